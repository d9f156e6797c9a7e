//! An in-memory [`RedisNode`] with Redis semantics for redlease's operations.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redlease::{
    ExtendItem, KeyState, NodeError, NodeErrorKind, RedisNode, ReplicaWait, RunId, SystemTimer,
    Timer, Token, Ttl, async_trait,
};

static NEXT_NODE: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Clone)]
struct Entry {
    value: Vec<u8>,
    expires_at: Option<Instant>,
}

#[derive(Default)]
struct Store {
    keys: HashMap<String, Entry>,
    /// Restarts so far: part of the run id.
    runs: u64,
    /// What `wait_replicas` answers (see [`MemoryNode::set_replicas`]).
    replicas: Option<u32>,
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
}

/// An in-memory Redis stand-in that implements the [`RedisNode`] contracts exactly, on an injectable clock.
///
/// Keys expire when the node's [`Timer`] reaches their deadline (`now >= expires_at`), like Redis' `PX`.
/// Clones share one store: keep a clone to plant foreign values or inspect keys while a manager owns another.
/// Every node created by [`new`](Self::new)/[`with_timer`](Self::with_timer) reports a distinct
/// [`endpoint`](RedisNode::endpoint) (`memory://N`), shared by its clones, and a [`run_id`](RedisNode::run_id)
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
#[derive(Clone)]
pub struct MemoryNode {
    store: Arc<Mutex<Store>>,
    timer: Arc<dyn Timer>,
    id: u64,
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
        Self {
            store: Arc::default(),
            timer: Arc::new(timer),
            id: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> Instant {
        self.timer.now()
    }

    /// `SET key value [PX ttl]`, overwriting whatever is there (to plant a foreign owner in tests).
    pub fn set(&self, key: &str, value: impl Into<Vec<u8>>, ttl: Option<Duration>) {
        let expires_at = ttl.map(|ttl| self.now() + ttl);
        self.lock().keys.insert(
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
            .map(|e| e.expires_at.map(|at| at.saturating_duration_since(now)))
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

    /// A restart without persistence: every key is forgotten and the [`run_id`](RedisNode::run_id) changes.
    pub fn restart(&self) {
        let mut store = self.lock();
        store.keys.clear();
        store.runs += 1;
    }

    /// How many replicas acknowledge every write from now on: [`wait_replicas`](RedisNode::wait_replicas)
    /// answers `min(n, asked)` at once. `None` (the default) makes it answer
    /// [`NodeErrorKind::Unsupported`], like a node without the capability.
    pub fn set_replicas(&self, n: Option<u32>) {
        self.lock().replicas = n;
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

fn expiry(now: Instant, ttl: Ttl) -> Option<Instant> {
    now.checked_add(ttl.as_duration())
}

#[async_trait]
impl RedisNode for MemoryNode {
    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        let now = self.now();
        let mut store = self.lock();
        match store.live(key, now) {
            Some(entry) if token.matches(&entry.value) => {
                entry.expires_at = expiry(now, ttl);
                Ok(true)
            }
            Some(_) => Ok(false),
            None => {
                store.keys.insert(
                    key.to_owned(),
                    Entry {
                        value: token.as_str().as_bytes().to_vec(),
                        expires_at: expiry(now, ttl),
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
                entry.expires_at = expiry(now, ttl);
                Ok(Some(fence))
            }
            Some(_) => Ok(None),
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
                        expires_at: expiry(now, ttl),
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

    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        let now = self.now();
        let mut store = self.lock();
        if store
            .live(key, now)
            .is_some_and(|e| token.matches(&e.value))
        {
            store.keys.remove(key);
            return Ok(true);
        }
        Ok(false)
    }

    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        let now = self.now();
        let mut store = self.lock();
        match store.live(key, now) {
            Some(entry) if token.matches(&entry.value) => {
                entry.expires_at = expiry(now, ttl);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Every item as [`extend`](RedisNode::extend) would, under one lock (one call, one instant).
    async fn extend_many(&self, items: &[ExtendItem<'_>]) -> Result<Vec<bool>, NodeError> {
        let now = self.now();
        let mut store = self.lock();
        Ok(items
            .iter()
            .map(|item| match store.live(item.key, now) {
                Some(entry) if item.token.matches(&entry.value) => {
                    entry.expires_at = expiry(now, item.ttl);
                    true
                }
                _ => false,
            })
            .collect())
    }

    fn extend_many_limit(&self) -> usize {
        1000
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        let now = self.now();
        Ok(self.lock().live(key, now).map(|e| {
            KeyState::new(
                e.value.clone(),
                e.expires_at.map(|at| at.saturating_duration_since(now)),
            )
        }))
    }

    /// `SET key token NX PX ttl`: sets the key if it does not exist, changes nothing if it does.
    async fn acquire_fresh(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        let now = self.now();
        let mut store = self.lock();
        if store.live(key, now).is_some() {
            return Ok(false);
        }
        store.keys.insert(
            key.to_owned(),
            Entry {
                value: token.as_str().as_bytes().to_vec(),
                expires_at: expiry(now, ttl),
            },
        );
        Ok(true)
    }

    fn acquire_fresh_is_nx(&self) -> bool {
        true
    }

    fn endpoint(&self) -> Option<String> {
        Some(format!("memory://{}", self.id))
    }

    async fn run_id(&self, _key: &str) -> Result<RunId, NodeError> {
        let runs = self.lock().runs;
        Ok(RunId::new(format!("memory-{}-run-{runs}", self.id)))
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
