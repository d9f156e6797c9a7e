//! A held lease's shared state and what drives it: the extension protocol (its decisions are
//! [`Holding`]'s), the renewal loop, repair rounds, the shared renewer's view of a lease, and the renewal of a
//! set's parts together. The API handles ([`Lease`](crate::Lease), [`LossSignal`](crate::LossSignal)) are
//! in `crate::lease`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime};

use super::{Engine, RoundTimes, Spawn};
use crate::error::{Error, LossReason, Operation, QuorumError};
use crate::machine::holding::{
    Extended, Holding, NotExtended, Planned, Renewed, RoundEnd, Status, Visit,
};
use crate::machine::nodeset::NodeSet;
use crate::machine::unconfirmed::counts;
use crate::machine::validity::deadline_after_round;
use crate::machine::{RenewalSchedule, RenewalStep, Reply, Tally, Verdict, WaitFor};
use crate::mode::Mode;
use crate::node::Ttl;
use crate::node::{MultiKeyItem, MultiKeyOp, MultiKeyReply, NodeError, NodeErrorKind};
use crate::observe::{CleanupCause, EventKind, LeaseId, Nodes};
use crate::time::Sleep;
use crate::token::Token;

static NEXT_WAITER: AtomicU64 = AtomicU64::new(1);

pub(crate) fn waiter_id() -> u64 {
    NEXT_WAITER.fetch_add(1, Ordering::Relaxed)
}

pub(crate) struct State {
    /// Validity, loss and the extension protocol: the deadline, the round it counts from, the first loss, an
    /// at-risk period, whether it ended, the extension permit and the records rounds rely on, who renews it
    /// (the decisions on them are [`Holding`]'s).
    pub(crate) h: Holding,
    /// The node failures behind the loss, if any (reported by [`Lease::run`]).
    pub(crate) loss_source: Option<Box<QuorumError>>,
    /// Its node cannot extend it together with the other parts of its set in one step
    /// ([`renew_together`]): renewed on its own for the rest of its hold.
    pub(crate) separately: bool,
    pub(crate) waiters: Vec<(u64, Waker)>,
}

impl State {
    pub(crate) fn register(&mut self, id: u64, waker: &Waker) {
        match self.waiters.iter_mut().find(|(i, _)| *i == id) {
            Some((_, w)) if w.will_wake(waker) => {}
            Some((_, w)) => w.clone_from(waker),
            None => {
                // Usually the only waiter: don't let the first push reserve room for four.
                self.waiters.reserve_exact(1);
                self.waiters.push((id, waker.clone()));
            }
        }
    }

    pub(crate) fn deregister(&mut self, id: u64) {
        self.waiters.retain(|(i, _)| *i != id);
    }

    #[must_use]
    pub(crate) fn take_waiters(&mut self) -> Vec<(u64, Waker)> {
        std::mem::take(&mut self.waiters)
    }

    /// Why a renewal loop asleep since the deadline was `planned_for` must wake before its planned instant,
    /// if it must: the lease ended, was lost, or its deadline moved earlier.
    pub(crate) fn woken(&self, planned_for: Instant) -> Option<Woken> {
        if self.h.ended {
            Some(Woken::Ended)
        } else if self.h.lost.is_some() {
            Some(Woken::Lost)
        } else if self.h.valid_until < planned_for {
            Some(Woken::Moved)
        } else {
            None
        }
    }
}

pub(crate) fn wake(waiters: Vec<(u64, Waker)>) {
    for (_, w) in waiters {
        w.wake();
    }
}

/// State shared by a [`Lease`], its loss signals and its renewal loop.
pub(crate) struct Shared {
    pub(crate) engine: Arc<Engine>,
    /// This lease itself, for the renewer's queue (which does not keep a lease alive).
    pub(crate) me: Weak<Shared>,
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    pub(crate) ttl: Ttl,
    pub(crate) op_timeout: Duration,
    pub(crate) fence: Option<u64>,
    pub(crate) renew_interval: Option<Duration>,
    pub(crate) id: LeaseId,
    pub(crate) acquired_at: Instant,
    /// The hold limit ([`crate::Lock::max_hold`]): the lease is never believed valid past it.
    pub(crate) hold_until: Option<Instant>,
    pub(crate) state: Mutex<State>,
}

/// What a successful acquisition hands to its lease.
pub(crate) struct Grant {
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    pub(crate) ttl: Ttl,
    pub(crate) op_timeout: Duration,
    pub(crate) fence: Option<u64>,
    pub(crate) renew_interval: Option<Duration>,
    pub(crate) id: LeaseId,
    pub(crate) acquired_at: Instant,
    /// The hold limit, if the lock has one.
    pub(crate) hold_until: Option<Instant>,
    pub(crate) round_started: Instant,
    pub(crate) wall_started: Option<SystemTime>,
    pub(crate) valid_until: Instant,
    /// Nodes where an acquisition request may still land (its TTL in ms), as in [`State::unconfirmed`].
    pub(crate) unconfirmed: Option<Box<[u64]>>,
    /// Nodes that did not confirm the key, as in [`State::missing`].
    pub(crate) missing: NodeSet,
}

/// How one extension round ended.
pub(crate) enum Extension {
    Extended {
        started: Instant,
        wall_started: Option<SystemTime>,
        valid_until: Instant,
    },
    NotHeld,
    Failed(Option<QuorumError>),
}

impl Shared {
    pub(crate) fn new(engine: Arc<Engine>, grant: Grant) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            engine,
            me: me.clone(),
            key: grant.key,
            token: grant.token,
            ttl: grant.ttl,
            op_timeout: grant.op_timeout,
            fence: grant.fence,
            renew_interval: grant.renew_interval,
            id: grant.id,
            acquired_at: grant.acquired_at,
            hold_until: grant.hold_until,
            state: Mutex::new(State {
                h: Holding::new(
                    match grant.hold_until {
                        Some(limit) => grant.valid_until.min(limit),
                        None => grant.valid_until,
                    },
                    grant.round_started,
                    grant.wall_started,
                )
                .with_records(grant.unconfirmed, grant.missing),
                loss_source: None,
                separately: false,
                waiters: Vec::new(),
            }),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn now(&self) -> Instant {
        self.engine.timer.now()
    }

    /// Marks the lease lost (first reason wins) and wakes every waiter.
    pub(crate) fn mark_lost(&self, reason: LossReason) -> LossReason {
        self.mark_lost_by(reason, None)
    }

