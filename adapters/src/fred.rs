//! [`RedisNode`] for fred: a [`Client`] or a [`Pool`], centralized, sentinel or clustered, through one generic
//! [`FredNode`].
//!
//! ```no_run
//! use redlease::{Config, LockManager};
//! use redlease_adapters::fred::{FredNode, fred::prelude::*};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = fred::prelude::Config::from_url("redis://127.0.0.1:6379/0")?;
//! let pool = Builder::from_config(config).build_pool(4)?;
//! pool.init().await?;
//! let manager = LockManager::single(FredNode::new(pool), redlease::Config::default())?;
//! let lease = manager.lock("jobs:{nightly}:lock").acquire().await?;
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Re-sending is switched off per command
//!
//! By default fred re-sends commands that were in flight when a connection closed, once it has reconnected
//! (`ConnectionConfig::max_command_attempts`, default 3), and follows cluster redirections. A lock command
//! re-sent blindly can run twice, and late: a repeated release reports "not held" after its first copy
//! succeeded, and an acquire re-sent after redlease gave up re-takes the lock for nobody until its TTL runs
//! out. So every command of a [`FredNode`] carries its own [`Options`]: `max_attempts: Some(1)` (written at
//! most once; if its connection closes the caller gets the error instead of a replay) and `fail_fast: true`
//! (while the client is not connected the command fails at once, unsent, instead of queueing until a
//! reconnection that may come after redlease's timeout). The client's own settings for other commands are
//! untouched. Transactions (`MULTI … EXEC`, used where the server runs no Lua) are sent as plain pipelines
//! of those commands, not through fred's transaction API, which re-sends a whole transaction once after
//! reconnecting whatever `max_attempts` says, from inside its connection task (so after the caller may have
//! given up); a transaction whose reply is lost is an error, never a second run.
//!
//! On Redis Cluster, following a `MOVED`/`ASK` redirection would be a second write, which
//! `max_attempts: Some(1)` refuses ("too many failed write attempts"; fred refreshes its slot map first, so
//! the next command is routed correctly). fred gives the same error to a command that was in flight when it
//! reconnected, which may have run; a [`FredNode`] tells the two apart by fred's connection notifications and
//! reports the redirection as a definite [`NodeErrorKind::Cluster`] error, the other as ambiguous.
//!
//! # Ordering
//!
//! Requests for one key sent by one node are applied in the order they were sent, or a stale one fails. A
//! [`Client`] writes its commands in call order on one connection per server. A [`Pool`] would spread
//! commands over its clients, and two commands for one key on two connections can be applied in either
//! order; so a [`PoolNode`] sends every command for one key through one pool member, chosen by the key's
//! hash slot ([`KeyRouted`]). After a reconnect, a command from the old connection may still be applied
//! late, but its caller got an error (ambiguous), never a success.
//!
//! # Not connected, dead servers and starting while a server is down
//!
//! A [`FredNode`] checks the client's state before each command: while the client is not connected, or once
//! the node has seen the connection fail and fred has not reported a new connection since, the command
//! fails at once with a definite [`NodeErrorKind::Connection`] error (nothing sent). So after a server dies
//! (`kill -9`) only the commands already in flight are ambiguous; later ones fail promptly. When the last
//! connection attempt was refused for authentication (a wrong or rotated password) that error is
//! [`NodeErrorKind::Auth`] instead.
//!
//! `init()` fails while the server is down. To start a service while some of its servers are down (Redlock
//! survives a minority), build the node with [`FredNode::lazy`]: it connects on first use, and its calls
//! fail definitely until the server is up.
//!
//! # Timeouts to set
//!
//! redlease bounds every node call by its operation timeout (by dropping the future; fred still writes a
//! command it has already dequeued). Set on the client's `ConnectionConfig`:
//!
//! - `connection_timeout` and `internal_command_timeout` small (≤ the operation timeout), so reconnection is
//!   quick and a dead server is noticed;
//! - optionally a per-command timeout with [`FredNode::with_command_timeout`] (or
//!   `PerformanceConfig::default_command_timeout`) of about the operation timeout; it is reported as an
//!   ambiguous [`NodeErrorKind::Timeout`].
//!
//! Set a `ReconnectPolicy` with a delay (not a tight loop): fred reconnects by itself, and with a refused
//! password every attempt is a new connection the server sees.
//!
//! # The capability check
//!
//! Before the first acquisition (and again after a failed connection) the node checks that the user may run
//! everything a lease needs (`EVAL` and the commands inside the scripts), so that `try_acquire()`
//! never hands out a lease it cannot extend or release; see [`crate::scripts::PROBE`] and
//! [`FredNode::probe`].
//!
//! # Errors
//!
//! Redis error replies (`NOSCRIPT`, `OOM`, `READONLY`, `NOPERM`, `WRONGTYPE`, …), fail-fast refusals,
//! redirections and refused connections are definite ([`NodeError::not_applied`]); I/O errors, timeouts and
//! closed connections after writing are ambiguous. See [`node_error`].
//!
//! Every script goes out as `EVALSHA`; on a `NOSCRIPT` reply (a definite refusal) it is sent once more as
//! `EVAL`, so it runs at most once. On a cluster each command is routed to the lock key's slot.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::clients::{Client, Pool};
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::types::config::{Options, Server, ServerConfig};
use fred::types::{ClientState, ClusterHash, CustomCommand, Value};
use redlease::notify::{self, Inbox, Notifier, SubscribeFuture, Subscriber};
use redlease::{
    Claim, Config, KeyState, LockManager, NodeError, NodeErrorKind, Readiness, RedisNode, Token,
    Ttl, async_trait,
};

use crate::ops::{self, Probe, Transport, Verb};
use crate::scripts::{self, Reply, Script};
use crate::slot;
use crate::{Capabilities, Commands, SetupError, Timeouts};
use tokio::sync::broadcast;

/// The fred client crate, re-exported so that versions match.
pub use ::fred;

/// A fred client a [`FredNode`] can send on, and which of its clients carries the commands for one key.
///
/// Implemented for [`Client`] (itself) and [`Pool`] (one member per key, by hash slot), so that every command
/// for one key goes over one connection, in order.
pub trait KeyRouted: ClientLike + Clone + Send + Sync + 'static {
    /// The clients commands are sent on: the client itself, or a pool's members.
    fn members(&self) -> &[Client];

    /// The index in [`members`](Self::members) of the client that carries every command for `key`.
    fn member_for_key(&self, key: &str) -> usize {
        usize::from(slot::hash_slot(key.as_bytes())) % self.members().len().max(1)
    }
}

impl KeyRouted for Client {
    fn members(&self) -> &[Client] {
        std::slice::from_ref(self)
    }

    /// Its only member (the key's slot is not computed).
    fn member_for_key(&self, _key: &str) -> usize {
        0
    }
}

impl KeyRouted for Pool {
    fn members(&self) -> &[Client] {
        self.clients()
    }
}

/// What a node learned about one member client's connection from its errors and fred's notifications, behind
/// one lock (every command reads all of it before it is sent).
struct Health(Mutex<HealthState>);

struct HealthState {
    /// When a command last failed because the connection is gone, or fred last announced a connection error;
    /// cleared by fred's next reconnection.
    broken: Option<Instant>,
    /// When the node last told fred to reconnect a Sentinel client whose primary stopped answering
    /// ([`FredNode::primary_unresponsive`]).
    forced: Option<Instant>,
    reconnects: broadcast::Receiver<Server>,
    errors: broadcast::Receiver<(FredError, Option<Server>)>,
    /// The last connection error fred reported (kept: a later check may drain the channel first).
    last_error: Option<FredError>,
}

