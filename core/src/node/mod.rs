//! The [`RedisNode`] trait: one logical Redis authority and the four atomic operations a lease needs.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;

use crate::notify::Notifier;
use crate::token::Token;

pub(crate) mod readiness;
mod types;

use readiness::Readiness;

pub use crate::node_error::{Applied, NodeError, NodeErrorKind};
pub use types::{
    Claim, ClaimRequest, ExtendItem, KeyState, MultiKeyItem, MultiKeyOp, MultiKeyReply,
    NodeProfile, PermitOp, PermitReply, ReplicaWait, RunId, RunIdSlot, Ttl,
};

/// One logical Redis authority: a standalone server, a primary with its replicas behind failover, or one Redis
/// Cluster (each key routed to its slot's primary).
///
/// Every method is **one atomic server-side operation** (a single command or a Lua script). The core relies on
/// the contracts below and on nothing else; a user's own node passes the conformance suite in
/// `redlease-testkit` when it keeps them.
///
/// # Errors and ambiguity
///
/// A method returns `Err` only when it could not learn the outcome. The [`NodeError`] says whether the command
/// was **definitely not applied** (refused connection, a Redis error reply such as `NOSCRIPT`, `OOM` or
/// `READONLY`) or is **ambiguous** (it may have been sent and applied: a timeout or a connection dropped after
/// writing). Classify honestly: the core never counts an ambiguous outcome as success, and its cleanup and
/// retry logic is built to stay correct when an ambiguous command was in fact applied. Do not re-send a
/// command whose outcome is unknown; report it as ambiguous instead.
///
/// # Order and late requests
///
/// The core assumes **nothing** about when a request whose outcome it did not learn reaches the server: it
/// may be applied long after the caller gave up on it, and after later requests for the same key when they
/// travel over different connections (a pool, a reconnect), and it may be applied **twice** (a client
/// library or a proxy that re-sends it on another connection: fred replays requests after a reconnect), the
/// copy landing after requests sent later, even after the first copy was answered. The core stays safe under
/// that: after a clean-up that did not answer, an acquisition retries with a fresh token, so a late
/// compare-and-delete can only delete the old one; and **no request ever shortens a key's TTL**: an
/// extension, and the own-token branch of an acquisition, set the TTL to the longer of what the key has left
/// and the TTL asked for (`PEXPIRE … GT`), so a late or duplicated extension with a shorter TTL cannot
/// shorten a key a later round relies on. (The core also does not count a node where an earlier, shorter
/// extension is still unconfirmed; that alone cannot cover a duplicate of an answered request, which is why
/// the never-shorten rule is part of this contract.) What late requests can still cost is liveness: an
/// acquisition applied after its own clean-up keeps the key until its TTL ends, and a key keeps the longest
/// TTL any request of its holder set. So a node should keep the requests for one key in order when it can
/// (one connection per key); the adapters do (fred's pool routes every command for a key through one pool
/// member).
///
/// # Extensions never shorten a key
///
/// Wherever a method sets the TTL of a key that already holds the caller's token ([`extend`](RedisNode::extend),
/// [`extend_many`](RedisNode::extend_many), and the own-token branch of [`acquire`](RedisNode::acquire),
/// [`claim`](RedisNode::claim), [`acquire_fenced`](RedisNode::acquire_fenced) and
/// [`multi_key`](RedisNode::multi_key)), the key's remaining
/// TTL becomes `max(remaining, ttl)` — Redis' `PEXPIRE key ttl GT`, or the same comparison of `PTTL` inside
/// a script — and the answer is still `true` (the key is ours) when the TTL was already longer. A key without
/// a TTL keeps none, as with `GT`. So a lease may believe a shorter deadline than its key has (a manual
/// [`Lease::extend`](crate::Lease::extend) with a TTL shorter than what is left): the lease's belief is
/// conservative, never the key. Writing a new key (`SET … NX PX`, the absent branch) sets exactly `ttl`.
///
/// # Wrappers
///
/// A node that decorates another (metrics, logging, fault injection) should implement [`NodeWrapper`]
/// instead: it forwards every operation and capability it does not override, including the provided ones
/// (the fast path [`claim`](RedisNode::claim), the endpoint, and capabilities added later), which a direct `RedisNode` implementation
/// that writes only the required methods silently loses. `redlease_testkit::conformance::run_wrapper`
/// checks a wrapper.
///
/// # Cancellation
///
/// The core bounds every call by its operation timeout by dropping the future. Dropping it must leave the
/// connection usable for later calls (a multiplexed connection or a pool does this; a single connection
/// that would read a stale reply does not).
///
/// # Example: a node of your own
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
/// use std::time::Instant;
/// use redlease::{KeyState, NodeError, RedisNode, Token, Ttl, async_trait};
///
/// /// A toy single-process "Redis": a map from key to (value, expiry).
/// #[derive(Default)]
/// struct MapNode {
///     keys: Mutex<HashMap<String, (String, Instant)>>,
///     fences: Mutex<HashMap<String, u64>>,
/// }
///
/// impl MapNode {
///     fn live(keys: &mut HashMap<String, (String, Instant)>, key: &str) -> Option<String> {
///         match keys.get(key) {
///             Some((v, at)) if *at > Instant::now() => Some(v.clone()),
///             Some(_) => { keys.remove(key); None }
///             None => None,
///         }
///     }
///
///     /// `PEXPIRE key ttl GT`: an extension never shortens a key (see "Extensions never shorten a key").
///     fn extend_to(keys: &mut HashMap<String, (String, Instant)>, key: &str, ttl: Ttl) {
///         if let Some((_, at)) = keys.get_mut(key) {
///             *at = (*at).max(Instant::now() + ttl.as_duration());
///         }
///     }
/// }
///
/// #[async_trait]
/// impl RedisNode for MapNode {
///     async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
///         let mut keys = self.keys.lock().unwrap();
///         match Self::live(&mut keys, key) {
///             Some(v) if v != token.as_str() => Ok(false),
///             Some(_) => {
///                 Self::extend_to(&mut keys, key, ttl);
///                 Ok(true)
///             }
///             None => {
///                 keys.insert(key.into(), (token.as_str().into(), Instant::now() + ttl.as_duration()));
///                 Ok(true)
///             }
///         }
///     }
///
///     async fn acquire_fenced(&self, key: &str, fence_key: &str, token: &Token, ttl: Ttl)
///         -> Result<Option<u64>, NodeError>
///     {
///         let mut keys = self.keys.lock().unwrap();
///         let mut fences = self.fences.lock().unwrap();
///         match Self::live(&mut keys, key) {
///             Some(v) if v != token.as_str() => Ok(None),
///             Some(_) => {
///                 Self::extend_to(&mut keys, key, ttl);
///                 Ok(fences.get(fence_key).copied())
///             }
///             None => {
///                 let fence = fences.entry(fence_key.into()).or_insert(0);
///                 *fence += 1;
///                 keys.insert(key.into(), (token.as_str().into(), Instant::now() + ttl.as_duration()));
///                 Ok(Some(*fence))
///             }
///         }
///     }
///
///     async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
///         let mut keys = self.keys.lock().unwrap();
///         if Self::live(&mut keys, key).as_deref() == Some(token.as_str()) {
///             keys.remove(key);
///             return Ok(true);
///         }
///         Ok(false)
///     }
///
///     async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
///         let mut keys = self.keys.lock().unwrap();
///         if Self::live(&mut keys, key).as_deref() == Some(token.as_str()) {
///             Self::extend_to(&mut keys, key, ttl);
///             return Ok(true);
///         }
///         Ok(false)
///     }
///
///     async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
///         let mut keys = self.keys.lock().unwrap();
///         let expiry = keys.get(key).map(|(_, at)| *at);
///         Ok(Self::live(&mut keys, key).map(|v| {
///             let ttl = expiry.map(|at| at.saturating_duration_since(Instant::now()));
///             KeyState::new(v, ttl)
///         }))
///     }
/// }
///
/// let manager = redlease::LockManager::single(MapNode::default(), redlease::Config::default()).unwrap();
/// # let _ = manager;
/// ```
#[async_trait]
pub trait RedisNode: Send + Sync {
    /// Takes the lock if it is free, or confirms that this acquisition already holds it.
    ///
    /// Atomically: if `key` does not exist, `SET key token PX ttl` and return `true`; if `key` holds exactly
    /// `token` (a retry of this acquisition whose earlier reply was lost), extend its TTL to at least `ttl`
    /// (never shortening it: `PEXPIRE key ttl GT`, see [the trait docs](RedisNode#extensions-never-shorten-a-key))
    /// and return `true`; otherwise change nothing and return `false` (contended).
    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError>;

