//! The async driver: runs rounds of node calls concurrently, bounded by a deadline, without any runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::config::Config;
use crate::machine::slots::Slots;
use crate::machine::{Jitter, Reply, Tally, WaitFor};
use crate::node::{
    Claim, ClaimRequest, NodeError, NodeErrorKind, NodeProfile, RedisNode, RunId, RunIdSlot, Ttl,
};
use crate::observe::{CleanupCause, EventKind, LeaseId, Nodes};
use crate::time::SharedTimer;
use crate::token::Token;
use fanout::{Fanout, Pace, Parties};

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

pub(crate) mod acquire;
pub(crate) mod batch;
mod fanout;
pub(crate) mod lease;

pub(crate) use crate::machine::acquisition::Fresh;
use crate::machine::nodeset::NodeSet;
use crate::mode::Mode;
pub use acquire::{Lock, MAX_HOLDER_INFO_BYTES};

pub(crate) use crate::machine::holding::Planned;

/// Everything a manager, its locks and its leases share.
pub(crate) struct Engine {
    pub(crate) nodes: Vec<Arc<dyn RedisNode>>,
    /// Each node's [`RedisNode::profile`], read when the nodes were given (see [`profiles`]).
    pub(crate) profiles: Vec<NodeProfile>,
    /// How many nodes decide a round: a majority, or more for a Redlock semaphore (see `crate::semaphore`).
    pub(crate) quorum: usize,
    /// An attempt that finds the lock held still writes (a writer's claim, a place in a fair lock's queue):
    /// an acquisition that gives up deletes its token, so that it leaves at once.
    pub(crate) contention_writes: bool,
    /// The lock operations act on permits (a semaphore, a read/write or a fair lock): no fencing tokens.
    pub(crate) permits: bool,
    /// Of permit operations: the acquisition can issue fencing tokens (a read/write lock's writer).
    pub(crate) fenced_permits: bool,
    /// A release notification wakes every waiter of the key, not one (read/write and fair locks: the waiter
    /// that may go next is decided on the server).
    pub(crate) wake_all: bool,
    /// A durability policy's replica wait applies to its writes: one logical authority (a single-mode
    /// manager). Redlock's nodes are independent primaries, with no replicas to wait for.
    pub(crate) replica_waits: bool,
    /// A node whose server restarted within its quarantine is not counted (Redlock: a restart without
    /// persistence could otherwise hand the lock to a second holder); elsewhere a restart is only reported.
    pub(crate) quarantines_restarts: bool,
    /// The manager's algorithm, for the API layers and spans (the driver reads the two fields above).
    pub(crate) mode: Mode,
    pub(crate) config: Config,
    pub(crate) timer: SharedTimer,
    pub(crate) spawner: Option<Arc<dyn Spawn>>,
    pub(crate) jitter: Mutex<Jitter>,
    pub(crate) hook: crate::observe::Hook,
    /// Renewals waiting for the next batch (see `batch`).
    pub(crate) batcher: crate::batch_queue::Batcher,
    /// What this manager learned about its nodes (shared by the managers `with_*` derives from it, except
    /// `with_timer`: its quarantine deadlines are instants of this timer).
    pub(crate) watch: Arc<Mutex<Watch>>,
}

/// What a manager remembers about its nodes across operations: each node's last [`RunId`] and when a change
/// was seen (restart detection and quarantine), and the largest fence each counter issued (fence regression
/// detection). Bounded by the number of nodes and of distinct fence keys used.
#[derive(Default)]
pub(crate) struct Watch {
    run_ids: Vec<Option<Seen>>,
    fences: std::collections::HashMap<String, u64>,
}

struct Seen {
    run_id: RunId,
    /// Not counted toward a quorum until then (set when a change was seen).
    quarantined_until: Option<Instant>,
}

