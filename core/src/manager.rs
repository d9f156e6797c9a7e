//! Managers (single authority or Redlock) and lock descriptions: the public API. An acquisition's driving is
//! in `crate::driver::acquire`.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::{Config, ConfigError};
use crate::driver::{Engine, Lock, Spawn};
use crate::error::{Error, Operation, QuorumError};
use crate::lease::Lease;
use crate::machine::Jitter;
use crate::machine::WaitFor;
use crate::machine::acquisition::Limit;
use crate::mode::Mode;
use crate::node::{KeyState, RedisNode};
use crate::observe::{Hook, Observer};
use crate::ticket::LeaseTicket;
use crate::time::{SharedTimer, SystemTimer, Timer};
use crate::token::Token;

/// Creates locks on one logical Redis authority or on a Redlock set of independent primaries.
///
/// Cheap to clone (all clones share nodes, configuration, timer and spawner).
///
/// ```
/// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
/// # use redlease::{Config, LockManager};
/// # fn nodes() -> Vec<MapNode> { (0..3).map(|_| MapNode::default()).collect() }
/// // Three independent primaries: quorum 2.
/// let manager = LockManager::redlock(nodes(), Config::default()).unwrap();
/// assert_eq!(manager.quorum(), 2);
/// ```
#[derive(Clone)]
pub struct LockManager {
    engine: Arc<Engine>,
}

impl fmt::Debug for LockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockManager")
            .field("mode", &self.engine.mode)
            .field("nodes", &self.engine.nodes.len())
            .field("config", &self.engine.config)
            .finish()
    }
}

impl LockManager {
    /// A manager for one logical Redis authority. Supports fencing tokens.
    ///
    /// # Errors
    /// [`ConfigError`] if the configuration is invalid.
    pub fn single(node: impl RedisNode + 'static, config: Config) -> Result<Self, ConfigError> {
        Self::build(vec![Arc::new(node)], Mode::Single, config)
    }

    /// A Redlock manager over an odd number (≥ 3) of independent Redis primaries.
    ///
    /// Pass primaries that fail independently: not replicas of one primary, not several addresses of one
    /// service, not shards of one Redis Cluster.
    ///
    /// # Errors
    /// [`ConfigError::Topology`] for fewer than three nodes, an even number, or two nodes reporting the same
    /// [endpoint](crate::NodeProfile::endpoint); other [`ConfigError`]s for an invalid configuration.
    pub fn redlock<I>(nodes: I, config: Config) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: RedisNode + 'static,
    {
        let nodes: Vec<Arc<dyn RedisNode>> = nodes
            .into_iter()
            .map(|n| Arc::new(n) as Arc<dyn RedisNode>)
            .collect();
        Self::build(nodes, Mode::Redlock, config)
    }

    /// Like [`redlock`](Self::redlock), for nodes already shared or of different types.
    ///
    /// # Errors
    /// As [`redlock`](Self::redlock).
    pub fn redlock_dyn(
        nodes: Vec<Arc<dyn RedisNode>>,
        config: Config,
    ) -> Result<Self, ConfigError> {
        Self::build(nodes, Mode::Redlock, config)
    }

