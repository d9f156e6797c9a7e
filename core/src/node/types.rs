//! The values node operations take and answer: [`Ttl`], [`KeyState`], [`ClaimRequest`], [`Claim`], [`RunId`],
//! [`RunIdSlot`], [`ReplicaWait`], and the items of the batched, multi-key and permit operations.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::token::Token;

/// A time-to-live in whole milliseconds, as sent to Redis (`PX`, `PEXPIRE`).
///
/// Always at least 1 ms and at most [`Ttl::MAX`], so a node never sends `PX 0` (an error) or `PEXPIRE 0`
/// (which deletes the key), and adding it to a clock reading cannot overflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(u64);

impl Ttl {
    /// The largest TTL redlease sends: 2^46 ms, a little over 2,200 years.
    ///
    /// Redis rejects expirations that overflow its own millisecond clock; this bound keeps far inside that.
    pub const MAX: Ttl = Ttl(1 << 46);

    /// A TTL from a duration, rounded *up* to whole milliseconds (Redis keeps the key at least as long as asked).
    ///
    /// Returns `None` for a zero duration or one above [`Ttl::MAX`].
    pub fn from_duration(duration: Duration) -> Option<Ttl> {
        if duration.is_zero() {
            return None;
        }
        let whole = duration.as_millis();
        let millis = if duration.subsec_nanos() % 1_000_000 == 0 {
            whole
        } else {
            whole.saturating_add(1)
        };
        let millis = u64::try_from(millis).ok()?;
        (millis <= Self::MAX.0).then_some(Ttl(millis))
    }

    /// A TTL of `millis` milliseconds; `None` for zero or above [`Ttl::MAX`].
    pub fn from_millis(millis: u64) -> Option<Ttl> {
        (millis > 0 && millis <= Self::MAX.0).then_some(Ttl(millis))
    }

    /// The TTL in milliseconds, the unit of `PX` and `PEXPIRE`. Always ≥ 1.
    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// The TTL as a [`Duration`].
    pub fn as_duration(self) -> Duration {
        Duration::from_millis(self.0)
    }
}

/// What [`RedisNode::inspect`](crate::RedisNode::inspect) found under a key.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// The raw value stored under the key.
    pub value: Vec<u8>,
    /// Remaining time to live; `None` when the key has no expiry (never the case for keys redlease writes).
    pub ttl: Option<Duration>,
}

impl KeyState {
    /// A key state, for node implementations.
    pub fn new(value: impl Into<Vec<u8>>, ttl: Option<Duration>) -> Self {
        Self {
            value: value.into(),
            ttl,
        }
    }

    /// Whether the key holds `token`.
    pub fn holds(&self, token: &Token) -> bool {
        token.matches(&self.value)
    }
}

