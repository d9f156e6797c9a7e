//! [`RedisNode`](redlease::RedisNode) for redis-rs async connections: [`MultiplexedConnection`], [`ConnectionManager`] and the
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
//!   connection drop, every later call fails at once with a definite [`NodeErrorKind::Connection`](redlease::NodeErrorKind::Connection) error
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
//!   ambiguous error instead of a prompt, definite [`NodeErrorKind::Auth`](redlease::NodeErrorKind::Auth) error. With
//!   [`ManagedNode::connect_with_config`] the retries are yours to choose.
//! - [`ClusterConnection`] ([`ClusterNode`]): Redis Cluster, built only by [`ClusterNode::connect`], which
//!   sets [`retries(0)`](redis::cluster::ClusterClientBuilder::retries) whatever the builder said: redis-rs
//!   otherwise re-sends a request after an I/O error or a redirection, and a re-sent command whose first copy
//!   was applied turns a successful release into a "not held" report (and a late repeat can re-take a lock
//!   after redlease gave it up). With `retries(0)` a `MOVED`/`ASK` after a resharding surfaces as a definite
//!   [`NodeErrorKind::Cluster`](redlease::NodeErrorKind::Cluster) error and the next call is routed with the refreshed slot map. Lock and fence
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
//! [`NodeErrorKind::Auth`](redlease::NodeErrorKind::Auth) error before anything is written. [`RedisRsNode::probe`] and [`LazyNode::probe`]
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
//!   [`NodeErrorKind::Timeout`](redlease::NodeErrorKind::Timeout): the command may have run.
//!
//! # Errors
//!
//! Redis error replies (`NOSCRIPT`, `OOM`, `READONLY`, `NOPERM`, `WRONGTYPE`, …) and refused connections are
//! definite ([`NodeError::not_applied`](redlease::NodeError::not_applied)); I/O errors, timeouts and dropped connections are ambiguous, because
//! redis-rs does not say whether the request had been written. See [`node_error`].
//!
//! Every script goes out as `EVALSHA`; on a `NOSCRIPT` reply (a definite refusal) it is sent once more as
//! `EVAL`, so it runs at most once.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
#[cfg(feature = "redis-cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, PushInfo, PushKind, RedisError};
use redlease::notify;
#[cfg(feature = "redis-cluster")]
use redlease::notify::Notifier;
use redlease::{Config, LockManager};

use crate::node::Node;
use crate::ops::Probe;
use crate::{SetupError, Timeouts};

mod error;
mod lazy;
mod subscriber;
mod transport;
mod waiter;
mod wire;

pub use error::node_error;
pub use lazy::{LazyNode, LazyTransport};
use subscriber::standalone_notifier;
#[cfg(feature = "redis-cluster")]
use subscriber::{RedisSubscriber, Target};
use waiter::Waiter;

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

/// A [`RedisNode`](redlease::RedisNode) over a cloneable redis-rs async connection `C`.
///
/// Each call clones the connection (cheap for all redis-rs async connections) and runs one script. Use the
/// aliases [`MultiplexedNode`], [`ManagedNode`] and [`ClusterNode`] and their `connect` constructors, or
/// [`RedisRsNode::new`] for a connection you built yourself. The builder methods every node shares
/// ([`with_endpoint`](Node::with_endpoint), [`with_commands`](Node::with_commands),
/// [`probe`](Node::probe), …) are [`Node`]'s.
pub type RedisRsNode<C> = Node<RedisRsTransport<C>>;

/// The transport of a [`RedisRsNode`]: its redis-rs connection `C` and what the node keeps about it. Built by
/// [`RedisRsNode::new`] and the `connect` constructors.
#[derive(Clone)]
pub struct RedisRsTransport<C> {
    conn: C,
    cluster: bool,
    reconnects: bool,
    /// Set once a non-reconnecting connection was seen to drop: nothing is sent on it any more.
    dead: Arc<AtomicBool>,
    probe: Probe,
    /// The connection `WAIT` goes on, if the node has a client to open one (see [`Waiter`]).
    waiter: Option<Waiter>,
}

/// A node over one [`MultiplexedConnection`] (no reconnection; see [`MultiplexedNode::lazy`]).
///
/// (A [`RedisRsNode`]: the methods every node has are [`Node`]'s.)
pub type MultiplexedNode = RedisRsNode<MultiplexedConnection>;
/// A node over a reconnecting [`ConnectionManager`].
///
/// (A [`RedisRsNode`]: the methods every node has are [`Node`]'s.)
pub type ManagedNode = RedisRsNode<ConnectionManager>;
/// A node over a Redis Cluster [`ClusterConnection`]; checks hash slots client-side. Needs the
/// `redis-cluster` feature.
///
/// (A [`RedisRsNode`]: the methods every node has are [`Node`]'s.)
#[cfg(feature = "redis-cluster")]
pub type ClusterNode = RedisRsNode<ClusterConnection>;

impl<C: NodeConnection> RedisRsNode<C> {
    /// A node over `conn`, **without endpoint**: add one with [`with_endpoint`](Node::with_endpoint), or a
    /// Redlock manager cannot tell that two nodes name one server. The `connect*` constructors keep the
    /// client's endpoint (and take timeouts): prefer them.
    pub fn new(conn: C) -> Self {
        Self::build(conn, C::RECONNECTS, false)
    }
}

impl<C> RedisRsNode<C> {
    fn build(conn: C, reconnects: bool, cluster: bool) -> Self {
        Node {
            transport: RedisRsTransport {
                conn,
                cluster,
                reconnects,
                dead: Arc::new(AtomicBool::new(false)),
                probe: Probe::default(),
                waiter: None,
            },
            endpoint: None,
            notifier: None,
        }
    }

    /// Enables release notifications for waiting acquisitions (see [`redlease::notify`]): a subscriber
    /// connection of its own, opened from `client` (with RESP3) when the first acquisition waits and closed
    /// when the last waiter is gone, subscribing at most [`notify::DEFAULT_MAX_CHANNELS`] channels (see
    /// [`with_channel_budget`](Node::with_channel_budget)). The `connect` constructors do this with their
    /// client; use it for a node built with [`new`](RedisRsNode::new). Not for a Redis Cluster (see
    /// [`ClusterNode::connect_with_subscriber`]).
    pub fn with_subscriber(mut self, client: &redis::Client) -> Self {
        self.notifier = Some(standalone_notifier(client, notify::DEFAULT_MAX_CHANNELS));
        self
    }

    /// The underlying connection.
    pub fn connection(&self) -> &C {
        &self.transport.conn
    }

    /// Returns the underlying connection.
    pub fn into_inner(self) -> C {
        self.transport.conn
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
        let mut node = Self::new(conn);
        node.transport.waiter = Some(Waiter::new(client, config.clone()));
        Ok(node
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
    /// capabilities and asks its [`run_id`](redlease::RedisNode::run_id) again, the `connect*` constructors give a
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
        let mut node = Self::new(conn);
        node.transport.probe = probe;
        node.transport.waiter = Some(Waiter::new(client, AsyncConnectionConfig::new()));
        Ok(node
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

#[cfg(feature = "redis-sentinel")]
mod sentinel;
#[cfg(feature = "redis-sentinel")]
pub use sentinel::{SentinelNode, SentinelTransport};