impl Health {
    fn new(client: &Client) -> Self {
        Self(Mutex::new(HealthState {
            broken: None,
            forced: None,
            reconnects: client.reconnect_rx(),
            errors: client.error_rx(),
            last_error: None,
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mark_broken(&self) {
        self.lock().mark_broken();
    }

    /// The last connection error fred reported since the last reconnection, if any.
    fn last_error(&self) -> Option<FredError> {
        let mut state = self.lock();
        state.saw_errors();
        state.last_error.clone()
    }
}

impl HealthState {
    fn mark_broken(&mut self) {
        self.broken = Some(Instant::now());
    }

    /// Healed by a reconnection: the connection errors announced before it are superseded.
    fn heal(&mut self) {
        self.broken = None;
        self.last_error = None;
    }

    /// Whether fred reconnected since the last call (also after missed notifications).
    fn reconnected(&mut self) -> bool {
        // `is_empty` first: one lock of the channel where `try_recv` on an empty channel takes two.
        if self.reconnects.is_empty() {
            return false;
        }
        let mut seen = false;
        loop {
            match self.reconnects.try_recv() {
                Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => seen = true,
                Err(_) => return seen,
            }
        }
    }

    /// Whether fred reported connection errors since the last call; keeps the last one.
    fn saw_errors(&mut self) -> bool {
        if self.errors.is_empty() {
            return false;
        }
        let mut seen = false;
        loop {
            match self.errors.try_recv() {
                Ok((err, _)) => {
                    self.last_error = Some(err);
                    seen = true;
                }
                Err(broadcast::error::TryRecvError::Lagged(_)) => seen = true,
                Err(_) => return seen,
            }
        }
    }
}

/// How a lazy node starts fred's connection task: one call at a time makes a connection attempt, and the
/// calls made while it is under way wait for it and take its outcome (so that concurrent first calls do not
/// fail as "not connected" while the first connection is being made).
#[derive(Default)]
struct LazyStart {
    /// Whether `connect()` was called already (and fred's task may still be running).
    started: AtomicBool,
    /// Whether an attempt is under way (set before `started`, cleared after `attempts` counted it).
    in_progress: AtomicBool,
    /// Attempts finished so far.
    attempts: AtomicU64,
    /// Whether the last attempt was dropped before it finished (its call was cut by a timeout, or its quorum
    /// was reached without it): the next call, or one waiting, takes it over.
    abandoned: AtomicBool,
    /// Held by the call that makes the attempt; the others wait on it.
    gate: tokio::sync::Mutex<()>,
}

/// Ends an attempt of [`LazyStart`]: finished, or abandoned when the call making it is dropped first.
struct Attempt<'a> {
    lazy: &'a LazyStart,
    finished: bool,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if self.finished {
            self.lazy.attempts.fetch_add(1, Ordering::AcqRel);
        }
        self.lazy.abandoned.store(!self.finished, Ordering::Release);
        self.lazy.in_progress.store(false, Ordering::Release);
    }
}

/// A [`RedisNode`] over a fred client `C`: a [`Client`] ([`ClientNode`]) or a [`Pool`] ([`PoolNode`]).
///
/// Built with [`new`](Self::new) for a connected client, or [`lazy`](Self::lazy) for one that connects on
/// first use. Both read the client's config to decide whether to check Redis Cluster hash slots and what
/// [`endpoint`](RedisNode::endpoint) to report.
#[derive(Clone)]
pub struct FredNode<C> {
    client: C,
    endpoint: Option<String>,
    cluster: bool,
    timeout: Option<Duration>,
    fail_fast: bool,
    /// For [`lazy`](Self::lazy) nodes: the state of the first connection.
    connect_started: Option<Arc<LazyStart>>,
    /// One per member client, in [`KeyRouted::members`] order.
    health: Arc<Vec<Health>>,
    probe: Probe,
    /// Release notifications over a subscriber client of the node's own.
    notifier: Option<Notifier>,
    /// Clients of the node's own for durability waits (one server only; see [`FredWaiter`]).
    waiter: Option<FredWaiter>,
}

/// A node over one fred [`Client`].
pub type ClientNode = FredNode<Client>;
/// A node over a fred [`Pool`] (every command for one key goes to the same pool member).
pub type PoolNode = FredNode<Pool>;

impl<C> fmt::Debug for FredNode<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FredNode")
            .field("client", &std::any::type_name::<C>())
            .field("endpoint", &self.endpoint)
            .field("cluster", &self.cluster)
            .field("timeout", &self.timeout)
            .field("fail_fast", &self.fail_fast)
            .field("lazy", &self.connect_started.is_some())
            .finish()
    }
}

/// The identity of a fred config, without credentials: `redis://host:port/db` for a centralized server,
/// `redis-cluster://host:port,…` (sorted) for a cluster, `redis-sentinel://host:port,…/service/db` for sentinel.
fn config_endpoint(config: &fred::types::config::Config) -> Option<String> {
    let db = config.database.unwrap_or(0);
    let hosts = |servers: &[fred::types::config::Server]| {
        let mut v: Vec<String> = servers
            .iter()
            .map(|s| format!("{}:{}", &*s.host, s.port))
            .collect();
        v.sort();
        v.join(",")
    };
    match &config.server {
        ServerConfig::Centralized { server } => {
            Some(format!("redis://{}:{}/{db}", &*server.host, server.port))
        }
        ServerConfig::Clustered { hosts: servers, .. } => {
            Some(format!("redis-cluster://{}", hosts(servers)))
        }
        ServerConfig::Sentinel {
            hosts: servers,
            service_name,
            ..
        } => Some(format!(
            "redis-sentinel://{}/{service_name}/{db}",
            hosts(servers)
        )),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

impl<C: KeyRouted> FredNode<C> {
    /// A node over `client` (a [`Client`] or a [`Pool`]), which you connected (`init`). The cluster slot check
    /// is on for clustered configs; the endpoint is derived from the config (host and port, never
    /// credentials).
    pub fn new(client: C) -> Self {
        let config = client.client_config();
        let cluster = config.server.is_clustered();
        let notifier = client.members().first().map(|member| {
            Notifier::new(
                FredSubscriber {
                    template: member.clone_new(),
                    cluster,
                    current: Arc::default(),
                },
                notify::DEFAULT_MAX_CHANNELS,
            )
        });
        // One server behind the config: a client of the same config reaches the server that carried the
        // write. Behind Sentinel it may reach another primary after a failover, so each wait there checks
        // the server (see `FredWaiter`); on a cluster `WAIT` is refused anyway.
        let sentinel = matches!(config.server, ServerConfig::Sentinel { .. });
        let waiter = (sentinel || matches!(config.server, ServerConfig::Centralized { .. }))
            .then(|| {
                client
                    .members()
                    .first()
                    .map(|member| FredWaiter::new(member, sentinel))
            })
            .flatten();
        Self {
            notifier,
            waiter,
            endpoint: config_endpoint(&config),
            cluster,
            timeout: None,
            fail_fast: true,
            connect_started: None,
            health: Arc::new(client.members().iter().map(Health::new).collect()),
            client,
            probe: Probe::default(),
        }
    }

    /// A node over a client that is not connected yet: the first call starts fred's connection task
    /// (`connect()`) and waits for the connection up to the client's connection timeout. If that first
    /// connection fails, fred's task ends (with the client's default `fail_fast`) and the next call starts it
    /// again: one connection attempt per call while the server is down, each failing the call definitely.
    /// Calls made while that connection is being made wait for it (up to the same timeout) rather than fail
    /// as "not connected", so N calls made at once on a fresh node behave as N calls on a connected one.
    /// Once connected, fred reconnects by the client's `ReconnectPolicy`. Building the node sends nothing,
    /// so a Redlock service can start while some servers are down.
    pub fn lazy(client: C) -> Self {
        let mut node = Self::new(client);
        node.connect_started = Some(Arc::default());
        node
    }

    /// Chooses which commands the node sends (scripts, native commands, or each where it works: the
    /// default); see [`Commands`]. Forgets what the capability check learned.
    pub fn with_commands(self, commands: Commands) -> Self {
        self.probe.set_mode(commands);
        self
    }

    /// What the capability check learned about the current connection, if it ran since the connection was
    /// (re)established.
    pub fn capabilities(&self) -> Option<Capabilities> {
        self.probe.get()
    }

    /// Sets the most channels the node (and its clones) subscribes at once for waiting acquisitions (default
    /// [`notify::DEFAULT_MAX_CHANNELS`]); waiters beyond that poll.
    pub fn with_channel_budget(self, max_channels: usize) -> Self {
        if let Some(n) = &self.notifier {
            n.set_max_channels(max_channels);
        }
        self
    }

    /// Turns release notifications off: waiting acquisitions poll this node. (Its releases still publish.)
    pub fn without_notifications(mut self) -> Self {
        self.notifier = None;
        self
    }

    /// Runs the capability check now (it otherwise runs before the first acquisition), with `example_key`
    /// standing for the lock keys (choose one your ACL key patterns allow), and remembers the answer until
    /// a connection fails. A definite [`NodeErrorKind::Auth`] error names what the user may not run.
    pub async fn probe(&self, example_key: &str) -> Result<(), NodeError> {
        ops::check(self, example_key, None).await.map(|_| ())
    }
}

impl<C> FredNode<C> {
    /// Replaces the identity reported by [`RedisNode::endpoint`] (used to reject a Redlock topology that names
    /// one server twice). Do not put credentials in it.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// A per-command timeout passed to fred (`Options::timeout`). Without it the client's
    /// `default_command_timeout` applies (none by default; redlease's operation timeout still bounds calls).
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Whether commands fail at once, unsent, while the client is not connected or after fred announced a
    /// dropped connection and has not reconnected since (default `true`). With `false` they wait for the
    /// reconnection (still written at most once), which can outlast redlease's operation timeout and then
    /// run late.
    pub fn with_fail_fast(mut self, fail_fast: bool) -> Self {
        self.fail_fast = fail_fast;
        self
    }

    /// The underlying client.
    pub fn client(&self) -> &C {
        &self.client
    }

    /// Returns the underlying client.
    pub fn into_inner(self) -> C {
        self.client
    }
}

impl ClientNode {
    /// A [lazy](FredNode::lazy) node over a new fred [`Client`] for `url`, with `timeouts`: the connection
    /// timeout as fred's `connection_timeout` and `internal_command_timeout`, the response timeout as the
    /// node's [command timeout](FredNode::with_command_timeout), and a reconnection policy with backoff
    /// (100 ms doubling to 2 s). The endpoint is derived from the URL (never its credentials). Nothing is
    /// sent until the first call.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlease::{Config, LockManager};
    /// use redlease_adapters::Timeouts;
    /// use redlease_adapters::fred::ClientNode;
    ///
    /// # fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let timeouts = Timeouts::new(Duration::from_millis(300), Duration::from_millis(500))?;
    /// let node = ClientNode::from_url("redis://127.0.0.1:6379/0", timeouts)?;
    /// let manager = LockManager::single(node, Config::default())?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`SetupError::Url`] for a URL fred cannot parse.
    pub fn from_url(url: &str, timeouts: Timeouts) -> Result<Self, SetupError> {
        lazy_from_url(0, url, timeouts)
    }
}

fn lazy_from_url(index: usize, url: &str, timeouts: Timeouts) -> Result<ClientNode, SetupError> {
    use fred::types::Builder;
    use fred::types::config::ReconnectPolicy;
    // fred takes any scheme for a centralized server (`http://…` included): only Redis's and Valkey's.
    if let Some((scheme, _)) = url.split_once("://")
        && !(scheme.starts_with("redis") || scheme.starts_with("valkey"))
    {
        return Err(SetupError::url(
            index,
            url,
            format!(
                "unsupported scheme `{scheme}` (expected redis, rediss, redis-cluster, redis-sentinel or their valkey forms)"
            ),
        ));
    }
    let config =
        fred::types::config::Config::from_url(url).map_err(|e| SetupError::url(index, url, e))?;
    let client = Builder::from_config(config)
        .with_connection_config(|c| {
            c.connection_timeout = timeouts.connection();
            c.internal_command_timeout = timeouts.connection();
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 100, 2_000, 2))
        .build()
        .map_err(|e| SetupError::url(index, url, e))?;
    Ok(FredNode::lazy(client).with_command_timeout(timeouts.response()))
}

/// A single-authority manager for the server at `url`, in one line: a [`ClientNode::from_url`] with
/// [`Timeouts::for_config`] (both the operation timeout) and tokio's timer
/// ([`RuntimeTimer`](crate::runtime::RuntimeTimer)). Call it anywhere; use the manager on tokio.
///
/// ```no_run
/// use redlease::Config;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let manager = redlease_adapters::fred::single("redis://127.0.0.1:6379/0", Config::default())?;
/// let lease = manager.lock("jobs:{nightly}:lock").acquire().await?;
/// lease.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`SetupError::Url`] for a URL fred cannot parse; [`SetupError::Config`] for an invalid `config`.
pub fn single(url: &str, config: Config) -> Result<LockManager, SetupError> {
    let node = lazy_from_url(0, url, Timeouts::for_config(&config)?)?;
    Ok(LockManager::single(node, config)?.with_timer(crate::runtime::RuntimeTimer))
}

/// A Redlock manager over the independent servers at `urls` (an odd number, at least 3), in one line; each
/// node as in [`single`], so the manager starts while a minority of the servers is down. Two URLs naming
/// one server (same host, port and database as written) are refused.
///
/// # Errors
/// [`SetupError::Url`] for the first URL fred cannot parse (with its index); [`SetupError::Config`] for an
/// invalid `config`, or a topology Redlock refuses (an even number, fewer than 3, a duplicate).
pub fn redlock<I>(urls: I, config: Config) -> Result<LockManager, SetupError>
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    let timeouts = Timeouts::for_config(&config)?;
    let nodes = urls
        .into_iter()
        .enumerate()
        .map(|(i, url)| lazy_from_url(i, url.as_ref(), timeouts))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LockManager::redlock(nodes, config)?.with_timer(crate::runtime::RuntimeTimer))
}

