//! Time: where the driver reads the clock and how it sleeps.
//!
//! The pure machines never read a clock; the driver reads one through [`Timer`]. The default,
//! [`SystemTimer`], uses [`std::time::Instant`] and `futures-timer`, which works on every executor. Tests
//! inject virtual time (see `redlease-testkit`), so a 30-second lease lifecycle runs in microseconds.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
}

impl<T: Timer + ?Sized> Timer for Arc<T> {
    fn now(&self) -> Instant {
        (**self).now()
    }
    fn sleep_until(&self, deadline: Instant) -> Sleep {
        (**self).sleep_until(deadline)
    }
}

/// The default timer: [`Instant::now`] and [`futures_timer::Delay`], usable on any executor.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemTimer;

impl Timer for SystemTimer {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        let wait = deadline.saturating_duration_since(Instant::now());
        Box::pin(futures_timer::Delay::new(wait))
    }
}

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
