//! [`RedisNode`](redlease::RedisNode) for fred: a [`Client`] or a [`Pool`], centralized, sentinel or clustered, through one generic
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
//! out. So every command of a [`FredNode`] carries its own [`Options`](fred::types::config::Options): `max_attempts: Some(1)` (written at
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
//! redirections and refused connections are definite ([`NodeError::not_applied`](redlease::NodeError::not_applied)); I/O errors, timeouts and
//! closed connections after writing are ambiguous. See [`node_error`].
//!
//! Every script goes out as `EVALSHA`; on a `NOSCRIPT` reply (a definite refusal) it is sent once more as
//! `EVAL`, so it runs at most once. On a cluster each command is routed to the lock key's slot.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::clients::{Client, Pool};
use fred::interfaces::ClientLike;
use fred::types::config::ServerConfig;
use redlease::notify::{self, Notifier};
use redlease::{Config, LockManager, NodeErrorKind, Readiness};

use crate::node::{Backend, Node};
use crate::ops::Probe;
use crate::{SetupError, Timeouts, slot};

mod error;
mod health;
mod subscriber;
mod transport;
mod waiter;

pub use error::node_error;
use health::{Health, LazyStart};
use subscriber::FredSubscriber;
use waiter::FredWaiter;

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

/// A [`RedisNode`](redlease::RedisNode) over a fred client `C`: a [`Client`] ([`ClientNode`]) or a [`Pool`] ([`PoolNode`]).
///
/// Built with [`new`](FredNode::new) for a connected client, or [`lazy`](FredNode::lazy) for one that
/// connects on first use. Both read the client's config to decide whether to check Redis Cluster hash slots
/// and what [endpoint](redlease::NodeProfile::endpoint) to report. The builder methods every node shares
/// ([`with_endpoint`](Node::with_endpoint), [`with_commands`](Node::with_commands), [`probe`](Node::probe),
/// …) are [`Node`]'s.
pub type FredNode<C> = Node<FredTransport<C>>;

/// The transport of a [`FredNode`]: its fred client `C` and what the node keeps about its connections. Built
/// by [`FredNode::new`] and [`FredNode::lazy`].
#[derive(Clone)]
pub struct FredTransport<C> {
    client: C,
    cluster: bool,
    timeout: Option<Duration>,
    fail_fast: bool,
    /// For [`lazy`](FredNode::lazy) nodes: the state of the first connection.
    connect_started: Option<Arc<LazyStart>>,
    /// One per member client, in [`KeyRouted::members`] order.
    health: Arc<Vec<Health>>,
    probe: Probe,
    /// Clients of the node's own for durability waits (one server only; see [`FredWaiter`]).
    waiter: Option<FredWaiter>,
}

/// A node over one fred [`Client`].
///
/// (A [`FredNode`]: the methods every node has are [`Node`]'s.)
pub type ClientNode = FredNode<Client>;
/// A node over a fred [`Pool`] (every command for one key goes to the same pool member).
///
/// (A [`FredNode`]: the methods every node has are [`Node`]'s.)
pub type PoolNode = FredNode<Pool>;

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
        Node {
            notifier,
            endpoint: config_endpoint(&config),
            transport: FredTransport {
                waiter,
                cluster,
                timeout: None,
                fail_fast: true,
                connect_started: None,
                health: Arc::new(client.members().iter().map(Health::new).collect()),
                client,
                probe: Probe::default(),
            },
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
        node.transport.connect_started = Some(Arc::default());
        node
    }
}

impl<C> FredNode<C> {
    /// A per-command timeout passed to fred (`Options::timeout`). Without it the client's
    /// `default_command_timeout` applies (none by default; redlease's operation timeout still bounds calls).
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.transport.timeout = Some(timeout);
        self
    }

    /// Whether commands fail at once, unsent, while the client is not connected or after fred announced a
    /// dropped connection and has not reconnected since (default `true`). With `false` they wait for the
    /// reconnection (still written at most once), which can outlast redlease's operation timeout and then
    /// run late.
    pub fn with_fail_fast(mut self, fail_fast: bool) -> Self {
        self.transport.fail_fast = fail_fast;
        self
    }

    /// The underlying client.
    pub fn client(&self) -> &C {
        &self.transport.client
    }

    /// Returns the underlying client.
    pub fn into_inner(self) -> C {
        self.transport.client
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

impl<C: KeyRouted> Backend for FredTransport<C> {
    /// A lazy node connects first; a connection error fred reports meanwhile (a refused login, a refused
    /// connection) is the answer, since fred keeps trying to connect by its policy and a command would only
    /// learn "not connected".
    async fn before_readiness(&self) -> Option<Readiness> {
        if self.must_start()
            && tokio::runtime::Handle::try_current().is_ok()
            && let Some(err) = self.connect_for_check().await
        {
            return Some(if err.kind() == NodeErrorKind::Auth {
                Readiness::LoginRefused(err)
            } else {
                Readiness::from_error(err)
            });
        }
        None
    }

    fn fmt_node(&self, endpoint: &Option<String>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FredNode")
            .field("client", &std::any::type_name::<C>())
            .field("endpoint", endpoint)
            .field("cluster", &self.cluster)
            .field("timeout", &self.timeout)
            .field("fail_fast", &self.fail_fast)
            .field("lazy", &self.connect_started.is_some())
            .finish()
    }
}

mod sentinel;
pub use sentinel::sentinel_builder;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;
    use fred::types::config::Options;
    use fred::types::{ClusterHash, CustomCommand, Value};
    use redlease::{Token, Ttl};

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
        let slot = redlease::RunIdSlot::new();
        let sizes = [
            (
                "acquire",
                std::mem::size_of_val(&ops::acquire(&node.transport, "k", &token, ttl)),
            ),
            (
                "fresh_acquire",
                std::mem::size_of_val(&ops::fresh_acquire_reporting(
                    &node.transport,
                    "k",
                    &token,
                    ttl,
                    None,
                )),
            ),
            (
                "claim (fresh, reporting the run id: SET NX GET with INFO pipelined)",
                std::mem::size_of_val(&ops::claim(
                    &node.transport,
                    redlease::ClaimRequest::new("k", &token, ttl)
                        .fresh(true)
                        .report_run_id(&slot),
                    true,
                )),
            ),
            (
                "extend",
                std::mem::size_of_val(&ops::extend(&node.transport, "k", &token, ttl)),
            ),
            (
                "release",
                std::mem::size_of_val(&ops::release(&node.transport, "k", &token)),
            ),
        ];
        for (op, size) in sizes {
            eprintln!("{op}: {size} B (fred call {fred_call} B)");
            assert!(
                size < fred_call * 3 / 2,
                "{op}: a {size}-byte future for a {fred_call}-byte fred call"
            );
        }
    }
}