    /// Marks the lease lost with the node failures that caused it (the first loss and its cause win).
    pub(crate) fn mark_lost_by(
        &self,
        reason: LossReason,
        source: Option<QuorumError>,
    ) -> LossReason {
        let poke;
        let (reason, waiters, first) = {
            let mut st = self.lock();
            let first;
            (first, poke) = st.h.lose_and_poke(reason);
            if first {
                // Without a cause of its own (an expiry), the loss keeps the one recorded while at risk.
                if let Some(source) = source {
                    st.loss_source = Some(Box::new(source));
                }
            }
            // Lost while the renewer has nothing in flight for it (`poke`): it should clean up now, not at
            // the next planned renewal (whoever holds an extension permit hands the lease back when it ends).
            let report = (first && !st.h.ended).then_some(st.h.valid_until);
            (st.h.lost.unwrap_or(reason), st.take_waiters(), report)
        };
        if let Some(valid_until) = first {
            let now = self.now();
            self.engine.hook.emit(
                &self.key,
                self.id,
                now,
                EventKind::Lost {
                    reason,
                    valid_until,
                    held_for: now.saturating_duration_since(self.acquired_at),
                },
            );
        }
        wake(waiters);
        if poke {
            self.requeue(RenewalStep::RenewAt(self.now()));
        }
        reason
    }

    /// The loss reason and its cause, for an error reported after the fact.
    pub(crate) fn loss_error(&self) -> Option<Error> {
        let st = self.lock();
        let reason = st.h.lost?;
        let source = st.loss_source.clone();
        drop(st);
        Some(Error::Lost {
            key: self.key.to_string(),
            reason,
            source,
        })
    }

    /// The validity deadline if the lease is still held at `now`; otherwise the loss reason (marking an
    /// expiry as a loss).
    pub(crate) fn current(&self, now: Instant) -> Result<Instant, LossReason> {
        let status = {
            let st = self.lock();
            // The wall clock is read only where a suspend can be told (a round with a wall reading).
            let wall_now = st.h.wall_started.and_then(|_| self.engine.timer.wall_now());
            st.h.status(now, wall_now, self.drift(), self.hold_until)
        };
        match status {
            Status::Valid(valid_until) => Ok(valid_until),
            Status::Gone(reason) => Err(reason),
            Status::Lapsed(reason) => Err(self.mark_lost(reason)),
        }
    }

    /// Why a lease whose deadline `valid_until` passed is lost: it expired, or it reached its hold limit.
    pub(crate) fn expiry_reason(&self, valid_until: Instant) -> LossReason {
        crate::machine::holding::expiry_reason(valid_until, self.hold_until)
    }

    /// The drift allowance of this lease's TTL.
    pub(crate) fn drift(&self) -> Duration {
        crate::machine::validity::drift(self.ttl, self.engine.config.drift_factor())
    }

    pub(crate) fn lost_error(&self, reason: LossReason, source: Option<QuorumError>) -> Error {
        Error::Lost {
            key: self.key.to_string(),
            reason,
            source: source.map(Box::new),
        }
    }

    /// Gives the lease up: marks it lost and deletes our token wherever it may remain.
    pub(crate) async fn give_up(&self, reason: LossReason, source: Option<QuorumError>) -> Error {
        let reason = self.mark_lost_by(reason, source.clone());
        self.clean_up().await;
        self.lost_error(reason, source)
    }

    /// Deletes our token on every node (always safe: compare-and-delete touches only our own key), once.
    /// Never after a handoff: the key is the resuming process's lease then.
    pub(crate) async fn clean_up(&self) {
        {
            if !self.lock().h.must_clean_up() {
                return;
            }
        }
        let _ = self
            .engine
            .cleanup(
                &self.key,
                &self.token,
                self.op_timeout,
                None,
                (self.id, CleanupCause::Lost),
            )
            .await;
        self.lock().h.cleaned = true;
    }

    /// Waits until no other extension of this lease is in flight, then claims the right to extend.
    pub(crate) async fn extend_permit(self: &Arc<Self>) -> ExtendPermit {
        let id = waiter_id();
        let registered = Deregister { shared: self, id };
        std::future::poll_fn(|cx| {
            let mut st = registered.shared.lock();
            if st.h.take_permit() {
                Poll::Ready(())
            } else {
                st.register(id, cx.waker());
                Poll::Pending
            }
        })
        .await;
        drop(registered);
        ExtendPermit {
            shared: Arc::clone(self),
        }
    }

    /// One extension round with `ttl`, bounded by `timeout`.
    ///
    /// An extension whose outcome is unknown on a node may still be carried out there later, after later
    /// rounds (on a pool or a reconnected connection), and a request may even be carried out twice (a
    /// client library's retry). The node contract makes that harmless: an extension never shortens a key
    /// ([`RedisNode`](crate::RedisNode#extensions-never-shorten-a-key)). On top of it, a node where an
    /// extension with a shorter TTL than `ttl` is unconfirmed does not count towards this round's quorum (one
    /// with an equal or longer TTL can only lengthen the key), which also keeps a node that does not honour
    /// the never-shorten rule safe against late (not duplicated) requests.
    ///
    /// Before sending, the deadline is capped at what this round would give if it succeeded now: a lease
    /// believes no more than the TTL it last asked for, even where the key keeps a longer one.
    pub(crate) async fn extend_once(
        &self,
        ttl: Ttl,
        timeout: Duration,
        renewal: bool,
    ) -> Extension {
        let planned = self.prepare_extension(ttl);
        let r = self
            .engine
            .extend_round(&self.key, &self.token, ttl, timeout, &planned, self.id)
            .await;
        self.undo_repair_if_ended(planned.missing).await;
        self.finish_extension(ttl, renewal, &r.tally, r.times())
    }

    /// Before an extension round with `ttl`, before any of its requests is sent: records the round as possibly
    /// applied on every node (until its answers say otherwise: its future may be dropped at any await), caps
    /// the deadline (see [`extend_once`](Self::extend_once)) and returns the per-node TTLs of unconfirmed
    /// earlier requests, and the nodes still missing the key.
    pub(crate) fn prepare_extension(&self, ttl: Ttl) -> Planned {
        let engine = &self.engine;
        let factor = engine.config.drift_factor();
        let now = self.now();
        let cap = crate::machine::validity::valid_until(now, ttl, factor).unwrap_or(now);
        let mut st = self.lock();
        let (planned, capped) = st.h.plan_extension(engine.nodes.len(), ttl, cap);
        if capped {
            let waiters = st.take_waiters();
            drop(st);
            engine.hook.emit(
                &self.key,
                self.id,
                now,
                EventKind::Capped { valid_until: cap },
            );
            wake(waiters);
        }
        planned
    }