impl fmt::Debug for KeyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The value may be somebody's ownership token: show only a prefix.
        let prefix = String::from_utf8_lossy(&self.value[..self.value.len().min(4)]).into_owned();
        f.debug_struct("KeyState")
            .field("value", &format_args!("{prefix}…"))
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// One acquisition request ([`RedisNode::claim`](crate::RedisNode::claim)): the key, the acquisition's token
/// and TTL, and what the caller knows and wants — whether the token is [fresh](Self::fresh) on this node,
/// whether it [wants the holder's TTL](Self::wants_ttl) on contention, and whether it would like the
/// [run id](Self::run_id) of the server that answered.
///
/// New facts are added as fields (`#[non_exhaustive]`), each defaulting to what a request without it meant,
/// so a node written for an older version keeps compiling and keeps its behaviour. `Debug` shows the token
/// redacted, as [`Token`]'s own `Debug` does.
///
/// ```
/// use redlease::{ClaimRequest, RunIdSlot, Token, Ttl};
///
/// let token = Token::random().unwrap();
/// let ttl = Ttl::from_millis(30_000).unwrap();
/// let req = ClaimRequest::new("orders:42", &token, ttl).fresh(true).wants_ttl(true);
/// assert!(req.fresh && req.wants_ttl);
/// let plain = ClaimRequest::new("orders:42", &token, ttl);
/// assert!(!plain.fresh && !plain.wants_ttl && plain.run_id.is_none());
/// assert!(!format!("{req:?}").contains(token.as_str()));
///
/// // A caller that wants the answering server's run id passes a slot the node may fill.
/// let slot = RunIdSlot::new();
/// let asked = plain.report_run_id(&slot);
/// assert!(asked.run_id.is_some());
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ClaimRequest<'a> {
    /// The lock key.
    pub key: &'a str,
    /// The acquisition's token.
    pub token: &'a Token,
    /// The TTL of a new key, and the least TTL the own-token branch leaves a key holding `token` with (never
    /// shortening it).
    pub ttl: Ttl,
    /// `token` is one this node has never stored and never will from an earlier request, so the own-token
    /// branch cannot apply and a plain `SET key token NX PX ttl` has the request's effect (see
    /// [`RedisNode::claim`](crate::RedisNode::claim)). `false` (the default): it may hold the key already.
    pub fresh: bool,
    /// On contention, report the holder's remaining TTL learned in the same atomic step (for a waiting
    /// acquisition; a node may ignore it and answer `None`). `false` (the default): no TTL is needed.
    pub wants_ttl: bool,
    /// Where the node may report the [`RunId`] of the server that applied this claim, if it learns it in the
    /// same ordered exchange (an `INFO server` pipelined behind the acquisition on its connection, say); see
    /// [`RunIdSlot`] for what may go in. `None` (the default): not wanted. A node that leaves a given slot
    /// empty loses nothing: the core then asks [`RedisNode::run_id`](crate::RedisNode::run_id) as before.
    pub run_id: Option<&'a RunIdSlot>,
}

impl<'a> ClaimRequest<'a> {
    /// A request to take `key` for `token` with `ttl`: not [fresh](Self::fresh), not
    /// [asking for the holder's TTL](Self::wants_ttl) — exactly [`RedisNode::acquire`](crate::RedisNode::acquire).
    pub fn new(key: &'a str, token: &'a Token, ttl: Ttl) -> Self {
        Self {
            key,
            token,
            ttl,
            fresh: false,
            wants_ttl: false,
            run_id: None,
        }
    }

    /// With whether `token` is fresh on this node (see [`fresh`](Self::fresh)).
    #[must_use]
    pub fn fresh(mut self, fresh: bool) -> Self {
        self.fresh = fresh;
        self
    }

    /// With whether the holder's remaining TTL is wanted on contention (see [`wants_ttl`](Self::wants_ttl)).
    #[must_use]
    pub fn wants_ttl(mut self, wants_ttl: bool) -> Self {
        self.wants_ttl = wants_ttl;
        self
    }

    /// With a slot for the run id of the server that applies the claim (see [`run_id`](Self::run_id)).
    #[must_use]
    pub fn report_run_id(mut self, slot: &'a RunIdSlot) -> Self {
        self.run_id = Some(slot);
        self
    }
}

/// Where a node reports, with its [`claim`](crate::RedisNode::claim)'s answer, the [`RunId`] of the server
/// that applied the claim ([`ClaimRequest::report_run_id`]): a restart check that costs no round trip of its
/// own.
///
/// **What may go in:** the run id of the server that answered this claim, or of a server that answered a
/// *later* command on the same ordered connection (a restart in between is then reported early, which only
/// makes the caller more careful) — never one learned before the claim was answered (an earlier server's:
/// that would hide a restart). Where the node reads it as [`run_id`](crate::RedisNode::run_id) would (the
/// same memory, the same restart bookkeeping, [`RunId::restarted_ago`] included), the two answers agree.
///
/// A node need not fill it: an empty slot means "not learned", and the caller asks
/// [`run_id`](crate::RedisNode::run_id) as it would without a slot. The first [`fill`](Self::fill) wins.
#[derive(Default)]
pub struct RunIdSlot(OnceLock<RunId>);

