//! Runtime glue for the managers: a tokio [`Timer`] and [`Spawn`]er (feature `tokio`) and a smol
//! [`Spawn`]er (feature `smol`).
//!
//! redlease itself never calls a runtime: its default timer, [`SystemTimer`](redlease::SystemTimer), is a
//! thread of its own that works on every executor, and background tasks (automatic renewal, clean-up after a
//! dropped lease) run only through a spawner you hand to
//! [`LockManager::with_spawner`](redlease::LockManager::with_spawner). These types are the one-line answer
//! for the two common runtimes (see [`TokioSpawner`] for an example).
//!
//! | client | tokio | smol | other executors |
//! |---|---|---|---|
//! | redis-rs (feature `redis`) | with feature `tokio` | with feature `smol` | no: redis-rs needs tokio's or smol's I/O |
//! | fred (feature `fred`) | yes (fred runs on tokio only; `fred` turns `tokio` on) | no | no |
//! | a node of your own, the testkit's | yes | yes | yes (redlease needs no runtime) |
//!
//! With both `tokio` and `smol` on, redis-rs uses tokio where a tokio runtime is current and smol elsewhere.

#[cfg(feature = "tokio")]
use std::time::{Duration, Instant, SystemTime};

#[cfg(feature = "tokio")]
use redlease::{Sleep, Timer};
use redlease::{Spawn, Task};

#[cfg(feature = "tokio")]
/// tokio's clock and timer as a [`Timer`] (feature `tokio`): sleeps are tokio sleeps, so a tokio service
/// needs no timer thread of redlease's own.
///
/// Call [`sleep_until`](Timer::sleep_until)'s futures on a tokio runtime with the time driver enabled
/// (`enable_time`, or `enable_all`, as `#[tokio::main]` does).
///
/// A long sleep is made of tokio sleeps of at most a second, so that the task sleeping looks at its lease
/// again at least once a second: after the machine was suspended (the monotonic clock tokio uses stops
/// meanwhile) a loss signal or renewal notices it within a second of the resume, as with
/// [`SystemTimer`](redlease::SystemTimer). The wall clock is [`SystemTime::now`].
///
/// Under tokio's paused clock (`tokio::time::pause`, `start_paused`) use the testkit's timer for it instead
/// (feature `tokio` of `redlease-testkit`): this one reports the real wall clock, which does not stop with
/// tokio's clock, so a lease would take the virtual standstill for a suspend.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioTimer;

#[cfg(feature = "tokio")]
/// The longest single tokio sleep inside a [`TokioTimer`] sleep.
const WAKE_AT_LEAST_EVERY: Duration = Duration::from_secs(1);

#[cfg(feature = "tokio")]
impl Timer for TokioTimer {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(async move {
            let deadline = tokio::time::Instant::from_std(deadline);
            loop {
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return;
                }
                let step = now.checked_add(WAKE_AT_LEAST_EVERY).unwrap_or(deadline);
                tokio::time::sleep_until(step.min(deadline)).await;
            }
        })
    }

    fn wall_now(&self) -> Option<SystemTime> {
        Some(SystemTime::now())
    }
}

#[cfg(feature = "tokio")]
/// The timer of the runtime each sleep runs on (feature `tokio`): a [`TokioTimer`] sleep where a tokio
/// runtime is current when the sleep is made, else redlease's default
/// [`SystemTimer`](redlease::SystemTimer). What the adapters' one-line constructors (`redis::single`,
/// `redis::redlock`, `fred::single`, `fred::redlock`) give their managers: a tokio service then needs no
/// timer thread of redlease's, and arming a round's timeout is a tokio timer entry (sharded per worker)
/// instead of an entry in the timer thread's one shared map; on smol or another executor it is the default
/// timer.
///
/// The clock is [`Instant::now`], which is tokio's while its clock runs (not paused). Under tokio's paused
/// clock give the manager the testkit's timer instead (see [`TokioTimer`]). Like the clients' own timeouts,
/// its tokio sleeps need the runtime's time driver (`enable_time`, or `enable_all`).
#[derive(Debug, Clone, Copy, Default)]
pub struct RuntimeTimer;

#[cfg(feature = "tokio")]
impl Timer for RuntimeTimer {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        if tokio::runtime::Handle::try_current().is_ok() {
            TokioTimer.sleep_until(deadline)
        } else {
            redlease::SystemTimer.sleep_until(deadline)
        }
    }

    fn wall_now(&self) -> Option<SystemTime> {
        Some(SystemTime::now())
    }
}

