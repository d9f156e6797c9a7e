//! A clock that runs at a different rate and offset from another: each node (or client) on its own clock.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant, SystemTime};

use redlease::machine::Jitter;
use redlease::{Sleep, Timer};

/// The slowest and fastest rate errors a [`SkewedClock`] accepts (a clock may not stop or run backwards).
const RATE_RANGE: (f64, f64) = (-0.9, 10.0);

/// A [`Timer`] that reads `origin + offset + elapsed × (1 + rate)`, where `origin` is the base clock's
/// instant when the skewed clock was made and `elapsed` is how far the base clock has moved since.
///
/// Give one to [`MemoryNode::with_timer`](crate::MemoryNode::with_timer) and the node expires keys on its
/// own clock: with `rate = 0.02` a 10 s TTL ends after about 9.8 s of the base (client) clock. The clock is
/// monotonic, and a sleep until a skewed instant ends exactly when the base clock reaches the corresponding
/// instant (so sleeps cost no real time on a [`VirtualClock`](crate::VirtualClock)).
///
/// ```
/// use std::time::Duration;
/// use redlease::Timer;
/// use redlease_testkit::{SkewedClock, VirtualClock};
///
/// let base = VirtualClock::new();
/// let fast = SkewedClock::new(base.clone(), 0.5).ahead(Duration::from_secs(60));
/// let t0 = fast.now();
/// base.advance(Duration::from_secs(10));
/// assert_eq!(fast.now() - t0, Duration::from_secs(15)); // runs 50 % fast
/// assert_eq!(fast.base_at(t0 + Duration::from_secs(30)), base.now() + Duration::from_secs(10));
/// ```
///
/// # Steps and a wall clock
///
/// A client's monotonic clock never goes back, but it may jump ahead (a VM resumed on another host):
/// [`step_forward`](Self::step_forward) moves it, and wakes the sleeps that the jump has made due. Its wall
/// clock, which redlease reads only to notice a suspend ([`Timer::wall_now`]), is off unless
/// [`with_wall_clock`](Self::with_wall_clock) turns it on; it follows the base clock (as an NTP-disciplined
/// wall clock follows real time) and steps either way with [`step_wall`](Self::step_wall). Clones share the
/// steps.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use redlease::Timer;
/// use redlease_testkit::{SkewedClock, VirtualClock};
///
/// let base = VirtualClock::new();
/// let clock = SkewedClock::new(base.clone(), 0.0).with_wall_clock(SystemTime::UNIX_EPOCH);
/// let t0 = clock.now();
/// clock.step_forward(Duration::from_secs(2));
/// assert_eq!(clock.now() - t0, Duration::from_secs(2), "the monotonic clock jumped");
/// assert_eq!(clock.base_at(t0 + Duration::from_secs(1)), base.now(), "reached at the jump");
/// clock.step_wall(Duration::from_secs(5), false); // the wall clock is set 5 s back
/// base.advance(Duration::from_secs(10));
/// assert_eq!(clock.wall_now(), Some(SystemTime::UNIX_EPOCH + Duration::from_secs(5)));
/// ```
#[derive(Clone)]
pub struct SkewedClock {
    base: Arc<dyn Timer>,
    origin: Instant,
    /// The skewed reading at `origin` (origin shifted by the offset).
    start: Instant,
    rate: f64,
    steps: Arc<Mutex<Steps>>,
}

/// The steps of a [`SkewedClock`], shared by its clones.
#[derive(Default)]
struct Steps {
    /// Forward jumps of the monotonic reading: `(base instant, total jumped from then on)`, in order.
    forward: Vec<(Instant, Duration)>,
    /// The wall clock's reading at `origin`, if it has one.
    wall_epoch: Option<SystemTime>,
    /// The wall clock's steps so far, in nanoseconds (negative: back).
    wall_offset: i128,
    /// Sleeps to wake at the next forward jump, by id (each removes itself when it ends).
    sleepers: std::collections::BTreeMap<u64, Waker>,
    next_sleeper: u64,
}

