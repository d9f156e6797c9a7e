//! The simulation tier: in-memory nodes, injected faults and virtual time. No sockets, no sleeps.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod acquire;
mod batch;
mod cancel;
mod clock_jump;
mod config;
mod defects;
mod duplicates;
mod durable;
mod fresh;
mod history;
mod observe;
mod push;
mod redundancy;
mod renewal;
mod restart;
mod support;
mod waiting;
