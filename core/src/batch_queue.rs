//! The shared renewer's queue (see `crate::driver::batch`): which leases it renews, by when each is due, and whether
//! its driver runs. Below the driver (an `Engine` holds one) and above nothing of the lease: a queued lease is
//! a [`Batched`], which `crate::lease` implements.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crate::machine::{RenewalStep, Tally};
use crate::node::Ttl;
use crate::observe::LeaseId;
use crate::time::{SharedTimer, Sleep};
use crate::token::Token;

/// What the shared renewer needs of a lease it renews: the steps of its own renewal loop, before and after a
/// batched round (`crate::lease::Shared` implements it).
pub(crate) trait Batched: Send + Sync {
    fn key(&self) -> &str;
    fn token(&self) -> &Token;
    fn ttl(&self) -> Ttl;
    fn id(&self) -> LeaseId;
    /// The visit at a due entry of `generation` (`lost_at`: the plan was to give up then):
    /// `Some((timeout, valid_until))` if a round should run now (the extension permit is then held until
    /// [`settle`](Self::settle) or [`abandon`](Self::abandon)).
    fn visit(&self, generation: u32, lost_at: bool) -> Option<(Duration, Instant)>;
    /// Before the round's requests are sent: records the round as possibly applied on every node, and
    /// returns the per-node TTLs of earlier extensions not yet confirmed.
    fn prepare(&self) -> Option<Box<[u64]>>;
    /// After the round that started at `started` (`wall_started` on the wall clock) and whose replies for
    /// this lease are `tally` (`valid_until`: the deadline its visit saw): the renewer's next entry for it.
    fn settle(
        &self,
        tally: &Tally,
        started: Instant,
        wall_started: Option<std::time::SystemTime>,
        valid_until: Instant,
    ) -> Option<Entry>;
    /// The round was dropped before it ended: the permit is given back; the next visit is due now.
    fn abandon(&self) -> Option<Entry>;
}

/// The shared renewer of one manager: the leases it renews, by when they are due.
#[derive(Default)]
pub(crate) struct Batcher {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    due: BinaryHeap<Entry>,
    /// A driver task runs (it ends when the queue is empty).
    driving: bool,
    /// While the driver sleeps: until when, and its waker (woken by an entry due earlier).
    sleeping: Option<(Instant, Waker)>,
    /// The queue length at which entries of leases gone since are dropped (see [`Batcher::push`]).
    compact_at: usize,
}

/// The smallest queue that is compacted.
const COMPACT_FLOOR: usize = 256;

/// One lease's next visit in the renewer's queue. Ordered earliest first.
pub(crate) struct Entry {
    at: Instant,
    /// The lease's `batch_gen` when this was queued: a later entry supersedes it.
    generation: u32,
    /// Planned to give the lease up at `at` (no renewal could finish before its deadline).
    lost_at: bool,
    lease: Weak<dyn Batched>,
}

impl Entry {
    pub(crate) fn new(lease: Weak<dyn Batched>, generation: u32, step: RenewalStep) -> Self {
        let (at, lost_at) = match step {
            RenewalStep::RenewAt(t) => (t, false),
            RenewalStep::LostAt(t) => (t, true),
        };
        Self {
            at,
            generation,
            lost_at,
            lease,
        }
    }

    /// The renewer's visit of this entry's lease (see [`Batched::visit`]): the lease, its round's timeout
    /// and the deadline it saw, if a round should run now; `None` if the lease is gone, or the entry was
    /// superseded, or no round runs.
    pub(crate) fn visit(&self) -> Option<(Arc<dyn Batched>, Duration, Instant)> {
        let lease = self.lease.upgrade()?;
        let (timeout, valid_until) = lease.visit(self.generation, self.lost_at)?;
        Some((lease, timeout, valid_until))
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        // `BinaryHeap` is a max-heap: the earliest instant is the greatest.
        other.at.cmp(&self.at)
    }
}

