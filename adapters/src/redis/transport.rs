//! How a [`RedisRsNode`](super::RedisRsNode) sends: its [`Transport`] and [`Backend`] over one redis-rs connection.

use std::fmt;
use std::sync::atomic::Ordering;

use redis::Cmd;
use redis::aio::ConnectionLike;
use redlease::{NodeError, NodeErrorKind};

use crate::node::Backend;
use crate::ops::{Probe, Transport, Verb};
use crate::scripts::{Reply, Script};

use super::RedisRsTransport;
use super::error::is_dropped;
use super::wire::{
    plain_cmd, probe_pipe, script_cmd, send, send_publishing, send_transaction, transaction_pipe,
};

impl<C> RedisRsTransport<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn run(&self, cmd: Cmd, what: &Script) -> Result<Reply, NodeError> {
        if self.dead.load(Ordering::Acquire) {
            return Err(NodeError::not_applied(
                NodeErrorKind::Connection,
                format!(
                    "{}: the multiplexed connection dropped earlier and never reconnects (not sent); build a new \
                     node, or use MultiplexedNode::lazy or ManagedNode",
                    what.name
                ),
            ));
        }
        let mut conn = self.conn.clone();
        let result = send(&mut conn, &cmd, what).await;
        self.after(&result);
        result
    }

    async fn run_publishing(
        &self,
        cmd: Cmd,
        publish: Cmd,
        what: &Script,
    ) -> Result<(Reply, Option<Reply>), NodeError> {
        if self.dead.load(Ordering::Acquire) {
            return Err(NodeError::not_applied(
                NodeErrorKind::Connection,
                format!(
                    "{}: the multiplexed connection dropped earlier and never reconnects (not sent)",
                    what.name
                ),
            ));
        }
        let mut conn = self.conn.clone();
        let result = send_publishing(&mut conn, cmd, publish, what).await;
        self.after(&result);
        result
    }

    async fn run_transaction(
        &self,
        pipe: redis::Pipeline,
        what: &Script,
    ) -> Result<Vec<Reply>, NodeError> {
        if self.dead.load(Ordering::Acquire) {
            return Err(NodeError::not_applied(
                NodeErrorKind::Connection,
                format!(
                    "{}: the multiplexed connection dropped earlier and never reconnects (not sent)",
                    what.name
                ),
            ));
        }
        let mut conn = self.conn.clone();
        let result = send_transaction(&mut conn, &pipe, what).await;
        self.after(&result);
        result
    }

    fn after<T>(&self, result: &Result<T, NodeError>) {
        if let Err(e) = result
            && !self.reconnects
            && is_dropped(e)
        {
            self.dead.store(true, Ordering::Release);
        }
    }
}

impl<C> Transport for RedisRsTransport<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
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
        self.run_publishing(plain_cmd(args), plain_cmd(publish), what)
            .await
    }

    async fn transaction(
        &self,
        what: &Script,
        _key: &str,
        cmds: &[&[&str]],
    ) -> Result<Vec<Reply>, NodeError> {
        self.run_transaction(transaction_pipe(cmds), what).await
    }

    async fn probe_transaction(&self, what: &Script, key: &str) -> Result<(), NodeError> {
        self.run_transaction(probe_pipe(key), what)
            .await
            .map(|_| ())
    }

    fn clustered(&self) -> bool {
        self.cluster
    }

    fn probe(&self) -> &Probe {
        &self.probe
    }

    /// A connection that never reconnects is one connection for the node's life (until it dropped); a
    /// reconnecting one may be replaced in the background, unnoticed.
    fn connection_id(&self, _key: &str) -> Option<u64> {
        (!self.reconnects && !self.dead.load(Ordering::Acquire)).then_some(0)
    }

    async fn wait_command(
        &self,
        what: &Script,
        key: &str,
        args: &[&str],
    ) -> Result<Reply, NodeError> {
        if let Some(waiter) = &self.waiter
            && let Some(reply) = waiter.wait(what, args).await
        {
            return reply;
        }
        self.command(what, key, args).await
    }
}

impl<C> Backend for RedisRsTransport<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn fmt_node(&self, endpoint: &Option<String>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRsNode")
            .field("connection", &std::any::type_name::<C>())
            .field("endpoint", endpoint)
            .field("cluster", &self.cluster)
            .field("dead", &self.dead.load(Ordering::Relaxed))
            .finish()
    }
}
