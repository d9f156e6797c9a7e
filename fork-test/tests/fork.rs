//! The default timer across a real `fork()` while other threads of the parent use timers.
//!
//! A child process inherits the parent's memory, including any lock that another thread held at the instant
//! of the fork: that thread does not exist in the child, so the lock is never released there. The timer must
//! not wait on such a lock: every child here sleeps on the timer once and exits; a child that is still
//! running long after its sleep's deadline hangs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use redlease::{SystemTimer, Timer};

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: Future>(fut: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Forks; the child runs `child` and exits with its code without unwinding or running destructors (the
/// parent's other threads do not exist there). Returns the child's pid in the parent.
fn fork(child: impl FnOnce() -> i32) -> libc::pid_t {
    #[allow(unsafe_code)]
    // SAFETY: the child calls only the timer under test and `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = child();
        #[allow(unsafe_code)]
        // SAFETY: ends the child at once, as a forked child of a multi-threaded process should.
        unsafe {
            libc::_exit(code)
        };
    }
    pid
}

/// Waits for `pid` until `deadline`: its exit code, or `None` if it is still running (then it is killed).
fn reap(pid: libc::pid_t, deadline: Instant) -> Option<i32> {
    loop {
        let mut status = 0;
        #[allow(unsafe_code)]
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            });
        }
        if Instant::now() >= deadline {
            #[allow(unsafe_code)]
            // SAFETY: signals and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn forked_children_sleep_on_the_timer_while_parent_threads_use_it() {
    const CHILDREN: usize = 200;
    let stop = Arc::new(AtomicBool::new(false));
    // Four threads arm, drop and wait on timers as fast as they can: at any instant one of them is likely to
    // hold the timer's lock.
    let busy: Vec<_> = (0..4u64)
        .map(|i| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut j = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let long = SystemTimer.sleep_until(Instant::now() + Duration::from_secs(30));
                    drop(long);
                    let d = Duration::from_micros(50 * ((i + j) % 5));
                    block_on(SystemTimer.sleep_until(Instant::now() + d));
                    j += 1;
                }
            })
        })
        .collect();
    // The parent's own sleeps work before any fork.
    block_on(SystemTimer.sleep_until(Instant::now() + Duration::from_millis(2)));
    let mut hung = 0;
    let mut failed = 0;
    for _ in 0..CHILDREN {
        let pid = fork(|| {
            let start = Instant::now();
            block_on(SystemTimer.sleep_until(start + Duration::from_millis(5)));
            // A second sleep: the child's own timer thread serves it.
            block_on(SystemTimer.sleep_until(Instant::now() + Duration::from_millis(1)));
            i32::from(start.elapsed() < Duration::from_millis(6))
        });
        // A child's two sleeps take 6 ms; 5 s is far beyond anything a loaded machine adds.
        match reap(pid, Instant::now() + Duration::from_secs(5)) {
            None => hung += 1,
            Some(0) => {}
            Some(_) => failed += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in busy {
        t.join().unwrap();
    }
    assert_eq!(
        (hung, failed),
        (0, 0),
        "of {CHILDREN} forked children, {hung} hung on the timer and {failed} woke before their deadline"
    );
}

/// Tokens come from a per-thread generator seeded from the OS: a forked child inherits its state, and its
/// very first token must still differ from every token of the parent (drawn before or after the fork) and of
/// every other child. Each child writes its first two tokens to a file; the parent keeps drawing meanwhile.
#[test]
fn forked_children_never_repeat_a_token_of_the_parent_or_of_each_other() {
    use redlease::Token;
    use std::collections::HashSet;

    const CHILDREN: usize = 100;
    let dir = std::env::temp_dir().join(format!("redlease-fork-tokens-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut seen = HashSet::new();
    // The parent's generator is in use (its state set) before every fork.
    for _ in 0..3 {
        assert!(seen.insert(Token::random().unwrap().as_str().to_owned()));
    }
    let mut children = Vec::new();
    for i in 0..CHILDREN {
        let path = dir.join(format!("{i}"));
        let pid = fork(move || {
            let (Ok(first), Ok(second)) = (Token::random(), Token::random()) else {
                return 2;
            };
            let text = format!("{}\n{}\n", first.as_str(), second.as_str());
            i32::from(std::fs::write(&path, text).is_err())
        });
        // The parent draws right after the fork, from the state the child inherited.
        for _ in 0..2 {
            assert!(seen.insert(Token::random().unwrap().as_str().to_owned()));
        }
        children.push(pid);
    }
    for pid in children {
        assert_eq!(reap(pid, Instant::now() + Duration::from_secs(10)), Some(0));
    }
    for i in 0..CHILDREN {
        let text = std::fs::read_to_string(dir.join(format!("{i}"))).unwrap();
        for token in text.lines() {
            assert_eq!(token.len(), 40);
            assert!(seen.insert(token.to_owned()), "child {i} repeated a token");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(seen.len(), 3 + CHILDREN * 4);
}
