//! [`RedisNode`] for redis-rs async connections: [`MultiplexedConnection`], [`ConnectionManager`] and the
//! Redis Cluster [`ClusterConnection`], through one generic [`RedisRsNode`].
//!
//! ```no_run
//! use redlease::{Config, LockManager};
//! use redlease_adapters::redis::{MultiplexedNode, redis};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::Client::open("redis://127.0.0.1:6379/0")?;
//! let node = MultiplexedNode::connect(&client).await?;
//! let manager = LockManager::single(node, Config::default())?;
//! let lease = manager.lock("jobs:{nightly}:lock").acquire().await?;
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Which connection to use
//!
//! - [`MultiplexedConnection`] ([`MultiplexedNode`]): one TCP connection shared by all clones, safe to cancel
//!   (a dropped request does not desynchronise it). It never reconnects: once the node has seen the
//!   connection drop, every later call fails at once with a definite [`NodeErrorKind::Connection`] error
//!   (nothing is sent) until you build a new node. To recover by itself, use a [`LazyNode`] or a
//!   [`ManagedNode`].
//! - [`LazyNode`] ([`MultiplexedNode::lazy`]): a multiplexed connection opened on first use and opened
//!   again on the first call after it dropped. Building one sends nothing, so a Redlock service can start
//!   while a minority of its servers is down; a down server's calls fail definitely (connection refused)
//!   until it is back.
//! - [`ConnectionManager`] ([`ManagedNode`]): a multiplexed connection that reconnects in the background
//!   after an I/O error. It does **not** re-send the failed command, which is what lock commands need.
//!   [`ManagedNode::connect`] builds it with `set_number_of_retries(0)`: with redis-rs's default retries a
//!   refused authentication (a wrong or rotated password) is retried and surfaces seconds later as an
//!   ambiguous error instead of a prompt, definite [`NodeErrorKind::Auth`] error. With
//!   [`ManagedNode::connect_with_config`] the retries are yours to choose.
//! - [`ClusterConnection`] ([`ClusterNode`]): Redis Cluster, built only by [`ClusterNode::connect`], which
//!   sets [`retries(0)`](redis::cluster::ClusterClientBuilder::retries) whatever the builder said: redis-rs
//!   otherwise re-sends a request after an I/O error or a redirection, and a re-sent command whose first copy
//!   was applied turns a successful release into a "not held" report (and a late repeat can re-take a lock
//!   after redlease gave it up). With `retries(0)` a `MOVED`/`ASK` after a resharding surfaces as a definite
//!   [`NodeErrorKind::Cluster`] error and the next call is routed with the refreshed slot map. Lock and fence
//!   keys are checked client-side to share a hash slot (see [`crate::slot`]).
//!
//! # Ordering
//!
//! Requests for one key sent by one node are applied in the order they were sent, or a stale one fails: a
//! [`MultiplexedNode`], [`ManagedNode`] and [`LazyNode`] write every request on one connection at a time, in
//! call order (a reconnect starts a new connection only after the old one failed, and the old one's
//! unanswered requests are reported as ambiguous); a [`ClusterNode`] sends every request for one key to its
//! slot's primary over one connection.
//!
//! # The capability check
//!
//! Before the first acquisition on a connection (and again after the connection failed) the node checks
//! that the user may run everything a lease needs (`EVAL` and the commands inside the scripts),
//! so that `try_acquire()` never hands out a lease it cannot extend or release: a refusal is a definite
//! [`NodeErrorKind::Auth`] error before anything is written. [`RedisRsNode::probe`] and [`LazyNode::probe`]
//! run it eagerly, for example at start-up. See [`crate::scripts::PROBE`].
//!
//! # Timeouts to set
//!
//! redlease bounds every node call by its operation timeout (by dropping the future), so client timeouts are
//! a second line of defence. Set:
//!
//! - the **connection timeout** (`AsyncConnectionConfig::set_connection_timeout`,
//!   `ConnectionManagerConfig::set_connection_timeout`, `ClusterClientBuilder::connection_timeout`) to a
//!   small value (≤ the operation timeout), so that an unreachable server fails fast and definitely;
//! - the **response timeout** (`set_response_timeout` / `ClusterClientBuilder::response_timeout`; redis-rs
//!   1.x defaults to 500 ms) to about the operation timeout. A response timeout is reported as an ambiguous
//!   [`NodeErrorKind::Timeout`]: the command may have run.
//!
//! # Errors
//!
//! Redis error replies (`NOSCRIPT`, `OOM`, `READONLY`, `NOPERM`, `WRONGTYPE`, …) and refused connections are
//! definite ([`NodeError::not_applied`]); I/O errors, timeouts and dropped connections are ambiguous, because
//! redis-rs does not say whether the request had been written. See [`node_error`].
//!
//! Every script goes out as `EVALSHA`; on a `NOSCRIPT` reply (a definite refusal) it is sent once more as
//! `EVAL`, so it runs at most once.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
#[cfg(feature = "redis-cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, PushInfo, PushKind, RedisError, Value};
use redlease::notify::{self, Inbox, Notifier, SubscribeFuture, Subscriber};
use redlease::{
    Claim, Config, KeyState, LockManager, NodeError, NodeErrorKind, Readiness, RedisNode, Token,
    Ttl, async_trait,
};

use crate::ops::{self, Probe, Transport, Verb};
use crate::scripts::{self, Reply, Script};
use crate::{Capabilities, Commands, SetupError, Timeouts};

/// The redis-rs client crate, re-exported so that versions match.
pub use ::redis;

/// A redis-rs async connection a [`RedisRsNode`] can use: what the node must know about it.
///
/// Implemented for [`MultiplexedConnection`] and [`ConnectionManager`]; implement it for a connection type of
/// your own (a cloneable handle onto one server, on which a dropped request future does not desynchronise
/// later requests). A Redis Cluster connection is available only through [`ClusterNode::connect`], which
/// chooses its settings.
pub trait NodeConnection: ConnectionLike + Clone + Send + Sync + 'static {
    /// Whether the connection reconnects by itself after it dropped. When it does not, the node fails every
    /// call after the first dropped-connection error at once, definitely and without sending.
    const RECONNECTS: bool;
}

impl NodeConnection for MultiplexedConnection {
    const RECONNECTS: bool = false;
}

impl NodeConnection for ConnectionManager {
    const RECONNECTS: bool = true;
}

