//! Renewal lateness (S6, S6L): how late each renewal round started against its schedule.
//!
//! redlease's schedule after a round that started at `s` is `s + interval` (the renewal interval; with S6's
//! TTLs of three times the interval and a 500 ms operation timeout the early-renewal bound of
//! `RenewalSchedule::after_success` never applies), so a renewal's lateness is its round's start minus (the previous round's start + interval). The
//! rounds are seen from the outside, through an [`Observer`](redlease::Observer) on the manager: the winning
//! acquisition attempt and every renewal's `Extension` event carry the round's end (`at`) and duration, hence
//! its start. A batched renewal's round starts when its batch is sent; the renewer takes the leases due within
//! the window of the earliest up to the window early, and those rounds count as early (not in the histogram). The raw floor records the same thing from its own loop (wake-up after its sleep against the
//! planned instant: the previous send plus the interval).
//!
//! Recording is lock-free (a few atomic operations per renewal), into 10 µs buckets up to 1 s.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlease::{AttemptOutcome, EventKind, LeaseEvent};

/// Bucket width.
const BUCKET_NS: u64 = 10_000;
/// Buckets below the overflow bucket (1 s).
const BUCKETS: usize = 100_000;

/// A lateness histogram and, per lease, the start of its last round.
pub(crate) struct Lateness {
    buckets: Box<[AtomicU64]>,
    max_ns: AtomicU64,
    /// Rounds that started before their schedule (a retry after a failed renewal, which is not scheduled by
    /// the interval); not in the histogram.
    early: AtomicU64,
    recording: AtomicBool,
    /// The last round's start of lease `id % len`, in ns since `base`, plus one (0: none yet). Leases held at
    /// once have ids closer together than `len`, so they never share a slot.
    last: Box<[AtomicU64]>,
    base: Instant,
    interval: Duration,
}

impl Lateness {
    /// Room for `leases` leases renewing every `interval`. Allocates everything now (before a scenario's
    /// heap reading).
    pub(crate) fn new(leases: usize, interval: Duration) -> Arc<Self> {
        let slots = (leases + 4096).next_power_of_two();
        Arc::new(Self {
            buckets: (0..=BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max_ns: AtomicU64::new(0),
            early: AtomicU64::new(0),
            recording: AtomicBool::new(false),
            last: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            base: Instant::now(),
            interval,
        })
    }

    /// Starts or stops recording (rounds are tracked either way, so the first renewal in the window has its
    /// predecessor).
    pub(crate) fn set_recording(&self, on: bool) {
        self.recording.store(on, Ordering::SeqCst);
    }

    /// Records one renewal that was `late` against its schedule.
    pub(crate) fn record(&self, late: Duration) {
        if !self.recording.load(Ordering::Relaxed) {
            return;
        }
        let ns = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
        let i = usize::try_from(ns / BUCKET_NS).map_or(BUCKETS, |i| i.min(BUCKETS));
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// A round of lease `id` started at `start`: the first one (`renewal == false`, the acquisition) or a
    /// renewal, whose lateness is recorded.
    fn round(&self, id: u64, start: Instant, renewal: bool) {
        let slot = &self.last[(id % self.last.len() as u64) as usize];
        let ns = u64::try_from(start.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX - 1);
        let prev = slot.swap(ns + 1, Ordering::Relaxed);
        if !renewal || prev == 0 {
            return;
        }
        let planned =
            (prev - 1).saturating_add(u64::try_from(self.interval.as_nanos()).unwrap_or(0));
        if ns < planned {
            if self.recording.load(Ordering::Relaxed) {
                self.early.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        self.record(Duration::from_nanos(ns - planned));
    }

    /// Renewals recorded.
    pub(crate) fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// Rounds that started before their schedule (not in the histogram).
    pub(crate) fn early(&self) -> u64 {
        self.early.load(Ordering::Relaxed)
    }

    /// The largest lateness recorded.
    pub(crate) fn max(&self) -> Duration {
        Duration::from_nanos(self.max_ns.load(Ordering::Relaxed))
    }

    /// The `q`-quantile (nearest rank) in µs, as its bucket's upper edge (so at most 10 µs high; the overflow
    /// bucket reports the maximum); `None` without samples.
    pub(crate) fn quantile_us(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= rank {
                if i == BUCKETS {
                    return Some(self.max().as_secs_f64() * 1e6);
                }
                return Some(((i as u64 + 1) * BUCKET_NS) as f64 / 1000.0);
            }
        }
        Some(self.max().as_secs_f64() * 1e6)
    }
}

/// The observer that feeds a [`Lateness`] from a manager's round events.
pub(crate) struct LatenessObserver(pub(crate) Arc<Lateness>);

impl redlease::Observer for LatenessObserver {
    fn event(&self, event: &LeaseEvent<'_>) {
        let (round, renewal) = match &event.kind {
            EventKind::Attempt {
                round,
                outcome: AttemptOutcome::Won { .. },
                ..
            } => (*round, false),
            EventKind::Extension {
                renewal: true,
                round,
                ..
            } => (*round, true),
            _ => return,
        };
        let start = event.at.checked_sub(round).unwrap_or(event.at);
        self.0.round(event.lease.get(), start, renewal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_bucket_upper_edges_and_early_rounds_are_counted_apart() {
        let l = Lateness::new(10, Duration::from_secs(1));
        l.set_recording(true);
        for us in [1u64, 15, 15, 25, 2_000_000] {
            l.record(Duration::from_micros(us));
        }
        assert_eq!(l.count(), 5);
        assert_eq!(l.quantile_us(0.2), Some(10.0));
        assert_eq!(l.quantile_us(0.6), Some(20.0));
        assert_eq!(l.quantile_us(0.8), Some(30.0));
        assert_eq!(l.quantile_us(1.0), Some(2_000_000.0));
        let t0 = l.base + Duration::from_secs(5);
        l.round(7, t0, false);
        l.round(7, t0 + Duration::from_millis(1_003), true);
        l.round(7, t0 + Duration::from_millis(1_500), true);
        assert_eq!(l.count(), 6);
        assert_eq!(l.early(), 1);
        assert_eq!(l.quantile_us(0.5), Some(20.0));
        l.set_recording(false);
        l.record(Duration::from_micros(1));
        assert_eq!(l.count(), 6);
    }
}
