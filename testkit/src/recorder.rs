//! A [`History`] fed by the core's lease event hook.

use redlease::{EventKind as CoreEvent, LeaseEvent, Observer};

use crate::history::{EventKind, History};

/// Records every lease of a manager into a [`History`]: each acquisition is a client of its own (numbered by
/// its [`LeaseId`](redlease::LeaseId)), acquired, extended and renewed, lost or released exactly as the core
/// reports it — background renewals included, with no instrumentation in the test.
///
/// ```
/// use redlease::{Config, LockManager};
/// use redlease_testkit::{History, MemoryNode};
///
/// # redlease_testkit::block_on(async {
/// let history = History::new();
/// let manager = LockManager::single(MemoryNode::new(), Config::default())?
///     .with_observer(history.clone());
/// manager.lock("job").try_acquire().await?.release().await?;
/// assert_eq!(history.acquisitions(), 1);
/// assert_eq!(history.check(), Ok(()));
/// # Ok::<(), redlease::Error>(())
/// # }).unwrap();
/// ```
impl Observer for History {
    fn event(&self, event: &LeaseEvent<'_>) {
        let kind = match event.kind {
            CoreEvent::Acquired {
                valid_until, fence, ..
            } => EventKind::Acquired { valid_until, fence },
            CoreEvent::Extended { valid_until, .. } | CoreEvent::Capped { valid_until } => {
                EventKind::Extended { valid_until }
            }
            CoreEvent::Resumed {
                valid_until, fence, ..
            } => EventKind::Resumed { valid_until, fence },
            CoreEvent::Lost { .. } => EventKind::Lost,
            CoreEvent::Released { .. } | CoreEvent::HandedOff { .. } => EventKind::Released,
            _ => return,
        };
        self.record(event.lease.get(), event.key, event.at, kind);
    }
}