/// A [`RedisNode`] over a cloneable redis-rs async connection `C`.
///
/// Each call clones the connection (cheap for all redis-rs async connections) and runs one script. Use the
/// aliases [`MultiplexedNode`], [`ManagedNode`] and [`ClusterNode`] and their `connect` constructors, or
/// [`RedisRsNode::new`] for a connection you built yourself.
#[derive(Clone)]
pub struct RedisRsNode<C> {
    conn: C,
    endpoint: Option<String>,
    cluster: bool,
    reconnects: bool,
    /// Set once a non-reconnecting connection was seen to drop: nothing is sent on it any more.
    dead: Arc<AtomicBool>,
    probe: Probe,
    /// Release notifications over a subscriber connection of the node's own, if it has a client to open one.
    notifier: Option<Notifier>,
    /// The connection `WAIT` goes on, if the node has a client to open one (see [`Waiter`]).
    waiter: Option<Waiter>,
}

/// A node over one [`MultiplexedConnection`] (no reconnection; see [`MultiplexedNode::lazy`]).
pub type MultiplexedNode = RedisRsNode<MultiplexedConnection>;
/// A node over a reconnecting [`ConnectionManager`].
pub type ManagedNode = RedisRsNode<ConnectionManager>;
/// A node over a Redis Cluster [`ClusterConnection`]; checks hash slots client-side. Needs the
/// `redis-cluster` feature.
#[cfg(feature = "redis-cluster")]
pub type ClusterNode = RedisRsNode<ClusterConnection>;

impl<C> fmt::Debug for RedisRsNode<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRsNode")
            .field("connection", &std::any::type_name::<C>())
            .field("endpoint", &self.endpoint)
            .field("cluster", &self.cluster)
            .field("dead", &self.dead.load(Ordering::Relaxed))
            .finish()
    }
}

impl<C: NodeConnection> RedisRsNode<C> {
    /// A node over `conn`, **without endpoint**: add one with [`with_endpoint`](Self::with_endpoint), or a
    /// Redlock manager cannot tell that two nodes name one server. The `connect*` constructors keep the
    /// client's endpoint (and take timeouts): prefer them.
    pub fn new(conn: C) -> Self {
        Self::build(conn, C::RECONNECTS, false)
    }
}

impl<C> RedisRsNode<C> {
    fn build(conn: C, reconnects: bool, cluster: bool) -> Self {
        Self {
            conn,
            endpoint: None,
            cluster,
            reconnects,
            dead: Arc::new(AtomicBool::new(false)),
            probe: Probe::default(),
            notifier: None,
            waiter: None,
        }
    }

    /// Enables release notifications for waiting acquisitions (see [`redlease::notify`]): a subscriber
    /// connection of its own, opened from `client` (with RESP3) when the first acquisition waits and closed
    /// when the last waiter is gone, subscribing at most [`notify::DEFAULT_MAX_CHANNELS`] channels (see
    /// [`with_channel_budget`](Self::with_channel_budget)). The `connect` constructors do this with their
    /// client; use it for a node built with [`new`](RedisRsNode::new). Not for a Redis Cluster (see
    /// [`ClusterNode::connect_with_subscriber`]).
    pub fn with_subscriber(mut self, client: &redis::Client) -> Self {
        self.notifier = Some(standalone_notifier(client, notify::DEFAULT_MAX_CHANNELS));
        self
    }

    /// Sets the most channels the node (and its clones) subscribes at once; waiters beyond that poll. No
    /// effect on a node without notifications.
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

    /// Sets the identity reported by [`RedisNode::endpoint`], used to reject a Redlock topology that names one
    /// server twice. Do not put credentials in it.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
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

    /// The underlying connection.
    pub fn connection(&self) -> &C {
        &self.conn
    }

    /// Returns the underlying connection.
    pub fn into_inner(self) -> C {
        self.conn
    }
}

impl<C> RedisRsNode<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Runs the capability check now (it otherwise runs before the first acquisition), with `example_key`
    /// standing for the lock keys (choose one your ACL key patterns allow), and remembers the answer until
    /// the connection fails. A definite [`NodeErrorKind::Auth`] error names what the user may not run.
    pub async fn probe(&self, example_key: &str) -> Result<(), NodeError> {
        ops::check(self, example_key, None).await.map(|_| ())
    }
}

/// redis-rs connection settings with `timeouts`.
fn async_config(timeouts: Timeouts) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeouts.connection()))
        .set_response_timeout(Some(timeouts.response()))
}

/// A single-authority manager for the server at `url`, in one line.
///
/// Its node is a [`LazyNode`] with [`Timeouts::for_config`] (both the operation timeout): building it sends
/// nothing, the first call connects, and a call after a dropped connection connects again. A URL the client
/// cannot parse is an error now, before anything is sent. Its timer is
/// [`RuntimeTimer`](crate::runtime::RuntimeTimer) with feature `tokio` (tokio's timer on a tokio runtime), the
/// default timer otherwise.
///
/// ```no_run
/// use redlease::Config;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let manager = redlease_adapters::redis::single("redis://127.0.0.1:6379/0", Config::default())?;
/// let lease = manager.lock("jobs:{nightly}:lock").acquire().await?;
/// lease.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`SetupError::Url`] for a URL redis-rs cannot parse; [`SetupError::Config`] for an invalid `config`.
pub fn single(url: &str, config: Config) -> Result<LockManager, SetupError> {
    let node = lazy_from_url(0, url, &config)?;
    Ok(with_runtime_timer(LockManager::single(node, config)?))
}

/// A Redlock manager over the independent servers at `urls` (an odd number, at least 3), in one line.
///
/// Each node is a [`LazyNode`] as in [`single`], so the manager starts while a minority of the servers is
/// down. Two URLs naming one server (same host, port and database as written) are refused.
///
/// ```no_run
/// use redlease::Config;
///
/// # fn example() -> Result<(), redlease_adapters::SetupError> {
/// let urls = ["redis://redis-a:6379", "redis://redis-b:6379", "redis://redis-c:6379"];
/// let manager = redlease_adapters::redis::redlock(urls, Config::default())?;
/// assert_eq!(manager.quorum(), 2);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`SetupError::Url`] for the first URL redis-rs cannot parse (with its index); [`SetupError::Config`] for
/// an invalid `config`, or a topology Redlock refuses (an even number, fewer than 3, a duplicate).
pub fn redlock<I>(urls: I, config: Config) -> Result<LockManager, SetupError>
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    let nodes = urls
        .into_iter()
        .enumerate()
        .map(|(i, url)| lazy_from_url(i, url.as_ref(), &config))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(with_runtime_timer(LockManager::redlock(nodes, config)?))
}

/// The one-line constructors' timer: [`RuntimeTimer`](crate::runtime::RuntimeTimer) with feature `tokio`
/// (tokio's timer where a tokio runtime runs, else the default), the default timer without it (smol alone).
fn with_runtime_timer(manager: LockManager) -> LockManager {
    #[cfg(feature = "tokio")]
    let manager = manager.with_timer(crate::runtime::RuntimeTimer);
    manager
}

