//! Batched renewal: the background renewals of a manager's leases are done by one shared renewer, which
//! sends those due within a short window of each other to each node as one
//! [`RedisNode::extend_many`](crate::RedisNode::extend_many) call.
//!
//! A lease renewed this way has no task of its own: the renewer keeps one queue entry per lease (its next
//! renewal instant, or the deadline at which it is given up), sleeps until the earliest, and then takes every
//! lease due within [`Config::renewal_batching`](crate::Config)'s window of now — renewing those at most the
//! window early, never late — in batches of at most the configured size (nor more than any node's
//! [`extend_many_limit`](crate::RedisNode::extend_many_limit)), each sent on the manager's spawner. Leases
//! renewed in one batch share their round start, hence their next renewal instant: they stay together.
//!
//! Each lease keeps its own token, TTL, unconfirmed-extension record, validity (measured from the batch
//! round's start), at-risk and loss handling, and the same steps as a lease renewing on its own
//! (`Shared::renew`): see `Shared::visit` and `Shared::batch_outcome`. The batch only shares the round
//! trip. A lease that a node answers "not held" for is lost alone; a node error fails that node's vote for
//! every lease of the call, exactly as it would have failed each lease's own call. A manual extension holds
//! the lease's extension permit as usual; when it ends the lease's next renewal is planned afresh.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crate::driver::{Engine, grace_floor};
use crate::lease::Shared;
use crate::machine::unconfirmed::counts;
use crate::machine::{RenewalStep, Reply, Tally, Verdict, WaitFor};
use crate::node::{ExtendItem, NodeError, NodeErrorKind, NodeFuture};
use crate::time::Sleep;

/// The shared renewer of one manager: the leases it renews, by when they are due.
#[derive(Default)]
pub(crate) struct Batcher {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    due: BinaryHeap<Entry>,
    /// A driver task runs (it ends when the queue is empty).
    driving: bool,
    /// While the driver sleeps: until when, and its waker (woken by an entry due earlier).
    sleeping: Option<(Instant, Waker)>,
    /// The queue length at which entries of leases gone since are dropped (see [`Batcher::push`]).
    compact_at: usize,
}

/// The smallest queue that is compacted.
const COMPACT_FLOOR: usize = 256;

/// One lease's next visit in the renewer's queue (see `Shared::requeue`). Ordered earliest first.
pub(crate) struct Entry {
    at: Instant,
    /// The lease's `batch_gen` when this was queued: a later entry supersedes it.
    generation: u32,
    /// Planned to give the lease up at `at` (no renewal could finish before its deadline).
    lost_at: bool,
    lease: Weak<Shared>,
}

impl Entry {
    pub(crate) fn new(lease: Weak<Shared>, generation: u32, step: RenewalStep) -> Self {
        let (at, lost_at) = match step {
            RenewalStep::RenewAt(t) => (t, false),
            RenewalStep::LostAt(t) => (t, true),
        };
        Self {
            at,
            generation,
            lost_at,
            lease,
        }
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        // `BinaryHeap` is a max-heap: the earliest instant is the greatest.
        other.at.cmp(&self.at)
    }
}

/// A lease in a batch about to be sent.
struct Pending {
    lease: Arc<Shared>,
    /// When this lease's round must end (its renewal's round timeout, counted from the visit).
    deadline: Instant,
    /// The lease's deadline when it was visited (for an at-risk report if the round fails).
    valid_until: Instant,
    /// The lease's `redlease.renewal` span for this round (with the `tracing` feature; nothing without).
    span: crate::trace::Span,
}

impl Engine {
    /// The batch size renewals of this manager use, or `None` when they renew one by one: batching is off,
    /// there is no spawner to send batches on, a node cannot take them, or a durability policy waits for
    /// replicas after each extension (a batch has no per-lease wait: those leases renew one by one).
    pub(crate) fn batch_size(&self) -> Option<usize> {
        let (_, max) = self.config.renewal_batching()?;
        if self.wait_allowance() > Duration::ZERO {
            return None;
        }
        self.spawner.as_ref()?;
        let limit = self
            .nodes
            .iter()
            .map(|n| n.extend_many_limit())
            .min()
            .unwrap_or(0);
        (limit > 0).then_some(max.min(limit))
    }
}