const FAIL_FAST_DETAILS: &str = "Connection closed unexpectedly.";

/// Classifies a fred error into a [`NodeError`] for redlease (assuming the command was sent with
/// `max_attempts: Some(1)`, as [`FredNode`] does).
///
/// - a Redis error reply (fred keeps the reply line, `CODE detail…`, as the details) → definite, kind from its
///   code (`NOSCRIPT`, `OOM`, `READONLY`, `NOPERM` → `Auth`, `MOVED`/`ASK`/`TRYAGAIN`/`CLUSTERDOWN` →
///   `Cluster`, `BUSY`/`LOADING`/`MASTERDOWN` → `Busy`, `WRONGTYPE`, `FENCE` → `Fence`, …);
/// - a refused authentication of the connection (`WRONGPASS`, `NOAUTH`) → definite `Auth`;
/// - fail-fast refusal (client not connected) and refused connections → definite `Connection`;
/// - "too many redirections" (the server answered `MOVED`/`ASK`, a refusal) → definite `Cluster`;
/// - routing failures and backpressure (nothing written) → definite `Cluster` / `Busy`;
/// - client-side argument or configuration errors → definite `Other`;
/// - timeouts → ambiguous `Timeout`; I/O errors, closed connections and cancellations → ambiguous;
/// - "too many failed write attempts" → ambiguous `Connection`: fred raises it when a command already written
///   once is queued again, which happens to commands in flight when fred reconnects (a [`FredNode`] on a
///   cluster reports it as a definite `Cluster` redirection when no reconnection happened meanwhile);
/// - malformed replies → ambiguous `Protocol`; anything else → ambiguous `Other`.
pub fn node_error(err: &FredError) -> NodeError {
    classify(None, err)
}

const TOO_MANY_REDIRECTIONS: &str = "Too many redirections.";
/// How long a node that saw its connection fail waits, with fred reporting itself connected and silent,
/// before it sends again without a reconnection notice (at least the connection timeout).
const PROBATION: Duration = Duration::from_secs(1);
const SECOND_WRITE: &str = "Too many failed write attempts";

/// Whether fred refused to write a command a second time (see [`node_error`]).
fn is_second_write(err: &NodeError) -> bool {
    use std::error::Error as _;
    err.source()
        .and_then(|s| s.downcast_ref::<FredError>())
        .is_some_and(|e| e.details().starts_with(SECOND_WRITE))
}
/// fred's answer when it has no connection to write a command on (checked before writing).
const NO_ROUTE: &str = "Failed to route command.";

fn classify(script: Option<&Script>, err: &FredError) -> NodeError {
    let what = script.map_or("the command", |s| s.name);
    let details = err.details();
    let first = details.split_whitespace().next().unwrap_or("");
    let connection_auth = *err.kind() == ErrorKind::Auth
        && (matches!(first, "WRONGPASS" | "NOAUTH") || !scripts::looks_like_error_code(first));
    let server_reply = matches!(
        err.kind(),
        ErrorKind::Unknown
            | ErrorKind::InvalidArgument
            | ErrorKind::InvalidCommand
            | ErrorKind::Auth
            | ErrorKind::Cluster
            | ErrorKind::Config
    ) && scripts::looks_like_error_code(first);
    let node_err = if connection_auth {
        NodeError::not_applied(
            NodeErrorKind::Auth,
            format!("{what}: the connection's authentication was refused ({details})"),
        )
    } else if server_reply {
        scripts::server_error(script.unwrap_or(&scripts::COMMAND), details)
    } else {
        match err.kind() {
            ErrorKind::Canceled if details == FAIL_FAST_DETAILS => NodeError::not_applied(
                NodeErrorKind::Connection,
                format!("{what}: the client is not connected (fail-fast, not sent)"),
            ),
            ErrorKind::IO if details.contains("ConnectionRefused") => NodeError::not_applied(
                NodeErrorKind::Connection,
                format!("{what}: connection refused"),
            ),
            ErrorKind::IO | ErrorKind::Canceled => NodeError::ambiguous(
                NodeErrorKind::Connection,
                format!(
                    "{what}: connection closed or I/O error; the request may have been sent ({details})"
                ),
            ),
            ErrorKind::Timeout => NodeError::ambiguous(
                NodeErrorKind::Timeout,
                format!("{what}: no reply before fred's command timeout"),
            ),
            ErrorKind::Routing if details == TOO_MANY_REDIRECTIONS => NodeError::not_applied(
                NodeErrorKind::Cluster,
                format!(
                    "{what}: the server redirected the command (MOVED/ASK), which redlease does not follow; \
                     fred refreshed its slot map, so the next call is routed anew"
                ),
            ),
            ErrorKind::Routing => NodeError::not_applied(
                NodeErrorKind::Cluster,
                format!("{what}: no route to the key's server ({details})"),
            ),
            ErrorKind::Backpressure => NodeError::not_applied(
                NodeErrorKind::Busy,
                format!("{what}: client backpressure ({details})"),
            ),
            ErrorKind::Cluster => {
                NodeError::not_applied(NodeErrorKind::Cluster, format!("{what}: {details}"))
            }
            ErrorKind::Config
            | ErrorKind::Url
            | ErrorKind::InvalidArgument
            | ErrorKind::InvalidCommand => NodeError::not_applied(
                NodeErrorKind::Other,
                format!("{what}: refused by the client before sending ({details})"),
            ),
            ErrorKind::Unknown if details == NO_ROUTE => NodeError::not_applied(
                NodeErrorKind::Connection,
                format!("{what}: no connection to the server (not sent)"),
            ),
            ErrorKind::Unknown if details.starts_with(SECOND_WRITE) => NodeError::ambiguous(
                NodeErrorKind::Connection,
                format!(
                    "{what}: fred queued the command again after writing it once (a reconnection with the \
                         command in flight); it may have been applied"
                ),
            ),
            ErrorKind::Protocol | ErrorKind::Parse | ErrorKind::NotFound => NodeError::ambiguous(
                NodeErrorKind::Protocol,
                format!("{what}: malformed reply ({})", err.kind().to_str()),
            ),
            _ => NodeError::ambiguous(NodeErrorKind::Other, format!("{what}: {err}")),
        }
    };
    node_err.with_source(err.clone())
}