impl RunIdSlot {
    /// An empty slot.
    pub const fn new() -> Self {
        Self(OnceLock::new())
    }

    /// Reports `id`, if nothing was reported yet (the first fill wins); whether this one went in.
    pub fn fill(&self, id: RunId) -> bool {
        self.0.set(id).is_ok()
    }

    /// The reported run id, if any.
    pub fn get(&self) -> Option<&RunId> {
        self.0.get()
    }

    /// The reported run id, if any, emptying the slot.
    pub fn take(&mut self) -> Option<RunId> {
        self.0.take()
    }
}

impl fmt::Debug for RunIdSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RunIdSlot").field(&self.get()).finish()
    }
}

/// What [`RedisNode::claim`](crate::RedisNode::claim) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Claim {
    /// The lock is (now) held by this acquisition's token.
    Taken,
    /// Another owner holds the lock; nothing changed.
    Held {
        /// The holder's remaining TTL, when the node learned it in the same atomic step (`None`: unknown, not
        /// [asked for](ClaimRequest::wants_ttl), or the key has no expiry).
        remaining: Option<Duration>,
    },
}

impl Claim {
    /// `Taken` for `true`, `Held` with no remaining TTL for `false`: the answer of a node that learned only
    /// whether it took the lock.
    pub fn from_taken(taken: bool) -> Self {
        if taken {
            Self::Taken
        } else {
            Self::Held { remaining: None }
        }
    }

    /// Whether the lock is (now) held by this acquisition's token.
    pub fn is_taken(self) -> bool {
        self == Self::Taken
    }
}

/// The identity of one run of a server process: Redis' `run_id` (`INFO server`), a new random value every
/// time the process starts. A node whose `run_id` changed was restarted (or replaced by a failover), and
/// without persistence it forgot every key; see [`RedisNode::run_id`](crate::RedisNode::run_id).
///
/// Two run ids are equal when their text is; [`restarted_ago`](Self::restarted_ago) is not compared.
#[derive(Clone)]
pub struct RunId(Arc<str>, Option<Duration>);

impl PartialEq for RunId {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for RunId {}

impl std::hash::Hash for RunId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl RunId {
    /// A run id, as the server reports it.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into(), None)
    }

    /// This run id, noting that the node itself saw it replace another run id of its server `ago` (on this
    /// connection or an earlier one). A manager that meets the node for the first time, or never recorded
    /// the old run id (its request was abandoned before the answer), then still counts it as a restart
    /// seen `ago`: the restart quarantine does not depend on which manager saw the old server.
    #[must_use]
    pub fn with_restarted_ago(mut self, ago: Duration) -> Self {
        self.1 = Some(ago);
        self
    }

    /// How long ago the node saw this run id replace another one, if it did.
    pub fn restarted_ago(&self) -> Option<Duration> {
        self.1
    }

    /// The run id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunId({})", self.0)
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What [`RedisNode::wait_replicas`](crate::RedisNode::wait_replicas) waits for: `replicas` replicas acknowledging the connection's writes
/// (`WAIT replicas timeout`), or, with [`aof`](Self::aof), having written them to their append-only file
/// (`WAITAOF 0 replicas timeout`), for at most `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ReplicaWait {
    /// How many replicas must acknowledge.
    pub replicas: u32,
    /// How long the server waits for them (never zero: `WAIT n 0` blocks forever).
    pub timeout: Duration,
    /// Wait for the replicas' append-only file (`WAITAOF`, Redis 7.2+ and Valkey) instead of their memory.
    pub aof: bool,
}

impl ReplicaWait {
    /// Wait for `replicas` replicas to acknowledge, for at most `timeout` (`WAIT`).
    pub fn new(replicas: u32, timeout: Duration) -> Self {
        Self {
            replicas,
            timeout,
            aof: false,
        }
    }

