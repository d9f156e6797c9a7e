//! The async driver: runs rounds of node calls concurrently, bounded by a deadline, without any runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime};

use crate::config::Config;
use crate::machine::{Jitter, Reply, Tally, Verdict, WaitFor};
use crate::node::{NodeError, NodeErrorKind, RedisNode, Ttl};
use crate::observe::{CleanupCause, EventKind, LeaseId, Nodes};
use crate::time::SharedTimer;
use crate::token::Token;

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A task handed to the user's spawn hook.
pub type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A way to run a background task, supplied by the user (redlease never calls a runtime itself).
///
/// Implemented for every `Fn(Task) + Send + Sync` closure, e.g. `|task| { tokio::spawn(task); }` or
/// `|task| smol::spawn(task).detach()`.
pub trait Spawn: Send + Sync {
    /// Runs `task` to completion in the background.
    fn spawn(&self, task: Task);
}

impl<F: Fn(Task) + Send + Sync> Spawn for F {
    fn spawn(&self, task: Task) {
        self(task)
    }
}

/// Single authority or Redlock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// One logical Redis authority; fencing tokens available.
    Single,
    /// An odd number (≥ 3) of independent primaries; majority acquisition and renewal, no fencing.
    Redlock,
}

/// Everything a manager, its locks and its leases share.
pub(crate) struct Engine {
    pub(crate) nodes: Vec<Arc<dyn RedisNode>>,
    pub(crate) mode: Mode,
    pub(crate) config: Config,
    pub(crate) timer: SharedTimer,
    pub(crate) spawner: Option<Arc<dyn Spawn>>,
    pub(crate) jitter: Mutex<Jitter>,
    pub(crate) hook: crate::observe::Hook,
    /// Renewals waiting for the next batch (see `crate::batch`).
    pub(crate) batcher: crate::batch::Batcher,
}

/// The replies of one round, with their values where a node answered.
pub(crate) struct RoundResult<T> {
    pub(crate) tally: Tally,
    pub(crate) values: Vec<Option<T>>,
    pub(crate) started: Instant,
    pub(crate) ended: Instant,
    /// Wall-clock readings at the start and end (see [`Timer::wall_now`](crate::Timer::wall_now)).
    pub(crate) wall: (Option<SystemTime>, Option<SystemTime>),
}

impl<T> RoundResult<T> {
    /// Whether the machine was suspended during the round, by more than `allowance`.
    pub(crate) fn suspended(&self, allowance: Duration) -> bool {
        crate::time::suspended((self.started, self.ended), self.wall, allowance)
    }

    /// [`suspended`](Self::suspended) as a closure over the round's times.
    pub(crate) fn suspended_by(&self) -> impl Fn(Duration) -> bool + use<T> {
        let (times, wall) = ((self.started, self.ended), self.wall);
        move |allowance| crate::time::suspended(times, wall, allowance)
    }
}

/// The least time a won script round waits for its stragglers: a second request after `NOSCRIPT` is one
/// more round trip, which a loaded machine can delay by tens of milliseconds.
pub(crate) const GRACE_FLOOR: Duration = Duration::from_millis(50);

/// The grace floor for a round with this timeout: [`GRACE_FLOOR`], or a quarter of the timeout when that is
/// shorter.
pub(crate) fn grace_floor(timeout: Duration) -> Duration {
    GRACE_FLOOR.min(timeout / 4)
}

impl Engine {
    pub(crate) fn quorum(&self) -> usize {
        crate::machine::quorum(self.nodes.len())
    }

    pub(crate) fn next_seed(&self) -> u64 {
        match self.jitter.lock() {
            Ok(mut j) => j.next_u64(),
            Err(poisoned) => poisoned.into_inner().next_u64(),
        }
    }