impl Batcher {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pushes `entries` and wakes a sleeping driver if one of them is due earlier than it sleeps. With
    /// `start`, claims the driver's part if none runs: `true` if the caller must start one.
    pub(crate) fn push(&self, entries: impl IntoIterator<Item = Entry>, start: bool) -> bool {
        let (start, wake) = {
            let mut q = self.lock();
            let mut earliest: Option<Instant> = None;
            for due in entries {
                earliest = Some(earliest.map_or(due.at, |e| e.min(due.at)));
                q.due.push(due);
            }
            let Some(earliest) = earliest else {
                return false;
            };
            if q.due.len() >= q.compact_at.max(COMPACT_FLOOR) {
                // An entry holds a `Weak`, which keeps its lease's allocation until the entry comes due: with
                // many short leases (one per job) released long before their next renewal, drop the entries
                // of leases that are gone, so that they stay within twice what is live.
                q.due.retain(|d| d.lease.strong_count() > 0);
                q.compact_at = q.due.len().saturating_mul(2);
            }
            let start = start && !std::mem::replace(&mut q.driving, true);
            let wake = match &q.sleeping {
                Some((until, _)) if earliest < *until => q.sleeping.take().map(|(_, w)| w),
                _ => None,
            };
            (start, wake)
        };
        if let Some(waker) = wake {
            waker.wake();
        }
        start
    }

    /// Waits for the earliest entry to fall due; then takes it and every entry due within `window` of now.
    /// `None` when the queue is empty (the driver then ends; the next entry starts another).
    pub(crate) async fn next_due(
        &self,
        timer: &SharedTimer,
        window: Duration,
    ) -> Option<Vec<Entry>> {
        let mut sleep: Option<(Instant, Sleep)> = None;
        std::future::poll_fn(|cx| {
            loop {
                let now = timer.now();
                let mut q = self.lock();
                let Some(first) = q.due.peek() else {
                    q.driving = false;
                    q.sleeping = None;
                    return Poll::Ready(None);
                };
                if first.at <= now {
                    q.sleeping = None;
                    let horizon = crate::time::add(now, window);
                    let mut due = Vec::new();
                    while q.due.peek().is_some_and(|d| d.at <= horizon) {
                        due.extend(q.due.pop());
                    }
                    return Poll::Ready(Some(due));
                }
                let at = first.at;
                match &mut q.sleeping {
                    Some((until, waker)) if *until == at && waker.will_wake(cx.waker()) => {}
                    slot => *slot = Some((at, cx.waker().clone())),
                }
                drop(q);
                let timer = match &mut sleep {
                    Some((until, s)) if *until == at => s,
                    slot => &mut slot.insert((at, timer.sleep_until(at))).1,
                };
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                sleep = None;
            }
        })
        .await
    }

    /// The driver was dropped before it ended: the next queued entry starts another.
    pub(crate) fn driver_gone(&self) {
        let mut q = self.lock();
        q.driving = false;
        q.sleeping = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering as Atomic};
    use std::task::Wake;

    use crate::time::hand::HandClock;

    /// A queued lease that is never visited (the tests look at the queue alone).
    struct Idle(Token, LeaseId);

    impl Batched for Idle {
        fn key(&self) -> &str {
            "k"
        }
        fn token(&self) -> &Token {
            &self.0
        }
        fn ttl(&self) -> Ttl {
            Ttl::from_millis(1000).unwrap()
        }
        fn id(&self) -> LeaseId {
            self.1
        }
        fn visit(&self, _: u32, _: bool) -> Option<(Duration, Instant)> {
            None
        }
        fn prepare(&self) -> Option<Box<[u64]>> {
            None
        }
        fn settle(
            &self,
            _: &Tally,
            _: Instant,
            _: Option<std::time::SystemTime>,
            _: Instant,
        ) -> Option<Entry> {
            None
        }
        fn abandon(&self) -> Option<Entry> {
            None
        }
    }

    fn idle() -> Arc<Idle> {
        Arc::new(Idle(Token::random().unwrap(), LeaseId::next()))
    }

