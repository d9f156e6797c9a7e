//! Fault injection around any [`RedisNode`].
//!
//! Besides the faults a caller sees at once (errors, hangs, lost replies, latency), a [`FaultyNode`] built with
//! a spawner ([`FaultyNode::with_spawner`]) models what real networks do long after the caller stopped
//! caring: a request that sits in the network and is applied *later* ([`Fault::Late`],
//! [`Fault::LateAfterError`]), after the caller timed out or dropped the call, and — on a
//! [`Delivery::Pool`] — after requests sent later to the same node.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use redlease::machine::Jitter;
use redlease::notify::Notifier;
use redlease::{
    Claim, ClaimRequest, ExtendItem, KeyState, MultiKeyItem, MultiKeyOp, MultiKeyReply, NodeError,
    NodeErrorKind, NodeProfile, PermitOp, PermitReply, Readiness, RedisNode, ReplicaWait, RunId,
    Spawn, Timer, Token, Ttl, async_trait,
};

/// The node operations, for scripting faults and counting calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Op {
    /// [`RedisNode::acquire`].
    Acquire,
    /// [`RedisNode::acquire_fenced`].
    AcquireFenced,
    /// [`RedisNode::release`].
    Release,
    /// [`RedisNode::extend`].
    Extend,
    /// [`RedisNode::inspect`].
    Inspect,
    /// [`RedisNode::run_id`], which the core asks after each acquisition reply when the restart quarantine
    /// is on. Only scripted and [`always`](Faults::always) faults touch it: a real node answers it from
    /// memory, so neither a [partition](Faults::partition) nor [random faults](Faults::random) do.
    RunId,
    /// [`RedisNode::wait_replicas`], which the core calls after a won acquisition and after each extension
    /// under a [`Durability`](redlease::Durability) policy. Scripted and [`always`](Faults::always) faults
    /// and a [partition](Faults::partition) touch it; [random faults](Faults::random) do not (seeded runs
    /// stay as they were).
    WaitReplicas,
}

/// How many operations [`Op`] has (the per-operation tables).
const OPS: usize = 7;

impl Op {
    /// The operation's slot in per-operation tables.
    fn index(self) -> usize {
        match self {
            Op::Acquire => 0,
            Op::AcquireFenced => 1,
            Op::Release => 2,
            Op::Extend => 3,
            Op::Inspect => 4,
            Op::RunId => 5,
            Op::WaitReplicas => 6,
        }
    }

    /// The optional capabilities (see [`RunId`](Self::RunId) and [`WaitReplicas`](Self::WaitReplicas)), which
    /// [`Faults::always_all`], [`Faults::total_calls`] and [`Faults::total_applied`] leave out.
    pub const CAPABILITIES: [Op; 2] = [Op::RunId, Op::WaitReplicas];

    /// Every lease operation (not the [capabilities](Self::CAPABILITIES)).
    pub const ALL: [Op; 5] = [
        Op::Acquire,
        Op::AcquireFenced,
        Op::Release,
        Op::Extend,
        Op::Inspect,
    ];
}

/// What happens to one call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Wait, then send and perform the call normally. The wait happens before the request is sent: dropping
    /// the call while it waits means the request is never sent.
    Delay(Duration),
    /// Refuse immediately without applying (e.g. connection refused, `OOM`).
    Fail(NodeErrorKind),
    /// Never answer and never apply (a blackholed request).
    Hang,
    /// Apply the call, then never answer (the reply is blackholed).
    ApplyThenHang,
    /// Apply the call, then report an ambiguous error (the reply was lost).
    ReplyLost,
    /// Apply the call at once, but deliver the reply only after this long.
    SlowReply(Duration),
    /// The request sits in the network for this long, then is applied **whether or not the caller still
    /// waits** (it may have timed out or dropped the call); a waiting caller gets the reply right after.
    ///
    /// On a [`Delivery::Fifo`] node every request sent after it waits behind it; on a [`Delivery::Pool`] node
    /// later requests overtake it. Needs a node built with [`FaultyNode::with_spawner`] (without one the call
    /// fails with a not-applied error that says so).
    Late(Duration),
    /// The caller at once gets an ambiguous I/O error (a connection reset after the request was written),
    /// but the request is still applied after this long, as with [`Late`](Self::Late).
    LateAfterError(Duration),
    /// The request is applied twice: once as usual (the caller gets that reply), and an identical copy
    /// this long after it was sent, whatever happened meanwhile — a retry that a client library or a proxy
    /// sent on another connection while the first copy was still on its way, so that the caller's answer
    /// comes from one copy and the other lands later. The copy travels on its own (as on a
    /// [`Delivery::Pool`], whatever the node's delivery): it may land after requests sent later, after the
    /// lease was extended again or released. Its reply goes nowhere. Needs a node built with
    /// [`FaultyNode::with_spawner`] (without one the call fails with a not-applied error that says so).
    Duplicated(Duration),
    /// [`Op::RunId`] only: answer this run id instead of the inner node's (a server restarted, or a failover
    /// to another process, as the client sees it). The inner node is not asked.
    RunId(RunId),
    /// [`Op::WaitReplicas`] only: answer that this many replicas acknowledged (capped at the number asked),
    /// without asking the inner node; with fewer than asked, after the wait's timeout has passed on the
    /// node's timer, as a server's `WAIT` does.
    Acknowledged(u32),
}

impl Fault {
    /// Whether this fault is an answer of its own ([`RunId`](Self::RunId), [`Acknowledged`](Self::Acknowledged)).
    fn is_answer(&self) -> bool {
        matches!(self, Fault::RunId(_) | Fault::Acknowledged(_))
    }
}

/// How the requests to one node are ordered when some of them are applied [late](Fault::Late).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Delivery {
    /// One FIFO connection: requests are applied in the order they were sent. A late request holds back
    /// every request sent after it (head-of-line blocking); nothing is reordered.
    #[default]
    Fifo,
    /// A connection pool: each request travels on its own, so a late request is applied after requests sent
    /// later — reordering within a window bounded by the late delay.
    Pool,
    /// One FIFO connection that reconnects after a reset ([`Fault::LateAfterError`]): the requests written
    /// on the old connection (the reset one included) are still applied in their order, but requests sent
    /// after the reset go over the new connection and may be applied before them.
    Reconnecting,
}

