//! The lease event hook: what the leases of a manager do, for metrics, logs and test histories.
//!
//! One [`Observer`] per manager, called inline. Events come in two layers:
//!
//! - **round events**, one per round of node calls, with every node's reply ([`Nodes`]) and the round's
//!   duration: [`Attempt`](EventKind::Attempt) (acquisition), [`Extension`](EventKind::Extension) (manual
//!   extension or renewal), [`ReleaseRound`](EventKind::ReleaseRound) and [`Cleanup`](EventKind::Cleanup);
//! - **lease events**, the life of one acquisition: [`Acquired`](EventKind::Acquired) or
//!   [`NotAcquired`](EventKind::NotAcquired), then any number of [`Extended`](EventKind::Extended),
//!   [`AtRisk`](EventKind::AtRisk) and [`Recovered`](EventKind::Recovered), then at most one of
//!   [`Lost`](EventKind::Lost) and [`Released`](EventKind::Released).
//!
//! Without an observer (and without the `tracing` feature) the hook costs one branch per event site: no event
//! is built, nothing is allocated or formatted.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{LossReason, NotAcquiredReason, QuorumError};
use crate::machine::{Reply, Tally};
use crate::node::NodeError;

/// Told of what the leases of a manager do; install one with
/// [`LockManager::with_observer`](crate::LockManager::with_observer).
///
/// Called synchronously, inline, from the future that caused the event (never while redlease holds a lock of
/// its own), so keep it short: count, log, or push into a channel. It must not block.
///
/// ```
/// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use redlease::{Config, EventKind, LeaseEvent, LockManager, Observer};
///
/// #[derive(Default)]
/// struct Acquisitions(AtomicUsize);
///
/// impl Observer for Acquisitions {
///     fn event(&self, event: &LeaseEvent<'_>) {
///         if let EventKind::Acquired { .. } = event.kind {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
///
/// # block_on(async {
/// let counter = Arc::new(Acquisitions::default());
/// let manager = LockManager::single(MapNode::default(), Config::default())?
///     .with_observer(Arc::clone(&counter));
/// manager.lock("job").try_acquire().await?.release().await?;
/// assert_eq!(counter.0.load(Ordering::Relaxed), 1);
/// # Ok::<(), redlease::Error>(())
/// # }).unwrap();
/// ```
pub trait Observer: Send + Sync + 'static {
    /// One event.
    fn event(&self, event: &LeaseEvent<'_>);
}

impl<O: Observer + ?Sized> Observer for std::sync::Arc<O> {
    fn event(&self, event: &LeaseEvent<'_>) {
        (**self).event(event)
    }
}

/// Two observers, both told of every event (first `.0`, then `.1`): e.g. metrics and a test history.
/// Nest pairs for more.
impl<A: Observer, B: Observer> Observer for (A, B) {
    fn event(&self, event: &LeaseEvent<'_>) {
        self.0.event(event);
        self.1.event(event);
    }
}

/// Identifies one acquisition (and the lease it produced) within this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(u64);

static NEXT_LEASE: AtomicU64 = AtomicU64::new(1);

impl LeaseId {
    pub(crate) fn next() -> Self {
        Self(NEXT_LEASE.fetch_add(1, Ordering::Relaxed))
    }

    /// The number, unique within this process.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One thing a lease (or an acquisition) did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LeaseEvent<'a> {
    /// The lock key.
    pub key: &'a str,
    /// The acquisition this event belongs to.
    pub lease: LeaseId,
    /// When it happened, on the manager's timer.
    pub at: Instant,
    /// What happened.
    pub kind: EventKind<'a>,
}

