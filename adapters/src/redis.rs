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
//!   (a dropped request does not desynchronise it). It does not reconnect: after the server goes away every
//!   call fails until you build a new node.
//! - [`ConnectionManager`] ([`ManagedNode`]): a multiplexed connection that reconnects in the background
//!   after an I/O error. It does **not** re-send the failed command, which is what lock commands need.
//! - [`ClusterConnection`] ([`ClusterNode`]): Redis Cluster. Lock and fence keys are checked client-side to
//!   share a hash slot (see [`crate::slot`]). Build the client with
//!   [`ClusterClientBuilder::retries(0)`](redis::cluster::ClusterClientBuilder::retries): redis-rs otherwise
//!   re-sends a request after an I/O error or a redirection, and a re-sent command whose first copy was applied
//!   turns a successful release into a "not held" report (the other scripts are harmless to repeat, but a late
//!   repeat can re-take a lock after redlease gave it up, keeping it blocked for one TTL). With `retries(0)` a
//!   `MOVED`/`ASK` after a resharding surfaces as a definite [`NodeErrorKind::Cluster`] error and the next
//!   call is routed with the refreshed slot map.
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

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use redlease::{KeyState, NodeError, NodeErrorKind, RedisNode, Token, Ttl, async_trait};

use crate::ops::{self, Transport};
use crate::scripts::{self, Reply, Script};

/// The redis-rs client crate, re-exported so that versions match.
pub use ::redis;

/// A [`RedisNode`] over any cloneable redis-rs async connection `C`.
///
/// Each call clones the connection (cheap for all redis-rs async connections) and runs one script. Use the
/// aliases [`MultiplexedNode`], [`ManagedNode`] and [`ClusterNode`] and their `connect` constructors, or
/// [`RedisRsNode::new`] for a connection you built yourself.
#[derive(Clone)]
pub struct RedisRsNode<C> {
    conn: C,
    endpoint: Option<String>,
    cluster: bool,
}

/// A node over one [`MultiplexedConnection`] (no reconnection).
pub type MultiplexedNode = RedisRsNode<MultiplexedConnection>;
/// A node over a reconnecting [`ConnectionManager`].
pub type ManagedNode = RedisRsNode<ConnectionManager>;
/// A node over a Redis Cluster [`ClusterConnection`]; checks hash slots client-side.
pub type ClusterNode = RedisRsNode<ClusterConnection>;

impl<C> fmt::Debug for RedisRsNode<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRsNode")
            .field("connection", &std::any::type_name::<C>())
            .field("endpoint", &self.endpoint)
            .field("cluster", &self.cluster)
            .finish()
    }
}

impl<C> RedisRsNode<C> {
    /// A node over `conn`, without endpoint and without the cluster slot check.
    ///
    /// For a Redis Cluster connection of your own type, add
    /// [`with_cluster_slot_check(true)`](Self::with_cluster_slot_check).
    pub fn new(conn: C) -> Self {
        Self {
            conn,
            endpoint: None,
            cluster: false,
        }
    }

    /// Sets the identity reported by [`RedisNode::endpoint`], used to reject a Redlock topology that names one
    /// server twice. Do not put credentials in it.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Whether to check, before sending, that the lock and fence keys of a fenced acquisition share a Redis
    /// Cluster hash slot (on for [`ClusterNode`]s).
    pub fn with_cluster_slot_check(mut self, check: bool) -> Self {
        self.cluster = check;
        self
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

/// `redis://host:port/db` (or the socket path) of a client, without credentials.
fn client_endpoint(client: &redis::Client) -> String {
    let info = client.get_connection_info();
    format!("redis://{}/{}", info.addr(), info.redis_settings().db())
}

impl MultiplexedNode {
    /// Opens a multiplexed connection with `client`'s settings; the endpoint is taken from the client.
    ///
    /// To set timeouts, open the connection yourself with
    /// [`get_multiplexed_async_connection_with_config`](redis::Client::get_multiplexed_async_connection_with_config)
    /// and use [`RedisRsNode::new`].
    pub async fn connect(client: &redis::Client) -> Result<Self, RedisError> {
        let conn = client.get_multiplexed_async_connection().await?;
        Ok(Self::new(conn).with_endpoint(client_endpoint(client)))
    }
}

impl ManagedNode {
    /// Creates a reconnecting [`ConnectionManager`] with `client`'s settings; the endpoint is taken from the
    /// client.
    ///
    /// For timeouts and the reconnection policy use
    /// [`get_connection_manager_with_config`](redis::Client::get_connection_manager_with_config) and
    /// [`RedisRsNode::new`].
    pub async fn connect(client: &redis::Client) -> Result<Self, RedisError> {
        let conn = client.get_connection_manager().await?;
        Ok(Self::new(conn).with_endpoint(client_endpoint(client)))
    }
}

impl ClusterNode {
    /// A node over a cluster connection, with the client-side slot check on.
    pub fn cluster(conn: ClusterConnection) -> Self {
        Self::new(conn).with_cluster_slot_check(true)
    }

    /// Connects to the cluster with `client`'s settings (build it with `.retries(0)`; see the module docs).
    /// No endpoint is set: add one with [`with_endpoint`](RedisRsNode::with_endpoint) if needed.
    pub async fn connect(client: &redis::cluster::ClusterClient) -> Result<Self, RedisError> {
        Ok(Self::cluster(client.get_async_connection().await?))
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
        let script = script.copied().unwrap_or(Script {
            name: "command",
            source: "",
            sha1: "",
        });
        scripts::server_error(&script, &line)
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
        Value::Map(_) => Reply::Other("a map"),
        Value::Double(_) => Reply::Other("a double"),
        _ => Reply::Other("an unsupported RESP type"),
    }
}

#[async_trait]
impl<C> Transport for RedisRsNode<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Reply, NodeError> {
        let mut conn = self.conn.clone();
        let build = |verb: &str, body: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(body).arg(keys.len());
            for key in keys {
                cmd.arg(*key);
            }
            for arg in args {
                cmd.arg(*arg);
            }
            cmd
        };
        let first = build("EVALSHA", script.sha1)
            .query_async::<Value>(&mut conn)
            .await;
        let result = match first {
            // NOSCRIPT is a refusal: nothing ran, so one EVAL cannot double-apply.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                build("EVAL", script.source)
                    .query_async::<Value>(&mut conn)
                    .await
            }
            other => other,
        };
        result.map(to_reply).map_err(|e| classify(Some(script), &e))
    }

    async fn set_nx_px(&self, key: &str, value: &str, ttl_ms: u64) -> Result<Reply, NodeError> {
        let mut conn = self.conn.clone();
        redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async::<Value>(&mut conn)
            .await
            .map(to_reply)
            .map_err(|e| classify(None, &e))
    }

    fn clustered(&self) -> bool {
        self.cluster
    }
}

#[async_trait]
impl<C> RedisNode for RedisRsNode<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        ops::acquire(self, key, token, ttl).await
    }

    async fn acquire_fresh(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        ops::acquire_fresh(self, key, token, ttl).await
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

    fn endpoint(&self) -> Option<String> {
        self.endpoint.clone()
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