    /// After an extension round with `ttl` whose replies for this lease are `tally`: records the nodes
    /// where it may have been applied unconfirmed and turns the tally into an [`Extension`].
    pub(crate) fn finish_extension(
        &self,
        ttl: Ttl,
        renewal: bool,
        tally: &Tally,
        times: RoundTimes,
    ) -> Extension {
        let RoundTimes {
            started,
            ended,
            wall,
        } = times;
        let engine = &self.engine;
        if engine.hook.active() {
            engine.hook.emit(
                &self.key,
                self.id,
                ended,
                EventKind::Extension {
                    renewal,
                    nodes: Nodes::new(tally),
                    round: ended.saturating_duration_since(started),
                },
            );
        }
        let n = engine.nodes.len();
        self.handle_round(n, tally);
        if tally.verdict() == Verdict::Quorum {
            let drift = crate::machine::validity::drift(ttl, engine.config.drift_factor());
            return match deadline_after_round(started, ended, ttl, engine.config.drift_factor())
                .filter(|_| !times.suspended(drift))
            {
                Some(valid_until) => Extension::Extended {
                    started,
                    wall_started: wall.0,
                    valid_until,
                },
                None => Extension::Failed(None),
            };
        }
        if tally.refused() {
            return Extension::NotHeld;
        }
        Extension::Failed(Some(QuorumError::new(
            Operation::Extend,
            tally.yes(),
            tally.required(),
            tally.errors(),
        )))
    }

    /// A round of this lease planned by [`prepare_extension`](Self::prepare_extension) ended with `tally`
    /// (of `n` nodes): the nodes that answered are confirmed, and a yes proves the key there.
    pub(crate) fn handle_round(&self, n: usize, tally: &Tally) {
        self.lock().h.handle_round(n, tally);
    }

    /// Whether some node never confirmed this lease's key (see [`repair`](Self::repair)).
    pub(crate) fn needs_repair(&self) -> bool {
        self.lock().h.needs_repair()
    }

    /// Writes this lease's key, with its own token and TTL, on the nodes that never confirmed it: a Redlock
    /// acquisition wins at a quorum and lets the stragglers go, and a lease held by a bare majority survives
    /// no further node failure. Safe while the lease holds a confirmed majority: a node can hold one token at
    /// a time, and [`RedisNode::acquire`](crate::RedisNode::acquire) changes nothing where another owner
    /// holds the key. Recorded like an extension round (planned before it is sent, confirmed by answers), so
    /// a late landing cannot shorten a later extension. Run on the manager's spawner right after the
    /// acquisition; without one, the lease's next extension round does the same (see
    /// [`Engine::extend_round`]).
    pub(crate) async fn repair(self: Arc<Self>) {
        let n = self.engine.nodes.len();
        for attempt in 0..REPAIR_ATTEMPTS {
            if attempt > 0 {
                let at = crate::time::add(self.now(), self.engine.config.retry_delay());
                self.engine.timer.sleep_until(at).await;
            }
            let permit = self.extend_permit().await;
            let now = self.now();
            let Ok(valid_until) = self.current(now) else {
                return;
            };
            // Planned before anything is sent; only the missing nodes are asked.
            let Some(targets) = self.lock().h.plan_repair(n, self.ttl) else {
                // An extension round confirmed the key meanwhile.
                return;
            };
            // The first round is short: the permit it holds delays the holder's own extensions (which would
            // ask the missing nodes too), and a healthy node answers at once. A node that does not answer in
            // time (a connection still being opened) is asked again a retry delay later, with the operation
            // timeout.
            let bound = if attempt == 0 {
                crate::driver::grace_floor(self.op_timeout)
            } else {
                self.op_timeout
            };
            let timeout = bound.min(valid_until.saturating_duration_since(now));
            let r = self
                .engine
                .repair_round(&self.key, &self.token, self.ttl, timeout, targets)
                .await;
            self.handle_round(n, &r.tally);
            drop(permit);
            self.undo_repair_if_ended(targets).await;
            // Done once every missing node answered (yes, or no: another owner holds it there); a node that
            // failed (not connected yet, timed out) is asked again.
            if !r.tally.errors().iter().any(|(i, _)| targets.contains(*i)) {
                return;
            }
        }
    }

    /// After a round that asked `targets` with [`RedisNode::acquire`](crate::RedisNode::acquire) (a repair):
    /// if the lease ended or was lost meanwhile, a write that landed after the release's compare-and-delete
    /// must not outlive it: our token is deleted there again. Not after a handoff: the key is the resuming
    /// process's lease now (the ticket carries the write as in flight).
    pub(crate) async fn undo_repair_if_ended(&self, targets: NodeSet) {
        if targets.is_empty() {
            return;
        }
        if !self.lock().h.must_undo_writes() {
            return;
        }
        let only: Vec<usize> = (0..self.engine.nodes.len())
            .filter(|&i| targets.contains(i))
            .collect();
        let _ = self
            .engine
            .cleanup(
                &self.key,
                &self.token,
                self.op_timeout,
                Some(&only),
                (self.id, CleanupCause::Lost),
            )
            .await;
    }

    /// Records a successful extension unless the lease was lost or expired meanwhile. A deadline that moves
    /// earlier wakes every waiter: loss signals and the renewal loop plan for the old, later deadline.
    pub(crate) fn apply(
        &self,
        started: Instant,
        wall_started: Option<SystemTime>,
        valid_until: Instant,
        renewal: bool,
    ) -> Result<(), LossReason> {
        let now = self.now();
        let valid_until = self.schedule().cap(valid_until);
        let changed =
            self.lock()
                .h
                .extended(now, started, wall_started, valid_until, self.hold_until);
        match changed {
            Ok(change) => {
                self.report_extended(now, valid_until, change, renewal);
                Ok(())
            }
            Err(NotExtended::Lapsed(reason)) => Err(self.mark_lost(reason)),
            Err(NotExtended::Gone(reason)) => Err(reason),
        }
    }

    /// An extension (`renewal`: by a renewer) left the lease valid until `valid_until`, recorded at `now` with
    /// `change`: the cause of an earlier failure is dropped, the events reported, and waiters woken if the
    /// deadline moved earlier (loss signals and the renewal loop plan for the old, later deadline).
    pub(crate) fn report_extended(
        &self,
        now: Instant,
        valid_until: Instant,
        change: Extended,
        renewal: bool,
    ) {
        let Extended {
            earlier,
            recovered_from: was_at_risk,
        } = change;
        let waiters = {
            let mut st = self.lock();
            // Extended: an earlier failure is no longer the cause of anything.
            st.loss_source = None;
            if earlier {
                st.take_waiters()
            } else {
                Vec::new()
            }
        };
        self.engine.hook.emit(
            &self.key,
            self.id,
            now,
            EventKind::Extended {
                valid_until,
                renewal,
            },
        );
        if let Some(since) = was_at_risk {
            self.engine.hook.emit(
                &self.key,
                self.id,
                now,
                EventKind::Recovered {
                    valid_until,
                    at_risk_for: now.saturating_duration_since(since),
                },
            );
        }
        wake(waiters);
    }