fn to_reply(value: Value) -> Reply {
    match value {
        Value::Null => Reply::Nil,
        Value::Integer(n) => Reply::Int(n),
        Value::String(s) => Reply::Bytes(s.as_bytes().to_vec()),
        Value::Bytes(b) => Reply::Bytes(b.to_vec()),
        Value::Array(items) => Reply::Array(items.into_iter().map(to_reply).collect()),
        Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        // A RESP3 double (a sorted set's score): the decimal text RESP2 gives.
        Value::Double(f) => Reply::Bytes(f.to_string().into_bytes()),
        Value::Map(_) => Reply::Other("a map"),
        Value::Queued => Reply::Other("QUEUED"),
    }
}

impl<C: KeyRouted> FredNode<C> {
    fn options(&self) -> Options {
        Options {
            max_attempts: Some(1),
            timeout: self.timeout,
            fail_fast: self.fail_fast,
            ..Options::default()
        }
    }

    /// For a lazy node, starts fred's connection task (once, or again after it ended without connecting) and
    /// waits for the connection, bounded by the client's connection timeout. A call made while another call's
    /// attempt is under way waits for that attempt and takes its outcome.
    async fn start(&self) {
        let Some(lazy) = &self.connect_started else {
            return;
        };
        let seen = lazy.attempts.load(Ordering::Acquire);
        let _gate = lazy.gate.lock().await;
        if lazy.attempts.load(Ordering::Acquire) != seen {
            // Another call's attempt ended while this one waited: its outcome stands (connected, or failed:
            // then this call fails at once rather than waiting out another connection timeout).
            return;
        }
        let clients = self.client.members();
        // Started before, but fred's connection task ended without a connection: with `fail_fast` it gives up
        // after its first attempt, which can end after the wait below timed out (a handshake that is slow to
        // fail). Nothing would start it again, and every call would be refused: start it again now.
        let gave_up = clients
            .iter()
            .all(|c| c.state() == ClientState::Disconnected);
        if lazy.started.load(Ordering::Acquire)
            && !gave_up
            && !lazy.abandoned.load(Ordering::Acquire)
        {
            return;
        }
        lazy.in_progress.store(true, Ordering::Release);
        let mut attempt = Attempt {
            lazy,
            finished: false,
        };
        lazy.started.store(true, Ordering::Release);
        let wait = self.client.connection_config().connection_timeout;
        for client in clients {
            if client.state() == ClientState::Disconnected {
                drop(client.connect());
            }
        }
        let connected = async {
            let mut all = true;
            for client in clients {
                all &= client.wait_for_connect().await.is_ok();
            }
            all
        };
        let outcome = tokio::time::timeout(wait, connected).await;
        attempt.finished = true;
        match outcome {
            Ok(true) => {
                // Connected now: nothing learned before this connection applies to it.
                for health in self.health.iter() {
                    let mut state = health.lock();
                    state.reconnected();
                    state.saw_errors();
                    state.heal();
                }
                // A first connection: the calls waiting for it write on it, and their `WAIT`s count those
                // writes ([`Probe::opened`]).
                self.probe.opened();
            }
            // The first attempt failed and (with the client's `fail_fast`) fred's connection task ended:
            // start it again on the next call, one attempt per call.
            Ok(false) => lazy.started.store(false, Ordering::Release),
            // Still trying (a client built with `fail_fast: false` keeps trying by its policy).
            Err(_) => {}
        }
    }

