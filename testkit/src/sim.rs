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

use crate::{EventKind, History};
use redlease::{Config, ConfigError, LockManager, RedisNode, Sleep, Task, Timer};

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
///
/// ```
/// use std::time::Duration;
/// use redlease::{Config, LockManager, Timer};
/// use redlease_testkit::{MemoryNode, VirtualClock, block_on};
///
/// let clock = VirtualClock::new();
/// let node = MemoryNode::with_timer(clock.clone());
/// let manager = LockManager::single(node, Config::default())?.with_timer(clock.clone());
/// let lease = block_on(manager.lock("job").try_acquire())?; // 30 s
///
/// // Time stands still until moved: the lease ends when the clock passes its deadline, not before.
/// let left = lease.valid_until() - clock.now();
/// clock.advance(left - Duration::from_millis(1));
/// assert!(lease.is_held());
/// clock.advance(Duration::from_millis(1));
/// assert!(!lease.is_held());
/// assert!(clock.elapsed() < Duration::from_secs(30)); // validity ends before the key's TTL
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
    inbox: Mutex<Vec<(LocalTask, Option<u64>)>>,
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

struct SimTask {
    future: LocalTask,
    waker: Arc<TaskWaker>,
    /// The client this task belongs to ([`Sim::client`]), if any: paused with it.
    group: Option<u64>,
}

/// The end of the pause that covers `now` for `group` (following back-to-back pauses), if it is paused.
fn paused_until(
    pauses: &BTreeMap<u64, Vec<(Instant, Instant)>>,
    group: u64,
    now: Instant,
) -> Option<Instant> {
    let windows = pauses.get(&group)?;
    let mut until: Option<Instant> = None;
    loop {
        let at = until.unwrap_or(now);
        let next = windows
            .iter()
            .filter(|(start, end)| *start <= at && at < *end)
            .map(|(_, end)| *end)
            .max();
        match next {
            Some(end) if until.is_none_or(|u| end > u) => until = Some(end),
            _ => return until,
        }
    }
}

/// A deterministic executor on a [`VirtualClock`], with clients that can be paused.
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
///
/// Tasks spawned through [`client`](Self::client) belong to that client and stop together when it is
/// [paused](Self::pause), the way a GC pause or `SIGSTOP` stops a process: none of them is polled until the
/// pause ends, their timers fire but the wake-ups wait, and meanwhile virtual time, the network and other
/// clients go on.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use redlease::Timer;
/// use redlease_testkit::Sim;
///
/// let mut sim = Sim::new(1);
/// let clock = sim.clock();
/// let t0 = clock.now();
/// let woke_at = Arc::new(Mutex::new(None));
/// let (c, w) = (clock.clone(), woke_at.clone());
/// sim.client(1).spawn(async move {
///     c.sleep_until(c.now() + Duration::from_secs(1)).await;
///     *w.lock().unwrap() = Some(c.now());
/// });
/// sim.run_for(Duration::from_millis(100)); // the client now sleeps until t0 + 1 s
/// sim.pause(1, Duration::from_secs(5)); // stopped from 0.1 s to 5.1 s
/// sim.run_until_idle(Duration::from_secs(60));
/// assert_eq!(*woke_at.lock().unwrap(), Some(t0 + Duration::from_millis(5_100)));
/// ```
pub struct Sim {
    clock: VirtualClock,
    seed: u64,
    rng: Jitter,
    queue: Arc<Queue>,
    tasks: Vec<Option<SimTask>>,
    /// Tasks in `tasks` not yet finished.
    live: usize,
    /// Polls allowed at one virtual instant before the run is declared a livelock.
    max_polls_per_instant: u64,
    /// Pause windows `[start, end)` per client.
    pauses: BTreeMap<u64, Vec<(Instant, Instant)>>,
    /// Tasks woken while their client was paused, in wake order.
    deferred: Vec<usize>,
    /// The earliest end of a pause in `pauses` (when to forget it).
    prune_at: Option<Instant>,
    /// Jitter seeds handed out by [`Sim::seeded`] so far.
    managers: std::sync::atomic::AtomicU64,
    /// The histories of [`Sim::history`], told of every pause.
    histories: Vec<History>,
    /// Every pause so far as `(client, start, end)`, for a history taken after it.
    pause_log: Vec<(u64, Instant, Instant)>,
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
/// [`LockManager::with_spawner`](redlease::LockManager::with_spawner). One from [`Sim::client`] spawns into
/// that client's group (paused with it).
#[derive(Clone)]
pub struct SimSpawner {
    queue: Arc<Queue>,
    group: Option<u64>,
}

impl std::fmt::Debug for SimSpawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.group {
            Some(g) => write!(f, "SimSpawner(client {g})"),
            None => f.write_str("SimSpawner"),
        }
    }
}

