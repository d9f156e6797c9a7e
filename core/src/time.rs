//! Time: where the driver reads the clock and how it sleeps.
//!
//! The pure machines never read a clock; the driver reads one through [`Timer`]. The default,
//! [`SystemTimer`], uses [`std::time::Instant`] and one shared timer thread, which works on every executor. Tests
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

/// The default timer: [`Instant::now`] and a process-wide timer thread, usable on any executor.
///
/// Every round of node calls arms a timeout that is almost always dropped unfired a fraction of a
/// millisecond later, so arming and dropping must be cheap: a sleep registers its deadline in a shared ordered
/// map and wakes the timer thread only when it becomes the earliest deadline; dropping it just removes the
/// entry. (`futures-timer`, used before, woke its helper thread on every creation and every drop, which
/// measured at about a fifth of the CPU of a busy client.) If the thread cannot be started, sleeps fall back
/// to `futures-timer`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemTimer;

impl Timer for SystemTimer {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        match wheel::get() {
            Some(wheel) => Box::pin(wheel::WheelSleep::new(wheel, deadline)),
            None => {
                let wait = deadline.saturating_duration_since(Instant::now());
                Box::pin(futures_timer::Delay::new(wait))
            }
        }
    }
}

mod wheel {
    //! The timer thread behind [`SystemTimer`](super::SystemTimer).

    use std::collections::BTreeMap;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
    use std::task::{Context, Poll, Waker};
    use std::time::Instant;

    type Key = (Instant, u64);

    #[derive(Default)]
    struct State {
        timers: BTreeMap<Key, Waker>,
        next_id: u64,
        /// `Some(t)`: the thread sleeps until `t` (`Some(None)`: until notified); `None`: it is awake and will
        /// look at the map before sleeping again.
        parked_until: Option<Option<Instant>>,
    }

    pub(super) struct Wheel {
        state: Mutex<State>,
        wake: Condvar,
    }

    impl Wheel {
        fn lock(&self) -> MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|p| p.into_inner())
        }

        /// The timer thread: wakes due sleeps, then waits for the earliest deadline or a new earlier one.
        fn run(&self) {
            let mut st = self.lock();
            loop {
                let now = Instant::now();
                let mut due = Vec::new();
                while let Some(entry) = st.timers.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    due.push(entry.remove());
                }
                if !due.is_empty() {
                    drop(st);
                    due.into_iter().for_each(Waker::wake);
                    st = self.lock();
                    continue;
                }
                let target = st.timers.keys().next().map(|&(at, _)| at);
                st.parked_until = Some(target);
                st = match target {
                    Some(at) => {
                        let wait = at.saturating_duration_since(now);
                        match self.wake.wait_timeout(st, wait) {
                            Ok((guard, _)) => guard,
                            Err(p) => p.into_inner().0,
                        }
                    }
                    None => self.wake.wait(st).unwrap_or_else(|p| p.into_inner()),
                };
                st.parked_until = None;
            }
        }
    }

    static WHEEL: OnceLock<Option<&'static Wheel>> = OnceLock::new();

    /// The shared wheel, starting its thread on first use; `None` if no thread could be started.
    pub(super) fn get() -> Option<&'static Wheel> {
        *WHEEL.get_or_init(|| {
            let wheel: &'static Wheel = Box::leak(Box::new(Wheel {
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
            }));
            std::thread::Builder::new()
                .name("redlease-timer".into())
                .spawn(move || wheel.run())
                .ok()
                .map(|_| wheel)
        })
    }

    /// A sleep registered in the wheel while it waits.
    pub(super) struct WheelSleep {
        wheel: &'static Wheel,
        deadline: Instant,
        key: Option<Key>,
    }

    impl WheelSleep {
        pub(super) fn new(wheel: &'static Wheel, deadline: Instant) -> Self {
            Self {
                wheel,
                deadline,
                key: None,
            }
        }
    }

    impl Future for WheelSleep {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let this = &mut *self;
            if Instant::now() >= this.deadline {
                if let Some(key) = this.key.take() {
                    this.wheel.lock().timers.remove(&key);
                }
                return Poll::Ready(());
            }
            let mut st = this.wheel.lock();
            if let Some(waker) = this.key.and_then(|key| st.timers.get_mut(&key)) {
                if !waker.will_wake(cx.waker()) {
                    waker.clone_from(cx.waker());
                }
                return Poll::Pending;
            }
            // Not registered yet (or fired early by a clock quirk): register, and wake the thread only if it sleeps
            // past this deadline. A round's timeout is nearly always later than the one the thread already waits
            // for, so arming it costs no wake-up.
            let key = (this.deadline, st.next_id);
            st.next_id = st.next_id.wrapping_add(1);
            st.timers.insert(key, cx.waker().clone());
            this.key = Some(key);
            let notify = match st.parked_until {
                None => false,
                Some(None) => true,
                Some(Some(until)) => this.deadline < until,
            };
            drop(st);
            if notify {
                this.wheel.wake.notify_one();
            }
            Poll::Pending
        }
    }

    impl Drop for WheelSleep {
        fn drop(&mut self) {
            if let Some(key) = self.key.take() {
                self.wheel.lock().timers.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn block_on<F: std::future::Future>(fut: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = std::task::Context::from_waker(&waker);
        let mut fut = std::pin::pin!(fut);
        loop {
            if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }

    #[test]
    fn sleeps_last_at_least_until_their_deadline() {
        for ms in [0u64, 1, 5, 30] {
            let start = Instant::now();
            block_on(SystemTimer.sleep_until(start + Duration::from_millis(ms)));
            let took = start.elapsed();
            assert!(
                took >= Duration::from_millis(ms),
                "{ms} ms sleep took {took:?}"
            );
            assert!(
                took < Duration::from_millis(ms + 500),
                "{ms} ms sleep took {took:?}"
            );
        }
    }

    #[test]
    fn an_earlier_deadline_is_not_held_up_by_a_later_one() {
        let far = SystemTimer.sleep_until(Instant::now() + Duration::from_secs(60));
        let mut far = std::pin::pin!(far);
        let waker = std::task::Waker::noop();
        assert!(
            far.as_mut()
                .poll(&mut std::task::Context::from_waker(waker))
                .is_pending()
        );
        let start = Instant::now();
        block_on(SystemTimer.sleep_until(start + Duration::from_millis(10)));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn many_threads_sleep_correctly_while_arming_and_dropping_timeouts() {
        let threads: Vec<_> = (0..8)
            .map(|i| {
                std::thread::spawn(move || {
                    for j in 0..50u64 {
                        // Arm and drop a long timeout, as a round does, then sleep briefly.
                        let long =
                            SystemTimer.sleep_until(Instant::now() + Duration::from_secs(30));
                        drop(long);
                        let start = Instant::now();
                        let d = Duration::from_micros(100 * ((i + j) % 7));
                        block_on(SystemTimer.sleep_until(start + d));
                        assert!(start.elapsed() >= d);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
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
