//! Leased semaphores: at most N holders, each permit a lease with a TTL kept by the server.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::ConfigError;
use crate::driver::Lock;
use crate::error::Error;
use crate::lease::Lease;
use crate::manager::LockManager;
use crate::node::{
    Claim, ClaimRequest, ExtendItem, KeyState, MultiKeyItem, MultiKeyOp, MultiKeyReply, NodeError,
    NodeErrorKind, NodeFuture, NodeProfile, NodeWrapper, PermitOp, PermitReply, RedisNode, Ttl,
};
use crate::token::Token;

/// The least quorum with which a semaphore of `permits` over `n` independent nodes never has more than
/// `permits` holders: `q` with `(permits + 1) · q > permits · n` (any `permits + 1` permits, each held on `q`
/// of `n` nodes, would need some node to hold `permits + 1` of them). `None` when even all `n` nodes are too
/// few (never: `q = n` always satisfies it).
pub fn semaphore_quorum(n: usize, permits: u32) -> Option<usize> {
    let p = u128::from(permits);
    let n128 = n as u128;
    let q = (p * n128) / (p + 1) + 1;
    usize::try_from(q).ok().filter(|q| *q <= n)
}

/// A leased semaphore: at most `permits` holders at once, each holding a permit that is a [`Lease`] — its
/// own random token, a TTL timed by the **server's** clock (an expired permit comes back by itself, also
/// when its holder died), renewal, release, loss signal, `run`, hold limits and handoff, exactly as for a
/// lock. Made by [`LockManager::semaphore`]; cheap to clone.
///
/// The permits live in one server-side structure under the key (the adapters: a sorted set scored by each
/// permit's expiry on the server's clock, expired permits purged in the same atomic step as every
/// acquisition). A changed permit count applies to acquisitions made after it; permits already held stay.
///
/// On Redlock a permit counts only when it is held on `q` nodes with `(permits + 1) · q > permits · n`
/// ([`semaphore_quorum`]), more than a majority: with a bare majority, `permits + 1` holders could each
/// hold a different majority.
///
/// ```
/// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
/// use std::time::Duration;
/// use redlease::{Config, LockManager};
///
/// # block_on(async {
/// # let manager = LockManager::single(MapNode::default(), Config::default())?;
/// // At most 2 workers call the partner API at once.
/// let api = manager.semaphore("partner-api", 2)?;
/// let first = api.try_acquire().await?;
/// let second = api.try_acquire().await?;
/// assert!(api.try_acquire().await.unwrap_err().is_contended());
/// first.release().await?;
/// let third = api.acquire_within(Duration::from_secs(1)).await?;
/// # second.release().await?;
/// # third.release().await?;
/// # Ok::<(), redlease::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Semaphore {
    lock: Lock,
    permits: u32,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("key", &self.lock.key())
            .field("permits", &self.permits)
            .finish()
    }
}

impl LockManager {
    /// A leased semaphore of `permits` at `key`; see [`Semaphore`].
    ///
    /// # Errors
    /// [`Error::Config`] for zero permits, or a Redlock whose node count no quorum can protect (see
    /// [`semaphore_quorum`]; never for an odd count ≥ 3), before anything is sent.
    pub fn semaphore(&self, key: impl Into<String>, permits: u32) -> Result<Semaphore, Error> {
        if permits == 0 {
            return Err(ConfigError::Semaphore("a semaphore needs at least one permit").into());
        }
        let n = self.nodes();
        let quorum = semaphore_quorum(n, permits).ok_or(ConfigError::Semaphore(
            "no quorum of these nodes bounds the holders by the permits",
        ))?;
        Ok(Semaphore {
            lock: self
                .permit_manager(PermitOp::Acquire { permits }, quorum)
                .lock(key.into()),
            permits,
        })
    }

    /// A manager over this one's nodes whose lock operations are the permit operations of `acquire`, with
    /// `quorum`.
    fn permit_manager(&self, acquire: PermitOp<'static>, quorum: usize) -> LockManager {
        let nodes: Vec<Arc<dyn RedisNode>> = self
            .engine()
            .nodes
            .iter()
            .map(|inner| -> Arc<dyn RedisNode> {
                Arc::new(PermitNode {
                    inner: Arc::clone(inner),
                    acquire,
                })
            })
            .collect();
        self.rebuild(|e| {
            e.profiles = crate::driver::profiles(&nodes);
            e.nodes = nodes;
            e.quorum = quorum;
            e.permits = true;
            e.fenced_permits = matches!(acquire, PermitOp::AcquireExclusive { .. });
            e.wake_all = !matches!(acquire, PermitOp::Acquire { .. });
            e.contention_writes = matches!(
                acquire,
                PermitOp::AcquireExclusive { .. } | PermitOp::AcquireFair { .. }
            );
        })
    }

