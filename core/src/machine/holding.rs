//! What a held lease knows about its own validity, and the decisions made on it: whether it is still valid
//! at an instant (or expired, reached its hold limit, or was suspended past its drift), what a finished
//! extension changes, the first loss and the first failed renewal of an at-risk period. Time comes in as
//! arguments; the lease (`crate::lease`) keeps one `Holding` under its lock and turns the answers into
//! events and wake-ups.

use std::time::{Duration, Instant, SystemTime};

use crate::error::LossReason;

/// A held lease's validity and loss state.
#[derive(Debug, Clone)]
pub(crate) struct Holding {
    /// Valid until then, unless lost first.
    pub(crate) valid_until: Instant,
    /// When the round that gave `valid_until` started.
    pub(crate) round_started: Instant,
    /// The wall clock when `round_started` was read, to notice a suspend.
    pub(crate) wall_started: Option<SystemTime>,
    /// Lost, and why (the first reason wins).
    pub(crate) lost: Option<LossReason>,
    /// Since when the lease is at risk (the first failed renewal round of this at-risk period), if it is.
    pub(crate) at_risk: Option<Instant>,
    /// Released, handed off, or otherwise ended by its holder.
    pub(crate) ended: bool,
}

/// Where a lease stands at an instant ([`Holding::status`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Valid until then.
    Valid(Instant),
    /// Already lost for this reason, or ended ([`LossReason::Released`]).
    Gone(LossReason),
    /// Its deadline passed (or the process was suspended past its drift): to be marked lost for this reason.
    Lapsed(LossReason),
}

/// Why a finished extension changed nothing ([`Holding::extended`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotExtended {
    /// Already lost for this reason, or ended ([`LossReason::Released`]).
    Gone(LossReason),
    /// Its deadline passed before the round's answer: to be marked lost for this reason.
    Lapsed(LossReason),
}

/// What a finished extension changed ([`Holding::extended`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extended {
    /// The new deadline is earlier than the old one (a shorter manual extension): waiters must re-plan.
    pub(crate) earlier: bool,
    /// The lease was at risk since then, and has recovered.
    pub(crate) recovered_from: Option<Instant>,
}

/// Why a lease whose deadline `valid_until` passed is lost: it reached its hold limit (the deadline was
/// the limit), or it expired.
pub(crate) fn expiry_reason(valid_until: Instant, hold_limit: Option<Instant>) -> LossReason {
    if hold_limit.is_some_and(|limit| valid_until >= limit) {
        LossReason::HoldLimit
    } else {
        LossReason::Expired
    }
}

impl Holding {
    /// A lease won in a round that started at `round_started` (`wall_started` on the wall clock), valid
    /// until `valid_until`.
    pub(crate) fn new(
        valid_until: Instant,
        round_started: Instant,
        wall_started: Option<SystemTime>,
    ) -> Self {
        Self {
            valid_until,
            round_started,
            wall_started,
            lost: None,
            at_risk: None,
            ended: false,
        }
    }

    /// Where the lease stands at `now`. `wall_now`: the wall clock now (a suspend is a wall-clock advance
    /// past the monotonic one by more than `drift`, see [`crate::time::suspended`]); `hold_limit`: the
    /// instant its hold limit ends it, if it has one (a deadline at or past it is that limit, not an expiry).
    pub(crate) fn status(
        &self,
        now: Instant,
        wall_now: Option<SystemTime>,
        drift: Duration,
        hold_limit: Option<Instant>,
    ) -> Status {
        if let Some(reason) = self.lost {
            return Status::Gone(reason);
        }
        if self.ended {
            return Status::Gone(LossReason::Released);
        }
        if now >= self.valid_until {
            return Status::Lapsed(self.expiry_reason(hold_limit));
        }
        if self.wall_started.is_some()
            && crate::time::suspended(
                (self.round_started, now),
                (self.wall_started, wall_now),
                drift,
            )
        {
            return Status::Lapsed(LossReason::Suspended);
        }
        Status::Valid(self.valid_until)
    }

    /// Why a lease whose deadline passed is lost: it expired, or it reached its hold limit.
    pub(crate) fn expiry_reason(&self, hold_limit: Option<Instant>) -> LossReason {
        expiry_reason(self.valid_until, hold_limit)
    }