impl Batcher {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `entries`, starting the driver if none runs and waking it if it sleeps past one of them.
    pub(crate) fn queue(&self, engine: &Arc<Engine>, entries: impl IntoIterator<Item = Entry>) {
        let Some(spawner) = &engine.spawner else {
            return;
        };
        if self.push(entries, true) {
            let mut driving = Driving {
                engine: Arc::clone(engine),
                ended: false,
            };
            spawner.spawn(Box::pin(async move {
                drive(&driving.engine).await;
                driving.end();
            }));
        }
    }

    /// Pushes `entries` and wakes a sleeping driver if one of them is due earlier than it sleeps. With
    /// `start`, claims the driver's part if none runs: `true` if the caller must start one.
    fn push(&self, entries: impl IntoIterator<Item = Entry>, start: bool) -> bool {
        let (start, wake) = {
            let mut q = self.lock();
            let mut earliest: Option<Instant> = None;
            for due in entries {
                earliest = Some(earliest.map_or(due.at, |e| e.min(due.at)));
                q.due.push(due);
            }
            let Some(earliest) = earliest else {
                return false;
            };
            if q.due.len() >= q.compact_at.max(COMPACT_FLOOR) {
                // An entry holds a `Weak`, which keeps its lease's allocation until the entry comes due: with
                // many short leases (one per job) released long before their next renewal, drop the entries
                // of leases that are gone, so that they stay within twice what is live.
                q.due.retain(|d| d.lease.strong_count() > 0);
                q.compact_at = q.due.len().saturating_mul(2);
            }
            let start = start && !std::mem::replace(&mut q.driving, true);
            let wake = match &q.sleeping {
                Some((until, _)) if earliest < *until => q.sleeping.take().map(|(_, w)| w),
                _ => None,
            };
            (start, wake)
        };
        if let Some(waker) = wake {
            waker.wake();
        }
        start
    }

    /// Waits for the earliest entry to fall due; then takes it and every entry due within `window` of now.
    /// `None` when the queue is empty (the driver then ends; the next entry starts another).
    async fn next_due(&self, engine: &Engine, window: Duration) -> Option<Vec<Entry>> {
        let mut sleep: Option<(Instant, Sleep)> = None;
        std::future::poll_fn(|cx| {
            loop {
                let now = engine.timer.now();
                let mut q = self.lock();
                let Some(first) = q.due.peek() else {
                    q.driving = false;
                    q.sleeping = None;
                    return Poll::Ready(None);
                };
                if first.at <= now {
                    q.sleeping = None;
                    let horizon = crate::time::add(now, window);
                    let mut due = Vec::new();
                    while q.due.peek().is_some_and(|d| d.at <= horizon) {
                        due.extend(q.due.pop());
                    }
                    return Poll::Ready(Some(due));
                }
                let at = first.at;
                match &mut q.sleeping {
                    Some((until, waker)) if *until == at && waker.will_wake(cx.waker()) => {}
                    slot => *slot = Some((at, cx.waker().clone())),
                }
                drop(q);
                let timer = match &mut sleep {
                    Some((until, s)) if *until == at => s,
                    slot => &mut slot.insert((at, engine.timer.sleep_until(at))).1,
                };
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                sleep = None;
            }
        })
        .await
    }
}

/// Lets the next queued entry start another driver if this one is dropped before it ended (a spawner that
/// drops tasks, a runtime shutting down).
struct Driving {
    engine: Arc<Engine>,
    ended: bool,
}

impl Driving {
    /// The driver ended by itself (its queue was empty).
    fn end(&mut self) {
        self.ended = true;
    }
}

impl Drop for Driving {
    fn drop(&mut self) {
        if !self.ended {
            let mut q = self.engine.batcher.lock();
            q.driving = false;
            q.sleeping = None;
        }
    }
}

