//! One acquisition: its attempts, what a failed attempt leaves to clean up, and when to try again.

use std::time::{Duration, Instant};

use super::nodeset::NodeSet;
use super::{Backoff, Jitter, Tally, Verdict, validity};
use crate::config::Config;
use crate::error::{NotAcquiredReason, Operation, QuorumError};
use crate::node::{NodeErrorKind, Ttl};

/// How long an acquisition keeps trying.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Limit {
    /// At most this many attempts, a retry pause apart.
    Attempts(u32),
    /// Until this instant: no attempt starts after it and an attempt's round is cut at it.
    Until(Instant),
}

/// Added to a holder's reported TTL before a waiter tries again: the key expires on the server's clock.
pub(crate) const TTL_MARGIN: Duration = Duration::from_millis(1);

/// The most a waiter adds to a holder's reported expiry before trying again, so that the waiters of one
/// expiring lock do not all arrive in the same instant (a fraction of the retry jitter, scaled down).
pub(crate) const EXPIRY_SPREAD: Duration = Duration::from_millis(4);

/// The shape of the node set an acquisition runs on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Nodes, and the yes votes needed.
    pub(crate) n: u32,
    pub(crate) quorum: u32,
    /// Single mode (one authority; durability waits apply).
    pub(crate) single: bool,
    /// A fenced acquisition (its requests always go through the script that issues the fence).
    pub(crate) fenced: bool,
}

/// One attempt as planned by [`Acquisition::begin_attempt`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attempt {
    /// The bound of the attempt's round.
    pub(crate) timeout: Duration,
    /// The nodes that a plain `SET NX` may ask.
    pub(crate) fresh: Fresh,
}

/// How an attempt's round ended, as decided by [`Acquisition::handle_round`].
#[derive(Debug)]
pub(crate) enum Decision {
    /// Won: the lease is valid until `valid_until`; `unconfirmed` lists, per node, the TTL (ms) of an
    /// acquisition request that may still land there (0: none), for the lease's record; `missing` the nodes
    /// that did not confirm the key (the lease writes it there with its own token: see
    /// `Shared::repair`).
    Won {
        valid_until: Instant,
        unconfirmed: Option<Box<[u64]>>,
        missing: NodeSet,
    },
    /// Failed for `reason`; the token must be deleted on `cleanup` (where this or an earlier attempt may have
    /// written it and no clean-up has confirmed it gone since), then [`Acquisition::handle_cleanup`] and
    /// [`Acquisition::next`] say what follows.
    Failed {
        reason: NotAcquiredReason,
        cleanup: Vec<usize>,
    },
}

/// What follows a failed attempt, as decided by [`Acquisition::next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Sleep until this instant, then try again.
    Sleep(Instant),
    /// Wait for a release notification, or until `pushed` while a subscription is confirmed and the lock was
    /// `held`, else until `polling`; then try again if the deadline has not passed.
    Wait {
        held: bool,
        polling: Instant,
        pushed: Instant,
    },
    /// Give up: the acquisition fails with [`Acquisition::failure`].
    GiveUp,
}

/// The decisions of one acquisition, from its first attempt to a lease or a failure.
///
/// # Call protocol
/// 1. [`new`](Self::new); if [`expired`](Self::expired), fail with [`failure`](Self::failure) before
///    sending anything.
/// 2. Per attempt: [`begin_attempt`](Self::begin_attempt) before the round is sent; feed the round's tally
///    to [`handle_round`](Self::handle_round). On [`Decision::Won`] the acquisition is done.
/// 3. On [`Decision::Failed`]: run the clean-up it names (if any) and feed its answers to
///    [`handle_cleanup`](Self::handle_cleanup) (which says whether the token must be replaced); then
///    [`next`](Self::next) says whether and when to try again.
///
/// Dropped at any point, nothing is lost that safety needs: the driver deletes every token it sent in the
/// background (the acquisition never handed out a lease).
#[derive(Debug)]
pub(crate) struct Acquisition<'a> {
    config: &'a Config,
    shape: Shape,
    limit: Limit,
    backoff: Backoff,
    attempt: u32,
    /// Whether an attempt found the lock held by another owner.
    contended: bool,
    /// The current attempt's round is cut by the caller's deadline, before the operation timeout.
    cut: bool,
    /// Where the current token has never been stored and never will be by an earlier request.
    fresh: Fresh,
    /// Nodes where this or an earlier attempt may have written the current token and no clean-up has
    /// confirmed it gone since. Allocated on the first failed attempt only.
    dirty: Vec<bool>,
    /// Nodes where an acquisition request with the current token may still land later (it failed
    /// ambiguously or was abandoned). Allocated only when that happens.
    unsettled: Vec<bool>,
    /// The last failed attempt.
    last: Option<Failure>,
    /// When the acquisition began (for its events).
    began: Instant,
}

