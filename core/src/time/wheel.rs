//! The timer thread behind [`SystemTimer`](super::SystemTimer).
//!
//! Sleeps register in one of [`SHARDS`] maps, each behind its own lock, chosen per thread: two executor
//! threads arming and dropping round timeouts at once do not contend for one lock. Whether the timer
//! thread must be woken for a new deadline is read from an atomic ([`Wheel::parked_until`]), so arming a
//! sleep later than the one the thread waits for takes one uncontended lock and no more.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, TryLockError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime};

type Key = (Instant, u64);

/// Wall-clock progress beyond monotonic progress, between two looks of the timer thread, taken as a
/// suspend. Leases apply their own, tighter bound (their drift allowance); this only decides when to wake
/// sleepers so that they look.
const SUSPEND_HINT: Duration = Duration::from_millis(200);

/// Maps of sleeps per wheel; a thread registers in one of them (see [`shard_index`]).
const SHARDS: usize = 8;

/// [`Wheel::parked_until`]: the thread is awake and looks at every shard before it parks again.
const AWAKE: u64 = 0;
/// [`Wheel::parked_until`]: the thread is parked with nothing to wait for (until notified).
const PARKED_IDLE: u64 = u64::MAX;

#[derive(Default)]
struct Shard {
    timers: BTreeMap<Key, Waker>,
    next_id: u64,
}

pub(super) struct Wheel {
    shards: [Mutex<Shard>; SHARDS],
    /// Held by the thread from its last look at the shards until it waits on [`wake`](Self::wake); a
    /// sleep that must wake it takes it before notifying, so the notification cannot fall between the
    /// two.
    park: Mutex<()>,
    wake: Condvar,
    /// When the thread's wait ends: [`AWAKE`], [`PARKED_IDLE`], or 1 + ns since [`origin`](Self::origin).
    parked_until: AtomicU64,
    origin: Instant,
    /// The process the thread runs in: after `fork()` the child has the wheel but not the thread.
    pid: u32,
    /// Cleared when the thread exits (it only does by unwinding from an unexpected panic).
    alive: AtomicBool,
}

/// Clears [`Wheel::alive`] however the thread ends.
struct Alive(&'static Wheel);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Release);
    }
}

/// This thread's shard: threads take shards in turn as they first register.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SHARD
        .try_with(|s| {
            let mut i = s.get();
            if i == usize::MAX {
                i = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
                s.set(i);
            }
            i
        })
        .unwrap_or(0)
}

impl Wheel {
    fn new(pid: u32) -> Self {
        Self {
            shards: Default::default(),
            park: Mutex::new(()),
            wake: Condvar::new(),
            parked_until: AtomicU64::new(AWAKE),
            origin: Instant::now(),
            pid,
            alive: AtomicBool::new(true),
        }
    }