    /// A manual extension failed without proving the lease gone (too few nodes answered). Like a failed
    /// renewal round: the lease stays held until its deadline, at risk, retryable; the cause is kept for the
    /// loss at the deadline if nothing extends it. Lost already (expired during the round): given up.
    pub(crate) async fn extension_failed(&self, source: QuorumError) -> Error {
        let now = self.now();
        let valid_until = match self.current(now) {
            Ok(valid_until) => valid_until,
            Err(reason) => return self.give_up(reason, Some(source)).await,
        };
        self.note_at_risk(now, valid_until, Some(&source));
        self.keep_loss_source(source.clone());
        source.into()
    }

    /// Marks the lease at risk since `now` (an extension failed without proving it gone) and reports it.
    pub(crate) fn note_at_risk(
        &self,
        now: Instant,
        valid_until: Instant,
        error: Option<&QuorumError>,
    ) {
        let first = self.lock().h.at_risk_since(now);
        self.report_at_risk(now, valid_until, error, first);
    }

    /// Reports the lease at risk at `now` (`first`: since this failure), valid until `valid_until`.
    pub(crate) fn report_at_risk(
        &self,
        now: Instant,
        valid_until: Instant,
        error: Option<&QuorumError>,
        first: bool,
    ) {
        self.engine.hook.emit(
            &self.key,
            self.id,
            now,
            EventKind::AtRisk {
                valid_until,
                error,
                first,
            },
        );
    }

    /// Keeps `source` as the cause of a loss at the deadline, should nothing extend the lease before.
    pub(crate) fn keep_loss_source(&self, source: QuorumError) {
        let mut st = self.lock();
        if st.h.lost.is_none() {
            st.loss_source = Some(Box::new(source));
        }
    }

    /// Claims the single renewal loop of this lease; `false` if one already runs.
    pub(crate) fn claim_renewal(&self) -> bool {
        self.lock().h.claim_renewal()
    }

    /// Renews this lease in the background (its claim held by the caller): in the manager's shared renewer's
    /// batches when renewal batching is on, otherwise in a task of its own on `spawner`.
    pub(crate) fn renew_in_background(self: &Arc<Self>, spawner: &Arc<dyn Spawn>) {
        if self.engine.batch_size().is_some() {
            // No task of its own: the manager's shared renewer renews it with others in batches.
            self.renew_batched();
        } else {
            // Boxed once: the renewal loop stops by itself when the lease ends.
            spawner.spawn(Box::pin(Arc::clone(self).renew()));
        }
    }

    /// Hands this lease's renewal (whose claim the caller holds) to the manager's shared renewer.
    pub(crate) fn renew_batched(&self) {
        self.lock().h.renew_batched();
        self.requeue(self.replan());
    }

    /// Plans the renewer's next visit of this lease by `step`, superseding any entry queued before. Nothing
    /// if the renewer does not renew it (any more), or it ended.
    pub(crate) fn requeue(&self, step: RenewalStep) {
        if let Some(entry) = self.entry(step) {
            crate::driver::batch::queue(&self.engine, [entry]);
        }
    }

    /// A new renewer entry for this lease planned by `step` (superseding earlier ones), unless the renewer
    /// does not renew it (any more) or it ended.
    pub(crate) fn entry(&self, step: RenewalStep) -> Option<crate::batch_queue::Entry> {
        let generation = self.lock().h.next_entry()?;
        Some(crate::batch_queue::Entry::new(
            self.me.clone(),
            generation,
            step,
        ))
    }

    /// Releases the extension permit and wakes waiters; `true` if the renewer renews this lease.
    pub(crate) fn release_permit(&self) -> bool {
        let (waiters, batched) = {
            let mut st = self.lock();
            let batched = st.h.release_permit();
            (st.take_waiters(), batched)
        };
        wake(waiters);
        batched
    }

    /// The renewer's visit of this lease at a due entry of generation `generation` (`lost_at`: the plan was
    /// to give up at the deadline). The same steps as one turn of [`renew`](Self::renew)'s loop before its
    /// round: `Some((timeout, valid_until))` if a round should run now (the extension permit is then held
    /// until [`batch_outcome`](Self::batch_outcome)); `None` if not (skipped, re-planned, or given up).
    pub(crate) fn visit(&self, generation: u32, lost_at: bool) -> Option<(Duration, Instant)> {
        let visit = self.lock().h.visit(generation);
        match visit {
            Visit::Skip | Visit::Busy => return None,
            Visit::CleanUp => {
                self.spawn_clean_up();
                return None;
            }
            Visit::Go => {}
        }
        let now = self.now();
        let valid_until = match self.current(now) {
            Ok(v) => v,
            Err(LossReason::Released) => {
                self.release_permit();
                return None;
            }
            Err(reason) => {
                self.give_up_batched(reason, None);
                return None;
            }
        };
        if lost_at {
            // A manual extension moved the deadline since we planned to give up: plan afresh.
            self.release_permit();
            self.requeue(self.replan());
            return None;
        }
        match self.schedule().round_timeout(now, valid_until) {
            Some(timeout) => Some((timeout, valid_until)),
            None => {
                self.give_up_batched(self.expiry_reason(valid_until), None);
                None
            }
        }
    }

    /// After a batched round for this lease (started by [`visit`](Self::visit), whose `valid_until` it was):
    /// the same steps as the end of one turn of [`renew`](Self::renew)'s loop. Returns the renewer's entry
    /// for the next visit, if there is one.
    pub(crate) fn batch_outcome(
        &self,
        outcome: Extension,
        valid_until: Instant,
    ) -> Option<crate::batch_queue::Entry> {
        match self.after_renewal(outcome, valid_until) {
            AfterRenewal::Next(step) => {
                self.release_permit();
                self.entry(step)
            }
            AfterRenewal::Ended => {
                self.release_permit();
                None
            }
            AfterRenewal::GiveUp(reason) => {
                self.give_up_batched(reason, None);
                None
            }
        }
    }

