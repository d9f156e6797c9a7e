//! The acquisition's driver: a [`Lock`]'s description, the rounds of its acquisitions, resumptions and
//! grants, up to the lease's shared state. Every decision is the
//! [`Acquisition`](crate::machine::acquisition::Acquisition) machine's; the public `Lock` methods
//! (builders, `try_acquire`, `acquire`, …) are in `crate::manager`.

use std::fmt;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use super::lease::{Grant, Shared};
use super::{AcquireRequest, Engine, Planned, RoundResult, TtlHint};
use crate::config::ConfigError;
use crate::error::{Error, LossReason, NotAcquiredReason, Operation, QuorumError};
use crate::machine::Verdict;
use crate::machine::acquisition::{Acquisition, Decision, Limit, Next, Shape};
use crate::machine::nodeset::NodeSet;
use crate::machine::unconfirmed::Unconfirmed;
use crate::mode::Mode;
use crate::node::Ttl;
use crate::notify::{Outcome, Watch};
use crate::observe::{AttemptOutcome, CleanupCause, EventKind, LeaseId, Nodes};
use crate::ticket::LeaseTicket;
use crate::time::SharedTimer;
use crate::token::Token;

/// The most bytes of [holder info](Lock::with_holder_info) a lock stores with its token.
pub const MAX_HOLDER_INFO_BYTES: usize = 256;

/// A description of a lock: its key and options. Acquiring it yields a [`Lease`](crate::Lease).
///
/// Cheap to clone; acquiring the same description from several tasks makes them contend.
#[derive(Clone)]
pub struct Lock {
    pub(crate) engine: Arc<Engine>,
    /// Shared with the leases it grants (no copy per acquisition).
    pub(crate) key: Arc<str>,
    pub(crate) expiry: Option<Duration>,
    pub(crate) renew_every: Option<Duration>,
    /// Renewal in the background on the manager's spawner ([`Lock::auto_renew`]).
    pub(crate) background: bool,
    pub(crate) fence_key: Option<String>,
    /// [`Lock::max_hold`], if set (else the manager's default).
    pub(crate) max_hold: Option<Duration>,
    /// [`Lock::with_holder_info`], stored after the token.
    pub(crate) holder_info: Option<Arc<str>>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.key)
            .field("expiry", &self.expiry_in_use())
            .field("renew_every", &self.renew_every)
            .field("background_renewal", &self.background)
            .field("fence_key", &self.fence_key)
            .field("max_hold", &self.max_hold_in_use())
            .field("holder_info", &self.holder_info)
            .finish()
    }
}

/// The tokens of one acquisition: the one its next attempt sends, and older ones whose clean-up was not
/// confirmed on some node (see the rotation in `acquire_with`).
///
/// Dropped before [`won`](Self::won) or [`failed`](Self::failed) — the acquisition future was cancelled — it
/// deletes every token in the background (if the manager has a spawner).
struct Tokens<'a> {
    /// The lock acquired: its engine, key and holder info (one reference keeps the acquisition future small).
    lock: &'a Lock,
    id: LeaseId,
    timeout: Duration,
    current: Token,
    stale: Vec<Token>,
    armed: bool,
}

impl<'a> Tokens<'a> {
    fn new(lock: &'a Lock, id: LeaseId, timeout: Duration) -> Result<Self, Error> {
        Ok(Self {
            lock,
            id,
            timeout,
            current: Token::random()?.with_info(lock.holder_info.as_deref()),
            stale: Vec::new(),
            armed: true,
        })
    }

    /// Before giving up, where an attempt that found the lock held still wrote (see
    /// `Engine::contention_writes`): deletes the current token, so that the acquisition leaves at once. (A
    /// future dropped meanwhile is still armed: its token is deleted in the background.)
    async fn withdraw(&self) {
        let _ = self
            .lock
            .engine
            .cleanup(
                &self.lock.key,
                &self.current,
                self.timeout,
                None,
                (self.id, CleanupCause::FailedAttempt),
            )
            .await;
    }

    /// Retires the current token (its clean-up is unconfirmed somewhere) and draws a new one.
    fn rotate(&mut self) -> Result<(), Error> {
        let next = Token::random()?.with_info(self.lock.holder_info.as_deref());
        self.stale.push(std::mem::replace(&mut self.current, next));
        Ok(())
    }

