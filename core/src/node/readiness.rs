//! What a node's own start-up check found ([`Readiness`], with the [`CommandPaths`] it will use), as
//! [`RedisNode::readiness`](crate::RedisNode::readiness) answers it; [`LockManager::check`](crate::LockManager::check)
//! gathers them.

use std::fmt;

use crate::node_error::{NodeError, NodeErrorKind};

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

/// What one node's check found: the answer of [`RedisNode::readiness`](crate::RedisNode::readiness), and of
/// [`LockManager::check`](crate::LockManager::check) per node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Readiness {
    /// The node has no check of its own ([`RedisNode::readiness`](crate::RedisNode::readiness)'s default). [`LockManager::check`](crate::LockManager::check) then
    /// reads a key through it ([`RedisNode::inspect`](crate::RedisNode::inspect)) and reports [`Answered`](Self::Answered) or the
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
