//! Test doubles for [`redlease`]: make lock logic testable deterministically, against a world as hostile as
//! a real network.
//!
//! - [`MemoryNode`]: an in-memory node with Redis semantics for redlease's operations, on any clock.
//! - [`FaultyNode`] and [`Faults`]: latency, failures, hangs, lost replies, partitions, and requests applied
//!   late — after the caller gave up, in order on a FIFO connection or reordered on a pool ([`Delivery`]) —
//!   scripted per operation or random from a seed ([`RandomFaults`], everything at once with
//!   [`RandomFaults::hostile`]).
//! - [`SkewedClock`]: a clock with its own rate error and offset, so each node expires keys on its own clock.
//! - [`Sim`] and [`VirtualClock`]: a deterministic executor on virtual time, with clients that can be paused
//!   ([`Sim::client`], [`Sim::pause`]); a 30-second lease lifecycle runs in microseconds and a failing seed
//!   prints how to replay it.
//! - [`cancel`]: drop a future after each of its polls in turn, to cancel it at every await point.
//! - [`History`]: records what lease holders believed and checks that no two overlapped, that fencing tokens
//!   increase and that losses were signalled in time (also by the client's own clock).
//! - [`proxy::FaultProxy`]: a TCP proxy that delays, blackholes, resets or drops replies, for live tests.
//! - [`server`] and [`sentinel`]: real server processes on loopback (single, several, a cluster, a primary
//!   with a replica and three Sentinels) that never outlive the test process.
//! - [`conformance`]: the contract suite any [`RedisNode`](redlease::RedisNode) can run in one call.
//! - `TokioTestTimer` (feature `tokio`): tokio's paused clock as a [`Timer`](redlease::Timer), for tests
//!   written with `#[tokio::test(start_paused = true)]`.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod cancel;
mod clock;
pub mod conformance;
mod fault;
mod history;
mod memory;
pub mod proxy;
mod recorder;
pub mod sentinel;
pub mod server;
mod sim;

pub use clock::SkewedClock;
pub use fault::{Delivery, Fault, Faults, FaultyNode, Op, RandomFaults};
pub use history::{
    ClientRecorder, ClientView, Event, EventKind, History, Timed, TimedEvent, Violation,
};
pub use memory::MemoryNode;
pub use sim::{Sim, SimSpawner, VirtualClock, block_on, for_each_seed};

#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
mod tokio_time;
#[cfg(feature = "tokio")]
pub use tokio_time::TokioTestTimer;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
