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
//! (`ConnectionConfig::max_command_attempts`, default 3). A lock command re-sent blindly can run twice, and
//! late: a repeated release reports "not held" after its first copy succeeded, and an acquire re-sent after
//! redlease gave up re-takes the lock for nobody until its TTL runs out. So every command of a [`FredNode`]
//! carries its own [`Options`]: `max_attempts: Some(1)` (written at most once; if its connection closes the
//! caller gets the error instead of a replay) and `fail_fast: true` (when the client is not connected the
//! command fails at once, unsent, instead of queueing until a reconnection that may come after redlease's
//! timeout). The client's own settings for other commands are untouched.
//!
//! A consequence on Redis Cluster: following a `MOVED`/`ASK` redirection is a second write attempt, which
//! `max_attempts: Some(1)` refuses. After a resharding, the first command for a moved slot fails (reported as
//! an ambiguous [`NodeErrorKind::Cluster`] error, because fred's "too many failed write attempts" does not
//! say why) while fred refreshes its slot map; the next one is routed correctly.
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
//! # Errors
//!
//! Redis error replies (`NOSCRIPT`, `OOM`, `READONLY`, `NOPERM`, `WRONGTYPE`, …), fail-fast refusals and
//! refused connections are definite ([`NodeError::not_applied`]); I/O errors, timeouts and closed connections
//! after writing are ambiguous. See [`node_error`].
//!
//! Every script goes out as `EVALSHA`; on a `NOSCRIPT` reply (a definite refusal) it is sent once more as
//! `EVAL`, so it runs at most once. On a cluster each command is routed to the lock key's slot.

use std::fmt;
use std::time::Duration;

use fred::clients::{Client, Pool};
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::config::{Options, ServerConfig};
use fred::types::{ClusterHash, CustomCommand, Value};
use redlease::{KeyState, NodeError, NodeErrorKind, RedisNode, Token, Ttl, async_trait};

use crate::ops::{self, Transport};
use crate::scripts::{self, Reply, Script};
use crate::slot;

/// The fred client crate, re-exported so that versions match.
pub use ::fred;

/// A [`RedisNode`] over a fred client `C`: a [`Client`] ([`ClientNode`]) or a [`Pool`] ([`PoolNode`]).
///
/// Built with [`new`](Self::new), which reads the client's config to decide whether to check Redis Cluster
/// hash slots and what [`endpoint`](RedisNode::endpoint) to report. Connect the client (`init`) before
/// use; the node never connects or reconnects by itself.
#[derive(Clone)]
pub struct FredNode<C> {
    client: C,
    endpoint: Option<String>,
    cluster: bool,
    timeout: Option<Duration>,
    fail_fast: bool,
}

/// A node over one fred [`Client`].
pub type ClientNode = FredNode<Client>;
/// A node over a fred [`Pool`] (each command goes to the pool's next client).
pub type PoolNode = FredNode<Pool>;

impl<C> fmt::Debug for FredNode<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FredNode")
            .field("client", &std::any::type_name::<C>())
            .field("endpoint", &self.endpoint)
            .field("cluster", &self.cluster)
            .field("timeout", &self.timeout)
            .field("fail_fast", &self.fail_fast)
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

