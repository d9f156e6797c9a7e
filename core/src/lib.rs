//! Redis-backed distributed leases: one Redis authority with fencing tokens, or Redlock over independent
//! primaries. Any Redis client (through [`RedisNode`]), any async runtime (nothing here spawns or calls a
//! runtime), deterministic tests (through `redlease-testkit`).
//!
//! ```
//! use std::time::Duration;
//! use redlease::{Config, LockManager};
//! # redlease_testkit::block_on(async {
//! # let node = redlease_testkit::MemoryNode::new();
//! // `node` is any RedisNode: redlease-adapters has redis-rs and fred ones; the testkit an in-memory one.
//! let manager = LockManager::single(node, Config::default())?;
//! let lock = manager
//!     .lock("reports:{nightly}:lock")
//!     .expiry(Duration::from_secs(30))
//!     .renew_every(Duration::from_secs(10))
//!     .fenced("reports:{nightly}:fence");
//!
//! let lease = lock.acquire().await?;
//! let fence = lease.fencing_token().expect("fenced locks issue a token");
//! // Renewed while the work runs; the work is stopped if the lease is lost.
//! let rows = lease.run(async { /* write with `fence`, which the store checks */ 42 }).await?;
//! lease.release().await?;
//! # assert_eq!(rows, 42);
//! # assert!(fence >= 1);
//! # Ok::<(), redlease::Error>(())
//! # }).unwrap();
//! ```
//!
//! # What a lease guarantees
//!
//! A lease is a time-bounded promise, not a mutex: a process paused longer than its lease keeps running
//! after another process has acquired the lock. Use the [fencing token](Lease::fencing_token) (single
//! mode) or another atomic condition at the protected resource when stale writes must be rejected. See the
//! README's safety section.
//!
//! # Layers
//!
//! - [`machine`]: pure, clock-free decision logic (quorum tally, validity, retry and renewal schedules).
//! - the driver: runs rounds of [`RedisNode`] calls concurrently, bounded by the operation timeout, on a
//!   [`Timer`].
//! - the API: [`LockManager`], [`Lock`], [`Lease`], [`LossSignal`], [`Error`].
//!
//! # Observability
//!
//! - [`LockManager::with_observer`]: an [`Observer`] told of every acquisition attempt, extension, renewal
//!   failure and recovery, loss, release and clean-up ([`LeaseEvent`]); free when none is installed.
//! - feature `tracing`: spans (`redlease.acquire`, `redlease.extend`, `redlease.release`,
//!   `redlease.renewal`) and events at operator levels (loss and at-risk at warn, contention at debug); never
//!   a token.
//! - feature `metrics`: `metrics::MetricsObserver`, counters, histograms and a gauge over the `metrics`
//!   facade (the table of series is in its module).
//!
//! Both features are off by default and add no dependency when off.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod driver;
mod error;
mod lease;
pub mod machine;
mod manager;
mod node;
mod observe;
mod time;
mod token;
mod trace;

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;

pub use async_trait::async_trait;
pub use config::{Config, ConfigError};
pub use driver::{Mode, Spawn, Task};
pub use error::{Error, LossReason, NotAcquiredReason, Operation, QuorumError};
pub use lease::{Lease, LeaseState, LossSignal, ReleaseReport};
pub use manager::{Lock, LockManager};
pub use node::{
    Applied, KeyState, NodeError, NodeErrorKind, NodeFuture, NodeWrapper, RedisNode, Ttl,
};
pub use observe::{
    AttemptOutcome, CleanupCause, EventKind, LeaseEvent, LeaseId, NodeReply, Nodes, Observer,
};
pub use time::{Sleep, SystemTimer, Timer};
pub use token::{TOKEN_BYTES, Token, TokenError};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
