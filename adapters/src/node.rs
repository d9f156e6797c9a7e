//! [`Node`]: the crate's one [`RedisNode`] implementation, written once over the transport of a client
//! connection (redis-rs's, fred's), and the builder methods every node shares.
//!
//! Each public node type is an alias of `Node` over its transport (`redis::MultiplexedNode`,
//! `redis::LazyNode`, `fred::ClientNode`, …): what differs between them is how they send
//! ([`Transport`]) and the few places a node answers differently ([`Backend`]).

use std::fmt;
use std::future::Future;

use redlease::notify::Notifier;
use redlease::{
    Claim, ClaimRequest, ExtendItem, KeyState, MultiKeyItem, MultiKeyOp, MultiKeyReply, NodeError,
    NodeProfile, PermitOp, PermitReply, Readiness, RedisNode, ReplicaWait, RunId, Token, Ttl,
    async_trait,
};

use crate::ops::{self, Transport};
use crate::{Capabilities, Commands};

/// A [`RedisNode`] over the transport `T` of one client connection: use the aliases of the client modules
/// and their constructors (`redis::MultiplexedNode::connect`, `redis::LazyNode::new`,
/// `fred::ClientNode::from_url`, …), which build the transport.
///
/// Every operation is one of the crate's operations over the transport (the scripts, or the native commands
/// the capability check found; see the crate docs), so every node type behaves alike wherever its client
/// allows; the builder methods below are shared by all of them. Clones share the connection, the capability
/// state and the release notifications.
#[derive(Clone)]
pub struct Node<T> {
    pub(crate) transport: T,
    /// The identity reported by [`NodeProfile::endpoint`](redlease::NodeProfile::endpoint).
    pub(crate) endpoint: Option<String>,
    /// Release notifications for waiting acquisitions, if the node has a subscriber connection.
    pub(crate) notifier: Option<Notifier>,
}

/// What a transport adds to [`Transport`] for its [`Node`]: the few answers that differ between node types.
///
/// Implemented by this crate's transports only (a sealed trait: it is not exported).
pub(crate) trait Backend: Transport + Sized {
    /// Whether a [`RedisNode::claim`] that [wants the holder's TTL](redlease::ClaimRequest::wants_ttl) learns
    /// it in the acquisition's own step (and, on the native path, marks the waiter), through the crate's
    /// waiting acquisition. `false` answers it as a claim without `wants_ttl`: the acquisition alone (fresh
    /// or not), and `Held { remaining: None }` on contention.
    const CLAIMS_TTL: bool = true;

    /// Runs before the capability check of [`RedisNode::readiness`]: an answer here is the readiness (a
    /// transport that must connect first reports its connection error); `None` (the default) goes on with
    /// the check.
    fn before_readiness(&self) -> impl Future<Output = Option<Readiness>> + Send {
        async { None }
    }

    /// [`RedisNode::wait_replicas`]: by default `WAIT` / `WAITAOF` through the transport (see
    /// [`ops::wait_replicas`]); a transport that must pin the wait to the connection of the key's last write
    /// does that here.
    fn wait_replicas(
        &self,
        key: &str,
        wait: ReplicaWait,
    ) -> impl Future<Output = Result<u32, NodeError>> + Send {
        ops::wait_replicas(self, key, wait)
    }

    /// The node's `Debug` output, with its endpoint (each node type names itself and its connection state).
    fn fmt_node(&self, endpoint: &Option<String>, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

impl<T: Backend> fmt::Debug for Node<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.transport.fmt_node(&self.endpoint, f)
    }
}

impl<T> Node<T> {
    /// Sets the identity reported by [`NodeProfile::endpoint`](redlease::NodeProfile::endpoint), used to reject a Redlock topology that names one
    /// server twice. Do not put credentials in it.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Sets the most channels the node (and its clones) subscribes at once for waiting acquisitions (default
    /// [`notify::DEFAULT_MAX_CHANNELS`](redlease::notify::DEFAULT_MAX_CHANNELS)); waiters beyond that poll.
    /// No effect on a node without notifications.
    pub fn with_channel_budget(self, max_channels: usize) -> Self {
        if let Some(n) = &self.notifier {
            n.set_max_channels(max_channels);
        }
        self
    }

    /// Turns release notifications off: waiting acquisitions poll this node. (Its releases still publish.)
    pub fn without_notifications(mut self) -> Self {
        self.notifier = None;
        self
    }
}

#[expect(
    private_bounds,
    reason = "`Backend` is sealed: these methods are for this crate's node types (the public aliases), whose \
              transports implement it"
)]
impl<T: Backend> Node<T> {
    /// Chooses which commands the node sends (scripts, native commands, or each where it works: the
    /// default); see [`Commands`]. Forgets what the capability check learned.
    pub fn with_commands(self, commands: Commands) -> Self {
        self.transport.probe().set_mode(commands);
        self
    }

    /// What the capability check learned about the current connection, if it ran since the connection was
    /// (re)established.
    pub fn capabilities(&self) -> Option<Capabilities> {
        self.transport.probe().get()
    }