impl Watch {
    /// Records that node `i` reported `run_id` at `now`. Returns `(newly changed, remaining quarantine)`.
    fn saw(
        &mut self,
        i: usize,
        run_id: RunId,
        now: Instant,
        quarantine: Duration,
    ) -> (bool, Option<Duration>) {
        if self.run_ids.len() <= i {
            self.run_ids.resize_with(i + 1, || None);
        }
        let slot = &mut self.run_ids[i];
        let changed = match slot {
            None => {
                // First sight here; a restart the node itself saw counts from when it saw it.
                let quarantined_until = run_id
                    .restarted_ago()
                    .and_then(|ago| quarantine.checked_sub(ago))
                    .filter(|left| !left.is_zero())
                    .map(|left| crate::time::add(now, left));
                *slot = Some(Seen {
                    run_id,
                    quarantined_until,
                });
                quarantined_until.is_some()
            }
            Some(seen) if seen.run_id == run_id => false,
            Some(seen) => {
                seen.run_id = run_id;
                seen.quarantined_until = Some(crate::time::add(now, quarantine));
                true
            }
        };
        let remaining = slot
            .as_ref()
            .and_then(|s| s.quarantined_until)
            .filter(|until| *until > now)
            .map(|until| until.saturating_duration_since(now));
        (changed, remaining)
    }

    /// The largest fence this process received from `fence_key`.
    pub(crate) fn fence(&self, fence_key: &str) -> Option<u64> {
        self.fences.get(fence_key).copied()
    }

    /// Records a fence handed out with a lease.
    pub(crate) fn issued(&mut self, fence_key: &str, fence: u64) {
        match self.fences.get_mut(fence_key) {
            Some(max) => *max = (*max).max(fence),
            None => {
                self.fences.insert(fence_key.to_owned(), fence);
            }
        }
    }
}

/// What the nodes of one round reported besides their votes, turned into events after the round.
///
/// Boxed on the first note only: nearly every round has none, and an acquisition or extension future
/// carries this across its round (16 bytes instead of the 112 of the notes themselves).
#[derive(Default)]
pub(crate) struct Notes {
    inner: Mutex<Option<Box<NotesInner>>>,
}

#[derive(Default)]
struct NotesInner {
    restarted: Vec<(usize, Duration)>,
    not_replicated: Option<(Option<u32>, Option<NodeError>)>,
    regressed: Option<(u64, u64)>,
}

impl Notes {
    fn with<R>(&self, f: impl FnOnce(&mut NotesInner) -> R) -> R {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(g.get_or_insert_with(Box::default))
    }

    /// Emits the events the round's nodes gave reason for.
    pub(crate) fn emit(self, engine: &Engine, key: &str, id: LeaseId, at: Instant) {
        let Some(inner) = self.inner.into_inner().unwrap_or_else(|p| p.into_inner()) else {
            return;
        };
        for (node, quarantined_for) in inner.restarted {
            engine.hook.emit(
                key,
                id,
                at,
                EventKind::NodeRestarted {
                    node,
                    quarantined_for,
                },
            );
        }
        if let Some((fence, previous)) = inner.regressed {
            engine
                .hook
                .emit(key, id, at, EventKind::FenceRegressed { fence, previous });
        }
        if let (Some((acknowledged, error)), Some(wait)) =
            (inner.not_replicated, engine.config.durability().wait())
        {
            engine.hook.emit(
                key,
                id,
                at,
                EventKind::NotReplicated {
                    acknowledged,
                    wanted: wait.replicas,
                    error: error.as_ref(),
                },
            );
        }
    }
}

/// The replies of one round, with their values where a node answered.
pub(crate) struct RoundResult<T> {
    pub(crate) tally: Tally,
    pub(crate) values: Slots<Option<T>>,
    pub(crate) started: Instant,
    pub(crate) ended: Instant,
    /// Wall-clock readings at the start and end (see [`Timer::wall_now`](crate::Timer::wall_now)).
    pub(crate) wall: (Option<SystemTime>, Option<SystemTime>),
}

impl<T> RoundResult<T> {
    /// Whether the machine was suspended during the round by more than an allowance, as a closure over the
    /// round's times.
    pub(crate) fn suspended_by(&self) -> impl Fn(Duration) -> bool + use<T> {
        let times = self.times();
        move |allowance| times.suspended(allowance)
    }

    /// When the round ran.
    pub(crate) fn times(&self) -> RoundTimes {
        RoundTimes {
            started: self.started,
            ended: self.ended,
            wall: self.wall,
        }
    }
}

