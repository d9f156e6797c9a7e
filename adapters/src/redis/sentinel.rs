//! [`SentinelNode`]: a redis-rs node that asks Redis Sentinel for the current primary and follows it after a
//! failover.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};
use redlease::{NodeError, NodeErrorKind, ReplicaWait};

use redis::RedisError;

use super::error::{connect_error, is_dropped};
use super::waiter::Waiter;
use super::wire::{
    plain_cmd, script_cmd, send, send_publishing, send_transaction, transaction_pipe,
};
use crate::Timeouts;
use crate::node::{Backend, Node};
use crate::ops::{self, Probe, Transport, Verb};
use crate::scripts::{Reply, Script};

/// How many keys a [`SentinelNode`] remembers the connection of their last write for (for `WAIT`).
const WRITES_KEPT: usize = 1024;

/// A [`RedisNode`](redlease::RedisNode) for a primary behind Redis Sentinel: it asks the Sentinels for the primary
/// ([`SentinelClient`], which also checks with `ROLE` that the server it names is a primary), keeps one
/// multiplexed connection to it, and asks again after that connection dropped, the server answered
/// `READONLY` (it was demoted to a replica), or a call on it timed out. So after a failover its calls fail (definitely, nothing sent,
/// while the Sentinels still name the dead primary; ambiguous for the requests in flight when it died)
/// until the Sentinels name the new primary, and then go there. Building one sends nothing.
///
/// - **A hung primary** (stopped, or unreachable with its connection still open) is left at the first call
///   that times out or is cut by the operation timeout: the node forgets that connection and asks the
///   Sentinels again, so it follows a failover the Sentinels make meanwhile (the old primary, back and
///   demoted, answers `READONLY` if it is named again, and is left the same way).
/// - **Capability check and `run_id`** are per connection, as for the other nodes: a new primary is
///   checked again before the next acquisition, and reports its own [`RunId`](redlease::RunId) (a failover is a changed run
///   id: with the restart quarantine on, the core emits a
///   [`NodeRestarted`](redlease::EventKind::NodeRestarted) event).
/// - **Durability.** `WAIT` counts the writes of its own connection. The node remembers which connection
///   carried the last write of each key; if the node has moved to another primary since, it answers a
///   definite [`NodeErrorKind::Connection`] error instead of a count of another server's replicas.
///   Otherwise the `WAIT` goes on a connection of its own to that same server, behind a `PUBLISH` that
///   brings its replication offset up to the server's (as the other redis-rs nodes do: a `WAIT` blocks its
///   connection, and must not hold up other leases), followed by a `PING` on the write's connection that
///   proves it still reaches the server that took the write (else the same error). Under
///   [`Durability::Required`](redlease::Durability::Required) the lease is then not handed out or not
///   extended.
/// - **What a failover can lose.** The Sentinels promote a replica, which has only what was replicated to
///   it: a lock or fence increment acknowledged by the old primary but not replicated is gone. See the
///   README's "Deployment safety" section for what the durability policy and the fence regression check
///   make of that, and the live tests that show it.
/// - **Endpoint**: `redis-sentinel://host:port,…/<master name>/<db>` (the Sentinels, sorted; the same form
///   as a fred Sentinel node's), never credentials.
///
/// The methods every node has ([`with_endpoint`](Node::with_endpoint), [`with_commands`](Node::with_commands),
/// [`probe`](Node::probe), which asks the Sentinels and connects first if needed, …) are [`Node`]'s.
///
/// ```no_run
/// use redlease::{Config, LockManager};
/// use redlease_adapters::redis::SentinelNode;
///
/// # fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let node = SentinelNode::new(
///     vec!["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
///     "mymaster",
/// )?;
/// let manager = LockManager::single(node, Config::default())?;
/// # Ok(())
/// # }
/// ```
pub type SentinelNode = Node<SentinelTransport>;