/// A batch on its way. Dropped before its round ended (by its spawner, or a runtime shutting down), it gives
/// the leases whose outcome it has not handled their extension permits back and queues them again, due now.
struct InFlight {
    batch: Vec<Pending>,
    /// Per lease, whether its outcome is still to be handled.
    open: Vec<bool>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(first) = self.batch.first() else {
            return;
        };
        let engine = Arc::clone(&first.lease.engine);
        let entries: Vec<Entry> = self
            .batch
            .iter()
            .zip(&self.open)
            .filter(|(_, open)| **open)
            .filter_map(|(p, _)| p.lease.abandon_batch())
            .collect();
        // Not started from here: a spawner that just dropped this batch may drop a driver too. A running
        // driver takes them; otherwise the next queued entry starts one.
        engine.batcher.push(entries, false);
    }
}

/// The renewer's loop: visits the leases as they fall due and sends their batches.
async fn drive(engine: &Arc<Engine>) {
    let window = engine
        .config
        .renewal_batching()
        .map_or(Duration::ZERO, |(w, _)| w);
    let size = engine.batch_size().unwrap_or(1);
    while let Some(due) = engine.batcher.next_due(engine, window).await {
        let now = engine.timer.now();
        let mut batch = Vec::new();
        for d in due {
            let Some(lease) = d.lease.upgrade() else {
                continue;
            };
            let Some((timeout, valid_until)) = lease.visit(d.generation, d.lost_at) else {
                continue;
            };
            let span = crate::trace::span(crate::trace::SpanOf::Renewal(
                &lease.key,
                engine.mode,
                lease.id,
            ));
            batch.push(Pending {
                lease,
                deadline: crate::time::add(now, timeout),
                valid_until,
                span,
            });
            if batch.len() >= size {
                send(engine, std::mem::take(&mut batch));
            }
        }
        if !batch.is_empty() {
            send(engine, batch);
        }
    }
}

/// Runs one batch on the manager's spawner.
fn send(engine: &Arc<Engine>, batch: Vec<Pending>) {
    let open = vec![true; batch.len()];
    let mut flight = InFlight { batch, open };
    if let Some(spawner) = &engine.spawner {
        let engine = Arc::clone(engine);
        spawner.spawn(Box::pin(async move {
            run_batch(&engine, &mut flight).await;
        }));
    }
}