    fn build(
        nodes: Vec<Arc<dyn RedisNode>>,
        mode: Mode,
        config: Config,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        match mode {
            Mode::Single if nodes.len() != 1 => {
                return Err(ConfigError::Topology(format!(
                    "a single-authority manager needs exactly one node, got {}",
                    nodes.len()
                )));
            }
            Mode::Redlock if nodes.len() < 3 || nodes.len() % 2 == 0 => {
                return Err(ConfigError::Topology(format!(
                    "Redlock needs an odd number of at least 3 independent primaries, got {}",
                    nodes.len()
                )));
            }
            _ => {}
        }
        if mode == Mode::Redlock && config.durability().wait().is_some() {
            return Err(ConfigError::Durability(
                "a durability policy waits for the replicas of one primary; Redlock nodes are independent \
                 primaries (use Durability::Off)",
            ));
        }
        let mut seen = HashSet::new();
        for (i, node) in nodes.iter().enumerate() {
            if nodes[..i].iter().any(|other| Arc::ptr_eq(other, node)) {
                return Err(ConfigError::Topology(format!(
                    "node {i} is the same node object as an earlier one"
                )));
            }
            if let Some(endpoint) = node.profile().endpoint {
                if !seen.insert(endpoint.clone()) {
                    return Err(ConfigError::Topology(format!(
                        "node {i} names endpoint {endpoint} a second time; Redlock needs independent primaries"
                    )));
                }
            }
        }
        let jitter = match config.jitter_seed() {
            Some(seed) => Jitter::from_seed(seed),
            None => Jitter::from_os(),
        };
        Ok(Self {
            engine: Arc::new(Engine {
                quorum: crate::machine::quorum(nodes.len()),
                contention_writes: false,
                permits: false,
                fenced_permits: false,
                wake_all: false,
                replica_waits: mode == Mode::Single,
                quarantines_restarts: mode == Mode::Redlock,
                profiles: crate::driver::profiles(&nodes),
                nodes,
                mode,
                config,
                timer: SharedTimer(Arc::new(SystemTimer)),
                spawner: None,
                jitter: Mutex::new(jitter),
                hook: Hook::with_sink(crate::trace::SINK),
                watch: Arc::default(),
                batcher: Default::default(),
            }),
        })
    }

    pub(crate) fn rebuild(&self, f: impl FnOnce(&mut Engine)) -> Self {
        let e = &self.engine;
        let jitter = match e.jitter.lock() {
            Ok(j) => j.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let mut engine = Engine {
            nodes: e.nodes.clone(),
            profiles: e.profiles.clone(),
            quorum: e.quorum,
            contention_writes: e.contention_writes,
            permits: e.permits,
            fenced_permits: e.fenced_permits,
            wake_all: e.wake_all,
            replica_waits: e.replica_waits,
            quarantines_restarts: e.quarantines_restarts,
            mode: e.mode,
            config: e.config.clone(),
            timer: e.timer.clone(),
            spawner: e.spawner.clone(),
            jitter: Mutex::new(jitter),
            hook: e.hook.clone(),
            watch: Arc::clone(&e.watch),
            batcher: Default::default(),
        };
        f(&mut engine);
        Self {
            engine: Arc::new(engine),
        }
    }

    /// Uses `timer` for every clock reading and sleep (virtual time in tests, a runtime's timer in production).
    ///
    /// The manager returned starts a record of its nodes of its own (the run ids behind the restart
    /// quarantine, the fences behind fence regression detection), not shared with the manager it derives
    /// from as the other `with_*` managers share it: a quarantine ends at an instant of the timer that saw
    /// the restart, which another timer's instants cannot be compared with.
    #[must_use]
    pub fn with_timer(self, timer: impl Timer) -> Self {
        let timer = SharedTimer(Arc::new(timer));
        self.rebuild(|e| {
            e.timer = timer;
            e.watch = Arc::default();
        })
    }

    /// Lets redlease run background tasks through `spawner`: automatic renewal of leases whose lock has
    /// [`auto_renew`](Lock::auto_renew), and clean-up after a lease or an acquisition is dropped.
    ///
    /// Any `Fn(Task)` is a spawner. On tokio or smol use `redlease_adapters::runtime::TokioSpawner` or
    /// `SmolSpawner`; without a runtime, a thread per task with any `block_on` works:
    ///
    /// ```
    /// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
    /// use std::time::Duration;
    /// use redlease::{Config, LockManager, Task};
    ///
    /// let node = MapNode::default(); // any RedisNode
    /// let config = Config::default().with_expiry(Duration::from_secs(1));
    /// let manager = LockManager::single(node, config)?.with_spawner(|task: Task| {
    ///     std::thread::spawn(move || block_on(task));
    /// });
    /// let lock = manager.lock("jobs:nightly").auto_renew(Duration::from_millis(250));
    /// let lease = block_on(lock.acquire())?;
    /// std::thread::sleep(Duration::from_millis(2_500)); // past two TTLs: renewed on the spawned thread
    /// assert!(lease.is_held());
    /// block_on(lease.release())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_spawner(self, spawner: impl Spawn + 'static) -> Self {
        let spawner: Arc<dyn Spawn> = Arc::new(spawner);
        self.rebuild(|e| e.spawner = Some(spawner))
    }

