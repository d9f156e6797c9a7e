//! What a held lease knows about itself, and the decisions made on it: whether it is still valid at an
//! instant (or expired, reached its hold limit, or was suspended past its drift), what a finished extension
//! changes, the first loss and the first failed renewal of an at-risk period; and its extension protocol —
//! one extension round at a time (the permit), the records a later round relies on (written when a round is
//! planned, before anything is sent: the driver's future may be dropped at any await), who renews it (its
//! own loop or the shared renewer, whose visits carry a generation), and what follows a renewal round.
//! Time comes in as arguments; the lease (`crate::lease`) keeps one `Holding` under its lock and turns the
//! answers into events, wake-ups and rounds.

use std::time::{Duration, Instant, SystemTime};

use super::Tally;
use super::nodeset::NodeSet;
use super::renewal::{RenewalSchedule, RenewalStep};
use super::unconfirmed::Unconfirmed;
use crate::error::LossReason;
use crate::node::Ttl;

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
    /// Ended by a handoff: its key belongs to whoever resumes the ticket, so nothing of this lease may delete
    /// it any more.
    pub(crate) handed_off: bool,
    /// A compare-and-delete of our token on every node has finished (after a loss): nobody repeats it.
    pub(crate) cleaned: bool,
    /// Which nodes may still apply an earlier request of this lease (written when a round is planned).
    pub(crate) unconfirmed: Unconfirmed,
    /// Nodes that never confirmed this lease's key (a Redlock acquisition won without them): written there
    /// with the lease's own token by a repair or the next extension round.
    pub(crate) missing: NodeSet,
    /// An extension round of this lease (manual, renewal or repair) holds the permit.
    extending: bool,
    /// A renewal claim is held (a running [`Lease::run`](crate::Lease::run) or automatic renewal).
    renewing: bool,
    /// The manager's shared renewer renews this lease (batched renewal).
    batched: bool,
    /// The generation of the shared renewer's current entry for this lease: older entries are stale.
    batch_gen: u32,
}

/// What an extension round was planned with ([`Holding::plan_extension`]), before any request was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planned {
    /// Per node, the smallest TTL (ms) of an earlier request that may still land there (0: none).
    pub(crate) unconfirmed: Option<Box<[u64]>>,
    /// The nodes that never confirmed the lease's key.
    pub(crate) missing: NodeSet,
}

/// How one extension round of a lease ended, as the round's driver saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RoundEnd {
    /// A quorum extended it: valid until `valid_until` (not yet capped by the hold limit) by the round that
    /// started at `started` (`wall_started` on the wall clock).
    Extended {
        started: Instant,
        wall_started: Option<SystemTime>,
        valid_until: Instant,
    },
    /// A quorum said the key holds another value or none: the lease is gone.
    NotHeld,
    /// Undecided (too few answers, or a quorum too slow for the drift); `caused`: node failures explain it.
    Failed { caused: bool },
}

/// What follows a renewal round ([`Holding::renewal_ended`]), for either renewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// Extended until `valid_until`; renew (or give up) as `next` says.
    Extended {
        valid_until: Instant,
        change: Extended,
        next: RenewalStep,
    },
    /// The round failed; the lease stays held, at risk (`first`: this round started the at-risk period).
    /// `keep_cause`: no renewal can finish before the deadline any more, so the round's node failures are
    /// the cause of a loss at the deadline.
    AtRisk {
        first: bool,
        next: RenewalStep,
        keep_cause: bool,
    },
    /// Ended by its holder meanwhile: nothing more to renew.
    Ended,
    /// Lost (or to be marked lost) for this reason: stop renewing and delete our token.
    GiveUp(LossReason),
}