/// Random faults drawn per call from a seed.
///
/// Build with [`new`](Self::new) and the builder methods, or take everything at once with
/// [`hostile`](Self::hostile).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RandomFaults {
    /// Seed of the fault generator.
    pub seed: u64,
    /// Probability that a call fails without being applied.
    pub fail: f64,
    /// Probability that a call hangs (not applied).
    pub hang: f64,
    /// Probability that a call is applied but its reply lost.
    pub reply_lost: f64,
    /// Probability that a call is applied but its reply arrives after `max_latency` more.
    pub slow_reply: f64,
    /// Every call is delayed by a uniform latency in `[0, max_latency]` before it is sent.
    pub max_latency: Duration,
    /// Probability of a [`Fault::Late`] with a uniform delay in `[0, max_late]`.
    pub late: f64,
    /// Probability of a [`Fault::LateAfterError`] with a uniform delay in `[0, max_late]`.
    pub late_after_error: f64,
    /// The longest time a late request sits in the network (the reordering window of a pool).
    pub max_late: Duration,
    /// How the node orders requests when some are late.
    pub delivery: Delivery,
    /// Probability that a release notification is lost (see [`Faults::drop_notifications`]).
    pub notification_lost: f64,
    /// Probability of a [`Fault::Duplicated`] request, whose copy lands up to `max_late` later (uniform).
    pub duplicate: f64,
    /// Operations never duplicated (their draw of a duplicate goes through undisturbed).
    pub duplicate_except: Vec<Op>,
}

impl RandomFaults {
    /// Faults from `seed` with the given probabilities of failure, hang and lost reply, and latency up to
    /// `max_latency`; no slow replies and no late requests until the builder methods add them.
    pub fn new(seed: u64, fail: f64, hang: f64, reply_lost: f64, max_latency: Duration) -> Self {
        Self {
            seed,
            fail,
            hang,
            reply_lost,
            slow_reply: 0.0,
            max_latency,
            late: 0.0,
            late_after_error: 0.0,
            max_late: Duration::ZERO,
            delivery: Delivery::Fifo,
            notification_lost: 0.0,
            duplicate: 0.0,
            duplicate_except: Vec::new(),
        }
    }

    /// Every fault mode at once, for seeded random runs: failures 3 %, hangs 2 %, lost replies 3 %, slow
    /// replies 2 %, late requests 5 % and late requests after an error 3 % (applied up to 1.5 s later),
    /// latency up to 30 ms, lost release notifications 10 %, and by `seed % 3`: [`Delivery::Pool`] (0),
    /// [`Delivery::Fifo`] (1) or [`Delivery::Reconnecting`] (2).
    ///
    /// Late requests need a node built with [`FaultyNode::with_spawner`]. The other hostile conditions of
    /// the simulator are set elsewhere: node clocks with [`SkewedClock::random`](crate::SkewedClock::random),
    /// client pauses with [`Sim::random_pauses`](crate::Sim::random_pauses).
    ///
    /// ```
    /// use redlease_testkit::{Delivery, RandomFaults};
    /// let faults = RandomFaults::hostile(3);
    /// assert_eq!(faults.delivery, Delivery::Pool);
    /// assert!(faults.late > 0.0 && faults.max_late > faults.max_latency);
    /// ```
    pub fn hostile(seed: u64) -> Self {
        Self::new(seed, 0.03, 0.02, 0.03, Duration::from_millis(30))
            .slow_reply(0.02)
            .late(0.05, Duration::from_millis(1500))
            .late_after_error(0.03)
            .notification_lost(0.1)
            .delivery(match seed % 3 {
                0 => Delivery::Pool,
                1 => Delivery::Fifo,
                _ => Delivery::Reconnecting,
            })
    }

    /// Sets the probability of a slow reply.
    #[must_use]
    pub fn slow_reply(mut self, p: f64) -> Self {
        self.slow_reply = p;
        self
    }

    /// Sets the probability of a [`Fault::Late`] request and the longest late delay.
    #[must_use]
    pub fn late(mut self, p: f64, max_late: Duration) -> Self {
        self.late = p;
        self.max_late = max_late;
        self
    }

    /// Sets the probability of a [`Fault::LateAfterError`] request (its delay is up to `max_late`).
    #[must_use]
    pub fn late_after_error(mut self, p: f64) -> Self {
        self.late_after_error = p;
        self
    }

    /// Sets the probability of a [`Fault::Duplicated`] request; its copy lands up to `max_late` (see
    /// [`late`](Self::late)) after it was sent. Not part of [`hostile`](Self::hostile) (seeded runs stay as
    /// they were): add it to that mix with this method.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlease_testkit::RandomFaults;
    /// let faults = RandomFaults::hostile(1).duplicate(0.03);
    /// assert_eq!((faults.duplicate, faults.max_late), (0.03, Duration::from_millis(1500)));
    /// ```
    #[must_use]
    pub fn duplicate(mut self, p: f64) -> Self {
        self.duplicate = p;
        self
    }

    /// Leaves the calls of `ops` out of [`duplicate`](Self::duplicate): a duplicate drawn for one of them is
    /// sent once, normally.
    #[must_use]
    pub fn duplicate_except(mut self, ops: impl IntoIterator<Item = Op>) -> Self {
        self.duplicate_except = ops.into_iter().collect();
        self
    }

    /// Sets the probability that a release notification is lost.
    #[must_use]
    pub fn notification_lost(mut self, p: f64) -> Self {
        self.notification_lost = p;
        self
    }

    /// Sets how the node orders requests (FIFO connection or pool).
    #[must_use]
    pub fn delivery(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }
}

#[derive(Default)]
struct Plan {
    scripted: [VecDeque<Fault>; OPS],
    always: [Option<Fault>; OPS],
    partitioned: bool,
    random: Option<(RandomFaults, Jitter)>,
    delivery: Delivery,
    // Per operation, by `Op::index` (arrays: a simulation counts millions of calls).
    calls: [u64; OPS],
    applied: [u64; OPS],
    applied_after_caller_left: [u64; OPS],
    /// Copies of [`Fault::Duplicated`] requests applied, per operation.
    duplicates_applied: [u64; OPS],
    in_flight: u64,
    next_seq: u64,
    highest_applied_seq: Option<u64>,
    reordered: u64,
    /// Release notifications still to drop (scripted), and how many were dropped / let through.
    drop_notifications: u64,
    notifications_dropped: u64,
    notifications_passed: u64,
    /// The inner node's notifier, for [`Faults::cut_subscriptions`].
    notifier: Option<Notifier>,
}

