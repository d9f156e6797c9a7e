//! What a fred node knows about its client's connection: the errors and reconnections fred reported, and the
//! start of a lazy client.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use fred::clients::Client;
use fred::error::Error as FredError;
use fred::interfaces::EventInterface;
use fred::types::config::Server;
use tokio::sync::broadcast;

/// What a node learned about one member client's connection from its errors and fred's notifications, behind
/// one lock (every command reads all of it before it is sent).
pub(super) struct Health(Mutex<HealthState>);

pub(super) struct HealthState {
    /// When a command last failed because the connection is gone, or fred last announced a connection error;
    /// cleared by fred's next reconnection.
    pub(super) broken: Option<Instant>,
    /// When the node last told fred to reconnect a Sentinel client whose primary stopped answering
    /// ([`FredTransport::primary_unresponsive`](super::FredTransport::primary_unresponsive)).
    pub(super) forced: Option<Instant>,
    pub(super) reconnects: broadcast::Receiver<Server>,
    pub(super) errors: broadcast::Receiver<(FredError, Option<Server>)>,
    /// The last connection error fred reported (kept: a later check may drain the channel first).
    pub(super) last_error: Option<FredError>,
}

impl Health {
    pub(super) fn new(client: &Client) -> Self {
        Self(Mutex::new(HealthState {
            broken: None,
            forced: None,
            reconnects: client.reconnect_rx(),
            errors: client.error_rx(),
            last_error: None,
        }))
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn mark_broken(&self) {
        self.lock().mark_broken();
    }

    /// The last connection error fred reported since the last reconnection, if any.
    pub(super) fn last_error(&self) -> Option<FredError> {
        let mut state = self.lock();
        state.saw_errors();
        state.last_error.clone()
    }
}

impl HealthState {
    pub(super) fn mark_broken(&mut self) {
        self.broken = Some(Instant::now());
    }

    /// Healed by a reconnection: the connection errors announced before it are superseded.
    pub(super) fn heal(&mut self) {
        self.broken = None;
        self.last_error = None;
    }

    /// Whether fred reconnected since the last call (also after missed notifications).
    pub(super) fn reconnected(&mut self) -> bool {
        // `is_empty` first: one lock of the channel where `try_recv` on an empty channel takes two.
        if self.reconnects.is_empty() {
            return false;
        }
        let mut seen = false;
        loop {
            match self.reconnects.try_recv() {
                Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => seen = true,
                Err(_) => return seen,
            }
        }
    }

    /// Whether fred reported connection errors since the last call; keeps the last one.
    pub(super) fn saw_errors(&mut self) -> bool {
        if self.errors.is_empty() {
            return false;
        }
        let mut seen = false;
        loop {
            match self.errors.try_recv() {
                Ok((err, _)) => {
                    self.last_error = Some(err);
                    seen = true;
                }
                Err(broadcast::error::TryRecvError::Lagged(_)) => seen = true,
                Err(_) => return seen,
            }
        }
    }
}

/// How a lazy node starts fred's connection task: one call at a time makes a connection attempt, and the
/// calls made while it is under way wait for it and take its outcome (so that concurrent first calls do not
/// fail as "not connected" while the first connection is being made).
#[derive(Default)]
pub(super) struct LazyStart {
    /// Whether `connect()` was called already (and fred's task may still be running).
    pub(super) started: AtomicBool,
    /// Whether an attempt is under way (set before `started`, cleared after `attempts` counted it).
    pub(super) in_progress: AtomicBool,
    /// Attempts finished so far.
    pub(super) attempts: AtomicU64,
    /// Whether the last attempt was dropped before it finished (its call was cut by a timeout, or its quorum
    /// was reached without it): the next call, or one waiting, takes it over.
    pub(super) abandoned: AtomicBool,
    /// Held by the call that makes the attempt; the others wait on it.
    pub(super) gate: tokio::sync::Mutex<()>,
}

/// Ends an attempt of [`LazyStart`]: finished, or abandoned when the call making it is dropped first.
pub(super) struct Attempt<'a> {
    pub(super) lazy: &'a LazyStart,
    pub(super) finished: bool,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if self.finished {
            self.lazy.attempts.fetch_add(1, Ordering::AcqRel);
        }
        self.lazy.abandoned.store(!self.finished, Ordering::Release);
        self.lazy.in_progress.store(false, Ordering::Release);
    }
}
