//! The errors of the public API.

use std::fmt;

use crate::config::ConfigError;
use crate::mode::Mode;
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
    /// Reading who holds a lock ([`Lock::holder_info`](crate::Lock::holder_info)).
    Inspect,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Acquire => "acquire",
            Self::Extend => "extend",
            Self::Release => "release",
            Self::RaiseFence => "raise fence",
            Self::Inspect => "inspect",
        })
    }
}

/// A round of node calls that did not reach the required number of successes because nodes failed.
///
/// Carries the per-node errors by node index (the order the nodes were given to the manager). Its
/// [`source`](std::error::Error::source) is the first node error, which its message therefore does not
/// repeat: the message says how many nodes succeeded and which failed (any others with their error's kind).
#[derive(Debug, Clone)]
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
}

impl fmt::Display for QuorumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.required == 1 { "" } else { "s" };
        write!(
            f,
            "{} reached {} of {} required node{s}",
            self.operation, self.successes, self.required
        )?;
        let mut errors = self.errors.iter();
        if let Some((first, _)) = errors.next() {
            // The first node's error is the source; any others are named by kind only.
            write!(f, "; node {first} failed")?;
            for (n, (i, e)) in errors.enumerate() {
                let sep = if n == 0 { ", and node" } else { ", node" };
                write!(f, "{sep} {i} ({})", e.kind().as_str())?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for QuorumError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.errors
            .first()
            .map(|(_, e)| e as &(dyn std::error::Error + 'static))
    }
}

impl QuorumError {
    pub(crate) fn new(
        operation: Operation,
        successes: usize,
        required: usize,
        errors: Vec<(usize, NodeError)>,
    ) -> Self {
        Self {
            operation,
            successes,
            required,
            errors,
        }
    }

    /// Whether any failed node may have applied the operation anyway.
    pub fn any_ambiguous(&self) -> bool {
        self.errors.iter().any(|(_, e)| e.is_ambiguous())
    }
}

/// An error with all its sources, joined by `": "`: how redlease's own log events print an error (each
/// level says only what it adds, so the chain names the cause once).
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

/// How many bytes of a key an error message shows ([`ShortKey`]).
const KEY_SHOWN: usize = 64;

/// A key as error messages show it: quoted, and when longer than 64 bytes only its first 64 bytes (cut at
/// a character boundary) and its length, so that a long key never makes a long log line.
pub(crate) struct ShortKey<'a>(pub(crate) &'a str);

impl fmt::Display for ShortKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.0;
        if key.len() <= KEY_SHOWN {
            return write!(f, "{key:?}");
        }
        let mut end = KEY_SHOWN;
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        let shown = key.get(..end).unwrap_or_default();
        write!(f, "{shown:?}… ({} bytes)", key.len())
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
    /// The lease reached its hold limit ([`Lock::max_hold`](crate::Lock::max_hold)): renewal stopped there
    /// and the lease was given up (its token deleted from the nodes) although nothing failed. Not a fault:
    /// the work outlived the time it was allowed.
    HoldLimit,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Expired => "its validity ran out before it was renewed",
            Self::NotHeld => "the nodes no longer hold its token",
            Self::ExtendFailed => "an extension failed",
            Self::Released => "it was released",
            Self::Suspended => "the machine was suspended while it was held",
            Self::HoldLimit => "it reached its hold limit",
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

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Single => "single Redis",
        Mode::Redlock => "Redlock",
    }
}