    /// An extension round that started at `started` (`wall_started`) ended successfully at `now`, leaving
    /// the lease valid until `valid_until` (already capped by the hold limit). The new deadline and round
    /// are recorded and an at-risk period ends — unless the lease is gone or lapsed at `now`, whose reason
    /// is returned (a lapse must then be marked lost).
    pub(crate) fn extended(
        &mut self,
        now: Instant,
        started: Instant,
        wall_started: Option<SystemTime>,
        valid_until: Instant,
        hold_limit: Option<Instant>,
    ) -> Result<Extended, NotExtended> {
        if let Some(reason) = self.lost {
            return Err(NotExtended::Gone(reason));
        }
        if self.ended {
            return Err(NotExtended::Gone(LossReason::Released));
        }
        if now >= self.valid_until {
            return Err(NotExtended::Lapsed(self.expiry_reason(hold_limit)));
        }
        let earlier = valid_until < self.valid_until;
        self.valid_until = valid_until;
        self.round_started = started;
        self.wall_started = wall_started;
        Ok(Extended {
            earlier,
            recovered_from: self.at_risk.take(),
        })
    }

    /// Before an extension round whose best outcome is `cap` (its start plus the TTL, less the drift): a
    /// deadline later than that is brought down to it, since the round may be applied on the nodes without
    /// its answer ever coming back. `true` if the deadline moved (waiters must re-plan).
    pub(crate) fn cap(&mut self, cap: Instant) -> bool {
        let moved = cap < self.valid_until && self.lost.is_none() && !self.ended;
        if moved {
            self.valid_until = cap;
        }
        moved
    }

    /// The holder ends the lease at `now` (release, drop, handoff). `true` if its deadline had passed
    /// without anybody noticing: it is marked lost (expired, or at its hold limit) before it ends, and the
    /// loss is to be reported now.
    pub(crate) fn end(&mut self, now: Instant, hold_limit: Option<Instant>) -> bool {
        let unnoticed = self.lost.is_none() && now >= self.valid_until;
        if unnoticed {
            self.lost = Some(self.expiry_reason(hold_limit));
        }
        self.ended = true;
        unnoticed
    }

    /// Marks the lease lost for `reason`; `true` if this is its first loss (a later reason is ignored).
    pub(crate) fn lose(&mut self, reason: LossReason) -> bool {
        let first = self.lost.is_none();
        if first {
            self.lost = Some(reason);
        }
        first
    }