    /// Tells `observer` of every acquisition, extension, renewal failure, loss and release of this manager's
    /// leases (see [`Observer`]). Replaces an earlier observer.
    #[must_use]
    pub fn with_observer(self, observer: impl Observer) -> Self {
        let observer: Arc<dyn crate::Observer> = Arc::new(observer);
        self.rebuild(|e| e.hook = e.hook.observed(observer))
    }

    /// Describes a lock on `key` with this manager's defaults; adjust it with the builder methods. `key` is
    /// anything that reads as a `str` (`&str`, `String`, `&String`, …): it is copied once, into the lock's
    /// shared name.
    pub fn lock(&self, key: impl AsRef<str>) -> Lock {
        Lock {
            engine: Arc::clone(&self.engine),
            key: Arc::from(key.as_ref()),
            expiry: None,
            renew_every: None,
            background: false,
            fence_key: None,
            max_hold: None,
            holder_info: None,
        }
    }

    /// Single authority or Redlock.
    pub fn mode(&self) -> Mode {
        self.engine.mode
    }

    /// The number of nodes.
    pub fn nodes(&self) -> usize {
        self.engine.nodes.len()
    }

    /// Nodes that must agree: `floor(nodes / 2) + 1`.
    pub fn quorum(&self) -> usize {
        self.engine.quorum()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.engine.config
    }

    /// The engine, for the start-up check (`crate::check`).
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine, shared.
    pub(crate) fn engine_arc(&self) -> Arc<Engine> {
        Arc::clone(&self.engine)
    }

    /// A manager over `engine`.
    pub(crate) fn from_engine(engine: Arc<Engine>) -> Self {
        Self { engine }
    }

    /// Raises the fence counter at `fence_key` to at least `at_least` (never lowering it) and returns its
    /// value afterwards: every fencing token issued from then on is larger than `at_least`. Single mode only.
    ///
    /// For the day a Redis without persistence restarts and its fence counter starts again at 1, while the
    /// fenced resource remembers a larger fence and would refuse every new holder's write as stale: read the
    /// largest fence the resource has accepted, and raise the counter above it before taking the lock again.
    /// Bounded by the operation timeout of the default expiry.
    ///
    /// ```
    /// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
    /// use redlease::{Config, LockManager};
    ///
    /// # block_on(async {
    /// let manager = LockManager::single(MapNode::default(), Config::default())?;
    /// // The resource's largest accepted fence, e.g. `SELECT max(fence) FROM orders_log`.
    /// let resource_max = 4_711;
    /// manager.raise_fence("orders:{42}:fence", resource_max).await?;
    /// let lease = manager.lock("orders:{42}:lock").fenced("orders:{42}:fence").try_acquire().await?;
    /// assert!(lease.fencing_token().unwrap() > resource_max);
    /// # lease.release().await?;
    /// # Ok::<(), redlease::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`Error::FencingUnsupported`] for a Redlock manager and [`Error::Config`] for an empty key or a value
    /// of `i64::MAX` or more (no larger fence could follow), before anything is sent; [`Error::Quorum`] (operation [`RaiseFence`](Operation::RaiseFence)) with the node's
    /// error otherwise — [`NodeErrorKind::Unsupported`](crate::NodeErrorKind::Unsupported) for a node without
    /// the capability, [`NodeErrorKind::Fence`](crate::NodeErrorKind::Fence) for a counter that is not a
    /// non-negative integer or has a TTL.
    pub async fn raise_fence(&self, fence_key: &str, at_least: u64) -> Result<u64, Error> {
        if self.engine.mode != Mode::Single {
            return Err(Error::FencingUnsupported);
        }
        crate::config::check_key("fence", fence_key)?;
        if at_least >= i64::MAX as u64 {
            // Redis counters are signed 64-bit: the next INCR would overflow.
            return Err(ConfigError::FenceOutOfRange(at_least).into());
        }
        let config = &self.engine.config;
        let timeout = config.operation_timeout_for(config.expiry());
        let r = self
            .engine
            .round(
                crate::machine::WaitFor::All,
                false,
                timeout,
                |_, node| node.raise_fence(fence_key, at_least),
                |_| true,
            )
            .await;
        match r.values.into_iter().next().flatten() {
            Some(value) => Ok(value),
            None => Err(QuorumError::new(
                Operation::RaiseFence,
                r.tally.yes(),
                r.tally.required(),
                r.tally.errors(),
            )
            .into()),
        }
    }
}