    /// For the start-up check of a lazy node: starts the connection as a call would ([`start`](Self::start))
    /// and returns the first connection error fred reports before it connects (or gives up waiting).
    async fn connect_for_check(&self) -> Option<NodeError> {
        let reported = async {
            loop {
                if let Some(err) = self.health.iter().find_map(Health::last_error) {
                    return node_error(&err);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let (mut start, mut reported) = (Box::pin(self.start()), Box::pin(reported));
        std::future::poll_fn(|cx| {
            if let std::task::Poll::Ready(err) = reported.as_mut().poll(cx) {
                return std::task::Poll::Ready(Some(err));
            }
            start.as_mut().poll(cx).map(|()| None)
        })
        .await
    }

    /// Acts on a reconnection fred announced for `health`'s member since the last call: whatever the new
    /// connection offers (it may be another server now: a restart, a failover behind one address) is checked
    /// again and its run_id asked again (with or without `fail_fast`), and a broken member is healed (the
    /// connection errors announced before it are superseded). Whether there was one.
    fn act_on_reconnection(&self, health: &mut HealthState) -> bool {
        if !health.reconnected() {
            return false;
        }
        self.probe.forget();
        health.saw_errors();
        health.heal();
        true
    }

    /// Whether a lazy node must (re)start fred's connection task before sending, or wait for another call's
    /// attempt (see [`start`](Self::start)).
    fn must_start(&self) -> bool {
        self.connect_started.as_ref().is_some_and(|lazy| {
            !lazy.started.load(Ordering::Acquire)
                || lazy.in_progress.load(Ordering::Acquire)
                || lazy.abandoned.load(Ordering::Acquire)
                || self
                    .client
                    .members()
                    .iter()
                    .all(|c| c.state() == ClientState::Disconnected)
        })
    }

    /// Everything before a command is written: a tokio runtime, a lazy node's connection, the member client
    /// that carries `key` and the checks of its health (fail-fast while its connection is known broken).
    /// The member and its index on success; nothing is sent on an error. A lazy node's first connection is
    /// awaited in a box of its own: it happens once, and the commands' futures need not carry its states.
    async fn prepare(&self, key: &str, what: &Script) -> Result<(&Client, usize), NodeError> {
        if tokio::runtime::Handle::try_current().is_err() {
            // fred's connections are tokio tasks and its timeouts tokio timers: outside a tokio runtime it
            // would panic.
            return Err(NodeError::not_applied(
                NodeErrorKind::Unsupported,
                format!(
                    "{}: fred needs a tokio runtime, and none is current; call this node from within one (not sent)",
                    what.name
                ),
            ));
        }
        if self.must_start() {
            Box::pin(self.start()).await;
        }
        let index = self.client.member_for_key(key);
        let (Some(client), Some(health)) =
            (self.client.members().get(index), self.health.get(index))
        else {
            return Err(NodeError::not_applied(
                NodeErrorKind::Other,
                format!("{}: the fred pool has no client (not sent)", what.name),
            ));
        };
        let mut state = health.lock();
        self.act_on_reconnection(&mut state);
        // fred announces a dropped connection on its error channel at once, while its state may still say
        // "connected" and a command sent now would wait for the reconnection.
        if state.saw_errors() && self.fail_fast {
            state.mark_broken();
        }
        if let Some(since) = state.broken.filter(|_| self.fail_fast) {
            // Healed by a reconnection; or, if fred reports itself connected and has announced nothing for a
            // while (an error that did not close the connection), let one command through on probation.
            let quiet = self
                .client
                .connection_config()
                .connection_timeout
                .max(PROBATION);
            let probation = client.state() == ClientState::Connected && since.elapsed() >= quiet;
            if self.act_on_reconnection(&mut state) || probation {
                state.heal();
                self.probe.forget();
            } else {
                drop(state);
                return Err(self.not_connected(what, health, true));
            }
        }
        Ok((client, index))
    }

    /// Sends one command once, through the client that carries `key`.
    async fn send_one(
        &self,
        cmd: CustomCommand,
        values: Vec<Value>,
        key: &str,
        what: &Script,
    ) -> Result<Reply, NodeError> {
        let (client, index) = self.prepare(key, what).await?;
        let flight = InFlight::new(self, index);
        let result = client
            .with_options(&self.options())
            .custom::<Value, Value>(cmd, values)
            .await
            .map(to_reply)
            .map_err(|e| classify(Some(what), &e));
        flight.landed();
        self.sent(result, index, what)
    }

    /// Sends `cmds` once as a `MULTI … EXEC` transaction, through the client that carries `key`: `EXEC`'s
    /// reply (`Nil` when a `WATCH` aborted it).
    ///
    /// Written as a plain pipeline of `MULTI`, the commands and `EXEC`, each command carrying the node's
    /// options (one attempt), not through fred's transaction API: fred re-sends a whole transaction once
    /// after reconnecting whatever `max_attempts` says, waiting inside its connection task for the
    /// reconnection — so a lost reply ran the writes twice (two `INCR`s for one call), and the copy could
    /// run long after the caller gave up. A pipeline's commands are written back to back on the member's
    /// connection and never re-sent; a connection that drops before `EXEC` arrives makes the server discard
    /// the transaction.
    async fn send_multi(
        &self,
        cmds: Vec<(CustomCommand, Vec<Value>)>,
        key: &str,
        what: &Script,
    ) -> Result<Reply, NodeError> {
        let (client, index) = self.prepare(key, what).await?;
        let flight = InFlight::new(self, index);
        let options = self.options();
        let hash = self.hash(key);
        let pipeline = client.pipeline();
        let count = cmds.len();
        let mut queued = Ok(());
        let all = std::iter::once((
            CustomCommand::new_static("MULTI", hash.clone(), false),
            Vec::new(),
        ))
        .chain(cmds)
        .chain(std::iter::once((
            CustomCommand::new_static("EXEC", hash, false),
            Vec::new(),
        )));
        for (cmd, values) in all {
            if let Err(e) = pipeline
                .with_options(&options)
                .custom::<(), Value>(cmd, values)
                .await
            {
                queued = Err(e);
                break;
            }
        }
        let result = match queued {
            Ok(()) => {
                let mut replies = pipeline.try_all::<Value>().await;
                match (replies.len() == count + 2)
                    .then(|| replies.pop())
                    .flatten()
                {
                    // `EXEC` refused itself (`EXECABORT`): the first refusal among `MULTI` and the queued
                    // commands names the cause.
                    Some(Err(exec)) => {
                        Err(replies.into_iter().find_map(Result::err).unwrap_or(exec))
                    }
                    Some(exec) => exec,
                    None => Err(FredError::new(
                        ErrorKind::Protocol,
                        "a transaction pipeline with a missing reply",
                    )),
                }
            }
            Err(e) => Err(e),
        };
        let result = result.map(to_reply).map_err(|e| classify(Some(what), &e));
        flight.landed();
        self.sent(result, index, what)
    }

    /// Sends a command with a `PUBLISH` pipelined behind it, once, through the client that carries `key`: the
    /// command's reply.
    async fn send_publishing(
        &self,
        cmds: [(CustomCommand, Vec<Value>); 2],
        key: &str,
        what: &Script,
    ) -> Result<(Reply, Option<Reply>), NodeError> {
        let (client, index) = self.prepare(key, what).await?;
        let flight = InFlight::new(self, index);
        let options = self.options();
        // A plain pipeline (not a transaction, which fred would replay after a reconnection): each
        // command carries the options, so neither is written twice.
        let pipeline = client.pipeline();
        let mut queued = Ok(());
        for (cmd, values) in cmds {
            if let Err(e) = pipeline
                .with_options(&options)
                .custom::<(), Value>(cmd, values)
                .await
            {
                queued = Err(e);
                break;
            }
        }
        let mut second = None;
        let result = match queued {
            Ok(()) => {
                let mut replies = pipeline.try_all::<Value>().await.into_iter();
                let first = replies.next();
                second = replies.next().and_then(Result::ok).map(to_reply);
                match first {
                    Some(first) => first,
                    None => Err(FredError::new(
                        ErrorKind::Protocol,
                        "an empty pipeline reply",
                    )),
                }
            }
            Err(e) => Err(e),
        }
        .map(to_reply)
        .map_err(|e| classify(Some(what), &e));
        flight.landed();
        self.sent(result, index, what).map(|r| (r, second))
    }

    /// A command through member `index` timed out or was cut by the caller's operation timeout. On a
    /// Sentinel client that is how a primary that stopped answering with its connection open (`SIGSTOP`, a
    /// hung host) shows: fred keeps that connection (it reconnects only after it breaks) and would go on
    /// sending to the stopped primary while the Sentinels promote another. So the node tells fred to
    /// reconnect (`force_reconnection`, on a task: fred asks the Sentinels for the primary again), at most
    /// once per connection timeout.
    fn primary_unresponsive(&self, index: usize) {
        let (Some(client), Some(health)) =
            (self.client.members().get(index), self.health.get(index))
        else {
            return;
        };
        if !client.client_config().server.is_sentinel() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let quiet = client.connection_config().connection_timeout.max(PROBATION);
        {
            let mut state = health.lock();
            if state.forced.is_some_and(|at| at.elapsed() < quiet) {
                return;
            }
            state.forced = Some(Instant::now());
        }
        let client = client.clone();
        runtime.spawn(async move {
            let _ = client.force_reconnection().await;
        });
    }

    /// What a command sent through member `index` answers, after what its error says about the connection.
    fn sent(
        &self,
        result: Result<Reply, NodeError>,
        index: usize,
        what: &Script,
    ) -> Result<Reply, NodeError> {
        let Err(e) = result else {
            return result;
        };
        if e.kind() == NodeErrorKind::Timeout {
            self.primary_unresponsive(index);
        }
        let Some(health) = self.health.get(index) else {
            return Err(e);
        };
        if is_second_write(&e) && self.cluster {
            // fred refuses a second write both after a MOVED/ASK redirection (the server refused the
            // command) and for a command in flight when it reconnected (it may have run). A reconnection
            // is announced on the error or reconnect channel; without either, it was the redirection.
            let mut state = health.lock();
            let reconnected = state.saw_errors() | state.reconnected();
            if reconnected {
                self.probe.forget();
                state.mark_broken();
                Err(e)
            } else {
                Err(NodeError::not_applied(
                    NodeErrorKind::Cluster,
                    format!(
                        "{}: the server redirected the command (MOVED/ASK; the connection stayed up), \
                         which redlease does not follow; fred refreshed its slot map, so the next call is \
                         routed anew",
                        what.name
                    ),
                )
                .with_source(e))
            }
        } else if e.kind() == NodeErrorKind::Connection {
            health.mark_broken();
            if e.is_ambiguous() {
                Err(e)
            } else {
                Err(self.not_connected(what, health, false).with_source(e))
            }
        } else {
            Err(e)
        }
    }

    /// The definite error of a command not sent because the connection is down: `Auth` when fred's last
    /// connection attempt was refused for authentication, `Connection` otherwise.
    fn not_connected(&self, what: &Script, health: &Health, known_broken: bool) -> NodeError {
        if let Some(err) = health.last_error() {
            let classified = classify(Some(what), &err);
            if classified.kind() == NodeErrorKind::Auth {
                return NodeError::not_applied(
                    NodeErrorKind::Auth,
                    format!(
                        "{}: not sent: the client's last connection attempt was refused: {}",
                        what.name,
                        classified.message()
                    ),
                )
                .with_source(err);
            }
        }
        let why = if known_broken {
            "the connection failed and fred has not reconnected since"
        } else {
            "the client is not connected"
        };
        NodeError::not_applied(
            NodeErrorKind::Connection,
            format!("{}: {why} (not sent)", what.name),
        )
    }
}

/// A command in flight through member `index` of a [`FredNode`]: if its future is dropped before the reply
/// (the caller's operation timeout), the node treats it as a timeout ([`FredNode::primary_unresponsive`]).
struct InFlight<'a, C: KeyRouted> {
    node: &'a FredNode<C>,
    index: usize,
    pending: bool,
}

impl<'a, C: KeyRouted> InFlight<'a, C> {
    fn new(node: &'a FredNode<C>, index: usize) -> Self {
        Self {
            node,
            index,
            pending: true,
        }
    }

    /// The reply (or an error) came back.
    fn landed(mut self) {
        self.pending = false;
    }
}

impl<C: KeyRouted> Drop for InFlight<'_, C> {
    fn drop(&mut self) {
        if self.pending {
            self.node.primary_unresponsive(self.index);
        }
    }
}

/// The command names and fixed arguments [`ops`] sends, as `'static` strings. fred copies every borrowed
/// `&str` (a command name or an argument) into a buffer of its own, one allocation each; these go out without
/// a copy. Anything else (keys, tokens, TTLs, channels) is copied as before.
macro_rules! static_words {
    ($($word:literal)*) => {
        fn static_word(s: &str) -> Option<&'static str> {
            match s {
                $($word => Some($word),)*
                _ => None,
            }
        }
    };
}

static_words!(
    "SET" "GET" "PTTL" "DEL" "DELIFEQ" "PUBLISH" "SPUBLISH" "INCR" "INCRBY" "INFO" "WAIT" "WAITAOF" "NX" "PX"
    "IFEQ" "server" "0" "WATCH" "UNWATCH" "PEXPIRE" "GT"
);

