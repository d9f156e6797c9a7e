//! Wait connections of a redis-rs node (see [`crate::waits`]): multiplexed connections opened from the
//! node's client, without a response timeout (the caller bounds each wait).

use std::time::Duration;

use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use redlease::NodeError;

use super::{classify, connect_error, plain_cmd, send, to_reply};
use crate::scripts::{Reply, Script};
use crate::waits::{Apart, CHANNEL, Idle, Line};

/// redis-rs's default response timeout, for a node whose own is not known.
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

/// Names the wait connection's commands in messages.
const WAIT_APART: Script = Script {
    name: "WAIT for replicas (on a connection of its own)",
    source: "",
    sha1: "",
};

/// The client the wait connections are opened from, and the idle ones.
pub(crate) struct RedisLine {
    client: redis::Client,
    config: AsyncConnectionConfig,
    /// The response timeout each of a wait's round trips is allowed (see [`crate::waits::wait`]).
    allowance: Duration,
    idle: Idle<MultiplexedConnection>,
}

impl std::fmt::Debug for RedisLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLine")
            .field("idle", &self.idle)
            .finish()
    }
}

impl RedisLine {
    /// Wait connections opened from `client` with `config`'s settings but no response timeout (each wait is
    /// bounded by its own timeout plus `response`, the node's response timeout where known).
    pub(crate) fn new(
        client: &redis::Client,
        config: &AsyncConnectionConfig,
        response: Option<Duration>,
    ) -> Self {
        Self {
            client: client.clone(),
            config: config.clone().set_response_timeout(None),
            allowance: response.unwrap_or(DEFAULT_RESPONSE_TIMEOUT),
            idle: Idle::default(),
        }
    }

    pub(crate) fn allowance(&self) -> Duration {
        self.allowance
    }
}

impl Line for RedisLine {
    type Conn = MultiplexedConnection;

    async fn open(&self, _key: &str) -> Result<MultiplexedConnection, NodeError> {
        self.client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| connect_error(&WAIT_APART, &e))
    }

    async fn info(&self, conn: &mut MultiplexedConnection) -> Result<Reply, NodeError> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("server");
        send(conn, &cmd, &WAIT_APART).await
    }

    async fn publish_and_wait(
        &self,
        conn: &mut MultiplexedConnection,
        wait: &[&str],
    ) -> Result<Apart, NodeError> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("PUBLISH").arg(CHANNEL).arg("");
        pipe.add_command(plain_cmd(wait));
        let mut results = pipe
            .query_async::<Vec<redis::RedisResult<redis::Value>>>(conn)
            .await
            .map_err(|e| classify(Some(&WAIT_APART), &e))?;
        let (Some(reply), Some(published), None) = (results.pop(), results.pop(), results.pop())
        else {
            return Err(crate::scripts::unexpected_reply(
                &WAIT_APART,
                &Reply::Other("not two replies"),
            ));
        };
        Ok(Apart {
            published: published.is_ok(),
            reply: reply
                .map(to_reply)
                .map_err(|e| classify(Some(&WAIT_APART), &e)),
        })
    }

    fn idle(&self) -> &Idle<MultiplexedConnection> {
        &self.idle
    }

    /// Dropping the last handle of a multiplexed connection closes it.
    fn close(&self, conn: MultiplexedConnection) {
        drop(conn);
    }
}