    /// What follows a renewal round of this lease that ended with `outcome` (`valid_until`: the deadline
    /// the round was planned for), for both renewers (a lease's own loop and the shared renewer): records an
    /// extension, or the lease at risk (keeping the cause for a loss at the deadline), and says what next.
    pub(crate) fn after_renewal(&self, outcome: Extension, valid_until: Instant) -> AfterRenewal {
        let (end, source) = match outcome {
            Extension::Extended {
                started,
                wall_started,
                valid_until,
            } => (
                RoundEnd::Extended {
                    started,
                    wall_started,
                    valid_until,
                },
                None,
            ),
            Extension::NotHeld => (RoundEnd::NotHeld, None),
            Extension::Failed(source) => (
                RoundEnd::Failed {
                    caused: source.is_some(),
                },
                source,
            ),
        };
        let now = self.now();
        let schedule = self.schedule();
        let renewed =
            self.lock()
                .h
                .renewal_ended(now, end, valid_until, &schedule, self.hold_until);
        match renewed {
            Renewed::Extended {
                valid_until,
                change,
                next,
            } => {
                self.report_extended(now, valid_until, change, true);
                AfterRenewal::Next(next)
            }
            Renewed::AtRisk {
                first,
                next,
                keep_cause,
            } => {
                self.report_at_risk(now, valid_until, source.as_ref(), first);
                if let (true, Some(source)) = (keep_cause, source) {
                    // If nothing else extends the lease, it is lost at the deadline for this cause.
                    self.keep_loss_source(source);
                }
                AfterRenewal::Next(next)
            }
            Renewed::Ended => AfterRenewal::Ended,
            Renewed::GiveUp(reason) => AfterRenewal::GiveUp(reason),
        }
    }

    /// A batched round for this lease was dropped before it ended: the permit is released and the renewer's
    /// next visit is due now. (The extension may have been applied on any node: that was recorded when the
    /// round was planned, see [`prepare_extension`](Self::prepare_extension).)
    pub(crate) fn abandon_batch(&self) -> Option<crate::batch_queue::Entry> {
        self.release_permit();
        self.entry(RenewalStep::RenewAt(self.now()))
    }

    /// The end of a batched round for this lease: [`finish_extension`](Self::finish_extension) on the
    /// round's `tally`, then [`batch_outcome`](Self::batch_outcome).
    pub(crate) fn settle_batched(
        &self,
        tally: &Tally,
        started: Instant,
        wall_started: Option<SystemTime>,
        valid_until: Instant,
    ) -> Option<crate::batch_queue::Entry> {
        let ended = self.now();
        let wall = (wall_started, self.engine.timer.wall_now());
        let times = RoundTimes {
            started,
            ended,
            wall,
        };
        let outcome = self.finish_extension(self.ttl, true, tally, times);
        self.batch_outcome(outcome, valid_until)
    }

    /// Gives the lease up from the renewer, which holds the extension permit: it stops renewing it, marks it
    /// lost and deletes our token in the background.
    pub(crate) fn give_up_batched(&self, reason: LossReason, source: Option<QuorumError>) {
        self.lock().h.stop_batched();
        self.release_permit();
        self.mark_lost_by(reason, source);
        self.spawn_clean_up();
    }

    /// [`clean_up`](Self::clean_up) on the manager's spawner.
    pub(crate) fn spawn_clean_up(&self) {
        if let (Some(spawner), Some(me)) = (&self.engine.spawner, self.me.upgrade()) {
            spawner.spawn(Box::pin(async move { me.clean_up().await }));
        }
    }

    /// Gives up the renewal claim and wakes waiters, so that another [`Lease::run`] can take it over.
    pub(crate) fn unclaim_renewal(&self) {
        let waiters = {
            let mut st = self.lock();
            st.h.unclaim_renewal();
            st.take_waiters()
        };
        wake(waiters);
    }

    /// Ends the lease locally (release, drop or handoff): stops renewal, resolves loss signals. Returns the
    /// loss reason if the lease was already lost or expired.
    pub(crate) fn end(&self, how: Ending) -> Option<LossReason> {
        let now = self.now();
        let (prior, unnoticed, valid_until, waiters) = {
            let mut st = self.lock();
            let unnoticed = st.h.end(now, self.hold_until);
            st.h.handed_off = matches!(how, Ending::HandedOff) && st.h.lost.is_none();
            (st.h.lost, unnoticed, st.h.valid_until, st.take_waiters())
        };
        let kind = match prior {
            // Expired without anybody noticing: the loss is reported now, before the lease ends.
            Some(reason) if unnoticed => Some(EventKind::Lost {
                reason,
                valid_until,
                held_for: now.saturating_duration_since(self.acquired_at),
            }),
            Some(_) => None,
            None => Some(match how {
                Ending::HandedOff => EventKind::HandedOff {
                    held_for: now.saturating_duration_since(self.acquired_at),
                },
                Ending::Released | Ending::Dropped => EventKind::Released {
                    dropped: matches!(how, Ending::Dropped),
                    held_for: now.saturating_duration_since(self.acquired_at),
                },
            }),
        };
        if let Some(kind) = kind {
            self.engine.hook.emit(&self.key, self.id, now, kind);
        }
        wake(waiters);
        prior
    }

    /// Automatic renewal until the lease ends (released or dropped) or is lost.
    ///
    /// A renewal round already in flight when the lease ends runs to its end (bounded by the operation
    /// timeout; compare-and-pexpire cannot resurrect a released key); no new round starts after it.
    pub(crate) async fn renew(self: Arc<Self>) {
        // The schedule is rebuilt from the lease's fields where needed instead of living in this future's
        // state: thousands of these futures may sleep at once.
        let mut step = self.replan();
        loop {
            let at = match step {
                RenewalStep::RenewAt(t) | RenewalStep::LostAt(t) => t,
            };
            match self.sleep_unless_ended(at).await {
                Woken::Due => {}
                Woken::Ended => return,
                Woken::Lost => {
                    // Whoever noticed the loss may not have deleted our token (a loss signal only observes).
                    Box::pin(self.clean_up()).await;
                    return;
                }
                Woken::Moved => {
                    // A manual extension moved the deadline earlier than this plan allows for.
                    step = self.replan();
                    continue;
                }
            }
            let permit = self.extend_permit().await;
            let now = self.now();
            let valid_until = match self.current(now) {
                Ok(v) => v,
                Err(LossReason::Released) => return,
                Err(reason) => {
                    drop(permit);
                    let _ = Box::pin(self.give_up(reason, None)).await;
                    return;
                }
            };
            if matches!(step, RenewalStep::LostAt(_)) {
                // A manual extension moved the deadline since we planned to give up: plan afresh.
                step = self.replan();
                continue;
            }
            let Some(timeout) = self.schedule().round_timeout(now, valid_until) else {
                drop(permit);
                let _ = Box::pin(self.give_up(self.expiry_reason(valid_until), None)).await;
                return;
            };
            // Boxed: a lease spends nearly all its life asleep between rounds, and thousands may be held at once,
            // so the round's state lives on the heap only while a round runs.
            let span = crate::trace::span(crate::trace::SpanOf::Renewal(
                &self.key,
                self.engine.mode,
                self.id,
            ));
            let round = crate::trace::instrument(span, self.extend_once(self.ttl, timeout, true));
            let outcome = Box::pin(round).await;
            match self.after_renewal(outcome, valid_until) {
                AfterRenewal::Next(next) => step = next,
                AfterRenewal::Ended => return,
                AfterRenewal::GiveUp(reason) => {
                    drop(permit);
                    let _ = Box::pin(self.give_up(reason, None)).await;
                    return;
                }
            }
        }
    }