    /// A read/write lock at `key`; see [`RwLock`].
    pub fn rw_lock(&self, key: impl Into<String>) -> RwLock {
        let key = key.into();
        // Two majorities intersect: a writer and a reader (or two writers) can never both hold a quorum.
        let quorum = self.quorum();
        RwLock {
            read: self
                .permit_manager(PermitOp::AcquireShared, quorum)
                .lock(key.clone()),
            write: self
                .permit_manager(
                    PermitOp::AcquireExclusive {
                        claim: writer_claim(self.config()),
                        fence: None,
                    },
                    quorum,
                )
                .lock(key),
        }
    }
}

impl Semaphore {
    fn map(&self, f: impl FnOnce(Lock) -> Lock) -> Self {
        Self {
            lock: f(self.lock.clone()),
            permits: self.permits,
        }
    }

    /// The key.
    pub fn key(&self) -> &str {
        self.lock.key()
    }

    /// How many holders it admits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Sets each permit's TTL; see [`Lock::expiry`].
    #[must_use]
    pub fn expiry(&self, expiry: Duration) -> Self {
        self.map(|l| l.expiry(expiry))
    }

    /// Sets how often [`Lease::run`] renews a permit; see [`Lock::renew_every`].
    #[must_use]
    pub fn renew_every(&self, interval: Duration) -> Self {
        self.map(|l| l.renew_every(interval))
    }

    /// Renews each permit in the background; see [`Lock::auto_renew`].
    #[must_use]
    pub fn auto_renew(&self, interval: Duration) -> Self {
        self.map(|l| l.auto_renew(interval))
    }

    /// Limits how long a permit may be held in all; see [`Lock::max_hold`].
    #[must_use]
    pub fn max_hold(&self, max_hold: Duration) -> Self {
        self.map(|l| l.max_hold(max_hold))
    }

    /// Takes a permit if one is free (one attempt).
    ///
    /// # Errors
    /// As [`Lock::try_acquire`]: every permit held is contention ([`Error::is_contended`]).
    pub async fn try_acquire(&self) -> Result<Lease, Error> {
        self.lock.try_acquire().await
    }

    /// Tries up to [`Config::attempts`](crate::Config::attempts) times; see [`Lock::acquire`].
    ///
    /// # Errors
    /// As [`Lock::acquire`].
    pub async fn acquire(&self) -> Result<Lease, Error> {
        self.lock.acquire().await
    }

    /// Waits for a permit until `deadline`, woken by a release where the node can subscribe, and otherwise
    /// at the earliest permit's expiry; see [`Lock::acquire_until`].
    ///
    /// # Errors
    /// As [`Lock::acquire_until`].
    pub async fn acquire_until(&self, deadline: Instant) -> Result<Lease, Error> {
        self.lock.acquire_until(deadline).await
    }

    /// Waits for a permit for `patience`; see [`acquire_until`](Self::acquire_until).
    ///
    /// # Errors
    /// As [`Lock::acquire_within`].
    pub async fn acquire_within(&self, patience: Duration) -> Result<Lease, Error> {
        self.lock.acquire_within(patience).await
    }

    /// Continues a permit another process handed over ([`Lease::handoff`]); see [`Lock::resume`].
    ///
    /// # Errors
    /// As [`Lock::resume`].
    pub async fn resume(&self, ticket: &crate::LeaseTicket) -> Result<Lease, Error> {
        self.lock.resume(ticket).await
    }
}

/// The most waiters a [fair lock](Lock::fair)'s queue holds.
pub const FAIR_QUEUE_LIMIT: u32 = 1_000;