/// Who holds a lock, as [`Lock::holder_info`] read it from the nodes. Never carries the token.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    info: Option<String>,
    remaining: Option<Duration>,
    nodes: usize,
}

impl HolderInfo {
    /// The holder's [info](Lock::with_holder_info); `None` if it stored none (or the value was not written
    /// by redlease).
    pub fn info(&self) -> Option<&str> {
        self.info.as_deref()
    }

    /// The shortest time to live of the key among the agreeing nodes (`None` if they report no TTL).
    pub fn remaining(&self) -> Option<Duration> {
        self.remaining
    }

    /// How many nodes hold this value (at least a quorum).
    pub fn nodes(&self) -> usize {
        self.nodes
    }
}

impl Lock {
    /// Sets the lease TTL for this lock (default: the manager's [`Config::expiry`]).
    #[must_use]
    pub fn expiry(mut self, expiry: Duration) -> Self {
        self.expiry = Some(expiry);
        self
    }

    /// Sets how often the lease is renewed (it must be shorter than the expiry; default a third of it).
    ///
    /// [`Lease::run`](crate::Lease::run) always renews while its work runs; this sets its interval, and that
    /// of background renewal ([`auto_renew`](Self::auto_renew)).
    #[must_use]
    pub fn renew_every(mut self, interval: Duration) -> Self {
        self.renew_every = Some(interval);
        self
    }

    /// Renews the lease in the background every `interval`, on the manager's
    /// [spawner](LockManager::with_spawner), for as long as it is held.
    ///
    /// A manager without a spawner cannot do this: acquisition then fails before sending anything with
    /// [`ConfigError::AutoRenewWithoutSpawner`] (a lease nobody renews would silently be lost after one TTL).
    /// Without a spawner, run the work inside [`Lease::run`](crate::Lease::run), which renews by itself.
    ///
    /// A failing renewal marks the lease [at risk](crate::LeaseState::AtRisk) and retries while validity
    /// remains; the lease is reported lost no later than its validity deadline.
    #[must_use]
    pub fn auto_renew(mut self, interval: Duration) -> Self {
        self.renew_every = Some(interval);
        self.background = true;
        self
    }

    /// Issues a fencing token from the counter at `fence_key` with every acquisition (single mode only).
    ///
    /// On Redis Cluster, give both keys one hash tag, e.g. `orders:{42}:lock` and `orders:{42}:fence`.
    #[must_use]
    pub fn fenced(mut self, fence_key: impl Into<String>) -> Self {
        self.fence_key = Some(fence_key.into());
        self
    }