/// Why an acquisition gave up, worded for its mode: one node in single mode, several in Redlock mode. The
/// counts and the node errors are the source's ([`QuorumError`]) to say.
fn not_acquired(mode: Mode, reason: NotAcquiredReason) -> String {
    match (mode, reason) {
        (Mode::Single, NotAcquiredReason::TooFewNodes) => "the node failed".to_owned(),
        (_, NotAcquiredReason::TooFewNodes) => "too few nodes succeeded".to_owned(),
        (Mode::Single, NotAcquiredReason::Refused) => "refused by the node".to_owned(),
        (_, NotAcquiredReason::Refused) => "refused by too many nodes".to_owned(),
        (_, other) => other.to_string(),
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The errors of redlease's public API.
///
/// Match on the variants; never on the message text. Variants may be added.
///
/// ```
/// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
/// use std::time::Duration;
/// use redlease::{Config, Error, LockManager, LossReason};
///
/// # block_on(async {
/// # let manager = LockManager::single(MapNode::default(), Config::default()).unwrap();
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
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A setting, key or topology is invalid. Raised before any command is sent.
    Config(ConfigError),

    /// Fencing tokens were requested from a Redlock manager: independent primaries cannot issue one
    /// monotonic sequence. Use a single-authority manager for fenced locks.
    FencingUnsupported,

    /// The lock was not acquired within the allowed attempts or time.
    NotAcquired {
        /// The lock key.
        key: String,
        /// Single authority or Redlock.
        mode: Mode,
        /// Attempts made.
        attempts: u32,
        /// Why the last attempt failed.
        reason: NotAcquiredReason,
        /// Node failures of the last attempt, if any. The error's
        /// [`source`](std::error::Error::source) (a [`QuorumError`]).
        last_error: Option<Box<QuorumError>>,
    },

    /// The lease is no longer held.
    Lost {
        /// The lock key.
        key: String,
        /// Why.
        reason: LossReason,
        /// Node failures that led to the loss, if any. The error's [`source`](std::error::Error::source)
        /// (a [`QuorumError`]).
        source: Option<Box<QuorumError>>,
    },

    /// Nodes failed so that the operation did not reach its quorum (e.g. a release that reached too few nodes
    /// to say whether the lease was still held). The [`QuorumError`] is also the error's
    /// [`source`](std::error::Error::source).
    Quorum(Box<QuorumError>),

    /// An ownership token could not be generated.
    Token(TokenError),
}

/// Each variant's message says what that level adds (the key, the mode, the attempts, what it means for the
/// lease); the node errors are the [`source`](std::error::Error::source)'s to name, so that an error printed
/// with all its sources names its cause once. Keys longer than 64 bytes are shown shortened, with their
/// length.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(e) => fmt::Display::fmt(e, f),
            Error::FencingUnsupported => f.write_str(
                "fencing tokens need a single Redis authority; a Redlock manager cannot issue them",
            ),
            Error::NotAcquired {
                key,
                mode,
                attempts,
                reason,
                last_error: _,
            } => write!(
                f,
                "lock {} not acquired after {attempts} attempt{} ({}): {}",
                ShortKey(key),
                plural(*attempts),
                mode_name(*mode),
                not_acquired(*mode, *reason)
            ),
            Error::Lost { key, reason, .. } => {
                write!(f, "lease on {} lost: {reason}", ShortKey(key))
            }
            Error::Quorum(q) => f.write_str(match q.operation {
                Operation::Acquire => "the acquisition failed",
                Operation::Extend => "the lease was not extended",
                Operation::Release => "the release was not confirmed",
                Operation::RaiseFence => "the fence was not raised",
                Operation::Inspect => "the holder could not be read",
            }),
            Error::Token(e) => fmt::Display::fmt(e, f),
        }
    }
}

