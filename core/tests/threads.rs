//! Real threads: leases on the in-memory node driven by plain `block_on` on OS threads, with no async runtime
//! at all; and tokens drawn in separate processes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlease::{Config, LockManager, SystemTimer, TOKEN_BYTES, Timer, Token};
use redlease_testkit::{FaultyNode, MemoryNode, Op, VirtualClock, block_on};

#[test]
fn contending_threads_lose_no_update_of_a_non_atomic_counter() {
    for redlock in [false, true] {
        let config = Config::default()
            .with_expiry(Duration::from_secs(5))
            .with_retry_delay(Duration::from_millis(2));
        let manager = if redlock {
            LockManager::redlock((0..3).map(|_| MemoryNode::new()), config).unwrap()
        } else {
            LockManager::single(MemoryNode::new(), config).unwrap()
        };
        // A "read, pause, write" counter: correct only under mutual exclusion.
        let counter = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let lock = manager.lock("counter");
                let counter = Arc::clone(&counter);
                std::thread::spawn(move || {
                    block_on(async {
                        for _ in 0..25 {
                            let lease = lock.acquire_within(Duration::from_secs(30)).await.unwrap();
                            let read = counter.load(Ordering::SeqCst);
                            SystemTimer
                                .sleep_until(Instant::now() + Duration::from_micros(200))
                                .await;
                            counter.store(read + 1, Ordering::SeqCst);
                            lease.release().await.unwrap();
                        }
                    })
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(counter.load(Ordering::SeqCst), 200, "redlock={redlock}");
    }
}

/// Waits (in real time, generously) until `done` holds; the thread under test needs no particular speed.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < give_up, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn background_renewal_runs_on_a_thread_spawner() {
    // Virtual time, moved only by this test: the renewal task runs on its own OS thread (plain block_on),
    // and each step waits for it to finish its round before time moves on, however slow the machine is.
    let clock = VirtualClock::new();
    let (node, faults) = FaultyNode::new(MemoryNode::with_timer(clock.clone()), clock.clone());
    let threads = Arc::new(AtomicU64::new(0));
    let spawned = Arc::clone(&threads);
    let manager = LockManager::single(node, Config::default())
        .unwrap()
        .with_timer(clock.clone())
        .with_spawner(move |task| {
            spawned.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || block_on(task));
        });
    let lock = manager
        .lock("job")
        .expiry(Duration::from_millis(300))
        .auto_renew(Duration::from_millis(100));
    let lease = block_on(lock.try_acquire()).unwrap();
    let first = lease.valid_until();
    assert_eq!(
        threads.load(Ordering::SeqCst),
        1,
        "renewal runs on a spawned thread"
    );
    let mut previous = first;
    for step in 1..=7u64 {
        clock.advance(Duration::from_millis(100));
        wait_for(&format!("renewal {step}"), || {
            lease.valid_until() > previous
        });
        previous = lease.valid_until();
        assert!(
            previous > clock.now(),
            "step {step}: the renewed deadline lies ahead"
        );
        assert_eq!(faults.calls(Op::Extend), step, "one renewal per interval");
    }
    // 700 ms of virtual time: far past the original 300 ms TTL, still held.
    assert!(lease.is_held(), "renewed past its original 300 ms TTL");
    assert!(lease.valid_until() > first + Duration::from_millis(600));
    block_on(lease.release()).unwrap();
}

const TOKEN_CHILD: &str = "REDLEASE_TEST_TOKEN_CHILD";
const TOKENS_PER_PROCESS: usize = 2_000;

#[test]
fn tokens_differ_across_processes_and_every_bit_is_unbiased() {
    if std::env::var_os(TOKEN_CHILD).is_some() {
        // Child mode: print this process's tokens for the parent.
        for _ in 0..TOKENS_PER_PROCESS {
            println!("TOKEN {}", Token::random().unwrap().as_str());
        }
        return;
    }
    // A generator with a fixed seed (or one seeded once per build) repeats its tokens in every process: fresh
    // processes must not. Their tokens together must also look uniform bit by bit.
    let exe = std::env::current_exe().unwrap();
    let mut tokens: Vec<String> = (0..TOKENS_PER_PROCESS)
        .map(|_| Token::random().unwrap().as_str().to_owned())
        .collect();
    for child in 0..4 {
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "tokens_differ_across_processes_and_every_bit_is_unbiased",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(TOKEN_CHILD, "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "child {child}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let mine: Vec<String> = text
            .lines()
            // The harness may print "test … " on the same line as the first token.
            .filter_map(|l| l.split_once("TOKEN ").map(|(_, t)| t))
            .map(str::to_owned)
            .collect();
        assert_eq!(mine.len(), TOKENS_PER_PROCESS, "child {child}");
        tokens.extend(mine);
    }
    let distinct: HashSet<&String> = tokens.iter().collect();
    assert_eq!(
        distinct.len(),
        tokens.len(),
        "a token repeated across processes"
    );
    // Each of the 160 bits is set in half of the 10 000 tokens, within 6 standard deviations (50 each).
    let n = tokens.len() as f64;
    for bit in 0..TOKEN_BYTES * 8 {
        let ones = tokens
            .iter()
            .filter(|t| {
                let nibble = u8::from_str_radix(&t[bit / 4..bit / 4 + 1], 16).unwrap();
                nibble & (8 >> (bit % 4)) != 0
            })
            .count() as f64;
        assert!(
            (ones - n / 2.0).abs() < 6.0 * (n / 4.0).sqrt(),
            "bit {bit} is set in {ones} of {n} tokens"
        );
    }
}
