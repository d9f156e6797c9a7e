//! Redis-backed distributed leases: one Redis authority with fencing tokens, or Redlock over independent
//! primaries. Any Redis client (through [`RedisNode`]), any async runtime (nothing here spawns or calls a
//! runtime), deterministic tests (through `redlease-testkit`).
//!
//! ```
//! # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
//! use std::time::Duration;
//! use redlease::{Config, LockManager};
//! # block_on(async {
//! # let node = MapNode::default();
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
//! # Connecting to Redis
//!
//! [redlease-adapters](https://docs.rs/redlease-adapters) implements [`RedisNode`] for redis-rs and fred,
//! with runtime glue for tokio and smol and one-line managers from URLs
//! (`redlease_adapters::redis::single(url, config)`); [redlease-testkit](https://docs.rs/redlease-testkit)
//! has the in-memory node used in these examples, fault injection and virtual time.
//!
//! # What a lease guarantees
//!
//! A lease is a time-bounded promise, not a mutex: a process paused longer than its lease keeps running
//! after another process has acquired the lock. Use the [fencing token](Lease::fencing_token) (single
//! mode) or another atomic condition at the protected resource when stale writes must be rejected. The
//! [safety model](safety) says what redlease guarantees and what no Redis lock can.
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

mod batch_queue;
mod check;
mod config;
mod driver;
mod error;
mod lease;
pub mod machine;
mod manager;
mod mode;
mod multi;
mod node;
mod node_error;
pub mod notify;
mod observe;
mod semaphore;
mod ticket;
mod time;
mod token;
mod trace;

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;

pub use async_trait::async_trait;
pub use check::{CHECK_TIMEOUT_FLOOR, CheckReport, CommandPaths, NodeCheck, Path, Readiness};
pub use config::{Config, ConfigError, Durability, MAX_KEY_BYTES};
pub use driver::{Lock, MAX_HOLDER_INFO_BYTES, Spawn, Task};
pub use error::{Error, LossReason, NotAcquiredReason, Operation, QuorumError};
pub use lease::{Lease, LeaseState, LossSignal, ReleaseReport};
pub use manager::{HolderInfo, LockManager};
pub use mode::Mode;
pub use multi::{MultiLease, MultiLock};
pub use node::{
    Applied, Claim, ClaimRequest, ExtendItem, KeyState, MultiKeyItem, MultiKeyOp, MultiKeyReply,
    NodeError, NodeErrorKind, NodeFuture, NodeProfile, NodeWrapper, PermitOp, PermitReply,
    RedisNode, ReplicaWait, RunId, RunIdSlot, Ttl,
};
pub use observe::{
    AttemptOutcome, CleanupCause, EventKind, LeaseEvent, LeaseId, NodeReply, Nodes, Observer,
};
pub use semaphore::{FAIR_QUEUE_LIMIT, RwLock, Semaphore, semaphore_quorum};
pub use ticket::{LeaseTicket, TicketError};
pub use time::{Sleep, SystemTimer, Timer};
pub use token::{TOKEN_BYTES, Token, TokenError};

/// The safety model: what a lease does and does not guarantee.
///
/// (The README's section of the same name, word for word; a test compares them.)
///
#[doc = include_str!("safety.md")]
pub mod safety {}

/// The README's examples (the crate's registry page), compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod readme {
    /// The README's "Safety model" section, up to the next section.
    fn readme_section() -> String {
        let readme = include_str!("../README.md");
        let start = readme
            .find("## Safety model")
            .expect("the README has a safety model section");
        let section = &readme[start..];
        let end = section[1..]
            .find("\n## ")
            .map_or(section.len(), |end| end + 1);
        let body = section[..end].split_once('\n').map_or("", |(_, b)| b);
        format!("{}\n", body.trim_matches('\n'))
    }

    #[test]
    fn the_safety_module_is_the_readmes_safety_section_word_for_word() {
        assert_eq!(include_str!("safety.md"), readme_section());
    }
}