    /// The next renewal step from the lease's current deadline and the start of the round that set it.
    pub(crate) fn replan(&self) -> RenewalStep {
        let (started, valid_until) = {
            let st = self.lock();
            (st.h.round_started, st.h.valid_until)
        };
        self.schedule().after_success(started, valid_until)
    }

    /// The renewal schedule of this lease (only called for leases with an automatic-renewal interval).
    pub(crate) fn schedule(&self) -> RenewalSchedule {
        RenewalSchedule::new(
            self.renew_interval.unwrap_or(self.ttl.as_duration() / 3),
            self.engine.config.retry_delay(),
            self.op_timeout,
        )
        .with_hold_limit(self.hold_until)
    }

    /// Sleeps until `at`; resolves early if the lease ends or is lost, or its deadline moves earlier.
    pub(crate) fn sleep_unless_ended(&self, at: Instant) -> SleepUnlessEnded<'_> {
        SleepUnlessEnded {
            shared: self,
            id: waiter_id(),
            planned_for: self.lock().h.valid_until,
            sleep: self.engine.timer.sleep_until(at),
        }
    }
}

/// How many rounds [`Shared::repair`] makes at most (a retry delay apart) while a missing node does not
/// answer; after that the lease's extension rounds ask it.
pub(crate) const REPAIR_ATTEMPTS: u32 = 4;

/// How a lease ends locally (see [`Shared::end`]).
#[derive(Clone, Copy)]
pub(crate) enum Ending {
    Released,
    Dropped,
    HandedOff,
}

/// What follows a renewal round (see [`Shared::after_renewal`]).
pub(crate) enum AfterRenewal {
    /// Renew (or give up) as planned by this step.
    Next(RenewalStep),
    /// The lease was released meanwhile: nothing more to renew.
    Ended,
    /// Lost for this reason: stop renewing, mark it lost and delete our token.
    GiveUp(LossReason),
}

/// How a [`SleepUnlessEnded`] ended.
pub(crate) enum Woken {
    /// The planned instant came.
    Due,
    /// The lease ended (released, dropped): nothing more to renew.
    Ended,
    /// The lease was lost (e.g. a manual extension failed, or its deadline passed): nothing more to renew.
    Lost,
    /// The validity deadline moved earlier than when the sleep was planned.
    Moved,
}

/// See [`Shared::sleep_unless_ended`]. A named future rather than an `async fn`, because it sits inside every
/// sleeping renewal loop and its state should be only what it needs.
pub(crate) struct SleepUnlessEnded<'a> {
    shared: &'a Shared,
    id: u64,
    planned_for: Instant,
    sleep: Sleep,
}

impl Future for SleepUnlessEnded<'_> {
    type Output = Woken;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Woken> {
        let this = &mut *self;
        {
            let mut st = this.shared.lock();
            if let Some(woken) = st.woken(this.planned_for) {
                return Poll::Ready(woken);
            }
            st.register(this.id, cx.waker());
        }
        this.sleep.as_mut().poll(cx).map(|()| Woken::Due)
    }
}

impl Drop for SleepUnlessEnded<'_> {
    fn drop(&mut self) {
        self.shared.lock().deregister(self.id);
    }
}

/// [`SleepUnlessEnded`] for the parts of a set renewed together ([`renew_together`]), with one timer for all:
/// resolves with the first part (in order) that ended, was lost or whose deadline moved earlier than when
/// the sleep was planned, or with [`Woken::Due`] (index 0) at the planned instant.
pub(crate) struct SleepUnlessAnyEnded<'a> {
    parts: &'a [Arc<Shared>],
    id: u64,
    /// Per part, its deadline when the sleep was planned.
    planned_for: Vec<Instant>,
    sleep: Sleep,
}

impl<'a> SleepUnlessAnyEnded<'a> {
    pub(crate) fn new(parts: &'a [Arc<Shared>], engine: &Engine, at: Instant) -> Self {
        Self {
            parts,
            id: waiter_id(),
            planned_for: parts.iter().map(|p| p.lock().h.valid_until).collect(),
            sleep: engine.timer.sleep_until(at),
        }
    }
}

impl Future for SleepUnlessAnyEnded<'_> {
    type Output = (usize, Woken);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<(usize, Woken)> {
        let this = &mut *self;
        for (i, (part, &planned_for)) in this.parts.iter().zip(&this.planned_for).enumerate() {
            // Checked and registered under one lock, so a change in between cannot be missed.
            let mut st = part.lock();
            if let Some(woken) = st.woken(planned_for) {
                return Poll::Ready((i, woken));
            }
            st.register(this.id, cx.waker());
        }
        this.sleep.as_mut().poll(cx).map(|()| (0, Woken::Due))
    }
}

impl Drop for SleepUnlessAnyEnded<'_> {
    fn drop(&mut self) {
        for part in self.parts {
            part.lock().deregister(self.id);
        }
    }
}

/// Removes a waiter's waker when its future is dropped.
pub(crate) struct Deregister<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Deregister<'_> {
    fn drop(&mut self) {
        self.shared.lock().deregister(self.id);
    }
}

/// The right to run one extension round; released (and waiters woken) on drop, including cancellation.
pub(crate) struct ExtendPermit {
    pub(crate) shared: Arc<Shared>,
}

impl Drop for ExtendPermit {
    fn drop(&mut self) {
        let batched = self.shared.release_permit();
        if batched {
            // A manual extension of a lease the renewer renews: the renewer may have skipped it meanwhile, or
            // planned for a deadline that moved: it plans afresh from the lease as it is now.
            self.shared.requeue(self.shared.replan());
        }
    }
}

