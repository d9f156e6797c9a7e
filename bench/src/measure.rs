//! Measuring instruments: latency percentiles, process CPU time, resident memory, heap counters and Redis'
//! own command statistics.

use std::time::Duration;

use stats_alloc::{INSTRUMENTED_SYSTEM, Stats};

/// Latency samples in nanoseconds.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    ns: Vec<u64>,
}

impl Samples {
    /// Room for `n` samples, so recording does not allocate while measuring.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            ns: Vec::with_capacity(n),
        }
    }

    /// Records one duration.
    pub(crate) fn push(&mut self, d: Duration) {
        self.ns
            .push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Moves every sample of `other` into `self`.
    pub(crate) fn merge(&mut self, mut other: Samples) {
        self.ns.append(&mut other.ns);
    }

    /// The number of samples.
    pub(crate) fn len(&self) -> usize {
        self.ns.len()
    }

    /// The `q`-quantile (nearest rank, `q` in `[0, 1]`) in microseconds; `None` without samples.
    pub(crate) fn quantile_us(&mut self, q: f64) -> Option<f64> {
        if self.ns.is_empty() {
            return None;
        }
        self.ns.sort_unstable();
        let n = self.ns.len();
        // Nearest rank: the smallest sample with at least q·n samples at or below it.
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        Some(self.ns[rank - 1] as f64 / 1000.0)
    }
}

/// Clock ticks per second for `/proc/self/stat` (`getconf CLK_TCK`, 100 on Linux unless told otherwise).
fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t: &u64| t > 0)
        .unwrap_or(100)
}

/// Reads the CPU time (user + system) of this whole process, all threads, living and exited.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuClock {
    ticks_per_second: u64,
}

impl CpuClock {
    /// Looks up the tick rate once.
    pub(crate) fn new() -> Self {
        Self {
            ticks_per_second: clock_ticks_per_second(),
        }
    }

    /// The resolution of [`now`](Self::now): one clock tick.
    pub(crate) fn resolution(&self) -> Duration {
        Duration::from_nanos(1_000_000_000 / self.ticks_per_second)
    }

    /// Process CPU time so far, from fields 14 (utime) and 15 (stime) of `/proc/self/stat`.
    pub(crate) fn now(&self) -> Result<Duration, String> {
        let stat = std::fs::read_to_string("/proc/self/stat")
            .map_err(|e| format!("read /proc/self/stat: {e}"))?;
        // The command name (field 2) may contain spaces; fields after it start past the last ')'.
        let rest = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest)
            .ok_or("malformed /proc/self/stat")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state), so utime (14) and stime (15) are at indexes 11 and 12.
        let field = |i: usize| -> Result<u64, String> {
            fields
                .get(i)
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| format!("malformed /proc/self/stat field {}", i + 3))
        };
        let ticks = field(11)? + field(12)?;
        Ok(Duration::from_nanos(
            ticks.saturating_mul(1_000_000_000) / self.ticks_per_second,
        ))
    }
}

/// Resident set size in bytes, from `/proc/self/statm` (its second field, in pages of 4 KiB).
pub(crate) fn resident_bytes() -> Result<u64, String> {
    let statm = std::fs::read_to_string("/proc/self/statm")
        .map_err(|e| format!("read /proc/self/statm: {e}"))?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .ok_or("malformed /proc/self/statm")?;
    Ok(pages * 4096)
}

/// The counting global allocator's totals since the process started.
pub(crate) fn heap() -> Stats {
    INSTRUMENTED_SYSTEM.stats()
}

/// Heap bytes currently allocated according to `stats` (allocated − freed ± reallocation growth).
pub(crate) fn live_bytes(stats: &Stats) -> i128 {
    stats.bytes_allocated as i128 - stats.bytes_deallocated as i128
        + stats.bytes_reallocated as i128
}

/// Calls of Lua scripts (`EVALSHA` plus `EVAL`) in the `INFO commandstats` text of a server.
pub(crate) fn script_calls(info: &str) -> u64 {
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split_once("calls=")
                .and_then(|(_, rest)| rest.split(',').next())
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

/// Renewals a server ran in S6's window: extend scripts, or on Valkey `SET … IFEQ` (no other `SET` is sent in
/// that window, and the scripts' inner commands count under their own names, not as `set`).
pub(crate) fn renewal_calls(info: &str) -> u64 {
    script_calls(info)
        + info
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_set:calls="))
            .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut s = Samples::with_capacity(100);
        for i in 1..=100u64 {
            s.push(Duration::from_micros(i));
        }
        assert_eq!(s.quantile_us(0.5), Some(50.0));
        assert_eq!(s.quantile_us(0.99), Some(99.0));
        assert_eq!(s.quantile_us(1.0), Some(100.0));
        assert_eq!(Samples::default().quantile_us(0.5), None);
    }

    #[test]
    fn script_calls_sum_eval_and_evalsha() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.5\r\n\
                    cmdstat_eval:calls=3,usec=9\r\ncmdstat_set:calls=99,usec=1\r\n";
        assert_eq!(script_calls(info), 15);
        assert_eq!(renewal_calls(info), 114);
    }

    #[test]
    fn cpu_clock_reads_this_process() {
        let clock = CpuClock::new();
        assert!(clock.now().is_ok());
        assert!(resident_bytes().is_ok_and(|b| b > 0));
    }
}
