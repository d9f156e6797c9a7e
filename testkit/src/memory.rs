//! An in-memory [`RedisNode`] with Redis semantics for redlease's operations.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redlease::notify::{self, Inbox, Notifier, SubscribeFuture, Subscriber};
use redlease::{
    Claim, ClaimRequest, CommandPaths, ExtendItem, KeyState, MultiKeyItem, MultiKeyOp,
    MultiKeyReply, NodeError, NodeErrorKind, NodeProfile, Path, PermitOp, PermitReply, Readiness,
    RedisNode, ReplicaWait, RunId, SystemTimer, Timer, Token, Ttl, async_trait,
};

static NEXT_NODE: AtomicU64 = AtomicU64::new(1);
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Clone)]
struct Entry {
    value: Vec<u8>,
    expires_at: Option<Instant>,
}

/// One entry of a semaphore or read/write lock ([`RedisNode::permit`]).
#[derive(Debug, Clone)]
struct Permit {
    token: Vec<u8>,
    expires_at: Instant,
    role: Role,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A semaphore's permit.
    Permit,
    /// A reader's share.
    Shared,
    /// The writer's lock.
    Exclusive,
    /// A waiting writer's claim: holds new readers off.
    Claim,
}

#[derive(Default)]
struct Store {
    keys: HashMap<String, Entry>,
    /// Subscribed channels: the subscriber connections (by id) and where each delivers.
    subs: HashMap<String, Vec<(u64, Inbox)>>,
    /// Messages published so far.
    published: u64,
    /// Restarts so far: part of the run id.
    runs: u64,
    /// When the last restart happened, on the node's clock.
    restarted_at: Option<Instant>,
    /// What `wait_replicas` answers (see [`MemoryNode::set_replicas`]).
    replicas: Option<u32>,
    /// Leased semaphores: per key, each permit's token value and expiry (a sorted set scored by expiry on
    /// the node's clock, in the adapters).
    permits: HashMap<String, Vec<Permit>>,
    /// Whether a waiter marker was ever written here: until one is, a release need not build its key's
    /// marker name to know that none lives (the uncontended hot path allocates nothing for it).
    marked: bool,
}

impl Store {
    /// The live entry under `key`, removing it if it has expired (Redis' lazy expiry).
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        let expired = self
            .keys
            .get(key)
            .is_some_and(|e| e.expires_at.is_some_and(|at| now >= at));
        if expired {
            self.keys.remove(key);
        }
        self.keys.get_mut(key)
    }

    /// Marks `key`'s waiter marker ([`notify::waiting_key`]) as the adapters' scripts do for an attempt that
    /// found the key held or its permits blocking: to live at least `wait` (the holder's remaining TTL or
    /// the reported wait; `ttl` when there is none) plus [`WAITING_MARGIN_MS`](notify::WAITING_MARGIN_MS),
    /// never shortening it. A key without a marker (no valid hash tag but a `}`) marks nothing.
    fn mark_waiting(
        &mut self,
        clock: &NodeClock,
        key: &str,
        now: Instant,
        wait: Option<Duration>,
        ttl: Ttl,
    ) {
        let Some(marker) = notify::waiting_key(key) else {
            return;
        };
        let hold = wait
            .unwrap_or(ttl.as_duration())
            .saturating_add(Duration::from_millis(notify::WAITING_MARGIN_MS));
        let until = clock.expiry(now, hold);
        let longer = match self.live(&marker, now) {
            // `PTTL` -1 (no expiry) is shorter than any hold, as the scripts compare it.
            Some(e) => e
                .expires_at
                .is_none_or(|at| until.is_some_and(|new| new > at)),
            None => true,
        };
        if longer {
            self.marked = true;
            self.keys.insert(
                marker,
                Entry {
                    value: b"1".to_vec(),
                    expires_at: until,
                },
            );
        }
    }

    /// Whether a release of `key` publishes: its waiter marker lives (a key without one: always), as the
    /// adapters' release scripts check after their delete.
    fn listening(&mut self, key: &str, now: Instant) -> bool {
        if !self.marked && !key.contains('}') {
            // A key without `}` has a marker (`notify::waiting_key`), and no marker was ever written.
            return false;
        }
        notify::waiting_key(key).is_none_or(|m| self.live(&m, now).is_some())
    }
}