/// A failed attempt: why, and its yes votes and node errors.
#[derive(Debug)]
struct Failure {
    reason: NotAcquiredReason,
    yes: usize,
    errors: Vec<(usize, crate::node::NodeError)>,
}

impl<'a> Acquisition<'a> {
    /// An acquisition on nodes of `shape` with `config`, beginning at `began`, trying within `limit`, its
    /// retry jitter drawn from `seed`.
    pub(crate) fn new(
        config: &'a Config,
        shape: Shape,
        limit: Limit,
        seed: u64,
        began: Instant,
    ) -> Self {
        Self {
            began,
            backoff: Backoff::new(
                config.retry_delay(),
                config.retry_jitter(),
                Jitter::from_seed(seed),
            ),
            config,
            shape,
            limit,
            attempt: 0,
            contended: false,
            cut: false,
            fresh: Fresh::ALL,
            dirty: Vec::new(),
            unsettled: Vec::new(),
            last: None,
        }
    }

    /// Whether the deadline passed before the first attempt (at the instant the acquisition began): then
    /// nothing may be sent.
    pub(crate) fn expired(&mut self) -> bool {
        let expired = matches!(self.limit, Limit::Until(deadline) if self.began >= deadline);
        if expired {
            self.last = Some(Failure {
                reason: NotAcquiredReason::DeadlinePassed,
                yes: 0,
                errors: Vec::new(),
            });
        }
        expired
    }

    /// When the acquisition began.
    pub(crate) fn began(&self) -> Instant {
        self.began
    }

