//! [`Waiter`]: a node's connections of its own for `WAIT` / `WAITAOF`.

use std::sync::{Arc, Mutex};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use redlease::NodeError;

use crate::scripts::{Reply, Script};

use super::error::{classify, is_dropped, to_reply};
use super::wire::plain_cmd;

/// The channel a [`Waiter`] publishes on (nobody listens: the publish is for its replication offset).
const WAIT_CHANNEL: &str = "redlease:wait";

/// How many idle wait connections a [`Waiter`] keeps for the next waits.
const WAITERS_KEPT: usize = 8;

/// A node's connections of its own for `WAIT` / `WAITAOF`, so that a durability wait never holds up the
/// commands of other leases: the server answers nothing else on a connection while a `WAIT` on it blocks
/// (with a replica down, every lease sharing the connection would time out for as long as the wait lasts),
/// and so that the waits do not hold up each other either: each wait takes an idle wait connection, or
/// opens one, and gives it back when answered (at most [`WAITERS_KEPT`] are kept idle; one whose wait was
/// cut is closed).
///
/// `WAIT` waits for the replication offset of its own connection's last write, so the `WAIT` goes right
/// behind a `PUBLISH` on [`WAIT_CHANNEL`] (pipelined, one round trip): a publish is replicated, so the
/// connection's offset becomes the server's current one, which covers every write the server applied
/// before — the lease's write among them, since its reply came first. Where the `PUBLISH` is refused (a
/// user without that channel), the connection cannot be opened or it dropped, `None`: the node waits on
/// its shared connection as before.
#[derive(Clone)]
pub(super) struct Waiter {
    client: redis::Client,
    config: AsyncConnectionConfig,
    idle: Arc<Mutex<Vec<MultiplexedConnection>>>,
}

impl Waiter {
    /// Wait connections opened with `config`, without its response timeout: a `WAIT` answers by its own
    /// timeout, and the core bounds the call (a response timeout shorter than the wait would cut it).
    pub(super) fn new(client: &redis::Client, config: AsyncConnectionConfig) -> Self {
        Self {
            client: client.clone(),
            config: config.set_response_timeout(None),
            idle: Arc::default(),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<MultiplexedConnection>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `args` (a `WAIT` or `WAITAOF`) behind the `PUBLISH` on a wait connection: its reply, or `None` where
    /// the shared connection must be used.
    pub(super) async fn wait(
        &self,
        what: &Script,
        args: &[&str],
    ) -> Option<Result<Reply, NodeError>> {
        let taken = self.idle().pop();
        let mut conn = match taken {
            Some(conn) => conn,
            None => self
                .client
                .get_multiplexed_async_connection_with_config(&self.config)
                .await
                .ok()?,
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("PUBLISH").arg(WAIT_CHANNEL).arg("");
        pipe.add_command(plain_cmd(args));
        let results = match pipe
            .query_async::<Vec<redis::RedisResult<Value>>>(&mut conn)
            .await
        {
            Ok(results) => results,
            Err(e) => {
                let classified = classify(Some(what), &e);
                // A dropped connection is not kept; the shared one is asked instead (a `WAIT` changes
                // nothing, whether or not it ran).
                return (!is_dropped(&classified)).then_some(Err(classified));
            }
        };
        {
            let mut idle = self.idle();
            if idle.len() < WAITERS_KEPT {
                idle.push(conn);
            }
        }
        let [publish, wait]: [redis::RedisResult<Value>; 2] = results.try_into().ok()?;
        // Without the publish the connection's offset covers nothing: its `WAIT` would count every replica.
        publish.ok()?;
        Some(wait.map(to_reply).map_err(|e| classify(Some(what), &e)))
    }
}