    fn entry(lease: &Arc<Idle>, at: Instant) -> Entry {
        let lease: Arc<dyn Batched> = lease.clone();
        Entry::new(Arc::downgrade(&lease), 0, RenewalStep::RenewAt(at))
    }

    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Atomic::SeqCst);
        }
    }

    /// `BinaryHeap` orders by `Ord`; `Eq` must agree with it (entries due at the same instant are equal), and
    /// the earliest entry comes out first.
    #[test]
    fn entries_are_equal_when_due_together_and_the_earliest_is_first() {
        let (lease, t0) = (idle(), Instant::now());
        let later = t0 + Duration::from_millis(5);
        assert!(entry(&lease, t0) == entry(&lease, t0));
        assert!(entry(&lease, t0) != entry(&lease, later));
        assert_eq!(entry(&lease, t0).cmp(&entry(&lease, t0)), Ordering::Equal);
        let mut heap: BinaryHeap<Entry> = [later, t0, later + Duration::from_millis(1)]
            .into_iter()
            .map(|at| entry(&lease, at))
            .collect();
        assert_eq!(heap.pop().map(|e| e.at), Some(t0));
        assert_eq!(heap.pop().map(|e| e.at), Some(later));
    }

    /// A push wakes the sleeping driver only for an entry due before it would wake anyway, and claims the
    /// driver's part once.
    #[test]
    fn a_push_wakes_the_driver_only_for_an_earlier_entry() {
        let (lease, t0) = (idle(), Instant::now());
        let until = t0 + Duration::from_millis(100);
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let batcher = Batcher::default();
        assert!(
            batcher.push([entry(&lease, until)], true),
            "first push starts the driver"
        );
        assert!(
            !batcher.push([entry(&lease, until)], true),
            "a driver runs already"
        );
        let sleep = |b: &Batcher| b.lock().sleeping = Some((until, Waker::from(wakes.clone())));
        let woken = || wakes.0.load(Atomic::SeqCst);
        sleep(&batcher);
        // Due at the same instant or later: the driver wakes in time anyway.
        batcher.push([entry(&lease, until)], false);
        batcher.push([entry(&lease, until + Duration::from_millis(1))], false);
        assert_eq!(woken(), 0);
        assert!(batcher.lock().sleeping.is_some());
        // Due earlier: woken, and no longer recorded as sleeping.
        batcher.push([entry(&lease, until - Duration::from_millis(1))], false);
        assert_eq!(woken(), 1);
        assert!(batcher.lock().sleeping.is_none());
        // An empty push changes nothing.
        sleep(&batcher);
        assert!(!batcher.push([], true));
        assert_eq!(woken(), 1);
    }

    /// Entries of leases dropped since are removed once the queue reaches its compaction size (at least
    /// [`COMPACT_FLOOR`]), those of live leases kept; below it nothing is dropped.
    #[test]
    fn a_long_queue_drops_the_entries_of_leases_gone() {
        let (live, t0) = (idle(), Instant::now());
        let batcher = Batcher::default();
        let gone = idle();
        for _ in 0..COMPACT_FLOOR - 2 {
            batcher.push([entry(&gone, t0)], false);
        }
        drop(gone);
        batcher.push([entry(&live, t0)], false);
        assert_eq!(
            batcher.lock().due.len(),
            COMPACT_FLOOR - 1,
            "below the floor"
        );
        batcher.push([entry(&live, t0)], false);
        assert_eq!(batcher.lock().due.len(), 2, "compacted at the floor");
        assert_eq!(batcher.lock().compact_at, 4);
        for _ in 0..10 {
            batcher.push([entry(&live, t0)], false);
        }
        // Twelve live entries: never dropped, and the floor applies again.
        assert_eq!(batcher.lock().due.len(), 12);
    }

    /// The driver sleeps once per deadline however often it is polled, and a push of an earlier entry wakes
    /// the waker of its latest poll (it may have moved to another task); then it takes what fell due.
    #[test]
    fn the_driver_sleeps_once_per_deadline_and_an_earlier_push_wakes_its_latest_waker() {
        let (lease, t0) = (idle(), Instant::now());
        let clock = HandClock::at(t0);
        let timer = clock.timer();
        let batcher = Batcher::default();
        batcher.push([entry(&lease, t0 + Duration::from_millis(100))], true);
        let (first, second) = (
            Arc::new(Wakes(AtomicUsize::new(0))),
            Arc::new(Wakes(AtomicUsize::new(0))),
        );
        let mut due = Box::pin(batcher.next_due(&timer, Duration::ZERO));
        let mut poll = |wakes: &Arc<Wakes>| {
            let waker = Waker::from(wakes.clone());
            due.as_mut()
                .poll(&mut std::task::Context::from_waker(&waker))
        };
        assert!(poll(&first).is_pending());
        assert!(poll(&second).is_pending());
        assert_eq!(clock.sleeps(), 1, "one sleep per deadline");
        batcher.push([entry(&lease, t0 + Duration::from_millis(50))], false);
        assert_eq!(first.0.load(Atomic::SeqCst), 0);
        assert_eq!(
            second.0.load(Atomic::SeqCst),
            1,
            "the latest waker is woken"
        );
        assert!(poll(&second).is_pending());
        assert_eq!(clock.sleeps(), 2, "a new sleep for the new deadline");
        clock.set(t0 + Duration::from_millis(50));
        let Poll::Ready(Some(entries)) = poll(&second) else {
            panic!("the entry due at 50 ms is taken")
        };
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].at, t0 + Duration::from_millis(50));
        assert_eq!(batcher.lock().due.len(), 1, "the later entry stays queued");
    }
}