/// `s` as an argument: without a copy when it is one of the [`static_word`]s.
fn arg(s: &str) -> Value {
    match static_word(s) {
        Some(word) => Value::String(fred::bytes_utils::Str::from_static(word)),
        None => Value::from(s),
    }
}

/// The command named `name` (a static name where it is one of the [`static_word`]s), routed by `hash`.
fn command_named(name: &str, hash: ClusterHash) -> CustomCommand {
    match static_word(name) {
        Some(word) => CustomCommand::new_static(word, hash, false),
        None => CustomCommand::new(name.to_owned(), hash, false),
    }
}

impl<C: KeyRouted> FredNode<C> {
    /// How a command for `key` is routed: by its hash slot on a cluster; elsewhere fred ignores it (and the
    /// slot is not computed).
    fn hash(&self, key: &str) -> ClusterHash {
        ClusterHash::Custom(if self.cluster {
            slot::hash_slot(key.as_bytes())
        } else {
            0
        })
    }
}

impl<C: KeyRouted> Transport for FredNode<C> {
    async fn script_once(
        &self,
        verb: Verb,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Reply, NodeError> {
        let key = keys.first().copied().unwrap_or("");
        // Route by the first key's slot (all keys share it on a cluster; ignored otherwise).
        let hash = self.hash(key);
        let body = match verb {
            Verb::Eval => script.source,
            Verb::EvalSha => script.sha1,
        };
        let mut values: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
        values.push(Value::String(fred::bytes_utils::Str::from_static(body)));
        values.push(Value::Integer(keys.len() as i64));
        values.extend(keys.iter().map(|k| Value::from(*k)));
        values.extend(args.iter().map(|a| arg(a)));
        let cmd = CustomCommand::new_static(verb.as_str(), hash, false);
        self.send_one(cmd, values, key, script).await
    }

    async fn command(&self, what: &Script, key: &str, args: &[&str]) -> Result<Reply, NodeError> {
        let Some((name, rest)) = args.split_first() else {
            return Err(NodeError::not_applied(
                NodeErrorKind::Other,
                "an empty command (not sent)",
            ));
        };
        let cmd = command_named(name, self.hash(key));
        let values = rest.iter().map(|a| arg(a)).collect();
        self.send_one(cmd, values, key, what).await
    }

    async fn command_and_publish(
        &self,
        what: &Script,
        key: &str,
        args: &[&str],
        publish: &[&str],
    ) -> Result<(Reply, Option<Reply>), NodeError> {
        let hash = self.hash(key);
        let build = |args: &[&str]| {
            let (name, rest) = args.split_first()?;
            Some((
                command_named(name, hash.clone()),
                rest.iter().map(|a| arg(a)).collect::<Vec<_>>(),
            ))
        };
        let (Some(cmd), Some(publish)) = (build(args), build(publish)) else {
            return Err(NodeError::not_applied(
                NodeErrorKind::Other,
                "an empty command (not sent)",
            ));
        };
        self.send_publishing([cmd, publish], key, what).await
    }

    async fn transaction(
        &self,
        what: &Script,
        key: &str,
        cmds: &[&[&str]],
    ) -> Result<Vec<Reply>, NodeError> {
        let hash = self.hash(key);
        let mut request = Vec::with_capacity(cmds.len());
        for args in cmds {
            let Some((name, rest)) = args.split_first() else {
                return Err(NodeError::not_applied(
                    NodeErrorKind::Other,
                    "an empty command in a transaction (not sent)",
                ));
            };
            let cmd = command_named(name, hash.clone());
            request.push((cmd, rest.iter().map(|a| arg(a)).collect()));
        }
        match self.send_multi(request, key, what).await? {
            Reply::Array(items) if items.len() == cmds.len() => Ok(items),
            // EXEC aborted by a WATCH (the watched key was touched): nothing ran.
            Reply::Nil => Ok(Vec::new()),
            other => Err(scripts::unexpected_reply(what, &other)),
        }
    }

    fn clustered(&self) -> bool {
        self.cluster
    }

    fn probe(&self) -> &Probe {
        &self.probe
    }

    fn notice_reconnections(&self) {
        for health in self.health.iter() {
            self.act_on_reconnection(&mut health.lock());
        }
    }

    async fn wait_command(
        &self,
        what: &Script,
        key: &str,
        args: &[&str],
    ) -> Result<Reply, NodeError> {
        let Some(waiter) = &self.waiter else {
            return self.command(what, key, args).await;
        };
        let mut expected = None;
        if waiter.sentinel {
            // The server the write's connection reaches now, and that connection still the write's.
            if let Ok(Reply::Bytes(text)) = self.command(what, key, &["INFO", "server"]).await {
                expected =
                    ops::info_field(&String::from_utf8_lossy(&text), "run_id").map(str::to_owned);
            }
            self.notice_reconnections();
            if self.probe.written_before_a_reconnect(key) {
                return Err(NodeError::not_applied(
                    NodeErrorKind::Connection,
                    "WAIT for replicas: the connection that carried the write was replaced since (a \
                     reconnect), and WAIT on this one would not count that write (not sent)",
                ));
            }
        }
        if (!waiter.sentinel || expected.is_some())
            && let Some(reply) = waiter.wait(what, args, expected.as_deref()).await
        {
            return reply;
        }
        self.command(what, key, args).await
    }
}

/// The channel a [`FredWaiter`] publishes on (nobody listens: the publish is for its replication offset).
const WAIT_CHANNEL: &str = "redlease:wait";

/// How many idle wait clients a [`FredWaiter`] keeps for the next waits.
const WAITERS_KEPT: usize = 8;

/// How much longer than the `WAIT` itself its command may take on a wait client (the server answers a `WAIT`
/// at its own timeout; the core bounds the call by the operation timeout anyway).
const WAIT_MARGIN: Duration = Duration::from_secs(1);

/// A node's clients of its own for `WAIT` / `WAITAOF`, so that a durability wait never holds up other leases'
/// commands: the server answers nothing else on a connection while a `WAIT` on it blocks, so with a replica
/// down every lease sharing the node's connection would wait behind it. Each wait takes an idle wait client
/// (one connection, `clone_new` of the node's first client: the same server and credentials) or connects a
/// new one, and gives it back when answered (at most [`WAITERS_KEPT`] idle); a client whose wait was cut is
/// ended (`QUIT`), so its blocked connection is not reused.
///
/// `WAIT` counts the writes of its own connection, so it goes right behind a `PUBLISH` on [`WAIT_CHANNEL`]
/// (pipelined, one round trip): a publish is replicated, so the connection's replication offset becomes the
/// server's, which covers every write applied before — the lease's among them, since its reply came first.
/// Where the `PUBLISH` is refused (a channel ACL), the client cannot connect or its connection dropped,
/// `None`: the node waits on its shared connection as before. fred runs on tokio: outside a runtime, `None`.
///
/// Behind Sentinel a wait client asks the Sentinels for the primary by itself, and could reach another server
/// than the one that took the write (after a failover). So there the node first reads the run id of the
/// server its own connection reaches (`INFO server`, on the connection that carried the write, checked not
/// replaced since), and the wait client sends `INFO server` in the same pipeline as its `PUBLISH` and `WAIT`:
/// its answer counts only if both run ids agree (else the client is ended and the node waits on its shared
/// connection).
#[derive(Clone)]
struct FredWaiter {
    template: Client,
    idle: Arc<Mutex<Vec<Client>>>,
    /// The node's config is a Sentinel one: each wait checks the server (see above).
    sentinel: bool,
}

/// A wait client taken from a [`FredWaiter`]: ended in the background unless given back.
struct WaitClient {
    client: Option<Client>,
    handle: tokio::runtime::Handle,
}

impl Drop for WaitClient {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            self.handle.spawn(async move {
                let _ = client.quit().await;
            });
        }
    }
}