    /// Calls `op` on every node concurrently and collects replies until the tally is done or `timeout` passes.
    /// `yes` decides whether a successful value counts as a yes vote.
    ///
    /// With `grace`, a round won by a quorum still lets the remaining nodes answer for twice the time the quorum
    /// took, and at least [`grace_floor`] (see below). Rounds of single commands need none: a command already handed to the connection is
    /// sent and applied even when its reply is abandoned; a script may need a second request (`EVAL` after
    /// `NOSCRIPT`) that only happens while its future is polled.
    pub(crate) async fn round<'a, T, Op, Yes>(
        &'a self,
        wait: WaitFor,
        grace: bool,
        timeout: Duration,
        op: Op,
        yes: Yes,
    ) -> RoundResult<T>
    where
        T: Send + 'a,
        Op: Fn(usize, &'a dyn RedisNode) -> BoxFuture<'a, Result<T, NodeError>>,
        Yes: Fn(&T) -> bool,
    {
        let started = self.timer.now();
        let wall_started = self.timer.wall_now();
        let n = self.nodes.len();
        let mut tally = Tally::new(n, self.quorum(), wait);
        let mut values: Vec<Option<T>> = (0..n).map(|_| None).collect();
        let mut calls: Vec<Option<BoxFuture<'a, Result<T, NodeError>>>> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| Some(op(i, node.as_ref())))
            .collect();
        let deadline = crate::time::add(started, timeout);
        let mut sleep = self.timer.sleep_until(deadline);
        let mut grace_sleep: Option<crate::time::Sleep> = None;

        std::future::poll_fn(|cx| {
            for (i, slot) in calls.iter_mut().enumerate() {
                let Some(call) = slot else { continue };
                if let Poll::Ready(result) = call.as_mut().poll(cx) {
                    *slot = None;
                    let reply = match result {
                        Ok(value) => {
                            let reply = if yes(&value) { Reply::Yes } else { Reply::No };
                            values[i] = Some(value);
                            reply
                        }
                        Err(e) => Reply::Failed(e),
                    };
                    tally.handle_reply(i, reply);
                }
            }
            if tally.pending() == 0 {
                return Poll::Ready(());
            }
            if tally.is_done() {
                if !grace || tally.verdict() != Verdict::Quorum {
                    return Poll::Ready(());
                }
                // Won: give the stragglers twice as long again as the quorum took, and at least
                // `GRACE_FLOOR` (a quarter of the timeout when that is shorter), capped by the round's
                // deadline, so healthy nodes that answer a little later (a cold script cache costs a
                // second request, and a loaded machine may not schedule it for milliseconds) still get
                // the key, while a hung node costs a bounded, small delay.
                let grace_sleep = grace_sleep.get_or_insert_with(|| {
                    let now = self.timer.now();
                    let took = now.saturating_duration_since(started);
                    let grace = took.saturating_mul(2).max(grace_floor(timeout));
                    self.timer
                        .sleep_until(crate::time::add(now, grace).min(deadline))
                });
                if grace_sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
            }
            if sleep.as_mut().poll(cx).is_ready() {
                tally.handle_timeout(&NodeError::timed_out(timeout));
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
        // Abandon calls still in flight (a decided round waits for stragglers only briefly).
        drop(calls);
        RoundResult {
            tally,
            values,
            started,
            ended: self.timer.now(),
            wall: (wall_started, self.timer.wall_now()),
        }
    }

    /// One acquisition round. `Some(fence)` values only come from fenced single-node acquisition. `fresh`
    /// says the token has never been sent (the first attempt), so a plain `SET NX` suffices.
    pub(crate) async fn acquire_round(
        &self,
        key: &str,
        fence_key: Option<&str>,
        token: &Token,
        ttl: Ttl,
        timeout: Duration,
        fresh: bool,
    ) -> RoundResult<Option<u64>> {
        match fence_key {
            Some(fence_key) => {
                self.round(
                    WaitFor::Decision,
                    true,
                    timeout,
                    |_, node| node.acquire_fenced(key, fence_key, token, ttl),
                    Option::is_some,
                )
                .await
            }
            None => {
                // A fresh acquisition is one plain `SET NX` per node: no grace needed (see `round`).
                self.round(
                    WaitFor::Decision,
                    !fresh,
                    timeout,
                    |_, node| {
                        Box::pin(async move {
                            let taken = if fresh {
                                node.acquire_fresh(key, token, ttl).await
                            } else {
                                node.acquire(key, token, ttl).await
                            };
                            taken.map(|ok| ok.then_some(0))
                        })
                    },
                    Option::is_some,
                )
                .await
            }
        }
    }

    /// One extension round. `unconfirmed[i]`, where given and non-zero, is the smallest TTL (ms) of an earlier
    /// extension whose outcome is unknown on node `i`: if it is shorter than `ttl`, node `i`'s success is
    /// reported as an ambiguous error instead, because that earlier request may still land and shorten the key.
    pub(crate) async fn extend_round(
        &self,
        key: &str,
        token: &Token,
        ttl: Ttl,
        timeout: Duration,
        unconfirmed: Option<&[u64]>,
    ) -> RoundResult<bool> {
        self.round(
            WaitFor::Decision,
            true,
            timeout,
            |i, node| {
                let shorter_pending = unconfirmed
                    .and_then(|u| u.get(i).copied())
                    .is_some_and(|min| min != 0 && min < ttl.as_millis());
                if !shorter_pending {
                    return node.extend(key, token, ttl);
                }
                Box::pin(async move {
                    match node.extend(key, token, ttl).await {
                        Ok(true) => Err(NodeError::ambiguous(
                            NodeErrorKind::Other,
                            "extended, but not counted: an earlier, shorter extension of this lease may still \
                             be applied on this node after it",
                        )),
                        other => other,
                    }
                })
            },
            |ok| *ok,
        )
        .await
    }

    /// One compare-and-delete round on the nodes in `only` (all nodes when `None`), waiting for every reply.
    pub(crate) async fn release_round(
        &self,
        key: &str,
        token: &Token,
        timeout: Duration,
        only: Option<&[usize]>,
    ) -> RoundResult<bool> {
        self.round(
            WaitFor::All,
            false,
            timeout,
            |i, node| {
                if only.is_none_or(|only| only.contains(&i)) {
                    node.release(key, token)
                } else {
                    // Not a target: answered locally so the tally still covers every index.
                    Box::pin(std::future::ready(Ok(false)))
                }
            },
            |ok| *ok,
        )
        .await
    }

    /// Best-effort compare-and-delete of `token` on `nodes` (all when `None`); failures are tolerated because
    /// the keys expire by themselves. Returns the indices of the nodes that answered, where our token is now
    /// certainly gone. `origin` (the acquisition and why) is reported to the event hook.
    pub(crate) async fn cleanup(
        &self,
        key: &str,
        token: &Token,
        timeout: Duration,
        only: Option<&[usize]>,
        origin: (LeaseId, CleanupCause),
    ) -> Vec<usize> {
        if only.is_some_and(|o| o.is_empty()) {
            return Vec::new();
        }
        let r = self.release_round(key, token, timeout, only).await;
        if self.hook.active() {
            self.hook.emit(
                key,
                origin.0,
                r.ended,
                EventKind::Cleanup {
                    cause: origin.1,
                    nodes: Nodes::new(&r.tally),
                    round: r.ended.saturating_duration_since(r.started),
                },
            );
        }
        r.values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.is_some().then_some(i))
            .filter(|i| only.is_none_or(|o| o.contains(i)))
            .collect()
    }

    /// Runs a compare-and-delete of `token` on every node in the background, if the user supplied a spawner.
    /// Used when an acquisition or a lease is dropped before it could clean up after itself.
    pub(crate) fn spawn_cleanup(
        self: &Arc<Self>,
        key: &str,
        token: &Token,
        timeout: Duration,
        origin: (LeaseId, CleanupCause),
    ) {
        let Some(spawner) = self.spawner.clone() else {
            return;
        };
        let engine = Arc::clone(self);
        let key = key.to_owned();
        let token = token.clone();
        spawner.spawn(Box::pin(async move {
            let _ = engine.cleanup(&key, &token, timeout, None, origin).await;
        }));
    }
}
