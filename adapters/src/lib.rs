//! [`RedisNode`](redlease::RedisNode) implementations for Redis client crates, one feature per client:
//!
//! - `redis`: redis-rs, in [`redis`] (nodes over a [`MultiplexedConnection`] or a [`ConnectionManager`]);
//!   `redis-cluster` adds `redis::ClusterNode` (redis-rs's async cluster connection) and `redis-sentinel`
//!   `redis::SentinelNode`, so that a user of one server compiles neither part of redis-rs;
//! - `fred`: fred, in [`fred`] (`Client` and `Pool`, centralized or clustered, and Sentinel).
//!
//! Runtime features select the client's runtime support and add runtime glue in [`runtime`]:
//!
//! - `tokio`: redis-rs on tokio; `runtime::TokioTimer` and `runtime::TokioSpawner`;
//! - `smol`: redis-rs on smol; `runtime::SmolSpawner`.
//!
//! redis-rs needs one of them (`features = ["redis", "tokio"]` or `["redis", "smol"]`; both: tokio inside a
//! tokio runtime, smol elsewhere). fred runs on tokio only: `fred` turns `tokio` on, and a fred node must be
//! called from a tokio runtime.
//!
//! One line to a manager from URLs: `redis::single(url, config)` / `redis::redlock(urls, config)` (and the
//! same in `fred`); a bad URL is a typed [`SetupError`] before anything is sent. Every constructor that takes
//! [`Timeouts`] (connection and response) keeps the server's endpoint, which Redlock uses to refuse one
//! server named twice.
//!
//! Observability features (off by default): `tracing` turns on redlease's spans and events and adds
//! `trace::Traced`, a span per node call; `metrics` turns on redlease's `metrics::MetricsObserver`.
//!
//! Each module re-exports its client crate (`redlease_adapters::redis::redis`,
//! `redlease_adapters::fred::fred`) so that versions match. (The modules themselves carry the crates' names,
//! so the re-exports live inside them rather than at the crate root.)
//!
//! Every node type of both adapters is a [`Node`] over its client's transport (`redis::MultiplexedNode`,
//! `redis::LazyNode`, `fred::ClientNode`, … are aliases of it): one [`RedisNode`](redlease::RedisNode)
//! implementation, and one set of builder methods (`with_endpoint`, `with_commands`, `probe`, …).
//!
//! Both adapters run the same Lua scripts ([`scripts`]) as `EVALSHA` with a single `EVAL` fallback on
//! `NOSCRIPT`, classify client errors into definite and ambiguous [`NodeError`](redlease::NodeError)s, and
//! check Redis Cluster hash slots client-side ([`slot`]) before a fenced acquisition.
//!
//! # What every node does before its first write
//!
//! The first acquisition on a connection (and the first after the connection failed) checks what the node
//! permits: a fresh acquisition runs [`scripts::PROBE_ACQUIRE`] (the check and the acquisition in one `EVAL`),
//! a script acquisition runs [`scripts::PROBE`] before its script. A user who may not run what a lease needs
//! (`EVAL`, and on Redis 7 the commands inside the scripts, checked with `redis.acl_check_cmd`) gets a
//! definite [`Auth`](redlease::NodeErrorKind::Auth) error before anything is written, so `try_acquire()`
//! never hands out a lease it could not extend or release. The check also learns whether the server accepts
//! `SET … NX GET` (Redis 7.0+): later fresh acquisitions are that one command (a key of another type is
//! `WRONGTYPE` there, as in the acquire script, so one attempt or three give the same answer); on older
//! servers they are [`scripts::ACQUIRE_FRESH`]. Neither touches an existing key. Nothing is cached after a
//! refusal, so a corrected ACL takes effect at the next call.
//!
//! The same check learns which native conditional commands the connection offers and the user may run
//! (`SET … IFEQ` on Valkey 8.1+, `DELIFEQ` on Valkey 9.0+; probed by command, never from version strings), and
//! each operation chooses its path from that and the node's [`Commands`] mode: release by `DELIFEQ` where
//! present, scripts otherwise; where scripts cannot run (Lua absent, or `EVAL` refused by the ACL) every
//! operation is native, the fenced acquisition included (three steps; see the README's "Servers" section for
//! the design and the gaps it may leave in the fence sequence), and extension is a watched `PEXPIRE … GT`.
//! No path extends with `SET … IFEQ … PX`: an extension never shortens a key
//! ([`RedisNode`](redlease::RedisNode#extensions-never-shorten-a-key)), and that command sets exactly its TTL.
//!
//! # Order
//!
//! Requests for one key sent by one node are applied in the order they were sent, or a stale one fails (its
//! caller got an error, never a success): redis-rs nodes write on one connection at a time (a reconnect
//! replaces a connection only after it failed); a fred [`Client`](::fred::clients::Client) writes on one
//! connection per server, and a fred pool sends every command for one key through one member
//! ([`fred::KeyRouted`]).
//!
//! # Error classification
//!
//! Every server error and client condition becomes one [`NodeErrorKind`](redlease::NodeErrorKind); "applied"
//! says whether the command may have taken effect, "permanent" whether the core ends an acquisition at once
//! ([`NodeErrorKind::is_permanent`](redlease::NodeErrorKind::is_permanent)) instead of retrying:
//!
//! | Reply or condition | Kind | Applied | Permanent |
//! |---|---|---|---|
//! | `NOPERM …`; `ERR The user executing the script can't …` (Redis 7.0's in-script refusal); the probe's `NOPERM redlease: …`; `WRONGPASS`, `NOAUTH`, a refused login (also fred's last reconnection) | `Auth` | no | yes |
//! | `WRONGTYPE` (the lock key holds another type; the message names the lock key) | `WrongType` | no | yes |
//! | a node pinned to [`Commands::Native`] on a server without `DELIFEQ`/`SET … IFEQ`, or to [`Commands::Scripts`] where Lua is absent | `Unsupported` | no | yes |
//! | `FENCE …`: the fence key holds another type, is not a non-negative integer, has a TTL, is exhausted, or is missing while the lock holds our token (the message names the fence key) | `Fence` | no | yes |
//! | lock and fence keys in different Cluster slots (checked before sending), `CROSSSLOT` | `CrossSlot` | no | yes |
//! | `READONLY` (a replica) | `ReadOnly` | no | no |
//! | `OOM` | `OutOfMemory` | no | no |
//! | `BUSY`, `LOADING`, `MASTERDOWN`; fred backpressure | `Busy` | no | no |
//! | `TRYAGAIN`, `CLUSTERDOWN`, `MOVED`/`ASK` (never followed), fred: no route to the slot's node | `Cluster` | no | no |
//! | redis-rs: no connection to the slot's node | `Cluster` | maybe | no |
//! | `NOSCRIPT` (answered by one `EVAL`; reported only if that fails too) | `NoScript` | no | no |
//! | connection refused; not connected (fred fail-fast, or after fred announced a dropped connection); a redis-rs multiplexed connection seen to drop earlier; a lazy node's failed connection attempt | `Connection` | no | no |
//! | connection closed or reset with the request possibly written; fred's "too many failed write attempts" after a reconnection | `Connection` | maybe | no |
//! | the client's response or command timeout | `Timeout` | maybe | no |
//! | other I/O errors | `Io` | maybe | no |
//! | a reply of the wrong shape | `Protocol` | maybe | no |
//! | `ERR redlease: invalid …` (a script argument out of range: a bug in the caller), other `ERR` replies | `Other` | no | no |
//! | anything else | `Other` | maybe | no |
//!
//! [`MultiplexedConnection`]: https://docs.rs/redis/latest/redis/aio/struct.MultiplexedConnection.html
//! [`ConnectionManager`]: https://docs.rs/redis/latest/redis/aio/struct.ConnectionManager.html
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod commands;
#[cfg(any(feature = "redis", feature = "fred"))]
mod node;
#[cfg(any(feature = "redis", feature = "fred"))]
mod ops;
pub use commands::{Capabilities, Commands};
#[cfg(any(feature = "redis", feature = "fred"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "redis", feature = "fred"))))]
pub use node::Node;
mod setup;
pub use setup::{SetupError, Timeouts};
pub mod scripts;
pub mod slot;

// Without a runtime feature only the `compile_error!` below speaks.
#[cfg(all(feature = "redis", any(feature = "tokio", feature = "smol")))]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

#[cfg(feature = "fred")]
#[cfg_attr(docsrs, doc(cfg(feature = "fred")))]
pub mod fred;

#[cfg(feature = "tracing")]
#[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
pub mod trace;

#[cfg(any(feature = "tokio", feature = "smol"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "tokio", feature = "smol"))))]
pub mod runtime;

#[cfg(all(feature = "redis", not(any(feature = "tokio", feature = "smol"))))]
compile_error!(
    "redlease-adapters: the `redis` feature needs a runtime feature too, which selects redis-rs's runtime \
     support: add `tokio` or `smol` to the features (for example `features = [\"redis\", \"tokio\"]`)"
);

/// The README's examples, compiled as doctests (they need both clients and a runtime feature).
#[cfg(all(doctest, feature = "redis", feature = "fred", feature = "tokio"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