/// An in-memory Redis stand-in that implements the [`RedisNode`] contracts exactly, on an injectable clock.
///
/// Keys expire when the node's [`Timer`] reaches their deadline (`now >= expires_at`), like Redis' `PX`. An
/// extension, and the own-token branch of an acquisition, never shorten a key (`PEXPIRE … GT`, as the
/// contract asks): a key keeps the longest TTL any of its holder's requests set.
/// Clones share one store: keep a clone to plant foreign values or inspect keys while a manager owns another.
/// Every node created by [`new`](Self::new)/[`with_timer`](Self::with_timer) reports a distinct
/// [endpoint](redlease::NodeProfile::endpoint) (`memory://N`), shared by its clones, and a [`run_id`](RedisNode::run_id)
/// that changes with every [`restart`](Self::restart). It has no replicas unless
/// [`set_replicas`](Self::set_replicas) says how many acknowledge.
///
/// ```
/// use std::time::Duration;
/// use redlease::{Config, Error, LockManager, NotAcquiredReason};
/// use redlease_testkit::{MemoryNode, Sim};
///
/// let mut sim = Sim::new(1);
/// let node = MemoryNode::with_timer(sim.clock()); // keys expire on the simulation's clock
/// let manager = sim.single(node.clone(), Config::default().with_attempts(1))?;
/// let lock = manager.lock("job").expiry(Duration::from_secs(10));
///
/// // Another owner holds the key: contention, and the foreign value is left alone.
/// node.set("job", "someone-else", Some(Duration::from_secs(5)));
/// let err = sim.block_on(lock.try_acquire()).unwrap_err();
/// assert!(matches!(err, Error::NotAcquired { reason: NotAcquiredReason::Contended, .. }));
/// assert_eq!(node.get("job").as_deref(), Some(&b"someone-else"[..]));
///
/// // Five virtual seconds later the foreign key has expired; ours carries the lease's TTL.
/// sim.run_for(Duration::from_secs(5));
/// let lease = sim.block_on(lock.try_acquire())?;
/// assert_eq!(node.get("job").as_deref(), Some(lease.token().as_str().as_bytes()));
/// assert_eq!(node.pttl("job"), Some(Some(Duration::from_secs(10))));
/// sim.block_on(lease.release())?;
/// assert_eq!(node.keys(), Vec::<String>::new());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Release notifications
///
/// A release that deletes the key publishes [`notify::payload`] on [`notify::channel`] of the key, like the
/// adapters' release scripts, to every subscriber connection of the store, but only while the key's waiter
/// marker ([`notify::waiting_key`], a key of this store) lives; [`del`](Self::del) and expiry publish nothing
/// (a release by a client that does not publish). The marker is kept as the adapters keep it: a
/// [`claim`](RedisNode::claim) that [wants the holder's TTL](ClaimRequest::wants_ttl) (a waiting
/// acquisition's attempt) or an [`acquire_fenced`](RedisNode::acquire_fenced) that finds the key held marks
/// it, in the same step, to live the holder's remaining TTL (the attempt's TTL for a key without expiry) plus
/// [`WAITING_MARGIN_MS`](notify::WAITING_MARGIN_MS), never shortening it; a permit acquisition the permits
/// block (a semaphore's, a read/write or fair lock's: [`RedisNode::permit`]) marks it to live its reported
/// wait plus the margin. Nothing deletes it. So a release nobody waits for publishes nothing — a plain
/// release, each key of a [multi-key](RedisNode::multi_key) release, and a permit's release alike.
///
/// The node's [`Notifier`] is shared by its clones (one subscriber connection, as a client's);
/// [`client`](Self::client) gives another client of the same store, with its own. [`numsub`](Self::numsub)
/// and [`subscriber_connections`](Self::subscriber_connections) show what the "server" holds.
///
/// ```
/// use redlease::{Config, LockManager};
/// use redlease_testkit::MemoryNode;
/// let node = MemoryNode::new();
/// let manager = LockManager::single(node.clone(), Config::default()).unwrap();
/// # let _ = manager;
/// assert_eq!(node.subscriber_connections(), 0, "nothing subscribed while nobody waits");
/// ```
#[derive(Clone)]
pub struct MemoryNode {
    store: Arc<Mutex<Store>>,
    clock: Arc<NodeClock>,
    id: u64,
    notifier: Option<Notifier>,
}

/// The subscriber connection of one [`MemoryNode`] client.
struct MemorySubscriber {
    store: Arc<Mutex<Store>>,
    /// The open connection's id (0: none).
    connection: Arc<AtomicU64>,
}

impl MemorySubscriber {
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Subscriber for MemorySubscriber {
    fn subscribe(&self, inbox: Inbox, channel: &str) -> SubscribeFuture {
        let (store, connection, channel) = (
            Arc::clone(&self.store),
            Arc::clone(&self.connection),
            channel.to_owned(),
        );
        Box::pin(async move {
            let mut id = connection.load(Ordering::SeqCst);
            if id == 0 {
                id = NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed);
                connection.store(id, Ordering::SeqCst);
            }
            let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
            let subs = store.subs.entry(channel).or_default();
            subs.retain(|(c, _)| *c != id);
            subs.push((id, inbox));
            Ok(())
        })
    }

    fn unsubscribe(&self, channel: &str) -> SubscribeFuture {
        let (store, connection, channel) = (
            Arc::clone(&self.store),
            Arc::clone(&self.connection),
            channel.to_owned(),
        );
        Box::pin(async move {
            let id = connection.load(Ordering::SeqCst);
            let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(subs) = store.subs.get_mut(&channel) {
                subs.retain(|(c, _)| *c != id);
                if subs.is_empty() {
                    store.subs.remove(&channel);
                }
            }
            Ok(())
        })
    }

    fn close(&self) {
        let id = self.connection.swap(0, Ordering::SeqCst);
        if id == 0 {
            return;
        }
        let mut store = self.lock();
        store.subs.retain(|_, subs| {
            subs.retain(|(c, _)| *c != id);
            !subs.is_empty()
        });
    }
}

impl fmt::Debug for MemoryNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemoryNode(memory://{})", self.id)
    }
}

impl Default for MemoryNode {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryNode {
    /// A node on the system clock.
    pub fn new() -> Self {
        Self::with_timer(SystemTimer)
    }

    /// A node whose keys expire by `timer`'s clock (e.g. a [`VirtualClock`](crate::VirtualClock), or a
    /// [`SkewedClock`](crate::SkewedClock) for a node whose clock runs fast or slow).
    pub fn with_timer(timer: impl Timer) -> Self {
        let store: Arc<Mutex<Store>> = Arc::default();
        Self {
            notifier: Some(Self::notifier_for(&store)),
            store,
            clock: Arc::new(NodeClock {
                timer: Arc::new(timer),
                offset_ns: AtomicI64::new(0),
                ms_epoch: Mutex::new(None),
                shortening: AtomicBool::new(false),
            }),
            id: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
        }
    }

    fn notifier_for(store: &Arc<Mutex<Store>>) -> Notifier {
        Notifier::new(
            MemorySubscriber {
                store: Arc::clone(store),
                connection: Arc::default(),
            },
            notify::DEFAULT_MAX_CHANNELS,
        )
    }

    /// Another client of the same store (same keys, same endpoint) with a subscriber connection of its own.
    pub fn client(&self) -> Self {
        Self {
            notifier: Some(Self::notifier_for(&self.store)),
            ..self.clone()
        }
    }

