//! Wait connections of a fred node (see [`crate::waits`]): clients built from a member's config without a
//! reconnection policy (a wait connection never outlives its server process unnoticed) and without a
//! command timeout (the caller bounds each wait), ended with `QUIT` when they are not kept.

use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, EventInterface};
use fred::types::config::Options;
use fred::types::{ClientState, CustomCommand, Value};
use redlease::{NodeError, NodeErrorKind};
use tokio::sync::broadcast;

use super::{arg, classify, to_reply};
use crate::scripts::{Reply, Script};
use crate::waits::{Apart, CHANNEL, Idle, Line};

/// Names the wait connection's commands in messages.
const WAIT_APART: Script = Script {
    name: "WAIT for replicas (on a connection of its own)",
    source: "",
    sha1: "",
};

/// A wait client, ended (`QUIT`, as a task on the current tokio runtime) when dropped: a wait whose caller
/// gave up drops it with its future.
pub(crate) struct WaitClient {
    client: Option<Client>,
    /// fred's error channel: it announces a dropped connection at once, while the client's state may still
    /// say "connected" (and a command sent then, with no reconnection policy, would never be answered).
    errors: broadcast::Receiver<(fred::error::Error, Option<fred::types::config::Server>)>,
}

impl WaitClient {
    fn client(&self) -> Result<&Client, NodeError> {
        self.client.as_ref().ok_or_else(|| {
            NodeError::not_applied(
                NodeErrorKind::Connection,
                "the wait client is gone (not sent)",
            )
        })
    }

    /// Whether the client is connected and fred announced no error since it connected.
    fn healthy(&mut self) -> bool {
        let connected = self
            .client
            .as_ref()
            .is_some_and(|c| c.state() == ClientState::Connected);
        connected
            && matches!(
                self.errors.try_recv(),
                Err(broadcast::error::TryRecvError::Empty)
            )
    }
}

impl Drop for WaitClient {
    fn drop(&mut self) {
        if let Some(client) = self.client.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let _ = client.quit().await;
            });
        }
    }
}

/// The client the wait clients copy their settings from, and the idle ones.
pub(crate) struct FredLine {
    template: Client,
    idle: Idle<WaitClient>,
}

impl std::fmt::Debug for FredLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FredLine")
            .field("idle", &self.idle)
            .finish()
    }
}

impl FredLine {
    /// Wait clients with `template`'s server, connection and performance settings.
    pub(crate) fn new(template: &Client) -> Self {
        Self {
            template: template.clone(),
            idle: Idle::default(),
        }
    }

    fn options() -> Options {
        Options {
            max_attempts: Some(1),
            // No command timeout (zero: none, whatever the client's default): a WAIT lasts its own timeout.
            timeout: Some(Duration::ZERO),
            fail_fast: true,
            ..Options::default()
        }
    }
}

impl Line for FredLine {
    type Conn = WaitClient;

    async fn open(&self, _key: &str) -> Result<WaitClient, NodeError> {
        let connection = self.template.connection_config().clone();
        let wait = connection.connection_timeout;
        let client = Client::new(
            self.template.client_config(),
            Some(self.template.perf_config()),
            Some(connection),
            None,
        );
        let client = WaitClient {
            errors: client.error_rx(),
            client: Some(client),
        };
        let c = client.client()?;
        drop(c.connect());
        match tokio::time::timeout(wait, c.wait_for_connect()).await {
            Ok(Ok(())) => Ok(client),
            Ok(Err(e)) => Err(NodeError::not_applied(
                NodeErrorKind::Connection,
                format!("{}: could not connect (not sent)", WAIT_APART.name),
            )
            .with_source(e)),
            Err(_) => Err(NodeError::not_applied(
                NodeErrorKind::Connection,
                format!(
                    "{}: could not connect within the connection timeout (not sent)",
                    WAIT_APART.name
                ),
            )),
        }
    }

    async fn info(&self, conn: &mut WaitClient) -> Result<Reply, NodeError> {
        conn.client()?
            .with_options(&Self::options())
            .custom::<Value, Value>(
                CustomCommand::new_static("INFO", fred::types::ClusterHash::FirstKey, false),
                vec![arg("server")],
            )
            .await
            .map(to_reply)
            .map_err(|e| classify(Some(&WAIT_APART), &e))
    }

    async fn publish_and_wait(
        &self,
        conn: &mut WaitClient,
        wait: &[&str],
    ) -> Result<Apart, NodeError> {
        let healthy = conn.healthy();
        let client = conn.client()?;
        if !healthy {
            return Err(NodeError::not_applied(
                NodeErrorKind::Connection,
                format!(
                    "{}: the wait client's connection closed (not sent)",
                    WAIT_APART.name
                ),
            ));
        }
        let Some((name, rest)) = wait.split_first() else {
            return Err(NodeError::not_applied(
                NodeErrorKind::Other,
                "an empty command (not sent)",
            ));
        };
        let hash = fred::types::ClusterHash::FirstKey;
        let commands = [
            (
                CustomCommand::new_static("PUBLISH", hash.clone(), false),
                vec![arg(CHANNEL), arg("")],
            ),
            (
                super::command_named(name, hash),
                rest.iter().map(|a| arg(a)).collect(),
            ),
        ];
        let options = Self::options();
        let pipeline = client.pipeline();
        for (cmd, values) in commands {
            pipeline
                .with_options(&options)
                .custom::<(), Value>(cmd, values)
                .await
                .map_err(|e| classify(Some(&WAIT_APART), &e))?;
        }
        let mut results = pipeline.try_all::<Value>().await;
        let (Some(reply), Some(published), None) = (results.pop(), results.pop(), results.pop())
        else {
            return Err(crate::scripts::unexpected_reply(
                &WAIT_APART,
                &Reply::Other("not two replies"),
            ));
        };
        let reply = reply
            .map(to_reply)
            .map_err(|e| classify(Some(&WAIT_APART), &e));
        // A failure of the connection (not a server's refusal) fails the pair: the client is not kept.
        if let Err(e) = &reply
            && e.is_ambiguous()
        {
            return Err(e.clone());
        }
        Ok(Apart {
            published: published.is_ok(),
            reply,
        })
    }

    fn idle(&self) -> &Idle<WaitClient> {
        &self.idle
    }

    fn close(&self, conn: WaitClient) {
        drop(conn);
    }
}
