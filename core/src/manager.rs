//! Managers (single authority or Redlock), lock descriptions and acquisition.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::config::{Config, ConfigError};
use crate::driver::lease::{Grant, Shared};
use crate::driver::{Engine, Planned, RoundResult, Spawn, TtlHint};
use crate::error::{Error, LossReason, NotAcquiredReason, Operation, QuorumError};
use crate::lease::Lease;
use crate::machine::Jitter;
use crate::machine::Verdict;
use crate::machine::WaitFor;
use crate::machine::acquisition::{Acquisition, Decision, Limit, Next, Shape};
use crate::machine::nodeset::NodeSet;
use crate::machine::unconfirmed::Unconfirmed;
use crate::mode::Mode;
use crate::node::{KeyState, RedisNode, Ttl};
use crate::notify::{Outcome, Watch};
use crate::observe::{AttemptOutcome, CleanupCause, EventKind, Hook, LeaseId, Nodes, Observer};
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

    /// Describes a lock on `key` with this manager's defaults; adjust it with the builder methods.
    pub fn lock(&self, key: impl Into<String>) -> Lock {
        Lock {
            engine: Arc::clone(&self.engine),
            key: Arc::from(key.into()),
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

/// The most bytes of [holder info](Lock::with_holder_info) a lock stores with its token.
pub const MAX_HOLDER_INFO_BYTES: usize = 256;

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

/// A description of a lock: its key and options. Acquiring it yields a [`Lease`].
///
/// Cheap to clone; acquiring the same description from several tasks makes them contend.
#[derive(Clone)]
pub struct Lock {
    engine: Arc<Engine>,
    /// Shared with the leases it grants (no copy per acquisition).
    key: Arc<str>,
    expiry: Option<Duration>,
    renew_every: Option<Duration>,
    /// Renewal in the background on the manager's spawner ([`Lock::auto_renew`]).
    background: bool,
    fence_key: Option<String>,
    /// [`Lock::max_hold`], if set (else the manager's default).
    max_hold: Option<Duration>,
    /// [`Lock::with_holder_info`], stored after the token.
    holder_info: Option<Arc<str>>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.key)
            .field("expiry", &self.effective_expiry())
            .field("renew_every", &self.renew_every)
            .field("background_renewal", &self.background)
            .field("fence_key", &self.fence_key)
            .field("max_hold", &self.effective_max_hold())
            .field("holder_info", &self.holder_info)
            .finish()
    }
}

/// The tokens of one acquisition: the one its next attempt sends, and older ones whose clean-up was not
/// confirmed on some node (see the rotation in `acquire_with`).
///
/// Dropped before [`won`](Self::won) or [`failed`](Self::failed) — the acquisition future was cancelled — it
/// deletes every token in the background (if the manager has a spawner).
struct Tokens<'a> {
    /// The lock acquired: its engine, key and holder info (one reference keeps the acquisition future small).
    lock: &'a Lock,
    id: LeaseId,
    timeout: Duration,
    current: Token,
    stale: Vec<Token>,
    armed: bool,
}

impl<'a> Tokens<'a> {
    fn new(lock: &'a Lock, id: LeaseId, timeout: Duration) -> Result<Self, Error> {
        Ok(Self {
            lock,
            id,
            timeout,
            current: Token::random()?.with_info(lock.holder_info.as_deref()),
            stale: Vec::new(),
            armed: true,
        })
    }

    /// Before giving up, where an attempt that found the lock held still wrote (see
    /// `Engine::contention_writes`): deletes the current token, so that the acquisition leaves at once. (A
    /// future dropped meanwhile is still armed: its token is deleted in the background.)
    async fn withdraw(&self) {
        let _ = self
            .lock
            .engine
            .cleanup(
                &self.lock.key,
                &self.current,
                self.timeout,
                None,
                (self.id, CleanupCause::FailedAttempt),
            )
            .await;
    }

    /// Retires the current token (its clean-up is unconfirmed somewhere) and draws a new one.
    fn rotate(&mut self) -> Result<(), Error> {
        let next = Token::random()?.with_info(self.lock.holder_info.as_deref());
        self.stale.push(std::mem::replace(&mut self.current, next));
        Ok(())
    }