    /// This node with a channel budget of `max_channels` for its notifier (a new subscriber connection).
    pub fn with_max_channels(self, max_channels: usize) -> Self {
        Self {
            notifier: Some(Notifier::new(
                MemorySubscriber {
                    store: Arc::clone(&self.store),
                    connection: Arc::default(),
                },
                max_channels,
            )),
            ..self
        }
    }

    /// This node without release notifications (as a custom node that does not implement them): its
    /// [`notifier`](RedisNode::notifier) is `None`, so waiting acquisitions poll it. Releases still publish.
    pub fn without_notifications(self) -> Self {
        Self {
            notifier: None,
            ..self
        }
    }

    /// Subscriber connections subscribed to `channel` now (`PUBSUB NUMSUB`).
    pub fn numsub(&self, channel: &str) -> usize {
        self.lock().subs.get(channel).map_or(0, Vec::len)
    }

    /// Channels with at least one subscriber now (`PUBSUB CHANNELS`).
    pub fn subscribed_channels(&self) -> usize {
        self.lock().subs.len()
    }

    /// Distinct subscriber connections with at least one subscription now (`CLIENT LIST` with `sub>0`).
    pub fn subscriber_connections(&self) -> usize {
        let store = self.lock();
        let mut ids: Vec<u64> = store.subs.values().flatten().map(|(c, _)| *c).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    /// Messages published so far (by releases that deleted their key or removed a permit while its waiter
    /// marker lived).
    pub fn published(&self) -> u64 {
        self.lock().published
    }

    /// Publishes a release of `key` by `token` to every subscriber (what a release that deleted does).
    fn publish(&self, key: &str, token: &Token) {
        let (channel, inboxes): (String, Vec<Inbox>) = {
            let mut store = self.lock();
            store.published += 1;
            if store.subs.is_empty() {
                // Nobody subscribed to anything: no channel name to build.
                return;
            }
            let channel = notify::channel(key);
            let inboxes = store
                .subs
                .get(&channel)
                .map(|subs| subs.iter().map(|(_, inbox)| inbox.clone()).collect())
                .unwrap_or_default();
            (channel, inboxes)
        };
        let payload = notify::payload(token);
        for inbox in inboxes {
            inbox.deliver(channel.as_bytes(), payload.as_bytes());
        }
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node's clock now: its timer's reading moved by the [steps](Self::step_clock_forward) so far.
    fn now(&self) -> Instant {
        self.clock.now()
    }

    /// What [`run_id`](RedisNode::run_id) answers for the server run `store` is in, at `now`.
    fn run_id_of(&self, store: &Store, now: Instant) -> RunId {
        let id = RunId::new(format!("memory-{}-run-{}", self.id, store.runs));
        match store.restarted_at {
            Some(at) => id.with_restarted_ago(now.saturating_duration_since(at)),
            None => id,
        }
    }

    /// Steps the node's clock `by` forward, as an NTP step or an operator does to a server's wall clock
    /// (which is what Redis expires keys by): every key's remaining time shrinks by `by` at once. Clones
    /// share the clock. Only the node's expiry clock moves, not its timer.
    ///
    /// A forward step expires keys early, so no client can prevent a second holder once the step exceeds
    /// what its drift allowance leaves (see `core/tests/sim/clock_jump.rs`); a step back only keeps keys
    /// longer.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlease_testkit::{MemoryNode, VirtualClock};
    ///
    /// let clock = VirtualClock::new();
    /// let node = MemoryNode::with_timer(clock.clone());
    /// node.set("k", "v", Some(Duration::from_secs(10)));
    /// node.step_clock_back(Duration::from_secs(5));
    /// assert_eq!(node.pttl("k"), Some(Some(Duration::from_secs(15))));
    /// node.step_clock_forward(Duration::from_secs(15));
    /// assert_eq!(node.get("k"), None, "expired by the node's clock, without the timer moving");
    /// ```
    pub fn step_clock_forward(&self, by: Duration) {
        self.clock
            .step(i64::try_from(by.as_nanos()).unwrap_or(i64::MAX));
    }

    /// Steps the node's clock `by` back (see [`step_clock_forward`](Self::step_clock_forward)): every key's
    /// remaining time grows by `by`.
    pub fn step_clock_back(&self, by: Duration) {
        self.clock
            .step(-i64::try_from(by.as_nanos()).unwrap_or(i64::MAX));
    }

    /// The sum of the clock steps so far (forward minus back), and whether it is forward.
    pub fn clock_steps(&self) -> (Duration, bool) {
        let ns = self.clock.offset_ns.load(Ordering::SeqCst);
        (Duration::from_nanos(ns.unsigned_abs()), ns >= 0)
    }

    /// This node (and its clones) with Redis' millisecond expiry: the node keeps a clock of whole
    /// milliseconds (its own clock's reading truncated, counted from an epoch `phase` before now, so that
    /// the millisecond ticks need not line up with the clients' clock), a TTL sets the expiry to *that
    /// millisecond + TTL*, and a key is expired once the millisecond clock is past it — as `SET … PX`,
    /// `PEXPIRE` and Redis' `keyIsExpired` (`now > when`) do. So a key lives a little longer than its TTL
    /// (up to 1 ms), and `PTTL` (and the remaining TTL reported on contention) is the whole milliseconds left,
    /// 0 in a key's last millisecond. Without it, keys expire exactly their TTL after they were written.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlease_testkit::{MemoryNode, VirtualClock};
    ///
    /// let clock = VirtualClock::new();
    /// let node = MemoryNode::with_timer(clock.clone()).with_millisecond_expiry(Duration::from_micros(400));
    /// // Written 0.4 ms into the node's current millisecond: expiry at that millisecond + 10.
    /// node.set("k", "v", Some(Duration::from_millis(10)));
    /// clock.advance(Duration::from_micros(9_700)); // 10.1 ms into the millisecond count: the 10th, alive
    /// assert_eq!(node.pttl("k"), Some(Some(Duration::ZERO)));
    /// clock.advance(Duration::from_micros(899));
    /// assert!(node.get("k").is_some(), "10.999 ms: still the 10th millisecond");
    /// clock.advance(Duration::from_micros(1));
    /// assert_eq!(node.get("k"), None, "10.6 ms after it was written");
    /// ```
    #[must_use]
    pub fn with_millisecond_expiry(self, phase: Duration) -> Self {
        let now = self.now();
        let epoch = now
            .checked_sub(Duration::from_nanos(u64::from(
                phase.subsec_nanos() % 1_000_000,
            )))
            .unwrap_or(now);
        *self
            .clock
            .ms_epoch
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(epoch);
        self
    }

    /// `SET key value [PX ttl]`, overwriting whatever is there (to plant a foreign owner in tests).
    pub fn set(&self, key: &str, value: impl Into<Vec<u8>>, ttl: Option<Duration>) {
        let now = self.now();
        let expires_at = ttl.and_then(|ttl| self.clock.expiry(now, ttl));
        let mut store = self.lock();
        // A planted waiter marker counts as one written.
        store.marked |= key.starts_with(notify::WAITING_PREFIX);
        store.keys.insert(
            key.to_owned(),
            Entry {
                value: value.into(),
                expires_at,
            },
        );
    }

    /// `DEL key`; `true` if a live key was deleted.
    pub fn del(&self, key: &str) -> bool {
        let now = self.now();
        let mut store = self.lock();
        let live = store.live(key, now).is_some();
        store.keys.remove(key);
        live
    }

    /// `GET key`.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let now = self.now();
        self.lock().live(key, now).map(|e| e.value.clone())
    }

    /// `PTTL key`: `None` if the key is missing, `Some(None)` if it has no expiry.
    pub fn pttl(&self, key: &str) -> Option<Option<Duration>> {
        let now = self.now();
        self.lock()
            .live(key, now)
            .map(|e| e.expires_at.map(|at| self.clock.remaining(at, now)))
    }

    /// Live keys that have no expiry (only fence counters should appear here).
    pub fn keys_without_ttl(&self) -> Vec<String> {
        let now = self.now();
        let mut store = self.lock();
        let names: Vec<String> = store.keys.keys().cloned().collect();
        names
            .into_iter()
            .filter(|k| store.live(k, now).is_some_and(|e| e.expires_at.is_none()))
            .collect()
    }

    /// Names of all live keys, sorted.
    pub fn keys(&self) -> Vec<String> {
        let now = self.now();
        let mut store = self.lock();
        let names: Vec<String> = store.keys.keys().cloned().collect();
        let mut live: Vec<String> = names
            .into_iter()
            .filter(|k| store.live(k, now).is_some())
            .collect();
        live.sort();
        live
    }

    /// `FLUSHALL`: forgets every key, fence counters included (like a restart without persistence).
    pub fn flush(&self) {
        self.lock().keys.clear();
    }

    /// A restart without persistence: every key is forgotten, every subscriber connection is dropped (its
    /// notifier subscribes again) and the [`run_id`](RedisNode::run_id) changes. From then on the run id
    /// also tells how long ago the restart was ([`RunId::restarted_ago`], as a server's uptime tells), so a
    /// manager that first meets the node after the restart still quarantines it.
    pub fn restart(&self) {
        let now = self.now();
        let lost: Vec<Inbox> = {
            let mut store = self.lock();
            store.keys.clear();
            store.permits.clear();
            store.runs += 1;
            store.restarted_at = Some(now);
            // Every connection is gone, subscriber connections too.
            std::mem::take(&mut store.subs)
                .into_values()
                .flatten()
                .map(|(_, inbox)| inbox)
                .collect()
        };
        for inbox in lost {
            inbox.lost();
        }
    }

    /// How many replicas acknowledge every write from now on: [`wait_replicas`](RedisNode::wait_replicas)
    /// answers `min(n, asked)` at once. `None` (the default) makes it answer
    /// [`NodeErrorKind::Unsupported`], like a node without the capability.
    pub fn set_replicas(&self, n: Option<u32>) {
        self.lock().replicas = n;
    }

    /// With `true`, this node (every clone and [`client`](Self::client) of it) breaks the node contract's
    /// never-shorten rule on purpose: an extension of a live key holding the caller's token — `extend`,
    /// `extend_many`, a set's joint extension, the own-token branch of an acquisition — sets its expiry to
    /// exactly the asked TTL from now, as a plain `PEXPIRE` would, even when that is earlier than the one it
    /// has. A late or duplicated shorter extension then really shortens the key, which shows whether the
    /// core itself keeps a lease safe from one (it does not count a node where a shorter extension may
    /// still land).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlease::{RedisNode, Token, Ttl};
    /// use redlease_testkit::MemoryNode;
    ///
    /// # redlease_testkit::block_on(async {
    /// let node = MemoryNode::new();
    /// let token = Token::random().unwrap();
    /// let ttl = |s| Ttl::from_duration(Duration::from_secs(s)).unwrap();
    /// assert!(node.acquire("k", &token, ttl(30)).await.unwrap());
    /// assert!(node.extend("k", &token, ttl(5)).await.unwrap());
    /// assert!(node.pttl("k").flatten().unwrap() > Duration::from_secs(20), "never shortened");
    /// node.set_shortening_extensions(true);
    /// assert!(node.extend("k", &token, ttl(5)).await.unwrap());
    /// assert!(node.pttl("k").flatten().unwrap() <= Duration::from_secs(5), "shortened");
    /// # });
    /// ```
    pub fn set_shortening_extensions(&self, on: bool) {
        self.clock.shortening.store(on, Ordering::Relaxed);
    }
}

/// The number a fence counter holds (`None`: missing), or the error the fenced acquisition script gives for
/// a counter with a TTL or a value that is not a non-negative integer.
fn fence_value(entry: Option<&Entry>) -> Result<Option<u64>, NodeError> {
    let Some(entry) = entry else {
        return Ok(None);
    };
    if entry.expires_at.is_some() {
        return Err(NodeError::not_applied(
            NodeErrorKind::Fence,
            "the fence key has a TTL: its numbers would start again when it expires",
        ));
    }
    std::str::from_utf8(&entry.value)
        .ok()
        .filter(|s| *s == "0" || (!s.starts_with('0') && s.bytes().all(|b| b.is_ascii_digit())))
        .and_then(|s| s.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| {
            NodeError::not_applied(
                NodeErrorKind::Fence,
                "the fence key does not hold a non-negative integer",
            )
        })
}

/// A node's clock: what its keys expire by.
struct NodeClock {
    timer: Arc<dyn Timer>,
    /// The sum of the clock steps so far, in nanoseconds (negative: back).
    offset_ns: AtomicI64,
    /// With millisecond expiry, the instant its millisecond clock counts from.
    ms_epoch: Mutex<Option<Instant>>,
    /// Extensions are plain `PEXPIRE`s ([`MemoryNode::set_shortening_extensions`]).
    shortening: AtomicBool,
}

/// `base` moved by `ns` nanoseconds (either way), as far as `Instant` allows.
fn shift(base: Instant, ns: i128) -> Instant {
    let by = Duration::from_nanos(u64::try_from(ns.unsigned_abs()).unwrap_or(u64::MAX));
    if ns >= 0 {
        base.checked_add(by).unwrap_or(base)
    } else {
        base.checked_sub(by).unwrap_or(base)
    }
}

/// `a − b` in nanoseconds, signed.
fn signed_ns(a: Instant, b: Instant) -> i128 {
    if a >= b {
        (a - b).as_nanos() as i128
    } else {
        -((b - a).as_nanos() as i128)
    }
}

const NS_PER_MS: i128 = 1_000_000;

impl NodeClock {
    fn now(&self) -> Instant {
        shift(
            self.timer.now(),
            i128::from(self.offset_ns.load(Ordering::SeqCst)),
        )
    }

