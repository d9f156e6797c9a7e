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

    /// The quantiles of [`DIST_QUANTILES`](crate::report::DIST_QUANTILES) in µs (empty without samples).
    pub(crate) fn dist_us(&mut self) -> Vec<f64> {
        crate::report::DIST_QUANTILES
            .iter()
            .filter_map(|&q| self.quantile_us(q))
            .collect()
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

/// The per-command call counts of an `INFO commandstats` text (commands run by scripts count under their
/// own names too).
#[derive(Debug, Default)]
pub(crate) struct Commandstats {
    calls: Vec<(String, u64)>,
}

impl Commandstats {
    /// Parses the `cmdstat_NAME:calls=N,…` lines.
    pub(crate) fn parse(info: &str) -> Self {
        let calls = info
            .lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| {
                let (name, rest) = l.split_once(':')?;
                let n = rest
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("calls="))?
                    .trim()
                    .parse()
                    .ok()?;
                Some((name.to_owned(), n))
            })
            .collect();
        Self { calls }
    }

    /// Calls of `name` (lower case, as `INFO` spells it).
    pub(crate) fn calls(&self, name: &str) -> u64 {
        self.calls
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, c)| c)
            .sum()
    }

    /// `[expiry moves, SET, scripts, every command]`: the commands that move a key's expiry (`PEXPIRE`,
    /// `EXPIRE`, in the renewal scripts of redlease, the raw floors, distributed-lock-redis and
    /// async-redis-lock, alone or in a batch), `SET` (rslock's extend script sets the key again), scripts (`EVALSHA`, `EVAL`) and [`total`](Self::total).
    pub(crate) fn renewal_counters(&self) -> [u64; 4] {
        [
            self.calls("pexpire") + self.calls("expire"),
            self.calls("set"),
            self.calls("evalsha") + self.calls("eval"),
            self.total(),
        ]
    }

    /// Every command executed, script-inner ones included, but the harness's own `INFO` and `CONFIG`.
    pub(crate) fn total(&self) -> u64 {
        self.calls
            .iter()
            .filter(|(n, _)| !n.starts_with("info") && !n.starts_with("config"))
            .map(|(_, c)| c)
            .sum()
    }
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
    fn commandstats_count_renewals_requests_and_commands() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.5\r\n\
                    cmdstat_eval:calls=3,usec=9\r\ncmdstat_set:calls=99,usec=1\r\n\
                    cmdstat_pexpire:calls=1500,usec=7\r\ncmdstat_get:calls=1500,usec=7\r\n\
                    cmdstat_info:calls=2,usec=70\r\ncmdstat_config|resetstat:calls=1,usec=7\r\n";
        let stats = Commandstats::parse(info);
        assert_eq!(stats.calls("evalsha"), 12);
        assert_eq!(stats.renewal_counters(), [1500, 99, 15, 3114]);
    }

    #[test]
    fn cpu_clock_reads_this_process() {
        let clock = CpuClock::new();
        assert!(clock.now().is_ok());
        assert!(resident_bytes().is_ok_and(|b| b > 0));
    }
}
