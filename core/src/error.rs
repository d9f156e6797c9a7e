//! The errors of the public API.

use std::fmt;

use crate::config::ConfigError;
use crate::driver::Mode;
use crate::node::NodeError;
use crate::token::TokenError;

/// Which lease operation a [`QuorumError`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Acquiring (one attempt).
    Acquire,
    /// Extending, manually or by automatic renewal.
    Extend,
    /// Releasing.
    Release,
    /// Raising a fence counter ([`LockManager::raise_fence`](crate::LockManager::raise_fence)).
    RaiseFence,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Acquire => "acquire",
            Self::Extend => "extend",
            Self::Release => "release",
            Self::RaiseFence => "raise fence",
        })
    }
}

/// A round of node calls that did not reach the required number of successes because nodes failed.
///
/// Carries the per-node errors by node index (the order the nodes were given to the manager). Its
/// [`source`](std::error::Error::source) is the first node error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{operation} reached {successes} of {required} required nodes; {} node(s) failed{}", errors.len(), first_error(errors))]
#[non_exhaustive]
pub struct QuorumError {
    /// The operation.
    pub operation: Operation,
    /// Nodes that succeeded.
    pub successes: usize,
    /// Nodes that had to succeed.
    pub required: usize,
    /// The failures, as `(node index, error)`, in index order.
    pub errors: Vec<(usize, NodeError)>,
    #[source]
    first: Option<NodeError>,
}

fn first_error(errors: &[(usize, NodeError)]) -> String {
    match errors.first() {
        Some((i, e)) => format!(" (node {i}: {e})"),
        None => String::new(),
    }
}

impl QuorumError {
    pub(crate) fn new(
        operation: Operation,
        successes: usize,
        required: usize,
        errors: Vec<(usize, NodeError)>,
    ) -> Self {
        let first = errors.first().map(|(_, e)| e.clone());
        Self {
            operation,
            successes,
            required,
            errors,
            first,
        }
    }

    /// Whether any failed node may have applied the operation anyway.
    pub fn any_ambiguous(&self) -> bool {
        self.errors.iter().any(|(_, e)| e.is_ambiguous())
    }
}

/// Why a lease is no longer held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The validity deadline passed without a successful renewal.
    Expired,
    /// The nodes report the key missing or holding another token (expired on the server, deleted, or taken
    /// over), on too many nodes for a quorum to remain.
    NotHeld,
    /// An extension succeeded too late to leave any validity (its round took about the whole TTL, or spanned
    /// a suspend), so the lease was given up and cleaned up. An extension that merely failed to reach a
    /// quorum leaves the lease at risk instead; if nothing extends it, it is lost as
    /// [`Expired`](Self::Expired), with the node errors as the cause.
    ExtendFailed,
    /// The holder released the lease (or dropped it). Only reported by a [`LossSignal`](crate::LossSignal).
    Released,
    /// The machine was suspended (the wall clock ran ahead of the monotonic clock by more than the drift
    /// allowance): the servers' TTLs kept running meanwhile, so the lease cannot be trusted. See
    /// [`Timer::wall_now`](crate::Timer::wall_now).
    Suspended,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Expired => "its validity ran out before it was renewed",
            Self::NotHeld => "the nodes no longer hold its token",
            Self::ExtendFailed => "an extension failed",
            Self::Released => "it was released",
            Self::Suspended => "the machine was suspended while it was held",
        })
    }
}

/// Why an acquisition gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NotAcquiredReason {
    /// Another owner holds the lock on enough nodes (normal contention, not a fault).
    Contended,
    /// Too few nodes answered successfully (errors or timeouts) for a quorum.
    TooFewNodes,
    /// A quorum agreed, but the round took so long that no validity was left.
    ValidityExhausted,
    /// Nodes refused in a way no retry can change ([`NodeErrorKind::is_permanent`](crate::NodeErrorKind::is_permanent):
    /// wrong key type, no permission, cross-slot keys, an unusable fence counter), on too many nodes for a
    /// quorum; the acquisition ended at once, without further attempts.
    Refused,
    /// The deadline of [`acquire_until`](crate::Lock::acquire_until) had passed before an attempt could start;
    /// nothing was sent.
    DeadlinePassed,
    /// The node took the lock, but too few replicas acknowledged it in time for the
    /// [`Durability::Required`](crate::Durability::Required) policy; the key was released again.
    NotReplicated,
}

impl fmt::Display for NotAcquiredReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Contended => "held by another owner",
            Self::TooFewNodes => "too few nodes answered",
            Self::ValidityExhausted => "no validity left after the round",
            Self::Refused => "refused",
            Self::DeadlinePassed => "the deadline had passed before an attempt could start",
            Self::NotReplicated => {
                "taken, but not acknowledged by enough replicas in time (released again)"
            }
        })
    }
}

/// The cause named at the top of an error message: the first node error, if any.
fn cause(last_error: &Option<Box<QuorumError>>) -> String {
    match last_error.as_deref().and_then(|q| q.errors.first()) {
        Some((i, e)) => format!(" (node {i}: {e})"),
        None => String::new(),
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Single => "single Redis",
        Mode::Redlock => "Redlock",
    }
}

/// Why an acquisition gave up, worded for its mode: one node in single mode, a count in Redlock mode.
fn not_acquired(
    mode: Mode,
    reason: NotAcquiredReason,
    last_error: &Option<Box<QuorumError>>,
) -> String {
    let counts = last_error
        .as_deref()
        .map(|q| format!(" ({} of {} required)", q.successes, q.required))
        .unwrap_or_default();
    let what = match (mode, reason) {
        (Mode::Single, NotAcquiredReason::TooFewNodes) => {
            "the node did not answer successfully".to_owned()
        }
        (_, NotAcquiredReason::TooFewNodes) => format!("too few nodes answered{counts}"),
        (Mode::Single, NotAcquiredReason::Refused) => "refused by the node".to_owned(),
        (_, NotAcquiredReason::Refused) => format!("refused by too many nodes{counts}"),
        (_, other) => other.to_string(),
    };
    format!("{what}{}", cause(last_error))
}