/// Removes a sleep's registration for forward jumps when the sleep ends or is dropped.
struct Sleeper {
    steps: Arc<Mutex<Steps>>,
    id: u64,
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        self.steps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sleepers
            .remove(&self.id);
    }
}

impl fmt::Debug for SkewedClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SkewedClock")
            .field("rate", &self.rate)
            .field("offset", &self.offset_nanos())
            .finish()
    }
}

impl SkewedClock {
    /// A clock on `base` running `rate` faster (negative: slower), with no offset. `rate` is clamped to
    /// `[-0.9, 10]`; NaN means 0.
    pub fn new(base: impl Timer, rate: f64) -> Self {
        let rate = if rate.is_nan() {
            0.0
        } else {
            rate.clamp(RATE_RANGE.0, RATE_RANGE.1)
        };
        let origin = base.now();
        Self {
            base: Arc::new(base),
            origin,
            start: origin,
            rate,
            steps: Arc::default(),
        }
    }

    fn lock_steps(&self) -> MutexGuard<'_, Steps> {
        self.steps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the monotonic reading `by` ahead, now (see [the type's docs](Self#steps-and-a-wall-clock)),
    /// waking every sleep on this clock so that the ones now due end.
    pub fn step_forward(&self, by: Duration) {
        let at = self.base.now();
        let sleepers = {
            let mut steps = self.lock_steps();
            let total = steps.forward.last().map_or(Duration::ZERO, |s| s.1) + by;
            steps.forward.push((at, total));
            std::mem::take(&mut steps.sleepers)
                .into_values()
                .collect::<Vec<_>>()
        };
        for w in sleepers {
            w.wake();
        }
    }

    /// The total of the forward jumps so far.
    pub fn stepped(&self) -> Duration {
        self.lock_steps()
            .forward
            .last()
            .map_or(Duration::ZERO, |s| s.1)
    }

    /// This clock with a wall clock ([`Timer::wall_now`]) that read `epoch` when the base clock read what it
    /// did at this clock's creation, and runs with the base clock (shared by clones).
    #[must_use]
    pub fn with_wall_clock(self, epoch: SystemTime) -> Self {
        self.lock_steps().wall_epoch = Some(epoch);
        self
    }

    /// Steps the wall clock `by`, forward or back (an NTP step, an operator's `date -s`). Does nothing
    /// without [`with_wall_clock`](Self::with_wall_clock).
    pub fn step_wall(&self, by: Duration, forward: bool) {
        let ns = by.as_nanos() as i128;
        let mut steps = self.lock_steps();
        steps.wall_offset += if forward { ns } else { -ns };
    }

    /// The total forward jump at base instant `base`.
    fn jumped_at(&self, base: Instant) -> Duration {
        let steps = self.lock_steps();
        let k = steps.forward.partition_point(|(at, _)| *at <= base);
        k.checked_sub(1)
            .and_then(|k| steps.forward.get(k))
            .map_or(Duration::ZERO, |s| s.1)
    }

    /// A clock with a rate error uniform in `[-max_rate, max_rate]` and an offset uniform in
    /// `[-max_offset, max_offset]`, drawn from `rng`.
    pub fn random(base: impl Timer, rng: &mut Jitter, max_rate: f64, max_offset: Duration) -> Self {
        let rate = max_rate * (2.0 * rng.next_unit() - 1.0);
        let offset = max_offset.mul_f64(rng.next_unit());
        let clock = Self::new(base, rate);
        if rng.next_u64() % 2 == 0 {
            clock.ahead(offset)
        } else {
            clock.behind(offset)
        }
    }

    /// Shifts the clock `by` ahead of the base clock.
    #[must_use]
    pub fn ahead(mut self, by: Duration) -> Self {
        self.start = self.origin.checked_add(by).unwrap_or(self.start);
        self
    }

    /// Shifts the clock `by` behind the base clock (as far as `Instant` allows).
    #[must_use]
    pub fn behind(mut self, by: Duration) -> Self {
        self.start = self.origin.checked_sub(by).unwrap_or(self.start);
        self
    }

    /// The rate error (0.01: 1 % fast).
    pub fn rate(&self) -> f64 {
        self.rate
    }

    fn offset_nanos(&self) -> i128 {
        if self.start >= self.origin {
            (self.start - self.origin).as_nanos() as i128
        } else {
            -((self.origin - self.start).as_nanos() as i128)
        }
    }

    fn scale(&self, base_elapsed: Duration) -> Duration {
        let nanos = (base_elapsed.as_nanos() as f64 * (1.0 + self.rate)).floor();
        Duration::from_nanos(nanos.min(u64::MAX as f64) as u64)
    }

    /// This clock's reading when the base clock reads `base` (before this clock was made: its start).
    pub fn local_at(&self, base: Instant) -> Instant {
        let elapsed = base.saturating_duration_since(self.origin);
        self.start
            .checked_add(self.scale(elapsed) + self.jumped_at(base))
            .unwrap_or(self.start)
    }

    /// The earliest base instant at which this clock reads at least `local`.
    pub fn base_at(&self, local: Instant) -> Instant {
        let forward = self.lock_steps().forward.clone();
        // Between two jumps the clock runs as an unstepped one shifted by the jumps so far.
        let (mut from, mut jumped) = (self.origin, Duration::ZERO);
        for k in 0..=forward.len() {
            let b = local
                .checked_sub(jumped)
                .map_or(from, |l| self.base_at_unstepped(l))
                .max(from);
            match forward.get(k) {
                Some(&(at, total)) if b >= at => (from, jumped) = (at, total),
                _ => return b,
            }
        }
        from
    }

    /// [`base_at`](Self::base_at) ignoring the forward jumps.
    fn base_at_unstepped(&self, local: Instant) -> Instant {
        let Some(target) = local.checked_duration_since(self.start) else {
            return self.origin;
        };
        let mut nanos = (target.as_nanos() as f64 / (1.0 + self.rate)).ceil() as u64;
        // Correct the float rounding both ways: the smallest base elapsed whose scaled value reaches target.
        while nanos > 0 && self.scale(Duration::from_nanos(nanos - 1)) >= target {
            nanos -= 1;
        }
        while self.scale(Duration::from_nanos(nanos)) < target {
            nanos += 1;
        }
        self.origin
            .checked_add(Duration::from_nanos(nanos))
            .unwrap_or(self.origin)
    }
}

impl Timer for SkewedClock {
    fn now(&self) -> Instant {
        self.local_at(self.base.now())
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        let this = self.clone();
        Box::pin(async move {
            let sleeper = {
                let mut steps = this.lock_steps();
                steps.next_sleeper += 1;
                Sleeper {
                    steps: Arc::clone(&this.steps),
                    id: steps.next_sleeper,
                }
            };
            while this.now() < deadline {
                // A jump moves the base instant at which the deadline is reached: sleep again from there.
                let jumps = this.lock_steps().forward.len();
                let mut sleep = this.base.sleep_until(this.base_at(deadline));
                std::future::poll_fn(|cx| {
                    if sleep.as_mut().poll(cx).is_ready()
                        || this.lock_steps().forward.len() != jumps
                    {
                        return Poll::Ready(());
                    }
                    // Woken by a forward jump too.
                    this.lock_steps()
                        .sleepers
                        .insert(sleeper.id, cx.waker().clone());
                    Poll::Pending
                })
                .await;
            }
            drop(sleeper);
        })
    }

    fn wall_now(&self) -> Option<SystemTime> {
        let steps = self.lock_steps();
        let epoch = steps.wall_epoch?;
        let ns = self
            .base
            .now()
            .saturating_duration_since(self.origin)
            .as_nanos() as i128
            + steps.wall_offset;
        let by = Duration::from_nanos(u64::try_from(ns.unsigned_abs()).unwrap_or(u64::MAX));
        if ns >= 0 {
            epoch.checked_add(by)
        } else {
            epoch.checked_sub(by)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryNode, Sim, VirtualClock};
    use std::sync::{Arc, Mutex};

    #[test]
    fn reads_scale_and_offset_the_base_and_stay_monotonic() {
        let base = VirtualClock::new();
        let slow = SkewedClock::new(base.clone(), -0.25).behind(Duration::from_secs(5));
        let t0 = slow.now();
        assert_eq!(base.now() - t0, Duration::from_secs(5));
        let mut last = t0;
        for _ in 0..1000 {
            base.advance(Duration::from_nanos(7_777_777));
            let now = slow.now();
            assert!(now >= last);
            last = now;
        }
        let base_elapsed = Duration::from_nanos(7_777_777 * 1000);
        let expected = base_elapsed.mul_f64(0.75);
        let got = last - t0;
        assert!(got.abs_diff(expected) < Duration::from_micros(1), "{got:?}");
    }

    #[test]
    fn base_at_inverts_local_at_exactly() {
        let base = VirtualClock::new();
        for rate in [-0.9, -0.013, 0.0, 0.000_123, 0.01, 3.7] {
            let c = SkewedClock::new(base.clone(), rate).ahead(Duration::from_millis(3));
            for ms in [0u64, 1, 999, 12_345, 86_400_000] {
                let local = c.now() + Duration::from_millis(ms) + Duration::from_nanos(ms % 7);
                let b = c.base_at(local);
                assert!(c.local_at(b) >= local, "rate {rate}, {ms} ms");
                assert!(
                    b == base.now() || c.local_at(b - Duration::from_nanos(1)) < local,
                    "rate {rate}, {ms} ms: not the earliest"
                );
            }
        }
    }

    #[test]
    fn sleeps_end_when_the_skewed_clock_reaches_the_deadline() {
        let mut sim = Sim::new(3);
        let fast = SkewedClock::new(sim.clock(), 0.1);
        let base = sim.clock();
        let (slept_base, reached) = sim.block_on({
            let fast = fast.clone();
            async move {
                let (b0, deadline) = (base.now(), fast.now() + Duration::from_secs(11));
                fast.sleep_until(deadline).await;
                (base.now() - b0, fast.now() >= deadline)
            }
        });
        assert!(reached);
        assert_eq!(slept_base, Duration::from_secs(10));
    }

    #[test]
    fn a_forward_jump_ends_the_sleeps_it_makes_due_and_brings_the_others_forward() {
        let mut sim = Sim::new(9);
        let base = sim.clock();
        let clock = SkewedClock::new(base.clone(), 0.0);
        let t0 = base.now();
        let ended = Arc::new(Mutex::new(Vec::new()));
        for (name, after) in [("short", 1_000u64), ("long", 5_000)] {
            let (c, ended) = (clock.clone(), ended.clone());
            let b = base.clone();
            sim.spawn(async move {
                c.sleep_until(c.now() + Duration::from_millis(after)).await;
                ended.lock().unwrap().push((name, b.now() - t0));
            });
        }
        let jump = clock.clone();
        sim.at(t0 + Duration::from_millis(500), move || {
            jump.step_forward(Duration::from_millis(2_000))
        });
        sim.run_until_idle(Duration::from_secs(10));
        let ms = Duration::from_millis;
        // The short sleep was due at the jump; the long one 2 s earlier than without it.
        assert_eq!(
            *ended.lock().unwrap(),
            vec![("short", ms(500)), ("long", ms(3_000))]
        );
        assert_eq!(clock.base_at(t0 + ms(5_000)), t0 + ms(3_000));
        assert_eq!(clock.local_at(t0 + ms(499)), t0 + ms(499));
    }

    #[test]
    fn a_node_on_a_fast_clock_expires_keys_early_by_the_base_clock() {
        let base = VirtualClock::new();
        let node = MemoryNode::with_timer(SkewedClock::new(base.clone(), 0.02));
        node.set("k", "v", Some(Duration::from_secs(10)));
        base.advance(Duration::from_millis(9_804));
        assert!(
            node.get("k").is_none(),
            "10 s / 1.02 = 9.804 s of base time"
        );
        node.set("k", "v", Some(Duration::from_secs(10)));
        base.advance(Duration::from_millis(9_800));
        assert!(node.get("k").is_some());
    }
}