    /// One acquisition request, described by data ([`ClaimRequest`]): [`acquire`](Self::acquire), or its
    /// fast path for a [fresh](ClaimRequest::fresh) token, and on contention the holder's remaining TTL when
    /// [asked for](ClaimRequest::wants_ttl). The core sends every attempt of an unfenced acquisition through
    /// it (the repair of a lease's missing keys calls `acquire`).
    ///
    /// - **Not fresh** (`fresh: false`): exactly [`acquire`](Self::acquire)'s contract — a free key is set to
    ///   `token` with `PX ttl`; a key holding `token` is extended to at least `ttl`, never shortened; a key
    ///   holding another value is left unchanged.
    /// - **Fresh** (`fresh: true`): the token is one this node has never stored and never will from an
    ///   earlier request. The first attempt of every acquisition uses a fresh random token, which no key can
    ///   hold yet, so the own-token branch of `acquire` cannot apply and a plain `SET key token NX PX ttl`
    ///   (cheaper for the server than a script) has the same effect: `Taken` if set, `Held` (nothing
    ///   changed) if the key exists. Later attempts with the same token are fresh too on a node whose every
    ///   earlier request got a definite answer that it changed nothing (the lock was held by another owner,
    ///   or an error that was not applied); a node that said yes, failed ambiguously or did not answer in
    ///   time is asked without `fresh`. A node whose [`NodeProfile::fresh_is_nx`] says so **must not change
    ///   an existing key** on a fresh request — not even one holding `token` — whatever `wants_ttl` says; a
    ///   node that does not say so may treat a fresh request as a plain one.
    /// - **Wants the TTL** (`wants_ttl: true`, a waiting acquisition's attempt): when another owner holds
    ///   the lock, [`Claim::Held`] carries its remaining TTL learned in the same atomic step (the waiter waits
    ///   for a notification at most that long; see [`notifier`](Self::notifier)). A node may ignore it and
    ///   answer `remaining: None` (the waiter then waits at most
    ///   [`Config::max_retry_delay`](crate::Config::max_retry_delay)). A node that keeps waiter markers
    ///   ([`notify::waiting_key`](crate::notify::waiting_key)) marks the key on a contended `wants_ttl`
    ///   request, before it reads the holder's TTL. Without `wants_ttl`, `remaining` may be `None` and no
    ///   marker is written.
    /// - **Reports the run id** (`run_id: Some(slot)`, asked where the core would call
    ///   [`run_id`](Self::run_id) after the reply): a node that learns the [`RunId`] of the server that
    ///   applied the claim in the same ordered exchange (an `INFO server` pipelined behind the acquisition on
    ///   its connection) may [fill](RunIdSlot::fill) the slot with it — that server's or a later one's on the
    ///   same ordered connection, never an earlier one's (see [`RunIdSlot`]) — with the same answer and the
    ///   same restart bookkeeping as [`run_id`](Self::run_id). The core then does not call `run_id` for this
    ///   reply. A node may ignore the slot (the default does); the core then calls `run_id`, as it does
    ///   without a slot.
    ///
    /// The default calls [`acquire`](Self::acquire) for every request, and answers `Taken` or
    /// `Held { remaining: None }` ([`Claim::from_taken`]), which costs no extra command; its fresh request is
    /// not NX (the default [`profile`](Self::profile) says so).
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, NodeError> {
        Ok(Claim::from_taken(
            self.acquire(req.key, req.token, req.ttl).await?,
        ))
    }

