//! Virtual time and a deterministic single-threaded executor.
//!
//! [`Sim`] runs futures on one thread; when every task is waiting, it jumps the [`VirtualClock`] to the next
//! sleep deadline. A lease's whole 30-second life with renewals takes microseconds, and a run is a pure
//! function of its seed: tasks are polled in FIFO wake order and timers fire in (deadline, creation) order.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use redlease::machine::Jitter;
use redlease::{Sleep, Task, Timer};

struct ClockState {
    origin: Instant,
    now: Instant,
    timers: BTreeMap<(Instant, u64), Waker>,
    next_id: u64,
}

/// A clock that only moves when told to. Cloning shares it.
///
/// As a [`Timer`], its sleeps complete when the clock is advanced past their deadline (by [`Sim`] or by hand
/// with [`advance`](Self::advance)).
#[derive(Clone)]
pub struct VirtualClock {
    state: Arc<Mutex<ClockState>>,
}

impl std::fmt::Debug for VirtualClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VirtualClock(+{:?})", self.elapsed())
    }
}

impl Default for VirtualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl VirtualClock {
    /// A clock starting now (its instants are comparable with `Instant`s but never advance by themselves).
    pub fn new() -> Self {
        let origin = Instant::now();
        Self {
            state: Arc::new(Mutex::new(ClockState {
                origin,
                now: origin,
                timers: BTreeMap::new(),
                next_id: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ClockState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time elapsed on this clock since it was created.
    pub fn elapsed(&self) -> Duration {
        let st = self.lock();
        st.now.saturating_duration_since(st.origin)
    }

    /// Moves the clock forward by `by`, waking every sleep whose deadline is reached.
    pub fn advance(&self, by: Duration) {
        let target = {
            let st = self.lock();
            st.now + by
        };
        self.advance_to(target);
    }

    /// Moves the clock to `target` (never backwards), waking every sleep whose deadline is reached.
    pub fn advance_to(&self, target: Instant) {
        let woken = {
            let mut st = self.lock();
            if target > st.now {
                st.now = target;
            }
            let now = st.now;
            let mut woken = Vec::new();
            while let Some(entry) = st.timers.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                woken.push(entry.remove());
            }
            woken
        };
        for w in woken {
            w.wake();
        }
    }

    /// The earliest pending sleep deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.lock().timers.keys().next().map(|(at, _)| *at)
    }

    /// Number of pending sleeps.
    pub fn pending_sleeps(&self) -> usize {
        self.lock().timers.len()
    }
}

impl Timer for VirtualClock {
    fn now(&self) -> Instant {
        self.lock().now
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(VirtualSleep {
            clock: self.clone(),
            deadline,
            key: None,
        })
    }
}

struct VirtualSleep {
    clock: VirtualClock,
    deadline: Instant,
    key: Option<(Instant, u64)>,
}

impl Future for VirtualSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let mut st = this.clock.lock();
        if st.now >= this.deadline {
            if let Some(key) = this.key.take() {
                st.timers.remove(&key);
            }
            return Poll::Ready(());
        }
        let key = match this.key {
            Some(key) => key,
            None => {
                let key = (this.deadline, st.next_id);
                st.next_id += 1;
                this.key = Some(key);
                key
            }
        };
        st.timers.insert(key, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for VirtualSleep {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.clock.lock().timers.remove(&key);
        }
    }
}

type LocalTask = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Queue {
    ready: Mutex<VecDeque<usize>>,
    inbox: Mutex<Vec<LocalTask>>,
}

struct TaskWaker {
    id: usize,
    queue: Arc<Queue>,
    queued: AtomicBool,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.queue
                .ready
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back(self.id);
        }
    }
}

const MAIN: usize = usize::MAX;

/// A deterministic executor on a [`VirtualClock`].
///
/// ```
/// use std::time::Duration;
/// use redlease::Timer;
/// use redlease_testkit::Sim;
///
/// let mut sim = Sim::new(7);
/// let clock = sim.clock();
/// let slept = sim.block_on(async move {
///     let start = clock.now();
///     clock.sleep_until(start + Duration::from_secs(600)).await;
///     clock.now() - start
/// });
/// assert_eq!(slept, Duration::from_secs(600)); // ten virtual minutes, no real waiting
/// ```
pub struct Sim {
    clock: VirtualClock,
    seed: u64,
    rng: Jitter,
    queue: Arc<Queue>,
    tasks: Vec<Option<(LocalTask, Arc<TaskWaker>)>>,
    /// Polls allowed at one virtual instant before the run is declared a livelock.
    max_polls_per_instant: u64,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("seed", &self.seed)
            .field("clock", &self.clock)
            .field("tasks", &self.live_tasks())
            .finish()
    }
}

/// A handle that spawns onto a [`Sim`] from anywhere (it is `Send + Sync`); pass it to
/// [`LockManager::with_spawner`](redlease::LockManager::with_spawner).
#[derive(Clone)]
pub struct SimSpawner {
    queue: Arc<Queue>,
}

impl std::fmt::Debug for SimSpawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimSpawner")
    }
}

impl SimSpawner {
    /// Queues `task` to run on the simulation.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.queue
            .inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::pin(task));
    }
}

impl redlease::Spawn for SimSpawner {
    fn spawn(&self, task: Task) {
        SimSpawner::spawn(self, task);
    }
}