    /// The caller's deadline, if the acquisition has one.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self.limit {
            Limit::Until(deadline) => Some(deadline),
            Limit::Attempts(_) => None,
        }
    }

    /// Attempts made so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Whether an attempt found the lock held by another owner.
    pub(crate) fn contended(&self) -> bool {
        self.contended
    }

    /// Plans the next attempt at `now`, whose round the operation timeout `op` bounds (durability wait
    /// included).
    pub(crate) fn begin_attempt(&mut self, now: Instant, op: Duration) -> Attempt {
        self.attempt = self.attempt.saturating_add(1);
        let timeout = match self.limit {
            Limit::Until(deadline) => op.min(deadline.saturating_duration_since(now)),
            Limit::Attempts(_) => op,
        };
        self.cut = timeout < op;
        Attempt {
            timeout,
            fresh: self.fresh,
        }
    }

    /// The attempt's round with `ttl` ended: `tally` of the replies, started at `started` and ended at `ended`;
    /// `suspended(allowance)` says whether the machine was suspended for longer than `allowance` meanwhile;
    /// `plain_nx(i)` whether node `i` asked with a plain `SET NX` ([`Attempt::fresh`] on a node whose fresh
    /// path is one) can never change an existing key (its late request is then harmless).
    pub(crate) fn handle_round(
        &mut self,
        tally: &Tally,
        ttl: Ttl,
        (started, ended): (Instant, Instant),
        suspended: impl Fn(Duration) -> bool,
        plain_nx: impl Fn(usize) -> bool,
    ) -> Decision {
        let n = self.shape.n as usize;
        let factor = self.config.drift_factor();
        // A straggling plain `SET NX` can never change a key that exists, ours included; only an own-token
        // branch resets the TTL when it lands.
        for i in tally.unsettled_indices() {
            if !self.shape.fenced && self.fresh.get(i) && plain_nx(i) {
                continue;
            }
            self.unsettled.resize(n, false);
            self.unsettled[i] = true;
        }
        // A node stays fresh only after a definite "changed nothing": a yes stored the token, and an
        // ambiguous or abandoned request may still.
        self.fresh.settle();
        for i in tally.maybe_applied_indices() {
            self.fresh.spoil(i);
        }
        let reason = if tally.verdict() == Verdict::Quorum {
            let drift = validity::drift(ttl, factor);
            if let Some(valid_until) = validity::deadline_after_round(started, ended, ttl, factor)
                .filter(|_| !suspended(drift))
            {
                let unconfirmed = (!self.unsettled.is_empty()).then(|| {
                    self.unsettled
                        .iter()
                        .map(|&u| if u { ttl.as_millis() } else { 0 })
                        .collect::<Box<[u64]>>()
                });
                return Decision::Won {
                    valid_until,
                    unconfirmed,
                    missing: NodeSet::of((0..n).filter(|&i| !tally.is_yes(i))),
                };
            }
            NotAcquiredReason::ValidityExhausted
        } else {
            self.classify(tally)
        };
        self.contended |= reason == NotAcquiredReason::Contended;
        // Delete our token wherever this or an earlier attempt may have written it and no clean-up has
        // confirmed it gone since. A definite refusal or a definitely-not-applied error left nothing.
        self.dirty.resize(n, false);
        for i in tally.maybe_applied_indices() {
            self.dirty[i] = true;
        }
        let cleanup = (0..n).filter(|&i| self.dirty[i]).collect();
        self.last = Some(Failure {
            reason,
            yes: tally.yes(),
            errors: tally.errors(),
        });
        Decision::Failed { reason, cleanup }
    }

    /// Why an attempt without a quorum failed.
    fn classify(&self, tally: &Tally) -> NotAcquiredReason {
        let s = &self.shape;
        let spare = s.n.saturating_sub(s.quorum) as usize;
        let errors = tally.errors();
        if tally.refused() {
            NotAcquiredReason::Contended
        } else if tally.permanent() > spare {
            NotAcquiredReason::Refused
        } else if s.single
            && errors
                .iter()
                .any(|(_, e)| e.kind() == NodeErrorKind::NotReplicated)
        {
            NotAcquiredReason::NotReplicated
        } else if self.cut
            && (self.contended || tally.no() > 0)
            && errors
                .iter()
                .all(|(_, e)| e.kind() == NodeErrorKind::Timeout)
        {
            // The caller's deadline cut the round, not the operation timeout, and the lock was known to be
            // held: the nodes did not fail, the wait simply ended.
            NotAcquiredReason::Contended
        } else {
            NotAcquiredReason::TooFewNodes
        }
    }

    /// The clean-up that [`Decision::Failed`] named ended: `confirmed(i)` says whether node `i` answered it
    /// (the token is certainly gone there); `ambiguous` whether some node's outcome is unknown. Returns
    /// `true` if the next attempt must use a new token.
    ///
    /// A clean-up that was sent may be carried out again later — after the next attempt, even, on a pool or
    /// a reconnected connection: one whose outcome is unknown, and one that was confirmed too, when a copy
    /// of it is still on its way (a retry by a client library or a proxy). If the next attempt reused this
    /// token, that stale compare-and-delete could delete the key the new lease relies on. So the next
    /// attempt gets a fresh token: a stale clean-up of the old one can then only delete the old one.
    /// (Excluding such nodes from later quorums instead would leave a single-node acquisition unable to
    /// succeed at all.) Only a clean-up that failed definitely everywhere was never applied and never will
    /// be: then the token is kept, and a retry still recognises it where the earlier write landed.
    pub(crate) fn handle_cleanup(
        &mut self,
        targets: &[usize],
        confirmed: impl Fn(usize) -> bool,
        ambiguous: bool,
    ) -> bool {
        let mut sent = ambiguous;
        for &i in targets {
            if confirmed(i) {
                sent = true;
                if let Some(d) = self.dirty.get_mut(i) {
                    *d = false;
                }
            }
        }
        if sent {
            self.dirty.iter_mut().for_each(|d| *d = false);
            self.unsettled.clear();
            self.fresh = Fresh::ALL;
        }
        sent
    }

    /// After a failed attempt (and its clean-up), at `now`: whether and when to try again. `notified`: the
    /// acquisition waits with release notifications; `holder_ttl`: the shortest remaining TTL a contended
    /// node reported in the last attempt, if any.
    ///
    /// A holder's reported expiry is when the lock may be free without any notification: the next attempt
    /// is due then (plus at most [`EXPIRY_SPREAD`]), if that comes before the retry pause.
    pub(crate) fn next(
        &mut self,
        now: Instant,
        notified: bool,
        holder_ttl: Option<Duration>,
    ) -> Next {
        let config = self.config;
        let pause = self.backoff.next_pause();
        let reason = self.last.as_ref().map(|l| l.reason);
        if reason == Some(NotAcquiredReason::Refused) {
            return Next::GiveUp;
        }
        let after = |d: Duration| crate::time::add(now, d);
        let deadline = match self.limit {
            Limit::Attempts(max) if self.attempt < max => return Next::Sleep(after(pause)),
            Limit::Attempts(_) => return Next::GiveUp,
            Limit::Until(deadline) => deadline,
        };
        // The pause's jitter, scaled into the spread a waiter adds to a holder's expiry.
        let extra = pause.saturating_sub(config.retry_delay());
        let max_extra = config
            .retry_delay()
            .mul_f64(config.retry_jitter().clamp(0.0, 1.0));
        let spread = if max_extra.is_zero() {
            Duration::ZERO
        } else {
            EXPIRY_SPREAD.mul_f64((extra.as_secs_f64() / max_extra.as_secs_f64()).min(1.0))
        };
        let expiry =
            holder_ttl.map(|ttl| after(ttl.saturating_add(TTL_MARGIN).saturating_add(spread)));
        let polling = expiry.map_or(after(pause), |e| e.min(after(pause)));
        if !notified {
            return if polling < deadline {
                Next::Sleep(polling)
            } else {
                Next::GiveUp
            };
        }
        // A notification may end the wait early: wait up to the deadline itself.
        if now >= deadline {
            return Next::GiveUp;
        }
        let cap = after(config.max_retry_delay());
        Next::Wait {
            held: reason == Some(NotAcquiredReason::Contended),
            polling: polling.min(deadline),
            pushed: expiry.map_or(cap, |e| e.min(cap)).min(deadline),
        }
    }

    /// Why the acquisition failed: the last attempt's reason and, if nodes failed, its node errors.
    pub(crate) fn failure(&mut self) -> (NotAcquiredReason, Option<QuorumError>) {
        let Failure {
            reason,
            yes,
            errors,
        } = self.last.take().unwrap_or(Failure {
            reason: NotAcquiredReason::TooFewNodes,
            yes: 0,
            errors: Vec::new(),
        });
        let error = (!errors.is_empty())
            .then(|| QuorumError::new(Operation::Acquire, yes, self.shape.quorum as usize, errors));
        (reason, error)
    }
}