    /// What this node is, as opposed to what it does: its server's identity, whether its fresh
    /// [`claim`](Self::claim) is a plain `SET NX`, how many items its
    /// [`extend_many`](Self::extend_many) takes (see [`NodeProfile`]). The default knows nothing: no endpoint,
    /// not NX, no batches. A manager reads it once, when it is built.
    fn profile(&self) -> NodeProfile {
        NodeProfile::default()
    }

    /// Takes the lock and issues a fencing token, in one atomic step.
    ///
    /// Atomically: if `key` does not exist, `INCR fence_key`, `SET key token PX ttl` and return the incremented
    /// value; if `key` holds exactly `token`, extend its TTL to at least `ttl` (never shortening it, as
    /// [`acquire`](Self::acquire)) and return the current value of
    /// `fence_key` (the number issued to this acquisition, or a larger one); otherwise change nothing and
    /// return `None`. `fence_key` is never deleted or given a TTL, so numbers only grow; like every Redis
    /// counter they stay below `i64::MAX` (an exhausted counter is an error). Everything that could
    /// fail (wrong types, an exhausted counter) is checked before the first write, so an error never leaves a
    /// lock key behind. On Redis Cluster both keys must hash to one slot (`{tag}`).
    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError>;

    /// Compare-and-delete: atomically, if `key` holds exactly `token`, delete it and return `true`; otherwise
    /// change nothing and return `false`. Never touches a key holding another value.
    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError>;