impl Sim {
    /// A simulation whose randomness derives from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            clock: VirtualClock::new(),
            seed,
            rng: Jitter::from_seed(seed),
            queue: Arc::new(Queue {
                ready: Mutex::new(VecDeque::new()),
                inbox: Mutex::new(Vec::new()),
            }),
            tasks: Vec::new(),
            max_polls_per_instant: 1_000_000,
        }
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The simulation's clock (a [`Timer`]).
    pub fn clock(&self) -> VirtualClock {
        self.clock.clone()
    }

    /// A seeded generator for the test's own random choices (derived from the seed; each call gives a new
    /// independent stream).
    pub fn rng(&mut self) -> Jitter {
        Jitter::from_seed(self.rng.next_u64())
    }

    /// A spawner for background tasks.
    pub fn spawner(&self) -> SimSpawner {
        SimSpawner {
            queue: Arc::clone(&self.queue),
        }
    }

    /// Spawns a background task.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.spawner().spawn(task);
    }

    /// Background tasks not yet finished.
    pub fn live_tasks(&self) -> usize {
        self.tasks.iter().filter(|t| t.is_some()).count()
            + self
                .queue
                .inbox
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len()
    }

    fn adopt_inbox(&mut self) {
        let new: Vec<LocalTask> =
            std::mem::take(&mut *self.queue.inbox.lock().unwrap_or_else(|p| p.into_inner()));
        for task in new {
            let id = self.tasks.len();
            let waker = Arc::new(TaskWaker {
                id,
                queue: Arc::clone(&self.queue),
                queued: AtomicBool::new(false),
            });
            waker.wake_by_ref();
            self.tasks.push(Some((task, waker)));
        }
    }

    fn pop_ready(&self) -> Option<usize> {
        self.queue
            .ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    fn poll_task(&mut self, id: usize) {
        let Some(Some((task, waker))) = self.tasks.get_mut(id) else {
            return;
        };
        waker.queued.store(false, Ordering::Release);
        let w = Waker::from(Arc::clone(waker));
        let mut cx = Context::from_waker(&w);
        if task.as_mut().poll(&mut cx).is_ready() {
            self.tasks[id] = None;
        }
    }

    /// Runs `fut` and every spawned task until `fut` completes, advancing virtual time whenever all are idle.
    ///
    /// # Panics
    /// On a deadlock (everything waits and no timer is pending) or a livelock (a million polls without time
    /// moving); the message names the seed.
    #[allow(clippy::panic)]
    pub fn block_on<F: Future>(&mut self, fut: F) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        let main = Arc::new(TaskWaker {
            id: MAIN,
            queue: Arc::clone(&self.queue),
            queued: AtomicBool::new(false),
        });
        main.wake_by_ref();
        let main_waker = Waker::from(Arc::clone(&main));
        let mut polls_here = 0u64;
        loop {
            self.adopt_inbox();
            while let Some(id) = self.pop_ready() {
                polls_here += 1;
                if polls_here > self.max_polls_per_instant {
                    panic!(
                        "livelock: {} polls without virtual time moving (seed {}; rerun with REDLEASE_SEED={})",
                        polls_here, self.seed, self.seed
                    );
                }
                if id == MAIN {
                    main.queued.store(false, Ordering::Release);
                    let mut cx = Context::from_waker(&main_waker);
                    if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                        return out;
                    }
                } else {
                    self.poll_task(id);
                }
                self.adopt_inbox();
            }
            match self.clock.next_deadline() {
                Some(at) => {
                    self.clock.advance_to(at);
                    polls_here = 0;
                }
                None => panic!(
                    "deadlock: every task waits and no timer is pending (seed {}; rerun with REDLEASE_SEED={})",
                    self.seed, self.seed
                ),
            }
        }
    }

    /// Runs the spawned tasks for `duration` of virtual time.
    pub fn run_for(&mut self, duration: Duration) {
        let clock = self.clock.clone();
        let until = clock.now() + duration;
        self.block_on(async move { clock.sleep_until(until).await });
    }

    /// Runs the spawned tasks until none is left or `limit` of virtual time has passed; returns whether all
    /// finished.
    pub fn run_until_idle(&mut self, limit: Duration) -> bool {
        let until = self.clock.now() + limit;
        while self.clock.now() < until {
            self.adopt_inbox();
            while let Some(id) = self.pop_ready() {
                self.poll_task(id);
                self.adopt_inbox();
            }
            if self.live_tasks() == 0 {
                return true;
            }
            match self.clock.next_deadline() {
                Some(at) if at <= until => self.clock.advance_to(at),
                _ => break,
            }
        }
        self.live_tasks() == 0
    }
}

/// Runs `test` once per seed in `seeds` (or only for `REDLEASE_SEED` when that variable is set). A panicking
/// seed is reported on stderr as `rerun with REDLEASE_SEED=<seed>` before the panic continues.
pub fn for_each_seed(seeds: std::ops::Range<u64>, mut test: impl FnMut(u64)) {
    let chosen: Vec<u64> = match std::env::var("REDLEASE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => seeds.collect(),
    };
    for seed in chosen {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| test(seed))) {
            eprintln!("failing seed {seed}: rerun with REDLEASE_SEED={seed}");
            resume_unwind(panic);
        }
    }
}

/// Runs a future to completion on the current thread, with real time (for examples and simple tests).
pub fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}