/// What a [`LeaseEvent`] reports.
///
/// Variants and fields may be added: match with `..` and a wildcard arm.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum EventKind<'a> {
    /// One acquisition attempt (one round of node calls) ended. Precedes the attempt's
    /// [`Acquired`](Self::Acquired), or the acquisition's [`NotAcquired`](Self::NotAcquired) if it was the last.
    #[non_exhaustive]
    Attempt {
        /// 1 for the first attempt of the acquisition.
        attempt: u32,
        /// Every node's reply.
        nodes: Nodes<'a>,
        /// How long the round took.
        round: Duration,
        /// Won, or why not.
        outcome: AttemptOutcome,
    },
    /// The lock was acquired.
    #[non_exhaustive]
    Acquired {
        /// The validity deadline (drift-adjusted, from the start of the winning round).
        valid_until: Instant,
        /// The fencing token, for fenced locks.
        fence: Option<u64>,
        /// Attempts made, the winning one included.
        attempts: u32,
        /// Time from the acquisition's start until now.
        waited: Duration,
        /// Whether an earlier attempt found the lock held by another owner: the acquisition waited for it.
        contended: bool,
    },
    /// The acquisition gave up.
    #[non_exhaustive]
    NotAcquired {
        /// Why its last attempt failed.
        reason: NotAcquiredReason,
        /// Attempts made.
        attempts: u32,
        /// Time from the acquisition's start until now.
        waited: Duration,
        /// Whether any attempt found the lock held by another owner.
        contended: bool,
    },
    /// One extension round ended (manual or automatic), with every node's reply. Precedes its outcome:
    /// [`Extended`](Self::Extended), [`AtRisk`](Self::AtRisk) or [`Lost`](Self::Lost).
    #[non_exhaustive]
    Extension {
        /// `true` for automatic renewal, `false` for [`Lease::extend`](crate::Lease::extend).
        renewal: bool,
        /// Every node's reply.
        nodes: Nodes<'a>,
        /// How long the round took.
        round: Duration,
    },
    /// An extension succeeded and moved the validity deadline (earlier or later).
    #[non_exhaustive]
    Extended {
        /// The new deadline.
        valid_until: Instant,
        /// `true` for automatic renewal, `false` for [`Lease::extend`](crate::Lease::extend).
        renewal: bool,
    },
    /// The deadline was brought forward before an extension round with a TTL shorter than what the lease had
    /// left: the lease counts only on the TTL it asked for (the nodes keep the key's longer TTL, since an
    /// extension never shortens a key).
    Capped {
        /// The new, earlier deadline.
        valid_until: Instant,
    },
    /// A renewal round failed without proving the lease gone: the lease is at risk, and renewal retries while
    /// validity remains.
    #[non_exhaustive]
    AtRisk {
        /// The unchanged deadline.
        valid_until: Instant,
        /// The node failures of the round, if any (none when the round ran out of validity).
        error: Option<&'a QuorumError>,
        /// `true` when this failure put a held lease at risk; `false` when it was at risk already (a retry
        /// failed too).
        first: bool,
    },
    /// An extension succeeded on a lease that was [at risk](Self::AtRisk): it is held again. Follows the
    /// [`Extended`](Self::Extended) event of that extension.
    #[non_exhaustive]
    Recovered {
        /// The new deadline.
        valid_until: Instant,
        /// Time since the first failed round of this at-risk period.
        at_risk_for: Duration,
    },
    /// The lease was lost. Emitted once, when it is first known, and never after a release.
    #[non_exhaustive]
    Lost {
        /// Why.
        reason: LossReason,
        /// The deadline the lease had: the loss is reported no later than this unless nothing watched the
        /// lease (no loss signal, no renewal, no state query) when it passed.
        valid_until: Instant,
        /// Time from the acquisition until the loss was noticed.
        held_for: Duration,
    },
    /// The holder released (or dropped) a lease that was still held.
    #[non_exhaustive]
    Released {
        /// `true` when the lease was dropped rather than released.
        dropped: bool,
        /// Time from the acquisition until the release.
        held_for: Duration,
    },
    /// The holder handed the lease to another process ([`Lease::handoff`](crate::Lease::handoff)): it ends
    /// here without a release, and its key stays on the nodes for the process that resumes it.
    #[non_exhaustive]
    HandedOff {
        /// Time from the acquisition (or resumption) until the handoff.
        held_for: Duration,
    },
    /// A lease handed off by another process was resumed ([`Lock::resume`](crate::Lock::resume)): this
    /// process holds it from now on, valid from the resuming extension round.
    #[non_exhaustive]
    Resumed {
        /// The validity deadline (drift-adjusted, from the start of the resuming round).
        valid_until: Instant,
        /// The fencing token the lease was acquired with, for fenced locks.
        fence: Option<u64>,
    },
    /// The compare-and-delete round of [`Lease::release`](crate::Lease::release) ended (also for a lease
    /// lost before the release). Nodes that failed keep the key until its TTL runs out.
    #[non_exhaustive]
    ReleaseRound {
        /// Every node's reply: yes = deleted, no = not held any more.
        nodes: Nodes<'a>,
        /// How long the round took.
        round: Duration,
    },
    /// A node's server has a new [`RunId`](crate::RunId): it restarted (or a failover replaced it) since
    /// this manager last talked to it, and may have forgotten every lock. In Redlock mode its answers are
    /// not counted toward a quorum for the [restart quarantine](crate::Config::with_restart_quarantine).
    /// Reported by the acquisition that noticed it.
    #[non_exhaustive]
    NodeRestarted {
        /// The node's index.
        node: usize,
        /// How long its answers are not counted (zero in single mode, or with the quarantine off).
        quarantined_for: Duration,
    },
    /// A write of this lease (its acquisition or an extension) was acknowledged by fewer replicas than the
    /// [`Durability`](crate::Durability) policy asks for, within its timeout. Under
    /// [`BestEffort`](crate::Durability::BestEffort) the lease goes on; under
    /// [`Required`](crate::Durability::Required) the operation failed.
    #[non_exhaustive]
    NotReplicated {
        /// Replicas that acknowledged (`None` when the wait itself failed).
        acknowledged: Option<u32>,
        /// Replicas the policy asks for.
        wanted: u32,
        /// The node's error, when the wait failed (e.g. [`Unsupported`](crate::NodeErrorKind::Unsupported)
        /// for a server without `WAITAOF`).
        error: Option<&'a NodeError>,
    },
    /// The fence counter issued `fence`, no larger than `previous`, which this process already received from
    /// it: the server lost writes. The acquisition was refused
    /// ([`NodeErrorKind::FenceRegressed`](crate::NodeErrorKind::FenceRegressed)).
    #[non_exhaustive]
    FenceRegressed {
        /// The number just issued.
        fence: u64,
        /// The largest number this process received from the counter before.
        previous: u64,
    },
    /// A compare-and-delete of a token that may have been left on some nodes ended.
    #[non_exhaustive]
    Cleanup {
        /// Why the token had to be deleted.
        cause: CleanupCause,
        /// The nodes' replies (nodes that were not targeted answer no).
        nodes: Nodes<'a>,
        /// How long the round took.
        round: Duration,
    },
}