/// When a round ran: its start and end on the monotonic clock, and the wall clock's readings then (see
/// [`Timer::wall_now`](crate::Timer::wall_now)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RoundTimes {
    pub(crate) started: Instant,
    pub(crate) ended: Instant,
    pub(crate) wall: (Option<SystemTime>, Option<SystemTime>),
}

impl RoundTimes {
    /// Whether the machine was suspended during the round by more than `allowance` (see
    /// [`crate::time::suspended`]).
    pub(crate) fn suspended(&self, allowance: Duration) -> bool {
        crate::time::suspended((self.started, self.ended), self.wall, allowance)
    }
}

/// What one acquisition asks every node for: `key` with `token` for `ttl`, and with a fencing token from
/// `fence_key` when the lock is fenced.
#[derive(Clone, Copy)]
pub(crate) struct AcquireRequest<'a> {
    pub(crate) key: &'a str,
    pub(crate) fence_key: Option<&'a str>,
    pub(crate) token: &'a Token,
    pub(crate) ttl: Ttl,
}

/// The shortest remaining TTL that contended nodes reported in one acquisition round (see
/// [`Engine::acquire_round`]).
#[derive(Debug)]
pub(crate) struct TtlHint {
    /// The shortest reported TTL in nanoseconds (`u64::MAX`: none yet).
    min_nanos: std::sync::atomic::AtomicU64,
}

impl TtlHint {
    pub(crate) fn new() -> Self {
        Self {
            min_nanos: std::sync::atomic::AtomicU64::new(u64::MAX),
        }
    }

