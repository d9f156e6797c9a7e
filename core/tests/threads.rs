//! Real threads and real time: leases on the in-memory node driven by plain `block_on` on OS threads, with no
//! async runtime at all.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlease::{Config, LockManager, SystemTimer, Timer};
use redlease_testkit::{MemoryNode, block_on};

#[test]
fn contending_threads_lose_no_update_of_a_non_atomic_counter() {
    for redlock in [false, true] {
        let config = Config::default()
            .expiry(Duration::from_secs(5))
            .retry_delay(Duration::from_millis(2));
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

#[test]
fn background_renewal_runs_on_a_thread_spawner() {
    let manager = LockManager::single(MemoryNode::new(), Config::default())
        .unwrap()
        .with_spawner(|task| {
            std::thread::spawn(move || block_on(task));
        });
    let lock = manager
        .lock("job")
        .expiry(Duration::from_millis(300))
        .auto_renew(Duration::from_millis(100));
    let lease = block_on(lock.try_acquire()).unwrap();
    let first = lease.valid_until();
    std::thread::sleep(Duration::from_millis(700));
    assert!(lease.is_held(), "renewed past its original 300 ms TTL");
    assert!(lease.valid_until() > first + Duration::from_millis(300));
    block_on(lease.release()).unwrap();
}