fn lazy_from_url(index: usize, url: &str, config: &Config) -> Result<LazyNode, SetupError> {
    let timeouts = Timeouts::for_config(config)?;
    let client = redis::Client::open(url).map_err(|e| SetupError::url(index, url, e))?;
    Ok(LazyNode::with_timeouts(client, timeouts))
}

/// `redis://host:port/db` (or the socket path) of a client, without credentials.
fn client_endpoint(client: &redis::Client) -> String {
    let info = client.get_connection_info();
    format!("redis://{}/{}", info.addr(), info.redis_settings().db())
}

impl MultiplexedNode {
    /// Opens a multiplexed connection with `client`'s settings; the endpoint is taken from the client. See
    /// [`connect_with_timeouts`](Self::connect_with_timeouts) to set the timeouts.
    pub async fn connect(client: &redis::Client) -> Result<Self, RedisError> {
        Self::connect_with_config(client, &AsyncConnectionConfig::new()).await
    }

    /// Opens a multiplexed connection with `timeouts` (connection and response); the endpoint is taken from
    /// the client.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlease_adapters::Timeouts;
    /// use redlease_adapters::redis::{MultiplexedNode, redis};
    ///
    /// async fn node() -> Result<MultiplexedNode, Box<dyn std::error::Error>> {
    ///     let client = redis::Client::open("redis://127.0.0.1:6379/0")?;
    ///     let timeouts = Timeouts::new(Duration::from_millis(300), Duration::from_millis(500))?;
    ///     Ok(MultiplexedNode::connect_with_timeouts(&client, timeouts).await?)
    /// }
    /// ```
    pub async fn connect_with_timeouts(
        client: &redis::Client,
        timeouts: Timeouts,
    ) -> Result<Self, RedisError> {
        Self::connect_with_config(client, &async_config(timeouts)).await
    }

    /// Opens a multiplexed connection with `config` (timeouts and other settings); the endpoint is taken
    /// from the client.
    pub async fn connect_with_config(
        client: &redis::Client,
        config: &AsyncConnectionConfig,
    ) -> Result<Self, RedisError> {
        let conn = client
            .get_multiplexed_async_connection_with_config(config)
            .await?;
        Ok(Self {
            waiter: Some(Waiter::new(client, config.clone())),
            ..Self::new(conn)
        }
        .with_endpoint(client_endpoint(client))
        .with_subscriber(client))
    }

    /// A node that opens its multiplexed connection on first use and again after it dropped; see
    /// [`LazyNode`]. Sends nothing now.
    pub fn lazy(client: redis::Client) -> LazyNode {
        LazyNode::new(client)
    }
}

impl ManagedNode {
    /// Creates a reconnecting [`ConnectionManager`] with `client`'s settings and `set_number_of_retries(0)`;
    /// the endpoint is taken from the client.
    ///
    /// Each (re)connection is tried once and its failure is the caller's error at once: with redis-rs's
    /// default retries a refused authentication (a wrong or rotated password) is retried with backoff and
    /// surfaces seconds later as an ambiguous error. The price: after a failed reconnection the next call
    /// fails too (and starts the next attempt), so a short outage costs a call more; redlease's retries
    /// absorb it.
    pub async fn connect(client: &redis::Client) -> Result<Self, RedisError> {
        Self::connect_with_config(
            client,
            ConnectionManagerConfig::new().set_number_of_retries(0),
        )
        .await
    }

    /// Like [`connect`](Self::connect) (`set_number_of_retries(0)`), with `timeouts` (connection and
    /// response); the endpoint is taken from the client.
    pub async fn connect_with_timeouts(
        client: &redis::Client,
        timeouts: Timeouts,
    ) -> Result<Self, RedisError> {
        Self::connect_with_config(
            client,
            ConnectionManagerConfig::new()
                .set_number_of_retries(0)
                .set_connection_timeout(Some(timeouts.connection()))
                .set_response_timeout(Some(timeouts.response())),
        )
        .await
    }

    /// Creates a [`ConnectionManager`] with `config` as given (timeouts, delays, retries); the endpoint is
    /// taken from the client. Add `set_number_of_retries(0)` for prompt, definite authentication errors (see
    /// [`connect`](Self::connect)).
    ///
    /// Over RESP3 (`?protocol=resp3`) a `ConnectionManager` reconnects in the background as soon as its
    /// connection closes, so the next command may go to a new server process (a restart, or a failover behind
    /// one address) without any error in between. So that the node still checks the new connection's
    /// capabilities and asks its [`run_id`](RedisNode::run_id) again, the `connect*` constructors give a
    /// RESP3 manager a push sender that watches for the disconnection; **a push sender set in `config` is
    /// replaced** (the node's release notifications use a connection of their own, not this one). A RESP3
    /// manager given to [`RedisRsNode::new`] has no such watch: it notices a new server only after a failed
    /// call or a refused command.
    pub async fn connect_with_config(
        client: &redis::Client,
        config: ConnectionManagerConfig,
    ) -> Result<Self, RedisError> {
        let probe = Probe::default();
        let config = if client
            .get_connection_info()
            .redis_settings()
            .protocol()
            .supports_resp3()
        {
            let watched = probe.clone();
            config.set_push_sender(move |info: PushInfo| {
                if info.kind == PushKind::Disconnection {
                    watched.forget();
                }
                Ok::<(), std::convert::Infallible>(())
            })
        } else {
            config
        };
        let conn = client.get_connection_manager_with_config(config).await?;
        Ok(Self {
            probe,
            waiter: Some(Waiter::new(client, AsyncConnectionConfig::new())),
            ..Self::new(conn)
        }
        .with_endpoint(client_endpoint(client))
        .with_subscriber(client))
    }
}

#[cfg(feature = "redis-cluster")]
impl ClusterNode {
    /// Connects to a Redis Cluster with `builder`'s settings, after setting
    /// [`retries(0)`](redis::cluster::ClusterClientBuilder::retries) (see the module docs: redis-rs otherwise
    /// re-sends lock commands). The client-side slot check is on. No endpoint is set: add one with
    /// [`with_endpoint`](RedisRsNode::with_endpoint) if needed.
    pub async fn connect(
        builder: redis::cluster::ClusterClientBuilder,
    ) -> Result<Self, RedisError> {
        let client = builder.retries(0).build()?;
        let conn = client.get_async_connection().await?;
        Ok(Self::build(conn, true, true))
    }

