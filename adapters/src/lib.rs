//! [`RedisNode`](redlease::RedisNode) implementations for Redis client crates, one feature per client:
//!
//! - `redis`: redis-rs;
//! - `fred`: fred.
//!
//! Each module re-exports its client crate so that versions match.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The redis-rs client crate, re-exported.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis;

/// The fred client crate, re-exported.
#[cfg(feature = "fred")]
#[cfg_attr(docsrs, doc(cfg(feature = "fred")))]
pub use fred;