/// The shared control panel of a [`FaultyNode`]: change faults while a test runs, count calls.
///
/// ```
/// use std::time::Duration;
/// use redlease::{Config, Error, LeaseState, NodeErrorKind, NotAcquiredReason};
/// use redlease_testkit::{Fault, FaultyNode, MemoryNode, Op, Sim};
///
/// let mut sim = Sim::new(2);
/// let clock = sim.clock();
/// let (node, faults) = FaultyNode::new(MemoryNode::with_timer(clock.clone()), clock);
/// let manager = sim.single(node, Config::default().with_expiry(Duration::from_secs(3)).with_attempts(2))?;
/// let lock = manager.lock("job").auto_renew(Duration::from_secs(1));
///
/// // A partition: every call fails at once, nothing is applied.
/// faults.partition();
/// let err = sim.block_on(lock.acquire()).unwrap_err();
/// assert!(matches!(err, Error::NotAcquired { reason: NotAcquiredReason::TooFewNodes, attempts: 2, .. }));
/// assert_eq!((faults.calls(Op::Acquire), faults.applied(Op::Acquire)), (2, 0));
///
/// // Healed; then every renewal fails (out of memory): the lease is at risk, and lost by its deadline.
/// faults.heal();
/// let lease = sim.block_on(lock.acquire())?;
/// faults.always(Op::Extend, Fault::Fail(NodeErrorKind::OutOfMemory));
/// sim.run_for(Duration::from_millis(1_500));
/// assert_eq!(lease.state(), LeaseState::AtRisk);
/// let deadline = lease.valid_until();
/// sim.block_on(lease.lost());
/// assert!(sim.clock().elapsed() > Duration::from_secs(2));
/// assert!(redlease::Timer::now(&sim.clock()) <= deadline);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default)]
pub struct Faults {
    plan: Arc<Mutex<Plan>>,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plan = self.lock();
        f.debug_struct("Faults")
            .field("partitioned", &plan.partitioned)
            .field("delivery", &plan.delivery)
            .field(
                "calls",
                &Op::ALL
                    .iter()
                    .map(|op| (*op, plan.calls[op.index()]))
                    .collect::<Vec<_>>(),
            )
            .field("in_flight", &plan.in_flight)
            .finish()
    }
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues faults for the next calls of `op`, in order (one fault per call).
    pub fn script(&self, op: Op, faults: impl IntoIterator<Item = Fault>) -> &Self {
        self.lock().scripted[op.index()].extend(faults);
        self
    }

    /// Applies `fault` to every call of `op` until [`clear`](Self::clear)ed (after scripted faults run out).
    pub fn always(&self, op: Op, fault: Fault) -> &Self {
        self.lock().always[op.index()] = Some(fault);
        self
    }

    /// Applies `fault` to every lease operation ([`Op::ALL`]; not the [capabilities](Op::CAPABILITIES)).
    pub fn always_all(&self, fault: Fault) -> &Self {
        for op in Op::ALL {
            self.always(op, fault.clone());
        }
        self
    }

    /// Cuts the node off: every call fails at once with a (not applied) connection error. Requests already
    /// in the network still arrive.
    pub fn partition(&self) -> &Self {
        self.lock().partitioned = true;
        self
    }

    /// Ends a [`partition`](Self::partition).
    pub fn heal(&self) -> &Self {
        self.lock().partitioned = false;
        self
    }

    /// Draws random faults for every call (after scripted and `always` faults); also sets the node's
    /// [`Delivery`] to the one in `random`.
    pub fn random(&self, random: RandomFaults) -> &Self {
        let rng = Jitter::from_seed(random.seed);
        let mut plan = self.lock();
        plan.delivery = random.delivery;
        plan.random = Some((random, rng));
        self
    }

    /// Sets how the node orders requests when some are late (default [`Delivery::Fifo`]).
    pub fn delivery(&self, delivery: Delivery) -> &Self {
        self.lock().delivery = delivery;
        self
    }

    /// Removes every fault (scripted, always, random, partition). Counters and the [`Delivery`] are kept, and
    /// requests already in the network still arrive.
    pub fn clear(&self) -> &Self {
        let mut plan = self.lock();
        plan.scripted.iter_mut().for_each(VecDeque::clear);
        plan.always = Default::default();
        plan.random = None;
        plan.partitioned = false;
        self
    }

    /// Drops the next `n` release notifications the node's subscriber connection receives (they never
    /// reach a waiter), after which they pass again (unless random faults drop them).
    pub fn drop_notifications(&self, n: u64) -> &Self {
        self.lock().drop_notifications += n;
        self
    }

    /// Release notifications dropped so far (scripted or random).
    pub fn dropped_notifications(&self) -> u64 {
        self.lock().notifications_dropped
    }

    /// Release notifications let through so far.
    pub fn passed_notifications(&self) -> u64 {
        self.lock().notifications_passed
    }

    /// Cuts the node's subscriber connection as if it had failed: every subscription is lost (waiters poll
    /// until they are subscribed again). Does nothing for a node without notifications.
    pub fn cut_subscriptions(&self) -> &Self {
        let notifier = self.lock().notifier.clone();
        if let Some(n) = notifier {
            n.disconnect();
        }
        self
    }

    /// Whether the next notification passes (scripted drops first, then random ones).
    fn pass_notification(&self) -> bool {
        let mut plan = self.lock();
        let drop = if plan.drop_notifications > 0 {
            plan.drop_notifications -= 1;
            true
        } else if plan.partitioned {
            true
        } else if let Some((random, rng)) = &mut plan.random {
            let p = random.notification_lost;
            p > 0.0 && rng.next_unit() < p
        } else {
            false
        };
        if drop {
            plan.notifications_dropped += 1;
        } else {
            plan.notifications_passed += 1;
        }
        !drop
    }

    /// Calls of `op` so far (whatever happened to them).
    pub fn calls(&self, op: Op) -> u64 {
        self.lock().calls[op.index()]
    }

    /// Calls of every lease operation so far ([`Op::ALL`]; count the [capabilities](Op::CAPABILITIES) with
    /// [`calls`](Self::calls)).
    pub fn total_calls(&self) -> u64 {
        let plan = self.lock();
        Op::ALL.iter().map(|op| plan.calls[op.index()]).sum()
    }

    /// Calls of `op` that reached the inner node.
    pub fn applied(&self, op: Op) -> u64 {
        self.lock().applied[op.index()]
    }

    /// Calls of every lease operation that reached the inner node ([`Op::ALL`]).
    pub fn total_applied(&self) -> u64 {
        let plan = self.lock();
        Op::ALL.iter().map(|op| plan.applied[op.index()]).sum()
    }

    /// Calls of `op` that reached the inner node after their caller had stopped waiting (it dropped the
    /// call, or got an error from [`Fault::LateAfterError`]) — evidence that a late apply really happened.
    pub fn applied_after_caller_left(&self, op: Op) -> u64 {
        self.lock().applied_after_caller_left[op.index()]
    }

    /// Second copies of [`Fault::Duplicated`] requests of `op` that reached the inner node.
    pub fn duplicates_applied(&self, op: Op) -> u64 {
        self.lock().duplicates_applied[op.index()]
    }

    /// Requests sent but not yet applied (sitting in the network).
    pub fn in_flight(&self) -> u64 {
        self.lock().in_flight
    }

    /// Requests applied after a request sent later to this node had already been applied (a
    /// [`Delivery::Pool`] reorders, and a [`Delivery::Reconnecting`] connection across a reset; a
    /// [`Delivery::Fifo`] one never does).
    pub fn reordered(&self) -> u64 {
        self.lock().reordered
    }

    /// The next fault of `op` if it is an [answer](Fault::is_answer) (scripted first, then `always`), taken
    /// and the call counted; `None` (nothing taken) otherwise, or while a partition refuses `op`.
    fn take_answer(&self, op: Op) -> Option<Fault> {
        let mut plan = self.lock();
        if plan.partitioned && op != Op::RunId {
            return None;
        }
        let i = op.index();
        let fault = match plan.scripted[i].front() {
            Some(f) if f.is_answer() => plan.scripted[i].pop_front(),
            Some(_) => None,
            None => plan.always[i].clone().filter(Fault::is_answer),
        }?;
        plan.calls[i] += 1;
        plan.next_seq += 1;
        Some(fault)
    }

    /// The fault for the next call of `op`, its pre-send latency, the delivery and the call's sequence number.
    fn next(&self, op: Op) -> (Option<Fault>, Duration, Delivery, u64) {
        let mut plan = self.lock();
        plan.calls[op.index()] += 1;
        plan.next_seq += 1;
        let seq = plan.next_seq;
        let delivery = plan.delivery;
        if plan.partitioned && op != Op::RunId {
            return (
                Some(Fault::Fail(NodeErrorKind::Connection)),
                Duration::ZERO,
                delivery,
                seq,
            );
        }
        if let Some(fault) = plan.scripted[op.index()].pop_front() {
            return (Some(fault), Duration::ZERO, delivery, seq);
        }
        if let Some(fault) = &plan.always[op.index()] {
            return (Some(fault.clone()), Duration::ZERO, delivery, seq);
        }
        if let Some((random, rng)) = plan
            .random
            .as_mut()
            .filter(|_| !Op::CAPABILITIES.contains(&op))
        {
            let latency = random.max_latency.mul_f64(rng.next_unit());
            let roll = rng.next_unit();
            let late = random.max_late.mul_f64(rng.next_unit());
            let choices = [
                (random.fail, Fault::Fail(NodeErrorKind::Connection)),
                (random.hang, Fault::Hang),
                (random.reply_lost, Fault::ReplyLost),
                (random.slow_reply, Fault::SlowReply(random.max_latency)),
                (random.late, Fault::Late(late)),
                (random.late_after_error, Fault::LateAfterError(late)),
                // Last, so that without duplicates the draws of a seed are what they always were.
                (random.duplicate, Fault::Duplicated(late)),
            ];
            let mut edge = 0.0;
            let mut fault = None;
            for (p, f) in choices {
                edge += p;
                if roll < edge {
                    fault = Some(f);
                    break;
                }
            }
            if matches!(fault, Some(Fault::Duplicated(_))) && random.duplicate_except.contains(&op)
            {
                fault = None;
            }
            return (fault, latency, delivery, seq);
        }
        (None, Duration::ZERO, delivery, seq)
    }

    fn count_applied(&self, op: Op, seq: u64, caller_left: bool, detached: bool) {
        let mut plan = self.lock();
        plan.applied[op.index()] += 1;
        if caller_left {
            plan.applied_after_caller_left[op.index()] += 1;
        }
        if detached {
            plan.in_flight = plan.in_flight.saturating_sub(1);
        }
        match plan.highest_applied_seq {
            Some(high) if seq < high => plan.reordered += 1,
            _ => plan.highest_applied_seq = Some(seq),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Reply<T> = Result<T, NodeError>;
type Job = BoxFuture<()>;

/// A one-shot reply channel from a detached apply to the caller.
struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    sender_gone: bool,
    receiver_gone: bool,
}

struct ReplySender<T>(Arc<Mutex<Slot<T>>>);
struct ReplyReceiver<T>(Arc<Mutex<Slot<T>>>);

fn reply_channel<T>() -> (ReplySender<T>, ReplyReceiver<T>) {
    let slot = Arc::new(Mutex::new(Slot {
        value: None,
        waker: None,
        sender_gone: false,
        receiver_gone: false,
    }));
    (ReplySender(Arc::clone(&slot)), ReplyReceiver(slot))
}

fn lock_slot<T>(slot: &Mutex<Slot<T>>) -> MutexGuard<'_, Slot<T>> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T> ReplySender<T> {
    fn caller_left(&self) -> bool {
        lock_slot(&self.0).receiver_gone
    }

    fn send(self, value: T) {
        let waker = {
            let mut slot = lock_slot(&self.0);
            slot.value = Some(value);
            slot.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Drop for ReplySender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut slot = lock_slot(&self.0);
            slot.sender_gone = true;
            slot.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Future for ReplyReceiver<T> {
    /// `None` if the request was dropped unapplied (its executor went away).
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut slot = lock_slot(&self.0);
        if let Some(v) = slot.value.take() {
            return Poll::Ready(Some(v));
        }
        if slot.sender_gone {
            return Poll::Ready(None);
        }
        slot.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<T> Drop for ReplyReceiver<T> {
    fn drop(&mut self) {
        lock_slot(&self.0).receiver_gone = true;
    }
}

/// The FIFO connection of one node: requests waiting to be applied in send order.
#[derive(Default)]
struct Wire {
    queue: VecDeque<(Instant, Job)>,
    /// A worker task is applying the queue (its current job may already be popped).
    draining: bool,
}

/// A [`RedisNode`] wrapper that injects latency, failures, hangs, lost replies, partitions and late,
/// reordered requests.
///
/// Time passes on the given [`Timer`] (a [`VirtualClock`](crate::VirtualClock) in simulations), so delays
/// cost no real time in tests. A request is *sent* once its pre-send delay ([`Fault::Delay`], random latency)
/// is over: dropping the call before that means it is never applied; dropping it after, it may still be
/// applied ([`Fault::Late`], or a FIFO connection busy with a late request).
///
/// Late requests run detached from the caller, on the spawner given to [`with_spawner`](Self::with_spawner)
/// (in a simulation, [`Sim::spawner`](crate::Sim::spawner): the network is not paused with a client).
///
/// Release notifications: the inner node's [`notifier`](RedisNode::notifier) is forwarded, with a
/// [filter](Notifier::set_filter) that drops notifications as the [`Faults`] say
/// ([`drop_notifications`](Faults::drop_notifications), [`RandomFaults::notification_lost`], and all of them
/// while partitioned); [`Faults::cut_subscriptions`] drops the subscriber connection. The filter is installed
/// on the inner node's notifier, so it applies to every user of that node (and the last `FaultyNode` built
/// over it decides).
///
/// ```
/// use std::time::Duration;
/// use redlease::{RedisNode, Token, Ttl};
/// use redlease_testkit::{Fault, FaultyNode, MemoryNode, Op, Sim};
///
/// let mut sim = Sim::new(1);
/// let clock = sim.clock();
/// let memory = MemoryNode::with_timer(clock.clone());
/// let (node, faults) = FaultyNode::with_spawner(memory.clone(), clock.clone(), sim.spawner());
/// // The connection resets after the SET was written: the caller gets an ambiguous error at once, and the
/// // SET reaches the node 2 s later.
/// faults.script(Op::Acquire, [Fault::LateAfterError(Duration::from_secs(2))]);
/// let token = Token::random().unwrap();
/// let ttl = Ttl::from_duration(Duration::from_secs(10)).unwrap();
/// let err = sim.block_on(node.acquire("k", &token, ttl)).unwrap_err();
/// assert!(err.is_ambiguous());
/// sim.run_for(Duration::from_millis(1_999));
/// assert_eq!(memory.get("k"), None, "not applied yet");
/// sim.run_for(Duration::from_millis(2));
/// assert_eq!(memory.get("k").as_deref(), Some(token.as_str().as_bytes()));
/// assert_eq!(faults.applied_after_caller_left(Op::Acquire), 1);
/// ```
pub struct FaultyNode<N> {
    inner: Arc<N>,
    faults: Faults,
    timer: Arc<dyn Timer>,
    spawner: Option<Arc<dyn Spawn>>,
    /// The current FIFO connection (replaced on a reset when [`Delivery::Reconnecting`]).
    wire: Mutex<Arc<Mutex<Wire>>>,
}

impl<N: fmt::Debug> fmt::Debug for FaultyNode<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyNode")
            .field("inner", &self.inner)
            .finish()
    }
}

fn lock_wire(wire: &Mutex<Wire>) -> MutexGuard<'_, Wire> {
    wire.lock().unwrap_or_else(|p| p.into_inner())
}

async fn sleep_on(timer: &dyn Timer, d: Duration) {
    if !d.is_zero() {
        let at = timer.now() + d;
        timer.sleep_until(at).await;
    }
}

/// Applies the FIFO queue in order, then ends (a worker exists only while requests wait).
async fn drain(wire: Arc<Mutex<Wire>>, timer: Arc<dyn Timer>) {
    loop {
        let next = {
            let mut w = lock_wire(&wire);
            match w.queue.pop_front() {
                Some(job) => Some(job),
                None => {
                    w.draining = false;
                    None
                }
            }
        };
        let Some((at, job)) = next else { return };
        if timer.now() < at {
            timer.sleep_until(at).await;
        }
        job.await;
    }
}

impl<N: RedisNode + 'static> FaultyNode<N> {
    /// Wraps `inner`; returns the node and its control panel.
    ///
    /// Such a node cannot apply a request after its caller left: [`Fault::Late`] and
    /// [`Fault::LateAfterError`] fail with a not-applied error. Use [`with_spawner`](Self::with_spawner) for
    /// those.
    pub fn new(inner: N, timer: impl Timer) -> (Self, Faults) {
        Self::build(inner, Arc::new(timer), None)
    }

    /// Wraps `inner`, applying late requests as tasks on `spawner`; returns the node and its control panel.
    pub fn with_spawner(
        inner: N,
        timer: impl Timer,
        spawner: impl Spawn + 'static,
    ) -> (Self, Faults) {
        Self::build(inner, Arc::new(timer), Some(Arc::new(spawner)))
    }

    fn build(inner: N, timer: Arc<dyn Timer>, spawner: Option<Arc<dyn Spawn>>) -> (Self, Faults) {
        let faults = Faults::default();
        if let Some(notifier) = inner.notifier() {
            // The inner node's notifier is forwarded as it is; its deliveries pass this node's faults.
            let panel = faults.clone();
            notifier.set_filter(Some(Arc::new(move |_channel: &str| {
                panel.pass_notification()
            })));
            faults.lock().notifier = Some(notifier.clone());
        }
        (
            Self {
                inner: Arc::new(inner),
                faults: faults.clone(),
                timer,
                spawner,
                wire: Mutex::default(),
            },
            faults,
        )
    }

    /// The control panel.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Sends the request: `Inline` if it is to be applied at once by the caller's future (zero `delay` and
    /// nothing queued ahead of it on a FIFO connection), else detached — built by `detach` as an owned
    /// future and applied after `delay` on the spawner — with a receiver for the reply.
    fn route<T, A>(
        &self,
        (op, seq, delivery): (Op, u64, Delivery),
        delay: Duration,
        detach: A,
    ) -> Result<Route<T>, NodeError>
    where
        T: Send + 'static,
        A: FnOnce(Arc<N>) -> BoxFuture<Reply<T>>,
    {
        let wire = Arc::clone(&self.wire.lock().unwrap_or_else(|p| p.into_inner()));
        let fifo_busy = delivery != Delivery::Pool && lock_wire(&wire).draining;
        if delay.is_zero() && !fifo_busy {
            self.faults.count_applied(op, seq, false, false);
            return Ok(Route::Inline);
        }
        let Some(spawner) = &self.spawner else {
            return Err(NodeError::not_applied(
                NodeErrorKind::Other,
                "FaultyNode: a late request needs a node built with FaultyNode::with_spawner",
            ));
        };
        let (tx, rx) = reply_channel();
        let apply = detach(Arc::clone(&self.inner));
        let faults = self.faults.clone();
        faults.lock().in_flight += 1;
        let job: Job = Box::pin(async move {
            let reply = apply.await;
            faults.count_applied(op, seq, tx.caller_left(), true);
            tx.send(reply);
        });
        let at = self.timer.now() + delay;
        match delivery {
            Delivery::Pool => {
                let timer = Arc::clone(&self.timer);
                spawner.spawn(Box::pin(async move {
                    timer.sleep_until(at).await;
                    job.await;
                }));
            }
            _ => {
                let start = {
                    let mut w = lock_wire(&wire);
                    w.queue.push_back((at, job));
                    !std::mem::replace(&mut w.draining, true)
                };
                if start {
                    spawner.spawn(Box::pin(drain(wire, Arc::clone(&self.timer))));
                }
            }
        }
        Ok(Route::Detached(rx))
    }

    /// Sends the request (see [`route`](Self::route)) and waits for its reply.
    async fn deliver<T, F, A>(
        &self,
        call: (Op, u64, Delivery),
        delay: Duration,
        inline: F,
        detach: A,
    ) -> Reply<T>
    where
        T: Send + 'static,
        F: Future<Output = Reply<T>>,
        A: FnOnce(Arc<N>) -> BoxFuture<Reply<T>>,
    {
        match self.route(call, delay, detach)? {
            Route::Inline => inline.await,
            Route::Detached(rx) => rx.await.unwrap_or_else(|| {
                Err(NodeError::ambiguous(
                    NodeErrorKind::Io,
                    "FaultyNode: the late request was dropped by its executor",
                ))
            }),
        }
    }

    /// Sends the second copy of a [`Fault::Duplicated`] request: applied `delay` from now on its own (as
    /// on a pool), its reply dropped.
    fn send_copy<T, A>(&self, op: Op, seq: u64, delay: Duration, detach: A) -> Result<(), NodeError>
    where
        T: Send + 'static,
        A: FnOnce(Arc<N>) -> BoxFuture<Reply<T>>,
    {
        let Some(spawner) = &self.spawner else {
            return Err(NodeError::not_applied(
                NodeErrorKind::Other,
                "FaultyNode: a duplicated request needs a node built with FaultyNode::with_spawner",
            ));
        };
        let apply = detach(Arc::clone(&self.inner));
        let faults = self.faults.clone();
        faults.lock().in_flight += 1;
        let timer = Arc::clone(&self.timer);
        let at = timer.now() + delay;
        spawner.spawn(Box::pin(async move {
            timer.sleep_until(at).await;
            let _ = apply.await;
            faults.count_applied(op, seq, true, true);
            faults.lock().duplicates_applied[op.index()] += 1;
        }));
        Ok(())
    }

    /// Runs one call of `op`: `inline` is the call on the inner node, `detach` builds an owned copy of it for
    /// a late apply (only invoked when one is needed, so a plain call clones nothing).
    async fn run<T, F, A>(&self, op: Op, inline: F, detach: A) -> Reply<T>
    where
        T: Send + 'static,
        F: Future<Output = Reply<T>>,
        A: Fn(Arc<N>) -> BoxFuture<Reply<T>>,
    {
        let (fault, latency, delivery, seq) = self.faults.next(op);
        let call = (op, seq, delivery);
        sleep_on(&*self.timer, latency).await;
        match fault {
            None => self.deliver(call, Duration::ZERO, inline, detach).await,
            Some(Fault::Delay(d)) => {
                sleep_on(&*self.timer, d).await;
                self.deliver(call, Duration::ZERO, inline, detach).await
            }
            Some(Fault::Fail(kind)) => Err(NodeError::not_applied(kind, "injected failure")),
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::ApplyThenHang) => {
                let _ = self.deliver(call, Duration::ZERO, inline, detach).await;
                std::future::pending().await
            }
            Some(Fault::ReplyLost) => {
                let _ = self.deliver(call, Duration::ZERO, inline, detach).await;
                Err(NodeError::ambiguous(
                    NodeErrorKind::Io,
                    "injected lost reply",
                ))
            }
            Some(Fault::SlowReply(d)) => {
                let result = self.deliver(call, Duration::ZERO, inline, detach).await;
                sleep_on(&*self.timer, d).await;
                result
            }
            Some(Fault::Late(d)) => self.deliver(call, d, inline, detach).await,
            Some(Fault::Duplicated(d)) => {
                // Both copies leave now; the second one lands `d` later, on its own.
                self.send_copy(op, seq, d.max(Duration::from_nanos(1)), &detach)?;
                self.deliver(call, Duration::ZERO, inline, &detach).await
            }
            Some(answer @ (Fault::RunId(_) | Fault::Acknowledged(_))) => {
                Err(NodeError::not_applied(
                    NodeErrorKind::Other,
                    format!(
                        "FaultyNode: {answer:?} is an answer of Op::RunId or Op::WaitReplicas, scripted for {op:?}"
                    ),
                ))
            }
            Some(Fault::LateAfterError(d)) => {
                // The receiver is dropped at once: the caller has left before the request lands.
                drop(self.route(call, d.max(Duration::from_nanos(1)), detach)?);
                if delivery == Delivery::Reconnecting {
                    // Later requests go over a new connection; the old one drains on its own.
                    *self.wire.lock().unwrap_or_else(|p| p.into_inner()) = Arc::default();
                }
                Err(NodeError::ambiguous(
                    NodeErrorKind::Io,
                    "injected connection reset after the request was written",
                ))
            }
        }
    }
}