/// One batched extension round: every lease of the batch on every node, one call per node.
///
/// Each lease keeps its own deadline: its tally times out at it, and a lease whose round failed is handled
/// then, while the calls go on for the others (up to the latest deadline). Leases that won are handled when
/// the round ends (after the stragglers' grace, as in a single lease's round); their validity counts from
/// the round's start either way.
async fn run_batch(engine: &Arc<Engine>, flight: &mut InFlight) {
    let batch = &flight.batch;
    let open = &mut flight.open;
    if batch.is_empty() {
        return;
    }
    let unconfirmed: Vec<Option<Box<[u64]>>> = batch
        .iter()
        .map(|p| p.lease.prepare_extension(p.lease.ttl).unconfirmed)
        .collect();
    let items: Vec<ExtendItem<'_>> = batch
        .iter()
        .map(|p| ExtendItem::new(&p.lease.key, &p.lease.token, p.lease.ttl))
        .collect();
    let n = engine.nodes.len();
    let quorum = engine.quorum();
    let mut tallies: Vec<Tally> = (0..batch.len())
        .map(|_| Tally::new(n, quorum, WaitFor::Decision))
        .collect();
    let started = engine.timer.now();
    let wall_started = engine.timer.wall_now();
    let latest = batch.iter().map(|p| p.deadline).max().unwrap_or(started);
    let mut calls: Vec<Option<NodeFuture<'_, Vec<bool>>>> = engine
        .nodes
        .iter()
        .map(|node| Some(node.extend_many(&items)))
        .collect();
    // The timer for the earliest deadline of a lease still waiting for replies.
    let mut sleep: Option<(Instant, crate::time::Sleep)> = None;
    let mut grace: Option<crate::time::Sleep> = None;
    let mut answered = 0;
    std::future::poll_fn(|cx| {
        for (i, slot) in calls.iter_mut().enumerate() {
            let Some(call) = slot else { continue };
            let Poll::Ready(result) = call.as_mut().poll(cx) else {
                continue;
            };
            *slot = None;
            answered += 1;
            let result = result.and_then(|flags| {
                if flags.len() == items.len() {
                    Ok(flags)
                } else {
                    Err(NodeError::ambiguous(
                        NodeErrorKind::Protocol,
                        format!(
                            "extend_many answered {} flags for {} items",
                            flags.len(),
                            items.len()
                        ),
                    ))
                }
            });
            for (j, tally) in tallies.iter_mut().enumerate() {
                let reply = match &result {
                    Ok(flags) if flags[j] && !counts(unconfirmed[j].as_deref(), i, batch[j].lease.ttl) => {
                        Reply::Failed(NodeError::ambiguous(
                            NodeErrorKind::Other,
                            "extended, but not counted: an earlier, shorter extension of this lease may \
                             still be applied on this node after it",
                        ))
                    }
                    Ok(flags) if flags[j] => Reply::Yes,
                    Ok(_) => Reply::No,
                    Err(e) => Reply::Failed(e.clone()),
                };
                tally.handle_reply(i, reply);
            }
        }
        loop {
            let now = engine.timer.now();
            // Each lease's round ends at its own deadline; one that failed is handled at once.
            for (j, (p, tally)) in batch.iter().zip(tallies.iter_mut()).enumerate() {
                if !open[j] {
                    continue;
                }
                if !tally.is_done() && now >= p.deadline {
                    tally.handle_timeout(&NodeError::timed_out(
                        p.deadline.saturating_duration_since(started),
                    ));
                }
                if tally.is_done() && tally.verdict() != Verdict::Quorum {
                    open[j] = false;
                    engine
                        .batcher
                        .queue(engine, settle(p, tally, started, wall_started));
                }
            }
            if answered == n || !open.contains(&true) {
                return Poll::Ready(());
            }
            let waiting = batch
                .iter()
                .zip(&tallies)
                .zip(open.iter())
                .filter(|((_, t), open)| **open && !t.is_done())
                .map(|((p, _), _)| p.deadline)
                .min();
            let Some(at) = waiting else {
                // Every open lease won: the stragglers get the same grace as in a single lease's round.
                let grace = grace.get_or_insert_with(|| {
                    let took = now.saturating_duration_since(started);
                    let wait = took
                        .saturating_mul(2)
                        .max(grace_floor(latest.saturating_duration_since(started)));
                    engine
                        .timer
                        .sleep_until(crate::time::add(now, wait).min(latest))
                });
                return grace.as_mut().poll(cx).map(|()| ());
            };
            let timer = match &mut sleep {
                Some((until, s)) if *until == at => s,
                slot => &mut slot.insert((at, engine.timer.sleep_until(at))).1,
            };
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            sleep = None;
        }
    })
    .await;
    drop(calls);
    let mut next = Vec::with_capacity(batch.len());
    for (j, (p, tally)) in batch.iter().zip(&tallies).enumerate() {
        if std::mem::replace(&mut open[j], false) {
            next.extend(settle(p, tally, started, wall_started));
        }
    }
    engine.batcher.queue(engine, next);
}

/// Handles the outcome of one lease's part of a batched round that started at `started`; returns the
/// renewer's entry for its next visit, if there is one.
fn settle(
    p: &Pending,
    tally: &Tally,
    started: Instant,
    wall_started: Option<std::time::SystemTime>,
) -> Option<Entry> {
    let engine = &p.lease.engine;
    let ended = engine.timer.now();
    let wall = (wall_started, engine.timer.wall_now());
    let suspended = |allowance| crate::time::suspended((started, ended), wall, allowance);
    // The lease's events of this round (extended, at risk, lost) in its renewal span.
    let _in = crate::trace::enter(&p.span);
    let outcome =
        p.lease
            .finish_extension(p.lease.ttl, true, tally, started, ended, wall, suspended);
    p.lease.batch_outcome(outcome, p.valid_until)
}
