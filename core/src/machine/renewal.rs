//! When to renew a lease, and when a failing renewal becomes a loss.

use std::time::{Duration, Instant};

/// What a renewal loop should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewalStep {
    /// Start the next renewal round at this instant; bound it by [`RenewalSchedule::round_timeout`].
    RenewAt(Instant),
    /// No renewal can finish in time: the lease is lost at this instant (its validity deadline) unless
    /// something else extends it first.
    LostAt(Instant),
}

/// The renewal schedule of one lease.
///
/// Call protocol: after acquisition or a successful renewal, call [`after_success`](Self::after_success) with
/// the round's start and the new validity deadline; after a failed renewal that did not prove the lease gone,
/// call [`after_failure`](Self::after_failure). Sleep until the returned instant, then act on the step. Each
/// renewal round is bounded by [`round_timeout`](Self::round_timeout) so that its outcome is known before the
/// validity deadline.
///
/// With a [hold limit](Self::with_hold_limit), the lease's deadline is capped at the limit (see
/// [`cap`](Self::cap)): once a round leaves it valid up to the limit, no further renewal is planned and the
/// next step is [`RenewalStep::LostAt`] the limit.
#[derive(Debug, Clone, Copy)]
pub struct RenewalSchedule {
    interval: Duration,
    retry_pause: Duration,
    operation_timeout: Duration,
    hold_until: Option<Instant>,
}

impl RenewalSchedule {
    /// A schedule renewing every `interval`, retrying failed renewals after `retry_pause` (capped at the
    /// interval), with rounds bounded by `operation_timeout`.
    pub fn new(interval: Duration, retry_pause: Duration, operation_timeout: Duration) -> Self {
        Self {
            interval,
            retry_pause: retry_pause.min(interval),
            operation_timeout,
            hold_until: None,
        }
    }

    /// This schedule for a lease that may be held until `hold_until` at the latest (`None`: no limit).
    #[must_use]
    pub fn with_hold_limit(mut self, hold_until: Option<Instant>) -> Self {
        self.hold_until = hold_until;
        self
    }

    /// A validity deadline as the lease may believe it: never past the hold limit.
    pub fn cap(&self, valid_until: Instant) -> Instant {
        match self.hold_until {
            Some(limit) => valid_until.min(limit),
            None => valid_until,
        }
    }

    /// Whether a lease valid until `valid_until` (already [capped](Self::cap)) ends at its hold limit rather
    /// than by expiring: the reason its loss is reported with.
    pub fn ends_at_hold_limit(&self, valid_until: Instant) -> bool {
        self.hold_until.is_some_and(|limit| valid_until >= limit)
    }

    /// The renewal interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The next step after a round that started at `started` and left the lease valid until `valid_until`.
    ///
    /// Normally `started + interval`; earlier when that would leave less than one operation timeout before the
    /// deadline, so that a renewal has a full round to complete while the lease is still valid — but never
    /// earlier than halfway to the deadline, so a lease whose validity is shorter than two rounds is not
    /// renewed in a tight loop.
    ///
    /// A lease valid up to its hold limit is not renewed again: the step is `LostAt` the limit.
    pub fn after_success(&self, started: Instant, valid_until: Instant) -> RenewalStep {
        if self.ends_at_hold_limit(valid_until) {
            return RenewalStep::LostAt(valid_until);
        }
        let half = valid_until.saturating_duration_since(started) / 2;
        let halfway = started.checked_add(half).unwrap_or(started);
        let latest = valid_until
            .checked_sub(self.operation_timeout)
            .unwrap_or(started)
            .max(halfway);
        let planned = started.checked_add(self.interval).unwrap_or(latest);
        RenewalStep::RenewAt(planned.min(latest))
    }

    /// The next step after a renewal round that failed at `now` without proving the lease gone (errors,
    /// timeouts, too few nodes): retry after the retry pause if that is still before `valid_until`, otherwise
    /// give up and report the loss at `valid_until`.
    pub fn after_failure(&self, now: Instant, valid_until: Instant) -> RenewalStep {
        match now.checked_add(self.retry_pause) {
            Some(next) if next < valid_until => RenewalStep::RenewAt(next),
            _ => RenewalStep::LostAt(valid_until),
        }
    }

