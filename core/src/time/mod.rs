//! Time: where the driver reads the clock and how it sleeps.
//!
//! The pure machines never read a clock; the driver reads one through [`Timer`]. The default,
//! [`SystemTimer`], uses [`std::time::Instant`] and one shared timer thread, which works on every executor. Tests
//! inject virtual time (see `redlease-testkit`), so a 30-second lease lifecycle runs in microseconds.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// A boxed sleep future returned by [`Timer::sleep_until`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A monotonic clock and a way to sleep until a point on it.
///
/// Implementations must be monotonic (`now` never goes backwards) and `sleep_until(t)` must not complete
/// before `now() >= t`. A sleep that is dropped must stop cleanly.
pub trait Timer: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Instant;

    /// A future that completes once `now() >= deadline`.
    fn sleep_until(&self, deadline: Instant) -> Sleep;

    /// The wall clock, used only to notice that the machine was suspended.
    ///
    /// On Linux the monotonic clock behind [`Instant`] stops while the machine is suspended, so after a
    /// resume a lease would report the validity it had before. When this returns readings, redlease compares
    /// wall-clock progress with monotonic progress since each round started and treats a lease whose wall
    /// clock ran ahead by more than its drift allowance as lost ([`LossReason::Suspended`](crate::LossReason::Suspended)).
    /// The default, `None`, turns that detection off (for timers without a wall clock).
    fn wall_now(&self) -> Option<SystemTime> {
        None
    }
}

impl<T: Timer + ?Sized> Timer for Arc<T> {
    fn now(&self) -> Instant {
        (**self).now()
    }
    fn sleep_until(&self, deadline: Instant) -> Sleep {
        (**self).sleep_until(deadline)
    }
    fn wall_now(&self) -> Option<SystemTime> {
        (**self).wall_now()
    }
}

/// The default timer: [`Instant::now`] and a process-wide timer thread, usable on any executor.
///
/// Every round of node calls arms a timeout that is almost always dropped unfired a fraction of a
/// millisecond later, so arming and dropping must be cheap: a sleep registers its deadline in one of eight
/// ordered maps, each behind its own lock and chosen per thread (so executor threads do not contend for one
/// lock), and wakes the timer thread only when it becomes the earliest deadline (read from an atomic);
/// dropping it just removes the entry. (`futures-timer`, used before, woke its helper thread on every creation and every drop, which
/// measured at about a fifth of the CPU of a busy client.)
///
/// The thread is made to outlive what kills timer threads:
/// - **`fork()`**: a child process inherits the timer's state but not its thread, and a lock that another
///   thread of the parent held at the fork stays locked forever in the child. The timer notices that the
///   process id changed and starts a new thread without waiting on any inherited lock: sleeps registered
///   before the fork are taken over when the old wheel's lock is free (otherwise they register again when
///   next polled). Tested with real forks while four threads use timers (`fork-test/`).
/// - **a panicking waker**: the panic is caught and the thread goes on waking the others.
/// - **a thread that cannot be started** (resource limits): nothing is cached; every sleep tries again
///   (at most once per millisecond), and meanwhile waits by re-polling itself, so timeouts and loss signals
///   still fire on time at the cost of CPU. It never panics.
/// - **a suspended machine**: while sleeps are pending the thread looks at the wall clock at least once a
///   second; when it ran ahead of the monotonic clock (the machine was suspended), every sleep is woken early,
///   so that loss signals re-check their leases (see [`Timer::wall_now`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemTimer;

impl Timer for SystemTimer {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(wheel::WheelSleep::new(deadline))
    }

    fn wall_now(&self) -> Option<SystemTime> {
        Some(SystemTime::now())
    }
}

#[cfg(test)]
pub(crate) mod hand;
mod wheel;

#[cfg(test)]
mod tests;

/// A shared, type-erased [`Timer`].
#[derive(Clone)]
pub(crate) struct SharedTimer(pub(crate) Arc<dyn Timer>);

impl SharedTimer {
    pub(crate) fn now(&self) -> Instant {
        self.0.now()
    }
    pub(crate) fn sleep_until(&self, deadline: Instant) -> Sleep {
        self.0.sleep_until(deadline)
    }
    pub(crate) fn wall_now(&self) -> Option<SystemTime> {
        self.0.wall_now()
    }
}

/// Whether the wall clock ran ahead of the monotonic clock by more than `allowance` between two readings
/// (`start` and `end` of each): a suspended machine. A wall clock that went backwards (an adjustment) is not.
pub(crate) fn suspended(
    mono: (Instant, Instant),
    wall: (Option<SystemTime>, Option<SystemTime>),
    allowance: Duration,
) -> bool {
    let (Some(w0), Some(w1)) = wall else {
        return false;
    };
    let Ok(wall_elapsed) = w1.duration_since(w0) else {
        return false;
    };
    wall_elapsed
        > mono
            .1
            .saturating_duration_since(mono.0)
            .saturating_add(allowance)
}

impl fmt::Debug for SharedTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Timer")
    }
}

/// `instant + duration`, saturating at a far-future instant instead of panicking on overflow.
pub(crate) fn add(instant: Instant, duration: Duration) -> Instant {
    instant
        .checked_add(duration)
        .unwrap_or_else(|| far_future(instant))
}

/// An instant about a century after `from` (or as far as the platform allows).
pub(crate) fn far_future(from: Instant) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let mut step = CENTURY;
    loop {
        if let Some(t) = from.checked_add(step) {
            return t;
        }
        step /= 2;
        if step.is_zero() {
            return from;
        }
    }
}