impl Lock {
    /// This lock, served in arrival order: waiters queue on the server, and the lock goes to the one that
    /// has waited longest.
    ///
    /// A waiting acquisition ([`acquire_within`](Self::acquire_within), [`acquire_until`](Self::acquire_until))
    /// keeps its place alive with each attempt (at least every
    /// [`max_retry_delay`](crate::Config::max_retry_delay), and when a release wakes the waiters); a place
    /// lives `2 × max_retry_delay` unless refreshed, so a waiter that died leaves the queue within that, and
    /// one that gives up leaves it at once. While a waiter is first in the queue, nobody else takes the
    /// lock, even between the holder's release and the waiter's next attempt. At most
    /// [`FAIR_QUEUE_LIMIT`] waiters queue; another is refused with
    /// [`NodeErrorKind::Busy`] ("the fair lock's queue is full"). The lease is an ordinary lease (renewal,
    /// loss, hold limits); fair locks are not fenced, and must not share their key with plain locks.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn f(manager: redlease::LockManager) -> Result<(), redlease::Error> {
    /// let turn = manager.lock("printer").fair();
    /// let lease = turn.acquire_within(Duration::from_secs(60)).await?;
    /// # lease.release().await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn fair(self) -> Lock {
        let manager = LockManager::from_engine(self.engine());
        let op = PermitOp::AcquireFair {
            claim: writer_claim(manager.config()),
            queue: FAIR_QUEUE_LIMIT,
        };
        let quorum = manager.quorum();
        self.with_engine(manager.permit_manager(op, quorum).engine_arc())
    }
}

/// How long a waiting writer's claim lives unless its next attempt refreshes it: twice the longest pause
/// between a waiting acquisition's attempts ([`Config::max_retry_delay`](crate::Config::max_retry_delay)).
fn writer_claim(config: &crate::Config) -> Ttl {
    Ttl::from_duration(config.max_retry_delay().saturating_mul(2)).unwrap_or(Ttl::MAX)
}

/// A read/write lock: any number of readers, or one writer, each holding a [`Lease`] (its own token, a TTL
/// timed by the server's clock, renewal, loss signal, `run`, hold limits) — acquired through the [`Lock`]s
/// [`read`](Self::read) and [`write`](Self::write) with the usual calls. Made by
/// [`LockManager::rw_lock`]; cheap to clone.
///
/// **Writer preference.** A writer that finds readers records a claim on the server (an entry with the
/// writer's TTL) that holds *new* readers off; the readers already in finish (or expire), and the writer
/// goes next — readers cannot starve it. The claim is renewed by the writer's next attempts (a waiting
/// [`acquire_within`](Lock::acquire_within) retries at least every
/// [`max_retry_delay`](crate::Config::max_retry_delay), and when woken by a release), removed when the
/// writer gets the lock, and otherwise lives twice `max_retry_delay` (2 s by default; never longer than the
/// writer's TTL): a writer that gave up or died holds new readers off for at most that long. Writers do not hold each other off by claims (they contend as for a lock). A reader or writer
/// that dies frees its share at its TTL.
///
/// **Fencing.** The writer can be fenced ([`fenced`](Self::fenced), or [`Lock::fenced`] on
/// [`write`](Self::write), single mode only): each writer's acquisition increments the counter at the fence
/// key in the same atomic step that grants it the lock, and the lease carries the number
/// ([`Lease::fencing_token`](crate::Lease::fencing_token)); numbers strictly increase from writer to writer. Readers are not
/// fenced (many hold at once; fencing a reader is [`ConfigError::Semaphore`] before anything is sent). On
/// Redis Cluster give the lock and fence keys one hash tag, as for a plain fenced lock.
///
/// On Redlock both sides use a majority: any two majorities intersect, so a writer and a reader (or two
/// writers) never both hold one.
///
/// ```no_run
/// use std::time::Duration;
/// use redlease::LockManager;
///
/// async fn report(manager: &LockManager) -> Result<(), redlease::Error> {
///     let rw = manager.rw_lock("report:2026-12");
///     let reader = rw.read().acquire_within(Duration::from_secs(5)).await?;
///     // … read the report; other readers may hold it too …
///     reader.release().await?;
///     let writer = rw.write().acquire_within(Duration::from_secs(30)).await?;
///     // … rewrite it: no reader and no other writer holds it …
///     writer.release().await?;
///     Ok(())
/// }
/// ```
#[derive(Clone, Debug)]
pub struct RwLock {
    read: Lock,
    write: Lock,
}

impl RwLock {
    /// The reader side: acquiring it takes a shared permit.
    pub fn read(&self) -> &Lock {
        &self.read
    }

    /// The writer side: acquiring it takes the exclusive permit (after the readers already in).
    pub fn write(&self) -> &Lock {
        &self.write
    }

