//! [`RedisNode`](redlease::RedisNode) implementations for Redis client crates, one feature per client:
//!
//! - `redis`: redis-rs, in [`redis`] ([`MultiplexedConnection`], [`ConnectionManager`] and the
//!   async cluster connection);
//! - `fred`: fred, in [`fred`] (`Client` and `Pool`, centralized or clustered).
//!
//! Observability features (off by default): `tracing` turns on redlease's spans and events and adds
//! `trace::Traced`, a span per node call; `metrics` turns on redlease's `metrics::MetricsObserver`.
//!
//! Each module re-exports its client crate (`redlease_adapters::redis::redis`,
//! `redlease_adapters::fred::fred`) so that versions match. (The modules themselves carry the crates' names,
//! so the re-exports live inside them rather than at the crate root.)
//!
//! Both adapters run the same Lua scripts ([`scripts`]) as `EVALSHA` with a single `EVAL` fallback on
//! `NOSCRIPT`, classify client errors into definite and ambiguous [`NodeError`](redlease::NodeError)s, and
//! check Redis Cluster hash slots client-side ([`slot`]) before a fenced acquisition.
//!
//! [`MultiplexedConnection`]: https://docs.rs/redis/latest/redis/aio/struct.MultiplexedConnection.html
//! [`ConnectionManager`]: https://docs.rs/redis/latest/redis/aio/struct.ConnectionManager.html
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(feature = "redis", feature = "fred"))]
mod ops;
pub mod scripts;
pub mod slot;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

#[cfg(feature = "fred")]
#[cfg_attr(docsrs, doc(cfg(feature = "fred")))]
pub mod fred;

#[cfg(feature = "tracing")]
#[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
pub mod trace;
