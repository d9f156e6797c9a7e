//! Live tests against temporary `redis-server` processes (see `redlease_testkit::server`).
//!
//! Each test starts its own servers on free loopback ports and skips with a `SKIP` line (one per binary and missing binary) when no
//! `redis-server` is installed (fails instead with `REDLEASE_REQUIRE_REDIS=1`).

// Test helpers outside `#[test]` functions (node builders, occupancy checks) must fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod ambiguity;
mod auth;
mod batch;
mod check;
mod cluster;
mod common;
mod conformance;
mod examples;
mod executor;
mod lifetimes;
mod long_job;
mod matrix;
mod permissions;
mod probes;
mod push;
mod redlock;
mod redlock_stall;
mod redundancy;
mod renewal_loss;
mod replicas;
mod restarts;
mod scripts;
mod semaphore;
mod sentinel;
mod single;
mod split_vote;
#[path = "../shared/stats.rs"]
mod stats;
mod waits;
