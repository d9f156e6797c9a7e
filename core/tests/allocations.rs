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

/// Runs `ops(n)` (n operations inside one `block_on`, whose own waker is not the hot path) after a warm-up
/// of 100 (lazily built state — the token generator, the in-memory node's map — is not the hot path either),
/// and asserts that 2 000 of them made at most `bound` allocations each, plus at most one per hundred for
/// one-off state (a table that grows once).
fn assert_allocations_per_op(what: &str, bound: usize, ops: impl Fn(usize)) {
    ops(100);
    const OPS: usize = 2_000;
    let before = INSTRUMENTED_SYSTEM.stats().allocations;
    ops(OPS);
    let total = INSTRUMENTED_SYSTEM.stats().allocations - before;
    let per = total as f64 / OPS as f64;
    eprintln!("{per:.4} allocations per {what}");
    assert!(
        total <= bound * OPS + OPS / 100,
        "{per:.4} allocations per {what} (the bound is {bound})"
    );
}

/// The counter is the process's, so both bounds are measured in one test, one after the other (a test
/// running beside another counts its allocations, and the harness's too):
///
/// - an uncontended `try_acquire` + `release` pair makes at most six allocations;
/// - an extension of a held lease, without durability or an unconfirmed shorter extension, allocates once:
///   the node call's box (`async_trait`). The round's wrapper future, which waits for replicas or refuses a
///   count, is built only where one of those applies (on `MemoryNode`, whose calls allocate nothing else).
#[test]
fn hot_paths_allocate_within_their_bounds() {
    let manager = LockManager::single(MemoryNode::new(), Config::default()).unwrap();
    let lock = manager.lock("s7");
    assert_allocations_per_op("try_acquire + release pair", 6, |n| {
        block_on(async {
            for _ in 0..n {
                let lease = lock.try_acquire().await.unwrap();
                lease.release().await.unwrap();
            }
        })
    });
    let lease = block_on(manager.lock("s7-extend").try_acquire()).unwrap();
    assert_allocations_per_op("extension without durability", 1, |n| {
        block_on(async {
            for _ in 0..n {
                let ttl = std::time::Duration::from_secs(30);
                lease.extend(ttl).await.unwrap();
            }
        })
    });
}
