//! The batched renewer's queue keeps a `Weak` per lease, which holds the lease's allocation until its entry
//! comes due. Many short leases (one per job), released long before their next renewal, must not pile up.
//! A test binary of its own: it counts the whole process's live heap.

use std::alloc::System;
use std::time::Duration;

use redlease::{Config, LockManager};
use redlease_testkit::{MemoryNode, Sim};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn live() -> i128 {
    let s = INSTRUMENTED_SYSTEM.stats();
    s.bytes_allocated as i128 - s.bytes_deallocated as i128
}

#[test]
fn released_batched_leases_do_not_stay_allocated_until_their_next_renewal() {
    let mut sim = Sim::new(61);
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    let config = Config::default()
        .with_jitter_seed(61)
        .with_renewal_batching(Duration::from_millis(5), 100);
    let manager = LockManager::single(node, config)
        .unwrap()
        .with_timer(clock.clone())
        .with_spawner(sim.spawner());
    let churn = |sim: &mut Sim, jobs: std::ops::Range<u32>| {
        for i in jobs {
            // A job's lease, renewed every 10 s, released at once (long before its first renewal).
            let lock = manager
                .lock(format!("job:{i}"))
                .auto_renew(Duration::from_secs(10));
            sim.block_on(async move {
                let lease = lock.try_acquire().await.unwrap();
                lease.release().await.unwrap();
            });
        }
    };
    // Warm up (the renewer, the node's maps, the sim's queues), then measure 5 000 more jobs.
    churn(&mut sim, 0..1_000);
    let before = live();
    churn(&mut sim, 1_000..6_000);
    let grown = live() - before;
    // A lease's allocation is about 400 B: 5 000 kept until their renewal would be ~2 MB.
    assert!(
        grown < 400_000,
        "the live heap grew by {grown} B over 5 000 released leases"
    );
}