impl<C: ClientLike> FredNode<C> {
    /// A node over `client` (a [`Client`] or a [`Pool`]). The cluster slot check is on for clustered configs;
    /// the endpoint is derived from the config (host and port, never credentials).
    pub fn new(client: C) -> Self {
        let config = client.client_config();
        Self {
            endpoint: config_endpoint(&config),
            cluster: config.server.is_clustered(),
            client,
            timeout: None,
            fail_fast: true,
        }
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

    /// Whether commands fail at once, unsent, while the client is not connected (default `true`). With
    /// `false` they wait for the reconnection (still written at most once), which can outlast redlease's
    /// operation timeout and then run late.
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

const FAIL_FAST_DETAILS: &str = "Connection closed unexpectedly.";

/// Classifies a fred error into a [`NodeError`] for redlease (assuming the command was sent with
/// `max_attempts: Some(1)`, as [`FredNode`] does).
///
/// - a Redis error reply (fred keeps the reply line, `CODE detail…`, as the details) → definite, kind from its
///   code (`NOSCRIPT`, `OOM`, `READONLY`, `NOPERM`/`NOAUTH`/`WRONGPASS` → `Auth`, `MOVED`/`ASK`/`TRYAGAIN`/
///   `CLUSTERDOWN` → `Cluster`, `BUSY`/`LOADING`/`MASTERDOWN` → `Busy`, `WRONGTYPE`, …);
/// - fail-fast refusal (client not connected) and refused connections → definite `Connection`;
/// - routing failures and backpressure (nothing written) → definite `Cluster` / `Busy`;
/// - client-side argument or configuration errors → definite `Other`;
/// - timeouts → ambiguous `Timeout`; I/O errors, closed connections and cancellations → ambiguous;
/// - "too many failed write attempts" (a redirection that would need a second write) → ambiguous `Cluster`;
/// - malformed replies → ambiguous `Protocol`; anything else → ambiguous `Other`.
pub fn node_error(err: &FredError) -> NodeError {
    classify(None, err)
}

fn classify(script: Option<&Script>, err: &FredError) -> NodeError {
    let what = script.map_or("the command", |s| s.name);
    let details = err.details();
    let first = details.split_whitespace().next().unwrap_or("");
    let server_reply = matches!(
        err.kind(),
        ErrorKind::Unknown
            | ErrorKind::InvalidArgument
            | ErrorKind::InvalidCommand
            | ErrorKind::Auth
            | ErrorKind::Cluster
            | ErrorKind::Config
    ) && scripts::looks_like_error_code(first);
    let node_err = if server_reply {
        let script = script.copied().unwrap_or(Script {
            name: "command",
            source: "",
            sha1: "",
        });
        scripts::server_error(&script, details)
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
            ErrorKind::Auth => NodeError::not_applied(
                NodeErrorKind::Auth,
                format!("{what}: authentication failed ({details})"),
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
            ErrorKind::Unknown if details.starts_with("Too many failed write attempts") => {
                NodeError::ambiguous(
                    NodeErrorKind::Cluster,
                    format!(
                        "{what}: fred needed a second write attempt (e.g. to follow a cluster redirection), \
                         which redlease disables"
                    ),
                )
            }
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
        Value::Double(_) => Reply::Other("a double"),
        Value::Map(_) => Reply::Other("a map"),
        Value::Queued => Reply::Other("QUEUED"),
    }
}

fn is_noscript(err: &FredError) -> bool {
    err.details().split_whitespace().next() == Some("NOSCRIPT")
}

impl<C> FredNode<C>
where
    C: ClientLike + Clone + Send + Sync + 'static,
{
    fn options(&self) -> Options {
        Options {
            max_attempts: Some(1),
            timeout: self.timeout,
            fail_fast: self.fail_fast,
            ..Options::default()
        }
    }
}

#[async_trait]
impl<C> Transport for FredNode<C>
where
    C: ClientLike + Clone + Send + Sync + 'static,
{
    async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Reply, NodeError> {
        // Route by the first key's slot (all keys share it on a cluster; ignored otherwise).
        let hash = ClusterHash::Custom(slot::hash_slot(
            keys.first().map_or(&b""[..], |k| k.as_bytes()),
        ));
        let client = self.client.with_options(&self.options());
        let build = |body: &str| {
            let mut values: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
            values.push(Value::from(body));
            values.push(Value::Integer(keys.len() as i64));
            values.extend(keys.iter().map(|k| Value::from(*k)));
            values.extend(args.iter().map(|a| Value::from(*a)));
            values
        };
        let evalsha = CustomCommand::new_static("EVALSHA", hash.clone(), false);
        let result = match client
            .custom::<Value, Value>(evalsha, build(script.sha1))
            .await
        {
            // NOSCRIPT is a refusal: nothing ran, so one EVAL cannot double-apply.
            Err(e) if is_noscript(&e) => {
                let eval = CustomCommand::new_static("EVAL", hash, false);
                client
                    .custom::<Value, Value>(eval, build(script.source))
                    .await
            }
            other => other,
        };
        result.map(to_reply).map_err(|e| classify(Some(script), &e))
    }

    async fn set_nx_px(&self, key: &str, value: &str, ttl_ms: u64) -> Result<Reply, NodeError> {
        let hash = ClusterHash::Custom(slot::hash_slot(key.as_bytes()));
        let client = self.client.with_options(&self.options());
        let args = vec![
            Value::from(key),
            Value::from(value),
            Value::from("NX"),
            Value::from("PX"),
            Value::from(ttl_ms.to_string()),
        ];
        client
            .custom::<Value, Value>(CustomCommand::new_static("SET", hash, false), args)
            .await
            .map(to_reply)
            .map_err(|e| classify(None, &e))
    }

    fn clustered(&self) -> bool {
        self.cluster
    }
}

#[async_trait]
impl<C> RedisNode for FredNode<C>
where
    C: ClientLike + Clone + Send + Sync + 'static,
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
                "ERR fence counter exhausted",
                NodeErrorKind::Other,
            ),
        ] {
            let err = node_error(&FredError::new(kind, line));
            assert_eq!(err.kind(), expected, "{line}");
            assert!(!err.is_ambiguous(), "{line}");
        }
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
                NodeErrorKind::Cluster,
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
}