#[cfg(feature = "tokio")]
/// Spawns redlease's background tasks on a tokio runtime (feature `tokio`).
///
/// It holds a [`Handle`](tokio::runtime::Handle), so it spawns from any thread, also from a `Drop` outside
/// the runtime (a dropped lease's clean-up); once the runtime has shut down, tasks are dropped unrun.
///
/// ```
/// use std::time::Duration;
/// use redlease::{Config, LockManager};
/// use redlease_adapters::runtime::{TokioSpawner, TokioTimer};
/// use redlease_testkit::MemoryNode;
///
/// #[tokio::main]
/// async fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let node = MemoryNode::new(); // any RedisNode: `redis::single(url, …)` gives a manager in one line
///     let manager = LockManager::single(node, Config::default().with_expiry(Duration::from_secs(1)))?
///         .with_timer(TokioTimer)
///         .with_spawner(TokioSpawner::current()?);
///     let lock = manager.lock("jobs:nightly").auto_renew(Duration::from_millis(250));
///     let lease = lock.acquire().await?;
///     // Renewed in the background on tokio, across several TTLs, until released or lost.
///     tokio::time::sleep(Duration::from_millis(2500)).await;
///     assert!(lease.is_held());
///     lease.release().await?;
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone)]
pub struct TokioSpawner {
    handle: tokio::runtime::Handle,
}

#[cfg(feature = "tokio")]
impl TokioSpawner {
    /// Spawns on the runtime this is called from.
    ///
    /// # Errors
    /// [`TryCurrentError`](tokio::runtime::TryCurrentError) when called outside a tokio runtime.
    pub fn current() -> Result<Self, tokio::runtime::TryCurrentError> {
        tokio::runtime::Handle::try_current().map(Self::new)
    }

    /// Spawns on the runtime of `handle`.
    pub fn new(handle: tokio::runtime::Handle) -> Self {
        Self { handle }
    }
}

#[cfg(feature = "tokio")]
impl Spawn for TokioSpawner {
    fn spawn(&self, task: Task) {
        drop(self.handle.spawn(task));
    }
}

/// Spawns redlease's background tasks on smol (feature `smol`): on smol's global executor
/// ([`smol::spawn`], threads of its own, started on first use), or on an executor of yours.
#[cfg(feature = "smol")]
#[derive(Debug, Clone, Default)]
pub struct SmolSpawner {
    executor: Option<std::sync::Arc<smol::Executor<'static>>>,
}

#[cfg(feature = "smol")]
impl SmolSpawner {
    /// Spawns on smol's global executor.
    pub fn global() -> Self {
        Self::default()
    }

    /// Spawns on `executor`; its tasks run only while something runs the executor (`executor.run(…)`).
    pub fn on(executor: std::sync::Arc<smol::Executor<'static>>) -> Self {
        Self {
            executor: Some(executor),
        }
    }
}

#[cfg(feature = "smol")]
impl Spawn for SmolSpawner {
    fn spawn(&self, task: Task) {
        match &self.executor {
            Some(executor) => executor.spawn(task).detach(),
            None => smol::spawn(task).detach(),
        }
    }
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use super::*;

    /// Inside a tokio runtime a sleep is tokio's: under a paused clock a 10 s sleep ends at once (tokio
    /// advances its clock when idle), where redlease's timer thread would take the 10 s.
    #[tokio::test(start_paused = true)]
    async fn runtime_timer_sleeps_on_tokio_inside_a_tokio_runtime() {
        let real = std::time::Instant::now();
        RuntimeTimer
            .sleep_until(Instant::now() + Duration::from_secs(10))
            .await;
        assert!(
            real.elapsed() < Duration::from_secs(5),
            "{:?}",
            real.elapsed()
        );
    }

    /// Outside any runtime it is the default timer: the sleep completes, after its deadline.
    #[test]
    fn runtime_timer_falls_back_to_the_default_timer_outside_tokio() {
        use std::sync::Arc;
        use std::task::{Context, Poll, Wake, Waker};
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let start = Instant::now();
        let mut sleep = RuntimeTimer.sleep_until(start + Duration::from_millis(20));
        while sleep.as_mut().poll(&mut cx) == Poll::Pending {
            std::thread::park_timeout(Duration::from_secs(1));
        }
        assert!(start.elapsed() >= Duration::from_millis(20));
    }
}