    /// Like [`connect`](Self::connect), with release notifications for waiting acquisitions: `subscriber`
    /// (a builder for the same cluster; it is switched to RESP3) opens the subscriber connections, one per
    /// primary, on which each waiter's channel is subscribed with `SSUBSCRIBE` in its key's slot (releases
    /// publish with `SPUBLISH` there). A builder cannot be cloned, so it is a second one.
    pub async fn connect_with_subscriber(
        builder: redis::cluster::ClusterClientBuilder,
        subscriber: redis::cluster::ClusterClientBuilder,
    ) -> Result<Self, RedisError> {
        let node = Self::connect(builder).await?;
        let client = subscriber
            .retries(0)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .build()?;
        let link = RedisSubscriber {
            target: Target::Cluster(Box::new(client)),
            current: Arc::default(),
        };
        Ok(Self {
            notifier: Some(Notifier::new(link, notify::DEFAULT_MAX_CHANNELS)),
            ..node
        })
    }
}

/// Classifies a redis-rs error into a [`NodeError`] for redlease.
///
/// - a Redis error reply (any server error code) → definite, kind from its code (`NOSCRIPT` → `NoScript`,
///   `OOM` → `OutOfMemory`, `NOPERM`/`NOAUTH`/`WRONGPASS` → `Auth`, `MOVED`/`ASK`/`TRYAGAIN`/`CLUSTERDOWN` →
///   `Cluster`, `BUSY`/`LOADING`/`MASTERDOWN` → `Busy`, …);
/// - failed authentication while connecting → definite `Auth`;
/// - connection refused → definite `Connection` (nothing could have been sent);
/// - errors raised by the client before sending (invalid arguments or configuration) → definite `Other`;
/// - timeouts → ambiguous `Timeout`; other I/O errors and dropped connections → ambiguous `Io`/`Connection`;
/// - unparseable replies → ambiguous `Protocol`; anything else → ambiguous `Other`.
///
/// The message names the operation and the error category, never a token or password.
pub fn node_error(err: &RedisError) -> NodeError {
    classify(None, err)
}

fn classify(script: Option<&Script>, err: &RedisError) -> NodeError {
    let what = script.map_or("the command", |s| s.name);
    let server_code = match err.kind() {
        ErrorKind::Server(_) | ErrorKind::Extension => err.code(),
        _ => None,
    };
    let node_err = if let Some(code) = server_code {
        let line = match err.detail() {
            Some(detail) => format!("{code} {detail}"),
            None => code.to_owned(),
        };
        scripts::server_error(script.unwrap_or(&scripts::COMMAND), &line)
    } else {
        match err.kind() {
            ErrorKind::AuthenticationFailed => NodeError::not_applied(
                NodeErrorKind::Auth,
                format!("{what}: authentication failed"),
            ),
            ErrorKind::Io if err.is_connection_refusal() => NodeError::not_applied(
                NodeErrorKind::Connection,
                format!("{what}: connection refused"),
            ),
            ErrorKind::Io if err.is_timeout() => NodeError::ambiguous(
                NodeErrorKind::Timeout,
                format!("{what}: no reply before the client's response timeout"),
            ),
            ErrorKind::Io if err.is_connection_dropped() => NodeError::ambiguous(
                NodeErrorKind::Connection,
                format!("{what}: connection closed; the request may have been sent ({err})"),
            ),
            ErrorKind::Io => NodeError::ambiguous(NodeErrorKind::Io, format!("{what}: {err}")),
            ErrorKind::Client | ErrorKind::InvalidClientConfig => NodeError::not_applied(
                NodeErrorKind::Other,
                format!("{what}: refused by the client before sending: {err}"),
            ),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => NodeError::ambiguous(
                NodeErrorKind::Protocol,
                format!("{what}: malformed reply: {}", err.category()),
            ),
            ErrorKind::ClusterConnectionNotFound => NodeError::ambiguous(
                NodeErrorKind::Cluster,
                format!("{what}: no connection to the slot's node ({err})"),
            ),
            _ => NodeError::ambiguous(NodeErrorKind::Other, format!("{what}: {err}")),
        }
    };
    node_err.with_source(err.clone())
}

fn to_reply(value: Value) -> Reply {
    match value {
        Value::Nil => Reply::Nil,
        Value::Int(n) => Reply::Int(n),
        Value::BulkString(bytes) => Reply::Bytes(bytes),
        Value::SimpleString(s) => Reply::Bytes(s.into_bytes()),
        Value::Okay => Reply::Bytes(b"OK".to_vec()),
        Value::Array(items) | Value::Set(items) => {
            Reply::Array(items.into_iter().map(to_reply).collect())
        }
        Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::VerbatimString { text, .. } => Reply::Bytes(text.into_bytes()),
        Value::Map(_) => Reply::Other("a map"),
        // A RESP3 double (a sorted set's score): the decimal text RESP2 gives.
        Value::Double(f) => Reply::Bytes(f.to_string().into_bytes()),
        _ => Reply::Other("an unsupported RESP type"),
    }
}

fn script_cmd(verb: Verb, script: &Script, keys: &[&str], args: &[&str]) -> Cmd {
    let mut cmd = redis::cmd(verb.as_str());
    cmd.arg(match verb {
        Verb::Eval => script.source,
        Verb::EvalSha => script.sha1,
    })
    .arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

fn transaction_pipe(cmds: &[&[&str]]) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    // Per-command results, so that an error inside EXEC is reported as that command's server error.
    pipe.atomic().ignore_errors();
    for args in cmds {
        pipe.add_command(plain_cmd(args));
    }
    pipe
}

/// `MULTI`, `GET key`, `PTTL key`, `EXEC` as a plain pipeline: one reply per command, whatever the server refuses (see
/// [`Transport::probe_transaction`]).
fn probe_pipe(key: &str) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("MULTI")
        .cmd("GET")
        .arg(key)
        .cmd("PTTL")
        .arg(key)
        .cmd("EXEC");
    pipe
}

fn plain_cmd(args: &[&str]) -> Cmd {
    let mut cmd = redis::cmd(args.first().copied().unwrap_or(""));
    for arg in args.iter().skip(1) {
        cmd.arg(*arg);
    }
    cmd
}

/// Sends the atomic pipeline `pipe` (`MULTI … EXEC`) once on `conn`: the replies, or the first error.
async fn send_transaction(
    conn: &mut (impl ConnectionLike + Send),
    pipe: &redis::Pipeline,
    what: &Script,
) -> Result<Vec<Reply>, NodeError> {
    let results = pipe
        .query_async::<Vec<redis::RedisResult<Value>>>(conn)
        .await
        .map_err(|e| classify_aborted(what, &e))?;
    // The first command error (a server reply inside EXEC's array: definite, classified by its code).
    results
        .into_iter()
        .map(|r| r.map(to_reply).map_err(|e| classify(Some(what), &e)))
        .collect()
}

