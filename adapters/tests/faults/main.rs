//! Live fault tests: real `redis-server` processes that the tests start themselves, broken on purpose with
//! SIGSTOP/SIGCONT, `CLIENT KILL` and the testkit's TCP fault proxy (latency, blackhole, dropped replies),
//! for both adapters (redis-rs and fred), in single and Redlock mode.
//!
//! Each test skips with a `SKIP` line (one per binary and missing binary) when no `redis-server` is installed (and fails instead with
//! `REDLEASE_REQUIRE_REDIS=1`). The cancellation test is seeded: it prints its seed, and `REDLEASE_SEED`
//! replays a failure.

// Test helpers outside `#[test]` functions must fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cancellation;
mod client_kill;
mod cluster;
mod common;
mod extend_partial;
mod hung;
mod lost_reply;
mod lost_reply_retry;
mod matrix;
mod renewal;
mod slow_quorum;
mod stall;
mod transaction_replay;
