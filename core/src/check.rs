//! The start-up check ([`LockManager::check`]): every node contacted once, and what it found reported per
//! node, so that a wrong password, a down server or a missing permission shows at boot rather than at the
//! first lock.

use std::fmt;
use std::time::Duration;

use crate::driver::BoxFuture;
use crate::error::Error;
use crate::machine::WaitFor;
use crate::manager::LockManager;
use crate::node::{NodeError, NodeErrorKind, RedisNode};

/// How a node sends one kind of lease operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Path {
    /// A Lua script (`EVALSHA`, with one `EVAL` after `NOSCRIPT`).
    Script,
    /// The server's own commands (`SET … NX GET`, `SET … IFEQ`, `DELIFEQ`, `MULTI`/`EXEC`), no Lua.
    Native,
}

/// Which [`Path`] a node will use for each lease operation, as its check found it
/// ([`Readiness::Ready`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct CommandPaths {
    /// A first acquisition attempt (`SET … NX GET PX` where the server accepts it: [`Path::Native`]).
    pub acquire: Path,
    /// Retried and fenced acquisitions, and reading a key back.
    pub retry_and_fence: Path,
    /// Release.
    pub release: Path,
    /// Extension (renewal).
    pub extend: Path,
}

impl CommandPaths {
    /// Every operation by script.
    pub fn scripts() -> Self {
        Self {
            acquire: Path::Script,
            retry_and_fence: Path::Script,
            release: Path::Script,
            extend: Path::Script,
        }
    }

    /// With `path` for first acquisition attempts.
    #[must_use]
    pub fn with_acquire(mut self, path: Path) -> Self {
        self.acquire = path;
        self
    }

    /// With `path` for retried and fenced acquisitions and reads.
    #[must_use]
    pub fn with_retry_and_fence(mut self, path: Path) -> Self {
        self.retry_and_fence = path;
        self
    }

    /// With `path` for releases.
    #[must_use]
    pub fn with_release(mut self, path: Path) -> Self {
        self.release = path;
        self
    }

    /// With `path` for extensions.
    #[must_use]
    pub fn with_extend(mut self, path: Path) -> Self {
        self.extend = path;
        self
    }
}

impl fmt::Display for CommandPaths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |p: Path| match p {
            Path::Script => "script",
            Path::Native => "native",
        };
        write!(
            f,
            "acquire {}, retry/fence {}, release {}, extend {}",
            name(self.acquire),
            name(self.retry_and_fence),
            name(self.release),
            name(self.extend)
        )
    }
}

/// What one node's check found: the answer of [`RedisNode::readiness`], and of
/// [`LockManager::check`] per node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Readiness {
    /// The node has no check of its own ([`RedisNode::readiness`]'s default). [`LockManager::check`] then
    /// reads a key through it ([`RedisNode::inspect`]) and reports [`Answered`](Self::Answered) or the
    /// failure; it never reports `Unknown` itself.
    Unknown,
    /// A node without a check of its own answered a read: reachable, and logged in if the server asks for a
    /// login; its permissions and command paths are unknown.
    Answered,
    /// Connected, logged in, and the user may run everything a lease needs, by these paths.
    Ready(CommandPaths),
    /// No connection: refused, timed out, or dropped.
    Unreachable(NodeError),
    /// Connected, but the server refused the login (a wrong password or user, or none given where one is
    /// required).
    LoginRefused(NodeError),
    /// Logged in, but the server's ACL refuses a command (or key) a lease needs; the error names it.
    NotPermitted(NodeError),
    /// Something else: a replica, a server still loading, a node pinned to commands the server lacks.
    Failed(NodeError),
}

impl Readiness {
    /// A node error as the check reports it, by its kind: connection, timeout and I/O failures are
    /// [`Unreachable`](Self::Unreachable), everything else [`Failed`](Self::Failed). (A node's own check
    /// tells a refused login from a refused command, which the error kind alone does not.)
    pub fn from_error(error: NodeError) -> Self {
        match error.kind() {
            NodeErrorKind::Connection | NodeErrorKind::Timeout | NodeErrorKind::Io => {
                Self::Unreachable(error)
            }
            _ => Self::Failed(error),
        }
    }

    /// Whether the node can serve leases as far as the check can tell ([`Ready`](Self::Ready) or
    /// [`Answered`](Self::Answered)).
    pub fn is_ready(&self) -> bool {
        matches!(self, Self::Ready(_) | Self::Answered)
    }

    /// Whether the node answered: `Some(false)` for [`Unreachable`](Self::Unreachable), `None` while
    /// unknown.
    pub fn reachable(&self) -> Option<bool> {
        match self {
            Self::Unknown => None,
            Self::Unreachable(_) => Some(false),
            _ => Some(true),
        }
    }

    /// Whether the login was accepted: `Some(false)` for [`LoginRefused`](Self::LoginRefused), `None` where
    /// the check did not get that far (or the node failed otherwise).
    pub fn authenticated(&self) -> Option<bool> {
        match self {
            Self::Answered | Self::Ready(_) | Self::NotPermitted(_) => Some(true),
            Self::LoginRefused(_) => Some(false),
            Self::Unknown | Self::Unreachable(_) | Self::Failed(_) => None,
        }
    }

    /// Whether the user may run what a lease needs: `Some(true)` only from a node's own check
    /// ([`Ready`](Self::Ready)), `Some(false)` for [`NotPermitted`](Self::NotPermitted), `None` otherwise.
    pub fn permitted(&self) -> Option<bool> {
        match self {
            Self::Ready(_) => Some(true),
            Self::NotPermitted(_) => Some(false),
            _ => None,
        }
    }