/// The transport of a [`SentinelNode`]: the Sentinels, the settings of the connections to the primary, and
/// the current one. Built by [`SentinelNode::new`].
#[derive(Clone)]
pub struct SentinelTransport {
    sentinels: Vec<ConnectionInfo>,
    master_name: String,
    node_info: SentinelNodeConnectionInfo,
    db: i64,
    /// The Sentinel client, taken out while one call asks it for the primary.
    lookup: Arc<Mutex<Option<SentinelClient>>>,
    config: AsyncConnectionConfig,
    current: Arc<Mutex<Current>>,
    probe: Probe,
}

/// The connection to the current primary, the count of connections opened, and which connection (by that
/// count) carried the last write of each recent key.
#[derive(Default)]
struct Current {
    conn: Option<MultiplexedConnection>,
    /// Connections of their own for `WAIT`, to the server `conn` reaches (see [`Waiter`]).
    waiter: Option<Waiter>,
    generation: u64,
    writes: VecDeque<(String, u64)>,
}

impl Current {
    fn wrote(&mut self, key: &str, generation: u64) {
        self.writes.retain(|(k, _)| k != key);
        if self.writes.len() >= WRITES_KEPT {
            self.writes.pop_front();
        }
        self.writes.push_back((key.to_owned(), generation));
    }

    fn last_write(&self, key: &str) -> Option<u64> {
        self.writes
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, g)| *g)
    }
}

/// Puts the Sentinel client back when a lookup ends, also when its future is dropped.
struct Lookup<'a> {
    slot: &'a Mutex<Option<SentinelClient>>,
    client: Option<SentinelClient>,
}

impl Drop for Lookup<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(client);
        }
    }
}

fn sentinel_endpoint(sentinels: &[ConnectionInfo], master_name: &str, db: i64) -> String {
    let mut hosts: Vec<String> = sentinels.iter().map(|s| s.addr().to_string()).collect();
    hosts.sort();
    format!("redis-sentinel://{}/{master_name}/{db}", hosts.join(","))
}

impl SentinelNode {
    /// A node for the primary the Sentinels at `sentinels` (their URLs or addresses) monitor as
    /// `master_name`, connecting to it without credentials, database 0 (see
    /// [`with_redis_settings`](Self::with_redis_settings)). Sends nothing.
    ///
    /// # Errors
    /// An address that does not parse, or no address at all.
    pub fn new<T: IntoConnectionInfo>(
        sentinels: Vec<T>,
        master_name: &str,
    ) -> Result<Self, RedisError> {
        let sentinels = sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<Result<Vec<_>, _>>()?;
        let node_info = SentinelNodeConnectionInfo::default();
        let client = SentinelTransport::client(&sentinels, master_name, &node_info)?;
        Ok(Node {
            endpoint: Some(sentinel_endpoint(&sentinels, master_name, 0)),
            notifier: None,
            transport: SentinelTransport {
                sentinels,
                master_name: master_name.to_owned(),
                node_info,
                db: 0,
                lookup: Arc::new(Mutex::new(Some(client))),
                config: AsyncConnectionConfig::new(),
                current: Arc::default(),
                probe: Probe::default(),
            },
        })
    }

    /// The settings for the connections to the primary: credentials, database, protocol. (Credentials of
    /// the Sentinels themselves go in their URLs.)
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_redis_settings(
        mut self,
        settings: RedisConnectionInfo,
    ) -> Result<Self, RedisError> {
        let t = &mut self.transport;
        t.db = settings.db();
        t.node_info = SentinelNodeConnectionInfo::default().set_redis_connection_info(settings);
        let client = SentinelTransport::client(&t.sentinels, &t.master_name, &t.node_info)?;
        t.lookup = Arc::new(Mutex::new(Some(client)));
        self.endpoint = Some(sentinel_endpoint(&t.sentinels, &t.master_name, t.db));
        Ok(self)
    }

    /// The settings of each connection to the primary (set its connection timeout to at most the operation
    /// timeout, and the response timeout to about it).
    pub fn with_config(mut self, config: AsyncConnectionConfig) -> Self {
        self.transport.config = config;
        self
    }

    /// The connection and response timeouts of each connection to the primary (see [`Timeouts`]).
    pub fn with_timeouts(self, timeouts: Timeouts) -> Self {
        self.with_config(super::async_config(timeouts))
    }