/// Which nodes an acquisition attempt may ask with a plain `SET NX` (a [fresh](crate::ClaimRequest::fresh)
/// [`RedisNode::claim`]): those that have never stored the attempt's token and never will from an earlier request. That holds for every
/// node on the first attempt with a token, and stays true on a node for as long as every request carrying
/// the token got a definite answer that it changed nothing there (the lock was held by another owner, or a
/// definitely-not-applied error). A node that said yes, failed ambiguously or was abandoned (its request may
/// still land) is asked through the own-token branch from then on. Copy and allocation-free: nodes from
/// the 65th on are treated as not fresh after the first attempt.
///
/// [`RedisNode::claim`]: crate::RedisNode::claim
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fresh {
    all: bool,
    bits: u64,
}

impl Fresh {
    /// Every node: a token never sent.
    pub(crate) const ALL: Fresh = Fresh {
        all: true,
        bits: u64::MAX,
    };

    /// Whether node `i` may be asked with a plain `SET NX`.
    pub(crate) fn get(self, i: usize) -> bool {
        self.all || (i < 64 && self.bits >> i & 1 == 1)
    }

    /// Whether every one of `n` nodes is fresh (then a round needs no grace for scripts).
    pub(crate) fn all_of(self, n: usize) -> bool {
        self.all || (0..n).all(|i| self.get(i))
    }