    /// The acquisition won with the current token: retired tokens are deleted in the background.
    fn won(&mut self) -> Token {
        self.armed = false;
        for token in std::mem::take(&mut self.stale) {
            self.lock.engine.spawn_cleanup(
                &self.lock.key,
                &token,
                self.timeout,
                (self.id, CleanupCause::StaleToken),
            );
        }
        self.current.clone()
    }

    /// The acquisition gave up after cleaning up its last attempt: retired tokens, whose clean-up did not
    /// answer, are deleted again in the background. (The current one was either confirmed gone everywhere or
    /// never sent.)
    fn failed(&mut self) {
        self.armed = false;
        for token in &self.stale {
            self.lock.engine.spawn_cleanup(
                &self.lock.key,
                token,
                self.timeout,
                (self.id, CleanupCause::StaleToken),
            );
        }
    }
}

impl Drop for Tokens<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Cancelled, possibly in the middle of a round: the current token may be anywhere.
            self.failed();
            self.lock.engine.spawn_cleanup(
                &self.lock.key,
                &self.current,
                self.timeout,
                (self.id, CleanupCause::Cancelled),
            );
        }
    }
}

/// What an acquisition carries from attempt to attempt (see `Lock::acquire_in`).
struct Attempts<'a> {
    acq: Acquisition<'a>,
    tokens: Tokens<'a>,
    /// Waiting with release notifications: a watch per notifying node.
    watches: Vec<Watch>,
    /// The holder's remaining TTL, learned by a waiting attempt that found the lock held.
    hint: Option<TtlHint>,
    ttl: Ttl,
}

/// Waits until a watch holds a notification, or until `pushed` while some watch's subscription is confirmed
/// and the lock was `held` (else until `polling`), driving the notifiers' subscription commands meanwhile.
async fn wait_for_release(
    timer: &SharedTimer,
    watches: &mut [Watch],
    held: bool,
    polling: Instant,
    pushed: Instant,
) {
    let mut sleep: Option<(Instant, crate::time::Sleep)> = None;
    std::future::poll_fn(|cx| {
        let now = timer.now();
        // Every watch is polled (each drives its notifier): notifications that arrive together, such as the
        // confirmed subscriptions of several Redlock nodes, are used by one attempt.
        let mut notified = false;
        for w in watches.iter_mut() {
            notified |= w.poll_notified(cx, now).is_ready();
        }
        if notified {
            return Poll::Ready(());
        }
        let target = if held && watches.iter().any(Watch::is_active) {
            pushed
        } else {
            polling
        };
        if sleep.as_ref().is_none_or(|(at, _)| *at != target) {
            sleep = Some((target, timer.sleep_until(target)));
        }
        match &mut sleep {
            Some((_, timer_sleep)) => timer_sleep.as_mut().poll(cx),
            None => Poll::Pending,
        }
    })
    .await
}

/// Checked parameters of one acquisition.
struct Plan {
    ttl: Ttl,
    op_timeout: Duration,
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
    /// compare-and-delete and compare-and-expire. At most [`MAX_HOLDER_INFO_BYTES`] bytes (checked before
    /// anything is sent). Every process that locks the key should use redlease, or read values the same way.
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

    /// The manager's engine.
    pub(crate) fn engine(&self) -> Arc<Engine> {
        Arc::clone(&self.engine)
    }

    /// This description over another engine (its nodes and settings), everything else kept.
    pub(crate) fn with_engine(mut self, engine: Arc<Engine>) -> Self {
        self.engine = engine;
        self
    }

    /// Now, on the manager's timer.
    pub(crate) fn now(&self) -> Instant {
        self.engine.timer.now()
    }