    /// This lock with its writer fenced by the counter at `fence_key` (see the type's docs): a writer's lease
    /// carries a fencing token, larger than every earlier writer's.
    ///
    /// ```no_run
    /// # async fn f(manager: redlease::LockManager) -> Result<(), redlease::Error> {
    /// let rw = manager.rw_lock("report:{2026-12}").fenced("report:{2026-12}:fence");
    /// let writer = rw.write().try_acquire().await?;
    /// let fence = writer.fencing_token(); // Some(n), larger than every earlier writer's
    /// // … write the report, passing `fence` to the store so that it refuses older writers …
    /// # let _ = fence;
    /// writer.release().await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn fenced(&self, fence_key: impl Into<String>) -> Self {
        Self {
            read: self.read.clone(),
            write: self.write.clone().fenced(fence_key),
        }
    }

    /// This lock with both sides' TTL set; see [`Lock::expiry`].
    #[must_use]
    pub fn expiry(&self, expiry: Duration) -> Self {
        Self {
            read: self.read.clone().expiry(expiry),
            write: self.write.clone().expiry(expiry),
        }
    }
}

/// A node whose lock operations act on the permits of the semaphore at the same key
/// ([`RedisNode::permit`]): the whole lease machinery then serves permits unchanged.
struct PermitNode {
    inner: Arc<dyn RedisNode>,
    /// What an acquisition asks for.
    acquire: PermitOp<'static>,
}

impl PermitNode {
    fn unsupported<T: Send + 'static>(what: &'static str) -> NodeFuture<'static, T> {
        Box::pin(std::future::ready(Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            what,
        ))))
    }
}

impl NodeWrapper for PermitNode {
    type Inner = dyn RedisNode;

    fn inner(&self) -> &(dyn RedisNode + 'static) {
        &*self.inner
    }

    fn acquire<'a, 'b, 'c, 'f>(
        &'a self,
        key: &'b str,
        token: &'c Token,
        ttl: Ttl,
    ) -> NodeFuture<'f, bool>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
        Self: 'f,
    {
        let op = self.acquire;
        Box::pin(async move {
            Ok(RedisNode::permit(&*self.inner, key, token, ttl, op).await? == PermitReply::Done)
        })
    }

    /// The inner node's, but never NX: a permit's fresh acquisition is its script, not a `SET NX`.
    fn profile(&self) -> NodeProfile {
        RedisNode::profile(&*self.inner).with_fresh_is_nx(false)
    }

    /// The permit acquisition whatever the request says (a fresh one too: the profile says it is not NX), and
    /// on a full semaphore the time until its earliest permit expires.
    fn claim<'a, 'b, 'f>(&'a self, req: ClaimRequest<'b>) -> NodeFuture<'f, Claim>
    where
        'a: 'f,
        'b: 'f,
        Self: 'f,
    {
        let op = self.acquire;
        Box::pin(async move {
            Ok(
                match RedisNode::permit(&*self.inner, req.key, req.token, req.ttl, op).await? {
                    PermitReply::Done => Claim::Taken,
                    PermitReply::Full { next_expiry } => Claim::Held {
                        remaining: next_expiry,
                    },
                    _ => Claim::Held { remaining: None },
                },
            )
        })
    }

