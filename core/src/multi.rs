//! Several locks taken as one: [`MultiLock`] and [`MultiLease`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::config::ConfigError;
use crate::driver::acquire::Taken;
use crate::driver::{AcquireRequest, Engine, Lock, Notes};
use crate::error::{Error, LossReason, NotAcquiredReason, QuorumError};
use crate::lease::{CleanupOnDrop, Lease, LeaseState, LossSignal, Releasing};
use crate::machine::{Reply, Tally, WaitFor};
use crate::manager::LockManager;
use crate::mode::Mode;
use crate::node::{MultiKeyItem, MultiKeyOp, MultiKeyReply, NodeError, NodeErrorKind};
use crate::observe::{CleanupCause, LeaseId};
use crate::token::Token;

// Here rather than in `manager.rs`, so that imports run one way: this module builds on `Lock`.
impl LockManager {
    /// Describes several locks to be acquired all or nothing and held as one; see [`MultiLock`].
    pub fn lock_all<I, K>(&self, keys: I) -> MultiLock
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        MultiLock::new(keys.into_iter().map(|k| self.lock(k.into())).collect())
    }
}

/// A description of several locks acquired all or nothing, held, renewed and released as one
/// [`MultiLease`]. Made by [`LockManager::lock_all`](crate::LockManager::lock_all); cheap to clone.
///
/// Moving stock between two warehouses, merging two accounts: every key must be held before the work
/// starts, and none may stay held when the acquisition fails.
///
/// # How it acquires
/// **On one node** (single mode) whose [`RedisNode::multi_key`](crate::RedisNode::multi_key) can do it — the
/// adapters on any server that runs Lua scripts, and on Redis Cluster when every key (and fence counter)
/// hashes to one slot (`{tag}`) — an attempt is **one atomic step**: every key is set with its own token and
/// the TTL only if none is held by another owner, and otherwise nothing at all is written. With
/// [`fenced`](Self::fenced), every key's fencing token is issued in that same step, so a refused attempt
/// spends no fence. The release of the set, and its manual extension, are one step too.
///
/// **Otherwise** — Redlock, keys in several Cluster slots, a server without Lua, a node that does not
/// implement `multi_key` — the keys are taken one lock at a time in one fixed order (sorted), so two
/// acquisitions of overlapping sets never wait for each other in a cycle. An attempt tries every key once;
/// if one is held by another owner (or fails), every key this attempt took is released at once. Each key's
/// fencing token then comes from its own acquisition step, and a refused attempt may have spent the fences
/// of the keys it took before.
///
/// Either way, an attempt that found a key held is followed — if the limit allows — by waiting for that key
/// the way [`Lock::acquire_until`] does (woken by its release where the node can subscribe), holding nothing
/// else; the next attempt starts with that key held (its fence is the one its own acquisition issued). Each
/// key is its own lease with its own token, TTL and renewal; the set is valid until the earliest of their
/// deadlines. A manual [`MultiLease::extend`] is one step where the acquisition is, and so is each round of
/// the set's renewal ([`MultiLease::run`], [`auto_renew`](Self::auto_renew)) when every key has the same TTL:
/// one request extends every part, each part's outcome its own (renewed, at risk, or lost). Renewals go key
/// by key with Redlock, keys in several slots, a node that answers that it cannot extend the set in one step
/// (asked once per hold), or with [`Config::with_renewal_batching`](crate::Config::with_renewal_batching)
/// (whose batches already carry many keys per request). A set renewed in the background that was taken key by
/// key renews each key on its own.
///
/// ```
/// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
/// use std::time::Duration;
/// use redlease::{Config, LockManager};
///
/// # block_on(async {
/// let manager = LockManager::single(MapNode::default(), Config::default())?;
/// let transfer = manager.lock_all(["stock:{berlin}", "stock:{paris}"]);
/// let both = transfer.acquire_within(Duration::from_secs(5)).await?;
/// both.run(async { /* move the stock */ }).await?;
/// both.release().await?;
/// # Ok::<(), redlease::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct MultiLock {
    /// One lock per key, in acquisition (sorted) order.
    locks: Arc<[Lock]>,
    /// A key appeared more than once (refused at acquisition).
    duplicate: bool,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("keys", &self.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl MultiLock {
    pub(crate) fn new(mut locks: Vec<Lock>) -> Self {
        locks.sort_by(|a, b| a.key().cmp(b.key()));
        let duplicate = locks.windows(2).any(|w| w[0].key() == w[1].key());
        Self {
            locks: locks.into(),
            duplicate,
        }
    }

    fn map(&self, f: impl Fn(Lock) -> Lock) -> Self {
        Self {
            locks: self.locks.iter().cloned().map(f).collect(),
            duplicate: self.duplicate,
        }
    }

    /// The keys, in the order they are acquired.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.locks.iter().map(Lock::key)
    }

    /// Sets the TTL of every key's lease; see [`Lock::expiry`].
    #[must_use]
    pub fn expiry(&self, expiry: Duration) -> Self {
        self.map(|l| l.expiry(expiry))
    }

    /// Sets how often [`MultiLease::run`] renews each key; see [`Lock::renew_every`].
    #[must_use]
    pub fn renew_every(&self, interval: Duration) -> Self {
        self.map(|l| l.renew_every(interval))
    }

    /// Renews every key in the background; see [`Lock::auto_renew`].
    #[must_use]
    pub fn auto_renew(&self, interval: Duration) -> Self {
        self.map(|l| l.auto_renew(interval))
    }

    /// Limits the whole hold of every key; see [`Lock::max_hold`].
    #[must_use]
    pub fn max_hold(&self, max_hold: Duration) -> Self {
        self.map(|l| l.max_hold(max_hold))
    }

    /// Stores `info` with every key; see [`Lock::with_holder_info`].
    #[must_use]
    pub fn with_holder_info(&self, info: &str) -> Self {
        self.map(|l| l.with_holder_info(info))
    }

    /// Issues a fencing token for every key from the counter `fence_key(key)` (single mode only); see
    /// [`Lock::fenced`]. On a node that takes the set in one step (see [How it acquires](Self#how-it-acquires))
    /// every token is issued in that step; otherwise each comes from its own key's step. The counters must
    /// differ from each other and from the lock keys for the one step (else the keys go one at a time).
    #[must_use]
    pub fn fenced(&self, fence_key: impl Fn(&str) -> String) -> Self {
        self.map(|l| {
            let fence = fence_key(l.key());
            l.fenced(fence)
        })
    }

    /// Checks every key's description without sending anything; see [`Lock::validate`].
    ///
    /// # Errors
    /// [`Error::Config`] for an empty set or a key given twice, or the first key's own error.
    pub fn validate(&self) -> Result<(), Error> {
        if self.locks.is_empty() {
            return Err(ConfigError::InvalidKey("lock_all needs at least one key").into());
        }
        if self.duplicate {
            return Err(ConfigError::InvalidKey("lock_all was given a key twice").into());
        }
        self.locks.iter().try_for_each(Lock::validate)
    }

    /// One attempt: every key tried once, in order; all held, or none.
    ///
    /// # Errors
    /// The first key's failure, as [`Lock::try_acquire`] reports it ([`Error::is_contended`] for a key held
    /// by another owner); every key taken meanwhile has been released.
    pub async fn try_acquire(&self) -> Result<MultiLease, Error> {
        self.validate()?;
        match self.attempt(None).await {
            Ok(lease) => Ok(lease),
            Err((_, e)) => Err(e),
        }
    }

    /// Keeps trying for `patience` from now; see [`acquire_until`](Self::acquire_until).
    ///
    /// # Errors
    /// As [`acquire_until`](Self::acquire_until).
    pub async fn acquire_within(&self, patience: Duration) -> Result<MultiLease, Error> {
        let Some(first) = self.locks.first() else {
            return Err(ConfigError::InvalidKey("lock_all needs at least one key").into());
        };
        let deadline = crate::time::add(first.now(), patience);
        self.acquire_until(deadline).await
    }

    /// Keeps trying until `deadline` (an instant of the manager's timer): after an attempt failed on a key,
    /// waits for that key as [`Lock::acquire_until`] does, holding no other, then tries the rest.
    ///
    /// # Errors
    /// The last attempt's failure, as [`Lock::acquire_until`] reports it; nothing is held.
    pub async fn acquire_until(&self, deadline: Instant) -> Result<MultiLease, Error> {
        self.validate()?;
        let mut first: Option<Lease> = None;
        loop {
            let blocked = match self.attempt(first.take()).await {
                Ok(lease) => return Ok(lease),
                // A refusal no retry can change ends the wait at once (the one-step attempt names no key to
                // wait for: the first key would be taken and the set refused again, until the deadline).
                Err((
                    _,
                    e @ Error::NotAcquired {
                        reason: NotAcquiredReason::Refused,
                        ..
                    },
                )) => return Err(e),
                Err((blocked, e)) => match self.locks.get(blocked) {
                    Some(lock) if lock.now() < deadline => lock,
                    _ => return Err(e),
                },
            };
            // Wait for the key that stopped the attempt, holding nothing else; the next attempt starts with
            // it held. Its background renewal, if any, starts with the set's (see `hand_out`).
            first = Some(blocked.in_foreground().acquire_until(deadline).await?);
        }
    }

    /// One pass over the keys in order, starting with `held` (a key already taken by waiting for it). On
    /// failure, releases everything it took and returns the index of the key that failed with its error.
    ///
    /// The parts already held are watched while later keys are tried: one that is lost meanwhile (its
    /// deadline passed during a slow round or a pause) ends the attempt at once, reported by its loss signal
    /// at its deadline, and the set is never handed out with a part already gone.
    async fn attempt(&self, held: Option<Lease>) -> Result<MultiLease, (usize, Error)> {
        let Some(first) = self.locks.first() else {
            return Err((
                0,
                ConfigError::InvalidKey("lock_all needs at least one key").into(),
            ));
        };
        let held = match self.one_step_engine() {
            Some(engine) => match self.attempt_in_one_step(&engine, held).await {
                Step::Done(result) => return result,
                Step::Unsupported(held) => held,
            },
            None => held,
        };
        let mut slots: Vec<Option<Lease>> = self.locks.iter().map(|_| None).collect();
        if let Some(lease) = held {
            match self.locks.iter().position(|l| l.key() == lease.key()) {
                Some(i) => slots[i] = Some(lease),
                None => drop(lease),
            }
        }
        for (i, lock) in self.locks.iter().enumerate() {
            if slots[i].is_some() {
                continue;
            }
            let outcome = watch_parts(&slots, lock.try_acquire()).await;
            let failed = match outcome {
                Ok(Ok(lease)) => {
                    slots[i] = Some(lease);
                    continue;
                }
                Ok(Err(e)) => (i, e),
                Err(part) => {
                    let lost = slots[part].as_ref().map(|l| l.state());
                    let reason = match lost {
                        Some(LeaseState::Lost(reason)) => reason,
                        _ => LossReason::Expired,
                    };
                    (
                        part,
                        Error::Lost {
                            key: self.locks[part].key().to_owned(),
                            reason,
                            source: None,
                        },
                    )
                }
            };
            release_all(slots.into_iter().flatten().collect()).await;
            return Err(failed);
        }
        // A part whose deadline passed with the last round is not handed out.
        let _ = first;
        self.hand_out(slots.into_iter().flatten().collect()).await
    }

    /// The manager's engine, if these keys may be taken in one step ([`RedisNode::multi_key`]): a single
    /// node (not Redlock, not a semaphore's permits), one TTL for every key, and distinct fence counters that
    /// are not lock keys. Whether the node can is its own answer.
    ///
    /// [`RedisNode::multi_key`]: crate::RedisNode::multi_key
    fn one_step_engine(&self) -> Option<Arc<Engine>> {
        let first = self.locks.first()?;
        let engine = first.engine();
        let shaped = engine.mode == Mode::Single
            && engine.nodes.len() == 1
            && !engine.permits
            && !engine.contention_writes;
        if !shaped {
            return None;
        }
        let mut names: std::collections::HashSet<&str> = self.keys().collect();
        for lock in self.locks.iter() {
            if !Arc::ptr_eq(&lock.engine(), &engine)
                || lock.effective_expiry() != first.effective_expiry()
            {
                return None;
            }
            if let Some(fence_key) = lock.fence_key() {
                if !names.insert(fence_key) {
                    return None;
                }
            }
        }
        Some(engine)
    }

    /// One attempt as one atomic step on the node ([`MultiKeyOp::Acquire`]): every key with its own token
    /// (the key in `held`, taken by waiting for it, with its lease's), every fence issued in that step.
    /// [`Step::Unsupported`] (with `held` back) when the node cannot, having sent nothing.
    async fn attempt_in_one_step(&self, engine: &Arc<Engine>, held: Option<Lease>) -> Step {
        let began = engine.timer.now();
        let (ttl, op_timeout) = match self.locks[0].ttl_and_timeout() {
            Ok(plan) => plan,
            Err(e) => return Step::Done(Err((0, e))),
        };
        let held_at = held
            .as_ref()
            .and_then(|l| self.locks.iter().position(|k| k.key() == l.key()));
        let mut tokens: Vec<Token> = Vec::with_capacity(self.locks.len());
        for (i, lock) in self.locks.iter().enumerate() {
            let token = match (&held, held_at == Some(i)) {
                (Some(lease), true) => Ok(lease.token().clone()),
                _ => lock.new_token(),
            };
            match token {
                Ok(t) => tokens.push(t),
                Err(e) => {
                    release_all(held.into_iter().collect()).await;
                    return Step::Done(Err((i, e)));
                }
            }
        }
        let ids: Vec<LeaseId> = self.locks.iter().map(|_| LeaseId::next()).collect();
        let items: Vec<MultiKeyItem<'_>> = self
            .locks
            .iter()
            .zip(&tokens)
            .map(|(lock, token)| {
                let item = MultiKeyItem::new(lock.key(), token);
                match lock.fence_key() {
                    Some(fence_key) => item.fenced(fence_key),
                    None => item,
                }
            })
            .collect();
        // Armed before the request is sent: dropped from here on, the new tokens are deleted in the
        // background (the held key's lease cleans up after itself).
        let mut guards: Vec<CleanupOnDrop<'_>> = self
            .locks
            .iter()
            .zip(&tokens)
            .zip(&ids)
            .enumerate()
            .filter(|(i, _)| held_at != Some(*i))
            .map(|(_, ((lock, token), id))| {
                CleanupOnDrop::new(engine, lock.key(), token, op_timeout, *id)
            })
            .collect();
        let disarm =
            |guards: &mut Vec<CleanupOnDrop<'_>>| guards.iter_mut().for_each(CleanupOnDrop::disarm);
        let items_ref = &items;
        let round = engine.round(
            WaitFor::Decision,
            false,
            op_timeout.saturating_add(engine.wait_allowance()),
            move |_, node| node.multi_key(items_ref, MultiKeyOp::Acquire { ttl }),
            |reply| matches!(reply, MultiKeyReply::Taken { .. }),
        );
        // The held key's lease is watched meanwhile, as in a one-key-at-a-time attempt: lost during the
        // step, it ends the attempt at once (reported by its loss signal at its deadline).
        let r = match watch_parts(std::slice::from_ref(&held), round).await {
            Ok(r) => r,
            Err(_) => {
                self.clean_up(engine, &tokens, held_at, &ids, op_timeout)
                    .await;
                disarm(&mut guards);
                return Step::Done(Err(self.held_lost(held, held_at).await));
            }
        };
        let fences = match r.values.first().cloned().flatten() {
            Some(MultiKeyReply::Taken { fences }) if fences.len() == items.len() => fences,
            Some(MultiKeyReply::Held { index, .. }) if index < items.len() => {
                // Nothing was written.
                disarm(&mut guards);
                release_all(held.into_iter().collect()).await;
                return Step::Done(Err((
                    index,
                    self.not_acquired(index, NotAcquiredReason::Contended, None),
                )));
            }
            reply => {
                let error = match reply {
                    Some(other) => NodeError::ambiguous(
                        NodeErrorKind::Protocol,
                        format!(
                            "multi_key answered {other:?} to an acquisition of {} keys",
                            items.len()
                        ),
                    ),
                    None => r
                        .tally
                        .errors()
                        .into_iter()
                        .next()
                        .map_or_else(|| NodeError::timed_out(op_timeout), |(_, e)| e),
                };
                if error.kind() == NodeErrorKind::Unsupported && !error.is_ambiguous() {
                    disarm(&mut guards);
                    return Step::Unsupported(held);
                }
                if error.is_ambiguous() {
                    self.clean_up(engine, &tokens, held_at, &ids, op_timeout)
                        .await;
                }
                disarm(&mut guards);
                release_all(held.into_iter().collect()).await;
                let reason = if error.is_permanent() {
                    NotAcquiredReason::Refused
                } else {
                    NotAcquiredReason::TooFewNodes
                };
                return Step::Done(Err((0, self.not_acquired(0, reason, Some(error)))));
            }
        };
        // What follows a won acquisition on the node, per key: restart detection, fence regression (which
        // releases that key), the durability wait (as for one key).
        let notes = Notes::default();
        let node = engine.nodes[0].as_ref();
        let mut failed = None;
        let checks = async {
            for (i, item) in items.iter().enumerate() {
                let fence = fences[i].map_or(Some(0), Some);
                // The held key's fence is its lease's, already recorded: not a new one to compare.
                let fence_key = item.fence_key.filter(|_| held_at != Some(i));
                let checked = engine
                    .after_acquire(
                        0,
                        node,
                        AcquireRequest {
                            key: item.key,
                            fence_key,
                            token: item.token,
                            ttl,
                        },
                        Ok(fence),
                        None,
                        &notes,
                    )
                    .await;
                if let Err(e) = checked {
                    failed = Some((i, e));
                    break;
                }
            }
        };
        if watch_parts(std::slice::from_ref(&held), checks)
            .await
            .is_err()
        {
            self.clean_up(engine, &tokens, held_at, &ids, op_timeout)
                .await;
            disarm(&mut guards);
            return Step::Done(Err(self.held_lost(held, held_at).await));
        }
        let ended = engine.timer.now();
        if engine.hook.active() {
            notes.emit(engine, items[0].key, ids[0], ended);
        }
        let factor = engine.config.drift_factor();
        let drift = crate::machine::validity::drift(ttl, factor);
        let wall = (r.wall.0, engine.timer.wall_now());
        let valid_until =
            crate::machine::validity::deadline_after_round(r.started, ended, ttl, factor)
                .filter(|_| !crate::time::suspended((r.started, ended), wall, drift));
        let valid_until = match (failed, valid_until) {
            (None, Some(valid_until)) => valid_until,
            (failed, _) => {
                self.clean_up(engine, &tokens, held_at, &ids, op_timeout)
                    .await;
                disarm(&mut guards);
                release_all(held.into_iter().collect()).await;
                let (index, reason, error) = match failed {
                    Some((i, e)) if e.kind() == NodeErrorKind::NotReplicated => {
                        (i, NotAcquiredReason::NotReplicated, Some(e))
                    }
                    Some((i, e)) if e.is_permanent() => (i, NotAcquiredReason::Refused, Some(e)),
                    Some((i, e)) => (i, NotAcquiredReason::TooFewNodes, Some(e)),
                    None => (0, NotAcquiredReason::ValidityExhausted, None),
                };
                return Step::Done(Err((index, self.not_acquired(index, reason, error))));
            }
        };
        disarm(&mut guards);
        drop(guards);
        let waited = engine.timer.now().saturating_duration_since(began);
        let mut held = held;
        let mut leases = Vec::with_capacity(self.locks.len());
        for (i, ((lock, token), fence)) in self.locks.iter().zip(tokens).zip(fences).enumerate() {
            if held_at == Some(i) {
                if let Some(lease) = held.take() {
                    leases.push(lease);
                    continue;
                }
            }
            // Renewed in the background, if at all, together with the other parts (see `hand_out`).
            leases.push(Lease::new(lock.in_foreground().granted(Taken {
                id: ids[i],
                token,
                fence: fence.filter(|_| lock.fence_key().is_some()),
                ttl,
                op_timeout,
                started: r.started,
                wall_started: r.wall.0,
                valid_until,
                waited,
            })));
        }
        Step::Done(self.hand_out(leases).await)
    }

    /// A one-step attempt whose held part was lost meanwhile: releases it, and the attempt's error.
    async fn held_lost(&self, held: Option<Lease>, held_at: Option<usize>) -> (usize, Error) {
        let part = held_at.unwrap_or(0);
        let reason = match held.as_ref().map(Lease::state) {
            Some(LeaseState::Lost(reason)) => reason,
            _ => LossReason::Expired,
        };
        release_all(held.into_iter().collect()).await;
        let key = self.locks[part].key().to_owned();
        (
            part,
            Error::Lost {
                key,
                reason,
                source: None,
            },
        )
    }

    /// Deletes the tokens of a one-step attempt that may have been written (the held key's aside), one
    /// compare-and-delete each, concurrently.
    async fn clean_up(
        &self,
        engine: &Arc<Engine>,
        tokens: &[Token],
        held_at: Option<usize>,
        ids: &[LeaseId],
        timeout: Duration,
    ) {
        let rounds = self
            .locks
            .iter()
            .zip(tokens)
            .zip(ids)
            .enumerate()
            .filter(|(i, _)| held_at != Some(*i))
            .map(|(_, ((lock, token), id))| {
                engine.cleanup(
                    lock.key(),
                    token,
                    timeout,
                    None,
                    (*id, CleanupCause::FailedAttempt),
                )
            });
        join_all(rounds).await;
    }

    /// The error of a one-step attempt that failed on key `index`.
    fn not_acquired(
        &self,
        index: usize,
        reason: NotAcquiredReason,
        error: Option<NodeError>,
    ) -> Error {
        Error::NotAcquired {
            key: self.locks[index].key().to_owned(),
            mode: Mode::Single,
            attempts: 1,
            reason,
            last_error: error.map(|e| {
                Box::new(QuorumError::new(
                    crate::error::Operation::Acquire,
                    0,
                    1,
                    vec![(0, e)],
                ))
            }),
        }
    }

    /// The set, unless a part's deadline already passed (then every part is released).
    async fn hand_out(&self, leases: Vec<Lease>) -> Result<MultiLease, (usize, Error)> {
        if let Some(part) = leases.iter().position(|l| !l.is_held()) {
            let reason = match leases[part].state() {
                LeaseState::Lost(reason) => reason,
                _ => LossReason::Expired,
            };
            let key = leases[part].key().to_owned();
            release_all(leases).await;
            return Err((
                part,
                Error::Lost {
                    key,
                    reason,
                    source: None,
                },
            ));
        }
        if self.locks[0].renews_in_background() {
            // Parts that nothing renews yet (all of a set taken in one step, and the key it waited for):
            // together, one step per round, where the node can.
            crate::lease::renew_set_in_background(&leases);
        }
        let acquired_at = self.locks[0].now();
        Ok(MultiLease {
            leases,
            acquired_at,
        })
    }

    /// Reads the holder of every key; see [`Lock::holder_info`].
    ///
    /// # Errors
    /// The first key's error.
    pub async fn holder_info(&self) -> Result<Vec<Option<crate::HolderInfo>>, Error> {
        let mut out = Vec::with_capacity(self.locks.len());
        for lock in self.locks.iter() {
            out.push(lock.holder_info().await?);
        }
        Ok(out)
    }
}

