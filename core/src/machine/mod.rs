//! The pure, sans-I/O machines behind the driver.
//!
//! Nothing here reads a clock, sleeps, draws from a global random source or talks to a node: time arrives as
//! an [`Instant`](std::time::Instant) argument, randomness from a seeded [`Jitter`], replies through
//! `handle_*` methods, and decisions leave as plain values. The async driver composes them; tests drive them
//! directly with arbitrary times.
//!
//! - [`validity`]: drift allowance and the validity of a lease after a round.
//! - `Acquisition` (crate-internal): the decisions of one acquisition (attempts, clean-up, token rotation,
//!   classification of a failed attempt, when to try again).
//! - [`Tally`]: counts the replies of one fan-out round and says when the round is decided.
//! - [`Backoff`]: the pause between acquisition attempts, with seeded jitter.
//! - [`RenewalSchedule`]: when to renew next, and when a failing renewal turns into a loss.
//! - `Unconfirmed` (crate-internal): which nodes may still apply a lease's earlier request, written when a
//!   round is planned.
//! - `Holding` (crate-internal): a held lease's validity and loss state — whether it is valid at an instant
//!   (or expired, at its hold limit, suspended), what a finished extension or a planned round changes, the
//!   first loss, an at-risk period, an end that finds an unnoticed expiry.
//!
//! # Stability
//!
//! Using a lease never needs this module: [`LockManager`](crate::LockManager) and [`Lease`](crate::Lease)
//! drive it. It is public so that the algorithms can be read, property-tested and reused (a driver for
//! another store, a simulator), and it is covered by semantic versioning like the rest of the crate — but
//! before 1.0 expect it to change more often than the lease API: a new capability of the driver (batched
//! renewal, notifications) may change a machine's inputs or outputs, or add an enum variant, in a minor
//! release. Pin a minor version if you build on it.

pub(crate) mod acquisition;
pub(crate) mod holding;
pub(crate) mod nodeset;
mod quorum;
mod renewal;
mod retry;
pub(crate) mod slots;
pub(crate) mod unconfirmed;
pub mod validity;

pub use quorum::{Reply, Tally, Verdict, WaitFor, quorum};
pub use renewal::{RenewalSchedule, RenewalStep};
pub use retry::{Backoff, Jitter};