/// The errors of redlease's public API.
///
/// Match on the variants; never on the message text. Variants may be added.
///
/// ```
/// use std::time::Duration;
/// use redlease::{Config, Error, LockManager, LossReason};
///
/// # redlease_testkit::block_on(async {
/// # let manager = LockManager::single(redlease_testkit::MemoryNode::new(), Config::default()).unwrap();
/// match manager.lock("report").try_acquire().await {
///     Ok(lease) => {
///         match lease.run(async { /* the work */ }).await {
///             Ok(()) => {}
///             // Lost while working: the work was stopped; `reason` says why, `source()` the node errors.
///             Err(Error::Lost { reason: LossReason::NotHeld, .. }) => eprintln!("taken over"),
///             Err(e) => eprintln!("{e}"),
///         }
///         let _ = lease.release().await;
///     }
///     Err(e) if e.is_contended() => {}                 // someone else holds it
///     Err(Error::Config(e)) => panic!("a bug in our setup: {e}"), // nothing was sent
///     Err(Error::NotAcquired { .. }) => {}              // nodes failed: retry later
///     Err(e) => eprintln!("{e}"),
/// }
/// # });
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting, key or topology is invalid. Raised before any command is sent.
    #[error(transparent)]
    Config(#[from] ConfigError),

    /// Fencing tokens were requested from a Redlock manager: independent primaries cannot issue one
    /// monotonic sequence. Use a single-authority manager for fenced locks.
    #[error("fencing tokens need a single Redis authority; a Redlock manager cannot issue them")]
    FencingUnsupported,

    /// The lock was not acquired within the allowed attempts or time.
    #[error(
        "lock {key:?} not acquired after {attempts} attempt(s) ({}): {}",
        mode_name(*mode),
        not_acquired(*mode, *reason, last_error)
    )]
    NotAcquired {
        /// The lock key.
        key: String,
        /// Single authority or Redlock.
        mode: Mode,
        /// Attempts made.
        attempts: u32,
        /// Why the last attempt failed.
        reason: NotAcquiredReason,
        /// Node failures of the last attempt, if any.
        #[source]
        last_error: Option<Box<QuorumError>>,
    },

    /// The lease is no longer held.
    #[error("lease on {key:?} lost: {reason}{}", cause(source))]
    Lost {
        /// The lock key.
        key: String,
        /// Why.
        reason: LossReason,
        /// Node failures that led to the loss, if any.
        #[source]
        source: Option<Box<QuorumError>>,
    },

    /// Nodes failed so that the outcome of an operation is unknown (e.g. a release that reached too few nodes
    /// to say whether the lease was still held).
    #[error(transparent)]
    Quorum(Box<QuorumError>),

    /// An ownership token could not be generated.
    #[error(transparent)]
    Token(#[from] TokenError),
}

impl From<QuorumError> for Error {
    fn from(e: QuorumError) -> Self {
        Error::Quorum(Box::new(e))
    }
}

impl Error {
    /// `true` for [`Error::NotAcquired`] with [`NotAcquiredReason::Contended`]: someone else holds the lock.
    pub fn is_contended(&self) -> bool {
        matches!(
            self,
            Error::NotAcquired {
                reason: NotAcquiredReason::Contended,
                ..
            }
        )
    }

    /// `true` for [`Error::Lost`].
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_stay_small_enough_to_return_by_value() {
        assert!(
            std::mem::size_of::<Error>() <= 72,
            "{}",
            std::mem::size_of::<Error>()
        );
    }

    fn not_acquired_error(mode: Mode, errors: Vec<(usize, NodeError)>) -> Error {
        let required = if mode == Mode::Single { 1 } else { 2 };
        Error::NotAcquired {
            key: "k".into(),
            mode,
            attempts: 1,
            reason: NotAcquiredReason::TooFewNodes,
            last_error: Some(Box::new(QuorumError::new(
                Operation::Acquire,
                0,
                required,
                errors,
            ))),
        }
    }

    #[test]
    fn not_acquired_names_the_mode_and_the_node_error_at_the_top() {
        let oom =
            NodeError::not_applied(crate::NodeErrorKind::OutOfMemory, "OOM command not allowed");
        let single = not_acquired_error(Mode::Single, vec![(0, oom.clone())]).to_string();
        assert_eq!(
            single,
            "lock \"k\" not acquired after 1 attempt(s) (single Redis): the node did not answer successfully \
             (node 0: out of memory error (not applied): OOM command not allowed)"
        );
        assert!(!single.contains("too few nodes"));
        let redlock =
            not_acquired_error(Mode::Redlock, vec![(1, oom.clone()), (2, oom)]).to_string();
        assert!(
            redlock.starts_with(
                "lock \"k\" not acquired after 1 attempt(s) (Redlock): too few nodes answered (0 of 2 required) \
                 (node 1: out of memory"
            ),
            "{redlock}"
        );
    }

    #[test]
    fn quorum_error_names_counts_and_first_node() {
        let e = QuorumError::new(
            Operation::Extend,
            1,
            2,
            vec![(2, NodeError::timed_out(std::time::Duration::from_millis(5)))],
        );
        let text = e.to_string();
        assert!(
            text.starts_with(
                "extend reached 1 of 2 required nodes; 1 node(s) failed (node 2: timeout"
            ),
            "{text}"
        );
        assert!(e.any_ambiguous());
        assert!(std::error::Error::source(&e).is_some());
    }
}