    fn note(&self, remaining: Option<Duration>) {
        use std::sync::atomic::Ordering::Relaxed;
        if let Some(d) = remaining {
            let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1);
            self.min_nanos.fetch_min(nanos, Relaxed);
        }
    }

    /// The time after which the lock may be free without a notification: the shortest TTL a contended node
    /// reported, `None` when none reported one.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        use std::sync::atomic::Ordering::Relaxed;
        // A node that reported no TTL may hold the lock until it is released: the others' TTLs still bound
        // the wait (once they expire a majority may be free).
        match self.min_nanos.load(Relaxed) {
            u64::MAX => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    pub(crate) fn reset(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.min_nanos.store(u64::MAX, Relaxed);
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

/// The profiles of `nodes`, in order: read once, when a manager is given its nodes.
pub(crate) fn profiles(nodes: &[Arc<dyn RedisNode>]) -> Vec<NodeProfile> {
    nodes.iter().map(|n| n.profile()).collect()
}

impl Engine {
    pub(crate) fn quorum(&self) -> usize {
        self.quorum
    }

    /// A [`Watch`](crate::notify::Watch) for `key` on every node that offers notifications (one per
    /// notifier, if nodes share one).
    pub(crate) fn watches(&self, key: &str) -> Vec<crate::notify::Watch> {
        let mut seen: Vec<&crate::notify::Notifier> = Vec::new();
        let mut watches = Vec::new();
        for node in &self.nodes {
            if let Some(notifier) = node.notifier() {
                if seen.iter().any(|n| n.same(notifier)) {
                    continue;
                }
                seen.push(notifier);
                watches.push(notifier.watch(key));
            }
        }
        watches
    }

    pub(crate) fn next_seed(&self) -> u64 {
        match self.jitter.lock() {
            Ok(mut j) => j.next_u64(),
            Err(poisoned) => poisoned.into_inner().next_u64(),
        }
    }

    /// Calls `op` on every node concurrently and collects replies until the tally is done or `timeout` passes:
    /// the one round loop ([`fanout`]) with a single party. `yes` decides whether a successful value counts as
    /// a yes vote.
    ///
    /// With `grace`, a round won by a quorum still lets the remaining nodes answer for twice the time the
    /// quorum took, and at least [`grace_floor`]. Rounds of single commands need none: a command already
    /// handed to the connection is sent and applied even when its reply is abandoned; a script may need a
    /// second request (`EVAL` after `NOSCRIPT`) that only happens while its future is polled.
    ///
    /// Not an `async fn`: an `async fn` keeps its arguments twice in its future (as captured and as moved
    /// into its body), and every acquisition, extension and release future nests one round.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future; an async block, once"
    )]
    pub(crate) fn round<'a, T, Op, Yes>(
        &'a self,
        wait: WaitFor,
        grace: bool,
        timeout: Duration,
        op: Op,
        yes: Yes,
    ) -> impl Future<Output = RoundResult<T>> + 'a
    where
        T: Send + 'a,
        Op: Fn(usize, &'a dyn RedisNode) -> BoxFuture<'a, Result<T, NodeError>> + 'a,
        Yes: Fn(&T) -> bool + 'a,
    {
        async move {
            let started = self.timer.now();
            let wall_started = self.timer.wall_now();
            let n = self.nodes.len();
            let mut tally = [Tally::new(n, self.quorum(), wait)];
            let mut open = [true];
            // Inline for a single node: a round then allocates nothing but the node's own future.
            let mut values: Slots<Option<T>> = Slots::from_fn(n, |_| None);
            let mut fanout = Fanout::new(n, |i| op(i, self.nodes[i].as_ref()));
            let deadline = crate::time::add(started, timeout);
            std::future::poll_fn(|cx| {
                fanout.poll(
                    cx,
                    &self.timer,
                    Pace { started, grace },
                    &mut Parties {
                        tallies: &mut tally,
                        deadline: |_| deadline,
                        open: &mut open,
                    },
                    |i, result, tallies| {
                        let reply = match result {
                            Ok(value) => {
                                let reply = if yes(&value) { Reply::Yes } else { Reply::No };
                                values[i] = Some(value);
                                reply
                            }
                            Err(e) => Reply::Failed(e),
                        };
                        tallies[0].handle_reply(i, reply);
                    },
                    |_, _| {},
                )
            })
            .await;
            // Abandon calls still in flight (a decided round waits for stragglers only briefly).
            drop(fanout);
            let [tally] = tally;
            RoundResult {
                tally,
                values,
                started,
                ended: self.timer.now(),
                wall: (wall_started, self.timer.wall_now()),
            }
        }
    }

    /// The time a round may take beyond the operation timeout: the durability wait, where it applies.
    pub(crate) fn wait_allowance(&self) -> Duration {
        match self.config.durability().wait() {
            Some(wait) if self.replica_waits => wait.timeout,
            _ => Duration::ZERO,
        }
    }

    /// One acquisition round. `Some(fence)` values only come from fenced single-node acquisition. `fresh`
    /// says on which nodes the token has never been stored and never will be by an earlier request (see
    /// [`Fresh`]), so a plain `SET NX` suffices there. With `hint`
    /// (an unfenced acquisition that may wait for a notification), nodes are asked for the holder's remaining
    /// TTL on contention ([`ClaimRequest::wants_ttl`]), collected there. `timeout`
    /// includes the [`wait_allowance`](Self::wait_allowance). Events the nodes gave reason for (a restart, a fence regression, a write not replicated) are emitted for `id`.
    ///
    /// Not an `async fn`, like [`round`](Self::round): its arguments are kept once in its future.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future; an async block, once"
    )]
    pub(crate) fn acquire_round<'a>(
        &'a self,
        req: AcquireRequest<'a>,
        timeout: Duration,
        fresh: Fresh,
        hint: Option<&'a TtlHint>,
        id: LeaseId,
    ) -> impl Future<Output = RoundResult<Option<u64>>> + 'a {
        async move {
            let notes = Notes::default();
            let notes_ref = &notes;
            let r = match req.fence_key {
                Some(fence_key) => {
                    self.round(
                        WaitFor::Decision,
                        true,
                        timeout,
                        |i, node| {
                            Box::pin(async move {
                                let taken = node
                                    .acquire_fenced(req.key, fence_key, req.token, req.ttl)
                                    .await;
                                self.after_acquire(i, node, req, taken, None, notes_ref)
                                    .await
                            })
                        },
                        Option::is_some,
                    )
                    .await
                }
                None => {
                    // A fresh acquisition is one plain `SET NX` per node: no grace needed (see `round`).
                    self.round(
                        WaitFor::Decision,
                        !fresh.all_of(self.nodes.len()),
                        timeout,
                        |i, node| {
                            let fresh = fresh.get(i);
                            Box::pin(async move {
                                // Where the reply is followed by a restart check, the node may answer the
                                // run id with it (one exchange instead of two). The slot lives in this boxed
                                // per-node future, not in the acquisition's.
                                let mut slot = self.restart_check().map(|_| RunIdSlot::new());
                                // An acquisition that may wait asks for the holder's TTL too, on contention.
                                let mut claim = ClaimRequest::new(req.key, req.token, req.ttl)
                                    .fresh(fresh)
                                    .wants_ttl(hint.is_some());
                                if let Some(slot) = &slot {
                                    claim = claim.report_run_id(slot);
                                }
                                let taken = node.claim(claim).await.map(|claim| match claim {
                                    Claim::Held { remaining } => {
                                        if let Some(hint) = hint {
                                            hint.note(remaining);
                                        }
                                        None
                                    }
                                    Claim::Taken => Some(0),
                                });
                                let reported = slot.as_mut().and_then(RunIdSlot::take);
                                self.after_acquire(i, node, req, taken, reported, notes_ref)
                                    .await
                            })
                        },
                        Option::is_some,
                    )
                    .await
                }
            };
            if self.hook.active() {
                notes.emit(self, req.key, id, r.ended);
            }
            r
        }
    }

    /// The restart quarantine [`after_acquire`](Self::after_acquire) checks an acquisition reply against
    /// (before it is stretched to the lock's TTL), if it checks at all: where a restart quarantines the node
    /// (Redlock), or is only reported and something listens for the event (single mode). `None`: the node's
    /// run id is not asked.
    fn restart_check(&self) -> Option<Duration> {
        self.config
            .restart_quarantine()
            .filter(|_| self.quarantines_restarts || self.hook.active())
    }

    /// What follows a node's acquisition reply, on the same node and before the round counts it:
    ///
    /// 1. restart detection: the node's [`RunId`] (`reported` with the reply, through the claim's
    ///    [`RunIdSlot`], else asked with [`RedisNode::run_id`]) is compared with the last one seen; in
    ///    Redlock mode a yes
    ///    from a node in its restart quarantine becomes an ambiguous [`NodeErrorKind::Restarted`] error (the
    ///    key was written: the failed attempt's clean-up deletes it);
    /// 2. fence regression: a fence no larger than one this process received from the counter releases the
    ///    key again and becomes a [`NodeErrorKind::FenceRegressed`] error;
    /// 3. durability (single mode): the replicas' acknowledgement; under the required policy a shortfall
    ///    becomes an ambiguous [`NodeErrorKind::NotReplicated`] error (the clean-up releases the key).
    pub(crate) async fn after_acquire(
        &self,
        i: usize,
        node: &dyn RedisNode,
        req: AcquireRequest<'_>,
        taken: Result<Option<u64>, NodeError>,
        reported: Option<RunId>,
        notes: &Notes,
    ) -> Result<Option<u64>, NodeError> {
        let AcquireRequest {
            key,
            fence_key,
            token,
            ttl,
        } = req;
        let value = taken?;
        let redlock = self.quarantines_restarts;
        // Where restarts are only reported (an event): nobody listens, nothing to ask.
        if let Some(quarantine) = self.restart_check() {
            let quarantine = quarantine.max(ttl.as_duration());
            let run_id = match reported {
                Some(run_id) => Ok(run_id),
                None => node.run_id(key).await,
            };
            match run_id {
                Ok(run_id) => {
                    let now = self.timer.now();
                    let window = if redlock { quarantine } else { Duration::ZERO };
                    let (changed, remaining) = match self.watch.lock() {
                        Ok(mut w) => w.saw(i, run_id, now, window),
                        Err(p) => p.into_inner().saw(i, run_id, now, window),
                    };
                    if changed {
                        notes.with(|n| n.restarted.push((i, window)));
                    }
                    if let (Some(remaining), Some(_), true) = (remaining, value, redlock) {
                        return Err(NodeError::ambiguous(
                            NodeErrorKind::Restarted,
                            format!(
                                "the server restarted (its run_id changed) and may have forgotten locks; its \
                                 answers are not counted toward a quorum for another {remaining:?} (restart \
                                 quarantine)"
                            ),
                        ));
                    }
                }
                Err(e) if e.kind() == NodeErrorKind::Unsupported => {}
                Err(e) if redlock && value.is_some() => {
                    return Err(NodeError::ambiguous(
                        e.kind(),
                        format!(
                            "acquired, but not counted: the server's run_id could not be read to rule out a \
                             restart ({})",
                            e.message()
                        ),
                    )
                    .with_source(e));
                }
                Err(_) => {}
            }
        }
        let Some(v) = value else {
            return Ok(None);
        };
        if let Some(fence_key) = fence_key {
            let previous = match self.watch.lock() {
                Ok(w) => w.fence(fence_key),
                Err(p) => p.into_inner().fence(fence_key),
            };
            if let Some(previous) = previous.filter(|p| v <= *p) {
                notes.with(|n| n.regressed = Some((v, previous)));
                let message = format!(
                    "the fence counter {fence_key} issued {v}, but this process already received {previous} \
                     from it: the server lost writes (a restart without persistence, or a failover to a replica \
                     that had not received them); raise it above the resource's largest fence \
                     (LockManager::raise_fence)"
                );
                // Not handed out: take the lock back now, so the refusal leaves nothing behind.
                return Err(match node.release(key, token).await {
                    Ok(_) => NodeError::not_applied(NodeErrorKind::FenceRegressed, message),
                    Err(e) => {
                        NodeError::ambiguous(NodeErrorKind::FenceRegressed, message).with_source(e)
                    }
                });
            }
        }
        self.await_replicas(node, key, notes).await?;
        Ok(Some(v))
    }

    /// The durability wait after a successful write on `node` (where replica waits apply and a policy is set).
    async fn await_replicas(
        &self,
        node: &dyn RedisNode,
        key: &str,
        notes: &Notes,
    ) -> Result<(), NodeError> {
        let durability = self.config.durability();
        let Some(wait) = durability.wait().filter(|_| self.replica_waits) else {
            return Ok(());
        };
        let (acknowledged, error) = match node.wait_replicas(key, wait).await {
            Ok(n) if n >= wait.replicas => return Ok(()),
            Ok(n) => (Some(n), None),
            Err(e) => (None, Some(e)),
        };
        if !durability.is_required() {
            notes.with(|n| n.not_replicated = Some((acknowledged, error)));
            return Ok(());
        }
        let what = if wait.aof {
            "written to the AOF of"
        } else {
            "acknowledged by"
        };
        let message = match (&acknowledged, &error) {
            (Some(n), _) => format!(
                "the write was {what} {n} of {} required replica(s) within {:?}",
                wait.replicas, wait.timeout
            ),
            (None, Some(e)) => format!("waiting for replicas failed: {e}"),
            (None, None) => "waiting for replicas failed".to_owned(),
        };
        notes.with(|n| n.not_replicated = Some((acknowledged, error.clone())));
        let err = NodeError::ambiguous(NodeErrorKind::NotReplicated, message);
        Err(match error {
            Some(e) => err.with_source(e),
            None => err,
        })
    }

    /// One extension round, as `planned`. `planned.unconfirmed[i]`, where given and non-zero, is the smallest
    /// TTL (ms) of an earlier request whose outcome is unknown on node `i`: if it is shorter than `ttl`, node
    /// `i`'s success is reported as an ambiguous error instead, because that earlier request may still land
    /// and shorten the key. A node in `planned.missing` never confirmed the lease's key: it is asked with
    /// [`RedisNode::acquire`] (which writes the key only where it is free or already ours) instead of
    /// extended (see `Shared::repair`).
    ///
    /// With a [`Durability`](crate::Durability) policy (single mode), a successful extension waits for the
    /// replicas; under the required policy a shortfall makes it an ambiguous
    /// [`NodeErrorKind::NotReplicated`] error (a failed extension).
    ///
    /// Not an `async fn`, like [`round`](Self::round).
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future; an async block, once"
    )]
    pub(crate) fn extend_round<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        ttl: Ttl,
        timeout: Duration,
        planned: &'a Planned,
        id: LeaseId,
    ) -> impl Future<Output = RoundResult<bool>> + 'a {
        async move {
            let notes = Notes::default();
            let notes_ref = &notes;
            let durable = self.wait_allowance() > Duration::ZERO;
            let timeout = timeout.saturating_add(self.wait_allowance());
            let r = self
            .round(
                WaitFor::Decision,
                true,
                timeout,
                |i, node| {
                    let shorter_pending =
                        !crate::machine::unconfirmed::counts(planned.unconfirmed.as_deref(), i, ttl);
                    let missing = planned.missing.contains(i);
                    let call = move || {
                        if missing {
                            node.acquire(key, token, ttl)
                        } else {
                            node.extend(key, token, ttl)
                        }
                    };
                    if !shorter_pending && !durable {
                        return call();
                    }
                    Box::pin(async move {
                        match call().await {
                            Ok(true) if shorter_pending => Err(NodeError::ambiguous(
                                NodeErrorKind::Other,
                                "extended, but not counted: an earlier, shorter extension of this lease may \
                                 still be applied on this node after it",
                            )),
                            Ok(true) => self.await_replicas(node, key, notes_ref).await.map(|()| true),
                            other => other,
                        }
                    })
                },
                |ok| *ok,
            )
            .await;
            if self.hook.active() {
                notes.emit(self, key, id, r.ended);
            }
            r
        }
    }

    /// A [`Shared::repair`](crate::lease::Shared) round: [`RedisNode::acquire`] of the lease's own token on
    /// the nodes in `missing`, waiting for each; the others are answered locally with a no (nothing sent).
    pub(crate) fn repair_round<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        ttl: Ttl,
        timeout: Duration,
        missing: NodeSet,
    ) -> impl Future<Output = RoundResult<bool>> + 'a {
        self.round(
            WaitFor::All,
            false,
            timeout,
            move |i, node| {
                if missing.contains(i) {
                    node.acquire(key, token, ttl)
                } else {
                    Box::pin(std::future::ready(Ok(false)))
                }
            },
            |ok| *ok,
        )
    }

    /// One compare-and-delete round on the nodes in `only` (all nodes when `None`), waiting for every reply.
    /// The round's own future, not one around it.
    pub(crate) fn release_round<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        timeout: Duration,
        only: Option<&'a [usize]>,
    ) -> impl Future<Output = RoundResult<bool>> + 'a {
        self.round(
            WaitFor::All,
            false,
            timeout,
            move |i, node| {
                if only.is_none_or(|only| only.contains(&i)) {
                    node.release(key, token)
                } else {
                    // Not a target: answered locally so the tally still covers every index.
                    Box::pin(std::future::ready(Ok(false)))
                }
            },
            |ok| *ok,
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_the_node_saw_counts_on_first_sight_from_when_it_was_seen() {
        let now = Instant::now();
        let q = Duration::from_secs(10);
        let mut watch = Watch::default();
        // Plain first sight: recorded, not a restart.
        assert_eq!(watch.saw(0, RunId::new("a"), now, q), (false, None));
        // First sight of a run id the node saw replace another 4 s ago: quarantined for the rest.
        let seen = RunId::new("b").with_restarted_ago(Duration::from_secs(4));
        assert_eq!(
            watch.saw(1, seen.clone(), now, q),
            (true, Some(Duration::from_secs(6)))
        );
        // The same run id again: no new change, the quarantine runs on.
        assert_eq!(
            watch.saw(1, seen, now, q),
            (false, Some(Duration::from_secs(6)))
        );
        // Seen longer ago than the quarantine: nothing left.
        let old = RunId::new("c").with_restarted_ago(Duration::from_secs(11));
        assert_eq!(watch.saw(2, old, now, q), (false, None));
        // A changed run id still quarantines for the whole window.
        assert_eq!(watch.saw(0, RunId::new("a2"), now, q), (true, Some(q)));
    }
}