    /// Node `i` may have stored the token, or may still: it is no longer fresh.
    pub(crate) fn spoil(&mut self, i: usize) {
        self.all = false;
        if i < 64 {
            self.bits &= !(1u64 << i);
        }
    }

    /// After the first attempt, nodes from the 65th on are no longer fresh.
    pub(crate) fn settle(&mut self) {
        self.all = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{Reply, WaitFor};
    use crate::node::NodeError;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn shape(n: u32) -> Shape {
        Shape {
            n,
            quorum: n / 2 + 1,
            single: n == 1,
            fenced: false,
        }
    }

    const OP: Duration = Duration::from_millis(500);

    fn ttl() -> Ttl {
        Ttl::from_millis(30_000).unwrap_or(Ttl::MAX)
    }

    /// Retry delay 200 ms, jitter 0.5 (the defaults), waits for a notification capped at 5 s.
    fn config() -> Config {
        Config::default().with_max_retry_delay(ms(5_000))
    }

    fn tally(n: usize, replies: &[Reply]) -> Tally {
        let mut t = Tally::new(n, n / 2 + 1, WaitFor::Decision);
        for (i, r) in replies.iter().enumerate() {
            t.handle_reply(i, r.clone());
        }
        t.handle_timeout(&NodeError::timed_out(ms(500)));
        t
    }

    fn failed(kind: NodeErrorKind, ambiguous: bool) -> Reply {
        Reply::Failed(if ambiguous {
            NodeError::ambiguous(kind, "x")
        } else {
            NodeError::not_applied(kind, "x")
        })
    }

    fn round(a: &mut Acquisition<'_>, t0: Instant, replies: &[Reply]) -> Decision {
        let n = a.shape.n as usize;
        a.handle_round(
            &tally(n, replies),
            ttl(),
            (t0, t0 + ms(5)),
            |_| false,
            |_| true,
        )
    }

    #[test]
    fn each_failed_attempt_is_classified_by_its_replies() {
        use NotAcquiredReason::*;
        let t0 = Instant::now();
        let cfg = config();
        let perm = || failed(NodeErrorKind::WrongType, false);
        let io = || failed(NodeErrorKind::Io, true);
        let rows: Vec<(Vec<Reply>, NotAcquiredReason)> = vec![
            (vec![Reply::No, Reply::No, Reply::Yes], Contended),
            (vec![Reply::No, io(), Reply::Yes], TooFewNodes),
            (vec![perm(), perm(), Reply::Yes], Refused),
            (vec![Reply::Yes, io(), io()], TooFewNodes),
            (vec![], TooFewNodes),
        ];
        for (replies, want) in rows {
            let mut a = Acquisition::new(&cfg, shape(3), Limit::Attempts(3), 1, t0);
            let _ = a.begin_attempt(t0, OP);
            match round(&mut a, t0, &replies) {
                Decision::Failed { reason, .. } => assert_eq!(reason, want, "{replies:?}"),
                d => panic!("{replies:?}: {d:?}"),
            }
        }
    }

    #[test]
    fn a_quorum_wins_with_the_validity_left_and_records_requests_that_may_still_land() {
        let t0 = Instant::now();
        let cfg = config();
        let mut a = Acquisition::new(&cfg, shape(3), Limit::Attempts(3), 1, t0);
        let _ = a.begin_attempt(t0, OP);
        let io = failed(NodeErrorKind::Io, true);
        let replies = tally(3, &[Reply::Yes, Reply::Yes, io]);
        // A late plain `SET NX` cannot change an existing key: nothing to record.
        let d = a.handle_round(&replies, ttl(), (t0, t0 + ms(5)), |_| false, |_| true);
        assert!(
            matches!(
                d,
                Decision::Won {
                    unconfirmed: None,
                    ..
                }
            ),
            "{d:?}"
        );
        // Through the own-token branch, node 2's request may still land and reset the TTL.
        let mut a = Acquisition::new(&cfg, shape(3), Limit::Attempts(3), 1, t0);
        let _ = a.begin_attempt(t0, OP);
        match a.handle_round(&replies, ttl(), (t0, t0 + ms(5)), |_| false, |_| false) {
            Decision::Won {
                valid_until,
                unconfirmed,
                missing,
            } => {
                // 30 s minus the 302 ms drift allowance, from the round's start.
                assert_eq!(valid_until, t0 + ms(30_000 - 302));
                assert_eq!(unconfirmed.as_deref(), Some(&[0, 0, 30_000][..]));
                // Node 2 never confirmed the key: the lease writes it there.
                assert_eq!(missing, NodeSet::of([2]));
            }
            d => panic!("{d:?}"),
        }
        // Suspended longer than the drift allowance during the round: no validity is trusted.
        let mut a = Acquisition::new(&cfg, shape(1), Limit::Attempts(1), 1, t0);
        let _ = a.begin_attempt(t0, OP);
        let d = a.handle_round(
            &tally(1, &[Reply::Yes]),
            ttl(),
            (t0, t0 + ms(5)),
            |_| true,
            |_| true,
        );
        assert!(matches!(
            d,
            Decision::Failed {
                reason: NotAcquiredReason::ValidityExhausted,
                ..
            }
        ));
    }

    #[test]
    fn a_failed_attempt_cleans_up_where_the_token_may_be_and_a_sent_cleanup_rotates_it() {
        let t0 = Instant::now();
        let cfg = config();
        let mut a = Acquisition::new(&cfg, shape(3), Limit::Attempts(3), 1, t0);
        let _ = a.begin_attempt(t0, OP);
        let io = failed(NodeErrorKind::Io, true);
        let refused = failed(NodeErrorKind::Connection, false);
        let Decision::Failed { cleanup, .. } = round(&mut a, t0, &[Reply::Yes, io, refused]) else {
            panic!("no quorum")
        };
        assert_eq!(cleanup, [0, 1]);
        // Node 0 confirmed its clean-up, node 1 did not answer it definitely: a new token.
        assert!(a.handle_cleanup(&cleanup, |i| i == 0, true));
        assert_eq!(a.begin_attempt(t0, OP).fresh, Fresh::ALL);
        // A clean-up confirmed everywhere rotates the token too: a copy of it may still land after the next
        // attempt's write (a retry a library or a proxy sent on another connection).
        let Decision::Failed { cleanup, .. } =
            round(&mut a, t0, &[Reply::Yes, Reply::No, Reply::No])
        else {
            panic!("contended")
        };
        assert_eq!(cleanup, [0]);
        assert!(a.handle_cleanup(&cleanup, |_| true, false));
        assert_eq!(a.begin_attempt(t0, OP).fresh, Fresh::ALL);
        // A clean-up refused everywhere (never applied) keeps the token; the nodes that saw it are no longer
        // fresh.
        let Decision::Failed { cleanup, .. } =
            round(&mut a, t0, &[Reply::Yes, Reply::No, Reply::No])
        else {
            panic!("contended")
        };
        assert_eq!(cleanup, [0]);
        assert!(!a.handle_cleanup(&cleanup, |_| false, false));
        let fresh = a.begin_attempt(t0, OP).fresh;
        assert_eq!(
            (fresh.get(0), fresh.get(1), fresh.get(2)),
            (false, true, true)
        );
    }

    #[test]
    fn a_round_cut_by_the_callers_deadline_on_a_held_lock_is_contention() {
        let t0 = Instant::now();
        let cfg = config();
        let deadline = t0 + ms(100);
        let mut a = Acquisition::new(&cfg, shape(1), Limit::Until(deadline), 1, t0);
        let _ = a.begin_attempt(t0, OP);
        assert!(matches!(
            round(&mut a, t0, &[Reply::No]),
            Decision::Failed {
                reason: NotAcquiredReason::Contended,
                ..
            }
        ));
        // The next attempt starts 30 ms before the deadline: its round is cut there.
        assert_eq!(a.begin_attempt(t0 + ms(70), OP).timeout, ms(30));
        assert!(matches!(
            round(&mut a, t0, &[]),
            Decision::Failed {
                reason: NotAcquiredReason::Contended,
                ..
            }
        ));
        // A first attempt cut at the deadline: contention if a node said the lock is held, else node failure.
        for (replies, want) in [
            (vec![Reply::No], NotAcquiredReason::Contended),
            (vec![], NotAcquiredReason::TooFewNodes),
        ] {
            let mut a = Acquisition::new(&cfg, shape(3), Limit::Until(t0 + ms(30)), 1, t0);
            let _ = a.begin_attempt(t0, OP);
            match round(&mut a, t0, &replies) {
                Decision::Failed { reason, .. } => assert_eq!(reason, want, "{replies:?}"),
                d => panic!("{d:?}"),
            }
        }
        // The same timeout within the operation timeout (not cut) is a node failure.
        let mut a = Acquisition::new(&cfg, shape(1), Limit::Attempts(2), 1, t0);
        let _ = a.begin_attempt(t0, OP);
        let _ = round(&mut a, t0, &[Reply::No]);
        let _ = a.begin_attempt(t0, OP);
        assert!(matches!(
            round(&mut a, t0, &[]),
            Decision::Failed {
                reason: NotAcquiredReason::TooFewNodes,
                ..
            }
        ));
    }

    #[test]
    fn the_next_attempt_follows_the_holders_expiry_when_it_comes_before_the_pause() {
        let t0 = Instant::now();
        let cfg = config();
        for seed in 0..50 {
            let mut a = Acquisition::new(&cfg, shape(1), Limit::Until(t0 + ms(5_000)), seed, t0);
            let _ = a.begin_attempt(t0, OP);
            let _ = round(&mut a, t0, &[Reply::No]);
            // Polling: a holder with 30 ms left is tried again 31–35 ms from now, not after 200–300 ms.
            match a.next(t0, false, Some(ms(30))) {
                Next::Sleep(at) => assert!(
                    at >= t0 + ms(31) && at <= t0 + ms(35),
                    "seed {seed}: {:?}",
                    at - t0
                ),
                n => panic!("{n:?}"),
            }
            // A holder with 10 s left: the pause (a release may come earlier).
            match a.next(t0, false, Some(ms(10_000))) {
                Next::Sleep(at) => assert!(at >= t0 + ms(200) && at <= t0 + ms(300)),
                n => panic!("{n:?}"),
            }
            // Notified: the pushed wait ends at the holder's expiry (within the spread), polled by the pause
            // until a subscription is confirmed.
            match a.next(t0, true, Some(ms(1_000))) {
                Next::Wait {
                    held,
                    polling,
                    pushed,
                } => {
                    assert!(held);
                    assert!(polling >= t0 + ms(200) && polling <= t0 + ms(300));
                    assert!(pushed >= t0 + ms(1_001) && pushed <= t0 + ms(1_005));
                }
                n => panic!("{n:?}"),
            }
        }
    }

    #[test]
    fn the_spread_after_a_holders_expiry_follows_the_jitter_within_its_bound() {
        let t0 = Instant::now();
        let cfg = config();
        let spreads: Vec<Duration> = (0..200)
            .map(|seed| {
                let mut a =
                    Acquisition::new(&cfg, shape(1), Limit::Until(t0 + ms(5_000)), seed, t0);
                let _ = a.begin_attempt(t0, OP);
                let _ = round(&mut a, t0, &[Reply::No]);
                match a.next(t0, false, Some(ms(30))) {
                    Next::Sleep(at) => at - (t0 + ms(31)),
                    n => panic!("{n:?}"),
                }
            })
            .collect();
        let (min, max) = (spreads.iter().min(), spreads.iter().max());
        // Spread over the whole bound, not piled at one end.
        assert!(min.is_some_and(|d| *d < ms(1)), "{min:?}");
        assert!(
            max.is_some_and(|d| *d > ms(3) && *d <= EXPIRY_SPREAD),
            "{max:?}"
        );
        // Without jitter, none.
        let cfg = config().with_retry_jitter(0.0);
        let mut a = Acquisition::new(&cfg, shape(1), Limit::Until(t0 + ms(5_000)), 1, t0);
        let _ = a.begin_attempt(t0, OP);
        let _ = round(&mut a, t0, &[Reply::No]);
        assert_eq!(a.next(t0, false, Some(ms(30))), Next::Sleep(t0 + ms(31)));
    }

    #[test]
    fn attempts_and_deadlines_bound_the_retries() {
        let t0 = Instant::now();
        let cfg = config();
        let mut a = Acquisition::new(&cfg, shape(1), Limit::Attempts(2), 1, t0);
        let _ = a.begin_attempt(t0, OP);
        let _ = round(&mut a, t0, &[Reply::No]);
        assert!(matches!(a.next(t0, false, None), Next::Sleep(_)));
        let _ = a.begin_attempt(t0, OP);
        let _ = round(&mut a, t0, &[Reply::No]);
        assert_eq!(a.next(t0, false, None), Next::GiveUp);
        assert_eq!((a.attempts(), a.contended(), a.deadline()), (2, true, None));
        assert_eq!(a.failure().0, NotAcquiredReason::Contended);
        // A pause that ends past the deadline: give up now (polling); notified, wait up to the deadline.
        let mut a = Acquisition::new(&cfg, shape(1), Limit::Until(t0 + ms(100)), 1, t0);
        assert_eq!((a.attempts(), a.contended(), a.began()), (0, false, t0));
        assert_eq!(a.deadline(), Some(t0 + ms(100)));
        let _ = a.begin_attempt(t0, OP);
        let _ = round(&mut a, t0, &[Reply::No]);
        assert_eq!(a.next(t0, false, None), Next::GiveUp);
        assert!(
            matches!(a.next(t0, true, None), Next::Wait { pushed, .. } if pushed == t0 + ms(100))
        );
        // A permanent refusal ends at once.
        let mut a = Acquisition::new(&cfg, shape(1), Limit::Attempts(5), 1, t0);
        let _ = a.begin_attempt(t0, OP);
        let _ = round(&mut a, t0, &[failed(NodeErrorKind::WrongType, false)]);
        assert_eq!(a.next(t0, true, None), Next::GiveUp);
        let (reason, error) = a.failure();
        assert_eq!(reason, NotAcquiredReason::Refused);
        assert_eq!(error.map(|e| e.errors.len()), Some(1));
        // Past the deadline before the first attempt: nothing is sent.
        let mut a = Acquisition::new(&cfg, shape(1), Limit::Until(t0), 1, t0);
        assert!(a.expired());
        assert_eq!(a.failure().0, NotAcquiredReason::DeadlinePassed);
    }

    #[test]
    fn a_retry_due_exactly_at_the_deadline_is_not_made() {
        let t0 = Instant::now();
        // No jitter: the pause is exactly the retry delay (200 ms).
        let cfg = config().with_retry_jitter(0.0);
        for (deadline, want_retry) in [(ms(200), false), (ms(201), true)] {
            let mut a = Acquisition::new(&cfg, shape(1), Limit::Until(t0 + deadline), 1, t0);
            let _ = a.begin_attempt(t0, OP);
            let _ = round(&mut a, t0, &[Reply::No]);
            let next = a.next(t0, false, None);
            if want_retry {
                assert_eq!(next, Next::Sleep(t0 + ms(200)), "deadline {deadline:?}");
            } else {
                assert_eq!(next, Next::GiveUp, "deadline {deadline:?}");
            }
        }
    }

    #[test]
    fn fresh_nodes_are_spoiled_one_by_one_and_those_past_64_only_while_every_node_is() {
        let all = Fresh::ALL;
        assert!(all.get(0) && all.get(63) && all.get(64) && all.get(1_000));
        assert!(all.all_of(100));
        let mut f = Fresh::ALL;
        f.settle();
        // Settled: the first 64 stay fresh, the rest are not tracked.
        assert!(f.get(0) && f.get(63) && !f.get(64));
        assert!(f.all_of(64) && !f.all_of(65) && f.all_of(0));
        f.spoil(3);
        assert!(!f.get(3) && f.get(2) && f.get(4));
        assert!(!f.all_of(4) && f.all_of(3));
        // An index past 63 changes nothing tracked (and does not overflow).
        let before = f;
        f.spoil(64);
        f.spoil(200);
        assert_eq!(f, before);
        f.spoil(63);
        assert!(!f.get(63) && f.get(62));
        // Spoiling one node of an untouched set also ends "every node".
        let mut g = Fresh::ALL;
        g.spoil(1);
        assert!(!g.get(1) && g.get(0) && !g.get(64) && !g.all_of(2));
    }
}