    /// Wait for the replicas to write to their append-only file instead (`WAITAOF 0 replicas timeout`). A
    /// server without `WAITAOF` (Redis before 7.2) answers [`NodeErrorKind::Unsupported`](crate::NodeErrorKind::Unsupported).
    #[must_use]
    pub fn aof(mut self) -> Self {
        self.aof = true;
        self
    }
}

/// One key of a [`RedisNode::multi_key`](crate::RedisNode::multi_key) call.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct MultiKeyItem<'a> {
    /// The lock key.
    pub key: &'a str,
    /// The token this key is (to be) held by.
    pub token: &'a Token,
    /// The fence counter of a fenced item ([`MultiKeyOp::Acquire`] only; ignored otherwise).
    pub fence_key: Option<&'a str>,
}

impl<'a> MultiKeyItem<'a> {
    /// An unfenced item: `key` held by `token`.
    pub fn new(key: &'a str, token: &'a Token) -> Self {
        Self {
            key,
            token,
            fence_key: None,
        }
    }

    /// This item, fenced by the counter at `fence_key`.
    #[must_use]
    pub fn fenced(mut self, fence_key: &'a str) -> Self {
        self.fence_key = Some(fence_key);
        self
    }
}

/// What a [`RedisNode::multi_key`](crate::RedisNode::multi_key) call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MultiKeyOp {
    /// Take every key, or none.
    Acquire {
        /// The TTL of every key.
        ttl: Ttl,
    },
    /// Extend every key still holding its token, never shortening one.
    Extend {
        /// The TTL to extend to (at least).
        ttl: Ttl,
    },
    /// Delete every key still holding its token.
    Release,
}

/// The answer of [`RedisNode::multi_key`](crate::RedisNode::multi_key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MultiKeyReply {
    /// [`MultiKeyOp::Acquire`]: every key is (now) held by its token; each item's fence, in item order.
    Taken {
        /// Per item: the fence issued (or, for a key that already held its token, the counter's value);
        /// `None` for an unfenced item.
        fences: Vec<Option<u64>>,
    },
    /// [`MultiKeyOp::Acquire`]: the key of item `index` (the first such, in item order) is held by another
    /// owner; nothing was written.
    Held {
        /// The item whose key is held.
        index: usize,
        /// The holder's remaining TTL, learned in the same step (`None`: unknown or no expiry).
        remaining: Option<Duration>,
    },
    /// [`MultiKeyOp::Extend`] / [`MultiKeyOp::Release`]: per item, in order, whether its key held its token
    /// (and was extended or deleted).
    Done(Vec<bool>),
}

