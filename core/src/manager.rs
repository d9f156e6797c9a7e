//! Managers (single authority or Redlock), lock descriptions and acquisition.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::{Config, ConfigError};
use crate::driver::{Engine, Mode, Spawn};
use crate::error::{Error, NotAcquiredReason, Operation, QuorumError};
use crate::lease::{CleanupOnDrop, Grant, Lease, Shared};
use crate::machine::validity::deadline_after_round;
use crate::machine::{Backoff, Jitter, Verdict};
use crate::node::{RedisNode, Ttl};
use crate::time::{SharedTimer, SystemTimer, Timer};
use crate::token::Token;

/// Creates locks on one logical Redis authority or on a Redlock set of independent primaries.
///
/// Cheap to clone (all clones share nodes, configuration, timer and spawner).
///
/// ```
/// # use redlease::{Config, LockManager};
/// # fn nodes() -> Vec<redlease_testkit::MemoryNode> { (0..3).map(|_| redlease_testkit::MemoryNode::new()).collect() }
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
    /// [`endpoint`](RedisNode::endpoint); other [`ConfigError`]s for an invalid configuration.
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
        let mut seen = HashSet::new();
        for (i, node) in nodes.iter().enumerate() {
            if nodes[..i].iter().any(|other| Arc::ptr_eq(other, node)) {
                return Err(ConfigError::Topology(format!(
                    "node {i} is the same node object as an earlier one"
                )));
            }
            if let Some(endpoint) = node.endpoint() {
                if !seen.insert(endpoint.clone()) {
                    return Err(ConfigError::Topology(format!(
                        "node {i} names endpoint {endpoint} a second time; Redlock needs independent primaries"
                    )));
                }
            }
        }
        let jitter = match config.get_jitter_seed() {
            Some(seed) => Jitter::from_seed(seed),
            None => Jitter::from_os(),
        };
        Ok(Self {
            engine: Arc::new(Engine {
                nodes,
                mode,
                config,
                timer: SharedTimer(Arc::new(SystemTimer)),
                spawner: None,
                jitter: Mutex::new(jitter),
            }),
        })
    }

    fn rebuild(&self, f: impl FnOnce(&mut Engine)) -> Self {
        let e = &self.engine;
        let jitter = match e.jitter.lock() {
            Ok(j) => j.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let mut engine = Engine {
            nodes: e.nodes.clone(),
            mode: e.mode,
            config: e.config.clone(),
            timer: e.timer.clone(),
            spawner: e.spawner.clone(),
            jitter: Mutex::new(jitter),
        };
        f(&mut engine);
        Self {
            engine: Arc::new(engine),
        }
    }

    /// Uses `timer` for every clock reading and sleep (virtual time in tests, a runtime's timer in production).
    #[must_use]
    pub fn with_timer(self, timer: impl Timer) -> Self {
        let timer = SharedTimer(Arc::new(timer));
        self.rebuild(|e| e.timer = timer)
    }

    /// Lets redlease run background tasks through `spawner`: automatic renewal of leases whose lock has
    /// [`auto_renew`](Lock::auto_renew), and clean-up after a lease or an acquisition is dropped.
    ///
    /// ```
    /// # use redlease::{Config, LockManager};
    /// # let node = redlease_testkit::MemoryNode::new();
    /// let manager = LockManager::single(node, Config::default())
    ///     .unwrap()
    ///     .with_spawner(|task| { std::thread::spawn(move || futures_executor_stub(task)); });
    /// # fn futures_executor_stub(_t: redlease::Task) {}
    /// ```
    #[must_use]
    pub fn with_spawner(self, spawner: impl Spawn + 'static) -> Self {
        let spawner: Arc<dyn Spawn> = Arc::new(spawner);
        self.rebuild(|e| e.spawner = Some(spawner))
    }

    /// Describes a lock on `key` with this manager's defaults; adjust it with the builder methods.
    pub fn lock(&self, key: impl Into<String>) -> Lock {
        Lock {
            engine: Arc::clone(&self.engine),
            key: key.into(),
            expiry: None,
            auto_renew: None,
            fence_key: None,
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
}

/// A description of a lock: its key and options. Acquiring it yields a [`Lease`].
///
/// Cheap to clone; acquiring the same description from several tasks makes them contend.
#[derive(Clone)]
pub struct Lock {
    engine: Arc<Engine>,
    key: String,
    expiry: Option<Duration>,
    auto_renew: Option<Duration>,
    fence_key: Option<String>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.key)
            .field("expiry", &self.get_expiry())
            .field("auto_renew", &self.auto_renew)
            .field("fence_key", &self.fence_key)
            .finish()
    }
}

/// How long an acquisition keeps trying.
#[derive(Clone, Copy)]
enum Limit {
    Attempts(u32),
    Until(Instant),
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

