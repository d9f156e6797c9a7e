//! How a [`FredNode`](super::FredNode) sends: starting a lazy client, routing by key, sending each command once (one
//! command, a transaction, or a command with its publish) and acting on what fred reports; its [`Transport`].

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::config::Options;
use fred::types::{ClientState, ClusterHash, CustomCommand, Value};
use redlease::{NodeError, NodeErrorKind};

use crate::ops::{self, Probe, Transport, Verb};
use crate::scripts::{self, Reply, Script};
use crate::slot;

use super::error::{PROBATION, classify, is_second_write, node_error, to_reply};
use super::health::{Attempt, Health, HealthState};
use super::{FredTransport, KeyRouted};

impl<C: KeyRouted> FredTransport<C> {
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
    pub(super) async fn connect_for_check(&self) -> Option<NodeError> {
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
    pub(super) fn must_start(&self) -> bool {
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

/// A command in flight through member `index` of a [`FredNode`](super::FredNode): if its future is dropped before the reply
/// (the caller's operation timeout), the node treats it as a timeout ([`FredTransport::primary_unresponsive`](super::FredTransport::primary_unresponsive)).
struct InFlight<'a, C: KeyRouted> {
    node: &'a FredTransport<C>,
    index: usize,
    pending: bool,
}

impl<'a, C: KeyRouted> InFlight<'a, C> {
    fn new(node: &'a FredTransport<C>, index: usize) -> Self {
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
pub(super) fn arg(s: &str) -> Value {
    match static_word(s) {
        Some(word) => Value::String(fred::bytes_utils::Str::from_static(word)),
        None => Value::from(s),
    }
}

/// The command named `name` (a static name where it is one of the [`static_word`]s), routed by `hash`.
pub(super) fn command_named(name: &str, hash: ClusterHash) -> CustomCommand {
    match static_word(name) {
        Some(word) => CustomCommand::new_static(word, hash, false),
        None => CustomCommand::new(name.to_owned(), hash, false),
    }
}

impl<C: KeyRouted> FredTransport<C> {
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

impl<C: KeyRouted> Transport for FredTransport<C> {
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
                expected = ops::info_field(&text, "run_id").map(str::to_owned);
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