/// The source of [`Error::NotAcquired`], [`Error::Lost`] and [`Error::Quorum`] is their [`QuorumError`]
/// (`err.source()?.downcast_ref::<QuorumError>()` finds it), whose source is the first node's
/// [`NodeError`]. [`Error::Config`] and [`Error::Token`] stand for their inner error (same message, same
/// source).
impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let quorum = match self {
            Error::Config(e) => return std::error::Error::source(e),
            Error::Token(e) => return std::error::Error::source(e),
            Error::FencingUnsupported => None,
            Error::NotAcquired { last_error, .. } => last_error.as_deref(),
            Error::Lost { source, .. } => source.as_deref(),
            Error::Quorum(q) => Some(&**q),
        };
        quorum.map(|q| q as &(dyn std::error::Error + 'static))
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

impl From<TokenError> for Error {
    fn from(e: TokenError) -> Self {
        Error::Token(e)
    }
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
    use crate::NodeErrorKind;
    use std::error::Error as _;

    #[test]
    fn errors_stay_small_enough_to_return_by_value() {
        assert!(
            std::mem::size_of::<Error>() <= 72,
            "{}",
            std::mem::size_of::<Error>()
        );
    }

    /// Every level of `err`'s chain, top first.
    fn levels(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
        let mut out = Vec::new();
        let mut level = Some(err);
        while let Some(e) = level {
            out.push(e.to_string());
            level = e.source();
        }
        out
    }

    /// The rules every error message follows, as a list of broken ones: no level repeats the text of the
    /// level below it (so the chain names its cause once); no internal word; no line longer than a shortened
    /// key needs, however long the key.
    fn broken_rules(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
        let levels = levels(err);
        let mut broken = Vec::new();
        for pair in levels.windows(2) {
            if pair[0].contains(&pair[1]) {
                broken.push(format!("{:?} repeats its source {:?}", pair[0], pair[1]));
            }
        }
        for level in &levels {
            for word in ["probe", "probe_acquire"] {
                if level
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .any(|w| w == word)
                {
                    broken.push(format!("{level:?} uses the internal word {word:?}"));
                }
            }
            if level.len() > 400 {
                broken.push(format!("a level of {} bytes", level.len()));
            }
        }
        broken
    }

    fn oom() -> NodeError {
        NodeError::not_applied(NodeErrorKind::OutOfMemory, "OOM command not allowed")
    }

    fn quorum(op: Operation, required: usize, errors: Vec<(usize, NodeError)>) -> Box<QuorumError> {
        Box::new(QuorumError::new(op, 0, required, errors))
    }

    /// One of each error the core raises: every variant, every reason in both modes, with and without node
    /// errors, and a 2 MB key.
    fn every_error() -> Vec<Error> {
        let long_key = "k".repeat(2 << 20);
        let mut errors = Vec::new();
        for key in ["jobs:nightly".to_owned(), long_key] {
            for mode in [Mode::Single, Mode::Redlock] {
                let required = if mode == Mode::Single { 1 } else { 2 };
                for reason in [
                    NotAcquiredReason::Contended,
                    NotAcquiredReason::TooFewNodes,
                    NotAcquiredReason::ValidityExhausted,
                    NotAcquiredReason::Refused,
                    NotAcquiredReason::DeadlinePassed,
                    NotAcquiredReason::NotReplicated,
                ] {
                    for last_error in [
                        None,
                        Some(quorum(Operation::Acquire, required, vec![(0, oom())])),
                        Some(quorum(
                            Operation::Acquire,
                            required,
                            vec![
                                (0, oom()),
                                (2, NodeError::timed_out(std::time::Duration::from_millis(5))),
                            ],
                        )),
                    ] {
                        errors.push(Error::NotAcquired {
                            key: key.clone(),
                            mode,
                            attempts: 3,
                            reason,
                            last_error,
                        });
                    }
                }
            }
            for reason in [
                LossReason::Expired,
                LossReason::NotHeld,
                LossReason::ExtendFailed,
                LossReason::Released,
                LossReason::Suspended,
                LossReason::HoldLimit,
            ] {
                for source in [None, Some(quorum(Operation::Extend, 1, vec![(0, oom())]))] {
                    errors.push(Error::Lost {
                        key: key.clone(),
                        reason,
                        source,
                    });
                }
            }
        }
        for op in [
            Operation::Acquire,
            Operation::Extend,
            Operation::Release,
            Operation::RaiseFence,
            Operation::Inspect,
        ] {
            let reset = NodeError::ambiguous(NodeErrorKind::Connection, "connection reset")
                .with_source(std::io::Error::other("os error 104"));
            errors.push(Error::Quorum(quorum(op, 2, vec![(1, reset), (2, oom())])));
        }
        errors.push(Error::FencingUnsupported);
        errors.push(Error::Token(TokenError::for_tests("no entropy")));
        let d = std::time::Duration::from_secs(1);
        for config in [
            ConfigError::ZeroDuration { field: "expiry" },
            ConfigError::TooLong {
                field: "expiry",
                value: d,
                max: d,
            },
            ConfigError::ZeroAttempts,
            ConfigError::DriftFactor(2.0),
            ConfigError::RetryJitter(2.0),
            ConfigError::ExpiryWithinDrift {
                expiry: d,
                drift: d,
            },
            ConfigError::OperationTimeoutNotBelowExpiry {
                operation_timeout: d,
                expiry: d,
            },
            ConfigError::RenewalIntervalNotBelowExpiry {
                interval: d,
                expiry: d,
            },
            ConfigError::AutoRenewWithoutSpawner,
            ConfigError::RenewalBatch("max_batch must be at least 1".into()),
            ConfigError::FenceOutOfRange(u64::MAX),
            ConfigError::Durability("a Redlock manager has no replicas to wait for"),
            ConfigError::DurabilityWaitNotBelowExpiry {
                wait: d,
                operation_timeout: d,
                expiry: d,
            },
            ConfigError::InvalidKey("the lock key is empty"),
            ConfigError::KeyTooLong {
                which: "lock",
                len: 2 << 20,
                max: crate::MAX_KEY_BYTES,
            },
            ConfigError::Topology("3 nodes needed".into()),
            ConfigError::TicketMismatch("the ticket is for another key"),
            ConfigError::HolderInfoTooLong { len: 300, max: 256 },
            ConfigError::Semaphore("a semaphore needs at least one permit"),
        ] {
            errors.push(Error::Config(config));
        }
        errors
    }

    #[test]
    fn every_error_names_its_cause_once_without_internal_words_or_whole_long_keys() {
        let errors = every_error();
        assert!(errors.len() > 100, "{}", errors.len());
        for err in &errors {
            assert_eq!(broken_rules(err), Vec::<String>::new(), "{err:?}");
        }
        // The checker itself catches a level that repeats its source, and an internal word.
        let repeating = QuorumError::new(Operation::Acquire, 0, 1, vec![(0, oom())]);
        struct Repeats(QuorumError);
        impl fmt::Debug for Repeats {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }
        impl fmt::Display for Repeats {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "probe failed: {}", self.0)
            }
        }
        impl std::error::Error for Repeats {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        assert_eq!(broken_rules(&Repeats(repeating)).len(), 2);
    }

    #[test]
    fn the_source_of_a_node_failure_downcasts_to_its_quorum_error() {
        for err in every_error() {
            let expected = match &err {
                Error::NotAcquired { last_error, .. } => last_error.is_some(),
                Error::Lost { source, .. } => source.is_some(),
                Error::Quorum(_) => true,
                _ => false,
            };
            let quorum = err.source().and_then(|s| s.downcast_ref::<QuorumError>());
            assert_eq!(quorum.is_some(), expected, "{err:?}");
            if let Some(q) = quorum {
                let node = q.source().and_then(|s| s.downcast_ref::<NodeError>());
                assert_eq!(
                    node.map(NodeError::kind),
                    q.errors.first().map(|(_, e)| e.kind())
                );
            }
        }
    }

    #[test]
    fn an_error_printed_with_its_sources_reads_as_one_sentence_naming_the_cause_once() {
        let err = Error::NotAcquired {
            key: "k".into(),
            mode: Mode::Redlock,
            attempts: 3,
            reason: NotAcquiredReason::TooFewNodes,
            last_error: Some(quorum(
                Operation::Acquire,
                2,
                vec![
                    (1, oom()),
                    (2, NodeError::timed_out(std::time::Duration::from_millis(5))),
                ],
            )),
        };
        assert_eq!(
            levels(&err).join(": "),
            "lock \"k\" not acquired after 3 attempts (Redlock): too few nodes succeeded: \
             acquire reached 0 of 2 required nodes; node 1 failed, and node 2 (timeout): \
             out of memory error (not applied): OOM command not allowed"
        );
        let single = Error::NotAcquired {
            key: "k".into(),
            mode: Mode::Single,
            attempts: 1,
            reason: NotAcquiredReason::Refused,
            last_error: Some(quorum(Operation::Acquire, 1, vec![(0, oom())])),
        };
        assert_eq!(
            levels(&single).join(": "),
            "lock \"k\" not acquired after 1 attempt (single Redis): refused by the node: \
             acquire reached 0 of 1 required node; node 0 failed: \
             out of memory error (not applied): OOM command not allowed"
        );
    }

    #[test]
    fn a_long_key_is_shown_by_its_first_64_bytes_and_its_length() {
        let key = format!("{}é{}", "a".repeat(63), "b".repeat(2 << 20));
        let text = Error::Lost {
            key: key.clone(),
            reason: LossReason::Expired,
            source: None,
        }
        .to_string();
        // The 64-byte cut would split the 'é': the message stops before it.
        assert_eq!(
            text,
            format!(
                "lease on \"{}\"… ({} bytes) lost: its validity ran out before it was renewed",
                "a".repeat(63),
                key.len()
            )
        );
        assert_eq!(
            ShortKey(&"x".repeat(64)).to_string(),
            format!("\"{}\"", "x".repeat(64))
        );
    }
}
