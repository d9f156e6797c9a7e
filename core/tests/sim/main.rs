//! The simulation tier: in-memory nodes, injected faults and virtual time. No sockets, no sleeps.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod acquire;
mod batch;
mod cancel;
mod check;
mod clock_jump;
mod config;
mod defects;
mod duplicates;
mod durable;
mod fair;
mod fresh;
mod handoff;
mod history;
mod hold;
mod holder;
mod multi;
mod observe;
mod push;
mod redundancy;
mod renewal;
mod restart;
mod rwlock;
mod semaphore;
mod signal;
mod support;
mod waiting;