/// A leased-semaphore operation ([`RedisNode::permit`](crate::RedisNode::permit)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PermitOp<'a> {
    /// Take (or refresh) a permit if fewer than `permits` are held.
    Acquire {
        /// How many permits the semaphore has (for this acquisition: a changed count applies to new
        /// acquisitions only).
        permits: u32,
    },
    /// Read/write lock, reader side: take (or refresh) a shared permit unless a writer holds the lock or
    /// waits for it (an unexpired writer's claim, see [`AcquireExclusive`](Self::AcquireExclusive)); then
    /// [`PermitReply::Full`] with the time until the earliest writer's entry expires.
    AcquireShared,
    /// Read/write lock, writer side: take (or refresh) the exclusive permit if no other permit is held (its
    /// own claim aside), removing its claim; otherwise record (or refresh) this token's **claim** — an entry
    /// that lives `min(claim, ttl)` and holds new readers off, so that readers cannot starve a waiting
    /// writer — and answer [`PermitReply::Full`] with the time until the earliest blocking permit expires or
    /// the claim does, whichever is sooner (so a waiting writer tries again, refreshing its claim, before it
    /// lapses). A claim is removed by the writer's acquisition or release, or expires by itself.
    ///
    /// With `fence`, the acquisition is **fenced**: in the same atomic step that grants the exclusive permit,
    /// the counter at `fence` is incremented and its new value answered as [`PermitReply::Fenced`]; a refresh
    /// by the token that already holds it answers the counter's current value without incrementing (as
    /// [`RedisNode::acquire_fenced`](crate::RedisNode::acquire_fenced) does). A blocked attempt never touches the counter. The counter is
    /// checked before the first write, with [`acquire_fenced`](crate::RedisNode::acquire_fenced)'s rules (a
    /// non-negative integer without a TTL, not exhausted; a [`NodeErrorKind::Fence`](crate::NodeErrorKind::Fence) error otherwise), and
    /// must share the lock key's Redis Cluster slot.
    AcquireExclusive {
        /// How long a claim lives unless refreshed.
        claim: Ttl,
        /// The fence counter's key, for a fenced writer (`None`: not fenced).
        fence: Option<&'a str>,
    },
    /// Fair lock: take (or refresh) the lock if nobody holds it and `token` is first in the queue of waiters
    /// (or the queue is empty), leaving the queue; otherwise join the queue at its end (or refresh its place:
    /// an entry lives `min(claim, ttl)` unless refreshed) and answer [`PermitReply::Full`] with the time until
    /// the holder's or the head's entry expires, or this entry does, whichever is sooner. A queue of `queue`
    /// waiters is full: a new waiter is refused with [`NodeErrorKind::Busy`](crate::NodeErrorKind::Busy) (changing nothing).
    AcquireFair {
        /// How long a waiter's place lives unless refreshed.
        claim: Ttl,
        /// The most waiters the queue holds.
        queue: u32,
    },
    /// Refresh a held permit.
    Extend,
    /// Give a permit back.
    Release,
}

impl<'a> PermitOp<'a> {
    /// The fence counter's key of a fenced writer's acquisition ([`AcquireExclusive`](Self::AcquireExclusive)
    /// with `fence`); `None` for every other operation.
    pub fn fence_key(&self) -> Option<&'a str> {
        match self {
            Self::AcquireExclusive { fence, .. } => *fence,
            _ => None,
        }
    }

    /// This operation without its fence key, borrowing nothing (a wrapper that keeps a request past its
    /// caller keeps [`fence_key`](Self::fence_key) on its own and puts it back with
    /// [`with_fence`](PermitOp::with_fence)).
    pub fn unfenced(self) -> PermitOp<'static> {
        match self {
            Self::Acquire { permits } => PermitOp::Acquire { permits },
            Self::AcquireShared => PermitOp::AcquireShared,
            Self::AcquireExclusive { claim, .. } => {
                PermitOp::AcquireExclusive { claim, fence: None }
            }
            Self::AcquireFair { claim, queue } => PermitOp::AcquireFair { claim, queue },
            Self::Extend => PermitOp::Extend,
            Self::Release => PermitOp::Release,
        }
    }
}

impl PermitOp<'static> {
    /// This operation fenced by the counter at `fence` when it is a writer's acquisition
    /// ([`AcquireExclusive`](Self::AcquireExclusive)); any other operation unchanged.
    pub fn with_fence(self, fence: Option<&str>) -> PermitOp<'_> {
        match self {
            Self::AcquireExclusive { claim, .. } => PermitOp::AcquireExclusive { claim, fence },
            other => other,
        }
    }
}

/// The answer of [`RedisNode::permit`](crate::RedisNode::permit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PermitReply {
    /// Taken, refreshed or released.
    Done,
    /// [`PermitOp::Acquire`]: every permit is held; the earliest expires in `next_expiry` (`None`: unknown).
    Full {
        /// Time until the earliest permit expires, by the server's clock.
        next_expiry: Option<Duration>,
    },
    /// [`PermitOp::Extend`] or [`PermitOp::Release`]: `token` holds no unexpired permit.
    NotHeld,
    /// A fenced [`PermitOp::AcquireExclusive`]: taken (or refreshed) with this fencing token.
    Fenced {
        /// The fence counter's value after the grant (for a refresh: its current value).
        fence: u64,
    },
}

