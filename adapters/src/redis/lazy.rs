//! [`LazyNode`]: a multiplexed connection opened on first use and again after it dropped.

use std::fmt;
use std::sync::{Arc, Mutex};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd};
use redlease::NodeError;
use redlease::notify;

use crate::Timeouts;
use crate::node::{Backend, Node};
use crate::ops::{Probe, Transport, Verb};
use crate::scripts::{Reply, Script};

use super::error::{connect_error, is_dropped};
use super::subscriber::standalone_notifier;
use super::waiter::Waiter;
use super::wire::{
    plain_cmd, probe_pipe, script_cmd, send, send_publishing, send_transaction, transaction_pipe,
};
use super::{async_config, client_endpoint};

/// A [`RedisNode`](redlease::RedisNode) over a multiplexed connection that is opened on first use and opened again on the first
/// call after it dropped.
///
/// Building one sends nothing, so every node of a Redlock service can be built while some servers are down;
/// a call to a down server fails definitely (connection refused, or the connection timeout of the config,
/// nothing sent) and the first call after the server is back connects. A request in flight when the
/// connection drops is reported as ambiguous and never re-sent. Clones share the connection. The builder
/// methods every node shares ([`with_endpoint`](Node::with_endpoint), [`probe`](Node::probe), which
/// connects first if needed, …) are [`Node`]'s.
pub type LazyNode = Node<LazyTransport>;

/// The transport of a [`LazyNode`]: its client, connection settings and current connection. Built by the
/// [`LazyNode`] constructors.
#[derive(Clone)]
pub struct LazyTransport {
    client: redis::Client,
    config: AsyncConnectionConfig,
    current: Arc<Mutex<Slot>>,
    /// The capability state of the current connection (forgotten with each new connection).
    probe: Probe,
    /// The connection `WAIT` goes on (see [`Waiter`]).
    waiter: Waiter,
}

/// The current connection of a [`LazyNode`] and a count of the connections opened so far.
#[derive(Default)]
struct Slot {
    conn: Option<MultiplexedConnection>,
    generation: u64,
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
        Node {
            endpoint: Some(client_endpoint(&client)),
            notifier: Some(standalone_notifier(&client, notify::DEFAULT_MAX_CHANNELS)),
            transport: LazyTransport {
                waiter: Waiter::new(&client, config.clone()),
                client,
                config,
                current: Arc::new(Mutex::new(Slot::default())),
                probe: Probe::default(),
            },
        }
    }

    /// Whether a connection is open (it may still turn out to have dropped on its next use).
    pub fn is_connected(&self) -> bool {
        self.transport.is_connected()
    }
}

impl LazyTransport {
    fn is_connected(&self) -> bool {
        self.slot().conn.is_some()
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

impl Transport for LazyTransport {
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

impl Backend for LazyTransport {
    fn fmt_node(&self, endpoint: &Option<String>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyNode")
            .field("endpoint", endpoint)
            .field("connected", &self.is_connected())
            .finish()
    }
}