    /// The hold limit this lock uses: its own [`max_hold`](Self::max_hold), or the manager's default.
    pub fn effective_max_hold(&self) -> Option<Duration> {
        self.max_hold.or(self.engine.config.max_hold())
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lease TTL this lock uses: its own [`expiry`](Self::expiry), or the manager's default.
    pub fn effective_expiry(&self) -> Duration {
        self.expiry.unwrap_or(self.engine.config.expiry())
    }

    /// Checks the description against the manager (keys, TTL, renewal interval, fencing support) without
    /// sending anything. Every acquisition runs the same checks first.
    ///
    /// # Errors
    /// [`Error::Config`] or [`Error::FencingUnsupported`].
    pub fn validate(&self) -> Result<(), Error> {
        self.plan().map(|_| ())
    }

    fn plan(&self) -> Result<Plan, Error> {
        let config = &self.engine.config;
        crate::config::check_key("lock", &self.key)?;
        if let Some(fence_key) = &self.fence_key {
            if self.engine.mode == Mode::Redlock {
                return Err(Error::FencingUnsupported);
            }
            if self.engine.permits && !self.engine.fenced_permits {
                return Err(ConfigError::Semaphore(
                    "semaphore permits, readers and fair locks issue no fencing tokens (a read/write lock's writer does)",
                )
                .into());
            }
            crate::config::check_key("fence", fence_key)?;
            if fence_key.as_str() == &*self.key {
                return Err(
                    ConfigError::InvalidKey("the fence key must differ from the lock key").into(),
                );
            }
        }
        let expiry = self.effective_expiry();
        let ttl = config.check_expiry(expiry)?;
        if let Some(interval) = self.renew_every {
            config.check_renewal(interval, expiry)?;
        }
        if self.background && self.engine.spawner.is_none() {
            return Err(ConfigError::AutoRenewWithoutSpawner.into());
        }
        if let Some(info) = &self.holder_info {
            if info.len() > MAX_HOLDER_INFO_BYTES {
                return Err(ConfigError::HolderInfoTooLong {
                    len: info.len(),
                    max: MAX_HOLDER_INFO_BYTES,
                }
                .into());
            }
        }
        if self.max_hold.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::ZeroDuration { field: "max_hold" }.into());
        }
        Ok(Plan {
            ttl,
            op_timeout: config.operation_timeout_for(expiry),
        })
    }

    /// Makes one acquisition attempt.
    ///
    /// # Errors
    /// [`Error::NotAcquired`] if the attempt failed ([`Error::is_contended`] tells plain contention apart);
    /// [`Error::Config`], [`Error::FencingUnsupported`] or [`Error::Token`] before anything is sent.
    pub async fn try_acquire(&self) -> Result<Lease, Error> {
        self.acquire_with(Limit::Attempts(1)).await
    }

    /// Tries up to [`Config::attempts`] times, pausing [`Config::retry_delay`] plus jitter between attempts.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire), describing the last attempt.
    pub async fn acquire(&self) -> Result<Lease, Error> {
        self.acquire_with(Limit::Attempts(self.engine.config.attempts()))
            .await
    }

    /// Keeps trying until `deadline` (an instant of the manager's timer). No attempt starts after the deadline
    /// and an attempt's round is cut at it, so this returns by `deadline` plus the time to clean up.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire), describing the last attempt.
    pub async fn acquire_until(&self, deadline: Instant) -> Result<Lease, Error> {
        self.acquire_with(Limit::Until(deadline)).await
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
        self.acquire_with(Limit::Until(deadline)).await
    }

    /// The acquisition, in a span with the `tracing` feature. Not an `async fn`: without the feature this is
    /// the acquisition's own future, no bigger.
    fn acquire_with(&self, limit: Limit) -> impl Future<Output = Result<Lease, Error>> {
        let span = crate::trace::span(crate::trace::SpanOf::Acquire(&self.key, self.engine.mode));
        crate::trace::instrument(span, self.acquire_in(limit))
    }

    /// One acquisition attempt's event (built only when somebody listens).
    fn attempt_event(
        &self,
        id: LeaseId,
        r: &RoundResult<Option<u64>>,
        attempt: u32,
        outcome: AttemptOutcome,
    ) {
        let engine = &self.engine;
        if engine.hook.active() {
            engine.hook.emit(
                &self.key,
                id,
                r.ended,
                EventKind::Attempt {
                    attempt,
                    nodes: Nodes::new(&r.tally),
                    round: r.ended.saturating_duration_since(r.started),
                    outcome,
                },
            );
        }
    }

    /// The acquisition's driver: every decision is the [`Acquisition`] machine's; this sends its rounds,
    /// keeps its tokens and watches, and sleeps when it says so.
    async fn acquire_in(&self, limit: Limit) -> Result<Lease, Error> {
        let mut a = self.begin(limit)?;
        loop {
            for w in &mut a.watches {
                w.begin_attempt();
            }
            if let Some(hint) = &a.hint {
                hint.reset();
            }
            // The round's result stays in this block: the failure path keeps only what it needs across its
            // awaits, so that the coroutine does not keep the whole result (nor the attempt's plan, which the
            // round's future holds).
            let cleanup = {
                let round = {
                    let op_timeout = a
                        .tokens
                        .timeout
                        .saturating_add(self.engine.wait_allowance());
                    let attempt = a.acq.begin_attempt(self.engine.timer.now(), op_timeout);
                    self.engine.acquire_round(
                        &self.key,
                        self.fence_key.as_deref(),
                        &a.tokens.current,
                        a.ttl,
                        attempt.timeout,
                        attempt.fresh,
                        a.hint.as_ref(),
                        a.tokens.id,
                    )
                };
                let r = round.await;
                let won = a.acq.handle_round(
                    &r.tally,
                    a.ttl,
                    (r.started, r.ended),
                    r.suspended_by(),
                    |i| self.engine.profiles[i].fresh_is_nx,
                );
                match self.attempt_ended(&mut a, &r, won) {
                    Ok(lease) => return Ok(lease),
                    Err(cleanup) => cleanup,
                }
            };
            if !cleanup.is_empty() {
                self.clean_up_attempt(&mut a, &cleanup).await?;
            }
            if let Some(gave_up) = self.before_next_attempt(&mut a).await {
                return Err(gave_up);
            }
        }
    }

    /// An acquisition's start: its checked plan, machine, tokens, and (waiting) its watches and the holder's
    /// TTL hint. An error if the plan is refused or the deadline has already passed.
    fn begin(&self, limit: Limit) -> Result<Attempts<'_>, Error> {
        let plan = self.plan()?;
        let engine = &self.engine;
        let config = &engine.config;
        let shape = Shape {
            n: engine.nodes.len() as u32,
            quorum: engine.quorum() as u32,
            single: engine.mode == Mode::Single,
            fenced: self.fence_key.is_some(),
        };
        let mut acq =
            Acquisition::new(config, shape, limit, engine.next_seed(), engine.timer.now());
        if acq.expired() {
            let began = acq.began();
            return Err(self.not_acquired(&mut acq, LeaseId::next(), began));
        }
        // The lease's id and the operation timeout live in `tokens` (the future keeps one copy).
        let tokens = Tokens::new(self, LeaseId::next(), plan.op_timeout)?;
        // Waiting with release notifications: a watch per notifying node, registered before the first
        // attempt (nothing is sent until an attempt finds the lock held; see `crate::notify`).
        let mut watches = match limit {
            Limit::Until(_) if config.notifications() => engine.watches(&self.key),
            _ => Vec::new(),
        };
        for w in &mut watches {
            w.own(&tokens.current);
            if engine.wake_all {
                w.wake_every_waiter();
            }
        }
        // A waiting acquisition learns the holder's remaining TTL on contention (the next attempt is due at
        // its expiry); a fenced one cannot (its script reports no TTL).
        let hint =
            (matches!(limit, Limit::Until(_)) && self.fence_key.is_none()).then(TtlHint::new);
        Ok(Attempts {
            acq,
            tokens,
            watches,
            hint,
            ttl: plan.ttl,
        })
    }

    /// An attempt's round ended with the machine's `decision`: the lease if it won; otherwise the attempt is
    /// reported (its watches and event) and the nodes to clean up are returned.
    fn attempt_ended(
        &self,
        a: &mut Attempts<'_>,
        r: &RoundResult<Option<u64>>,
        decision: Decision,
    ) -> Result<Lease, Vec<usize>> {
        let (reason, cleanup) = match decision {
            Decision::Won {
                valid_until,
                unconfirmed,
                missing,
            } => {
                let won = (valid_until, unconfirmed, missing);
                let plan = Plan {
                    ttl: a.ttl,
                    op_timeout: a.tokens.timeout,
                };
                return Ok(self.won(&a.acq, &mut a.tokens, &mut a.watches, r, plan, won));
            }
            Decision::Failed { reason, cleanup } => (reason, cleanup),
        };
        let outcome = if reason == NotAcquiredReason::Contended {
            Outcome::Held
        } else {
            Outcome::Failed
        };
        for w in &mut a.watches {
            w.end_attempt(outcome);
        }
        let attempts = a.acq.attempts();
        self.attempt_event(a.tokens.id, r, attempts, AttemptOutcome::Failed(reason));
        Err(cleanup)
    }
    /// The clean-up of a failed attempt on the nodes `cleanup` names, reported; the token is replaced when the
    /// machine says so (its deletion went unconfirmed somewhere).
    async fn clean_up_attempt(&self, a: &mut Attempts<'_>, cleanup: &[usize]) -> Result<(), Error> {
        let c = self
            .engine
            .release_round(
                &self.key,
                &a.tokens.current,
                a.tokens.timeout,
                Some(cleanup),
            )
            .await;
        if self.engine.hook.active() {
            self.engine.hook.emit(
                &self.key,
                a.tokens.id,
                c.ended,
                EventKind::Cleanup {
                    cause: CleanupCause::FailedAttempt,
                    nodes: Nodes::new(&c.tally),
                    round: c.ended.saturating_duration_since(c.started),
                },
            );
        }
        let rotate =
            a.acq
                .handle_cleanup(cleanup, |i| c.values[i].is_some(), c.tally.any_ambiguous());
        if rotate {
            // The old token is deleted again in the background if a spawner exists; otherwise it expires
            // with its TTL.
            a.tokens.rotate()?;
            for w in &mut a.watches {
                w.own(&a.tokens.current);
            }
        }
        Ok(())
    }

    /// After a failed attempt: sleeps or waits for a release as the machine says, or gives up — then the
    /// error to return (the acquisition's last token withdrawn where an attempt that found the lock held
    /// still wrote).
    async fn before_next_attempt(&self, a: &mut Attempts<'_>) -> Option<Error> {
        let now = self.engine.timer.now();
        let holder_ttl = a.hint.as_ref().and_then(TtlHint::remaining);
        let waited = match a.acq.next(now, !a.watches.is_empty(), holder_ttl) {
            Next::Sleep(at) => {
                self.engine.timer.sleep_until(at).await;
                return None;
            }
            Next::Wait {
                held,
                polling,
                pushed,
            } => {
                if held {
                    for w in &mut a.watches {
                        w.subscribe(now);
                    }
                }
                wait_for_release(&self.engine.timer, &mut a.watches, held, polling, pushed).await;
                // Waiting is only for acquisitions with a deadline.
                let deadline = a.acq.deadline().unwrap_or(now);
                if self.engine.timer.now() < deadline {
                    return None;
                }
                true
            }
            Next::GiveUp => false,
        };
        if self.engine.contention_writes {
            Box::pin(a.tokens.withdraw()).await;
        }
        a.tokens.failed();
        // A wait that reached the deadline ends when the acquisition returns; a give-up when it was decided.
        let at = if waited { self.engine.timer.now() } else { now };
        Some(self.not_acquired(&mut a.acq, a.tokens.id, at))
    }

    /// The acquisition failed for the reason `acq` holds: its event, and the error.
    fn not_acquired(&self, acq: &mut Acquisition<'_>, id: LeaseId, now: Instant) -> Error {
        let (reason, last_error) = acq.failure();
        let attempts = acq.attempts();
        if attempts > 0 {
            self.engine.hook.emit(
                &self.key,
                id,
                now,
                EventKind::NotAcquired {
                    reason,
                    attempts,
                    waited: now.saturating_duration_since(acq.began()),
                    contended: acq.contended(),
                },
            );
        }
        Error::NotAcquired {
            key: self.key.to_string(),
            mode: self.engine.mode,
            attempts,
            reason,
            last_error: last_error.map(Box::new),
        }
    }

    /// The attempt `r` won, valid until `won.0` (`won.1`, `won.2`: [`Decision::Won`]'s unconfirmed and missing
    /// nodes): its events,
    /// and the lease.
    fn won(
        &self,
        acq: &Acquisition<'_>,
        tokens: &mut Tokens<'_>,
        watches: &mut [Watch],
        r: &RoundResult<Option<u64>>,
        plan: Plan,
        (valid_until, unconfirmed, missing): (Instant, Option<Box<[u64]>>, NodeSet),
    ) -> Lease {
        let engine = &self.engine;
        let id = tokens.id;
        let fence = match self.fence_key {
            Some(_) => r.values.first().copied().flatten().flatten(),
            None => None,
        };
        for w in watches.iter_mut() {
            w.end_attempt(Outcome::Won);
        }
        if let (Some(fence_key), Some(fence)) = (&self.fence_key, fence) {
            match engine.watch.lock() {
                Ok(mut w) => w.issued(fence_key, fence),
                Err(p) => p.into_inner().issued(fence_key, fence),
            }
        }
        let token = tokens.won();
        let now = engine.timer.now();
        self.attempt_event(
            id,
            r,
            acq.attempts(),
            AttemptOutcome::Won {
                validity: valid_until.saturating_duration_since(r.ended),
            },
        );
        engine.hook.emit(
            &self.key,
            id,
            now,
            EventKind::Acquired {
                valid_until,
                fence,
                attempts: acq.attempts(),
                waited: now.saturating_duration_since(acq.began()),
                contended: acq.contended(),
            },
        );
        self.lease(Grant {
            key: self.key.clone(),
            token,
            ttl: plan.ttl,
            op_timeout: plan.op_timeout,
            fence,
            renew_interval: self.renew_every,
            id,
            acquired_at: now,
            hold_until: self
                .effective_max_hold()
                .and_then(|d| r.started.checked_add(d)),
            round_started: r.started,
            wall_started: r.wall.0,
            unconfirmed,
            missing,
            valid_until,
        })
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
        let plan = self.plan()?;
        let engine = &self.engine;
        let n = engine.nodes.len();
        let mismatch = |why| Err(Error::Config(ConfigError::TicketMismatch(why)));
        if ticket.key.as_str() != &*self.key {
            return mismatch("the ticket is for another key");
        }
        if ticket.mode != engine.mode {
            return mismatch("the ticket was made by a manager of the other mode");
        }
        if ticket.pending.len() != n {
            return mismatch("the ticket was made by a manager with another number of nodes");
        }
        if ticket.fence.is_some() != self.fence_key.is_some() {
            return mismatch(
                "a fenced lock needs a fenced ticket, an unfenced lock an unfenced one",
            );
        }
        let id = LeaseId::next();
        // The ticket's in-flight record, with this round planned on top before anything is sent. (Dropped with
        // this future, it leaves no lease behind to rely on it.)
        let mut ledger = Unconfirmed::from_acquisition(Some(ticket.pending.clone()));
        let planned = Planned {
            unconfirmed: ledger.plan(n, plan.ttl),
            missing: NodeSet::from_bits(ticket.missing),
        };
        let r = engine
            .extend_round(
                &self.key,
                &ticket.token,
                plan.ttl,
                plan.op_timeout,
                &planned,
                id,
            )
            .await;
        ledger.handle_round(n, &r.tally);
        if engine.hook.active() {
            engine.hook.emit(
                &self.key,
                id,
                r.ended,
                EventKind::Extension {
                    renewal: false,
                    nodes: crate::observe::Nodes::new(&r.tally),
                    round: r.ended.saturating_duration_since(r.started),
                },
            );
        }
        let lost = |reason| Error::Lost {
            key: self.key.to_string(),
            reason,
            source: None,
        };
        if r.tally.verdict() != Verdict::Quorum {
            if r.tally.refused() {
                return Err(lost(LossReason::NotHeld));
            }
            return Err(QuorumError::new(
                Operation::Extend,
                r.tally.yes(),
                r.tally.required(),
                r.tally.errors(),
            )
            .into());
        }
        let factor = engine.config.drift_factor();
        let drift = crate::machine::validity::drift(plan.ttl, factor);
        let suspended = r.suspended_by();
        let Some(valid_until) =
            crate::machine::validity::deadline_after_round(r.started, r.ended, plan.ttl, factor)
                .filter(|_| !suspended(drift))
        else {
            return Err(lost(LossReason::ExtendFailed));
        };
        let mut missing = planned.missing;
        for i in r.tally.yes_indices() {
            missing.remove(i);
        }
        let now = engine.timer.now();
        let hold_until = self
            .effective_max_hold()
            .and_then(|d| r.started.checked_add(d));
        // The lease's validity, as `Acquired` reports it: a hold limit is reported by its own loss. (Clamped
        // to a hold limit that the resuming round outlasted, the event would say the lease ended before it
        // was resumed.)
        engine.hook.emit(
            &self.key,
            id,
            now,
            EventKind::Resumed {
                valid_until,
                fence: ticket.fence,
            },
        );
        Ok(self.lease(Grant {
            key: self.key.clone(),
            token: ticket.token.clone(),
            ttl: plan.ttl,
            op_timeout: plan.op_timeout,
            fence: ticket.fence,
            renew_interval: self.renew_every,
            id,
            acquired_at: now,
            hold_until,
            round_started: r.started,
            wall_started: r.wall.0,
            unconfirmed: Some(ledger.snapshot(n)),
            missing,
            valid_until,
        }))
    }

    /// The checked TTL and operation timeout of an acquisition of this lock (for `crate::multi`).
    pub(crate) fn ttl_and_timeout(&self) -> Result<(Ttl, Duration), Error> {
        self.plan().map(|p| (p.ttl, p.op_timeout))
    }

    /// The fence counter of a fenced lock.
    pub(crate) fn fence_key(&self) -> Option<&str> {
        self.fence_key.as_deref()
    }

    /// Whether its leases are renewed in the background ([`auto_renew`](Self::auto_renew)).
    pub(crate) fn renews_in_background(&self) -> bool {
        self.background
    }

    /// This description without background renewal: the leases it grants are renewed by whoever takes
    /// them (a [`MultiLock`](crate::MultiLock) starts its set's renewal once the set is complete).
    pub(crate) fn in_foreground(&self) -> Self {
        Self {
            background: false,
            ..self.clone()
        }
    }

    /// A fresh token for an acquisition of this lock (with its holder info).
    pub(crate) fn new_token(&self) -> Result<Token, Error> {
        Ok(Token::random()?.with_info(self.holder_info.as_deref()))
    }

    /// The lease of an acquisition of this lock made outside its own rounds — one step that took several
    /// keys at once (`crate::multi`) — whose request was sent at `started` and which is valid until
    /// `valid_until`: its events and the lease, as [`won`](Self::won) makes them.
    pub(crate) fn granted(&self, taken: Taken) -> Lease {
        let Taken {
            id,
            token,
            fence,
            ttl,
            op_timeout,
            started,
            wall_started,
            valid_until,
            waited,
        } = taken;
        let engine = &self.engine;
        if let (Some(fence_key), Some(fence)) = (&self.fence_key, fence) {
            match engine.watch.lock() {
                Ok(mut w) => w.issued(fence_key, fence),
                Err(p) => p.into_inner().issued(fence_key, fence),
            }
        }
        let now = engine.timer.now();
        engine.hook.emit(
            &self.key,
            id,
            now,
            EventKind::Acquired {
                valid_until,
                fence,
                attempts: 1,
                waited,
                contended: false,
            },
        );
        self.lease(Grant {
            key: self.key.clone(),
            token,
            ttl,
            op_timeout,
            fence,
            renew_interval: self.renew_every,
            id,
            acquired_at: now,
            hold_until: self
                .effective_max_hold()
                .and_then(|d| started.checked_add(d)),
            round_started: started,
            wall_started,
            unconfirmed: None,
            missing: NodeSet::default(),
            valid_until,
        })
    }

    fn lease(&self, grant: Grant) -> Lease {
        let shared = Shared::new(Arc::clone(&self.engine), grant);
        if let Some(spawner) = &self.engine.spawner {
            // Nodes that never confirmed the key get it now, with the lease's own token (Redlock: a lease held
            // by a bare majority survives no further node failure). A lease renewed in the background gets it
            // from its first renewal round (which asks those nodes too) instead of a repair round competing
            // with it for the extension permit; without a spawner, the lease's next extension round does it.
            if shared.needs_repair() && !self.background {
                spawner.spawn(Box::pin(Arc::clone(&shared).repair()));
            }
        }
        if let (true, Some(spawner)) = (self.background, &self.engine.spawner) {
            if shared.claim_renewal() {
                shared.renew_in_background(spawner);
            }
        }
        Lease::new(shared)
    }
}

/// A key of a lock taken outside the lock's own rounds (by a step that took several keys at once, see
/// [`Lock::granted`]).
pub(crate) struct Taken {
    pub(crate) id: LeaseId,
    pub(crate) token: Token,
    /// The fencing token issued with it, if the lock is fenced.
    pub(crate) fence: Option<u64>,
    pub(crate) ttl: Ttl,
    pub(crate) op_timeout: Duration,
    /// When the request that took it was sent (on the monotonic and the wall clock).
    pub(crate) started: Instant,
    pub(crate) wall_started: Option<std::time::SystemTime>,
    pub(crate) valid_until: Instant,
    /// How long the acquisition waited for it.
    pub(crate) waited: Duration,
}
