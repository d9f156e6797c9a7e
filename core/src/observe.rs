//! The lease event hook: what the leases of a manager do, for metrics, logs and test histories.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{LossReason, NotAcquiredReason, QuorumError};

/// Told of what the leases of a manager do; install one with
/// [`LockManager::with_observer`](crate::LockManager::with_observer).
///
/// Called synchronously, inline, from the future that caused the event (never while redlease holds a lock of
/// its own), so keep it short: count, log, or push into a channel. It must not block.
///
/// ```
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
/// # redlease_testkit::block_on(async {
/// let counter = Arc::new(Acquisitions::default());
/// let manager = LockManager::single(redlease_testkit::MemoryNode::new(), Config::default())?
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
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum EventKind<'a> {
    /// The lock was acquired.
    Acquired {
        /// The validity deadline (drift-adjusted, from the start of the winning round).
        valid_until: Instant,
        /// The fencing token, for fenced locks.
        fence: Option<u64>,
        /// Attempts made, the winning one included.
        attempts: u32,
        /// Time from the acquisition's start until now.
        waited: Duration,
    },
    /// The acquisition gave up.
    NotAcquired {
        /// Why its last attempt failed.
        reason: NotAcquiredReason,
        /// Attempts made.
        attempts: u32,
        /// Time from the acquisition's start until now.
        waited: Duration,
    },
    /// An extension succeeded and moved the validity deadline (earlier or later).
    Extended {
        /// The new deadline.
        valid_until: Instant,
        /// `true` for automatic renewal, `false` for [`Lease::extend`](crate::Lease::extend).
        renewal: bool,
    },
    /// The deadline was brought forward before an extension round with a TTL shorter than what the lease had
    /// left: the node may apply the shorter TTL whatever becomes of the reply, so the holder must not rely on
    /// the old deadline meanwhile.
    Capped {
        /// The new, earlier deadline.
        valid_until: Instant,
    },
    /// A renewal round failed without proving the lease gone: the lease is at risk, and renewal retries while
    /// validity remains.
    AtRisk {
        /// The unchanged deadline.
        valid_until: Instant,
        /// The node failures of the round, if any (none when the round ran out of validity).
        error: Option<&'a QuorumError>,
    },
    /// The lease was lost. Emitted once, when it is first known, and never after a release.
    Lost {
        /// Why.
        reason: LossReason,
        /// The deadline the lease had: the loss is reported no later than this unless nothing watched the
        /// lease (no loss signal, no renewal, no state query) when it passed.
        valid_until: Instant,
    },
    /// The holder released (or dropped) a lease that was still held.
    Released {
        /// `true` when the lease was dropped rather than released.
        dropped: bool,
        /// Time from the acquisition until the release.
        held_for: Duration,
    },
}

/// The observer of a manager, if any, with the one call the driver makes.
#[derive(Clone, Default)]
pub(crate) struct Hook(Option<std::sync::Arc<dyn Observer>>);

impl Hook {
    pub(crate) fn new(observer: std::sync::Arc<dyn Observer>) -> Self {
        Self(Some(observer))
    }

    #[inline]
    pub(crate) fn emit(&self, key: &str, lease: LeaseId, at: Instant, kind: EventKind<'_>) {
        if let Some(o) = &self.0 {
            o.event(&LeaseEvent {
                key,
                lease,
                at,
                kind,
            });
        }
    }
}