    /// Compare-and-extend: atomically, if `key` holds exactly `token`, set its TTL to the longer of its
    /// remaining TTL and `ttl` (`PEXPIRE key ttl GT`: an extension **never shortens** a key, see [the trait
    /// docs](RedisNode#extensions-never-shorten-a-key)) and return `true`, also when the TTL it had was already
    /// longer; otherwise change nothing and return `false`. Never creates a key: an expired lease stays
    /// expired.
    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError>;

    /// Reads the value and remaining TTL of `key` (for tools and tests; the lease algorithms never call it).
    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError>;

    /// The node's release notifications, if it can subscribe: a [`Notifier`] owning one subscriber
    /// connection, shared by every waiter (see [`crate::notify`]). Every release this node performs must
    /// then publish on [`notify::channel(key)`](crate::notify::channel) once the key is deleted — or, if
    /// the node keeps waiter markers ([`notify::waiting_key`](crate::notify::waiting_key): its contended
    /// [`claim`](Self::claim) with [`wants_ttl`](ClaimRequest::wants_ttl) and
    /// [`acquire_fenced`](Self::acquire_fenced) mark the key
    /// before they read the holder's TTL), at least while the key's marker exists.
    ///
    /// The default, `None`, means unsupported: waiting acquisitions poll this node
    /// ([`Config::retry_delay`](crate::Config::retry_delay)), as they always did. A wrapper node forwards
    /// its inner node's notifier.
    fn notifier(&self) -> Option<&Notifier> {
        None
    }