/// Clears the renewal claim of a scoped [`Lease::run`], if it took one, when it ends or is dropped.
pub(crate) struct RenewalClaim<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) held: bool,
}

impl Drop for RenewalClaim<'_> {
    fn drop(&mut self) {
        if self.held {
            self.shared.unclaim_renewal();
        }
    }
}

/// The engine of `parts` if one step of its node can extend them all ([`MultiKeyOp::Extend`]): a single
/// node in single mode (not a semaphore's permits), every part on it, none missing its key.
pub(crate) fn one_step_engine<'a>(
    parts: impl Iterator<Item = &'a Shared> + Clone,
) -> Option<Arc<Engine>> {
    let engine = Arc::clone(&parts.clone().next()?.engine);
    let one_node = engine.mode == Mode::Single
        && engine.nodes.len() == 1
        && !engine.permits
        && parts
            .into_iter()
            .all(|p| Arc::ptr_eq(&p.engine, &engine) && !p.needs_repair());
    one_node.then_some(engine)
}

/// One extension round of `parts` to `ttl` as one atomic step of `engine`'s node ([`MultiKeyOp::Extend`]),
/// bounded by `timeout`; the caller holds every part's extension permit. Each part's round is recorded as
/// possibly applied before the request is sent ([`Shared::prepare_extension`]: the future may be dropped at
/// any await), and its flag in the answer becomes its own [`Extension`], as if it had been its own round
/// ([`Shared::finish_extension`], which reports it with `renewal`).
///
/// `None` when the node cannot take the step (a definite `Unsupported`: nothing was applied, and no round is
/// reported): the records are settled, and the parts must be extended one by one.
pub(crate) async fn extend_in_one_step(
    engine: &Engine,
    parts: &[&Shared],
    ttl: Ttl,
    timeout: Duration,
    renewal: bool,
) -> Option<Vec<Extension>> {
    if parts.is_empty() {
        return Some(Vec::new());
    }
    // Recorded as possibly applied before the request is sent (see `Shared::prepare_extension`).
    let planned: Vec<Planned> = parts.iter().map(|p| p.prepare_extension(ttl)).collect();
    let items: Vec<MultiKeyItem<'_>> = parts
        .iter()
        .map(|p| MultiKeyItem::new(&p.key, &p.token))
        .collect();
    let items_ref = &items;
    let r = engine
        .round(
            WaitFor::All,
            false,
            timeout,
            move |_, node| node.multi_key(items_ref, MultiKeyOp::Extend { ttl }),
            |_| true,
        )
        .await;
    let (flags, error) = match r.values.first().cloned().flatten() {
        Some(MultiKeyReply::Done(flags)) if flags.len() == items.len() => (flags, None),
        Some(other) => (
            Vec::new(),
            Some(NodeError::ambiguous(
                NodeErrorKind::Protocol,
                format!(
                    "multi_key answered {other:?} to an extension of {} keys",
                    items.len()
                ),
            )),
        ),
        None => (
            Vec::new(),
            Some(
                r.tally
                    .errors()
                    .into_iter()
                    .next()
                    .map_or_else(|| NodeError::timed_out(timeout), |(_, e)| e),
            ),
        ),
    };
    let unsupported = error
        .as_ref()
        .is_some_and(|e| e.kind() == NodeErrorKind::Unsupported && !e.is_ambiguous());
    let tallies = planned.iter().enumerate().map(|(k, planned)| {
        let reply = match (&error, flags.get(k).copied()) {
            (Some(e), _) => Reply::Failed(e.clone()),
            (None, Some(true)) if counts(planned.unconfirmed.as_deref(), 0, ttl) => Reply::Yes,
            (None, Some(true)) => Reply::Failed(NodeError::ambiguous(
                NodeErrorKind::Other,
                "extended, but not counted: an earlier, shorter extension of this lease may still be \
                 applied on this node after it",
            )),
            (None, _) => Reply::No,
        };
        let mut tally = Tally::new(1, engine.quorum(), WaitFor::Decision);
        tally.handle_reply(0, reply);
        tally
    });
    if unsupported {
        // Nothing was applied: the records are settled (a definite answer), and no round happened.
        let n = engine.nodes.len();
        for (part, tally) in parts.iter().zip(tallies) {
            part.handle_round(n, &tally);
        }
        return None;
    }
    let times = r.times();
    Some(
        parts
            .iter()
            .zip(tallies)
            .map(|(part, tally)| part.finish_extension(ttl, renewal, &tally, times))
            .collect(),
    )
}

/// Whether the parts of a set may be renewed together, one step of their node per round
/// ([`renew_together`]): two or more, on a node that can extend them in one step (as for
/// [`Lease::extend_together`]), with one TTL, not renewed in the manager's batches (which already send many
/// keys per request), and not found unable to before.
pub(crate) fn renewable_together<'a>(parts: impl Iterator<Item = &'a Shared> + Clone) -> bool {
    let Some(first) = parts.clone().next() else {
        return false;
    };
    parts.clone().nth(1).is_some()
        && one_step_engine(parts.clone()).is_some_and(|e| e.batch_size().is_none())
        && parts
            .into_iter()
            .all(|p| p.ttl == first.ttl && !p.lock().separately)
}

/// How [`renew_together`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Together {
    /// Nothing more to renew: every part ended or was lost (stopping on a loss: a part was lost).
    Done,
    /// The node cannot extend the parts in one step (nothing was applied): each part is to be renewed on its
    /// own from now on, its renewal claim still held by the caller.
    Separately,
}