    fn step(&self, ns: i64) {
        let _ = self
            .offset_ns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |o| {
                Some(o.saturating_add(ns))
            });
    }

    fn epoch(&self) -> Option<Instant> {
        *self.ms_epoch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When a key written at `now` with `ttl` expires: `now + ttl`, or with millisecond expiry the start of
    /// the millisecond after *now's millisecond + ttl* (`keyIsExpired`: `now > when`).
    fn expiry(&self, now: Instant, ttl: Duration) -> Option<Instant> {
        let Some(epoch) = self.epoch() else {
            return now.checked_add(ttl);
        };
        let now_ms = signed_ns(now, epoch).div_euclid(NS_PER_MS);
        let when = now_ms + ttl.as_millis() as i128;
        Some(shift(epoch, (when + 1) * NS_PER_MS))
    }

    /// A live key's `PTTL` at `now`, for a key expiring at `at`: what is left, or with millisecond expiry the
    /// whole milliseconds from now's millisecond to the key's last one.
    fn remaining(&self, at: Instant, now: Instant) -> Duration {
        let Some(epoch) = self.epoch() else {
            return at.saturating_duration_since(now);
        };
        let when = signed_ns(at, epoch).div_euclid(NS_PER_MS) - 1;
        let now_ms = signed_ns(now, epoch).div_euclid(NS_PER_MS);
        Duration::from_millis(u64::try_from(when - now_ms).unwrap_or(0))
    }

    fn expiry_ttl(&self, now: Instant, ttl: Ttl) -> Option<Instant> {
        self.expiry(now, ttl.as_duration())
    }

    /// `PEXPIRE key ttl GT` on a live entry holding the caller's token: its expiry becomes the later of the
    /// one it has and `ttl` from `now` (an extension never shortens a key; a key without expiry keeps none,
    /// as with `GT`).
    fn extend(&self, entry: &mut Entry, now: Instant, ttl: Ttl) {
        if let Some(at) = entry.expires_at {
            let new = self.expiry_ttl(now, ttl);
            entry.expires_at = Some(if self.shortening.load(Ordering::Relaxed) {
                new.unwrap_or(now)
            } else {
                new.map_or(at, |new| new.max(at))
            });
        }
    }
}

#[async_trait]
impl RedisNode for MemoryNode {
    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        let now = self.now();
        let mut store = self.lock();
        match store.live(key, now) {
            Some(entry) if token.matches(&entry.value) => {
                self.clock.extend(entry, now, ttl);
                Ok(true)
            }
            Some(_) => Ok(false),
            None => {
                store.keys.insert(
                    key.to_owned(),
                    Entry {
                        value: token.as_str().as_bytes().to_vec(),
                        expires_at: self.clock.expiry_ttl(now, ttl),
                    },
                );
                Ok(true)
            }
        }
    }

    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError> {
        let now = self.now();
        let mut store = self.lock();
        // Validate everything before any write, as the Lua script does: an error never leaves a lock behind.
        let fence = fence_value(store.live(fence_key, now).as_deref())?;
        if fence.is_some_and(|f| f >= i64::MAX as u64) {
            return Err(NodeError::not_applied(
                NodeErrorKind::Fence,
                "the fence counter is exhausted",
            ));
        }
        match store.live(key, now) {
            Some(entry) if token.matches(&entry.value) => {
                let Some(fence) = fence else {
                    return Err(NodeError::not_applied(
                        NodeErrorKind::Fence,
                        "the fence key is missing while the lock holds this token",
                    ));
                };
                self.clock.extend(entry, now, ttl);
                Ok(Some(fence))
            }
            Some(entry) => {
                // A contended fenced attempt marks the waiter marker, as the adapters' fenced script does.
                let remaining = entry.expires_at.map(|at| self.clock.remaining(at, now));
                store.mark_waiting(&self.clock, key, now, remaining, ttl);
                Ok(None)
            }
            None => {
                let next = fence.unwrap_or(0) + 1;
                // INCR keeps whatever TTL the counter has (normally none).
                let counter = store.keys.entry(fence_key.to_owned()).or_insert(Entry {
                    value: Vec::new(),
                    expires_at: None,
                });
                counter.value = next.to_string().into_bytes();
                store.keys.insert(
                    key.to_owned(),
                    Entry {
                        value: token.as_str().as_bytes().to_vec(),
                        expires_at: self.clock.expiry_ttl(now, ttl),
                    },
                );
                Ok(Some(next))
            }
        }
    }

