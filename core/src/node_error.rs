//! What a node operation's failure is: [`NodeError`], its [`NodeErrorKind`] and whether it was [`Applied`].
//! A leaf: it depends on nothing else in the crate.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Whether a failed node operation may have taken effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Applied {
    /// The command definitely did not change anything (it was never sent, or Redis refused it).
    No,
    /// The command may have been executed: it was (or may have been) sent, and no reply arrived.
    Unknown,
}

/// What went wrong on a node, coarse enough for the core to reason about and for users to decide how to react.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeErrorKind {
    /// Could not connect, or the connection is closed. Reconnecting may help.
    Connection,
    /// No reply within the operation timeout (the command may have been applied).
    Timeout,
    /// An I/O error on an established connection.
    Io,
    /// The server has not loaded the script (`NOSCRIPT`) and loading it failed.
    NoScript,
    /// The server is out of memory (`OOM`).
    OutOfMemory,
    /// The node is a read-only replica (`READONLY`): the topology points at the wrong server.
    ReadOnly,
    /// Authentication or authorisation failed (`NOAUTH`, `WRONGPASS`, `NOPERM`). Retrying will not help.
    Auth,
    /// Keys of one operation hash to different Cluster slots (`CROSSSLOT`), found by the server or before sending.
    CrossSlot,
    /// The Cluster is reconfiguring or down (`TRYAGAIN`, `CLUSTERDOWN`, `MOVED`/`ASK` not followed).
    Cluster,
    /// The server is busy running a script (`BUSY`) or loading its dataset (`LOADING`), or its primary is down
    /// (`MASTERDOWN`). Usually transient.
    Busy,
    /// A key holds a value of the wrong type (`WRONGTYPE`), e.g. a lock key holding a hash.
    WrongType,
    /// The fence counter cannot issue a number: it is not a non-negative integer, it is exhausted, it has a
    /// TTL (it would expire and numbers would regress), or it is missing while the lock holds our token.
    Fence,
    /// The server does not offer, or this user may not run, the commands the node's configured mode needs
    /// (for example a node pinned to native commands on a server without `DELIFEQ`, or one pinned to scripts
    /// where Lua is absent). Retrying will not help.
    Unsupported,
    /// The write was applied on the primary but not acknowledged by as many replicas as the
    /// [`Durability`](crate::Durability) policy requires (`WAIT`/`WAITAOF`): a failover now could lose it.
    /// Usually transient (a replica is down or lagging).
    NotReplicated,
    /// The server was restarted (its [`RunId`](crate::RunId) changed) and is still within the restart quarantine: its
    /// answer is not counted toward a quorum, because it may have forgotten a lease another client holds.
    Restarted,
    /// The fence counter issued a number no larger than one this process already received from it: the
    /// server lost writes (a restart without persistence, or a failover to a replica that had not received
    /// them). Raise it above the resource's largest fence
    /// ([`LockManager::raise_fence`](crate::LockManager::raise_fence)).
    FenceRegressed,
    /// The reply did not have the expected shape.
    Protocol,
    /// Anything else.
    Other,
}