/// How one acquisition attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// Acquired.
    #[non_exhaustive]
    Won {
        /// The validity granted: from the end of the round to the validity deadline.
        validity: Duration,
    },
    /// Not acquired, for this reason.
    Failed(NotAcquiredReason),
}

/// Why a token was deleted by a [`Cleanup`](EventKind::Cleanup).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CleanupCause {
    /// A failed acquisition attempt may have written its token on some nodes.
    FailedAttempt,
    /// A token an earlier attempt retired (its clean-up did not answer), deleted again in the background.
    StaleToken,
    /// An acquisition or a release was cancelled (its future dropped) midway.
    Cancelled,
    /// A lease was dropped without being released.
    Dropped,
    /// A lease was lost; its token may remain on some nodes.
    Lost,
}

impl CleanupCause {
    /// A short snake-case name, used as a metric label and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailedAttempt => "failed_attempt",
            Self::StaleToken => "stale_token",
            Self::Cancelled => "cancelled",
            Self::Dropped => "dropped",
            Self::Lost => "lost",
        }
    }
}

/// Every node's reply in one round, by node index (the order the nodes were given to the manager). A view
/// into the round's tally: building it allocates nothing.
#[derive(Clone, Copy)]
pub struct Nodes<'a> {
    tally: &'a Tally,
}

/// One node's reply in a round; see [`Nodes`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum NodeReply<'a> {
    /// Did what was asked (acquired, extended, deleted).
    Yes,
    /// Definitely refused: held by another owner (acquire), or not held by ours (extend, release).
    No,
    /// Failed: an error or a timeout.
    Failed(&'a NodeError),
    /// No reply: the round was decided without it and stopped waiting.
    Abandoned,
}

impl<'a> Nodes<'a> {
    pub(crate) fn new(tally: &'a Tally) -> Self {
        Self { tally }
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.tally.replies().len()
    }