    /// The command paths, where the node's check reported them.
    pub fn paths(&self) -> Option<CommandPaths> {
        match self {
            Self::Ready(paths) => Some(*paths),
            _ => None,
        }
    }

    /// The error that made the node fail its check.
    pub fn error(&self) -> Option<&NodeError> {
        match self {
            Self::Unreachable(e)
            | Self::LoginRefused(e)
            | Self::NotPermitted(e)
            | Self::Failed(e) => Some(e),
            Self::Unknown | Self::Answered | Self::Ready(_) => None,
        }
    }
}

impl fmt::Display for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown => f.write_str("not checked"),
            Self::Answered => f.write_str("answered a read (no check of its own)"),
            Self::Ready(paths) => write!(f, "ready ({paths})"),
            Self::Unreachable(e) => write!(f, "unreachable: {e}"),
            Self::LoginRefused(e) => write!(f, "login refused: {e}"),
            Self::NotPermitted(e) => write!(f, "not permitted: {e}"),
            Self::Failed(e) => write!(f, "failed: {e}"),
        }
    }
}

/// One node's part of a [`CheckReport`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeCheck {
    /// The node's position in the manager (the order it was given in).
    pub index: usize,
    /// The node's [`endpoint`](RedisNode::endpoint), if it reports one (never with credentials).
    pub endpoint: Option<String>,
    /// What the check found.
    pub readiness: Readiness,
}

/// What [`LockManager::check`] found on every node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CheckReport {
    /// One entry per node, in the manager's order.
    pub nodes: Vec<NodeCheck>,
    /// Nodes that must be ready for a lease to be granted (1 in single mode, the majority in Redlock mode).
    pub quorum: usize,
}

impl CheckReport {
    /// Whether every node is ready.
    pub fn all_ready(&self) -> bool {
        self.nodes.iter().all(|n| n.readiness.is_ready())
    }

    /// Whether at least a quorum of nodes is ready: leases can be granted now (a Redlock service may start
    /// with a minority down).
    pub fn quorum_ready(&self) -> bool {
        self.nodes.iter().filter(|n| n.readiness.is_ready()).count() >= self.quorum
    }

    /// The nodes that are not ready.
    pub fn failed(&self) -> impl Iterator<Item = &NodeCheck> {
        self.nodes.iter().filter(|n| !n.readiness.is_ready())
    }
}

impl fmt::Display for CheckReport {
    /// One line per node: `node 0 (redis://10.0.0.1:6379/0): ready (acquire native, …)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, node) in self.nodes.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "node {}", node.index)?;
            if let Some(endpoint) = &node.endpoint {
                write!(f, " ({endpoint})")?;
            }
            write!(f, ": {}", node.readiness)?;
        }
        Ok(())
    }
}

/// The least time [`LockManager::check`] gives each node (the operation timeout when that is longer).
pub const CHECK_TIMEOUT_FLOOR: Duration = Duration::from_secs(2);

impl LockManager {
    /// The start-up check: contacts every node once, concurrently, and reports per node whether it is
    /// reachable, accepts the login, and lets the user run what a lease needs, and which commands it will
    /// use ([`CheckReport`]). Writes nothing.
    ///
    /// `example_key` stands for the lock keys (choose one the ACL's key patterns allow, as real lock keys
    /// must be). Each node's check is bounded by the configuration's operation timeout or
    /// [`CHECK_TIMEOUT_FLOOR`] (2 s), whichever is longer — at start-up a first connection and its
    /// capability check may take longer than one operation on a warm connection, and nothing waits on the
    /// check but the start-up itself; a node that does not answer in time is
    /// [`Unreachable`](Readiness::Unreachable). Nodes with a check of their own
    /// ([`RedisNode::readiness`]: both adapters) report their command paths and the checked connection
    /// serves the first lease; others are asked to read `example_key`.
    ///
    /// ```
    /// use redlease::{CheckReport, LockManager};
    ///
    /// async fn start(manager: &LockManager) -> Result<(), Box<dyn std::error::Error>> {
    ///     let report: CheckReport = manager.check("jobs:{nightly}:lock").await?;
    ///     if !report.quorum_ready() {
    ///         return Err(format!("Redis is not ready for leases:\n{report}").into());
    ///     }
    ///     for node in report.failed() {
    ///         eprintln!("running without node {}: {}", node.index, node.readiness);
    ///     }
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] for an empty or too long `example_key`, before anything is sent. What the nodes
    /// answer is in the report, never an error.
    pub async fn check(&self, example_key: &str) -> Result<CheckReport, Error> {
        crate::config::check_key("lock", example_key)?;
        let engine = self.engine();
        let config = &engine.config;
        let timeout: Duration = config
            .operation_timeout_for(config.expiry())
            .max(CHECK_TIMEOUT_FLOOR);
        let r = engine
            .round(
                WaitFor::All,
                false,
                timeout,
                |_, node| -> BoxFuture<'_, Result<Readiness, NodeError>> {
                    Box::pin(async move { Ok(readiness(node, example_key).await) })
                },
                |_| true,
            )
            .await;
        let nodes = r
            .values
            .into_iter()
            .enumerate()
            .map(|(index, value)| NodeCheck {
                index,
                endpoint: engine.nodes[index].endpoint(),
                readiness: value
                    .unwrap_or_else(|| Readiness::Unreachable(NodeError::timed_out(timeout))),
            })
            .collect();
        Ok(CheckReport {
            nodes,
            quorum: engine.quorum(),
        })
    }
}

/// A node's own check, or a read for a node without one.
async fn readiness(node: &dyn RedisNode, key: &str) -> Readiness {
    match node.readiness(key).await {
        Readiness::Unknown => match node.inspect(key).await {
            Ok(_) => Readiness::Answered,
            Err(e) => Readiness::from_error(e),
        },
        found => found,
    }
}