    /// A renewal round failed at `now`; `true` if this starts an at-risk period.
    pub(crate) fn at_risk_since(&mut self, now: Instant) -> bool {
        let first = self.at_risk.is_none();
        self.at_risk.get_or_insert(now);
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn status_names_the_first_reason_a_lease_is_not_valid() {
        let t0 = Instant::now();
        let drift = ms(10);
        let fresh = Holding::new(t0 + ms(1_000), t0, None);
        assert_eq!(
            fresh.status(t0, None, drift, None),
            Status::Valid(t0 + ms(1_000))
        );
        assert_eq!(
            fresh.status(t0 + ms(999), None, drift, None),
            Status::Valid(t0 + ms(1_000))
        );
        // At the deadline exactly: lapsed (expired; at the hold limit when that is the deadline).
        assert_eq!(
            fresh.status(t0 + ms(1_000), None, drift, None),
            Status::Lapsed(LossReason::Expired)
        );
        assert_eq!(
            fresh.status(t0 + ms(1_000), None, drift, Some(t0 + ms(1_000))),
            Status::Lapsed(LossReason::HoldLimit)
        );
        assert_eq!(
            fresh.status(t0 + ms(1_000), None, drift, Some(t0 + ms(1_001))),
            Status::Lapsed(LossReason::Expired)
        );
        // Lost beats ended beats lapsed.
        let mut h = fresh.clone();
        h.ended = true;
        assert_eq!(
            h.status(t0 + ms(2_000), None, drift, None),
            Status::Gone(LossReason::Released)
        );
        assert!(h.lose(LossReason::NotHeld));
        assert_eq!(
            h.status(t0, None, drift, None),
            Status::Gone(LossReason::NotHeld)
        );
    }

    #[test]
    fn a_planned_round_caps_a_later_deadline_and_an_end_reports_an_unnoticed_expiry() {
        let t0 = Instant::now();
        let mut h = Holding::new(t0 + ms(1_000), t0, None);
        assert!(!h.cap(t0 + ms(1_000)), "not later: unchanged");
        assert!(h.cap(t0 + ms(800)));
        assert_eq!(h.valid_until, t0 + ms(800));
        assert!(!h.cap(t0 + ms(900)), "a cap never raises the deadline");
        // Ended before its deadline: nothing to report.
        let mut ended = h.clone();
        assert!(!ended.end(t0 + ms(799), None));
        assert!(ended.ended && ended.lost.is_none());
        assert!(
            !ended.cap(t0 + ms(100)),
            "an ended lease keeps its deadline"
        );
        // Ended at or past its deadline, unnoticed: lost first (at the hold limit if that was the deadline).
        let mut late = h.clone();
        assert!(late.end(t0 + ms(800), None));
        assert_eq!((late.lost, late.ended), (Some(LossReason::Expired), true));
        let mut limited = h.clone();
        assert!(limited.end(t0 + ms(900), Some(t0 + ms(800))));
        assert_eq!(limited.lost, Some(LossReason::HoldLimit));
        // Already lost: the end adds nothing to report.
        let mut lost = h.clone();
        assert!(lost.lose(LossReason::NotHeld));
        assert!(!lost.end(t0 + ms(900), None));
        assert_eq!(lost.lost, Some(LossReason::NotHeld));
        assert!(!lost.cap(t0 + ms(100)));
    }

    #[test]
    fn a_wall_clock_that_ran_ahead_by_more_than_the_drift_is_a_suspend() {
        let t0 = Instant::now();
        let w0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let h = Holding::new(t0 + ms(10_000), t0, Some(w0));
        let drift = ms(50);
        // 100 ms of monotonic time, 100 ms of wall time: valid.
        assert_eq!(
            h.status(t0 + ms(100), Some(w0 + ms(100)), drift, None),
            Status::Valid(t0 + ms(10_000))
        );
        // The wall clock ran 5 s while the monotonic one ran 100 ms: suspended.
        assert_eq!(
            h.status(t0 + ms(100), Some(w0 + ms(5_100)), drift, None),
            Status::Lapsed(LossReason::Suspended)
        );
        // Without a wall reading at the round's start, no suspend can be told.
        let h = Holding::new(t0 + ms(10_000), t0, None);
        assert_eq!(
            h.status(t0 + ms(100), Some(w0 + ms(5_100)), drift, None),
            Status::Valid(t0 + ms(10_000))
        );
    }

    #[test]
    fn an_extension_records_its_round_and_ends_an_at_risk_period_unless_the_lease_is_gone() {
        let t0 = Instant::now();
        let mut h = Holding::new(t0 + ms(1_000), t0, None);
        assert!(h.at_risk_since(t0 + ms(300)));
        assert!(!h.at_risk_since(t0 + ms(600)), "one at-risk period");
        let e = h
            .extended(t0 + ms(700), t0 + ms(650), None, t0 + ms(1_650), None)
            .unwrap();
        assert_eq!(
            e,
            Extended {
                earlier: false,
                recovered_from: Some(t0 + ms(300))
            }
        );
        assert_eq!(
            (h.valid_until, h.round_started, h.at_risk),
            (t0 + ms(1_650), t0 + ms(650), None)
        );
        // A shorter (manual) extension moves the deadline earlier.
        let e = h
            .extended(t0 + ms(800), t0 + ms(790), None, t0 + ms(1_200), None)
            .unwrap();
        assert!(e.earlier && e.recovered_from.is_none());
        // Too late: the deadline passed before the round's answer came back.
        assert_eq!(
            h.extended(t0 + ms(1_200), t0 + ms(900), None, t0 + ms(2_000), None),
            Err(NotExtended::Lapsed(LossReason::Expired))
        );
        assert_eq!(
            h.valid_until,
            t0 + ms(1_200),
            "a lapsed lease is not extended"
        );
        assert!(h.lose(LossReason::Expired));
        assert!(!h.lose(LossReason::NotHeld), "the first reason wins");
        assert_eq!(h.lost, Some(LossReason::Expired));
        assert_eq!(
            h.extended(t0 + ms(100), t0, None, t0 + ms(5_000), None),
            Err(NotExtended::Gone(LossReason::Expired))
        );
        let mut ended = Holding::new(t0 + ms(1_000), t0, None);
        ended.ended = true;
        assert_eq!(
            ended.extended(t0, t0, None, t0 + ms(2_000), None),
            Err(NotExtended::Gone(LossReason::Released))
        );
    }
}