    /// Always `false`: a manager has at least one node.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Node `index`'s reply.
    pub fn get(&self, index: usize) -> Option<NodeReply<'a>> {
        let reply = self.tally.replies().get(index)?;
        Some(match reply {
            Some(Reply::Yes) => NodeReply::Yes,
            Some(Reply::No) => NodeReply::No,
            Some(Reply::Failed(e)) => NodeReply::Failed(e),
            None => NodeReply::Abandoned,
        })
    }

    /// Every reply, in node order.
    pub fn iter(&self) -> impl Iterator<Item = NodeReply<'a>> + 'a {
        let tally = self.tally;
        (0..tally.replies().len()).filter_map(move |i| Nodes { tally }.get(i))
    }

    /// Nodes that answered yes.
    pub fn yes(&self) -> usize {
        self.tally.yes()
    }

    /// Nodes that answered no.
    pub fn no(&self) -> usize {
        self.tally.no()
    }

    /// Nodes that failed.
    pub fn failed(&self) -> usize {
        self.errors().count()
    }

    /// Nodes whose reply the round did not wait for.
    pub fn abandoned(&self) -> usize {
        self.tally.pending()
    }

    /// The yes votes the round needed (the quorum; every node for a clean-up's success).
    pub fn required(&self) -> usize {
        self.tally.required()
    }

    /// The failures, as `(node index, error)`, in index order.
    pub fn errors(&self) -> impl Iterator<Item = (usize, &'a NodeError)> + 'a {
        self.tally
            .replies()
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Some(Reply::Failed(e)) => Some((i, e)),
                _ => None,
            })
    }
}

/// Compact: `[yes, no, failed(timeout), abandoned]`.
impl fmt::Debug for Nodes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, reply) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match reply {
                NodeReply::Yes => f.write_str("yes")?,
                NodeReply::No => f.write_str("no")?,
                NodeReply::Failed(e) => write!(f, "failed({})", e.kind().as_str())?,
                NodeReply::Abandoned => f.write_str("abandoned")?,
            }
        }
        f.write_str("]")
    }
}

/// The snake-case name of a [`NotAcquiredReason`], for metric labels and log fields.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) fn not_acquired_str(reason: NotAcquiredReason) -> &'static str {
    match reason {
        NotAcquiredReason::Contended => "contended",
        NotAcquiredReason::TooFewNodes => "too_few_nodes",
        NotAcquiredReason::ValidityExhausted => "validity_exhausted",
        NotAcquiredReason::Refused => "refused",
        NotAcquiredReason::DeadlinePassed => "deadline_passed",
        NotAcquiredReason::NotReplicated => "not_replicated",
    }
}

/// The snake-case name of a [`LossReason`], for metric labels and log fields.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) fn loss_str(reason: LossReason) -> &'static str {
    match reason {
        LossReason::Expired => "expired",
        LossReason::NotHeld => "not_held",
        LossReason::ExtendFailed => "extend_failed",
        LossReason::Released => "released",
        LossReason::Suspended => "suspended",
        LossReason::HoldLimit => "hold_limit",
    }
}

/// Where every event also goes (the `tracing` feature's log lines: the `trace` module).
#[derive(Clone, Copy)]
pub(crate) struct Sink {
    /// Gives it one event.
    pub(crate) emit: fn(&LeaseEvent<'_>),
    /// Whether anything may record what it is given now (read before an event's fields are computed, on
    /// every operation: a cheap check).
    pub(crate) listening: fn() -> bool,
}

/// The observer of a manager, if any, and a sink (the `tracing` feature's), with the calls the driver makes.
#[derive(Clone, Default)]
pub(crate) struct Hook {
    observer: Option<std::sync::Arc<dyn Observer>>,
    sink: Option<Sink>,
}

impl Hook {
    /// A hook that gives every event to `sink` (and to no observer yet).
    pub(crate) fn with_sink(sink: Option<Sink>) -> Self {
        Self {
            observer: None,
            sink,
        }
    }

    /// This hook with `observer` (replacing any earlier one), keeping its sink.
    pub(crate) fn observed(&self, observer: std::sync::Arc<dyn Observer>) -> Self {
        Self {
            observer: Some(observer),
            sink: self.sink,
        }
    }

    /// Whether anything listens: callers check this before computing an event's fields. With a sink, while
    /// it says it listens (the `tracing` feature: while a subscriber may record anything at all; which
    /// events it records, it decides per call site).
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.observer.is_some() || self.sink.is_some_and(|s| (s.listening)())
    }

    #[inline]
    pub(crate) fn emit(&self, key: &str, lease: LeaseId, at: Instant, kind: EventKind<'_>) {
        if !self.active() {
            return;
        }
        let event = LeaseEvent {
            key,
            lease,
            at,
            kind,
        };
        if let Some(sink) = self.sink {
            (sink.emit)(&event);
        }
        if let Some(o) = &self.observer {
            o.event(&event);
        }
    }
}