impl FredWaiter {
    fn new(client: &Client, sentinel: bool) -> Self {
        Self {
            template: client.clone_new(),
            idle: Arc::default(),
            sentinel,
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Client>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `args` (a `WAIT` or `WAITAOF`, its timeout in milliseconds last) behind the `PUBLISH` on a wait
    /// client: its reply, or `None` where the shared connection must be used. With `expected` (a run id),
    /// only if `INFO server` in the same pipeline names that server.
    async fn wait(
        &self,
        what: &Script,
        args: &[&str],
        expected: Option<&str>,
    ) -> Option<Result<Reply, NodeError>> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let (name, rest) = args.split_first()?;
        let taken = self.idle().pop();
        let mut held = WaitClient {
            client: taken,
            handle,
        };
        if held.client.is_none() {
            let client = self.template.clone_new();
            // Ended on drop from here on, connected or not (fred's task would otherwise keep reconnecting).
            held.client = Some(client.clone());
            client.init().await.ok()?;
        }
        let client = held.client.clone()?;
        let millis: u64 = rest.last().and_then(|m| m.parse().ok()).unwrap_or(0);
        let options = Options {
            max_attempts: Some(1),
            timeout: Some(Duration::from_millis(millis) + WAIT_MARGIN),
            fail_fast: true,
            ..Options::default()
        };
        // A plain pipeline, not a transaction: a `WAIT` inside `MULTI` does not block (and waits for nothing).
        let pipeline = client.pipeline();
        if expected.is_some() {
            pipeline
                .with_options(&options)
                .custom::<(), Value>(
                    CustomCommand::new_static("INFO", ClusterHash::FirstKey, false),
                    vec![Value::from("server")],
                )
                .await
                .ok()?;
        }
        pipeline
            .with_options(&options)
            .custom::<(), Value>(
                CustomCommand::new_static("PUBLISH", ClusterHash::FirstKey, false),
                vec![Value::from(WAIT_CHANNEL), Value::from("")],
            )
            .await
            .ok()?;
        pipeline
            .with_options(&options)
            .custom::<(), Value>(
                command_named(name, ClusterHash::FirstKey),
                rest.iter().map(|a| arg(a)).collect(),
            )
            .await
            .ok()?;
        let mut replies = pipeline.try_all::<Value>().await.into_iter();
        if let Some(expected) = expected {
            let info = replies.next()?.ok().map(to_reply);
            let Some(Reply::Bytes(text)) = info else {
                return None;
            };
            if ops::info_field(&String::from_utf8_lossy(&text), "run_id") != Some(expected) {
                // Another server than the write's: ended (on drop), not kept, and its answer not used.
                return None;
            }
        }
        let (Some(publish), Some(wait)) = (replies.next(), replies.next()) else {
            return None;
        };
        let wait = wait.map(to_reply).map_err(|e| classify(Some(what), &e));
        if let Err(e) = &wait
            && matches!(e.kind(), NodeErrorKind::Connection | NodeErrorKind::Io)
        {
            // A dropped connection is not kept; the shared one is asked instead (a `WAIT` changes nothing,
            // whether or not it ran).
            return None;
        }
        // A client whose `WAIT` timed out may still be blocked by it: ended, not kept.
        if !matches!(&wait, Err(e) if e.kind() == NodeErrorKind::Timeout) {
            let mut idle = self.idle();
            if idle.len() < WAITERS_KEPT {
                idle.extend(held.client.take());
            }
        }
        // Without the publish the connection's offset covers nothing: its `WAIT` would count every replica.
        publish.ok()?;
        Some(wait)
    }
}

#[async_trait]
impl<C: KeyRouted> RedisNode for FredNode<C> {
    /// The capability check, run now (see `probe`): reachability, login, permissions and paths. A lazy node
    /// connects first; a connection error fred reports meanwhile (a refused login, a refused connection) is
    /// the answer, since fred keeps trying to connect by its policy and a command would only learn "not
    /// connected".
    async fn readiness(&self, key: &str) -> Readiness {
        if self.must_start()
            && tokio::runtime::Handle::try_current().is_ok()
            && let Some(err) = self.connect_for_check().await
        {
            return if err.kind() == NodeErrorKind::Auth {
                Readiness::LoginRefused(err)
            } else {
                Readiness::from_error(err)
            };
        }
        ops::readiness(self, key).await
    }

    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        ops::acquire(self, key, token, ttl).await
    }

    async fn acquire_fresh(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        ops::acquire_fresh(self, key, token, ttl).await
    }

    /// `SET … NX GET` or the fresh-acquire script: neither touches an existing key.
    fn acquire_fresh_is_nx(&self) -> bool {
        true
    }

    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError> {
        ops::acquire_fenced(self, key, fence_key, token, ttl).await
    }

    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        ops::release(self, key, token).await
    }

    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        ops::extend(self, key, token, ttl).await
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        ops::inspect(self, key).await
    }

    async fn acquire_or_ttl(
        &self,
        key: &str,
        token: &Token,
        ttl: Ttl,
        fresh: bool,
    ) -> Result<Claim, NodeError> {
        ops::acquire_or_ttl(self, key, token, ttl, fresh).await
    }

    /// A subscriber client of the node's own (`clone_new` of the first member: one connection, or one per
    /// primary on a cluster, where channels are subscribed with `SSUBSCRIBE` in their key's slot).
    fn notifier(&self) -> Option<&Notifier> {
        self.notifier.as_ref()
    }

    fn endpoint(&self) -> Option<String> {
        self.endpoint.clone()
    }

    async fn raise_fence(&self, fence_key: &str, at_least: u64) -> Result<u64, NodeError> {
        ops::raise_fence(self, fence_key, at_least).await
    }

    /// `INFO server` at every call (fred may replace its connection unnoticed; see `ops::run_id`);
    /// unsupported on a cluster.
    async fn run_id(&self, key: &str) -> Result<redlease::RunId, NodeError> {
        ops::run_id(self, key).await
    }

    /// `WAIT` or `WAITAOF` on the connection that carries `key`; unsupported on a cluster.
    async fn wait_replicas(
        &self,
        key: &str,
        wait: redlease::ReplicaWait,
    ) -> Result<u32, NodeError> {
        ops::wait_replicas(self, key, wait).await
    }

    async fn extend_many(
        &self,
        items: &[redlease::ExtendItem<'_>],
    ) -> Result<Vec<bool>, NodeError> {
        ops::extend_many(self, items).await
    }

    fn extend_many_limit(&self) -> usize {
        ops::EXTEND_MANY_LIMIT
    }

    /// The [`ACQUIRE_MANY`](crate::scripts::ACQUIRE_MANY), `EXTEND_MANY` or `RELEASE_MANY` script; unsupported
    /// across Cluster slots and without Lua (the core then takes the keys one at a time).
    async fn multi_key(
        &self,
        items: &[redlease::MultiKeyItem<'_>],
        op: redlease::MultiKeyOp,
    ) -> Result<redlease::MultiKeyReply, NodeError> {
        ops::multi_key(self, items, op).await
    }

    /// The [`PERMIT`](crate::scripts::PERMIT) or [`RW_PERMIT`](crate::scripts::RW_PERMIT) script; without
    /// Lua, `TIME` and a watched sorted-set transaction (see the crate README's "Leased semaphores").
    async fn permit(
        &self,
        key: &str,
        token: &Token,
        ttl: Ttl,
        op: redlease::PermitOp<'_>,
    ) -> Result<redlease::PermitReply, NodeError> {
        ops::permit(self, key, token, ttl, op).await
    }
}

mod sentinel;
pub use sentinel::sentinel_builder;

/// Not a script: names `SUBSCRIBE`/`SSUBSCRIBE` and their opposites in messages.
const SUBSCRIBE: Script = Script {
    name: "SUBSCRIBE",
    source: "",
    sha1: "",
};

/// A fred subscriber client of one inbox generation, and the runtime that can end it.
type Current = Arc<Mutex<Option<(Client, u64, tokio::runtime::Handle)>>>;

/// The subscriber connection of a fred node (see [`redlease::notify`]): a client of its own (`clone_new` of
/// the node's), connected for one inbox generation. fred reconnects by itself, but a new connection has no
/// subscriptions: an error on the client's error channel reports the connection lost, and the next subscribe
/// starts a new client. fred runs on tokio: a client is ended (`QUIT`) as a task on the runtime it was
/// started on.
struct FredSubscriber {
    template: Client,
    cluster: bool,
    current: Current,
}

fn lock_current(
    current: &Current,
) -> std::sync::MutexGuard<'_, Option<(Client, u64, tokio::runtime::Handle)>> {
    current.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ends a subscriber client in the background (its connections close, the server drops its subscriptions).
fn quit_later(old: Option<(Client, u64, tokio::runtime::Handle)>) {
    if let Some((client, _, handle)) = old {
        handle.spawn(async move {
            let _ = client.quit().await;
        });
    }
}

fn payload_bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::String(s) => Some(s.as_bytes().to_vec()),
        Value::Bytes(b) => Some(b.to_vec()),
        _ => None,
    }
}