    /// Limits how long a lease of this lock may be held in all, renewals included: renewal stops `max_hold`
    /// after the acquisition (counted from the start of the winning round), and the lease ends there — its
    /// [loss signal](crate::Lease::lost) fires with [`LossReason::HoldLimit`](crate::LossReason::HoldLimit),
    /// [`Lease::run`](crate::Lease::run) stops its work and returns that loss, and the renewer (if any)
    /// deletes the token from the nodes so that the next holder need not wait for the TTL. A job stuck in a
    /// loop cannot keep the lock for ever. Overrides the manager's [`Config::with_max_hold`].
    ///
    /// The lease's [`valid_until`](crate::Lease::valid_until) never lies past the limit. A lease that
    /// nothing renews and nobody releases keeps its key on the nodes until its TTL runs out, as without a
    /// limit; a node that does not answer the deletion keeps it for at most one TTL after the limit.
    ///
    /// ```
    /// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
    /// use std::time::Duration;
    /// use redlease::{Config, Error, LockManager, LossReason};
    ///
    /// # block_on(async {
    /// let manager = LockManager::single(MapNode::default(), Config::default())?;
    /// let lease = manager
    ///     .lock("rebuild-cache")
    ///     .expiry(Duration::from_millis(300))
    ///     .max_hold(Duration::from_millis(500))
    ///     .try_acquire()
    ///     .await?;
    /// // Renewed while the work runs, but never past half a second in all.
    /// let stuck = std::future::pending::<()>();
    /// match lease.run(stuck).await {
    ///     Err(Error::Lost { reason: LossReason::HoldLimit, .. }) => {}
    ///     other => panic!("expected the hold limit, got {other:?}"),
    /// }
    /// // The key was deleted at the limit: another holder gets the lock at once.
    /// assert!(manager.lock("rebuild-cache").try_acquire().await.is_ok());
    /// # Ok::<(), redlease::Error>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Stores `info` — what the holder is: host, process id, job id — with every lease of this lock, for
    /// operators and other clients to read with [`holder_info`](Self::holder_info) without the token.
    ///
    /// It lives in the lock's own value, after the token (`<token>:<info>`): written in the same atomic step
    /// as the acquisition, with the same TTL, extended and deleted with it, and compared with it by every
    /// compare-and-delete and compare-and-expire. At most
    /// [`MAX_HOLDER_INFO_BYTES`](crate::MAX_HOLDER_INFO_BYTES) bytes (checked before anything is sent). Every
    /// process that locks the key should use redlease, or read values the same way.
    ///
    /// ```
    /// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
    /// use redlease::{Config, LockManager};
    ///
    /// # block_on(async {
    /// let manager = LockManager::single(MapNode::default(), Config::default())?;
    /// let lease = manager
    ///     .lock("nightly-report")
    ///     .with_holder_info("host=web-3 pid=4242 job=2026-12-02")
    ///     .try_acquire()
    ///     .await?;
    /// // Anyone, without the token:
    /// let holder = manager.lock("nightly-report").holder_info().await?.expect("held");
    /// assert_eq!(holder.info(), Some("host=web-3 pid=4242 job=2026-12-02"));
    /// lease.release().await?;
    /// assert!(manager.lock("nightly-report").holder_info().await?.is_none());
    /// # Ok::<(), redlease::Error>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn with_holder_info(mut self, info: impl Into<String>) -> Self {
        self.holder_info = Some(Arc::from(info.into()));
        self
    }

    /// Who holds the lock now, as far as a quorum of nodes agrees: the [holder info](Self::with_holder_info)
    /// stored with the lease (never its token), the time its key has left, and on how many nodes. `None` when
    /// no value is held by a quorum (free, or split between owners).
    ///
    /// One read of every node, bounded by the operation timeout. A snapshot: the lock may change hands the
    /// moment after.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid key; [`Error::Quorum`] if too few nodes answered.
    pub async fn holder_info(&self) -> Result<Option<HolderInfo>, Error> {
        crate::config::check_key("lock", &self.key)?;
        let engine = &self.engine;
        let timeout = engine.config.operation_timeout_for(self.effective_expiry());
        let key = &*self.key;
        let r = engine
            .round(
                WaitFor::All,
                false,
                timeout,
                move |_, node| node.inspect(key),
                |_| true,
            )
            .await;
        if r.tally.yes() < engine.quorum() {
            return Err(QuorumError::new(
                Operation::Inspect,
                r.tally.yes(),
                r.tally.required(),
                r.tally.errors(),
            )
            .into());
        }
        let states: Vec<KeyState> = r.values.into_iter().flatten().flatten().collect();
        let Some(state) = states
            .iter()
            .find(|s| states.iter().filter(|o| o.value == s.value).count() >= engine.quorum())
        else {
            return Ok(None);
        };
        let agreeing: Vec<&KeyState> = states.iter().filter(|o| o.value == state.value).collect();
        Ok(Some(HolderInfo {
            info: Token::info_in(&state.value).map(str::to_owned),
            remaining: agreeing.iter().filter_map(|s| s.ttl).min(),
            nodes: agreeing.len(),
        }))
    }

    /// The hold limit this lock uses: its own [`max_hold`](Self::max_hold), or the manager's default.
    pub fn effective_max_hold(&self) -> Option<Duration> {
        self.max_hold_in_use()
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lease TTL this lock uses: its own [`expiry`](Self::expiry), or the manager's default.
    pub fn effective_expiry(&self) -> Duration {
        self.expiry_in_use()
    }

    /// Checks the description against the manager (keys, TTL, renewal interval, fencing support) without
    /// sending anything. Every acquisition runs the same checks first.
    ///
    /// # Errors
    /// [`Error::Config`] or [`Error::FencingUnsupported`].
    pub fn validate(&self) -> Result<(), Error> {
        self.plan().map(|_| ())
    }

    /// Makes one acquisition attempt.
    ///
    /// # Errors
    /// [`Error::NotAcquired`] if the attempt failed ([`Error::is_contended`] tells plain contention apart);
    /// [`Error::Config`], [`Error::FencingUnsupported`] or [`Error::Token`] before anything is sent.
    pub async fn try_acquire(&self) -> Result<Lease, Error> {
        self.acquire_with(Limit::Attempts(1)).await.map(Lease::new)
    }

    /// Tries up to [`Config::attempts`] times, pausing [`Config::retry_delay`] plus jitter between attempts.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire), describing the last attempt.
    pub async fn acquire(&self) -> Result<Lease, Error> {
        self.acquire_with(Limit::Attempts(self.engine.config.attempts()))
            .await
            .map(Lease::new)
    }

    /// Keeps trying until `deadline` (an instant of the manager's timer). No attempt starts after the deadline
    /// and an attempt's round is cut at it, so this returns by `deadline` plus the time to clean up.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire), describing the last attempt.
    pub async fn acquire_until(&self, deadline: Instant) -> Result<Lease, Error> {
        self.acquire_with(Limit::Until(deadline))
            .await
            .map(Lease::new)
    }

    /// Keeps trying for `patience` from now; see [`acquire_until`](Self::acquire_until).
    ///
    /// ```
    /// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
    /// use std::time::Duration;
    /// use redlease::{Config, Error, LockManager};
    ///
    /// # block_on(async {
    /// let manager = LockManager::single(MapNode::default(), Config::default())?;
    /// let holder = manager.lock("migration").try_acquire().await?;
    /// // Someone holds it: wait up to 300 ms, retrying every `retry_delay` (+ jitter).
    /// match manager.lock("migration").acquire_within(Duration::from_millis(300)).await {
    ///     Ok(lease) => lease.release().await.map(|_| ())?,
    ///     Err(e) if e.is_contended() => println!("still held by someone else: skip this run"),
    ///     Err(e) => return Err(e), // the server is unreachable, refused us, …
    /// }
    /// holder.release().await?;
    /// # Ok::<(), redlease::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire_within(&self, patience: Duration) -> Result<Lease, Error> {
        let deadline = crate::time::add(self.engine.timer.now(), patience);
        self.acquire_with(Limit::Until(deadline))
            .await
            .map(Lease::new)
    }

    /// Continues a lease another process handed over with [`Lease::handoff`](crate::Lease::handoff): proves
    /// that the ticket's token still holds the key with an extension round (this lock's TTL), and returns a
    /// lease whose validity counts from that round — never carried over from the ticket. The resumed lease is
    /// renewed, limited ([`max_hold`](Self::max_hold), counted from the resumption) and released like an
    /// acquired one, with this lock's settings.
    ///
    /// Resume a ticket once: two processes resuming one ticket hold one lease together, as two holders of
    /// one token would.
    ///
    /// # Errors
    /// - [`Error::Config`] ([`ConfigError::TicketMismatch`]) if the ticket is for another key, another mode
    ///   or number of nodes, or a fenced lock where this one is not (or the reverse); the lock's own checks
    ///   as for an acquisition; all before anything is sent;
    /// - [`Error::Lost`] with [`LossReason::NotHeld`](crate::LossReason::NotHeld) if the key no longer holds
    ///   the ticket's token (it expired before the resumption, or was taken over), or
    ///   [`LossReason::ExtendFailed`](crate::LossReason::ExtendFailed) if the round left no validity;
    /// - [`Error::Quorum`] if too few nodes answered to tell: the ticket may be tried again while the key's
    ///   TTL lasts.
    pub async fn resume(&self, ticket: &LeaseTicket) -> Result<Lease, Error> {
        self.resumed(ticket).await.map(Lease::new)
    }
}