    fn shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        self.shards[i % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A shard of a wheel that may have been inherited through `fork()`: taken only if free at once (a
    /// lock held by a parent's thread at the fork is never released in the child). A wheel of this process
    /// is locked as usual.
    ///
    /// A free lock is taken without asking the operating system for the process id (a system call, the
    /// costliest step of arming and dropping a round's timeout); only a busy one makes the difference matter.
    fn try_shard_inherited(&self, i: usize) -> Option<MutexGuard<'_, Shard>> {
        match self.shards[i % SHARDS].try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) if self.pid == pid() => Some(self.shard(i)),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Whether this wheel's thread serves process `me`.
    fn usable(&self, me: u32) -> bool {
        self.alive.load(Ordering::Acquire) && self.pid == me
    }

    /// `at` as a [`parked_until`](Self::parked_until) value (never [`AWAKE`] or [`PARKED_IDLE`]).
    fn encode(&self, at: Instant) -> u64 {
        let ns = at.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(ns)
            .unwrap_or(PARKED_IDLE - 2)
            .min(PARKED_IDLE - 2)
            + 1
    }

    /// The earliest deadline of any shard.
    fn earliest(&self) -> Option<Instant> {
        (0..SHARDS)
            .filter_map(|i| self.shard(i).timers.keys().next().map(|&(at, _)| at))
            .min()
    }

    /// Registers `waker` until `deadline` in shard `i`, and wakes the thread if it waits past it.
    fn register(&self, i: usize, deadline: Instant, waker: Waker) -> Key {
        let mut shard = self.shard(i);
        let key = (deadline, shard.next_id);
        shard.next_id = shard.next_id.wrapping_add(1);
        shard.timers.insert(key, waker);
        drop(shard);
        // After the insert: a thread that parks later sees the entry when it looks again (see `run`).
        let parked = self.parked_until.load(Ordering::SeqCst);
        if parked != AWAKE && (parked == PARKED_IDLE || self.encode(deadline) < parked) {
            let _park = self.park.lock().unwrap_or_else(|p| p.into_inner());
            self.wake.notify_one();
        }
        key
    }

    /// The timer thread: wakes due sleeps, then waits for the earliest deadline or a new earlier one.
    fn run(&'static self) {
        let _alive = Alive(self);
        let mut last = (Instant::now(), SystemTime::now());
        loop {
            let now = Instant::now();
            let wall = SystemTime::now();
            let mono_step = now.saturating_duration_since(last.0);
            let wall_step = wall.duration_since(last.1).unwrap_or_default();
            last = (now, wall);
            // The machine was suspended: wake everybody, so loss signals look at their leases now.
            let suspended = wall_step > mono_step + SUSPEND_HINT;
            let mut due = Vec::new();
            for i in 0..SHARDS {
                let mut shard = self.shard(i);
                if suspended {
                    due.extend(std::mem::take(&mut shard.timers).into_values());
                    continue;
                }
                while let Some(entry) = shard.timers.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    due.push(entry.remove());
                }
            }
            if !due.is_empty() {
                for waker in due {
                    // A waker is user code: one that panics must not stop every other timer.
                    let _ = catch_unwind(AssertUnwindSafe(|| waker.wake()));
                }
                continue;
            }
            let park = self.park.lock().unwrap_or_else(|p| p.into_inner());
            let target = self.earliest();
            self.parked_until.store(
                target.map_or(PARKED_IDLE, |at| self.encode(at)),
                Ordering::SeqCst,
            );
            // A sleep registered between the look above and the store read `AWAKE` and did not notify:
            // look again now that the store is visible.
            if self.earliest() != target {
                self.parked_until.store(AWAKE, Ordering::SeqCst);
                drop(park);
                continue;
            }
            let park = match target {
                Some(at) => {
                    // At least once a second, to notice a suspend (see above).
                    let wait = at
                        .saturating_duration_since(now)
                        .min(Duration::from_secs(1));
                    match self.wake.wait_timeout(park, wait) {
                        Ok((guard, _)) => guard,
                        Err(p) => p.into_inner().0,
                    }
                }
                None => self.wake.wait(park).unwrap_or_else(|p| p.into_inner()),
            };
            self.parked_until.store(AWAKE, Ordering::SeqCst);
            drop(park);
        }
    }
}