    async fn raise_fence(&self, fence_key: &str, at_least: u64) -> Result<u64, NodeError> {
        let now = self.now();
        let mut store = self.lock();
        match fence_value(store.live(fence_key, now).as_deref())? {
            Some(current) if current >= at_least => Ok(current),
            _ => {
                store.keys.insert(
                    fence_key.to_owned(),
                    Entry {
                        value: at_least.to_string().into_bytes(),
                        expires_at: None,
                    },
                );
                Ok(at_least)
            }
        }
    }

    /// Compare-and-delete; a deletion publishes the release while the key's waiter marker lives (see the
    /// type's docs).
    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        let now = self.now();
        let (deleted, listening) = {
            let mut store = self.lock();
            let ours = store
                .live(key, now)
                .is_some_and(|e| token.matches(&e.value));
            if ours {
                store.keys.remove(key);
            }
            (ours, ours && store.listening(key, now))
        };
        if listening {
            self.publish(key, token);
        }
        Ok(deleted)
    }

    /// The acquisition in one step: a fresh request is `SET key token NX PX ttl` (the profile says so: it
    /// never changes an existing key), any other the own-token branch of [`acquire`](RedisNode::acquire);
    /// on contention, the holder's remaining TTL when the request [wants it](ClaimRequest::wants_ttl) (as the
    /// adapters' script does), after marking the key's waiter marker in the same step (see the type's docs).
    /// Fills a [run id slot](ClaimRequest::run_id) with what [`run_id`](RedisNode::run_id) would answer,
    /// read under the same lock as the claim (so never an earlier server's).
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, NodeError> {
        let now = self.now();
        let mut store = self.lock();
        if let Some(slot) = req.run_id {
            slot.fill(self.run_id_of(&store, now));
        }
        match store.live(req.key, now) {
            Some(entry) if !req.fresh && req.token.matches(&entry.value) => {
                self.clock.extend(entry, now, req.ttl);
                Ok(Claim::Taken)
            }
            Some(entry) => {
                let remaining = entry.expires_at.map(|at| self.clock.remaining(at, now));
                if !req.wants_ttl {
                    return Ok(Claim::Held { remaining: None });
                }
                store.mark_waiting(&self.clock, req.key, now, remaining, req.ttl);
                Ok(Claim::Held { remaining })
            }
            None => {
                store.keys.insert(
                    req.key.to_owned(),
                    Entry {
                        value: req.token.as_str().as_bytes().to_vec(),
                        expires_at: self.clock.expiry_ttl(now, req.ttl),
                    },
                );
                Ok(Claim::Taken)
            }
        }
    }