/// Where a sent request is applied.
enum Route<T> {
    /// By the caller's future, now.
    Inline,
    /// Later, on the spawner; the reply arrives here.
    Detached(ReplyReceiver<Reply<T>>),
}

// Every operation is overridden, so that none falls back to the trait's plain default instead of reaching
// the inner node through the faults (a provided method added to `RedisNode` fails the lint until it is).
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<N: RedisNode + 'static> RedisNode for FaultyNode<N> {
    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        let detach = |n: Arc<N>| -> BoxFuture<Reply<bool>> {
            let (key, token) = (key.to_owned(), token.clone());
            Box::pin(async move { n.acquire(&key, &token, ttl).await })
        };
        self.run(Op::Acquire, self.inner.acquire(key, token, ttl), detach)
            .await
    }

    /// Counted and faulted as [`Op::Acquire`]; forwards to the inner node's own `claim` (its fast path, the
    /// holder's TTL), with the same request but without its [run id slot](ClaimRequest::run_id): run ids
    /// always come through [`run_id`](Self::run_id) (faulted as [`Op::RunId`]), so that a scripted or
    /// `always` `Op::RunId` fault is never bypassed by a slot the inner node filled.
    async fn claim(&self, mut req: ClaimRequest<'_>) -> Result<Claim, NodeError> {
        req.run_id = None;
        let detach = |n: Arc<N>| -> BoxFuture<Reply<Claim>> {
            let (key, token, ttl) = (req.key.to_owned(), req.token.clone(), req.ttl);
            let (fresh, wants_ttl) = (req.fresh, req.wants_ttl);
            Box::pin(async move {
                let req = ClaimRequest::new(&key, &token, ttl)
                    .fresh(fresh)
                    .wants_ttl(wants_ttl);
                n.claim(req).await
            })
        };
        self.run(Op::Acquire, self.inner.claim(req), detach).await
    }

    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError> {
        let detach = |n: Arc<N>| -> BoxFuture<Reply<Option<u64>>> {
            let (key, fence_key, token) = (key.to_owned(), fence_key.to_owned(), token.clone());
            Box::pin(async move { n.acquire_fenced(&key, &fence_key, &token, ttl).await })
        };
        self.run(
            Op::AcquireFenced,
            self.inner.acquire_fenced(key, fence_key, token, ttl),
            detach,
        )
        .await
    }

    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        let detach = |n: Arc<N>| -> BoxFuture<Reply<bool>> {
            let (key, token) = (key.to_owned(), token.clone());
            Box::pin(async move { n.release(&key, &token).await })
        };
        self.run(Op::Release, self.inner.release(key, token), detach)
            .await
    }

    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        let detach = |n: Arc<N>| -> BoxFuture<Reply<bool>> {
            let (key, token) = (key.to_owned(), token.clone());
            Box::pin(async move { n.extend(&key, &token, ttl).await })
        };
        self.run(Op::Extend, self.inner.extend(key, token, ttl), detach)
            .await
    }

    /// Counted and faulted as one [`Op::Extend`] call: a fault hits the whole batch, as a failed connection
    /// or a lost reply would.
    async fn extend_many(&self, items: &[ExtendItem<'_>]) -> Result<Vec<bool>, NodeError> {
        let owned: Vec<(String, Token, Ttl, bool)> = items
            .iter()
            .map(|i| (i.key.to_owned(), i.token.clone(), i.ttl, i.permit))
            .collect();
        let detach = move |n: Arc<N>| -> BoxFuture<Reply<Vec<bool>>> {
            let owned = owned.clone();
            Box::pin(async move {
                let items: Vec<ExtendItem<'_>> = owned
                    .iter()
                    .map(|(k, t, ttl, permit)| {
                        let item = ExtendItem::new(k, t, *ttl);
                        if *permit { item.for_permit() } else { item }
                    })
                    .collect();
                n.extend_many(&items).await
            })
        };
        self.run(Op::Extend, self.inner.extend_many(items), detach)
            .await
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        let detach = |n: Arc<N>| -> BoxFuture<Reply<Option<KeyState>>> {
            let key = key.to_owned();
            Box::pin(async move { n.inspect(&key).await })
        };
        self.run(Op::Inspect, self.inner.inspect(key), detach).await
    }

    /// Counted and faulted as the lock operation it stands for: [`Op::Acquire`], [`Op::Extend`] or
    /// [`Op::Release`], so every fault and partition applies to a semaphore's permits as to a lock.
    async fn permit(
        &self,
        key: &str,
        token: &Token,
        ttl: Ttl,
        op: PermitOp<'_>,
    ) -> Result<PermitReply, NodeError> {
        let detach = |n: Arc<N>| -> BoxFuture<Reply<PermitReply>> {
            let (key, token) = (key.to_owned(), token.clone());
            let (unfenced, fence) = (op.unfenced(), op.fence_key().map(str::to_owned));
            Box::pin(async move {
                n.permit(&key, &token, ttl, unfenced.with_fence(fence.as_deref()))
                    .await
            })
        };
        let counted = match op {
            PermitOp::Extend => Op::Extend,
            PermitOp::Release => Op::Release,
            _ => Op::Acquire,
        };
        self.run(counted, self.inner.permit(key, token, ttl, op), detach)
            .await
    }

    /// Counted and faulted as one [`Op::Inspect`] call (the check writes nothing): an injected error is
    /// reported as the check reports a node error ([`Readiness::from_error`]), a hang or a partition makes
    /// the node unreachable when the caller gives up; otherwise the inner node's answer.
    async fn readiness(&self, key: &str) -> Readiness {
        let detach = |n: Arc<N>| -> BoxFuture<Reply<Readiness>> {
            let key = key.to_owned();
            Box::pin(async move { Ok(n.readiness(&key).await) })
        };
        let inline = async { Ok(self.inner.readiness(key).await) };
        match self.run(Op::Inspect, inline, detach).await {
            Ok(readiness) => readiness,
            Err(e) => Readiness::from_error(e),
        }
    }

    /// Counted and faulted as one call of the lock operation it stands for ([`Op::Acquire`], or
    /// [`Op::AcquireFenced`] when an item is fenced; [`Op::Extend`]; [`Op::Release`]): a fault hits the whole
    /// step, as a failed connection or a lost reply would.
    async fn multi_key(
        &self,
        items: &[MultiKeyItem<'_>],
        op: MultiKeyOp,
    ) -> Result<MultiKeyReply, NodeError> {
        let owned: Vec<(String, Token, Option<String>)> = items
            .iter()
            .map(|i| {
                (
                    i.key.to_owned(),
                    i.token.clone(),
                    i.fence_key.map(str::to_owned),
                )
            })
            .collect();
        let detach = move |n: Arc<N>| -> BoxFuture<Reply<MultiKeyReply>> {
            let owned = owned.clone();
            Box::pin(async move {
                let items: Vec<MultiKeyItem<'_>> = owned
                    .iter()
                    .map(|(k, t, f)| {
                        let item = MultiKeyItem::new(k, t);
                        match f {
                            Some(f) => item.fenced(f),
                            None => item,
                        }
                    })
                    .collect();
                n.multi_key(&items, op).await
            })
        };
        let counted = match op {
            MultiKeyOp::Release => Op::Release,
            MultiKeyOp::Extend { .. } => Op::Extend,
            _ if items.iter().any(|i| i.fence_key.is_some()) => Op::AcquireFenced,
            _ => Op::Acquire,
        };
        self.run(counted, self.inner.multi_key(items, op), detach)
            .await
    }

    fn profile(&self) -> NodeProfile {
        self.inner.profile()
    }

    fn notifier(&self) -> Option<&Notifier> {
        self.inner.notifier()
    }

    /// Forwarded without faults (an administrative call, not a lease operation).
    async fn raise_fence(&self, fence_key: &str, at_least: u64) -> Result<u64, NodeError> {
        self.inner.raise_fence(fence_key, at_least).await
    }

    /// Faulted as [`Op::RunId`]: scripted and `always` faults only (a real node answers from memory, so no
    /// partition or random fault), [`Fault::RunId`] to report a changed server.
    async fn run_id(&self, key: &str) -> Result<RunId, NodeError> {
        if let Some(Fault::RunId(id)) = self.faults.take_answer(Op::RunId) {
            return Ok(id);
        }
        let detach = |n: Arc<N>| -> BoxFuture<Reply<RunId>> {
            let key = key.to_owned();
            Box::pin(async move { n.run_id(&key).await })
        };
        self.run(Op::RunId, self.inner.run_id(key), detach).await
    }

    /// Faulted as [`Op::WaitReplicas`]: scripted and `always` faults and a partition (no random faults),
    /// [`Fault::Acknowledged`] for a shortfall. Without one it is the inner node's answer (for a
    /// [`MemoryNode`](crate::MemoryNode), see [`set_replicas`](crate::MemoryNode::set_replicas)).
    async fn wait_replicas(&self, key: &str, wait: ReplicaWait) -> Result<u32, NodeError> {
        if let Some(Fault::Acknowledged(n)) = self.faults.take_answer(Op::WaitReplicas) {
            if n < wait.replicas {
                sleep_on(&*self.timer, wait.timeout).await;
            }
            return Ok(n.min(wait.replicas));
        }
        let detach = |n: Arc<N>| -> BoxFuture<Reply<u32>> {
            let key = key.to_owned();
            Box::pin(async move { n.wait_replicas(&key, wait).await })
        };
        self.run(
            Op::WaitReplicas,
            self.inner.wait_replicas(key, wait),
            detach,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn capability_faults_answer_for_their_operation_only_and_random_faults_leave_them_alone() {
        use crate::{MemoryNode, block_on};
        let memory = MemoryNode::new();
        memory.set_replicas(Some(1));
        let (node, faults) = FaultyNode::new(memory, redlease::SystemTimer);
        let real = block_on(node.run_id("k")).unwrap();
        faults.script(Op::RunId, [Fault::RunId(RunId::new("other"))]);
        assert_eq!(block_on(node.run_id("k")).unwrap().as_str(), "other");
        assert_eq!(
            block_on(node.run_id("k")).unwrap(),
            real,
            "the script ran out"
        );
        // A partition refuses the wait (a network call), not the run id (answered from memory).
        faults.partition();
        assert_eq!(block_on(node.run_id("k")).unwrap(), real);
        let wait = ReplicaWait::new(1, Duration::from_millis(1));
        let err = block_on(node.wait_replicas("k", wait)).unwrap_err();
        assert_eq!(err.kind(), NodeErrorKind::Connection);
        faults.heal();
        faults.always(Op::WaitReplicas, Fault::Acknowledged(0));
        assert_eq!(block_on(node.wait_replicas("k", wait)).unwrap(), 0);
        faults.clear();
        assert_eq!(block_on(node.wait_replicas("k", wait)).unwrap(), 1);
        // An answer scripted for another operation is a clear error, not a silent pass.
        faults.script(Op::Release, [Fault::Acknowledged(1)]);
        let token = Token::random().unwrap();
        let err = block_on(node.release("k", &token)).unwrap_err();
        assert!(err.message().contains("scripted for Release"), "{err}");
        // Random faults never touch the capabilities (and draw nothing for them).
        faults.random(RandomFaults::new(1, 1.0, 0.0, 0.0, Duration::ZERO));
        assert_eq!(block_on(node.run_id("k")).unwrap(), real);
        assert_eq!(block_on(node.wait_replicas("k", wait)).unwrap(), 1);
        assert_eq!(faults.calls(Op::RunId), 5);
        assert_eq!(
            faults.total_calls(),
            1,
            "the capabilities are not lease calls"
        );
    }

    #[test]
    fn hostile_faults_draw_every_kind_at_about_its_probability() {
        let faults = Faults::default();
        let random = RandomFaults::hostile(42);
        faults.random(random.clone());
        let mut counts: HashMap<&'static str, u32> = HashMap::new();
        let draws: u32 = 20_000;
        for _ in 0..draws {
            let (fault, latency, _, _) = faults.next(Op::Extend);
            assert!(latency <= random.max_latency);
            let name = match fault {
                None => "none",
                Some(Fault::Fail(_)) => "fail",
                Some(Fault::Hang) => "hang",
                Some(Fault::ReplyLost) => "reply_lost",
                Some(Fault::SlowReply(_)) => "slow_reply",
                Some(Fault::Late(d)) => {
                    assert!(d <= random.max_late);
                    "late"
                }
                Some(Fault::LateAfterError(d)) => {
                    assert!(d <= random.max_late);
                    "late_after_error"
                }
                Some(other) => panic!("unexpected {other:?}"),
            };
            *counts.entry(name).or_default() += 1;
        }
        for (name, p) in [
            ("fail", random.fail),
            ("hang", random.hang),
            ("reply_lost", random.reply_lost),
            ("slow_reply", random.slow_reply),
            ("late", random.late),
            ("late_after_error", random.late_after_error),
        ] {
            let got = f64::from(counts.get(name).copied().unwrap_or(0)) / f64::from(draws);
            assert!((got - p).abs() < 0.01, "{name}: {got} vs {p}");
        }
        assert_eq!(faults.calls(Op::Extend), u64::from(draws));
    }
}