    /// The acquisition won with the current token: retired tokens are deleted in the background.
    fn won(&mut self) -> Token {
        self.armed = false;
        for token in std::mem::take(&mut self.stale) {
            self.lock.engine.spawn_cleanup(
                &self.lock.key,
                &token,
                self.timeout,
                (self.id, CleanupCause::StaleToken),
            );
        }
        self.current.clone()
    }

    /// The acquisition gave up after cleaning up its last attempt: retired tokens, whose clean-up did not
    /// answer, are deleted again in the background. (The current one was either confirmed gone everywhere or
    /// never sent.)
    fn failed(&mut self) {
        self.armed = false;
        for token in &self.stale {
            self.lock.engine.spawn_cleanup(
                &self.lock.key,
                token,
                self.timeout,
                (self.id, CleanupCause::StaleToken),
            );
        }
    }
}

impl Drop for Tokens<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Cancelled, possibly in the middle of a round: the current token may be anywhere.
            self.failed();
            self.lock.engine.spawn_cleanup(
                &self.lock.key,
                &self.current,
                self.timeout,
                (self.id, CleanupCause::Cancelled),
            );
        }
    }
}

/// What an acquisition carries from attempt to attempt (see `Lock::acquire_in`).
struct Attempts<'a> {
    acq: Acquisition<'a>,
    tokens: Tokens<'a>,
    /// Waiting with release notifications: a watch per notifying node.
    watches: Vec<Watch>,
    /// The holder's remaining TTL, learned by a waiting attempt that found the lock held.
    hint: Option<TtlHint>,
    ttl: Ttl,
}

/// Waits until a watch holds a notification, or until `pushed` while some watch's subscription is confirmed
/// and the lock was `held` (else until `polling`), driving the notifiers' subscription commands meanwhile.
async fn wait_for_release(
    timer: &SharedTimer,
    watches: &mut [Watch],
    held: bool,
    polling: Instant,
    pushed: Instant,
) {
    let mut sleep: Option<(Instant, crate::time::Sleep)> = None;
    std::future::poll_fn(|cx| {
        let now = timer.now();
        // Every watch is polled (each drives its notifier): notifications that arrive together, such as the
        // confirmed subscriptions of several Redlock nodes, are used by one attempt.
        let mut notified = false;
        for w in watches.iter_mut() {
            notified |= w.poll_notified(cx, now).is_ready();
        }
        if notified {
            return Poll::Ready(());
        }
        let target = if held && watches.iter().any(Watch::is_active) {
            pushed
        } else {
            polling
        };
        if sleep.as_ref().is_none_or(|(at, _)| *at != target) {
            sleep = Some((target, timer.sleep_until(target)));
        }
        match &mut sleep {
            Some((_, timer_sleep)) => timer_sleep.as_mut().poll(cx),
            None => Poll::Pending,
        }
    })
    .await
}

/// Checked parameters of one acquisition.
pub(crate) struct Plan {
    ttl: Ttl,
    op_timeout: Duration,
}

impl Lock {
    /// The manager's engine.
    pub(crate) fn engine(&self) -> Arc<Engine> {
        Arc::clone(&self.engine)
    }

    /// This description over another engine (its nodes and settings), everything else kept.
    pub(crate) fn with_engine(mut self, engine: Arc<Engine>) -> Self {
        self.engine = engine;
        self
    }

    /// Now, on the manager's timer.
    pub(crate) fn now(&self) -> Instant {
        self.engine.timer.now()
    }

    /// The hold limit this lock uses: its own [`max_hold`](Self::max_hold), or the manager's default
    /// (public as [`effective_max_hold`](Self::effective_max_hold)).
    pub(crate) fn max_hold_in_use(&self) -> Option<Duration> {
        self.max_hold.or(self.engine.config.max_hold())
    }

    /// The lease TTL this lock uses: its own [`expiry`](Self::expiry), or the manager's default (public as
    /// [`effective_expiry`](Self::effective_expiry)).
    pub(crate) fn expiry_in_use(&self) -> Duration {
        self.expiry.unwrap_or(self.engine.config.expiry())
    }