    /// Raises the fence counter at `fence_key` to at least `at_least`, and returns its value afterwards.
    ///
    /// Never lowers the counter and never gives it a TTL; a missing counter is created at `at_least`. Every
    /// fencing token issued after this returns is larger than `at_least`. (Acquisitions that run at the
    /// same time may still receive smaller numbers: they happened before the raise.) For re-seeding a
    /// counter that a restart without persistence reset, see
    /// [`LockManager::raise_fence`](crate::LockManager::raise_fence).
    ///
    /// An optional capability: the default answers [`NodeErrorKind::Unsupported`] without sending anything.
    /// A counter that is not a non-negative integer, or has a TTL, is a [`NodeErrorKind::Fence`] error, as
    /// for [`acquire_fenced`](Self::acquire_fenced), changing nothing.
    async fn raise_fence(&self, fence_key: &str, at_least: u64) -> Result<u64, NodeError> {
        let _ = (fence_key, at_least);
        Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            "this node cannot raise a fence counter (RedisNode::raise_fence is not implemented)",
        ))
    }

    /// The [`RunId`] of the server that serves `key` now (the one that answered the last command for it).
    ///
    /// The core asks for it after each acquisition reply, to notice a restarted server: a Redlock node whose
    /// run id changed is not counted toward a quorum for a while (see
    /// [`Config::with_restart_quarantine`](crate::Config::with_restart_quarantine)). In single mode, where a
    /// change is only reported, it asks only when something listens for the
    /// [`NodeRestarted`](crate::EventKind::NodeRestarted) event (an observer, or the `tracing` feature).
    /// It must be cheap: a
    /// node learns it once per connection (`INFO server`) and again after a reconnect, and answers from that
    /// memory otherwise — only where it knows for certain which connection its next command takes (a client
    /// that may replace its connection unnoticed asks every time). Such a node can spare the core this call,
    /// and the round trip it costs, by answering the run id with the acquisition itself: a
    /// [`claim`](Self::claim) whose request carries a [slot](ClaimRequest::run_id) it filled is not followed
    /// by `run_id` (a fenced or multi-key acquisition always is). It must never report an old run id for a
    /// connection to a new server process; a run id that replaced one the node read before (or a server
    /// that started after the node first reached it) carries [`RunId::with_restarted_ago`].
    ///
    /// An optional capability: the default answers [`NodeErrorKind::Unsupported`] without sending anything,
    /// and the core then cannot detect restarts of this node.
    async fn run_id(&self, key: &str) -> Result<RunId, NodeError> {
        let _ = key;
        Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            "this node cannot report its server's run_id (RedisNode::run_id is not implemented)",
        ))
    }

    /// Waits until `wait.replicas` replicas have acknowledged the writes made so far for `key` (`WAIT`, or
    /// `WAITAOF 0 n timeout` with [`ReplicaWait::aof`]), and returns how many did within `wait.timeout`
    /// (fewer than asked when the time ran out).
    ///
    /// Must run on the connection that carried the write, right after it: `WAIT` counts the writes of its
    /// own connection. The core calls it after a won acquisition and after each extension when a
    /// [`Durability`](crate::Durability) policy asks for it (single mode).
    ///
    /// An optional capability: the default answers [`NodeErrorKind::Unsupported`] without sending anything;
    /// a node whose server lacks `WAITAOF` answers the same for `aof`.
    async fn wait_replicas(&self, key: &str, wait: ReplicaWait) -> Result<u32, NodeError> {
        let _ = (key, wait);
        Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            "this node cannot wait for replicas (RedisNode::wait_replicas is not implemented)",
        ))
    }

    /// Extends many leases in one call: for each item, exactly [`extend`](Self::extend) — if its key holds
    /// its token, set its TTL to the longer of what it has left and the item's TTL (never shortening it) and
    /// answer `true`; otherwise change nothing and answer `false` (a key of
    /// another type answers `false` too) — and one answer per item, in order. The items need not be atomic
    /// together; each one is.
    ///
    /// An item with [`permit`](ExtendItem::permit) set extends a permit instead, exactly as
    /// [`permit`](Self::permit) with [`PermitOp::Extend`] (`true` for `Done`, also when the expiry it had was
    /// later). A node that cannot extend permits in a batch answers [`NodeErrorKind::Unsupported`] (not
    /// applied) for a call with such items, and the core then extends those permits one by one.
    ///
    /// The core's batched renewal sends at most [`NodeProfile::batch_limit`] items per
    /// call. An error fails every item of the call (classify it as for `extend`: not applied, or
    /// ambiguous).
    ///
    /// An optional capability: the default answers [`NodeErrorKind::Unsupported`] without sending
    /// anything, and the core then extends each lease on its own.
    async fn extend_many(&self, items: &[ExtendItem<'_>]) -> Result<Vec<bool>, NodeError> {
        let _ = items;
        Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            "this node cannot extend a batch (RedisNode::extend_many is not implemented)",
        ))
    }

    /// The node's start-up check, for [`LockManager::check`](crate::LockManager::check): connect if not
    /// connected, and find out whether the login is accepted, whether the user may run what a lease needs
    /// (on keys like `key`), and which commands each operation will use. Writes nothing.
    ///
    /// An optional capability: the default answers [`Readiness::Unknown`] without sending anything, and the
    /// manager then only reads `key` through [`inspect`](Self::inspect).
    async fn readiness(&self, key: &str) -> Readiness {
        let _ = key;
        Readiness::Unknown
    }

    /// One atomic operation on the leased semaphore at `key` (see
    /// [`LockManager::semaphore`](crate::LockManager::semaphore)): a set of permits, each a `token` with an
    /// expiry **timed by the server's own clock** (`TIME`), expired permits purged in the same step. The
    /// adapters keep it in a sorted set scored by expiry; the key itself expires with its last permit.
    ///
    /// - [`PermitOp::Acquire`]: if `token` holds a permit, set its expiry to `ttl` from now and answer
    ///   [`PermitReply::Done`]; else if fewer than `permits` unexpired permits are held, add one for `token`
    ///   (`Done`); else change nothing and answer [`PermitReply::Full`] with the time until the earliest
    ///   permit expires.
    /// - [`PermitOp::Extend`]: if `token` holds an unexpired permit, set its expiry to `ttl` from now
    ///   (`Done`); else [`PermitReply::NotHeld`], changing nothing.
    /// - A refresh never moves a permit's expiry earlier (`ZADD … GT`): a late or duplicated request with a
    ///   shorter TTL cannot shorten a permit a later request relies on.
    /// - [`PermitOp::AcquireShared`] / [`PermitOp::AcquireExclusive`]: a read/write lock at `key` (see the
    ///   variants); a key serves one kind of semaphore only.
    /// - [`PermitOp::Release`]: remove `token`'s permit and claim (`Done`; [`NotHeld`](PermitReply::NotHeld) if it
    ///   held no permit or it had expired), and publish a release notification on
    ///   [`notify::channel(key)`](crate::notify::channel) when it held one, as a lock release does.
    ///
    /// `ttl` is ignored by `Release`. An optional capability: the default answers
    /// [`NodeErrorKind::Unsupported`] without sending anything.
    async fn permit(
        &self,
        key: &str,
        token: &Token,
        ttl: Ttl,
        op: PermitOp<'_>,
    ) -> Result<PermitReply, NodeError> {
        let _ = (key, token, ttl, op);
        Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            "this node has no leased semaphores (RedisNode::permit is not implemented)",
        ))
    }

    /// One atomic step over several lock keys on this node, for
    /// [`LockManager::lock_all`](crate::LockManager::lock_all): every item's key, token and (optional)
    /// fence counter at once, all or nothing.
    ///
    /// - [`MultiKeyOp::Acquire`]: if every key is absent or holds its item's token, then for each item in
    ///   order: an absent key is set to its token with `PX ttl` (a fenced item's counter `INCR`ed first, as
    ///   [`acquire_fenced`](Self::acquire_fenced) does), a key holding its token keeps the longer of its
    ///   remaining TTL and `ttl` (never shortened); the answer is [`MultiKeyReply::Taken`] with each item's
    ///   fence (`None` for an unfenced item; for a key that already held its token, the counter's current
    ///   value). Every fence of one call is issued in this one step. If some key holds another value,
    ///   **nothing** is written and the answer is [`MultiKeyReply::Held`] naming the first such item and the
    ///   holder's remaining TTL.
    /// - [`MultiKeyOp::Release`]: each key holding its item's token is deleted (publishing the release
    ///   notification, as [`release`](Self::release) does); [`MultiKeyReply::Done`] with one flag per item.
    /// - [`MultiKeyOp::Extend`]: each key holding its item's token gets the longer of its remaining TTL and
    ///   `ttl` (never shortened, as [`extend`](Self::extend)); [`MultiKeyReply::Done`] with one flag per
    ///   item. Never creates a key.
    ///
    /// Every check that can fail (a key of another type, a fence counter that is not a non-negative integer,
    /// has a TTL or is exhausted, invalid arguments) runs before the first write, so an error means nothing
    /// was applied (unless it is ambiguous, as for any operation). Items name distinct keys; fence keys are
    /// distinct and no lock key is a fence key (the core never sends anything else).
    ///
    /// An optional capability: the default answers [`NodeErrorKind::Unsupported`] without sending anything,
    /// and the core then takes, renews and releases the keys one lock at a time, in a fixed order. A node
    /// answers `Unsupported` too, without sending anything, for a call it cannot make one atomic step: keys
    /// in different Redis Cluster slots, or a server without scripting.
    async fn multi_key(
        &self,
        items: &[MultiKeyItem<'_>],
        op: MultiKeyOp,
    ) -> Result<MultiKeyReply, NodeError> {
        let _ = (items, op);
        Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            "this node cannot take several keys in one step (RedisNode::multi_key is not implemented)",
        ))
    }
}