/// What a one-step attempt did.
enum Step {
    /// The node cannot take these keys in one step (nothing was sent): take them one at a time, starting
    /// with the held lease given back.
    Unsupported(Option<Lease>),
    /// The attempt's outcome, as [`MultiLock::attempt`]'s.
    Done(Result<MultiLease, (usize, Error)>),
}

/// Drives `fut` while watching the loss signals of the parts already held in `slots`: `Err(index)` of the
/// first part lost before `fut` finished (which is then dropped: an acquisition future cleans up after
/// itself).
async fn watch_parts<F: Future>(slots: &[Option<Lease>], fut: F) -> Result<F::Output, usize> {
    let mut signals: Vec<(usize, LossSignal)> = slots
        .iter()
        .enumerate()
        .filter_map(|(i, l)| l.as_ref().map(|l| (i, l.lost())))
        .collect();
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        for (i, signal) in &mut signals {
            if Pin::new(signal).poll(cx).is_ready() {
                return Poll::Ready(Err(*i));
            }
        }
        fut.as_mut().poll(cx).map(Ok)
    })
    .await
}

/// Releases `leases` concurrently, ignoring the outcome (a failed acquisition's partial set: whatever a
/// node could not delete expires by its TTL).
async fn release_all(leases: Vec<Lease>) {
    let _ = join_all(leases.into_iter().map(Lease::release)).await;
}