/// One lease's part of a batched extension ([`RedisNode::extend_many`](crate::RedisNode::extend_many)).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ExtendItem<'a> {
    /// The lock key.
    pub key: &'a str,
    /// The lease's token.
    pub token: &'a Token,
    /// The TTL to extend to (at least: a longer TTL the key has is kept).
    pub ttl: Ttl,
    /// The item extends `token`'s **permit** in the semaphore, read/write or fair lock at `key`, exactly as
    /// [`RedisNode::permit`](crate::RedisNode::permit) with [`PermitOp::Extend`] (`true` for [`PermitReply::Done`]), not a lock key.
    pub permit: bool,
}

impl<'a> ExtendItem<'a> {
    /// An item extending `key`, if it holds `token`, to `ttl`.
    pub fn new(key: &'a str, token: &'a Token, ttl: Ttl) -> Self {
        Self {
            key,
            token,
            ttl,
            permit: false,
        }
    }

    /// This item as the extension of `token`'s permit at `key` (see [`permit`](Self::permit)).
    #[must_use]
    pub fn for_permit(mut self) -> Self {
        self.permit = true;
        self
    }
}

/// What a node is, as opposed to what it does ([`RedisNode::profile`](crate::RedisNode::profile)): read once
/// when a manager is built. New facts are added as fields (`#[non_exhaustive]`), each defaulting to "unknown"
/// or "not supported", so a node written for an older version keeps compiling and keeps its behaviour.
///
/// ```
/// use redlease::NodeProfile;
///
/// let profile = NodeProfile::new()
///     .with_endpoint("redis://10.0.0.5:6379/0")
///     .with_fresh_is_nx(true)
///     .with_batch_limit(100);
/// assert_eq!(profile.endpoint.as_deref(), Some("redis://10.0.0.5:6379/0"));
/// assert!(profile.fresh_is_nx && profile.batch_limit == 100);
/// assert_eq!(NodeProfile::default(), NodeProfile::new());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeProfile {
    /// A stable identity of the server behind the node (e.g. `redis://10.0.0.5:6379/0`), used to reject a
    /// Redlock topology that names one server twice and to name the node in reports. `None` (the default)
    /// when unknown.
    pub endpoint: Option<String>,
    /// Whether a [fresh](ClaimRequest::fresh) [`claim`](crate::RedisNode::claim) never changes a key that
    /// exists — not even one holding this token — as a plain `SET NX` does. The default `claim` (which calls
    /// `acquire`) resets the TTL of a key holding the token, so the default is `false`.
    ///
    /// The core uses it for late requests: a fresh request that lands after a later round extended the key
    /// with a longer TTL cannot shorten it when this is `true`, so such a node still counts for that
    /// extension. Say `true` only if a fresh `claim` really is a plain `SET key token NX PX ttl` (with or
    /// without [`wants_ttl`](ClaimRequest::wants_ttl)).
    pub fresh_is_nx: bool,
    /// The most items [`extend_many`](crate::RedisNode::extend_many) takes in one call; 0 (the default) when
    /// the node cannot extend a batch.
    pub batch_limit: usize,
}

impl NodeProfile {
    /// A profile that knows nothing (the default).
    pub fn new() -> Self {
        Self::default()
    }

    /// With the server's identity.
    #[must_use]
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// With whether a fresh `claim` is a plain `SET NX` (see [`fresh_is_nx`](Self::fresh_is_nx)).
    #[must_use]
    pub fn with_fresh_is_nx(mut self, nx: bool) -> Self {
        self.fresh_is_nx = nx;
        self
    }

    /// With the most items `extend_many` takes in one call (0: none).
    #[must_use]
    pub fn with_batch_limit(mut self, limit: usize) -> Self {
        self.batch_limit = limit;
        self
    }
}
