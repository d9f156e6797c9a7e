//! [`LazyNode`]: a multiplexed connection opened on first use and again after it dropped.

use std::fmt;
use std::sync::{Arc, Mutex};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd};
use redlease::NodeError;
use redlease::notify::{self, Notifier};

use crate::ops::{self, Probe, Transport, Verb};
use crate::scripts::{Reply, Script};
use crate::{Capabilities, Commands, Timeouts};

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
/// connection drops is reported as ambiguous and never re-sent. Clones share the connection.
#[derive(Clone)]
pub struct LazyNode {
    client: redis::Client,
    config: AsyncConnectionConfig,
    current: Arc<Mutex<Slot>>,
    pub(super) endpoint: Option<String>,
    /// The capability state of the current connection (forgotten with each new connection).
    probe: Probe,
    pub(super) notifier: Option<Notifier>,
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

    /// Sets the channel budget of the node's release notifications; see [`RedisRsNode::with_channel_budget`](super::RedisRsNode::with_channel_budget).
    pub fn with_channel_budget(self, max_channels: usize) -> Self {
        if let Some(n) = &self.notifier {
            n.set_max_channels(max_channels);
        }
        self
    }

    /// Turns release notifications off; see [`RedisRsNode::without_notifications`](super::RedisRsNode::without_notifications).
    pub fn without_notifications(mut self) -> Self {
        self.notifier = None;
        self
    }

    /// Replaces the identity reported by [`RedisNode::endpoint`](redlease::RedisNode::endpoint). Do not put credentials in it.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Chooses which commands the node sends; see [`RedisRsNode::with_commands`](super::RedisRsNode::with_commands).
    pub fn with_commands(self, commands: Commands) -> Self {
        self.probe.set_mode(commands);
        self
    }

    /// What the capability check learned about the current connection; see [`RedisRsNode::capabilities`](super::RedisRsNode::capabilities).
    pub fn capabilities(&self) -> Option<Capabilities> {
        self.probe.get()
    }

    /// Whether a connection is open (it may still turn out to have dropped on its next use).
    pub fn is_connected(&self) -> bool {
        self.slot().conn.is_some()
    }

    /// Connects now if needed and runs the capability check (see [`RedisRsNode::probe`](super::RedisRsNode::probe)).
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