/// The wheels this process lineage has used, in order; [`SLOT`] says which one is current. A wheel is
/// replaced when its thread is gone (a `fork()`: the child has the wheel but not the thread; or the
/// thread's death). Lock-free on purpose: a lock that another thread of the parent held at the moment of
/// `fork()` stays locked forever in the child, so nothing here waits on one (a `RwLock` did, and forked
/// children hung on their first sleep).
static WHEELS: [OnceLock<&'static Wheel>; MAX_WHEELS] = [const { OnceLock::new() }; MAX_WHEELS];
/// How many wheels one process (with its forked ancestors) can start; after that, sleeps poll themselves
/// (see [`WheelSleep::poll`]), which keeps every deadline at the cost of CPU.
const MAX_WHEELS: usize = 64;
/// The current slot of [`WHEELS`] (high 32 bits) and the id of the process that claimed it (low 32 bits).
/// A slot claimed but not yet filled by another process (a parent forked while one of its threads was
/// starting a wheel) is skipped: that thread does not exist here.
static SLOT: AtomicU64 = AtomicU64::new(0);
/// When a failed thread start was last retried (ms of the wall clock), to rate-limit retries.
static LAST_TRY: AtomicU64 = AtomicU64::new(0);

fn pid() -> u32 {
    #[cfg(test)]
    {
        let fake = hooks::FAKE_PID.load(Ordering::Relaxed);
        if fake != 0 {
            return fake;
        }
    }
    std::process::id()
}

/// Wall-clock milliseconds, for rate-limiting retries only (no lazily initialised state: see [`WHEELS`]).
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How one look at the current wheel ended.
enum Look {
    Ready(&'static Wheel),
    /// Another thread of this process is starting a wheel this instant: look again.
    Busy,
    /// No thread can be started now.
    Unavailable,
}

/// The wheel with a running thread, starting one if needed; `None` if no thread can be started now.
pub(super) fn current() -> Option<&'static Wheel> {
    // A thread of this process that is starting a wheel is alive (same process): it finishes in moments.
    for _ in 0..1_000 {
        match look() {
            Look::Ready(wheel) => return Some(wheel),
            Look::Busy => std::thread::yield_now(),
            Look::Unavailable => return None,
        }
    }
    None
}

fn look() -> Look {
    let me = pid();
    let claimed = SLOT.load(Ordering::Acquire);
    let (slot, owner) = ((claimed >> 32) as usize, claimed as u32);
    let old = match WHEELS.get(slot).and_then(OnceLock::get) {
        Some(wheel) if wheel.usable(me) => return Look::Ready(wheel),
        Some(wheel) => Some(*wheel),
        // Being started by a thread of this process: it is usable in a moment.
        None if owner == me && slot > 0 => return Look::Busy,
        None => None,
    };
    let last = LAST_TRY.load(Ordering::Relaxed);
    if last != 0 {
        // A previous start failed: retry at most once per millisecond.
        let now = wall_ms();
        if now == last {
            return Look::Unavailable;
        }
        LAST_TRY.store(now, Ordering::Relaxed);
    }
    let next = slot + 1;
    if next >= MAX_WHEELS {
        return Look::Unavailable;
    }
    // Claim the next slot; whoever loses the race polls again and finds the winner's wheel.
    let claim = ((next as u64) << 32) | u64::from(me);
    if SLOT
        .compare_exchange(claimed, claim, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Look::Busy;
    }
    let wheel: &'static Wheel = Box::leak(Box::new(Wheel::new(me)));
    #[cfg(test)]
    let fail = hooks::FAIL_SPAWN.load(Ordering::Relaxed);
    #[cfg(not(test))]
    let fail = false;
    let started = (!fail)
        .then(|| {
            std::thread::Builder::new()
                .name("redlease-timer".into())
                .spawn(move || wheel.run())
                .ok()
        })
        .flatten();
    if started.is_none() {
        // Give the slot back so that the next try can claim it again.
        let _ = SLOT.compare_exchange(claim, claimed, Ordering::AcqRel, Ordering::Relaxed);
        LAST_TRY.store(wall_ms().max(1), Ordering::Relaxed);
        return Look::Unavailable;
    }
    LAST_TRY.store(0, Ordering::Relaxed);
    // Take over the sleeps of the wheel whose thread is gone: they keep their wakers and deadlines. Only
    // from shards whose lock can be had at once: in a forked child a lock held by a parent's thread is
    // never released, and the map behind it may be half-changed. Those sleeps then re-register when next
    // polled.
    if let Some(old) = old {
        for i in 0..SHARDS {
            let Some(mut shard) = old.try_shard_inherited(i) else {
                continue;
            };
            let moved = std::mem::take(&mut shard.timers);
            drop(shard);
            for ((at, _), waker) in moved {
                wheel.register(i, at, waker);
            }
        }
    }
    let _ = WHEELS[next].set(wheel);
    Look::Ready(wheel)
}

/// A sleep registered in the current wheel while it waits.
pub(super) struct WheelSleep {
    deadline: Instant,
    key: Option<(&'static Wheel, usize, Key)>,
}

impl WheelSleep {
    pub(super) fn new(deadline: Instant) -> Self {
        Self {
            deadline,
            key: None,
        }
    }

    fn unregister(&mut self) {
        if let Some((wheel, shard, key)) = self.key.take() {
            if let Some(mut shard) = wheel.try_shard_inherited(shard) {
                shard.timers.remove(&key);
            }
        }
    }
}

impl Future for WheelSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if Instant::now() >= this.deadline {
            this.unregister();
            return Poll::Ready(());
        }
        let Some(wheel) = current() else {
            // No timer thread can run now: keep the deadline by polling again soon.
            this.unregister();
            cx.waker().wake_by_ref();
            return Poll::Pending;
        };
        if let Some((registered, shard, key)) = this.key {
            if std::ptr::eq(registered, wheel) {
                let mut st = wheel.shard(shard);
                if let Some(waker) = st.timers.get_mut(&key) {
                    if !waker.will_wake(cx.waker()) {
                        waker.clone_from(cx.waker());
                    }
                    return Poll::Pending;
                }
            } else {
                // Registered with a wheel whose thread is gone (fork): register with the new one.
                this.unregister();
            }
        }
        // Not registered (or fired early by a clock quirk): register, and wake the thread only if it sleeps
        // past this deadline. A round's timeout is nearly always later than the one the thread already
        // waits for, so arming it costs no wake-up.
        let shard = shard_index();
        let key = wheel.register(shard, this.deadline, cx.waker().clone());
        this.key = Some((wheel, shard, key));
        Poll::Pending
    }
}

impl Drop for WheelSleep {
    fn drop(&mut self) {
        self.unregister();
    }
}

#[cfg(test)]
pub(super) mod hooks {
    //! Test hooks standing in for what a unit test cannot do to its own process.
    use std::sync::atomic::{AtomicBool, AtomicU32};
    /// A process id to report instead of the real one (0: the real one) — a simulated `fork()`.
    pub(crate) static FAKE_PID: AtomicU32 = AtomicU32::new(0);
    /// Makes starting the timer thread fail.
    pub(crate) static FAIL_SPAWN: AtomicBool = AtomicBool::new(false);
}