/// A transaction's error: one that `EXEC` aborted (a command refused while queueing, e.g. by the ACL or for
/// want of memory) is classified by the first refused command's reply, so that its cause is named.
fn classify_aborted(what: &Script, err: &RedisError) -> NodeError {
    let first = err
        .clone()
        .into_server_errors()
        .and_then(|errors| errors.first().map(|(_, e)| e.clone()));
    match first {
        Some(first) if err.kind() == ErrorKind::Server(redis::ServerErrorKind::ExecAbort) => {
            let line = match first.details() {
                Some(detail) => format!("{} {detail}", first.code()),
                None => first.code().to_owned(),
            };
            scripts::server_error(what, &line).with_source(err.clone())
        }
        _ => classify(Some(what), err),
    }
}

/// Sends `cmd` and, pipelined behind it, `publish` once on `conn`: the reply of `cmd` (that of `publish` is
/// ignored).
async fn send_publishing(
    conn: &mut (impl ConnectionLike + Send),
    cmd: Cmd,
    publish: Cmd,
    what: &Script,
) -> Result<(Reply, Option<Reply>), NodeError> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.add_command(cmd);
    pipe.add_command(publish);
    let results = pipe
        .query_async::<Vec<redis::RedisResult<Value>>>(conn)
        .await
        .map_err(|e| classify(Some(what), &e))?;
    let mut results = results.into_iter();
    let Some(first) = results.next() else {
        return Err(scripts::unexpected_reply(what, &Reply::Array(Vec::new())));
    };
    let second = results.next().and_then(Result::ok).map(to_reply);
    first
        .map(|r| (to_reply(r), second))
        .map_err(|e| classify(Some(what), &e))
}

/// Sends `cmd` once on `conn`, classifying its error.
async fn send(
    conn: &mut (impl ConnectionLike + Send),
    cmd: &Cmd,
    what: &Script,
) -> Result<Reply, NodeError> {
    cmd.query_async::<Value>(conn)
        .await
        .map(to_reply)
        .map_err(|e| classify(Some(what), &e))
}

impl<C> RedisRsNode<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn run(&self, cmd: Cmd, what: &Script) -> Result<Reply, NodeError> {
        if self.dead.load(Ordering::Acquire) {
            return Err(NodeError::not_applied(
                NodeErrorKind::Connection,
                format!(
                    "{}: the multiplexed connection dropped earlier and never reconnects (not sent); build a new \
                     node, or use MultiplexedNode::lazy or ManagedNode",
                    what.name
                ),
            ));
        }
        let mut conn = self.conn.clone();
        let result = send(&mut conn, &cmd, what).await;
        self.after(&result);
        result
    }

    async fn run_publishing(
        &self,
        cmd: Cmd,
        publish: Cmd,
        what: &Script,
    ) -> Result<(Reply, Option<Reply>), NodeError> {
        if self.dead.load(Ordering::Acquire) {
            return Err(NodeError::not_applied(
                NodeErrorKind::Connection,
                format!(
                    "{}: the multiplexed connection dropped earlier and never reconnects (not sent)",
                    what.name
                ),
            ));
        }
        let mut conn = self.conn.clone();
        let result = send_publishing(&mut conn, cmd, publish, what).await;
        self.after(&result);
        result
    }

    async fn run_transaction(
        &self,
        pipe: redis::Pipeline,
        what: &Script,
    ) -> Result<Vec<Reply>, NodeError> {
        if self.dead.load(Ordering::Acquire) {
            return Err(NodeError::not_applied(
                NodeErrorKind::Connection,
                format!(
                    "{}: the multiplexed connection dropped earlier and never reconnects (not sent)",
                    what.name
                ),
            ));
        }
        let mut conn = self.conn.clone();
        let result = send_transaction(&mut conn, &pipe, what).await;
        self.after(&result);
        result
    }

    fn after<T>(&self, result: &Result<T, NodeError>) {
        if let Err(e) = result
            && !self.reconnects
            && is_dropped(e)
        {
            self.dead.store(true, Ordering::Release);
        }
    }
}

/// Whether a classified error says the connection dropped (redis-rs's driver then stops for good).
fn is_dropped(err: &NodeError) -> bool {
    use std::error::Error as _;
    err.source()
        .and_then(|s| s.downcast_ref::<RedisError>())
        .is_some_and(|e| e.is_connection_dropped() || e.is_unrecoverable_error())
}

impl<C> Transport for RedisRsNode<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn script_once(
        &self,
        verb: Verb,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Reply, NodeError> {
        self.run(script_cmd(verb, script, keys, args), script).await
    }

    async fn command(&self, what: &Script, _key: &str, args: &[&str]) -> Result<Reply, NodeError> {
        self.run(plain_cmd(args), what).await
    }

    async fn command_and_publish(
        &self,
        what: &Script,
        _key: &str,
        args: &[&str],
        publish: &[&str],
    ) -> Result<(Reply, Option<Reply>), NodeError> {
        self.run_publishing(plain_cmd(args), plain_cmd(publish), what)
            .await
    }

    async fn transaction(
        &self,
        what: &Script,
        _key: &str,
        cmds: &[&[&str]],
    ) -> Result<Vec<Reply>, NodeError> {
        self.run_transaction(transaction_pipe(cmds), what).await
    }

    async fn probe_transaction(&self, what: &Script, key: &str) -> Result<(), NodeError> {
        self.run_transaction(probe_pipe(key), what)
            .await
            .map(|_| ())
    }

    fn clustered(&self) -> bool {
        self.cluster
    }

    fn probe(&self) -> &Probe {
        &self.probe
    }

    /// A connection that never reconnects is one connection for the node's life (until it dropped); a
    /// reconnecting one may be replaced in the background, unnoticed.
    fn connection_id(&self, _key: &str) -> Option<u64> {
        (!self.reconnects && !self.dead.load(Ordering::Acquire)).then_some(0)
    }

    async fn wait_command(
        &self,
        what: &Script,
        key: &str,
        args: &[&str],
    ) -> Result<Reply, NodeError> {
        if let Some(waiter) = &self.waiter
            && let Some(reply) = waiter.wait(what, args).await
        {
            return reply;
        }
        self.command(what, key, args).await
    }
}