    /// Whether a connection to a primary is open (it may still turn out to have dropped on its next use).
    pub fn is_connected(&self) -> bool {
        self.transport.lock_current().conn.is_some()
    }
}

impl SentinelTransport {
    fn client(
        sentinels: &[ConnectionInfo],
        master_name: &str,
        node_info: &SentinelNodeConnectionInfo,
    ) -> Result<SentinelClient, RedisError> {
        // `build` takes a `String`, or `impl AsRef<str>` when redis-rs's `tls-rustls` is on: an owned one fits both.
        #[allow(clippy::unnecessary_to_owned)]
        SentinelClient::build(
            sentinels.to_vec(),
            master_name.to_owned(),
            Some(node_info.clone()),
            SentinelServerType::Master,
        )
    }

    fn lock_current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The open connection and its generation, or a new one to the primary the Sentinels name now.
    async fn connection(&self, what: &Script) -> Result<(MultiplexedConnection, u64), NodeError> {
        {
            let current = self.lock_current();
            if let Some(conn) = &current.conn {
                return Ok((conn.clone(), current.generation));
            }
        }
        let taken = self.lookup.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(client) = taken else {
            return Err(NodeError::not_applied(
                NodeErrorKind::Connection,
                format!(
                    "{}: not connected, and another call is asking the Sentinels for the primary (not sent)",
                    what.name
                ),
            ));
        };
        let mut lookup = Lookup {
            slot: &self.lookup,
            client: Some(client),
        };
        let primary = match lookup.client.as_mut() {
            Some(client) => client.async_get_client().await,
            None => unreachable_lookup(),
        };
        drop(lookup);
        let primary = primary.map_err(|e| lookup_error(what, &e))?;
        let conn = primary
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| connect_error(what, &e))?;
        let mut current = self.lock_current();
        let conn = match &current.conn {
            Some(existing) => existing.clone(),
            None => {
                current.conn = Some(conn.clone());
                current.waiter = Some(Waiter::new(&primary, self.config.clone()));
                current.generation += 1;
                self.probe.opened();
                conn
            }
        };
        Ok((conn, current.generation))
    }

    /// After a reply on connection `generation`: remembers a write of `key`, and forgets the connection when
    /// it dropped, its server is no longer a primary, or it did not answer in time (a hung or stopped
    /// primary keeps its connection open: the Sentinels may have promoted another meanwhile). The next call
    /// asks the Sentinels again.
    fn after<T>(&self, result: &Result<T, NodeError>, generation: u64, key: Option<&str>) {
        let mut current = self.lock_current();
        if let Err(e) = result {
            let gone = is_dropped(e)
                || e.kind() == NodeErrorKind::ReadOnly
                || e.kind() == NodeErrorKind::Timeout;
            if gone && current.generation == generation {
                current.conn = None;
                self.probe.forget();
            }
        }
        if let Some(key) = key {
            current.wrote(key, generation);
        }
    }

    /// A request on connection `generation` whose caller gave up before its reply (the operation timeout
    /// cut it): forgotten as after a timeout (see [`after`](Self::after)).
    fn abandoned(&self, generation: u64) {
        let mut current = self.lock_current();
        if current.generation == generation && current.conn.is_some() {
            current.conn = None;
            self.probe.forget();
        }
    }

    async fn run(&self, cmd: Cmd, what: &Script, key: Option<&str>) -> Result<Reply, NodeError> {
        let (mut conn, generation) = self.connection(what).await?;
        let flight = InFlight::new(self, generation);
        let result = send(&mut conn, &cmd, what).await;
        flight.landed();
        self.after(&result, generation, key);
        result
    }
}

/// A request in flight on one of a [`SentinelNode`]'s connections: if its future is dropped before the reply
/// (the caller's operation timeout, typically because the primary stopped answering while its connection
/// stays open: `SIGSTOP`, a hung host), the connection is forgotten, so the next call asks the Sentinels for
/// the primary again instead of waiting on it until it comes back. (Its request may still be applied late,
/// which the core allows for: see the `RedisNode` contract's "Order and late requests".)
struct InFlight<'a> {
    node: &'a SentinelTransport,
    generation: u64,
    pending: bool,
}

