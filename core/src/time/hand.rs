//! A clock moved by hand, for the driver's table tests (test builds only).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Instant;

use super::{SharedTimer, Sleep, Timer};

/// A clock moved by hand: its sleeps are ready once it reaches their deadline. It counts them.
#[derive(Clone)]
pub(crate) struct HandClock {
    now: Arc<Mutex<Instant>>,
    sleeps: Arc<AtomicUsize>,
}

impl HandClock {
    /// A clock at `t0`.
    pub(crate) fn at(t0: Instant) -> Self {
        Self {
            now: Arc::new(Mutex::new(t0)),
            sleeps: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// This clock as the driver's timer.
    pub(crate) fn timer(&self) -> SharedTimer {
        SharedTimer(Arc::new(self.clone()))
    }

    /// Moves the clock to `t`.
    pub(crate) fn set(&self, t: Instant) {
        *self.now.lock().unwrap_or_else(|p| p.into_inner()) = t;
    }

    /// The sleeps made so far.
    pub(crate) fn sleeps(&self) -> usize {
        self.sleeps.load(Ordering::SeqCst)
    }
}

impl Timer for HandClock {
    fn now(&self) -> Instant {
        *self.now.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        self.sleeps.fetch_add(1, Ordering::SeqCst);
        let now = Arc::clone(&self.now);
        Box::pin(std::future::poll_fn(move |_| {
            if *now.lock().unwrap_or_else(|p| p.into_inner()) >= deadline {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }))
    }
}