/// Implements [`RedisNode`] for a node type through [`ops`] (the type implements [`Transport`] and has
/// `endpoint` and `notifier` fields).
macro_rules! impl_node {
    ([$($generics:tt)*] $ty:ty $(where $($bounds:tt)*)?) => {
        #[async_trait]
        impl<$($generics)*> RedisNode for $ty $(where $($bounds)*)? {
            /// The capability check, run now (see `probe`): reachability, login, permissions and paths.
            async fn readiness(&self, key: &str) -> Readiness {
                ops::readiness(self, key).await
            }

            async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
                ops::acquire(self, key, token, ttl).await
            }

            async fn acquire_fresh(
                &self,
                key: &str,
                token: &Token,
                ttl: Ttl,
            ) -> Result<bool, NodeError> {
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

            fn notifier(&self) -> Option<&Notifier> {
                self.notifier.as_ref()
            }

            fn endpoint(&self) -> Option<String> {
                self.endpoint.clone()
            }

            async fn raise_fence(&self, fence_key: &str, at_least: u64) -> Result<u64, NodeError> {
                ops::raise_fence(self, fence_key, at_least).await
            }

            /// `INFO server`, once per connection where the node knows its connection (multiplexed, lazy),
            /// at every call for a reconnecting `ConnectionManager`; unsupported on a cluster.
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
    };
}

impl_node!([C] RedisRsNode<C> where C: ConnectionLike + Clone + Send + Sync + 'static);

/// A [`RedisNode`] over a multiplexed connection that is opened on first use and opened again on the first
/// call after it dropped.
///
/// Building one sends nothing, so every node of a Redlock service can be built while some servers are down;
/// a call to a down server fails definitely (connection refused, or the connection timeout of the config,
/// nothing sent) and the first call after the server is back connects. A request in flight when the
/// connection drops is reported as ambiguous and never re-sent. Clones share the connection.
#[derive(Clone)]
pub struct LazyNode {
    client: redis::Client,
    config: AsyncConnectionConfig,
    current: Arc<Mutex<Slot>>,
    endpoint: Option<String>,
    /// The capability state of the current connection (forgotten with each new connection).
    probe: Probe,
    notifier: Option<Notifier>,
    /// The connection `WAIT` goes on (see [`Waiter`]).
    waiter: Waiter,
}

/// The current connection of a [`LazyNode`] and a count of the connections opened so far.
#[derive(Default)]
struct Slot {
    conn: Option<MultiplexedConnection>,
    generation: u64,
}

impl fmt::Debug for LazyNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyNode")
            .field("endpoint", &self.endpoint)
            .field("connected", &self.is_connected())
            .finish()
    }
}

impl LazyNode {
    /// A lazy node for `client` with redis-rs's default connection settings; the endpoint is taken from the
    /// client.
    pub fn new(client: redis::Client) -> Self {
        Self::with_config(client, AsyncConnectionConfig::new())
    }

    /// A lazy node whose connections are opened with `timeouts` (connection and response); the endpoint is
    /// taken from the client.
    pub fn with_timeouts(client: redis::Client, timeouts: Timeouts) -> Self {
        Self::with_config(client, async_config(timeouts))
    }

    /// A lazy node whose connections are opened with `config` (set its connection timeout to at most the
    /// operation timeout, so a call to an unreachable server fails within the round).
    pub fn with_config(client: redis::Client, config: AsyncConnectionConfig) -> Self {
        Self {
            endpoint: Some(client_endpoint(&client)),
            notifier: Some(standalone_notifier(&client, notify::DEFAULT_MAX_CHANNELS)),
            waiter: Waiter::new(&client, config.clone()),
            client,
            config,
            current: Arc::new(Mutex::new(Slot::default())),
            probe: Probe::default(),
        }
    }

    /// Sets the channel budget of the node's release notifications; see [`RedisRsNode::with_channel_budget`].
    pub fn with_channel_budget(self, max_channels: usize) -> Self {
        if let Some(n) = &self.notifier {
            n.set_max_channels(max_channels);
        }
        self
    }

    /// Turns release notifications off; see [`RedisRsNode::without_notifications`].
    pub fn without_notifications(mut self) -> Self {
        self.notifier = None;
        self
    }

    /// Replaces the identity reported by [`RedisNode::endpoint`]. Do not put credentials in it.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Chooses which commands the node sends; see [`RedisRsNode::with_commands`].
    pub fn with_commands(self, commands: Commands) -> Self {
        self.probe.set_mode(commands);
        self
    }

    /// What the capability check learned about the current connection; see [`RedisRsNode::capabilities`].
    pub fn capabilities(&self) -> Option<Capabilities> {
        self.probe.get()
    }

    /// Whether a connection is open (it may still turn out to have dropped on its next use).
    pub fn is_connected(&self) -> bool {
        self.slot().conn.is_some()
    }

    /// Connects now if needed and runs the capability check (see [`RedisRsNode::probe`]).
    pub async fn probe(&self, example_key: &str) -> Result<(), NodeError> {
        ops::check(self, example_key, None).await.map(|_| ())
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The open connection and its generation, or a new one.
    async fn connection(&self, what: &Script) -> Result<(MultiplexedConnection, u64), NodeError> {
        {
            let slot = self.slot();
            if let Some(conn) = &slot.conn {
                return Ok((conn.clone(), slot.generation));
            }
        }
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| connect_error(what, &e))?;
        let mut slot = self.slot();
        // A concurrent call may have connected meanwhile: keep one connection.
        let conn = match &slot.conn {
            Some(existing) => existing.clone(),
            None => {
                slot.conn = Some(conn.clone());
                slot.generation += 1;
                self.probe.opened();
                conn
            }
        };
        Ok((conn, slot.generation))
    }

    async fn run(&self, cmd: Cmd, what: &Script) -> Result<Reply, NodeError> {
        let (mut conn, generation) = self.connection(what).await?;
        let result = send(&mut conn, &cmd, what).await;
        self.dropped(&result, generation);
        result
    }

    fn dropped<T>(&self, result: &Result<T, NodeError>, generation: u64) {
        if let Err(e) = result
            && is_dropped(e)
        {
            // Forget this connection (unless a newer one replaced it already); the next call reconnects. The
            // writes on it no longer count for `WAIT`.
            let mut slot = self.slot();
            if slot.generation == generation {
                slot.conn = None;
                self.probe.forget();
            }
        }
    }
}

/// A failed connection attempt: nothing of the operation was sent.
fn connect_error(what: &Script, err: &RedisError) -> NodeError {
    let classified = classify(Some(what), err);
    if !classified.is_ambiguous() {
        return classified;
    }
    let message = format!(
        "{}: could not connect (not sent): {}",
        what.name,
        if err.is_timeout() {
            "connection timeout".to_owned()
        } else {
            err.category().to_owned()
        }
    );
    NodeError::not_applied(NodeErrorKind::Connection, message).with_source(err.clone())
}