impl<'a> InFlight<'a> {
    fn new(node: &'a SentinelTransport, generation: u64) -> Self {
        Self {
            node,
            generation,
            pending: true,
        }
    }

    /// The reply (or an error) came back.
    fn landed(mut self) {
        self.pending = false;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.pending {
            self.node.abandoned(self.generation);
        }
    }
}

/// The lookup slot is filled just before it is read.
fn unreachable_lookup() -> Result<redis::Client, RedisError> {
    Err(RedisError::from((
        redis::ErrorKind::Client,
        "internal: no Sentinel client",
    )))
}

/// A failed lookup: nothing of the operation was sent.
fn lookup_error(what: &Script, err: &RedisError) -> NodeError {
    let classified = connect_error(what, err);
    if classified.kind() == NodeErrorKind::Auth {
        return classified;
    }
    NodeError::not_applied(
        NodeErrorKind::Connection,
        format!(
            "{}: the Sentinels named no reachable primary (not sent): {err}",
            what.name
        ),
    )
    .with_source(err.clone())
}

impl Transport for SentinelTransport {
    async fn script_once(
        &self,
        verb: Verb,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Reply, NodeError> {
        self.run(
            script_cmd(verb, script, keys, args),
            script,
            keys.first().copied(),
        )
        .await
    }

    async fn command(&self, what: &Script, key: &str, args: &[&str]) -> Result<Reply, NodeError> {
        // Reads and waits are not writes: the WAIT for a key must follow the connection of its last write.
        let reads = [
            "INFO", "WAIT", "WAITAOF", "GET", "PTTL", "PING", "WATCH", "UNWATCH", "TIME", "ZRANGE",
            "ZSCORE",
        ];
        let write = !args
            .first()
            .is_some_and(|c| reads.iter().any(|r| c.eq_ignore_ascii_case(r)));
        self.run(plain_cmd(args), what, write.then_some(key)).await
    }

    async fn command_and_publish(
        &self,
        what: &Script,
        key: &str,
        args: &[&str],
        publish: &[&str],
    ) -> Result<(Reply, Option<Reply>), NodeError> {
        // A release (its publish rides along): a write on the primary.
        let (mut conn, generation) = self.connection(what).await?;
        let flight = InFlight::new(self, generation);
        let result = send_publishing(&mut conn, plain_cmd(args), plain_cmd(publish), what).await;
        flight.landed();
        self.after(&result, generation, Some(key));
        result
    }

    async fn transaction(
        &self,
        what: &Script,
        key: &str,
        cmds: &[&[&str]],
    ) -> Result<Vec<Reply>, NodeError> {
        let (mut conn, generation) = self.connection(what).await?;
        let flight = InFlight::new(self, generation);
        let result = send_transaction(&mut conn, &transaction_pipe(cmds), what).await;
        flight.landed();
        self.after(&result, generation, Some(key));
        result
    }

    fn clustered(&self) -> bool {
        false
    }

    fn probe(&self) -> &Probe {
        &self.probe
    }

    /// The open connection's number (each connection to a primary the node opens gets the next one).
    fn connection_id(&self, _key: &str) -> Option<u64> {
        let current = self.lock_current();
        current.conn.as_ref().map(|_| current.generation)
    }
}

/// A [`SentinelNode`] pinned to the connection that carried a key's last write, for `WAIT`.
struct Pinned<'a> {
    node: &'a SentinelTransport,
    conn: MultiplexedConnection,
    /// Wait connections to the server `conn` reaches.
    waiter: Option<Waiter>,
    generation: u64,
}