    fn acquire_fenced<'a, 'b, 'c, 'd, 'f>(
        &'a self,
        key: &'b str,
        fence_key: &'c str,
        token: &'d Token,
        ttl: Ttl,
    ) -> NodeFuture<'f, Option<u64>>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
        'd: 'f,
        Self: 'f,
    {
        // Only a read/write lock's writer is fenced (the core refuses the others before sending).
        let PermitOp::AcquireExclusive { claim, .. } = self.acquire else {
            return Self::unsupported("only a read/write lock's writer is fenced");
        };
        let op = PermitOp::AcquireExclusive {
            claim,
            fence: Some(fence_key),
        };
        Box::pin(async move {
            match RedisNode::permit(&*self.inner, key, token, ttl, op).await? {
                PermitReply::Fenced { fence } => Ok(Some(fence)),
                PermitReply::Full { .. } => Ok(None),
                // A node that granted without a number broke the contract; it may have taken the lock,
                // so the answer is ambiguous (the acquisition cleans up after it).
                _ => Err(NodeError::ambiguous(
                    NodeErrorKind::Protocol,
                    "a fenced writer's acquisition was answered without a fencing token",
                )),
            }
        })
    }

    fn release<'a, 'b, 'c, 'f>(&'a self, key: &'b str, token: &'c Token) -> NodeFuture<'f, bool>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
        Self: 'f,
    {
        Box::pin(async move {
            let ttl = Ttl::from_millis(1).unwrap_or(Ttl::MAX);
            Ok(
                RedisNode::permit(&*self.inner, key, token, ttl, PermitOp::Release).await?
                    == PermitReply::Done,
            )
        })
    }

    fn extend<'a, 'b, 'c, 'f>(
        &'a self,
        key: &'b str,
        token: &'c Token,
        ttl: Ttl,
    ) -> NodeFuture<'f, bool>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
        Self: 'f,
    {
        Box::pin(async move {
            Ok(
                RedisNode::permit(&*self.inner, key, token, ttl, PermitOp::Extend).await?
                    == PermitReply::Done,
            )
        })
    }

    fn inspect<'a, 'b, 'f>(&'a self, _key: &'b str) -> NodeFuture<'f, Option<KeyState>>
    where
        'a: 'f,
        'b: 'f,
        Self: 'f,
    {
        Self::unsupported("a semaphore has no single holder to inspect")
    }

    fn raise_fence<'a, 'b, 'f>(&'a self, _fence_key: &'b str, _at_least: u64) -> NodeFuture<'f, u64>
    where
        'a: 'f,
        'b: 'f,
        Self: 'f,
    {
        Self::unsupported("a semaphore's permits are not fenced")
    }

    /// The permits' batched renewal: one [`RedisNode::extend_many`] call of the inner node with every item
    /// [marked as a permit](ExtendItem::for_permit); where the inner node cannot extend permits in a batch
    /// (an [`Unsupported`](NodeErrorKind::Unsupported) answer), one [`PermitOp::Extend`] per item,
    /// concurrently, in the same call.
    fn extend_many<'a, 'b, 'c, 'f>(
        &'a self,
        items: &'b [ExtendItem<'c>],
    ) -> NodeFuture<'f, Vec<bool>>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
        Self: 'f,
    {
        Box::pin(async move {
            let permits: Vec<ExtendItem<'_>> = items.iter().map(|i| i.for_permit()).collect();
            match RedisNode::extend_many(&*self.inner, &permits).await {
                Err(e) if e.kind() == NodeErrorKind::Unsupported && !e.is_ambiguous() => {}
                other => return other,
            }
            let replies =
                join_all(items.iter().map(|i| {
                    RedisNode::permit(&*self.inner, i.key, i.token, i.ttl, PermitOp::Extend)
                }))
                .await;
            let mut flags = Vec::with_capacity(replies.len());
            let mut failed: Option<NodeError> = None;
            for reply in replies {
                match reply {
                    Ok(r) => flags.push(r == PermitReply::Done),
                    // An error fails the call; an ambiguous one (it may have been applied) wins.
                    Err(e) => {
                        if failed.as_ref().is_none_or(|f| !f.is_ambiguous()) {
                            failed = Some(e);
                        }
                        flags.push(false);
                    }
                }
            }
            failed.map_or(Ok(flags), Err)
        })
    }

    fn multi_key<'a, 'b, 'c, 'f>(
        &'a self,
        _items: &'b [MultiKeyItem<'c>],
        _op: MultiKeyOp,
    ) -> NodeFuture<'f, MultiKeyReply>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
        Self: 'f,
    {
        // The inner node's would act on lock keys, not permits.
        Self::unsupported("permits are taken one key at a time")
    }
}

/// Polls every future concurrently; their outputs in order.
async fn join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (f, out) in pending.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *out = Some(v),
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quorum_bounds_the_holders_by_pigeonhole() {
        // A single node: itself.
        assert_eq!(semaphore_quorum(1, 5), Some(1));
        // One permit is a lock: a majority.
        assert_eq!(semaphore_quorum(3, 1), Some(2));
        assert_eq!(semaphore_quorum(5, 1), Some(3));
        // More permits need more of the nodes.
        assert_eq!(semaphore_quorum(3, 2), Some(3));
        assert_eq!(semaphore_quorum(5, 2), Some(4));
        assert_eq!(semaphore_quorum(5, 4), Some(5));
        for n in 1..=9usize {
            for permits in 1..=50u32 {
                let q = semaphore_quorum(n, permits).unwrap_or(0);
                let (p, n, q) = (u64::from(permits), n as u64, q as u64);
                assert!((p + 1) * q > p * n, "n={n} permits={p} q={q}");
                assert!(
                    q == 0 || (p + 1) * (q - 1) <= p * n,
                    "q={q} is not the least"
                );
            }
        }
    }
}
