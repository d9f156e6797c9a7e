//! [`RedisNode`] for the redis-rs nodes, written once over [`Transport`] (`impl_node!`), and the
//! [`Transport`] of a [`RedisRsNode`].

use std::sync::atomic::Ordering;

use redis::Cmd;
use redis::aio::ConnectionLike;
use redlease::notify::Notifier;
use redlease::{
    Claim, KeyState, NodeError, NodeErrorKind, Readiness, RedisNode, Token, Ttl, async_trait,
};

use crate::ops::{self, Probe, Transport, Verb};
use crate::scripts::{Reply, Script};

use super::RedisRsNode;
use super::error::is_dropped;
use super::lazy::LazyNode;
use super::wire::{
    plain_cmd, probe_pipe, script_cmd, send, send_publishing, send_transaction, transaction_pipe,
};

impl<C> RedisRsNode<C>
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

impl<C> Transport for RedisRsNode<C>
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

/// Implements [`RedisNode`] for a node type through [`ops`] (the type implements [`Transport`] and has
/// `endpoint` and `notifier` fields).
macro_rules! impl_node {
    ([$($generics:tt)*] $ty:ty $(where $($bounds:tt)*)?) => {
        #[async_trait]
        impl<$($generics)*> RedisNode for $ty $(where $($bounds)*)? {
            /// The capability check, run now (see `probe`): reachability, login, permissions and paths.
            async fn readiness(&self, key: &str) -> Readiness {
                ops::readiness(self, key).await
            }

            async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
                ops::acquire(self, key, token, ttl).await
            }

            async fn acquire_fresh(
                &self,
                key: &str,
                token: &Token,
                ttl: Ttl,
            ) -> Result<bool, NodeError> {
                ops::acquire_fresh(self, key, token, ttl).await
            }

            /// `SET … NX GET` or the fresh-acquire script: neither touches an existing key.
            fn acquire_fresh_is_nx(&self) -> bool {
                true
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

            async fn acquire_or_ttl(
                &self,
                key: &str,
                token: &Token,
                ttl: Ttl,
                fresh: bool,
            ) -> Result<Claim, NodeError> {
                ops::acquire_or_ttl(self, key, token, ttl, fresh).await
            }

            fn notifier(&self) -> Option<&Notifier> {
                self.notifier.as_ref()
            }

            fn endpoint(&self) -> Option<String> {
                self.endpoint.clone()
            }

            async fn raise_fence(&self, fence_key: &str, at_least: u64) -> Result<u64, NodeError> {
                ops::raise_fence(self, fence_key, at_least).await
            }

            /// `INFO server`, once per connection where the node knows its connection (multiplexed, lazy),
            /// at every call for a reconnecting `ConnectionManager`; unsupported on a cluster.
            async fn run_id(&self, key: &str) -> Result<redlease::RunId, NodeError> {
                ops::run_id(self, key).await
            }

            /// `WAIT` or `WAITAOF` on the connection that carries `key`; unsupported on a cluster.
            async fn wait_replicas(
                &self,
                key: &str,
                wait: redlease::ReplicaWait,
            ) -> Result<u32, NodeError> {
                ops::wait_replicas(self, key, wait).await
            }

            async fn extend_many(
                &self,
                items: &[redlease::ExtendItem<'_>],
            ) -> Result<Vec<bool>, NodeError> {
                ops::extend_many(self, items).await
            }

            fn extend_many_limit(&self) -> usize {
                ops::EXTEND_MANY_LIMIT
            }

            /// The [`ACQUIRE_MANY`](crate::scripts::ACQUIRE_MANY), `EXTEND_MANY` or `RELEASE_MANY` script; unsupported
            /// across Cluster slots and without Lua (the core then takes the keys one at a time).
            async fn multi_key(
                &self,
                items: &[redlease::MultiKeyItem<'_>],
                op: redlease::MultiKeyOp,
            ) -> Result<redlease::MultiKeyReply, NodeError> {
                ops::multi_key(self, items, op).await
            }

            /// The [`PERMIT`](crate::scripts::PERMIT) or [`RW_PERMIT`](crate::scripts::RW_PERMIT) script; without
            /// Lua, `TIME` and a watched sorted-set transaction (see the crate README's "Leased semaphores").
            async fn permit(
                &self,
                key: &str,
                token: &Token,
                ttl: Ttl,
                op: redlease::PermitOp<'_>,
            ) -> Result<redlease::PermitReply, NodeError> {
                ops::permit(self, key, token, ttl, op).await
            }
        }
    };
}

impl_node!([C] RedisRsNode<C> where C: ConnectionLike + Clone + Send + Sync + 'static);

impl_node!([] LazyNode);
