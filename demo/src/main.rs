//! Several workers contend for one fenced lock and print who holds it, with which fencing token.
//!
//! Runs on the embedded in-memory backend: no Redis needed. Each worker is an OS thread driving its own
//! futures with a minimal executor, which shows that redlease needs no async runtime.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlease::{Config, Error, LockManager, SystemTimer, Timer};
use redlease_testkit::{MemoryNode, block_on};

const WORKERS: u64 = 4;
const ROUNDS: u64 = 3;

fn main() -> Result<(), Error> {
    let node = MemoryNode::new();
    let manager = LockManager::single(
        node,
        Config::default()
            .expiry(Duration::from_secs(2))
            .retry_delay(Duration::from_millis(40)),
    )?;
    println!("redlease demo: {WORKERS} workers, one fenced lock, in-memory backend\n");

    let started = Instant::now();
    let last_fence = Arc::new(AtomicU64::new(0));
    let stale = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (1..=WORKERS)
        .map(|id| {
            let lock = manager
                .lock("demo:{report}:lock")
                .fenced("demo:{report}:fence")
                .auto_renew(Duration::from_millis(600));
            let last_fence = Arc::clone(&last_fence);
            let stale = Arc::clone(&stale);
            std::thread::spawn(move || -> Result<(), Error> {
                block_on(async {
                    for _ in 0..ROUNDS {
                        let lease = lock.acquire_within(Duration::from_secs(30)).await?;
                        let fence = lease.fencing_token().unwrap_or_default();
                        // A fenced store accepts only growing tokens; the demo checks the same property.
                        let previous = last_fence.swap(fence, Ordering::SeqCst);
                        let order = if fence > previous {
                            "ok"
                        } else {
                            stale.fetch_add(1, Ordering::SeqCst);
                            "STALE"
                        };
                        println!(
                            "{:>6.2}s  worker {id} holds the lock  fencing token {fence:>2} ({order}, previous {previous})",
                            started.elapsed().as_secs_f64()
                        );
                        lease.run(pause(Duration::from_millis(150))).await?;
                        lease.release().await?;
                        // Give the others a chance before trying again.
                        pause(Duration::from_millis(60)).await;
                    }
                    Ok(())
                })
            })
        })
        .collect();
    for worker in workers {
        match worker.join() {
            Ok(result) => result?,
            Err(_) => eprintln!("a worker thread panicked"),
        }
    }
    let stale = stale.load(Ordering::SeqCst);
    println!(
        "\n{} acquisitions; {} with a fencing token that did not increase",
        WORKERS * ROUNDS,
        stale
    );
    if stale > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// A runtime-free sleep: redlease's default timer (futures-timer) works on any executor.
async fn pause(d: Duration) {
    SystemTimer.sleep_until(Instant::now() + d).await;
}
