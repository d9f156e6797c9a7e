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

/// The counter is the process's: one test counts at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn an_uncontended_acquire_and_release_pair_makes_at_most_six_allocations() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
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

/// An extension of a held lease, without durability or an unconfirmed shorter extension, allocates once: the
/// node call's box (`async_trait`). The round's wrapper future, which waits for replicas or refuses a count,
/// is built only where one of those applies (on `MemoryNode`, whose calls allocate nothing else).
#[test]
fn an_extension_without_durability_makes_one_allocation() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let manager = LockManager::single(MemoryNode::new(), Config::default()).unwrap();
    let lease = block_on(manager.lock("s7-extend").try_acquire()).unwrap();
    let extend = |n: usize| {
        block_on(async {
            for _ in 0..n {
                lease
                    .extend(std::time::Duration::from_secs(30))
                    .await
                    .unwrap();
            }
        })
    };
    extend(100);
    const EXTENSIONS: usize = 2_000;
    let before = INSTRUMENTED_SYSTEM.stats().allocations;
    extend(EXTENSIONS);
    let total = INSTRUMENTED_SYSTEM.stats().allocations - before;
    let per = total as f64 / EXTENSIONS as f64;
    eprintln!("{per:.4} allocations per extension");
    assert!(
        total <= BOUND * EXTENSIONS + EXTENSIONS / 100,
        "{per:.4} allocations per extension (the bound is {BOUND})"
    );
}

const BOUND: usize = 1;