/// The compare-and-delete of every part as one step on the node ([`MultiKeyOp::Release`]): each part's
/// round result, as if it had been its own round; `None` when the node cannot (nothing was sent).
async fn release_in_one_step(
    engine: &Arc<Engine>,
    parts: &[Releasing],
) -> Option<Vec<crate::driver::RoundResult<bool>>> {
    let items: Vec<MultiKeyItem<'_>> = parts
        .iter()
        .map(|p| MultiKeyItem::new(p.key(), p.token()))
        .collect();
    let timeout = parts
        .iter()
        .map(Releasing::op_timeout)
        .min()
        .unwrap_or_default();
    let items_ref = &items;
    let r = engine
        .round(
            WaitFor::All,
            false,
            timeout,
            move |_, node| node.multi_key(items_ref, MultiKeyOp::Release),
            |_| true,
        )
        .await;
    let replies: Vec<Reply> = match r.values.first().cloned().flatten() {
        Some(MultiKeyReply::Done(flags)) if flags.len() == items.len() => flags
            .into_iter()
            .map(|ok| if ok { Reply::Yes } else { Reply::No })
            .collect(),
        reply => {
            let error = match reply {
                Some(other) => NodeError::ambiguous(
                    NodeErrorKind::Protocol,
                    format!(
                        "multi_key answered {other:?} to a release of {} keys",
                        items.len()
                    ),
                ),
                None => r
                    .tally
                    .errors()
                    .into_iter()
                    .next()
                    .map_or_else(|| NodeError::timed_out(timeout), |(_, e)| e),
            };
            if error.kind() == NodeErrorKind::Unsupported && !error.is_ambiguous() {
                return None;
            }
            // As each part's own round would have failed: not retried per key, where a step that was
            // applied would read as "not held".
            items.iter().map(|_| Reply::Failed(error.clone())).collect()
        }
    };
    Some(
        replies
            .into_iter()
            .map(|reply| {
                let yes = matches!(reply, Reply::Yes);
                let answered = !matches!(reply, Reply::Failed(_));
                let mut tally = Tally::new(1, engine.quorum(), WaitFor::All);
                tally.handle_reply(0, reply);
                crate::driver::RoundResult {
                    tally,
                    values: crate::machine::slots::Slots::from_fn(1, |_| answered.then_some(yes)),
                    started: r.started,
                    ended: r.ended,
                    wall: r.wall,
                }
            })
            .collect(),
    )
}