impl FredSubscriber {
    async fn client(
        template: &Client,
        current: &Current,
        inbox: &Inbox,
    ) -> Result<Client, NodeError> {
        if let Some((client, generation, _)) = &*lock_current(current)
            && *generation == inbox.generation()
        {
            return Ok(client.clone());
        }
        let old = lock_current(current).take();
        quit_later(old);
        // fred runs on tokio: outside a tokio runtime there is nothing to run the listeners on (the waiters
        // then poll).
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Err(NodeError::not_applied(
                NodeErrorKind::Unsupported,
                "SUBSCRIBE: fred needs a tokio runtime to receive messages; none is current (not sent)",
            ));
        };
        let client = template.clone_new();
        // Not `on_message`: its listener ends at the first overflow of fred's bounded message queue (32 by
        // default), after which every message would be lost. This one survives it and reports the gap.
        let (sink, mut messages) = (inbox.clone(), client.message_rx());
        handle.spawn(async move {
            loop {
                match messages.recv().await {
                    Ok(msg) => {
                        if let Some(payload) = payload_bytes(&msg.value) {
                            sink.deliver(msg.channel.as_bytes(), &payload);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => sink.missed(),
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        // A connection error (or errors missed in an overflow) means the subscriptions may be gone: the
        // client is ended and the notifier subscribes again on a new one.
        let (sink, slot, mut errors) = (inbox.clone(), Arc::clone(current), client.error_rx());
        handle.spawn(async move {
            loop {
                match errors.recv().await {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                }
                let mine = {
                    let mut slot = lock_current(&slot);
                    if slot
                        .as_ref()
                        .is_some_and(|(_, g, _)| *g == sink.generation())
                    {
                        slot.take()
                    } else {
                        None
                    }
                };
                if mine.is_some() {
                    quit_later(mine);
                    sink.lost();
                    return;
                }
            }
        });
        let connected = client.init().await;
        if let Err(e) = connected {
            let _ = client.quit().await;
            return Err(classify(Some(&SUBSCRIBE), &e));
        }
        *lock_current(current) = Some((client.clone(), inbox.generation(), handle));
        Ok(client)
    }
}

impl Subscriber for FredSubscriber {
    fn subscribe(&self, inbox: Inbox, channel: &str) -> SubscribeFuture {
        let (template, current, cluster, channel) = (
            self.template.clone(),
            Arc::clone(&self.current),
            self.cluster,
            channel.to_owned(),
        );
        Box::pin(async move {
            let client = Self::client(&template, &current, &inbox).await?;
            let result = if cluster {
                client.ssubscribe(channel).await
            } else {
                // fred takes `SUBSCRIBE` as answered once written (its confirmation arrives out of band), so
                // the server may not have subscribed yet: a release published meanwhile would wake nobody,
                // although the waiter was told it listens. A `PING` behind it on the same connection (allowed
                // in subscriber mode) answers only after the server ran the `SUBSCRIBE`. (`SSUBSCRIBE` waits
                // for its own reply in fred.)
                match client.subscribe(channel).await {
                    Ok(()) => client.ping::<Value>(None).await.map(|_| ()),
                    Err(e) => Err(e),
                }
            };
            result.map_err(|e| classify(Some(&SUBSCRIBE), &e))
        })
    }

    fn unsubscribe(&self, channel: &str) -> SubscribeFuture {
        let client = lock_current(&self.current)
            .as_ref()
            .map(|(c, _, _)| c.clone());
        let (cluster, channel) = (self.cluster, channel.to_owned());
        Box::pin(async move {
            let Some(client) = client else {
                return Ok(());
            };
            let result = if cluster {
                client.sunsubscribe(channel).await
            } else {
                client.unsubscribe(channel).await
            };
            result.map_err(|e| classify(Some(&SUBSCRIBE), &e))
        })
    }

    fn close(&self) {
        let old = lock_current(&self.current).take();
        quit_later(old);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_replies_are_definite_and_classified() {
        for (kind, line, expected) in [
            (
                ErrorKind::Unknown,
                "NOSCRIPT No matching script.",
                NodeErrorKind::NoScript,
            ),
            (
                ErrorKind::Unknown,
                "OOM command not allowed",
                NodeErrorKind::OutOfMemory,
            ),
            (
                ErrorKind::Unknown,
                "READONLY You can't write",
                NodeErrorKind::ReadOnly,
            ),
            (
                ErrorKind::Auth,
                "WRONGPASS invalid username-password pair",
                NodeErrorKind::Auth,
            ),
            (
                ErrorKind::Auth,
                "NOAUTH Authentication required.",
                NodeErrorKind::Auth,
            ),
            (
                ErrorKind::Unknown,
                "NOPERM User has no permissions",
                NodeErrorKind::Auth,
            ),
            (
                ErrorKind::InvalidArgument,
                "WRONGTYPE Operation against a key",
                NodeErrorKind::WrongType,
            ),
            (
                ErrorKind::Cluster,
                "CLUSTERDOWN The cluster is down",
                NodeErrorKind::Cluster,
            ),
            (
                ErrorKind::Unknown,
                "BUSY Redis is busy",
                NodeErrorKind::Busy,
            ),
            (
                ErrorKind::Unknown,
                "FENCE the fence counter f is exhausted",
                NodeErrorKind::Fence,
            ),
            (
                ErrorKind::Unknown,
                "ERR The user executing the script can't run this command or subcommand",
                NodeErrorKind::Auth,
            ),
            (
                ErrorKind::Routing,
                TOO_MANY_REDIRECTIONS,
                NodeErrorKind::Cluster,
            ),
        ] {
            let err = node_error(&FredError::new(kind, line));
            assert_eq!(err.kind(), expected, "{line}");
            assert!(!err.is_ambiguous(), "{line}");
        }
    }

    #[test]
    fn a_refused_connection_authentication_says_so() {
        let err = node_error(&FredError::new(
            ErrorKind::Auth,
            "WRONGPASS invalid username-password pair or user is disabled.",
        ));
        assert_eq!(err.kind(), NodeErrorKind::Auth);
        assert!(!err.is_ambiguous());
        assert!(err.message().contains("authentication"), "{err}");
        assert!(!err.message().contains("script"), "{err}");
    }

    #[test]
    fn fail_fast_and_refused_connections_are_definite() {
        let err = node_error(&FredError::new(ErrorKind::Canceled, FAIL_FAST_DETAILS));
        assert_eq!(err.kind(), NodeErrorKind::Connection);
        assert!(!err.is_ambiguous());
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let err = node_error(&FredError::from(io));
        assert_eq!(err.kind(), NodeErrorKind::Connection);
        assert!(!err.is_ambiguous());
    }

    #[test]
    fn closed_connections_timeouts_and_lost_attempts_are_ambiguous() {
        for (kind, details, expected) in [
            (
                ErrorKind::IO,
                "Connection Closed",
                NodeErrorKind::Connection,
            ),
            (ErrorKind::Canceled, "Canceled.", NodeErrorKind::Connection),
            (
                ErrorKind::Timeout,
                "Request timed out.",
                NodeErrorKind::Timeout,
            ),
            (
                ErrorKind::Unknown,
                "Too many failed write attempts.",
                NodeErrorKind::Connection,
            ),
            (
                ErrorKind::Protocol,
                "Invalid frame",
                NodeErrorKind::Protocol,
            ),
        ] {
            let err = node_error(&FredError::new(kind, details));
            assert!(err.is_ambiguous(), "{details}");
            assert_eq!(err.kind(), expected, "{details}");
        }
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(node_error(&FredError::from(io)).is_ambiguous());
    }

    #[test]
    fn values_map_to_replies() {
        assert_eq!(to_reply(Value::Null), Reply::Nil);
        assert_eq!(to_reply(Value::Integer(1)), Reply::Int(1));
        assert_eq!(
            to_reply(Value::Array(vec![Value::from("abc"), Value::Integer(9)])),
            Reply::Array(vec![Reply::Bytes(b"abc".to_vec()), Reply::Int(9)])
        );
    }

    #[test]
    fn endpoints_come_from_the_config_without_credentials() {
        let config =
            fred::types::config::Config::from_url("redis://user:secret@10.0.0.5:6380/2").unwrap();
        let endpoint = config_endpoint(&config).unwrap();
        assert_eq!(endpoint, "redis://10.0.0.5:6380/2");
        assert!(!endpoint.contains("secret"));
    }

    /// Every node call is boxed by the node trait, so its future is allocated and copied on every call: an
    /// operation must hold fred's command future (the bulk of it, about 5 KB in fred 10) once, not twice
    /// (as a future passed into another async fn or block and awaited there would be).
    #[test]
    fn operation_futures_hold_the_command_future_once() {
        let client = fred::types::Builder::default_centralized()
            .build()
            .expect("a client (not connected)");
        let fred_call = std::mem::size_of_val(
            &client
                .with_options(&Options::default())
                .custom::<Value, Value>(
                    CustomCommand::new_static("GET", ClusterHash::Custom(0), false),
                    vec![],
                ),
        );
        let node = FredNode::new(client);
        let token = Token::random().expect("a token");
        let ttl = Ttl::from_millis(1000).expect("a TTL");
        let sizes = [
            (
                "acquire",
                std::mem::size_of_val(&ops::acquire(&node, "k", &token, ttl)),
            ),
            (
                "acquire_fresh",
                std::mem::size_of_val(&ops::acquire_fresh(&node, "k", &token, ttl)),
            ),
            (
                "extend",
                std::mem::size_of_val(&ops::extend(&node, "k", &token, ttl)),
            ),
            (
                "release",
                std::mem::size_of_val(&ops::release(&node, "k", &token)),
            ),
        ];
        for (op, size) in sizes {
            assert!(
                size < fred_call * 3 / 2,
                "{op}: a {size}-byte future for a {fred_call}-byte fred call"
            );
        }
    }
}
