//! [`FredWaiter`]: a node's clients of its own for `WAIT` / `WAITAOF`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Value};
use redlease::{NodeError, NodeErrorKind};

use crate::ops;
use crate::scripts::{Reply, Script};

use super::error::{classify, to_reply};
use super::transport::{arg, command_named};

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
pub(super) struct FredWaiter {
    pub(super) template: Client,
    pub(super) idle: Arc<Mutex<Vec<Client>>>,
    /// The node's config is a Sentinel one: each wait checks the server (see above).
    pub(super) sentinel: bool,
}

/// A wait client taken from a [`FredWaiter`]: ended in the background unless given back.
struct WaitClient {
    pub(super) client: Option<Client>,
    pub(super) handle: tokio::runtime::Handle,
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
    pub(super) fn new(client: &Client, sentinel: bool) -> Self {
        Self {
            template: client.clone_new(),
            idle: Arc::default(),
            sentinel,
        }
    }

    pub(super) fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Client>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `args` (a `WAIT` or `WAITAOF`, its timeout in milliseconds last) behind the `PUBLISH` on a wait
    /// client: its reply, or `None` where the shared connection must be used. With `expected` (a run id),
    /// only if `INFO server` in the same pipeline names that server.
    pub(super) async fn wait(
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
            if ops::info_field(&text, "run_id") != Some(expected) {
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