    pub(crate) fn plan(&self) -> Result<Plan, Error> {
        let config = &self.engine.config;
        crate::config::check_key("lock", &self.key)?;
        if let Some(fence_key) = &self.fence_key {
            if self.engine.mode == Mode::Redlock {
                return Err(Error::FencingUnsupported);
            }
            if self.engine.permits && !self.engine.fenced_permits {
                return Err(ConfigError::Semaphore(
                    "semaphore permits, readers and fair locks issue no fencing tokens (a read/write lock's writer does)",
                )
                .into());
            }
            crate::config::check_key("fence", fence_key)?;
            if fence_key.as_str() == &*self.key {
                return Err(
                    ConfigError::InvalidKey("the fence key must differ from the lock key").into(),
                );
            }
        }
        let expiry = self.expiry_in_use();
        let ttl = config.check_expiry(expiry)?;
        if let Some(interval) = self.renew_every {
            config.check_renewal(interval, expiry)?;
        }
        if self.background && self.engine.spawner.is_none() {
            return Err(ConfigError::AutoRenewWithoutSpawner.into());
        }
        if let Some(info) = &self.holder_info {
            if info.len() > MAX_HOLDER_INFO_BYTES {
                return Err(ConfigError::HolderInfoTooLong {
                    len: info.len(),
                    max: MAX_HOLDER_INFO_BYTES,
                }
                .into());
            }
        }
        if self.max_hold.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::ZeroDuration { field: "max_hold" }.into());
        }
        Ok(Plan {
            ttl,
            op_timeout: config.operation_timeout_for(expiry),
        })
    }

    /// The acquisition, in a span with the `tracing` feature. Not an `async fn`: without the feature this is
    /// the acquisition's own future, no bigger.
    pub(crate) fn acquire_with(
        &self,
        limit: Limit,
    ) -> impl Future<Output = Result<Arc<Shared>, Error>> {
        let span = crate::trace::span(crate::trace::SpanOf::Acquire(&self.key, self.engine.mode));
        crate::trace::instrument(span, self.acquire_in(limit))
    }

    /// One acquisition attempt's event (built only when somebody listens).
    fn attempt_event(
        &self,
        id: LeaseId,
        r: &RoundResult<Option<u64>>,
        attempt: u32,
        outcome: AttemptOutcome,
    ) {
        let engine = &self.engine;
        if engine.hook.active() {
            engine.hook.emit(
                &self.key,
                id,
                r.ended,
                EventKind::Attempt {
                    attempt,
                    nodes: Nodes::new(&r.tally),
                    round: r.ended.saturating_duration_since(r.started),
                    outcome,
                },
            );
        }
    }

    /// The acquisition's driver: every decision is the [`Acquisition`] machine's; this sends its rounds,
    /// keeps its tokens and watches, and sleeps when it says so.
    async fn acquire_in(&self, limit: Limit) -> Result<Arc<Shared>, Error> {
        let mut a = self.begin(limit)?;
        loop {
            for w in &mut a.watches {
                w.begin_attempt();
            }
            if let Some(hint) = &a.hint {
                hint.reset();
            }
            // The round's result stays in this block: the failure path keeps only what it needs across its
            // awaits, so that the coroutine does not keep the whole result (nor the attempt's plan, which the
            // round's future holds).
            let cleanup = {
                let round = {
                    let op_timeout = a
                        .tokens
                        .timeout
                        .saturating_add(self.engine.wait_allowance());
                    let attempt = a.acq.begin_attempt(self.engine.timer.now(), op_timeout);
                    self.engine.acquire_round(
                        AcquireRequest {
                            key: &self.key,
                            fence_key: self.fence_key.as_deref(),
                            token: &a.tokens.current,
                            ttl: a.ttl,
                        },
                        attempt.timeout,
                        attempt.fresh,
                        a.hint.as_ref(),
                        a.tokens.id,
                    )
                };
                let r = round.await;
                let won = a.acq.handle_round(
                    &r.tally,
                    a.ttl,
                    (r.started, r.ended),
                    r.suspended_by(),
                    |i| self.engine.profiles[i].fresh_is_nx,
                );
                match self.attempt_ended(&mut a, &r, won) {
                    Ok(lease) => return Ok(lease),
                    Err(cleanup) => cleanup,
                }
            };
            if !cleanup.is_empty() {
                self.clean_up_attempt(&mut a, &cleanup).await?;
            }
            if let Some(gave_up) = self.before_next_attempt(&mut a).await {
                return Err(gave_up);
            }
        }
    }

    /// An acquisition's start: its checked plan, machine, tokens, and (waiting) its watches and the holder's
    /// TTL hint. An error if the plan is refused or the deadline has already passed.
    fn begin(&self, limit: Limit) -> Result<Attempts<'_>, Error> {
        let plan = self.plan()?;
        let engine = &self.engine;
        let config = &engine.config;
        let shape = Shape {
            n: engine.nodes.len() as u32,
            quorum: engine.quorum() as u32,
            single: engine.mode == Mode::Single,
            fenced: self.fence_key.is_some(),
        };
        let mut acq =
            Acquisition::new(config, shape, limit, engine.next_seed(), engine.timer.now());
        if acq.expired() {
            let began = acq.began();
            return Err(self.not_acquired(&mut acq, LeaseId::next(), began));
        }
        // The lease's id and the operation timeout live in `tokens` (the future keeps one copy).
        let tokens = Tokens::new(self, LeaseId::next(), plan.op_timeout)?;
        // Waiting with release notifications: a watch per notifying node, registered before the first
        // attempt (nothing is sent until an attempt finds the lock held; see `crate::notify`).
        let mut watches = match limit {
            Limit::Until(_) if config.notifications() => engine.watches(&self.key),
            _ => Vec::new(),
        };
        for w in &mut watches {
            w.own(&tokens.current);
            if engine.wake_all {
                w.wake_every_waiter();
            }
        }
        // A waiting acquisition learns the holder's remaining TTL on contention (the next attempt is due at
        // its expiry); a fenced one cannot (its script reports no TTL).
        let hint =
            (matches!(limit, Limit::Until(_)) && self.fence_key.is_none()).then(TtlHint::new);
        Ok(Attempts {
            acq,
            tokens,
            watches,
            hint,
            ttl: plan.ttl,
        })
    }

    /// An attempt's round ended with the machine's `decision`: the lease's shared state if it won; otherwise
    /// the attempt is reported (its watches and event) and the nodes to clean up are returned.
    fn attempt_ended(
        &self,
        a: &mut Attempts<'_>,
        r: &RoundResult<Option<u64>>,
        decision: Decision,
    ) -> Result<Arc<Shared>, Vec<usize>> {
        let (reason, cleanup) = match decision {
            Decision::Won {
                valid_until,
                unconfirmed,
                missing,
            } => {
                let won = (valid_until, unconfirmed, missing);
                let plan = Plan {
                    ttl: a.ttl,
                    op_timeout: a.tokens.timeout,
                };
                return Ok(self.won(&a.acq, &mut a.tokens, &mut a.watches, r, plan, won));
            }
            Decision::Failed { reason, cleanup } => (reason, cleanup),
        };
        let outcome = if reason == NotAcquiredReason::Contended {
            Outcome::Held
        } else {
            Outcome::Failed
        };
        for w in &mut a.watches {
            w.end_attempt(outcome);
        }
        let attempts = a.acq.attempts();
        self.attempt_event(a.tokens.id, r, attempts, AttemptOutcome::Failed(reason));
        Err(cleanup)
    }
    /// The clean-up of a failed attempt on the nodes `cleanup` names, reported; the token is replaced when the
    /// machine says so (its deletion went unconfirmed somewhere).
    async fn clean_up_attempt(&self, a: &mut Attempts<'_>, cleanup: &[usize]) -> Result<(), Error> {
        let c = self
            .engine
            .release_round(
                &self.key,
                &a.tokens.current,
                a.tokens.timeout,
                Some(cleanup),
            )
            .await;
        if self.engine.hook.active() {
            self.engine.hook.emit(
                &self.key,
                a.tokens.id,
                c.ended,
                EventKind::Cleanup {
                    cause: CleanupCause::FailedAttempt,
                    nodes: Nodes::new(&c.tally),
                    round: c.ended.saturating_duration_since(c.started),
                },
            );
        }
        let rotate =
            a.acq
                .handle_cleanup(cleanup, |i| c.values[i].is_some(), c.tally.any_ambiguous());
        if rotate {
            // The old token is deleted again in the background if a spawner exists; otherwise it expires
            // with its TTL.
            a.tokens.rotate()?;
            for w in &mut a.watches {
                w.own(&a.tokens.current);
            }
        }
        Ok(())
    }

    /// After a failed attempt: sleeps or waits for a release as the machine says, or gives up — then the
    /// error to return (the acquisition's last token withdrawn where an attempt that found the lock held
    /// still wrote).
    async fn before_next_attempt(&self, a: &mut Attempts<'_>) -> Option<Error> {
        let now = self.engine.timer.now();
        let holder_ttl = a.hint.as_ref().and_then(TtlHint::remaining);
        let waited = match a.acq.next(now, !a.watches.is_empty(), holder_ttl) {
            Next::Sleep(at) => {
                self.engine.timer.sleep_until(at).await;
                return None;
            }
            Next::Wait {
                held,
                polling,
                pushed,
            } => {
                if held {
                    for w in &mut a.watches {
                        w.subscribe(now);
                    }
                }
                wait_for_release(&self.engine.timer, &mut a.watches, held, polling, pushed).await;
                // Waiting is only for acquisitions with a deadline.
                let deadline = a.acq.deadline().unwrap_or(now);
                if self.engine.timer.now() < deadline {
                    return None;
                }
                true
            }
            Next::GiveUp => false,
        };
        if self.engine.contention_writes {
            Box::pin(a.tokens.withdraw()).await;
        }
        a.tokens.failed();
        // A wait that reached the deadline ends when the acquisition returns; a give-up when it was decided.
        let at = if waited { self.engine.timer.now() } else { now };
        Some(self.not_acquired(&mut a.acq, a.tokens.id, at))
    }

    /// The acquisition failed for the reason `acq` holds: its event, and the error.
    fn not_acquired(&self, acq: &mut Acquisition<'_>, id: LeaseId, now: Instant) -> Error {
        let (reason, last_error) = acq.failure();
        let attempts = acq.attempts();
        if attempts > 0 {
            self.engine.hook.emit(
                &self.key,
                id,
                now,
                EventKind::NotAcquired {
                    reason,
                    attempts,
                    waited: now.saturating_duration_since(acq.began()),
                    contended: acq.contended(),
                },
            );
        }
        Error::NotAcquired {
            key: self.key.to_string(),
            mode: self.engine.mode,
            attempts,
            reason,
            last_error: last_error.map(Box::new),
        }
    }

    /// The attempt `r` won, valid until `won.0` (`won.1`, `won.2`: [`Decision::Won`]'s unconfirmed and missing
    /// nodes): its events,
    /// and the lease's shared state, [started](Self::start).
    fn won(
        &self,
        acq: &Acquisition<'_>,
        tokens: &mut Tokens<'_>,
        watches: &mut [Watch],
        r: &RoundResult<Option<u64>>,
        plan: Plan,
        (valid_until, unconfirmed, missing): (Instant, Option<Box<[u64]>>, NodeSet),
    ) -> Arc<Shared> {
        let engine = &self.engine;
        let id = tokens.id;
        let fence = match self.fence_key {
            Some(_) => r.values.first().copied().flatten().flatten(),
            None => None,
        };
        for w in watches.iter_mut() {
            w.end_attempt(Outcome::Won);
        }
        if let (Some(fence_key), Some(fence)) = (&self.fence_key, fence) {
            match engine.watch.lock() {
                Ok(mut w) => w.issued(fence_key, fence),
                Err(p) => p.into_inner().issued(fence_key, fence),
            }
        }
        let token = tokens.won();
        let now = engine.timer.now();
        self.attempt_event(
            id,
            r,
            acq.attempts(),
            AttemptOutcome::Won {
                validity: valid_until.saturating_duration_since(r.ended),
            },
        );
        engine.hook.emit(
            &self.key,
            id,
            now,
            EventKind::Acquired {
                valid_until,
                fence,
                attempts: acq.attempts(),
                waited: now.saturating_duration_since(acq.began()),
                contended: acq.contended(),
            },
        );
        self.start(Grant {
            key: self.key.clone(),
            token,
            ttl: plan.ttl,
            op_timeout: plan.op_timeout,
            fence,
            renew_interval: self.renew_every,
            id,
            acquired_at: now,
            hold_until: self
                .max_hold_in_use()
                .and_then(|d| r.started.checked_add(d)),
            round_started: r.started,
            wall_started: r.wall.0,
            unconfirmed,
            missing,
            valid_until,
        })
    }

    /// The driving of [`resume`](Self::resume): the ticket checked against this lock, its extension round,
    /// and the lease's shared state, started.
    pub(crate) async fn resumed(&self, ticket: &LeaseTicket) -> Result<Arc<Shared>, Error> {
        let plan = self.plan()?;
        let engine = &self.engine;
        let n = engine.nodes.len();
        let mismatch = |why| Err(Error::Config(ConfigError::TicketMismatch(why)));
        if ticket.key.as_str() != &*self.key {
            return mismatch("the ticket is for another key");
        }
        if ticket.mode != engine.mode {
            return mismatch("the ticket was made by a manager of the other mode");
        }
        if ticket.pending.len() != n {
            return mismatch("the ticket was made by a manager with another number of nodes");
        }
        if ticket.fence.is_some() != self.fence_key.is_some() {
            return mismatch(
                "a fenced lock needs a fenced ticket, an unfenced lock an unfenced one",
            );
        }
        let id = LeaseId::next();
        // The ticket's in-flight record, with this round planned on top before anything is sent. (Dropped with
        // this future, it leaves no lease behind to rely on it.)
        let mut ledger = Unconfirmed::from_acquisition(Some(ticket.pending.clone()));
        let planned = Planned {
            unconfirmed: ledger.plan(n, plan.ttl),
            missing: NodeSet::from_bits(ticket.missing),
        };
        let r = engine
            .extend_round(
                &self.key,
                &ticket.token,
                plan.ttl,
                plan.op_timeout,
                &planned,
                id,
            )
            .await;
        ledger.handle_round(n, &r.tally);
        if engine.hook.active() {
            engine.hook.emit(
                &self.key,
                id,
                r.ended,
                EventKind::Extension {
                    renewal: false,
                    nodes: crate::observe::Nodes::new(&r.tally),
                    round: r.ended.saturating_duration_since(r.started),
                },
            );
        }
        let lost = |reason| Error::Lost {
            key: self.key.to_string(),
            reason,
            source: None,
        };
        if r.tally.verdict() != Verdict::Quorum {
            if r.tally.refused() {
                return Err(lost(LossReason::NotHeld));
            }
            return Err(QuorumError::new(
                Operation::Extend,
                r.tally.yes(),
                r.tally.required(),
                r.tally.errors(),
            )
            .into());
        }
        let factor = engine.config.drift_factor();
        let drift = crate::machine::validity::drift(plan.ttl, factor);
        let suspended = r.suspended_by();
        let Some(valid_until) =
            crate::machine::validity::deadline_after_round(r.started, r.ended, plan.ttl, factor)
                .filter(|_| !suspended(drift))
        else {
            return Err(lost(LossReason::ExtendFailed));
        };
        let mut missing = planned.missing;
        for i in r.tally.yes_indices() {
            missing.remove(i);
        }
        let now = engine.timer.now();
        let hold_until = self
            .max_hold_in_use()
            .and_then(|d| r.started.checked_add(d));
        // The lease's validity, as `Acquired` reports it: a hold limit is reported by its own loss. (Clamped
        // to a hold limit that the resuming round outlasted, the event would say the lease ended before it
        // was resumed.)
        engine.hook.emit(
            &self.key,
            id,
            now,
            EventKind::Resumed {
                valid_until,
                fence: ticket.fence,
            },
        );
        Ok(self.start(Grant {
            key: self.key.clone(),
            token: ticket.token.clone(),
            ttl: plan.ttl,
            op_timeout: plan.op_timeout,
            fence: ticket.fence,
            renew_interval: self.renew_every,
            id,
            acquired_at: now,
            hold_until,
            round_started: r.started,
            wall_started: r.wall.0,
            unconfirmed: Some(ledger.snapshot(n)),
            missing,
            valid_until,
        }))
    }

    /// The checked TTL and operation timeout of an acquisition of this lock (for `crate::multi`).
    pub(crate) fn ttl_and_timeout(&self) -> Result<(Ttl, Duration), Error> {
        self.plan().map(|p| (p.ttl, p.op_timeout))
    }

    /// The fence counter of a fenced lock.
    pub(crate) fn fence_key(&self) -> Option<&str> {
        self.fence_key.as_deref()
    }

    /// Whether its leases are renewed in the background ([`auto_renew`](Self::auto_renew)).
    pub(crate) fn renews_in_background(&self) -> bool {
        self.background
    }

    /// This description without background renewal: the leases it grants are renewed by whoever takes
    /// them (a [`MultiLock`](crate::MultiLock) starts its set's renewal once the set is complete).
    pub(crate) fn in_foreground(&self) -> Self {
        Self {
            background: false,
            ..self.clone()
        }
    }

    /// A fresh token for an acquisition of this lock (with its holder info).
    pub(crate) fn new_token(&self) -> Result<Token, Error> {
        Ok(Token::random()?.with_info(self.holder_info.as_deref()))
    }

    /// The lease of an acquisition of this lock made outside its own rounds — one step that took several
    /// keys at once (`crate::multi`) — whose request was sent at `started` and which is valid until
    /// `valid_until`: its events and the lease's shared state, as [`won`](Self::won) makes them.
    pub(crate) fn granted(&self, taken: Taken) -> Arc<Shared> {
        let Taken {
            id,
            token,
            fence,
            ttl,
            op_timeout,
            started,
            wall_started,
            valid_until,
            waited,
        } = taken;
        let engine = &self.engine;
        if let (Some(fence_key), Some(fence)) = (&self.fence_key, fence) {
            match engine.watch.lock() {
                Ok(mut w) => w.issued(fence_key, fence),
                Err(p) => p.into_inner().issued(fence_key, fence),
            }
        }
        let now = engine.timer.now();
        engine.hook.emit(
            &self.key,
            id,
            now,
            EventKind::Acquired {
                valid_until,
                fence,
                attempts: 1,
                waited,
                contended: false,
            },
        );
        self.start(Grant {
            key: self.key.clone(),
            token,
            ttl,
            op_timeout,
            fence,
            renew_interval: self.renew_every,
            id,
            acquired_at: now,
            hold_until: self.max_hold_in_use().and_then(|d| started.checked_add(d)),
            round_started: started,
            wall_started,
            unconfirmed: None,
            missing: NodeSet::default(),
            valid_until,
        })
    }

    /// The shared state of a lease granted by this lock, with its repair or background renewal spawned (the
    /// API wraps it in a [`Lease`](crate::Lease)).
    fn start(&self, grant: Grant) -> Arc<Shared> {
        let shared = Shared::new(Arc::clone(&self.engine), grant);
        if let Some(spawner) = &self.engine.spawner {
            // Nodes that never confirmed the key get it now, with the lease's own token (Redlock: a lease held
            // by a bare majority survives no further node failure). A lease renewed in the background gets it
            // from its first renewal round (which asks those nodes too) instead of a repair round competing
            // with it for the extension permit; without a spawner, the lease's next extension round does it.
            if shared.needs_repair() && !self.background {
                spawner.spawn(Box::pin(Arc::clone(&shared).repair()));
            }
        }
        if let (true, Some(spawner)) = (self.background, &self.engine.spawner) {
            if shared.claim_renewal() {
                shared.renew_in_background(spawner);
            }
        }
        shared
    }
}

/// A key of a lock taken outside the lock's own rounds (by a step that took several keys at once, see
/// [`Lock::granted`]).
pub(crate) struct Taken {
    pub(crate) id: LeaseId,
    pub(crate) token: Token,
    /// The fencing token issued with it, if the lock is fenced.
    pub(crate) fence: Option<u64>,
    pub(crate) ttl: Ttl,
    pub(crate) op_timeout: Duration,
    /// When the request that took it was sent (on the monotonic and the wall clock).
    pub(crate) started: Instant,
    pub(crate) wall_started: Option<std::time::SystemTime>,
    pub(crate) valid_until: Instant,
    /// How long the acquisition waited for it.
    pub(crate) waited: Duration,
}