/// The boxed future every node operation returns (what `#[async_trait]` methods return).
pub type NodeFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, NodeError>> + Send + 'a>>;

/// `NodeWrapper`'s forwarding defaults and the blanket `RedisNode` implementation, written from one list of
/// the node's operations (the invocation below): an operation added to [`RedisNode`] is added to the list
/// once, and the blanket implementation's `missing_trait_methods` lint fails the build until it is. An `async` entry returns the inner node's future as is
/// (no second box); its reference parameters carry the lifetimes `#[async_trait]` gives the trait's own
/// declaration (one per reference, plus `'a` for `self` and `'f` for the future).
macro_rules! wrapper_forwarding {
    (
        $(#[doc = $trait_doc:literal])*
        pub trait NodeWrapper;
        $(
        $(#[doc = $doc:literal])*
        $kind:ident fn $name:ident $(<$($lt:lifetime),*>)? ($($arg:ident: $ty:ty),*) -> $ret:ty;
    )*) => {
        $(#[doc = $trait_doc])*
        #[async_trait]
        pub trait NodeWrapper: Send + Sync {
            /// The wrapped node.
            type Inner: RedisNode + ?Sized;

            /// The wrapped node, which receives every call this wrapper does not override.
            fn inner(&self) -> &Self::Inner;

            $(wrapper_forwarding!(@default $kind $(#[doc = $doc])* $name [$($($lt),*)?] ($($arg: $ty),*) -> $ret);)*
        }

        #[deny(clippy::missing_trait_methods)]
        impl<W: NodeWrapper> RedisNode for W {
            $(wrapper_forwarding!(@blanket $kind $name [$($($lt),*)?] ($($arg: $ty),*) -> $ret);)*
        }
    };
    (@default async $(#[doc = $doc:literal])* $name:ident [$($lt:lifetime),*] ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        #[doc = concat!("See [`RedisNode::", stringify!($name), "`]; forwards by default.")]
        $(#[doc = $doc])*
        fn $name<'a, $($lt,)* 'f>(&'a self, $($arg: $ty),*) -> $ret
        where
            'a: 'f,
            $($lt: 'f,)*
            Self: 'f,
        {
            self.inner().$name($($arg),*)
        }
    };
    (@default sync $(#[doc = $doc:literal])* $name:ident [] ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        #[doc = concat!("See [`RedisNode::", stringify!($name), "`]; forwards by default.")]
        $(#[doc = $doc])*
        fn $name(&self, $($arg: $ty),*) -> $ret {
            self.inner().$name($($arg),*)
        }
    };
    (@blanket async $name:ident [$($lt:lifetime),*] ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        fn $name<'a, $($lt,)* 'f>(&'a self, $($arg: $ty),*) -> $ret
        where
            'a: 'f,
            $($lt: 'f,)*
            Self: 'f,
        {
            NodeWrapper::$name(self, $($arg),*)
        }
    };
    (@blanket sync $name:ident [] ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        fn $name(&self, $($arg: $ty),*) -> $ret {
            NodeWrapper::$name(self, $($arg),*)
        }
    };
}

// Every operation of `RedisNode`. (`missing_trait_methods` on the blanket implementation checks that the list
// names them all; the testkit's conformance suite, `run_wrapper`, that a wrapper forwards each one.)
wrapper_forwarding! {
    /// A node that wraps another and forwards to it every operation and capability it does not override.
    ///
    /// Write decorators (metrics, logging, fault injection, routing) with this trait rather than [`RedisNode`]:
    /// implement [`inner`](Self::inner) and override only what the wrapper changes; a blanket implementation
    /// makes every `NodeWrapper` a [`RedisNode`]. Each method defaults to the inner node's, so the fast path
    /// ([`claim`](RedisNode::claim), with its [`profile`](RedisNode::profile) saying a fresh claim is NX),
    /// the [endpoint](NodeProfile::endpoint) that Redlock uses to reject duplicate servers, and every
    /// capability added to [`RedisNode`] later are forwarded without the wrapper author thinking of them.
    /// (A wrapper that implements [`RedisNode`] directly and writes only the required methods silently loses
    /// them: each provided method falls back to its plain default.)
    ///
    /// A forwarded call costs nothing extra: the inner node's future is returned as is.
    ///
    /// Overriding an operation does not redirect the others: a wrapper that counts `acquire` and should also
    /// count the core's acquisitions overrides [`claim`](Self::claim) too (the core sends every attempt of an
    /// unfenced acquisition through `claim`).
    ///
    /// # Example: counting releases
    ///
    /// ```
    /// # mod doc_support { include!("../doc_support.rs"); } use doc_support::*;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use redlease::{NodeError, NodeWrapper, RedisNode, Token, async_trait};
    ///
    /// struct CountReleases<N> {
    ///     inner: N,
    ///     releases: AtomicU64,
    /// }
    ///
    /// #[async_trait]
    /// impl<N: RedisNode> NodeWrapper for CountReleases<N> {
    ///     type Inner = N;
    ///
    ///     fn inner(&self) -> &N {
    ///         &self.inner
    ///     }
    ///
    ///     async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
    ///         self.releases.fetch_add(1, Ordering::Relaxed);
    ///         self.inner.release(key, token).await
    ///     }
    /// }
    ///
    /// # fn node() -> MapNode { MapNode::default() }
    /// let counted = CountReleases { inner: node(), releases: AtomicU64::new(0) };
    /// // Everything else (acquire, extend, the fast path, the profile) is the inner node's. (With both traits
    /// // in scope, name the trait: the wrapper has each method twice.)
    /// assert!(RedisNode::profile(&counted).fresh_is_nx);
    /// let manager = redlease::LockManager::single(counted, redlease::Config::default()).unwrap();
    /// # let _ = manager;
    /// ```
    pub trait NodeWrapper;

    async fn acquire<'b, 'c>(key: &'b str, token: &'c Token, ttl: Ttl) -> NodeFuture<'f, bool>;
    async fn claim<'b>(req: ClaimRequest<'b>) -> NodeFuture<'f, Claim>;
    sync fn profile() -> NodeProfile;
    async fn acquire_fenced<'b, 'c, 'd>(
        key: &'b str,
        fence_key: &'c str,
        token: &'d Token,
        ttl: Ttl
    ) -> NodeFuture<'f, Option<u64>>;
    async fn release<'b, 'c>(key: &'b str, token: &'c Token) -> NodeFuture<'f, bool>;
    async fn extend<'b, 'c>(key: &'b str, token: &'c Token, ttl: Ttl) -> NodeFuture<'f, bool>;
    async fn inspect<'b>(key: &'b str) -> NodeFuture<'f, Option<KeyState>>;
    /// (The wrapper's waiters share the inner node's subscriber connection.)
    sync fn notifier() -> Option<&Notifier>;
    async fn raise_fence<'b>(fence_key: &'b str, at_least: u64) -> NodeFuture<'f, u64>;
    async fn run_id<'b>(key: &'b str) -> NodeFuture<'f, RunId>;
    async fn wait_replicas<'b>(key: &'b str, wait: ReplicaWait) -> NodeFuture<'f, u32>;
    async fn extend_many<'b, 'c>(items: &'b [ExtendItem<'c>]) -> NodeFuture<'f, Vec<bool>>;
    async fn readiness<'b>(key: &'b str) -> Pin<Box<dyn Future<Output = Readiness> + Send + 'f>>;
    async fn permit<'b, 'c, 'd>(
        key: &'b str,
        token: &'c Token,
        ttl: Ttl,
        op: PermitOp<'d>
    ) -> NodeFuture<'f, PermitReply>;
    async fn multi_key<'b, 'c>(items: &'b [MultiKeyItem<'c>], op: MultiKeyOp) -> NodeFuture<'f, MultiKeyReply>;
}

impl<N: RedisNode + ?Sized> NodeWrapper for Arc<N> {
    type Inner = N;

    fn inner(&self) -> &N {
        self
    }
}

impl<N: RedisNode + ?Sized> NodeWrapper for Box<N> {
    type Inner = N;

    fn inner(&self) -> &N {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as StdError;
    use std::time::Duration;

    #[test]
    fn ttl_rounds_up_to_whole_milliseconds() {
        assert_eq!(
            Ttl::from_duration(Duration::from_micros(1))
                .unwrap()
                .as_millis(),
            1
        );
        assert_eq!(
            Ttl::from_duration(Duration::from_micros(1500))
                .unwrap()
                .as_millis(),
            2
        );
        assert_eq!(
            Ttl::from_duration(Duration::from_millis(30_000))
                .unwrap()
                .as_millis(),
            30_000
        );
    }

    #[test]
    fn ttl_rejects_zero_and_huge() {
        assert_eq!(Ttl::from_duration(Duration::ZERO), None);
        assert_eq!(Ttl::from_duration(Duration::MAX), None);
        assert_eq!(Ttl::from_millis(0), None);
        assert_eq!(Ttl::from_millis(Ttl::MAX.as_millis() + 1), None);
        assert_eq!(Ttl::from_millis(Ttl::MAX.as_millis()), Some(Ttl::MAX));
    }

    #[test]
    fn node_error_reports_source_and_ambiguity() {
        let io = std::io::Error::other("reset");
        let err = NodeError::ambiguous(NodeErrorKind::Io, "connection reset").with_source(io);
        assert!(err.is_ambiguous());
        assert_eq!(err.source().unwrap().to_string(), "reset");
        assert_eq!(
            err.to_string(),
            "i/o error (outcome unknown): connection reset"
        );
        assert!(!NodeError::not_applied(NodeErrorKind::Auth, "x").is_ambiguous());
    }

    #[test]
    fn key_state_debug_hides_the_value() {
        let token = Token::random().unwrap();
        let state = KeyState::new(token.as_str(), Some(Duration::from_secs(1)));
        assert!(!format!("{state:?}").contains(token.as_str()));
        assert!(state.holds(&token));
    }
}