/// Polls every future concurrently; their outputs in order.
async fn join_all<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (f, out) in pending.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => all = false,
                }
            }
        }
        if all { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    done.into_iter().flatten().collect()
}

/// Several leases held as one: the result of a [`MultiLock`] acquisition.
///
/// Valid while every part is; [lost](Self::state) as soon as any part is lost (the others stay held until
/// the `MultiLease` is released or dropped: release it). Dropping it drops every part.
pub struct MultiLease {
    /// In key order; never empty.
    leases: Vec<Lease>,
    /// When the acquisition that made it ended (on the manager's timer).
    acquired_at: Instant,
}

impl fmt::Debug for MultiLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLease")
            .field("leases", &self.leases)
            .finish()
    }
}

impl MultiLease {
    /// The parts, one lease per key, in key order.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.leases.iter().map(Lease::key)
    }

    /// Every key's fencing token, in key order (`None` for unfenced keys).
    pub fn fencing_tokens(&self) -> Vec<Option<u64>> {
        self.leases.iter().map(Lease::fencing_token).collect()
    }

    /// The earliest validity deadline of the parts.
    pub fn valid_until(&self) -> Instant {
        self.leases
            .iter()
            .map(Lease::valid_until)
            .min()
            .unwrap_or(self.acquired_at)
    }

    /// Validity left now: the least of the parts'; zero once any is lost.
    pub fn remaining(&self) -> Duration {
        self.leases
            .iter()
            .map(Lease::remaining)
            .min()
            .unwrap_or_default()
    }

    /// The worst state of the parts: lost if any is lost (with its reason), at risk if any is at risk.
    pub fn state(&self) -> LeaseState {
        let mut worst = LeaseState::Held;
        for lease in &self.leases {
            match lease.state() {
                LeaseState::Lost(reason) => return LeaseState::Lost(reason),
                LeaseState::AtRisk => worst = LeaseState::AtRisk,
                LeaseState::Held => {}
            }
        }
        worst
    }

    /// `true` while every part is held (including while at risk).
    pub fn is_held(&self) -> bool {
        !matches!(self.state(), LeaseState::Lost(_))
    }

    /// A future that resolves, with the reason, once any part is lost, released or dropped.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let mut signals: Vec<LossSignal> = self.leases.iter().map(Lease::lost).collect();
        std::future::poll_fn(move |cx| {
            for s in &mut signals {
                if let Poll::Ready(reason) = Pin::new(s).poll(cx) {
                    return Poll::Ready(reason);
                }
            }
            Poll::Pending
        })
    }

    /// Extends every part to `ttl` from now — in one step on a node that can (see [`MultiLock`]'s "How it
    /// acquires"), else concurrently — see [`Lease::extend`].
    ///
    /// # Errors
    /// The first part's error, in key order (every part was tried).
    pub async fn extend(&self, ttl: Duration) -> Result<(), Error> {
        if let Some(results) = Lease::extend_together(&self.leases, ttl).await {
            return results.into_iter().collect();
        }
        // Every part's loss signal is polled meanwhile: a part whose deadline passes while another part's
        // extension is under way is reported lost at its deadline.
        crate::lease::watching_losses(
            &self.leases,
            join_all(self.leases.iter().map(|l| l.extend(ttl))),
        )
        .await
        .into_iter()
        .collect()
    }

    /// Runs `work` while holding every part, renewing each meanwhile — on one node together, one step per
    /// round (see [`MultiLock`]'s "How it acquires") — and stops it as soon as any part is lost; see
    /// [`Lease::run`]. The parts stay held when it returns: release the `MultiLease` afterwards.
    ///
    /// # Errors
    /// [`Error::Lost`] for the first part found lost, with its cause.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        crate::lease::run_all(&self.leases, work).await
    }

    /// Releases every part — in one step on a node that can (see [`MultiLock`]'s "How it acquires"), else
    /// concurrently — see [`Lease::release`].
    ///
    /// # Errors
    /// The first part's error, in key order ([`Error::Lost`] if it had been lost: work done under the set
    /// may have overlapped another holder of that key). Every part was released whatever the errors.
    pub async fn release(self) -> Result<(), Error> {
        let parts: Vec<Releasing> = self.leases.into_iter().map(Lease::begin_release).collect();
        let Some(first) = parts.first() else {
            return Ok(());
        };
        let engine = Arc::clone(first.engine());
        let one_step = engine.mode == Mode::Single
            && engine.nodes.len() == 1
            && !engine.permits
            && parts.iter().all(|p| Arc::ptr_eq(p.engine(), &engine));
        // Armed before the first await: a release dropped from here on still deletes every token.
        let mut guards: Vec<CleanupOnDrop<'_>> = parts.iter().map(Releasing::guard).collect();
        let mut rounds = None;
        if one_step {
            rounds = release_in_one_step(&engine, &parts).await;
        }
        let rounds = match rounds {
            Some(rounds) => rounds,
            None => join_all(parts.iter().map(Releasing::round)).await,
        };
        guards.iter_mut().for_each(CleanupOnDrop::disarm);
        drop(guards);
        parts
            .into_iter()
            .zip(&rounds)
            .map(|(part, r)| part.finish(r))
            .collect::<Vec<_>>()
            .into_iter()
            .try_for_each(|r| r.map(|_| ()))
    }
}
