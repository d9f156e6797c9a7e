//! Test doubles for [`redlease`]: make lock logic testable deterministically.
//!
//! - [`MemoryNode`]: an in-memory node with Redis semantics for redlease's operations, on any clock.
//! - [`FaultyNode`] and [`Faults`]: latency, failures, hangs, lost replies and partitions around any node,
//!   scripted per operation or random from a seed.
//! - [`Sim`] and [`VirtualClock`]: a deterministic executor on virtual time; a 30-second lease lifecycle
//!   runs in microseconds and a failing seed prints how to replay it.
//! - [`History`]: records what lease holders believed and checks that no two overlapped.
//! - [`proxy::FaultProxy`]: a TCP proxy that delays, blackholes, resets or drops replies, for live tests.
//! - [`conformance`]: the contract suite any [`RedisNode`](redlease::RedisNode) can run in one call.
#![forbid(unsafe_code)]

pub mod conformance;
mod fault;
mod history;
mod memory;
pub mod proxy;
mod recorder;
pub mod server;
mod sim;

pub use fault::{Fault, Faults, FaultyNode, Op, RandomFaults};
pub use history::{Event, EventKind, History, Violation};
pub use memory::MemoryNode;
pub use sim::{Sim, SimSpawner, VirtualClock, block_on, for_each_seed};