    fn notifier(&self) -> Option<&Notifier> {
        self.notifier.as_ref()
    }

    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        let now = self.now();
        let mut store = self.lock();
        match store.live(key, now) {
            Some(entry) if token.matches(&entry.value) => {
                self.clock.extend(entry, now, ttl);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Every item as [`extend`](RedisNode::extend) would (a permit's item as [`permit`](RedisNode::permit)'s
    /// extension), under one lock (one call, one instant).
    async fn extend_many(&self, items: &[ExtendItem<'_>]) -> Result<Vec<bool>, NodeError> {
        let now = self.now();
        let mut store = self.lock();
        Ok(items
            .iter()
            .map(|item| {
                if item.permit {
                    let Some(set) = store.permits.get_mut(item.key) else {
                        return false;
                    };
                    set.retain(|p| p.expires_at > now);
                    let until = now + item.ttl.as_duration();
                    // Never earlier, as `permit`'s extension.
                    let held = set
                        .iter_mut()
                        .find(|p| item.token.matches(&p.token) && p.role != Role::Claim)
                        .map(|p| p.expires_at = p.expires_at.max(until))
                        .is_some();
                    if set.is_empty() {
                        store.permits.remove(item.key);
                    }
                    return held;
                }
                match store.live(item.key, now) {
                    Some(entry) if item.token.matches(&entry.value) => {
                        self.clock.extend(entry, now, item.ttl);
                        true
                    }
                    _ => false,
                }
            })
            .collect())
    }

    /// All items under one lock (one call, one instant), all or nothing, every check before the first write,
    /// as the adapters' script does; a release publishes each deletion while its key's waiter marker lives.
    async fn multi_key(
        &self,
        items: &[MultiKeyItem<'_>],
        op: MultiKeyOp,
    ) -> Result<MultiKeyReply, NodeError> {
        let now = self.now();
        let ttl = match op {
            MultiKeyOp::Release => {
                // Per item: deleted, and whether its deletion publishes (its waiter marker lives).
                let deleted: Vec<(bool, bool)> = {
                    let mut store = self.lock();
                    items
                        .iter()
                        .map(|item| {
                            let ours = store
                                .live(item.key, now)
                                .is_some_and(|e| item.token.matches(&e.value));
                            if ours {
                                store.keys.remove(item.key);
                            }
                            (ours, ours && store.listening(item.key, now))
                        })
                        .collect()
                };
                for (item, (_, listening)) in items.iter().zip(&deleted) {
                    if *listening {
                        self.publish(item.key, item.token);
                    }
                }
                return Ok(MultiKeyReply::Done(
                    deleted.into_iter().map(|(d, _)| d).collect(),
                ));
            }
            MultiKeyOp::Extend { ttl } => {
                let mut store = self.lock();
                return Ok(MultiKeyReply::Done(
                    items
                        .iter()
                        .map(|item| match store.live(item.key, now) {
                            Some(entry) if item.token.matches(&entry.value) => {
                                self.clock.extend(entry, now, ttl);
                                true
                            }
                            _ => false,
                        })
                        .collect(),
                ));
            }
            MultiKeyOp::Acquire { ttl } => ttl,
            _ => {
                return Err(NodeError::not_applied(
                    NodeErrorKind::Unsupported,
                    "MemoryNode: an unknown multi-key operation",
                ));
            }
        };
        let mut store = self.lock();
        // Every check first: the fence counters, then the lock keys (first held key wins).
        let mut fences: Vec<Option<u64>> = Vec::with_capacity(items.len());
        for item in items {
            let fence = match item.fence_key {
                Some(fence_key) => {
                    let fence = fence_value(store.live(fence_key, now).as_deref())?;
                    if fence.is_some_and(|f| f >= i64::MAX as u64) {
                        return Err(NodeError::not_applied(
                            NodeErrorKind::Fence,
                            "the fence counter is exhausted",
                        ));
                    }
                    fence
                }
                None => None,
            };
            fences.push(fence);
        }
        let mut ours = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match store.live(item.key, now) {
                Some(entry) if item.token.matches(&entry.value) => {
                    if item.fence_key.is_some() && fences[i].is_none() {
                        return Err(NodeError::not_applied(
                            NodeErrorKind::Fence,
                            "the fence key is missing while the lock holds this token",
                        ));
                    }
                    ours.push(true);
                }
                Some(entry) => {
                    return Ok(MultiKeyReply::Held {
                        index: i,
                        remaining: entry.expires_at.map(|at| self.clock.remaining(at, now)),
                    });
                }
                None => ours.push(false),
            }
        }
        let mut issued = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if ours[i] {
                if let Some(entry) = store.live(item.key, now) {
                    self.clock.extend(entry, now, ttl);
                }
                issued.push(item.fence_key.and(fences[i]));
                continue;
            }
            let fence = match item.fence_key {
                Some(fence_key) => {
                    let next = fences[i].unwrap_or(0) + 1;
                    let counter = store.keys.entry(fence_key.to_owned()).or_insert(Entry {
                        value: Vec::new(),
                        expires_at: None,
                    });
                    counter.value = next.to_string().into_bytes();
                    Some(next)
                }
                None => None,
            };
            store.keys.insert(
                item.key.to_owned(),
                Entry {
                    value: item.token.as_str().as_bytes().to_vec(),
                    expires_at: self.clock.expiry_ttl(now, ttl),
                },
            );
            issued.push(fence);
        }
        Ok(MultiKeyReply::Taken { fences: issued })
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        let now = self.now();
        Ok(self.lock().live(key, now).map(|e| {
            KeyState::new(
                e.value.clone(),
                e.expires_at.map(|at| self.clock.remaining(at, now)),
            )
        }))
    }

    /// `memory://<id>`, a plain `SET NX` first attempt, batches of up to 1000.
    fn profile(&self) -> NodeProfile {
        NodeProfile::new()
            .with_endpoint(format!("memory://{}", self.id))
            .with_fresh_is_nx(true)
            .with_batch_limit(1000)
    }

    /// The semaphore at `key`, with its node's clock: expired permits purged first, as the adapters' scripts
    /// do in the same step.
    async fn permit(
        &self,
        key: &str,
        token: &Token,
        ttl: Ttl,
        op: PermitOp<'_>,
    ) -> Result<PermitReply, NodeError> {
        let now = self.now();
        // Whether the key's waiter marker lives (a release publishes only then).
        let listening;
        let released = {
            let mut store = self.lock();
            // A fenced writer's counter is checked before any write, as the script does.
            let fence = match op.fence_key() {
                Some(fence_key) => {
                    let fence = fence_value(store.live(fence_key, now).as_deref())?;
                    if fence.is_some_and(|f| f >= i64::MAX as u64) {
                        return Err(NodeError::not_applied(
                            NodeErrorKind::Fence,
                            "the fence counter is exhausted",
                        ));
                    }
                    Some((fence_key, fence))
                }
                None => None,
            };
            let set = store.permits.entry(key.to_owned()).or_default();
            set.retain(|p| p.expires_at > now);
            let until = now + ttl.as_duration();
            let ours = |p: &Permit| token.matches(&p.token);
            let mine = set.iter().position(|p| ours(p) && p.role != Role::Claim);
            let earliest = |set: &[Permit], blocks: &dyn Fn(&Permit) -> bool| {
                set.iter()
                    .filter(|p| blocks(p))
                    .map(|p| p.expires_at - now)
                    .min()
            };
            let add = |set: &mut Vec<Permit>, role| {
                set.push(Permit {
                    token: token.as_str().as_bytes().to_vec(),
                    expires_at: until,
                    role,
                })
            };
            // The writer's fence when `fence` is set: the counter's value for a refresh, incremented for a grant.
            let mut issue = None;
            let reply = match (op, mine) {
                (
                    PermitOp::Acquire { .. }
                    | PermitOp::AcquireShared
                    | PermitOp::AcquireExclusive { .. }
                    | PermitOp::AcquireFair { .. }
                    | PermitOp::Extend,
                    Some(i),
                ) => {
                    if let Some((_, None)) = fence {
                        return Err(NodeError::not_applied(
                            NodeErrorKind::Fence,
                            "the fence key is missing while the writer holds this token",
                        ));
                    }
                    // Never earlier: a late or duplicated shorter request cannot shorten a permit.
                    set[i].expires_at = set[i].expires_at.max(until);
                    PermitReply::Done
                }
                (PermitOp::Acquire { permits }, None) => {
                    if set.len() < permits as usize {
                        add(set, Role::Permit);
                        PermitReply::Done
                    } else {
                        PermitReply::Full {
                            next_expiry: earliest(set, &|_| true),
                        }
                    }
                }
                (PermitOp::AcquireShared, None) => {
                    let writer = |p: &Permit| matches!(p.role, Role::Exclusive | Role::Claim);
                    if set.iter().any(writer) {
                        PermitReply::Full {
                            next_expiry: earliest(set, &writer),
                        }
                    } else {
                        add(set, Role::Shared);
                        PermitReply::Done
                    }
                }
                (PermitOp::AcquireExclusive { claim, .. }, None) => {
                    let blocker = |p: &Permit| p.role != Role::Claim && !ours(p);
                    if set.iter().any(blocker) {
                        let lives = claim.as_duration().min(ttl.as_duration());
                        let next_expiry = earliest(set, &blocker).map(|d| d.min(lives));
                        set.retain(|p| !(ours(p) && p.role == Role::Claim));
                        set.push(Permit {
                            token: token.as_str().as_bytes().to_vec(),
                            expires_at: now + lives,
                            role: Role::Claim,
                        });
                        PermitReply::Full { next_expiry }
                    } else {
                        set.retain(|p| !ours(p));
                        add(set, Role::Exclusive);
                        if let Some((_, current)) = fence {
                            issue = Some(current.unwrap_or(0) + 1);
                        }
                        PermitReply::Done
                    }
                }
                (PermitOp::AcquireFair { claim, queue }, None) => {
                    let holder = |p: &Permit| p.role == Role::Exclusive;
                    let head = set.iter().position(|p| p.role == Role::Claim);
                    let place = set.iter().position(|p| ours(p) && p.role == Role::Claim);
                    if !set.iter().any(holder) && (head.is_none() || head == place) {
                        set.retain(|p| !ours(p));
                        add(set, Role::Exclusive);
                        PermitReply::Done
                    } else {
                        let waiting = set.iter().filter(|p| p.role == Role::Claim).count();
                        if place.is_none() && waiting >= queue as usize {
                            return Err(NodeError::not_applied(
                                NodeErrorKind::Busy,
                                format!("the fair lock's queue is full ({waiting} waiters)"),
                            ));
                        }
                        let lives = claim.as_duration().min(ttl.as_duration());
                        let next = set
                            .iter()
                            .enumerate()
                            .filter(|(i, p)| holder(p) || Some(*i) == head)
                            .map(|(_, p)| p.expires_at - now)
                            .min()
                            .map_or(lives, |d| d.min(lives));
                        match place {
                            Some(i) => set[i].expires_at = now + lives,
                            None => set.push(Permit {
                                token: token.as_str().as_bytes().to_vec(),
                                expires_at: now + lives,
                                role: Role::Claim,
                            }),
                        }
                        PermitReply::Full {
                            next_expiry: Some(next),
                        }
                    }
                }
                (PermitOp::Release, held) => {
                    set.retain(|p| !ours(p));
                    if held.is_some() {
                        PermitReply::Done
                    } else {
                        PermitReply::NotHeld
                    }
                }
                _ => PermitReply::NotHeld,
            };
            if set.is_empty() {
                store.permits.remove(key);
            }
            // The waiter marker (`notify::waiting_key`), as the adapters' permit scripts keep it: a blocked
            // acquisition marks it in this step to outlive its wait by the margin (never shortening it); a
            // release that removed a permit publishes only while it lives. Nothing deletes it.
            if let PermitReply::Full { next_expiry } = reply {
                store.mark_waiting(&self.clock, key, now, next_expiry, ttl);
            }
            listening = store.listening(key, now);
            match (fence, reply) {
                (Some((fence_key, _)), PermitReply::Done) if issue.is_some() => {
                    let next = issue.unwrap_or_default();
                    // INCR keeps whatever TTL the counter has (none: checked above).
                    let counter = store.keys.entry(fence_key.to_owned()).or_insert(Entry {
                        value: Vec::new(),
                        expires_at: None,
                    });
                    counter.value = next.to_string().into_bytes();
                    PermitReply::Fenced { fence: next }
                }
                // A refresh by the holder: the number it was issued (or a larger one), never a new one.
                (Some((_, current)), PermitReply::Done) => PermitReply::Fenced {
                    fence: current.unwrap_or_default(),
                },
                (_, reply) => reply,
            }
        };
        if op == PermitOp::Release && released == PermitReply::Done && listening {
            self.publish(key, token);
        }
        Ok(released)
    }

    /// Ready, with the paths of a Redis 7 server (whose semantics this node has): a first acquisition by
    /// `SET … NX GET`, everything else by script.
    async fn readiness(&self, _key: &str) -> Readiness {
        Readiness::Ready(CommandPaths::scripts().with_acquire(Path::Native))
    }

    /// `memory-<node>-run-<restarts>`, with [`restarted_ago`](RunId::restarted_ago) after a
    /// [`restart`](MemoryNode::restart).
    async fn run_id(&self, _key: &str) -> Result<RunId, NodeError> {
        let now = self.now();
        let store = self.lock();
        Ok(self.run_id_of(&store, now))
    }

    async fn wait_replicas(&self, _key: &str, wait: ReplicaWait) -> Result<u32, NodeError> {
        match self.lock().replicas {
            Some(n) => Ok(n.min(wait.replicas)),
            None => Err(NodeError::not_applied(
                NodeErrorKind::Unsupported,
                "this memory node has no replicas (MemoryNode::set_replicas)",
            )),
        }
    }
}