    /// The bound for a renewal round starting at `now`: the operation timeout, shortened so that the round
    /// ends by `valid_until`. `None` when `now` is already past the deadline.
    pub fn round_timeout(&self, now: Instant, valid_until: Instant) -> Option<Duration> {
        let left = valid_until
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())?;
        Some(left.min(self.operation_timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn renews_every_interval_when_healthy() {
        let s = RenewalSchedule::new(ms(10_000), ms(200), ms(500));
        assert_eq!(s.interval(), ms(10_000));
        let t0 = Instant::now();
        assert_eq!(
            s.after_success(t0, t0 + ms(29_698)),
            RenewalStep::RenewAt(t0 + ms(10_000))
        );
    }

    #[test]
    fn renews_early_when_the_interval_is_too_long_for_the_validity() {
        let s = RenewalSchedule::new(ms(29_900), ms(200), ms(500));
        let t0 = Instant::now();
        assert_eq!(
            s.after_success(t0, t0 + ms(29_698)),
            RenewalStep::RenewAt(t0 + ms(29_198))
        );
    }

    #[test]
    fn failure_retries_until_the_deadline_then_reports_loss() {
        let s = RenewalSchedule::new(ms(10_000), ms(200), ms(500));
        let t0 = Instant::now();
        let until = t0 + ms(1_000);
        assert_eq!(
            s.after_failure(t0, until),
            RenewalStep::RenewAt(t0 + ms(200))
        );
        assert_eq!(
            s.after_failure(t0 + ms(800), until),
            RenewalStep::LostAt(until)
        );
        assert_eq!(
            s.after_failure(t0 + ms(2_000), until),
            RenewalStep::LostAt(until)
        );
    }

    #[test]
    fn rounds_end_by_the_deadline() {
        let s = RenewalSchedule::new(ms(10_000), ms(200), ms(500));
        let t0 = Instant::now();
        assert_eq!(s.round_timeout(t0, t0 + ms(10_000)), Some(ms(500)));
        assert_eq!(s.round_timeout(t0, t0 + ms(100)), Some(ms(100)));
        assert_eq!(s.round_timeout(t0 + ms(100), t0 + ms(100)), None);
        assert_eq!(s.round_timeout(t0 + ms(200), t0 + ms(100)), None);
    }

    #[test]
    fn a_hold_limit_caps_the_deadline_and_stops_renewal_once_reached() {
        let t0 = Instant::now();
        let limit = t0 + ms(25_000);
        let s = RenewalSchedule::new(ms(10_000), ms(200), ms(500)).with_hold_limit(Some(limit));
        // Before the limit is in reach: renewed as usual.
        assert_eq!(s.cap(t0 + ms(20_000)), t0 + ms(20_000));
        assert!(!s.ends_at_hold_limit(t0 + ms(20_000)));
        assert_eq!(
            s.after_success(t0, t0 + ms(20_000)),
            RenewalStep::RenewAt(t0 + ms(10_000))
        );
        // A round that would leave it valid past the limit leaves it valid up to the limit, and no renewal
        // follows.
        let capped = s.cap(t0 + ms(39_700));
        assert_eq!(capped, limit);
        assert!(s.ends_at_hold_limit(capped));
        assert_eq!(
            s.after_success(t0 + ms(10_000), capped),
            RenewalStep::LostAt(limit)
        );
        // A failure before the limit still retries while validity remains.
        assert_eq!(
            s.after_failure(t0 + ms(20_000), capped),
            RenewalStep::RenewAt(t0 + ms(20_200))
        );
        // Without a limit nothing is capped.
        let free = RenewalSchedule::new(ms(10_000), ms(200), ms(500));
        assert_eq!(free.cap(t0 + ms(39_700)), t0 + ms(39_700));
        assert!(!free.ends_at_hold_limit(t0 + ms(39_700)));
    }

    proptest! {
        #[test]
        fn next_renewal_never_precedes_its_round_and_leaves_a_full_round(
            interval in 1u64..100_000, timeout in 1u64..10_000, validity in 0u64..200_000, pause in 1u64..10_000,
        ) {
            let s = RenewalSchedule::new(ms(interval), ms(pause), ms(timeout));
            let t0 = Instant::now();
            let until = t0 + ms(validity);
            let RenewalStep::RenewAt(next) = s.after_success(t0, until) else { panic!("success always renews") };
            prop_assert!(next <= t0 + ms(interval));
            if validity > 0 {
                prop_assert!(next > t0, "a renewal never repeats at the instant of the last one");
            }
            if validity >= 2 * timeout {
                prop_assert!(next + ms(timeout) <= until);
            }
            match s.after_failure(t0, until) {
                RenewalStep::RenewAt(t) => prop_assert!(t > t0 && t < until),
                RenewalStep::LostAt(t) => prop_assert_eq!(t, until),
            }
        }
    }
}
