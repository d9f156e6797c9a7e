//! The loss signal ([`Lease::lost`](redlease::Lease::lost)) on its own: what it says without waiting, how
//! it prints, the one timer it arms while pending, and that a dropped signal leaves nothing registered.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::task::{Context, Poll, Wake, Waker};

use redlease::{LockManager, LossReason};
use redlease_testkit::{MemoryNode, Sim};

use crate::support::*;

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Counting(AtomicUsize);

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// A single-node manager on `sim`'s clock whose timer counts the sleeps armed on it.
fn counting_manager(sim: &Sim) -> (LockManager, MemoryNode, Arc<AtomicUsize>) {
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    let sleeps = Arc::new(AtomicUsize::new(0));
    let timer = CountingTimer {
        clock,
        sleeps: Arc::clone(&sleeps),
    };
    let manager = LockManager::single(node.clone(), config())
        .unwrap()
        .with_timer(timer);
    (manager, node, sleeps)
}

#[test]
fn a_loss_signal_tells_whether_the_lease_ended_without_waiting() {
    let mut c = Cluster::new(1, 1, config());
    let lock = c.manager.lock("job").expiry(secs(10));
    let released = c.sim.block_on(lock.try_acquire()).unwrap();
    let signal = released.lost();
    assert!(!signal.has_ended(), "held");
    c.sim.block_on(released.release()).unwrap();
    assert!(signal.has_ended(), "released");

    let expired = c.sim.block_on(lock.try_acquire()).unwrap();
    let signal = expired.lost();
    assert!(!signal.has_ended(), "held");
    c.clock.advance(secs(11));
    assert!(signal.has_ended(), "expired");
    assert_eq!(
        c.sim.block_on(signal),
        LossReason::Expired,
        "awaiting it completes at once"
    );
}

#[test]
fn a_loss_signal_debugs_as_its_key_and_whether_the_lease_ended() {
    let mut c = Cluster::new(1, 2, config());
    let lease = c.sim.block_on(c.manager.lock("job").try_acquire()).unwrap();
    let signal = lease.lost();
    let held = format!("{signal:?}");
    assert!(held.starts_with("LossSignal"), "{held}");
    assert!(held.contains("\"job\""), "{held}");
    assert!(held.contains("ended: false"), "{held}");
    c.sim.block_on(lease.release()).unwrap();
    let ended = format!("{signal:?}");
    assert!(ended.contains("ended: true"), "{ended}");
}

/// Polled again and again while the deadline stays where it is (spurious wake-ups, a `select!` loop), a
/// pending signal keeps the one sleep it armed: one timer registration per deadline, not one per poll.
#[test]
fn a_pending_loss_signal_arms_one_sleep_per_deadline_however_often_it_is_polled() {
    let mut sim = Sim::new(3);
    let (manager, _node, sleeps) = counting_manager(&sim);
    let lease = sim
        .block_on(manager.lock("job").expiry(secs(10)).try_acquire())
        .unwrap();
    let mut signal = Box::pin(lease.lost());
    let waker = Waker::from(Arc::new(Counting::default()));
    let before = sleeps.load(SeqCst);
    for _ in 0..5 {
        assert!(
            signal
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
    }
    assert_eq!(sleeps.load(SeqCst) - before, 1, "one sleep for five polls");
}

/// A signal that was polled (and so registered its waker with the lease) and then dropped is forgotten: the
/// lease's end wakes nobody on its behalf.
#[test]
fn a_dropped_loss_signal_is_not_woken_when_the_lease_ends() {
    let mut sim = Sim::new(4);
    let (manager, _node, _) = counting_manager(&sim);
    let lease = sim
        .block_on(manager.lock("job").expiry(secs(10)).try_acquire())
        .unwrap();
    let counting = Arc::new(Counting::default());
    let waker = Waker::from(Arc::clone(&counting));
    let mut signal = Box::pin(lease.lost());
    assert_eq!(
        signal.as_mut().poll(&mut Context::from_waker(&waker)),
        Poll::Pending
    );
    drop(signal);
    sim.block_on(lease.release()).unwrap();
    assert_eq!(counting.0.load(SeqCst), 0, "the dropped signal was woken");
}

/// A signal polled by one task and then by another (moved between tasks, or raced in a `select!` of
/// another task) wakes the task that polled it last when the lease ends, and not the first.
#[test]
fn a_loss_signal_wakes_the_task_that_polled_it_last() {
    let mut sim = Sim::new(5);
    let (manager, _node, _) = counting_manager(&sim);
    let lease = sim
        .block_on(manager.lock("job").expiry(secs(10)).try_acquire())
        .unwrap();
    let (first, last) = (Arc::new(Counting::default()), Arc::new(Counting::default()));
    let mut signal = Box::pin(lease.lost());
    for task in [&first, &last] {
        let waker = Waker::from(Arc::clone(task));
        assert!(
            signal
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
    }
    sim.block_on(lease.release()).unwrap();
    assert_eq!(last.0.load(SeqCst), 1, "the last poller was woken");
    assert_eq!(first.0.load(SeqCst), 0, "the first poller was not");
}
