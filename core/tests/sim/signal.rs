//! The loss signal ([`Lease::lost`](redlease::Lease::lost)) on its own: what it says without waiting, how
//! it prints, the one timer it arms while pending, and that a dropped signal leaves nothing registered.
//! The same last point for the lease's other waiters: a background renewal (a single lease's and a set's,
//! renewed together) dropped by its executor, and a manual extension dropped while it waited for another's
//! to finish.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use redlease::{LockManager, LossReason};
use redlease_testkit::{Fault, FaultyNode, MemoryNode, Op, Sim};

use crate::support::*;

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Counting(AtomicUsize, AtomicUsize);

impl Counting {
    /// Remembers the count so far.
    fn settle(&self) {
        self.1.store(self.0.load(SeqCst), SeqCst);
    }

    /// The wake-ups since the last [`settle`](Self::settle).
    fn since(&self) -> usize {
        self.0.load(SeqCst) - self.1.load(SeqCst)
    }
}

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

/// Polls `fut` once with a waker that counts its wake-ups (it must not finish), then drops it;
/// [`Counting::since`] then tells the wake-ups after the drop.
fn poll_once_then_drop<F: Future>(fut: F) -> Arc<Counting> {
    let counting = Arc::new(Counting::default());
    let waker = Waker::from(Arc::clone(&counting));
    let mut fut = Box::pin(fut);
    assert!(
        fut.as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    drop(fut);
    counting.settle();
    counting
}

/// A manager whose spawner only keeps the tasks it is given (an executor that will drop them unrun, as a
/// runtime shutting down does), on `sim`'s clock.
fn keeping_manager(sim: &Sim) -> (LockManager, MemoryNode, Arc<Mutex<Vec<redlease::Task>>>) {
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    let kept = Arc::new(Mutex::new(Vec::new()));
    let tasks = Arc::clone(&kept);
    let manager = LockManager::single(node.clone(), config())
        .unwrap()
        .with_timer(clock)
        .with_spawner(move |task| tasks.lock().unwrap().push(task));
    (manager, node, kept)
}

/// A background renewal asleep until its next round, its task's waker registered with the lease, and then
/// dropped by its executor (a runtime shutting down) leaves nothing registered: the lease's release wakes
/// nobody on the dead task's behalf.
#[test]
fn a_background_renewal_dropped_by_its_executor_is_not_woken_when_the_lease_ends() {
    let mut sim = Sim::new(7);
    let (manager, _node, kept) = keeping_manager(&sim);
    let lease = sim
        .block_on(
            manager
                .lock("job")
                .expiry(secs(10))
                .auto_renew(secs(2))
                .try_acquire(),
        )
        .unwrap();
    let task = kept.lock().unwrap().pop().expect("a renewal task");
    let counting = poll_once_then_drop(task);
    sim.block_on(lease.release()).unwrap();
    assert_eq!(counting.since(), 0, "the dropped renewal was woken");
}

/// The same for a set renewed together in the background (one task, one sleep watching every part).
#[test]
fn a_joint_background_renewal_dropped_by_its_executor_is_not_woken_when_its_parts_end() {
    let mut sim = Sim::new(9);
    let (manager, node, kept) = keeping_manager(&sim);
    let set = sim
        .block_on(
            manager
                .lock_all(["a", "b", "c"])
                .expiry(secs(10))
                .auto_renew(secs(2))
                .try_acquire(),
        )
        .unwrap();
    let task = {
        let mut kept = kept.lock().unwrap();
        assert_eq!(kept.len(), 1, "one task renews the set");
        kept.pop().unwrap()
    };
    let counting = poll_once_then_drop(task);
    sim.block_on(set.release()).unwrap();
    assert!(node.keys().is_empty(), "{:?}", node.keys());
    assert_eq!(counting.since(), 0, "the dropped renewal was woken");
}

/// A manual extension waits while another extension of the lease is in flight (one at a time), its waker
/// registered to be woken when that one finishes. Dropped while it waits, it leaves nothing behind: the
/// first extension's end wakes nobody on its behalf.
#[test]
fn an_extension_dropped_while_waiting_for_another_is_not_woken_when_that_one_ends() {
    let mut sim = Sim::new(8);
    let clock = sim.clock();
    let (node, faults) = FaultyNode::new(MemoryNode::with_timer(clock.clone()), clock.clone());
    let manager = LockManager::single(node, config())
        .unwrap()
        .with_timer(clock);
    let lease = sim
        .block_on(manager.lock("job").expiry(secs(10)).try_acquire())
        .unwrap();
    faults.always(Op::Extend, Fault::Delay(ms(200)));
    let mut first = Box::pin(lease.extend(secs(20)));
    let idle = Waker::from(Arc::new(Counting::default()));
    assert!(
        first
            .as_mut()
            .poll(&mut Context::from_waker(&idle))
            .is_pending(),
        "the first extension is delayed"
    );
    let counting = poll_once_then_drop(lease.extend(secs(30)));
    sim.block_on(first).unwrap();
    assert_eq!(faults.calls(Op::Extend), 1, "only the first was sent");
    assert_eq!(counting.since(), 0, "the dropped extension was woken");
    sim.block_on(lease.release()).unwrap();
}