impl Transport for LazyNode {
    async fn script_once(
        &self,
        verb: Verb,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Reply, NodeError> {
        self.run(script_cmd(verb, script, keys, args), script).await
    }

    async fn command(&self, what: &Script, _key: &str, args: &[&str]) -> Result<Reply, NodeError> {
        self.run(plain_cmd(args), what).await
    }

    async fn command_and_publish(
        &self,
        what: &Script,
        _key: &str,
        args: &[&str],
        publish: &[&str],
    ) -> Result<(Reply, Option<Reply>), NodeError> {
        let (mut conn, generation) = self.connection(what).await?;
        let result = send_publishing(&mut conn, plain_cmd(args), plain_cmd(publish), what).await;
        self.dropped(&result, generation);
        result
    }

    async fn transaction(
        &self,
        what: &Script,
        _key: &str,
        cmds: &[&[&str]],
    ) -> Result<Vec<Reply>, NodeError> {
        let (mut conn, generation) = self.connection(what).await?;
        let result = send_transaction(&mut conn, &transaction_pipe(cmds), what).await;
        self.dropped(&result, generation);
        result
    }

    async fn probe_transaction(&self, what: &Script, key: &str) -> Result<(), NodeError> {
        let (mut conn, generation) = self.connection(what).await?;
        let result = send_transaction(&mut conn, &probe_pipe(key), what).await;
        self.dropped(&result, generation);
        result.map(|_| ())
    }

    fn clustered(&self) -> bool {
        false
    }

    fn probe(&self) -> &Probe {
        &self.probe
    }

    /// The open connection's number (each connection the node opens gets the next one).
    fn connection_id(&self, _key: &str) -> Option<u64> {
        let slot = self.slot();
        slot.conn.as_ref().map(|_| slot.generation)
    }

    async fn wait_command(
        &self,
        what: &Script,
        key: &str,
        args: &[&str],
    ) -> Result<Reply, NodeError> {
        if let Some(reply) = self.waiter.wait(what, args).await {
            return reply;
        }
        self.command(what, key, args).await
    }
}

/// The channel a [`Waiter`] publishes on (nobody listens: the publish is for its replication offset).
const WAIT_CHANNEL: &str = "redlease:wait";

/// How many idle wait connections a [`Waiter`] keeps for the next waits.
const WAITERS_KEPT: usize = 8;

/// A node's connections of its own for `WAIT` / `WAITAOF`, so that a durability wait never holds up the
/// commands of other leases: the server answers nothing else on a connection while a `WAIT` on it blocks
/// (with a replica down, every lease sharing the connection would time out for as long as the wait lasts),
/// and so that the waits do not hold up each other either: each wait takes an idle wait connection, or
/// opens one, and gives it back when answered (at most [`WAITERS_KEPT`] are kept idle; one whose wait was
/// cut is closed).
///
/// `WAIT` waits for the replication offset of its own connection's last write, so the `WAIT` goes right
/// behind a `PUBLISH` on [`WAIT_CHANNEL`] (pipelined, one round trip): a publish is replicated, so the
/// connection's offset becomes the server's current one, which covers every write the server applied
/// before — the lease's write among them, since its reply came first. Where the `PUBLISH` is refused (a
/// user without that channel), the connection cannot be opened or it dropped, `None`: the node waits on
/// its shared connection as before.
#[derive(Clone)]
struct Waiter {
    client: redis::Client,
    config: AsyncConnectionConfig,
    idle: Arc<Mutex<Vec<MultiplexedConnection>>>,
}

impl Waiter {
    /// Wait connections opened with `config`, without its response timeout: a `WAIT` answers by its own
    /// timeout, and the core bounds the call (a response timeout shorter than the wait would cut it).
    fn new(client: &redis::Client, config: AsyncConnectionConfig) -> Self {
        Self {
            client: client.clone(),
            config: config.set_response_timeout(None),
            idle: Arc::default(),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<MultiplexedConnection>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `args` (a `WAIT` or `WAITAOF`) behind the `PUBLISH` on a wait connection: its reply, or `None` where
    /// the shared connection must be used.
    async fn wait(&self, what: &Script, args: &[&str]) -> Option<Result<Reply, NodeError>> {
        let taken = self.idle().pop();
        let mut conn = match taken {
            Some(conn) => conn,
            None => self
                .client
                .get_multiplexed_async_connection_with_config(&self.config)
                .await
                .ok()?,
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("PUBLISH").arg(WAIT_CHANNEL).arg("");
        pipe.add_command(plain_cmd(args));
        let results = match pipe
            .query_async::<Vec<redis::RedisResult<Value>>>(&mut conn)
            .await
        {
            Ok(results) => results,
            Err(e) => {
                let classified = classify(Some(what), &e);
                // A dropped connection is not kept; the shared one is asked instead (a `WAIT` changes
                // nothing, whether or not it ran).
                return (!is_dropped(&classified)).then_some(Err(classified));
            }
        };
        {
            let mut idle = self.idle();
            if idle.len() < WAITERS_KEPT {
                idle.push(conn);
            }
        }
        let [publish, wait]: [redis::RedisResult<Value>; 2] = results.try_into().ok()?;
        // Without the publish the connection's offset covers nothing: its `WAIT` would count every replica.
        publish.ok()?;
        Some(wait.map(to_reply).map_err(|e| classify(Some(what), &e)))
    }
}

impl_node!([] LazyNode);

// After `impl_node!` and with access to this module's private helpers.
#[cfg(feature = "redis-sentinel")]
mod sentinel;
#[cfg(feature = "redis-sentinel")]
pub use sentinel::SentinelNode;

/// The servers a redis-rs subscriber connection talks to.
#[derive(Clone)]
enum Target {
    /// One server: a RESP3 multiplexed connection, `SUBSCRIBE`.
    Standalone(Box<redis::Client>),
    /// A Redis Cluster: a RESP3 cluster connection, `SSUBSCRIBE` routed by the channel's slot.
    #[cfg(feature = "redis-cluster")]
    Cluster(Box<redis::cluster::ClusterClient>),
}

#[derive(Clone)]
enum SubConnection {
    Standalone(MultiplexedConnection),
    #[cfg(feature = "redis-cluster")]
    Cluster(ClusterConnection),
}

/// The subscriber connection of a redis-rs node (see [`redlease::notify`]): opened for one inbox generation,
/// delivering pushed messages to that inbox, dropped on [`close`](Subscriber::close) or when it reports a
/// disconnection.
struct RedisSubscriber {
    target: Target,
    current: Arc<Mutex<Option<(SubConnection, u64)>>>,
}

/// Not a script: names `SUBSCRIBE`/`SSUBSCRIBE` and `UNSUBSCRIBE`/`SUNSUBSCRIBE` in messages.
const SUBSCRIBE: Script = Script {
    name: "SUBSCRIBE",
    source: "",
    sha1: "",
};

fn standalone_notifier(client: &redis::Client, max_channels: usize) -> Notifier {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let target = match redis::Client::open(info.set_redis_settings(settings)) {
        Ok(client) => Target::Standalone(Box::new(client)),
        // Cannot happen for the settings of a client that exists; then the plain client (whose subscribe
        // fails, so waiters poll).
        Err(_) => Target::Standalone(Box::new(client.clone())),
    };
    Notifier::new(
        RedisSubscriber {
            target,
            current: Arc::default(),
        },
        max_channels,
    )
}

fn lock_sub(
    m: &Mutex<Option<(SubConnection, u64)>>,
) -> std::sync::MutexGuard<'_, Option<(SubConnection, u64)>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a subscriber connection's push sender does with one push.
fn on_push(inbox: &Inbox, current: &Mutex<Option<(SubConnection, u64)>>, info: PushInfo) {
    match info.kind {
        PushKind::Message | PushKind::SMessage => {
            let bytes = |v: &Value| match v {
                Value::BulkString(b) => Some(b.clone()),
                Value::SimpleString(s) => Some(s.clone().into_bytes()),
                _ => None,
            };
            // `[channel, payload]`.
            if let [channel, payload, ..] = info.data.as_slice()
                && let (Some(channel), Some(payload)) = (bytes(channel), bytes(payload))
            {
                inbox.deliver(&channel, &payload);
            }
        }
        PushKind::Disconnection => {
            {
                let mut slot = lock_sub(current);
                if slot.as_ref().is_some_and(|(_, g)| *g == inbox.generation()) {
                    *slot = None;
                }
            }
            inbox.lost();
        }
        _ => {}
    }
}

impl RedisSubscriber {
    /// The connection of `inbox`'s generation, opened if needed.
    async fn connection(
        target: &Target,
        current: &Arc<Mutex<Option<(SubConnection, u64)>>>,
        inbox: &Inbox,
    ) -> Result<SubConnection, NodeError> {
        if let Some((conn, generation)) = &*lock_sub(current)
            && *generation == inbox.generation()
        {
            return Ok(conn.clone());
        }
        let (sink, slot) = (inbox.clone(), Arc::clone(current));
        let push = move |info: PushInfo| {
            on_push(&sink, &slot, info);
            Ok::<(), std::convert::Infallible>(())
        };
        let conn = match target {
            Target::Standalone(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(std::time::Duration::from_secs(2)))
                    .set_push_sender(push);
                SubConnection::Standalone(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map_err(|e| connect_error(&SUBSCRIBE, &e))?,
                )
            }
            #[cfg(feature = "redis-cluster")]
            Target::Cluster(client) => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(std::time::Duration::from_secs(2))
                    .set_push_sender(push);
                SubConnection::Cluster(
                    client
                        .get_async_connection_with_config(config)
                        .await
                        .map_err(|e| connect_error(&SUBSCRIBE, &e))?,
                )
            }
        };
        let mut slot = lock_sub(current);
        // A concurrent subscribe cannot happen (the notifier runs one command at a time); replace anything
        // older.
        *slot = Some((conn.clone(), inbox.generation()));
        Ok(conn)
    }
}

impl Subscriber for RedisSubscriber {
    fn subscribe(&self, inbox: Inbox, channel: &str) -> SubscribeFuture {
        let (target, current, channel) = (
            self.target.clone(),
            Arc::clone(&self.current),
            channel.to_owned(),
        );
        Box::pin(async move {
            let conn = Self::connection(&target, &current, &inbox).await?;
            let result = match conn {
                SubConnection::Standalone(mut c) => c.subscribe(&channel).await,
                #[cfg(feature = "redis-cluster")]
                SubConnection::Cluster(mut c) => c.ssubscribe(&channel).await,
            };
            result.map_err(|e| classify(Some(&SUBSCRIBE), &e))
        })
    }

