//! The heap allocations of the uncontended hot path, counted exactly: one `try_acquire` + `release` pair on
//! the in-memory node (the benchmark's S7 row) makes at most six. A test binary of its own: it counts the
//! whole process's allocations.

#![allow(clippy::unwrap_used, missing_docs)]

use std::alloc::System;

use redlease::{Config, LockManager};
use redlease_testkit::{MemoryNode, block_on};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn an_uncontended_acquire_and_release_pair_makes_at_most_six_allocations() {
    let manager = LockManager::single(MemoryNode::new(), Config::default()).unwrap();
    let lock = manager.lock("s7");
    // Pairs inside one `block_on` (whose own waker is not the hot path).
    let pairs = |n: usize| {
        block_on(async {
            for _ in 0..n {
                let lease = lock.try_acquire().await.unwrap();
                lease.release().await.unwrap();
            }
        })
    };
    // Warm-up: lazily built state (the token generator, the in-memory node's map) is not the hot path.
    pairs(100);
    const PAIRS: usize = 2_000;
    let before = INSTRUMENTED_SYSTEM.stats().allocations;
    pairs(PAIRS);
    let total = INSTRUMENTED_SYSTEM.stats().allocations - before;
    let per_pair = total as f64 / PAIRS as f64;
    eprintln!("{per_pair:.4} allocations per try_acquire + release pair");
    // Six per pair, plus at most one per hundred pairs for one-off state (a table that grows once).
    assert!(
        total <= 6 * PAIRS + PAIRS / 100,
        "{per_pair:.4} allocations per pair (the bound is 6)"
    );
}