    /// Runs the capability check now (it otherwise runs before the first acquisition), connecting first if
    /// needed, with `example_key` standing for the lock keys (choose one your ACL key patterns allow), and
    /// remembers the answer until the connection fails. A definite
    /// [`NodeErrorKind::Auth`](redlease::NodeErrorKind::Auth) error names what the user may not run.
    pub async fn probe(&self, example_key: &str) -> Result<(), NodeError> {
        ops::check(&self.transport, example_key, None)
            .await
            .map(|_| ())
    }
}

// Every operation written out: none falls back to the trait's plain default unnoticed (a provided method
// added to `RedisNode` fails this lint until the node answers it).
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<T: Backend> RedisNode for Node<T> {
    /// The capability check, run now (see `probe`): reachability, login, permissions and paths. A lazy fred
    /// node connects first; a connection error fred reports meanwhile (a refused login, a refused
    /// connection) is the answer, since fred keeps trying to connect by its policy and a command would only
    /// learn "not connected".
    async fn readiness(&self, key: &str) -> Readiness {
        if let Some(answer) = self.transport.before_readiness().await {
            return answer;
        }
        ops::readiness(&self.transport, key).await
    }

    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        ops::acquire(&self.transport, key, token, ttl).await
    }

    /// A fresh claim is `SET … NX GET` (or the fresh-acquire script): it never touches an existing key. With
    /// `wants_ttl`, the holder's TTL in the same step (the `ACQUIRE_TTL` script, or natively with the waiter
    /// marker); a `SentinelNode` answers `wants_ttl` as a claim without it (the acquisition alone).
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, NodeError> {
        ops::claim(&self.transport, req, T::CLAIMS_TTL).await
    }

    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError> {
        ops::acquire_fenced(&self.transport, key, fence_key, token, ttl).await
    }

    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        ops::release(&self.transport, key, token).await
    }

    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        ops::extend(&self.transport, key, token, ttl).await
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        ops::inspect(&self.transport, key).await
    }

    /// A subscriber connection of the node's own (redis-rs: one connection, or on a cluster one per primary,
    /// where channels are subscribed with `SSUBSCRIBE` in their key's slot; fred: `clone_new` of the first
    /// member), if the node has one.
    fn notifier(&self) -> Option<&Notifier> {
        self.notifier.as_ref()
    }

    /// The node's endpoint (credentials left out), a plain `SET NX` first attempt, and batches of up to
    /// 100 leases (a script call per slot).
    fn profile(&self) -> NodeProfile {
        let profile = NodeProfile::new()
            .with_fresh_is_nx(true)
            .with_batch_limit(ops::EXTEND_MANY_LIMIT);
        match &self.endpoint {
            Some(endpoint) => profile.with_endpoint(endpoint.clone()),
            None => profile,
        }
    }

    async fn raise_fence(&self, fence_key: &str, at_least: u64) -> Result<u64, NodeError> {
        ops::raise_fence(&self.transport, fence_key, at_least).await
    }

    /// `INFO server`, once per connection where the node knows its connection (multiplexed, lazy, the
    /// current primary of a `SentinelNode`), at every call where the client may replace its connection
    /// unnoticed (a reconnecting `ConnectionManager`, fred); unsupported on a cluster.
    async fn run_id(&self, key: &str) -> Result<RunId, NodeError> {
        ops::run_id(&self.transport, key).await
    }

    /// `WAIT` or `WAITAOF` on the connection that carries `key` (a `SentinelNode`: that carried `key`'s last
    /// write, or a definite [`NodeErrorKind::Connection`](redlease::NodeErrorKind::Connection) error when
    /// the node has moved to another primary since); unsupported on a cluster.
    async fn wait_replicas(&self, key: &str, wait: ReplicaWait) -> Result<u32, NodeError> {
        self.transport.wait_replicas(key, wait).await
    }

    async fn extend_many(&self, items: &[ExtendItem<'_>]) -> Result<Vec<bool>, NodeError> {
        ops::extend_many(&self.transport, items).await
    }

    /// The [`ACQUIRE_MANY`](crate::scripts::ACQUIRE_MANY), `EXTEND_MANY` or `RELEASE_MANY` script; unsupported
    /// across Cluster slots and without Lua (the core then takes the keys one at a time).
    async fn multi_key(
        &self,
        items: &[MultiKeyItem<'_>],
        op: MultiKeyOp,
    ) -> Result<MultiKeyReply, NodeError> {
        ops::multi_key(&self.transport, items, op).await
    }

    /// The [`PERMIT`](crate::scripts::PERMIT) or [`RW_PERMIT`](crate::scripts::RW_PERMIT) script; without
    /// Lua, `TIME` and a watched sorted-set transaction (see the crate README's "Leased semaphores").
    async fn permit(
        &self,
        key: &str,
        token: &Token,
        ttl: Ttl,
        op: PermitOp<'_>,
    ) -> Result<PermitReply, NodeError> {
        ops::permit(&self.transport, key, token, ttl, op).await
    }
}
