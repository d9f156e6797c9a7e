//! tokio's clock as a [`Timer`], for tests on tokio's paused clock (feature `tokio`).

use std::time::{Instant, SystemTime};

use redlease::{Sleep, Timer};

/// tokio's clock and sleeps as a [`Timer`], for tests that run on tokio's **paused clock**
/// (`#[tokio::test(start_paused = true)]`, `tokio::time::pause`, `advance`; tokio's `test-util` feature).
///
/// With it, a manager's sleeps (retry pauses, renewal intervals, loss deadlines, round timeouts) are tokio
/// sleeps: they move with `tokio::time::advance`, and on a paused runtime tokio jumps to the next one when
/// every task waits, so a 30-second lease lifecycle runs in microseconds of real time. Give the same timer
/// to a [`MemoryNode`](crate::MemoryNode) so keys expire on that clock too.
///
/// It has no wall clock ([`Timer::wall_now`] is `None`): real time passes while tokio's paused clock stands
/// still (a blocking call, a slow test machine), which a wall-clock comparison would take for a suspended
/// machine and end the lease (`LossReason::Suspended`). For production on tokio use
/// `redlease_adapters::runtime::TokioTimer`, which keeps suspend detection.
///
/// ```
/// use std::time::Duration;
/// use redlease::{Config, LockManager, Task};
/// use redlease_testkit::{MemoryNode, TokioTestTimer};
///
/// #[tokio::main(flavor = "current_thread", start_paused = true)]
/// async fn main() -> Result<(), redlease::Error> {
///     let node = MemoryNode::with_timer(TokioTestTimer);
///     let manager = LockManager::single(node, Config::default())? // 30 s leases
///         .with_timer(TokioTestTimer)
///         .with_spawner(|task: Task| drop(tokio::spawn(task)));
///     let lease = manager.lock("job").auto_renew(Duration::from_secs(10)).acquire().await?;
///     tokio::time::sleep(Duration::from_secs(3600)).await; // an hour of renewals, at once
///     assert!(lease.is_held());
///     lease.release().await?;
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioTestTimer;

impl Timer for TokioTestTimer {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(
            deadline,
        )))
    }

    fn wall_now(&self) -> Option<SystemTime> {
        None
    }
}