/// The shared renewer's visit of a batched lease at a due entry ([`Holding::visit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Visit {
    /// A stale entry, a lease the renewer no longer renews, or one that ended: nothing to do.
    Skip,
    /// Lost by whoever noticed (a loss signal only observes): the renewer stops renewing it, and our token
    /// is to be deleted.
    CleanUp,
    /// A manual extension holds the permit: its end plans the next visit.
    Busy,
    /// The renewer holds the extension permit now: check the deadline, then run a round.
    Go,
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
            handed_off: false,
            cleaned: false,
            unconfirmed: Unconfirmed::default(),
            missing: NodeSet::default(),
            extending: false,
            renewing: false,
            batched: false,
            batch_gen: 0,
        }
    }

    /// With the records its acquisition left: the nodes where an acquisition request may still land
    /// (`unconfirmed`, as [`Unconfirmed::from_acquisition`]) and those that never confirmed the key.
    pub(crate) fn with_records(
        mut self,
        unconfirmed: Option<Box<[u64]>>,
        missing: NodeSet,
    ) -> Self {
        self.unconfirmed = Unconfirmed::from_acquisition(unconfirmed);
        self.missing = missing;
        self
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
    /// Whether the lease is neither lost nor ended.
    pub(crate) fn live(&self) -> bool {
        self.lost.is_none() && !self.ended
    }

    /// Marks the lease lost for `reason` (see [`lose`](Self::lose)); `true` if this is its first loss and the
    /// shared renewer renews it with nothing in flight: the renewer should visit it now (to delete our
    /// token) rather than at its planned renewal.
    pub(crate) fn lose_and_poke(&mut self, reason: LossReason) -> (bool, bool) {
        let first = self.lose(reason);
        (first, first && self.batched && !self.extending)
    }

    // ---- The extension protocol: one round at a time, its records written before it is sent. ----

    /// Takes the extension permit; `false` if another round holds it (wait for its release).
    pub(crate) fn take_permit(&mut self) -> bool {
        !std::mem::replace(&mut self.extending, true)
    }

    /// Releases the extension permit; `true` if the shared renewer renews this lease (and it is live), so
    /// that its next visit is to be planned.
    pub(crate) fn release_permit(&mut self) -> bool {
        self.extending = false;
        self.batched && self.live()
    }

    /// Before an extension round with `ttl` to all `n` nodes, whose best outcome is `cap`, before any of its
    /// requests is sent: records the round as possibly applied on every node (until its answers say
    /// otherwise) and caps the deadline (see [`cap`](Self::cap)). Returns what the round is planned with and
    /// whether the deadline moved (waiters must re-plan).
    pub(crate) fn plan_extension(&mut self, n: usize, ttl: Ttl, cap: Instant) -> (Planned, bool) {
        let planned = Planned {
            unconfirmed: self.unconfirmed.plan(n, ttl),
            missing: self.missing,
        };
        (planned, self.cap(cap))
    }

    /// Before a repair round with `ttl` (see [`missing`](Self::missing)), before anything is sent: the nodes
    /// to ask, recorded as possibly applied there; `None` if every node has confirmed the key meanwhile.
    pub(crate) fn plan_repair(&mut self, n: usize, ttl: Ttl) -> Option<NodeSet> {
        if self.missing.is_empty() {
            return None;
        }
        let targets = self.missing;
        self.unconfirmed.plan_on(n, ttl, Some(targets));
        Some(targets)
    }

    /// The round planned last (of `n` nodes) ended with `tally`: the nodes that answered are confirmed, and a
    /// yes proves the key there.
    pub(crate) fn handle_round(&mut self, n: usize, tally: &Tally) {
        self.unconfirmed.handle_round(n, tally);
        for i in tally.yes_indices() {
            self.missing.remove(i);
        }
    }

    /// Whether some node never confirmed the key of this live lease: a repair round should write it there.
    pub(crate) fn needs_repair(&self) -> bool {
        !self.missing.is_empty() && self.live()
    }

    /// After a round that wrote the key on some nodes (a repair): whether those writes must be deleted
    /// again, because the lease ended or was lost meanwhile (a write that landed after the release's
    /// compare-and-delete must not outlive it). Not after a handoff: the key is the resumed lease's.
    pub(crate) fn must_undo_writes(&self) -> bool {
        !self.handed_off && !self.live()
    }

    /// Whether our token is still to be deleted everywhere (not done yet, and not handed off).
    pub(crate) fn must_clean_up(&self) -> bool {
        !self.cleaned && !self.handed_off
    }

    // ---- Who renews it. ----

    /// Claims the single renewal loop of this lease; `false` if one already runs.
    pub(crate) fn claim_renewal(&mut self) -> bool {
        !std::mem::replace(&mut self.renewing, true)
    }

    /// Gives the renewal claim up (the shared renewer stops renewing it too), so another loop can take it.
    pub(crate) fn unclaim_renewal(&mut self) {
        self.renewing = false;
        self.batched = false;
    }

    /// Hands the renewal (whose claim is held) to the shared renewer.
    pub(crate) fn renew_batched(&mut self) {
        self.batched = true;
    }

    /// The shared renewer gives the lease up: it stops renewing it.
    pub(crate) fn stop_batched(&mut self) {
        self.batched = false;
    }

    /// A new generation for the shared renewer's next entry of this lease (superseding earlier entries), or
    /// `None` if the renewer does not renew it (any more) or it ended.
    pub(crate) fn next_entry(&mut self) -> Option<u32> {
        if !self.batched || self.ended {
            return None;
        }
        self.batch_gen = self.batch_gen.wrapping_add(1);
        Some(self.batch_gen)
    }

    /// The shared renewer's visit at a due entry of generation `generation` (see [`Visit`]). On
    /// [`Visit::Go`] the renewer holds the extension permit.
    pub(crate) fn visit(&mut self, generation: u32) -> Visit {
        if !self.batched || self.batch_gen != generation || self.ended {
            return Visit::Skip;
        }
        if self.lost.is_some() {
            self.batched = false;
            return Visit::CleanUp;
        }
        if !self.take_permit() {
            return Visit::Busy;
        }
        Visit::Go
    }

    /// A renewal round planned for the deadline `planned_for` ended at `now` as `end` (its deadline already
    /// computed by the round): records an extension (capped by `schedule`'s hold limit) or an at-risk period,
    /// and says what follows, the same for a lease's own loop and the shared renewer.
    pub(crate) fn renewal_ended(
        &mut self,
        now: Instant,
        end: RoundEnd,
        planned_for: Instant,
        schedule: &RenewalSchedule,
        hold_limit: Option<Instant>,
    ) -> Renewed {
        match end {
            RoundEnd::Extended {
                started,
                wall_started,
                valid_until,
            } => {
                let valid_until = schedule.cap(valid_until);
                match self.extended(now, started, wall_started, valid_until, hold_limit) {
                    Ok(change) => Renewed::Extended {
                        valid_until,
                        change,
                        next: schedule.after_success(started, valid_until),
                    },
                    Err(NotExtended::Gone(LossReason::Released)) => Renewed::Ended,
                    Err(NotExtended::Gone(reason) | NotExtended::Lapsed(reason)) => {
                        Renewed::GiveUp(reason)
                    }
                }
            }
            RoundEnd::NotHeld => Renewed::GiveUp(LossReason::NotHeld),
            RoundEnd::Failed { caused } => {
                let first = self.at_risk_since(now);
                let next = schedule.after_failure(now, planned_for);
                Renewed::AtRisk {
                    first,
                    next,
                    keep_cause: caused && matches!(next, RenewalStep::LostAt(_)),
                }
            }
        }
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
    fn ttl(ms: u64) -> Ttl {
        Ttl::from_millis(ms).unwrap()
    }

    #[test]
    fn one_extension_round_at_a_time_and_the_renewer_hears_of_the_permits_release() {
        let t0 = Instant::now();
        let mut h = Holding::new(t0 + ms(1_000), t0, None);
        assert!(h.take_permit());
        assert!(!h.take_permit(), "a second round waits for the permit");
        assert!(!h.release_permit(), "not batched: nothing to plan");
        assert!(h.take_permit(), "released: free again");
        h.renew_batched();
        assert!(
            h.release_permit(),
            "batched and live: the renewer plans its next visit"
        );
        h.take_permit();
        assert!(h.lose(LossReason::NotHeld));
        assert!(!h.release_permit(), "lost: nothing more to renew");
        let mut ended = Holding::new(t0 + ms(1_000), t0, None);
        ended.renew_batched();
        ended.ended = true;
        assert!(!ended.release_permit(), "ended: nothing more to renew");
    }

    #[test]
    fn a_planned_round_is_recorded_on_every_node_before_it_is_sent_and_answers_confirm_it() {
        let t0 = Instant::now();
        let mut h = Holding::new(t0 + ms(10_000), t0, None).with_records(None, NodeSet::of([2]));
        // Planned with 5 s, capped at t0 + 4 s: the deadline moves down.
        let (planned, capped) = h.plan_extension(3, ttl(5_000), t0 + ms(4_000));
        assert!(capped);
        assert_eq!(h.valid_until, t0 + ms(4_000));
        assert_eq!(planned.unconfirmed, None, "nothing earlier is unconfirmed");
        assert_eq!(planned.missing, NodeSet::of([2]));
        // Dropped before its answers: the next round (longer) must not count any node, since the dropped
        // one may land after it with 5 s.
        let (planned, capped) = h.plan_extension(3, ttl(8_000), t0 + ms(9_000));
        assert!(!capped, "a cap never raises the deadline");
        assert_eq!(
            planned.unconfirmed.as_deref(),
            Some(&[5_000, 5_000, 5_000][..])
        );
        // This round's answers: node 0 yes, node 1 no, node 2 yes (the missing node now holds the key).
        let mut tally = Tally::new(3, 2, crate::machine::WaitFor::All);
        tally.handle_reply(0, crate::machine::Reply::Yes);
        tally.handle_reply(1, crate::machine::Reply::No);
        tally.handle_reply(2, crate::machine::Reply::Yes);
        h.handle_round(3, &tally);
        assert!(h.missing.is_empty(), "a yes proves the key");
        assert!(!h.needs_repair());
        // The dropped 5 s round stays unconfirmed for good (its answers never came).
        let (planned, _) = h.plan_extension(3, ttl(8_000), t0 + ms(9_000));
        assert_eq!(
            planned.unconfirmed.as_deref(),
            Some(&[5_000, 5_000, 5_000][..])
        );
    }

    #[test]
    fn a_repair_asks_only_the_missing_nodes_and_undoes_its_writes_after_an_end_but_not_a_handoff() {
        let t0 = Instant::now();
        let mut h = Holding::new(t0 + ms(10_000), t0, None).with_records(None, NodeSet::of([1]));
        assert!(h.needs_repair());
        assert_eq!(h.plan_repair(3, ttl(10_000)), Some(NodeSet::of([1])));
        // Its answer never came: only node 1 may still apply it.
        let (planned, _) = h.plan_extension(3, ttl(20_000), t0 + ms(10_000));
        assert_eq!(planned.unconfirmed.as_deref(), Some(&[0, 10_000, 0][..]));
        assert!(!h.must_undo_writes(), "live: the writes are the lease's");
        let mut lost = h.clone();
        lost.lose(LossReason::NotHeld);
        assert!(!lost.needs_repair(), "a lost lease repairs nothing");
        assert!(lost.must_undo_writes());
        let mut ended = h.clone();
        ended.end(t0 + ms(1), None);
        assert!(ended.must_undo_writes() && ended.must_clean_up());
        ended.handed_off = true;
        assert!(
            !ended.must_undo_writes(),
            "handed off: the key is the resumed lease's"
        );
        assert!(!ended.must_clean_up());
        let mut cleaned = h.clone();
        cleaned.cleaned = true;
        assert!(!cleaned.must_clean_up(), "cleaned once");
        // Nothing missing: no repair round.
        let mut whole = Holding::new(t0 + ms(10_000), t0, None);
        assert_eq!(whole.plan_repair(3, ttl(10_000)), None);
    }

    #[test]
    fn the_renewers_visits_skip_stale_entries_clean_up_losses_and_wait_for_a_manual_extension() {
        let t0 = Instant::now();
        let mut h = Holding::new(t0 + ms(1_000), t0, None);
        assert!(h.claim_renewal());
        assert!(!h.claim_renewal(), "one renewal loop");
        assert_eq!(h.next_entry(), None, "not batched: no renewer entry");
        assert_eq!(h.visit(0), Visit::Skip);
        h.renew_batched();
        let g1 = h.next_entry().unwrap();
        let g2 = h.next_entry().unwrap();
        assert_ne!(g1, g2);
        assert_eq!(h.visit(g1), Visit::Skip, "superseded");
        assert!(h.take_permit(), "a manual extension");
        assert_eq!(h.visit(g2), Visit::Busy);
        assert!(h.release_permit());
        assert_eq!(h.visit(g2), Visit::Go);
        assert!(!h.take_permit(), "the renewer holds the permit");
        h.release_permit();
        // Lost with nothing in flight: the renewer is poked, visits, and stops renewing it.
        let (first, poke) = h.lose_and_poke(LossReason::Expired);
        assert!(first && poke);
        assert_eq!(h.visit(g2), Visit::CleanUp);
        assert_eq!(h.visit(g2), Visit::Skip, "no longer renewed");
        assert_eq!(h.next_entry(), None);
        // A loss while a round holds the permit needs no poke: the round's end hands the lease back.
        let mut busy = Holding::new(t0 + ms(1_000), t0, None);
        busy.renew_batched();
        busy.take_permit();
        assert_eq!(busy.lose_and_poke(LossReason::Expired), (true, false));
        assert_eq!(busy.lose_and_poke(LossReason::NotHeld), (false, false));
        // Unclaimed: another loop may claim it; the renewer stops.
        h.unclaim_renewal();
        assert!(h.claim_renewal());
        let mut ended = Holding::new(t0 + ms(1_000), t0, None);
        ended.renew_batched();
        let g = ended.next_entry().unwrap();
        ended.end(t0, None);
        assert_eq!(ended.visit(g), Visit::Skip);
        let mut stopped = Holding::new(t0 + ms(1_000), t0, None);
        stopped.renew_batched();
        let g = stopped.next_entry().unwrap();
        stopped.stop_batched();
        assert_eq!(stopped.visit(g), Visit::Skip);
    }

    #[test]
    fn a_renewal_rounds_end_decides_the_next_step_for_both_renewers() {
        let t0 = Instant::now();
        let schedule = RenewalSchedule::new(ms(300), ms(100), ms(50));
        let planned_for = t0 + ms(1_000);
        // Extended: the new deadline, the next renewal an interval after the round's start.
        let mut h = Holding::new(planned_for, t0, None);
        let won = RoundEnd::Extended {
            started: t0 + ms(300),
            wall_started: None,
            valid_until: t0 + ms(1_290),
        };
        assert_eq!(
            h.renewal_ended(t0 + ms(310), won, planned_for, &schedule, None),
            Renewed::Extended {
                valid_until: t0 + ms(1_290),
                change: Extended {
                    earlier: false,
                    recovered_from: None
                },
                next: RenewalStep::RenewAt(t0 + ms(600)),
            }
        );
        assert_eq!(h.valid_until, t0 + ms(1_290));
        // Failed with node errors and time for another try: at risk, retry after the pause.
        let failed = RoundEnd::Failed { caused: true };
        assert_eq!(
            h.renewal_ended(t0 + ms(700), failed, t0 + ms(1_290), &schedule, None),
            Renewed::AtRisk {
                first: true,
                next: RenewalStep::RenewAt(t0 + ms(800)),
                keep_cause: false,
            }
        );
        // Failed again with no time left: lost at the deadline, for this cause; the at-risk period goes on.
        assert_eq!(
            h.renewal_ended(t0 + ms(1_200), failed, t0 + ms(1_290), &schedule, None),
            Renewed::AtRisk {
                first: false,
                next: RenewalStep::LostAt(t0 + ms(1_290)),
                keep_cause: true,
            }
        );
        // Without a cause (a quorum too slow for the drift) nothing is kept.
        let mut quiet = h.clone();
        assert_eq!(
            quiet.renewal_ended(
                t0 + ms(1_200),
                RoundEnd::Failed { caused: false },
                t0 + ms(1_290),
                &schedule,
                None
            ),
            Renewed::AtRisk {
                first: false,
                next: RenewalStep::LostAt(t0 + ms(1_290)),
                keep_cause: false,
            }
        );
        // A late success ends the at-risk period; its deadline is capped by the hold limit, after which
        // nothing more is renewed.
        let limited = schedule.with_hold_limit(Some(t0 + ms(1_500)));
        let won = RoundEnd::Extended {
            started: t0 + ms(1_210),
            wall_started: None,
            valid_until: t0 + ms(2_200),
        };
        assert_eq!(
            h.renewal_ended(
                t0 + ms(1_220),
                won,
                t0 + ms(1_290),
                &limited,
                Some(t0 + ms(1_500))
            ),
            Renewed::Extended {
                valid_until: t0 + ms(1_500),
                change: Extended {
                    earlier: false,
                    recovered_from: Some(t0 + ms(700))
                },
                next: RenewalStep::LostAt(t0 + ms(1_500)),
            }
        );
        // Not held: give up. Answered after the deadline: lapsed, give up. Ended meanwhile: stop.
        assert_eq!(
            h.renewal_ended(
                t0 + ms(1_300),
                RoundEnd::NotHeld,
                t0 + ms(1_500),
                &schedule,
                None
            ),
            Renewed::GiveUp(LossReason::NotHeld)
        );
        assert_eq!(
            h.renewal_ended(
                t0 + ms(1_500),
                won,
                t0 + ms(1_500),
                &limited,
                Some(t0 + ms(1_500))
            ),
            Renewed::GiveUp(LossReason::HoldLimit)
        );
        let mut ended = Holding::new(planned_for, t0, None);
        ended.end(t0 + ms(10), None);
        assert_eq!(
            ended.renewal_ended(t0 + ms(20), won, planned_for, &schedule, None),
            Renewed::Ended
        );
        let mut lost = Holding::new(planned_for, t0, None);
        lost.lose(LossReason::Suspended);
        assert_eq!(
            lost.renewal_ended(t0 + ms(20), won, planned_for, &schedule, None),
            Renewed::GiveUp(LossReason::Suspended)
        );
    }
}