/// Automatic renewal of a set's parts (in key order) together: one step of their node per round
/// ([`MultiKeyOp::Extend`]) instead of one request per part. The caller holds every part's renewal claim and
/// checked [`renewable_together`].
///
/// Each turn is one turn of [`Shared::renew`]'s loop for every part at once: sleep until the earliest part's
/// planned step, woken early when a part ends, is lost or its deadline moves earlier (one timer for all);
/// take every part's extension permit, in key order (as a manual extension of the set does, so neither waits
/// for the other in a cycle); per part, its current deadline (a part lost meanwhile is given up, a part whose
/// planned loss a manual extension averted is re-planned); then one round for every part whose step is a
/// renewal — due or not yet, so that the parts stay in step — bounded by the earliest deadline. Every part's
/// round is recorded before the request is sent ([`extend_in_one_step`]), and its own outcome is applied as
/// its own renewal's would be (extended, at risk, or lost).
///
/// A part that ends leaves the set. A part that is lost is marked lost at once (every part lost in one turn
/// before any clean-up) and its token deleted; then, with `stop_on_loss` ([`run_all`], which stops the work
/// on any part's loss), this returns [`Together::Done`] once that is done; otherwise (background renewal)
/// the deletion runs on the manager's spawner and the other parts go on being renewed, as they were when
/// each had a loop of its own. [`Together::Separately`] when the node
/// answers that it cannot take the step: the parts are marked to be renewed one by one for the rest of
/// their hold.
pub(crate) async fn renew_together(mut parts: Vec<Arc<Shared>>, stop_on_loss: bool) -> Together {
    let Some(first) = parts.first() else {
        return Together::Done;
    };
    let engine = Arc::clone(&first.engine);
    let ttl = first.ttl;
    let mut steps: Vec<RenewalStep> = parts.iter().map(|p| p.replan()).collect();
    loop {
        let Some(at) = steps.iter().map(|&s| step_instant(s)).min() else {
            return Together::Done;
        };
        match SleepUnlessAnyEnded::new(&parts, &engine, at).await {
            (_, Woken::Due) => {}
            (i, Woken::Ended) => {
                parts.remove(i);
                steps.remove(i);
                continue;
            }
            (i, Woken::Lost) => {
                let part = parts.remove(i);
                steps.remove(i);
                // Whoever noticed the loss may not have deleted our token (a loss signal only observes).
                let_go(&part, stop_on_loss).await;
                if stop_on_loss {
                    return Together::Done;
                }
                continue;
            }
            (i, Woken::Moved) => {
                // A manual extension moved this part's deadline earlier than its plan allows for.
                steps[i] = parts[i].replan();
                continue;
            }
        }
        let mut permits = Vec::with_capacity(parts.len());
        for part in &parts {
            permits.push(part.extend_permit().await);
        }
        let now = engine.timer.now();
        // The parts in this round: index, deadline, bound.
        let mut members: Vec<(usize, Instant, Duration)> = Vec::with_capacity(parts.len());
        // The parts leaving the set: index, and the loss reason (`None`: ended).
        let mut leaving: Vec<(usize, Option<LossReason>)> = Vec::new();
        let mut due = false;
        for (i, part) in parts.iter().enumerate() {
            let valid_until = match part.current(now) {
                Ok(v) => v,
                Err(LossReason::Released) => {
                    leaving.push((i, None));
                    continue;
                }
                Err(reason) => {
                    leaving.push((i, Some(reason)));
                    continue;
                }
            };
            if let RenewalStep::LostAt(t) = steps[i] {
                if t > now {
                    // No renewal can finish in time: it waits for its deadline.
                    continue;
                }
                // A manual extension moved the deadline since we planned to give up: plan afresh.
                steps[i] = part.replan();
            }
            let RenewalStep::RenewAt(t) = steps[i] else {
                continue;
            };
            match part.schedule().round_timeout(now, valid_until) {
                Some(timeout) => {
                    due |= t <= now;
                    members.push((i, valid_until, timeout));
                }
                None => leaving.push((i, Some(part.expiry_reason(valid_until)))),
            }
        }
        if due {
            let timeout = members.iter().map(|m| m.2).min().unwrap_or_default();
            let in_round: Vec<&Shared> = members.iter().map(|m| &*parts[m.0]).collect();
            let lead = in_round[0];
            let span = crate::trace::span(crate::trace::SpanOf::Renewal(
                &lead.key,
                engine.mode,
                lead.id,
            ));
            let round = crate::trace::instrument(
                span,
                extend_in_one_step(&engine, &in_round, ttl, timeout, true),
            );
            let Some(outcomes) = Box::pin(round).await else {
                // The node cannot take the step (nothing was applied): each part on its own from now on.
                for part in &parts {
                    part.lock().separately = true;
                }
                return Together::Separately;
            };
            for (&(i, valid_until, _), outcome) in members.iter().zip(outcomes) {
                match parts[i].after_renewal(outcome, valid_until) {
                    AfterRenewal::Next(step) => steps[i] = step,
                    AfterRenewal::Ended => leaving.push((i, None)),
                    AfterRenewal::GiveUp(reason) => leaving.push((i, Some(reason))),
                }
            }
        }
        // Every part lost in this turn is marked lost before any clean-up round: its loss signals fire now.
        for &(i, reason) in &leaving {
            if let Some(reason) = reason {
                parts[i].mark_lost_by(reason, None);
            }
        }
        drop(permits);
        if leaving.is_empty() {
            continue;
        }
        leaving.sort_unstable_by_key(|&(i, _)| std::cmp::Reverse(i));
        let mut lost = Vec::new();
        for (i, reason) in leaving {
            let part = parts.remove(i);
            steps.remove(i);
            if reason.is_some() {
                lost.push(part);
            }
        }
        if lost.is_empty() {
            continue;
        }
        for part in &lost {
            let_go(part, stop_on_loss).await;
        }
        if stop_on_loss {
            return Together::Done;
        }
    }
}

/// Deletes the token of a part lost from a joint renewal ([`Shared::clean_up`]): awaited when the renewal
/// stops there (`wait`), otherwise on the manager's spawner, so that the other parts' next round does not
/// wait for it (it may take an operation timeout).
pub(crate) async fn let_go(part: &Arc<Shared>, wait: bool) {
    if wait || part.engine.spawner.is_none() {
        Box::pin(part.clean_up()).await;
    } else {
        part.spawn_clean_up();
    }
}

/// The instant a renewal step is planned for.
pub(crate) fn step_instant(step: RenewalStep) -> Instant {
    match step {
        RenewalStep::RenewAt(t) | RenewalStep::LostAt(t) => t,
    }
}

/// The shared renewer's view of a lease it renews (`crate::driver::batch`): the same steps as a turn of
/// [`Shared::renew`]'s loop, before and after a batched round.
impl crate::batch_queue::Batched for Shared {
    fn key(&self) -> &str {
        &self.key
    }

    fn token(&self) -> &Token {
        &self.token
    }

    fn ttl(&self) -> Ttl {
        self.ttl
    }

    fn id(&self) -> LeaseId {
        self.id
    }

    fn visit(&self, generation: u32, lost_at: bool) -> Option<(Duration, Instant)> {
        Shared::visit(self, generation, lost_at)
    }

    fn prepare(&self) -> Option<Box<[u64]>> {
        self.prepare_extension(self.ttl).unconfirmed
    }

    fn settle(
        &self,
        tally: &Tally,
        started: Instant,
        wall_started: Option<SystemTime>,
        valid_until: Instant,
    ) -> Option<crate::batch_queue::Entry> {
        self.settle_batched(tally, started, wall_started, valid_until)
    }

    fn abandon(&self) -> Option<crate::batch_queue::Entry> {
        self.abandon_batch()
    }
}