impl SimSpawner {
    /// Queues `task` to run on the simulation.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.queue
            .inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((Box::pin(task), self.group));
    }

    /// The client whose tasks this spawner creates, if any.
    pub fn client(&self) -> Option<u64> {
        self.group
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
            live: 0,
            max_polls_per_instant: 1_000_000,
            pauses: BTreeMap::new(),
            deferred: Vec::new(),
            prune_at: None,
            managers: std::sync::atomic::AtomicU64::new(0),
            histories: Vec::new(),
            pause_log: Vec::new(),
        }
    }

    /// A [`History`] that knows this simulation: every client pause ([`pause`](Self::pause),
    /// [`pause_at`](Self::pause_at), [`random_pauses`](Self::random_pauses)), before or after this call, is
    /// recorded in it as [`EventKind::Paused`](crate::EventKind::Paused) of that client, so that
    /// [`History::check`] knows a paused client could not learn of its loss (no need to record pauses by
    /// hand); and its [timeline](History::timeline) counts from the simulation's start. Record each
    /// client's leases under the client number its manager's spawner pauses
    /// ([`history.recorder(id)`](History::recorder) with [`Sim::client(id)`](Self::client)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlease::Config;
    /// use redlease_testkit::{MemoryNode, Sim};
    ///
    /// let mut sim = Sim::new(3);
    /// let history = sim.history();
    /// let node = MemoryNode::with_timer(sim.clock());
    /// let manager = sim
    ///     .single(node, Config::default().with_expiry(Duration::from_secs(2)))
    ///     .unwrap()
    ///     .with_spawner(sim.client(1))
    ///     .with_observer(history.recorder(1));
    /// let lock = manager.lock("job").auto_renew(Duration::from_millis(500));
    /// let lease = sim.block_on(lock.try_acquire()).unwrap();
    /// // Client 1 stops for 5 s: its renewals stop, the lease expires on the server meanwhile, and the client
    /// // learns of the loss only when it runs again — which the checker accepts, knowing of the pause.
    /// sim.pause(1, Duration::from_secs(5));
    /// sim.run_for(Duration::from_secs(6));
    /// assert!(!lease.is_held());
    /// assert_eq!(history.check(), Ok(()));
    /// ```
    pub fn history(&mut self) -> History {
        let origin = self
            .clock
            .now()
            .checked_sub(self.clock.elapsed())
            .unwrap_or_else(|| self.clock.now());
        let history = History::starting_at(origin);
        for &(client, start, end) in &self.pause_log {
            history.record(client, "", start, EventKind::Paused { until: end });
        }
        self.histories.push(history.clone());
        history
    }

    /// `config` with its retry jitter seeded from the simulation's seed, unless it has a
    /// [`with_jitter_seed`](Config::with_jitter_seed) of its own. The n-th call gives the n-th seed of a sequence
    /// derived from the simulation's seed (so two managers do not retry in lockstep), which makes a run
    /// replay exactly: without it each manager draws its jitter from the OS and no two runs of one seed
    /// retry at the same instants.
    pub fn seeded(&self, config: Config) -> Config {
        if config.jitter_seed().is_some() {
            return config;
        }
        let n = self.managers.fetch_add(1, Ordering::Relaxed);
        let seed =
            Jitter::from_seed(self.seed ^ n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .next_u64();
        config.with_jitter_seed(seed)
    }

    /// A single-authority manager on this simulation: [`seeded`](Self::seeded) jitter, the virtual clock as
    /// its timer and [`spawner`](Self::spawner) as its spawner (replace it with
    /// `.with_spawner(sim.client(id))` for a client that can be [paused](Self::pause)).
    ///
    /// # Errors
    /// As [`LockManager::single`].
    pub fn single(
        &self,
        node: impl RedisNode + 'static,
        config: Config,
    ) -> Result<LockManager, ConfigError> {
        Ok(LockManager::single(node, self.seeded(config))?
            .with_timer(self.clock())
            .with_spawner(self.spawner()))
    }

    /// A Redlock manager on this simulation, wired as in [`single`](Self::single).
    ///
    /// # Errors
    /// As [`LockManager::redlock`].
    pub fn redlock<I>(&self, nodes: I, config: Config) -> Result<LockManager, ConfigError>
    where
        I: IntoIterator,
        I::Item: RedisNode + 'static,
    {
        Ok(LockManager::redlock(nodes, self.seeded(config))?
            .with_timer(self.clock())
            .with_spawner(self.spawner()))
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

    /// A spawner for background tasks that belong to no client (never paused): the network, servers.
    pub fn spawner(&self) -> SimSpawner {
        SimSpawner {
            queue: Arc::clone(&self.queue),
            group: None,
        }
    }

    /// A spawner for the tasks of client `id`: give it to that client's
    /// [`LockManager::with_spawner`](redlease::LockManager::with_spawner) so its renewals and clean-ups stop
    /// when the client is [paused](Self::pause).
    pub fn client(&self, id: u64) -> SimSpawner {
        SimSpawner {
            queue: Arc::clone(&self.queue),
            group: Some(id),
        }
    }

    /// Spawns a background task (belonging to no client).
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.spawner().spawn(task);
    }

    /// Runs `action` at virtual instant `at` (on the next poll if `at` has passed), in a task of no client
    /// (never paused): something that happens to the world at a chosen moment — a node restarting
    /// ([`MemoryNode::restart`](crate::MemoryNode::restart)), a server's clock stepping
    /// ([`MemoryNode::step_clock_forward`](crate::MemoryNode::step_clock_forward)), a client's clock jumping
    /// ([`SkewedClock::step_forward`](crate::SkewedClock::step_forward)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlease::{Config, Timer};
    /// use redlease_testkit::{MemoryNode, Sim};
    ///
    /// let mut sim = Sim::new(5);
    /// let node = MemoryNode::with_timer(sim.clock());
    /// let manager = sim.single(node.clone(), Config::default()).unwrap();
    /// let lock = manager.lock("job").expiry(Duration::from_secs(10)).auto_renew(Duration::from_secs(1));
    /// let lease = sim.block_on(lock.try_acquire()).unwrap();
    /// // The server restarts without persistence 2.5 s into the lease: the next renewal finds no key.
    /// let restart = node.clone();
    /// sim.at(sim.clock().now() + Duration::from_millis(2_500), move || restart.restart());
    /// sim.block_on(lease.lost());
    /// assert!(!lease.is_held());
    /// assert!(sim.clock().elapsed() < Duration::from_secs(4), "lost at the first renewal after it");
    /// ```
    pub fn at(&self, at: Instant, action: impl FnOnce() + Send + 'static) {
        let clock = self.clock.clone();
        self.spawn(async move {
            clock.sleep_until(at).await;
            action();
        });
    }

    /// Stops client `client` for `duration` from now: none of its tasks is polled until then. A history from
    /// [`Sim::history`] records the pause by itself (one from [`History::new`] needs an
    /// [`EventKind::Paused`] record by hand, or [`History::check`] reports the loss the client learns at
    /// the pause's end as late).
    pub fn pause(&mut self, client: u64, duration: Duration) {
        let now = self.clock.now();
        self.pause_at(client, now, duration);
    }

    /// Stops client `client` for `duration` from `at` (which may be in the future).
    pub fn pause_at(&mut self, client: u64, at: Instant, duration: Duration) {
        if duration.is_zero() {
            return;
        }
        let end = at.checked_add(duration).unwrap_or(at);
        self.pauses.entry(client).or_default().push((at, end));
        self.pause_log.push((client, at, end));
        for history in &self.histories {
            history.record(client, "", at, EventKind::Paused { until: end });
        }
        self.prune_at = Some(self.prune_at.map_or(end, |p| p.min(end)));
    }

    /// Schedules `count` pauses of client `client` at instants uniform over the next `horizon`, each lasting
    /// up to `max_pause` (uniform), drawn from `seed`; returns them as `(start, duration)`.
    pub fn random_pauses(
        &mut self,
        client: u64,
        seed: u64,
        horizon: Duration,
        count: usize,
        max_pause: Duration,
    ) -> Vec<(Instant, Duration)> {
        let mut rng = Jitter::from_seed(seed);
        let now = self.clock.now();
        let pauses: Vec<(Instant, Duration)> = (0..count)
            .map(|_| {
                let at = now + horizon.mul_f64(rng.next_unit());
                (at, max_pause.mul_f64(rng.next_unit()))
            })
            .collect();
        for &(at, d) in &pauses {
            self.pause_at(client, at, d);
        }
        pauses
    }

    /// Whether client `client` is paused now.
    pub fn is_paused(&self, client: u64) -> bool {
        paused_until(&self.pauses, client, self.clock.now()).is_some()
    }

    /// Background tasks not yet finished (paused ones included).
    pub fn live_tasks(&self) -> usize {
        self.live
            + self
                .queue
                .inbox
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len()
    }

    fn adopt_inbox(&mut self) {
        let new: Vec<(LocalTask, Option<u64>)> =
            std::mem::take(&mut *self.queue.inbox.lock().unwrap_or_else(|p| p.into_inner()));
        for (future, group) in new {
            // Slots are never reused: a stale waker of a finished task finds an empty slot.
            let id = self.tasks.len();
            let waker = Arc::new(TaskWaker {
                id,
                queue: Arc::clone(&self.queue),
                queued: AtomicBool::new(false),
            });
            waker.wake_by_ref();
            self.tasks.push(Some(SimTask {
                future,
                waker,
                group,
            }));
            self.live += 1;
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
        let now = self.clock.now();
        let Some(Some(task)) = self.tasks.get_mut(id) else {
            return;
        };
        if let Some(group) = task.group {
            if paused_until(&self.pauses, group, now).is_some() {
                // Stays marked as queued: further wake-ups add nothing until it is released.
                self.deferred.push(id);
                return;
            }
        }
        task.waker.queued.store(false, Ordering::Release);
        let w = Waker::from(Arc::clone(&task.waker));
        let mut cx = Context::from_waker(&w);
        if task.future.as_mut().poll(&mut cx).is_ready() {
            self.tasks[id] = None;
            self.live -= 1;
        }
    }

    /// Queues the deferred tasks whose client is no longer paused, and forgets pauses that are over.
    fn release_deferred(&mut self) {
        let now = self.clock.now();
        if self.prune_at.is_some_and(|at| at <= now) {
            self.pauses.retain(|_, windows| {
                windows.retain(|(_, end)| *end > now);
                !windows.is_empty()
            });
            self.prune_at = self.pauses.values().flatten().map(|(_, end)| *end).min();
        }
        if self.deferred.is_empty() {
            return;
        }
        let (pauses, tasks) = (&self.pauses, &self.tasks);
        let mut released = Vec::new();
        self.deferred.retain(|&id| {
            let group = tasks.get(id).and_then(Option::as_ref).and_then(|t| t.group);
            let paused = group.is_some_and(|g| paused_until(pauses, g, now).is_some());
            if !paused {
                released.push(id);
            }
            paused
        });
        if !released.is_empty() {
            self.queue
                .ready
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(released);
        }
    }

    /// The next instant something can happen: a timer, or the end of a pause holding back a woken task.
    fn next_wakeup(&self) -> Option<Instant> {
        let now = self.clock.now();
        let resume = self
            .deferred
            .iter()
            .filter_map(|&id| self.tasks.get(id)?.as_ref()?.group)
            .filter_map(|g| paused_until(&self.pauses, g, now))
            .min();
        match (self.clock.next_deadline(), resume) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn advance_to(&mut self, at: Instant) {
        self.clock.advance_to(at);
        self.release_deferred();
    }

    /// Runs `fut` and every spawned task until `fut` completes, advancing virtual time whenever all are idle.
    ///
    /// # Panics
    /// On a deadlock (everything waits and no timer is pending) or a livelock (a million polls without time
    /// moving); the message names the seed.
    pub fn block_on<F: Future>(&mut self, fut: F) -> F::Output {
        match self.drive(fut, None) {
            Some(out) => out,
            None => unreachable!("an unbounded run ends only when its future completes"),
        }
    }

    /// Like [`block_on`](Self::block_on), but drops `fut` right after its `polls`-th poll if it is still
    /// pending (with `polls == 0`, before it was ever polled) and returns `None`; spawned tasks stay.
    ///
    /// Dropping a future after its k-th poll for every k is how to cancel it at each of its await points:
    /// see [`cancel::each_poll`](crate::cancel::each_poll).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlease::Timer;
    /// use redlease_testkit::Sim;
    ///
    /// let mut sim = Sim::new(1);
    /// let clock = sim.clock();
    /// let two_sleeps = |clock: redlease_testkit::VirtualClock| async move {
    ///     clock.sleep_until(clock.now() + Duration::from_secs(1)).await;
    ///     clock.sleep_until(clock.now() + Duration::from_secs(1)).await;
    ///     7
    /// };
    /// assert_eq!(sim.block_on_for_polls(two_sleeps(clock.clone()), 2), None);
    /// assert_eq!(sim.block_on_for_polls(two_sleeps(clock.clone()), 3), Some(7));
    /// ```
    ///
    /// # Panics
    /// As [`block_on`](Self::block_on).
    pub fn block_on_for_polls<F: Future>(&mut self, fut: F, polls: usize) -> Option<F::Output> {
        self.drive(fut, Some(polls))
    }

    #[allow(clippy::panic)]
    fn drive<F: Future>(&mut self, fut: F, mut budget: Option<usize>) -> Option<F::Output> {
        if budget == Some(0) {
            return None;
        }
        let mut fut = std::pin::pin!(fut);
        let main = Arc::new(TaskWaker {
            id: MAIN,
            queue: Arc::clone(&self.queue),
            queued: AtomicBool::new(false),
        });
        main.wake_by_ref();
        let main_waker = Waker::from(Arc::clone(&main));
        let mut polls_here = 0u64;
        // Pauses only end as time moves: after this, `advance_to` releases what they held back.
        self.release_deferred();
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
                        return Some(out);
                    }
                    if let Some(left) = &mut budget {
                        *left -= 1;
                        if *left == 0 {
                            return None;
                        }
                    }
                } else {
                    self.poll_task(id);
                }
                self.adopt_inbox();
            }
            match self.next_wakeup() {
                Some(at) => {
                    self.advance_to(at);
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
        self.release_deferred();
        while self.clock.now() <= until {
            self.adopt_inbox();
            while let Some(id) = self.pop_ready() {
                self.poll_task(id);
                self.adopt_inbox();
            }
            if self.live_tasks() == 0 {
                return true;
            }
            match self.next_wakeup() {
                Some(at) if at <= until => self.advance_to(at),
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
