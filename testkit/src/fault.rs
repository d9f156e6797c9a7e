//! Fault injection around any [`RedisNode`].

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redlease::machine::Jitter;
use redlease::{KeyState, NodeError, NodeErrorKind, RedisNode, Timer, Token, Ttl, async_trait};

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
}

impl Op {
    /// Every operation.
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
    /// Wait, then perform the call normally.
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
}

/// Random faults drawn per call from a seed.
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
    /// Every call is delayed by a uniform latency in `[0, max_latency]`.
    pub max_latency: Duration,
}

impl RandomFaults {
    /// Faults from `seed` with the given probabilities of failure, hang and lost reply, and latency up to
    /// `max_latency`.
    pub fn new(seed: u64, fail: f64, hang: f64, reply_lost: f64, max_latency: Duration) -> Self {
        Self {
            seed,
            fail,
            hang,
            reply_lost,
            slow_reply: 0.0,
            max_latency,
        }
    }

    /// Sets the probability of a slow reply.
    #[must_use]
    pub fn slow_reply(mut self, p: f64) -> Self {
        self.slow_reply = p;
        self
    }
}

#[derive(Default)]
struct Plan {
    scripted: HashMap<Op, VecDeque<Fault>>,
    always: HashMap<Op, Fault>,
    partitioned: bool,
    random: Option<(RandomFaults, Jitter)>,
    calls: HashMap<Op, u64>,
    applied: HashMap<Op, u64>,
}

/// The shared control panel of a [`FaultyNode`]: change faults while a test runs, count calls.
#[derive(Clone, Default)]
pub struct Faults {
    plan: Arc<Mutex<Plan>>,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plan = self.lock();
        f.debug_struct("Faults")
            .field("partitioned", &plan.partitioned)
            .field("calls", &plan.calls)
            .finish()
    }
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues faults for the next calls of `op`, in order (one fault per call).
    pub fn script(&self, op: Op, faults: impl IntoIterator<Item = Fault>) -> &Self {
        self.lock().scripted.entry(op).or_default().extend(faults);
        self
    }

    /// Applies `fault` to every call of `op` until [`clear`](Self::clear)ed (after scripted faults run out).
    pub fn always(&self, op: Op, fault: Fault) -> &Self {
        self.lock().always.insert(op, fault);
        self
    }

    /// Applies `fault` to every operation.
    pub fn always_all(&self, fault: Fault) -> &Self {
        for op in Op::ALL {
            self.always(op, fault.clone());
        }
        self
    }

    /// Cuts the node off: every call fails at once with a (not applied) connection error.
    pub fn partition(&self) -> &Self {
        self.lock().partitioned = true;
        self
    }

    /// Ends a [`partition`](Self::partition).
    pub fn heal(&self) -> &Self {
        self.lock().partitioned = false;
        self
    }

    /// Draws random faults for every call (after scripted and `always` faults).
    pub fn random(&self, random: RandomFaults) -> &Self {
        let rng = Jitter::from_seed(random.seed);
        self.lock().random = Some((random, rng));
        self
    }

    /// Removes every fault (scripted, always, random, partition). Counters are kept.
    pub fn clear(&self) -> &Self {
        let mut plan = self.lock();
        plan.scripted.clear();
        plan.always.clear();
        plan.random = None;
        plan.partitioned = false;
        self
    }

    /// Calls of `op` so far (whatever happened to them).
    pub fn calls(&self, op: Op) -> u64 {
        self.lock().calls.get(&op).copied().unwrap_or(0)
    }

    /// Calls of every operation so far.
    pub fn total_calls(&self) -> u64 {
        self.lock().calls.values().sum()
    }

    /// Calls of `op` that reached the inner node.
    pub fn applied(&self, op: Op) -> u64 {
        self.lock().applied.get(&op).copied().unwrap_or(0)
    }

    fn next(&self, op: Op) -> (Option<Fault>, Duration) {
        let mut plan = self.lock();
        *plan.calls.entry(op).or_default() += 1;
        if plan.partitioned {
            return (Some(Fault::Fail(NodeErrorKind::Connection)), Duration::ZERO);
        }
        if let Some(fault) = plan.scripted.get_mut(&op).and_then(VecDeque::pop_front) {
            return (Some(fault), Duration::ZERO);
        }
        if let Some(fault) = plan.always.get(&op) {
            return (Some(fault.clone()), Duration::ZERO);
        }
        if let Some((random, rng)) = &mut plan.random {
            let latency = random.max_latency.mul_f64(rng.next_unit());
            let roll = rng.next_unit();
            let choices = [
                (random.fail, Fault::Fail(NodeErrorKind::Connection)),
                (random.hang, Fault::Hang),
                (random.reply_lost, Fault::ReplyLost),
                (random.slow_reply, Fault::SlowReply(random.max_latency)),
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
            return (fault, latency);
        }
        (None, Duration::ZERO)
    }

    fn count_applied(&self, op: Op) {
        *self.lock().applied.entry(op).or_default() += 1;
    }
}