    fn unsubscribe(&self, channel: &str) -> SubscribeFuture {
        let conn = lock_sub(&self.current).as_ref().map(|(c, _)| c.clone());
        let channel = channel.to_owned();
        Box::pin(async move {
            let result = match conn {
                None => return Ok(()),
                Some(SubConnection::Standalone(mut c)) => c.unsubscribe(&channel).await,
                #[cfg(feature = "redis-cluster")]
                Some(SubConnection::Cluster(mut c)) => c.sunsubscribe(&channel).await,
            };
            result.map_err(|e| classify(Some(&SUBSCRIBE), &e))
        })
    }

    fn close(&self) {
        // The last handle: the connection's driver ends and the server drops its subscriptions.
        let old = lock_sub(&self.current).take();
        drop(old);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn refused_connections_are_definite() {
        let err = RedisError::from(io::Error::from(io::ErrorKind::ConnectionRefused));
        let node_err = node_error(&err);
        assert_eq!(node_err.kind(), NodeErrorKind::Connection);
        assert!(!node_err.is_ambiguous());
    }

    #[test]
    fn dropped_connections_and_timeouts_are_ambiguous() {
        for (kind, expected) in [
            (io::ErrorKind::BrokenPipe, NodeErrorKind::Connection),
            (io::ErrorKind::ConnectionReset, NodeErrorKind::Connection),
            (io::ErrorKind::UnexpectedEof, NodeErrorKind::Connection),
            (io::ErrorKind::TimedOut, NodeErrorKind::Timeout),
            (io::ErrorKind::Other, NodeErrorKind::Io),
        ] {
            let err = node_error(&RedisError::from(io::Error::from(kind)));
            assert!(err.is_ambiguous(), "{kind:?}");
            assert_eq!(err.kind(), expected, "{kind:?}");
        }
    }

    #[test]
    fn server_replies_are_definite_and_classified() {
        let err = redis::make_extension_error("OOM".into(), Some("command not allowed".into()));
        let node_err = node_error(&err);
        assert_eq!(node_err.kind(), NodeErrorKind::OutOfMemory);
        assert!(!node_err.is_ambiguous());
        let err = redis::make_extension_error("WRONGPASS".into(), Some("invalid".into()));
        assert_eq!(node_error(&err).kind(), NodeErrorKind::Auth);
    }

    #[test]
    fn client_side_errors_are_definite() {
        let err = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(node_error(&err).kind(), NodeErrorKind::Auth);
        assert!(!node_error(&err).is_ambiguous());
        let err = RedisError::from((ErrorKind::Client, "bad"));
        assert!(!node_error(&err).is_ambiguous());
    }

    #[test]
    fn values_map_to_replies() {
        assert_eq!(to_reply(Value::Nil), Reply::Nil);
        assert_eq!(to_reply(Value::Int(3)), Reply::Int(3));
        assert_eq!(
            to_reply(Value::Array(vec![
                Value::BulkString(b"x".to_vec()),
                Value::Int(5)
            ])),
            Reply::Array(vec![Reply::Bytes(b"x".to_vec()), Reply::Int(5)])
        );
        assert_eq!(to_reply(Value::Boolean(false)), Reply::Nil);
    }
}