    /// Renews the lease every `interval` (it must be shorter than the expiry; a third of it is typical).
    ///
    /// Renewal runs inside [`Lease::run`], or in the background when the manager has a
    /// [spawner](LockManager::with_spawner). A failing renewal marks the lease
    /// [at risk](crate::LeaseState::AtRisk) and retries while validity remains; the lease is reported lost no
    /// later than its validity deadline.
    #[must_use]
    pub fn auto_renew(mut self, interval: Duration) -> Self {
        self.auto_renew = Some(interval);
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

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The effective lease TTL.
    pub fn get_expiry(&self) -> Duration {
        self.expiry.unwrap_or(self.engine.config.get_expiry())
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
        if self.key.is_empty() {
            return Err(ConfigError::InvalidKey("the lock key is empty").into());
        }
        if let Some(fence_key) = &self.fence_key {
            if self.engine.mode == Mode::Redlock {
                return Err(Error::FencingUnsupported);
            }
            if fence_key.is_empty() {
                return Err(ConfigError::InvalidKey("the fence key is empty").into());
            }
            if *fence_key == self.key {
                return Err(
                    ConfigError::InvalidKey("the fence key must differ from the lock key").into(),
                );
            }
        }
        let expiry = self.get_expiry();
        let ttl = config.check_expiry(expiry)?;
        if let Some(interval) = self.auto_renew {
            config.check_renewal(interval, expiry)?;
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
        self.acquire_with(Limit::Attempts(self.engine.config.get_attempts()))
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
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire_within(&self, patience: Duration) -> Result<Lease, Error> {
        let deadline = crate::time::add(self.engine.timer.now(), patience);
        self.acquire_with(Limit::Until(deadline)).await
    }

    async fn acquire_with(&self, limit: Limit) -> Result<Lease, Error> {
        let plan = self.plan()?;
        let token = Token::random()?;
        let engine = &self.engine;
        let config = &engine.config;
        let n = engine.nodes.len();
        let mut backoff = Backoff::new(
            config.get_retry_delay(),
            config.get_retry_jitter(),
            Jitter::from_seed(engine.next_seed()),
        );
        let mut guard = CleanupOnDrop::new(engine, &self.key, &token, plan.op_timeout);
        let mut attempt = 0u32;
        // Allocated on the first failed attempt only: the common path never needs it.
        let mut dirty: Vec<bool> = Vec::new();
        loop {
            attempt += 1;
            let mut timeout = plan.op_timeout;
            if let Limit::Until(deadline) = limit {
                timeout = timeout.min(deadline.saturating_duration_since(engine.timer.now()));
            }
            let r = engine
                .acquire_round(
                    &self.key,
                    self.fence_key.as_deref(),
                    &token,
                    plan.ttl,
                    timeout,
                    attempt == 1,
                )
                .await;
            let reason = if r.tally.verdict() == Verdict::Quorum {
                if let Some(valid_until) =
                    deadline_after_round(r.started, r.ended, plan.ttl, config.get_drift_factor())
                {
                    guard.disarm();
                    drop(guard);
                    let fence = match self.fence_key {
                        Some(_) => r.values.first().copied().flatten().flatten(),
                        None => None,
                    };
                    return Ok(self.lease(token, plan, fence, r.started, valid_until));
                }
                NotAcquiredReason::ValidityExhausted
            } else if r.tally.no() > n - engine.quorum() {
                NotAcquiredReason::Contended
            } else {
                NotAcquiredReason::TooFewNodes
            };
            // Delete our token wherever this or an earlier attempt may have written it and no clean-up has
            // confirmed it gone since. A definite refusal or a definitely-not-applied error left nothing.
            dirty.resize(n, false);
            for i in r.tally.maybe_applied_indices() {
                dirty[i] = true;
            }
            let targets: Vec<usize> = (0..n).filter(|&i| dirty[i]).collect();
            for i in engine
                .cleanup(&self.key, &token, plan.op_timeout, Some(&targets))
                .await
            {
                dirty[i] = false;
            }

            let pause = backoff.next_pause();
            let now = engine.timer.now();
            let more = match limit {
                Limit::Attempts(max) => attempt < max,
                Limit::Until(deadline) => crate::time::add(now, pause) < deadline,
            };
            if !more {
                guard.disarm();
                let errors = r.tally.errors();
                let last_error = (!errors.is_empty()).then(|| {
                    Box::new(QuorumError::new(
                        Operation::Acquire,
                        r.tally.yes(),
                        r.tally.required(),
                        errors,
                    ))
                });
                return Err(Error::NotAcquired {
                    key: self.key.clone(),
                    attempts: attempt,
                    reason,
                    last_error,
                });
            }
            engine.timer.sleep_until(crate::time::add(now, pause)).await;
        }
    }

    fn lease(
        &self,
        token: Token,
        plan: Plan,
        fence: Option<u64>,
        started: Instant,
        valid_until: Instant,
    ) -> Lease {
        let shared = Arc::new(Shared::new(
            Arc::clone(&self.engine),
            Grant {
                key: self.key.clone(),
                token,
                ttl: plan.ttl,
                op_timeout: plan.op_timeout,
                fence,
                renew_interval: self.auto_renew,
                round_started: started,
                valid_until,
            },
        ));
        if let (Some(_), Some(spawner)) = (self.auto_renew, &self.engine.spawner) {
            if shared.claim_renewal() {
                // Boxed once: the renewal loop stops by itself when the lease ends.
                spawner.spawn(Box::pin(Arc::clone(&shared).renew()));
            }
        }
        Lease::new(shared)
    }
}