/// A [`RedisNode`] wrapper that injects latency, failures, hangs, lost replies and partitions.
///
/// Time passes on the given [`Timer`] (a [`VirtualClock`](crate::VirtualClock) in simulations), so
/// delays cost no real time in tests. Dropping a call's future while it waits drops the inner call too,
/// like a cancelled request on a multiplexed connection.
pub struct FaultyNode<N> {
    inner: N,
    faults: Faults,
    timer: Arc<dyn Timer>,
}

impl<N: fmt::Debug> fmt::Debug for FaultyNode<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyNode")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<N: RedisNode> FaultyNode<N> {
    /// Wraps `inner`; returns the node and its control panel.
    pub fn new(inner: N, timer: impl Timer) -> (Self, Faults) {
        let faults = Faults::default();
        (
            Self {
                inner,
                faults: faults.clone(),
                timer: Arc::new(timer),
            },
            faults,
        )
    }

    /// The control panel.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    async fn sleep(&self, d: Duration) {
        if !d.is_zero() {
            let at = self.timer.now() + d;
            self.timer.sleep_until(at).await;
        }
    }

    async fn run<T, F>(&self, op: Op, call: F) -> Result<T, NodeError>
    where
        F: std::future::Future<Output = Result<T, NodeError>>,
    {
        let (fault, latency) = self.faults.next(op);
        self.sleep(latency).await;
        match fault {
            None => {
                self.faults.count_applied(op);
                call.await
            }
            Some(Fault::Delay(d)) => {
                self.sleep(d).await;
                self.faults.count_applied(op);
                call.await
            }
            Some(Fault::Fail(kind)) => Err(NodeError::not_applied(kind, "injected failure")),
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::ApplyThenHang) => {
                self.faults.count_applied(op);
                let _ = call.await;
                std::future::pending().await
            }
            Some(Fault::ReplyLost) => {
                self.faults.count_applied(op);
                let _ = call.await;
                Err(NodeError::ambiguous(
                    NodeErrorKind::Io,
                    "injected lost reply",
                ))
            }
            Some(Fault::SlowReply(d)) => {
                self.faults.count_applied(op);
                let result = call.await;
                self.sleep(d).await;
                result
            }
        }
    }
}

#[async_trait]
impl<N: RedisNode> RedisNode for FaultyNode<N> {
    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        self.run(Op::Acquire, self.inner.acquire(key, token, ttl))
            .await
    }

    /// Counted and faulted as [`Op::Acquire`]; forwards to the inner node's own fast path.
    async fn acquire_fresh(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        self.run(Op::Acquire, self.inner.acquire_fresh(key, token, ttl))
            .await
    }

    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError> {
        self.run(
            Op::AcquireFenced,
            self.inner.acquire_fenced(key, fence_key, token, ttl),
        )
        .await
    }

    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        self.run(Op::Release, self.inner.release(key, token)).await
    }

    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        self.run(Op::Extend, self.inner.extend(key, token, ttl))
            .await
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        self.run(Op::Inspect, self.inner.inspect(key)).await
    }

    fn endpoint(&self) -> Option<String> {
        self.inner.endpoint()
    }
}