impl Transport for Pinned<'_> {
    async fn script_once(
        &self,
        verb: Verb,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Reply, NodeError> {
        let mut conn = self.conn.clone();
        let result = send(&mut conn, &script_cmd(verb, script, keys, args), script).await;
        self.node.after(&result, self.generation, None);
        result
    }

    async fn command(&self, what: &Script, _key: &str, args: &[&str]) -> Result<Reply, NodeError> {
        let mut conn = self.conn.clone();
        let result = send(&mut conn, &plain_cmd(args), what).await;
        self.node.after(&result, self.generation, None);
        result
    }

    async fn command_and_publish(
        &self,
        what: &Script,
        _key: &str,
        args: &[&str],
        publish: &[&str],
    ) -> Result<(Reply, Option<Reply>), NodeError> {
        let mut conn = self.conn.clone();
        let result = send_publishing(&mut conn, plain_cmd(args), plain_cmd(publish), what).await;
        self.node.after(&result, self.generation, None);
        result
    }

    async fn transaction(
        &self,
        what: &Script,
        _key: &str,
        cmds: &[&[&str]],
    ) -> Result<Vec<Reply>, NodeError> {
        let mut conn = self.conn.clone();
        let result = send_transaction(&mut conn, &transaction_pipe(cmds), what).await;
        self.node.after(&result, self.generation, None);
        result
    }

    fn clustered(&self) -> bool {
        false
    }

    fn probe(&self) -> &Probe {
        &self.node.probe
    }

    /// On a wait connection of its own to the server the pinned connection reaches (the address the
    /// Sentinels named for it), so that the `WAIT` does not hold up other leases' commands on the shared
    /// connection; then a `PING` on the pinned connection proves that it still reaches the server that took
    /// the write (a server restarted at that address would have dropped it, and lost the write). Where no
    /// wait connection can be used, the pinned connection itself.
    async fn wait_command(
        &self,
        what: &Script,
        key: &str,
        args: &[&str],
    ) -> Result<Reply, NodeError> {
        let Some(reply) = (match &self.waiter {
            Some(waiter) => waiter.wait(what, args).await,
            None => None,
        }) else {
            return self.command(what, key, args).await;
        };
        match self.command(what, key, &["PING"]).await {
            Ok(_) => reply,
            Err(e) => Err(NodeError::not_applied(
                NodeErrorKind::Connection,
                "WAIT: the connection that carried the write failed while the wait ran (the primary \
                 failed or restarted), so its replication cannot be confirmed",
            )
            .with_source(e)),
        }
    }
}

impl Backend for SentinelTransport {
    /// Never had the waiting acquisition's one-step TTL (nor release notifications): a waiter polls, as
    /// with the trait's default.
    const CLAIMS_TTL: bool = false;

    /// `WAIT`/`WAITAOF` on the connection that carried `key`'s last write; a definite
    /// [`NodeErrorKind::Connection`] error when the node has moved to another connection (another primary)
    /// since.
    async fn wait_replicas(&self, key: &str, wait: ReplicaWait) -> Result<u32, NodeError> {
        let pinned = {
            let current = self.lock_current();
            match (current.last_write(key), &current.conn) {
                (Some(g), Some(conn)) if g == current.generation => Some(Pinned {
                    node: self,
                    conn: conn.clone(),
                    waiter: current.waiter.clone(),
                    generation: g,
                }),
                (None, _) => None,
                _ => {
                    return Err(NodeError::not_applied(
                        NodeErrorKind::Connection,
                        "WAIT: the connection that carried the write is gone (the primary failed or changed), \
                         so its replication cannot be confirmed (not sent)",
                    ));
                }
            }
        };
        match pinned {
            Some(pinned) => ops::wait_replicas(&pinned, key, wait).await,
            // Nothing written for the key through this node (or forgotten): the current connection.
            None => ops::wait_replicas(self, key, wait).await,
        }
    }

    fn fmt_node(&self, endpoint: &Option<String>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelNode")
            .field("endpoint", endpoint)
            .field("connected", &self.lock_current().conn.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redlease::RedisNode;

    #[test]
    fn the_endpoint_names_the_sentinels_and_the_master_without_credentials() {
        let node = SentinelNode::new(
            vec!["redis://:secret@127.0.0.1:26380", "redis://127.0.0.1:26379"],
            "mymaster",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let endpoint = node.profile().endpoint.unwrap_or_default();
        assert_eq!(
            endpoint,
            "redis-sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/0"
        );
        assert!(!node.is_connected());
    }
}