impl NodeErrorKind {
    /// Whether no retry can change this refusal: the key, the permissions or the topology must be fixed first.
    ///
    /// | kind | permanent | why |
    /// |---|---|---|
    /// | [`Auth`](Self::Auth) (`NOAUTH`, `WRONGPASS`, `NOPERM`) | yes | credentials and ACLs do not change between attempts |
    /// | [`CrossSlot`](Self::CrossSlot) | yes | the keys' hash slots are fixed by their names |
    /// | [`WrongType`](Self::WrongType) | yes | the key keeps its type until someone deletes it |
    /// | [`Fence`](Self::Fence) | yes | a corrupt, exhausted or expiring counter needs an operator |
    /// | [`Unsupported`](Self::Unsupported) | yes | the server's commands do not change between attempts |
    /// | [`FenceRegressed`](Self::FenceRegressed) | yes | the counter must be raised by an operator first |
    /// | [`NotReplicated`](Self::NotReplicated) | no | a replica comes back or catches up |
    /// | [`Restarted`](Self::Restarted) | no | the quarantine ends |
    /// | [`Busy`](Self::Busy) (`BUSY`, `LOADING`, `MASTERDOWN`) | no | the server finishes loading or its script |
    /// | [`Cluster`](Self::Cluster) (`TRYAGAIN`, `CLUSTERDOWN`, redirections) | no | resharding and failover end |
    /// | [`ReadOnly`](Self::ReadOnly) | no | during a failover the address becomes a primary again |
    /// | [`OutOfMemory`](Self::OutOfMemory) | no | keys expire and memory is freed |
    /// | [`Connection`](Self::Connection), [`Timeout`](Self::Timeout), [`Io`](Self::Io), [`NoScript`](Self::NoScript), [`Protocol`](Self::Protocol), [`Other`](Self::Other) | no | transient or unknown: retried |
    ///
    /// An acquisition ends at once, without further attempts or pauses, when permanent refusals leave too
    /// few nodes for a quorum.
    pub fn is_permanent(self) -> bool {
        matches!(
            self,
            Self::Auth
                | Self::CrossSlot
                | Self::WrongType
                | Self::Fence
                | Self::Unsupported
                | Self::FenceRegressed
        )
    }

    /// A short lowercase name, used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Timeout => "timeout",
            Self::Io => "i/o",
            Self::NoScript => "noscript",
            Self::OutOfMemory => "out of memory",
            Self::ReadOnly => "read-only replica",
            Self::Auth => "authentication",
            Self::CrossSlot => "cross-slot",
            Self::Cluster => "cluster",
            Self::Busy => "busy",
            Self::WrongType => "wrong type",
            Self::Fence => "fence counter",
            Self::Unsupported => "unsupported",
            Self::NotReplicated => "not replicated",
            Self::Restarted => "restarted node in quarantine",
            Self::FenceRegressed => "fence regression",
            Self::Protocol => "protocol",
            Self::Other => "other",
        }
    }
}

/// An operation on one node that could not report its outcome.
///
/// Carries the [`kind`](Self::kind), whether the command [may have been applied](Self::applied), a message
/// (never containing tokens or credentials) and the underlying client error as its [`source`](StdError::source).
#[derive(Debug, Clone)]
pub struct NodeError {
    kind: NodeErrorKind,
    applied: Applied,
    message: Cow<'static, str>,
    source: Option<Arc<dyn StdError + Send + Sync + 'static>>,
}

impl NodeError {
    /// An error after which the command definitely did not take effect.
    pub fn not_applied(kind: NodeErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            applied: Applied::No,
            message: message.into(),
            source: None,
        }
    }

    /// An error after which the command may or may not have taken effect.
    pub fn ambiguous(kind: NodeErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            applied: Applied::Unknown,
            message: message.into(),
            source: None,
        }
    }

    /// The error raised by the core when a node did not answer within the operation timeout.
    pub fn timed_out(after: Duration) -> Self {
        Self::ambiguous(
            NodeErrorKind::Timeout,
            format!("no reply within the operation timeout of {after:?}"),
        )
    }

    /// Attaches the underlying error (e.g. the client library's), reported by [`source`](StdError::source).
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The coarse kind of failure.
    pub fn kind(&self) -> NodeErrorKind {
        self.kind
    }

    /// Whether the command may have been applied.
    pub fn applied(&self) -> Applied {
        self.applied
    }

    /// `true` when the command may have taken effect although no reply arrived.
    pub fn is_ambiguous(&self) -> bool {
        self.applied == Applied::Unknown
    }

    /// `true` when no retry can change this outcome (see [`NodeErrorKind::is_permanent`]). Only a refusal that
    /// was definitely not applied counts.
    pub fn is_permanent(&self) -> bool {
        self.applied == Applied::No && self.kind.is_permanent()
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let applied = match self.applied {
            Applied::No => "not applied",
            Applied::Unknown => "outcome unknown",
        };
        write!(
            f,
            "{} error ({applied}): {}",
            self.kind.as_str(),
            self.message
        )
    }
}

impl StdError for NodeError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
