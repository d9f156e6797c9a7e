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

/// Like `block_on`, but fails the test instead of hanging when `fut` is not done within `limit`.
#[allow(clippy::panic)]
fn block_on_within<F: std::future::Future>(fut: F, limit: Duration) -> F::Output {
    struct Unpark(std::thread::Thread, std::sync::atomic::AtomicBool);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
            self.0.unpark();
        }
    }
    let unpark = Arc::new(Unpark(
        std::thread::current(),
        std::sync::atomic::AtomicBool::new(false),
    ));
    let waker = std::task::Waker::from(Arc::clone(&unpark));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    let start = Instant::now();
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        let left = limit.saturating_sub(start.elapsed());
        std::thread::park_timeout(left);
        if !unpark.1.swap(false, std::sync::atomic::Ordering::SeqCst) && start.elapsed() >= limit {
            panic!("not woken within {limit:?}: the timer thread is gone");
        }
    }
}

/// The hooks are process-wide: tests that set them run one at a time.
static HOOKS: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct PanicOnWake;
impl std::task::Wake for PanicOnWake {
    #[allow(clippy::panic)]
    fn wake(self: Arc<Self>) {
        panic!("a waker that panics");
    }
}

#[test]
fn a_panicking_waker_does_not_stop_the_timer_thread() {
    let _serial = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    let waker = std::task::Waker::from(Arc::new(PanicOnWake));
    let mut bad = SystemTimer.sleep_until(Instant::now() + Duration::from_millis(1));
    assert!(
        bad.as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
            .is_pending()
    );
    std::thread::sleep(Duration::from_millis(20));
    // The thread woke (and survived) the panicking waker: a later sleep is still woken by it.
    for _ in 0..3 {
        let start = Instant::now();
        block_on_within(
            SystemTimer.sleep_until(start + Duration::from_millis(5)),
            Duration::from_secs(10),
        );
        assert!(start.elapsed() >= Duration::from_millis(5));
    }
    let wheel = wheel::current().expect("a timer thread");
    assert!(
        std::ptr::eq(wheel, wheel::current().unwrap()),
        "no restart needed"
    );
}

#[test]
fn a_changed_process_id_starts_a_new_timer_thread_and_keeps_earlier_sleeps() {
    let _serial = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    let before = wheel::current().expect("a timer thread");
    // A sleep registered before the "fork"...
    let deadline = Instant::now() + Duration::from_millis(30);
    let (tx, rx) = std::sync::mpsc::channel();
    let early = std::thread::spawn(move || {
        let mut sleep = SystemTimer.sleep_until(deadline);
        struct Notify(std::sync::mpsc::Sender<()>, std::thread::Thread);
        impl std::task::Wake for Notify {
            fn wake(self: Arc<Self>) {
                let _ = self.0.send(());
                self.1.unpark();
            }
        }
        let waker = std::task::Waker::from(Arc::new(Notify(tx, std::thread::current())));
        let mut cx = std::task::Context::from_waker(&waker);
        while sleep.as_mut().poll(&mut cx).is_pending() {
            std::thread::park();
        }
    });
    std::thread::sleep(Duration::from_millis(5));
    // ...then the process id changes, as in a child after fork(), where the old thread does not exist.
    wheel::hooks::FAKE_PID.store(
        std::process::id().wrapping_add(1),
        std::sync::atomic::Ordering::Relaxed,
    );
    let after = wheel::current().expect("a new timer thread");
    assert!(
        !std::ptr::eq(before, after),
        "the old wheel belongs to the parent"
    );
    let start = Instant::now();
    block_on(SystemTimer.sleep_until(start + Duration::from_millis(5)));
    assert!(start.elapsed() >= Duration::from_millis(5));
    // The earlier sleep was handed to the new wheel and is woken at its deadline.
    rx.recv_timeout(Duration::from_secs(10)).expect("woken");
    early.join().unwrap();
    assert!(Instant::now() >= deadline);
    wheel::hooks::FAKE_PID.store(0, std::sync::atomic::Ordering::Relaxed);
}

#[test]
fn sleeps_keep_their_deadlines_while_no_timer_thread_can_start_and_a_later_start_succeeds() {
    let _serial = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    use std::sync::atomic::Ordering::Relaxed;
    wheel::hooks::FAIL_SPAWN.store(true, Relaxed);
    // Force a restart (as after a fork) while starting threads fails.
    wheel::hooks::FAKE_PID.store(std::process::id().wrapping_add(7), Relaxed);
    assert!(wheel::current().is_none());
    let start = Instant::now();
    block_on(SystemTimer.sleep_until(start + Duration::from_millis(10)));
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(10), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // The failure was not cached: once threads can start again, the timer thread comes back.
    wheel::hooks::FAIL_SPAWN.store(false, Relaxed);
    std::thread::sleep(Duration::from_millis(2));
    assert!(wheel::current().is_some());
    wheel::hooks::FAKE_PID.store(0, Relaxed);
    // And with the real process id again, a fresh thread serves it.
    std::thread::sleep(Duration::from_millis(2));
    assert!(wheel::current().is_some());
}

#[test]
fn many_threads_sleep_correctly_while_arming_and_dropping_timeouts() {
    let threads: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                for j in 0..50u64 {
                    // Arm and drop a long timeout, as a round does, then sleep briefly.
                    let long = SystemTimer.sleep_until(Instant::now() + Duration::from_secs(30));
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
