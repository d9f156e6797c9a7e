//! Batched renewal: the background renewals of a manager's leases are done by one shared renewer, which
//! sends those due within a short window of each other to each node as one
//! [`RedisNode::extend_many`](crate::RedisNode::extend_many) call.
//!
//! A lease renewed this way has no task of its own: the renewer keeps one queue entry per lease (its next
//! renewal instant, or the deadline at which it is given up), sleeps until the earliest, and then takes every
//! lease due within [`Config::renewal_batching`](crate::Config)'s window of now — renewing those at most the
//! window early, never late — in batches of at most the configured size (nor more than any node's
//! [batch limit](crate::NodeProfile::batch_limit)), each sent on the manager's spawner. Leases
//! renewed in one batch share their round start, hence their next renewal instant: they stay together.
//!
//! Each lease keeps its own token, TTL, unconfirmed-extension record, validity (measured from the batch
//! round's start), at-risk and loss handling, and the same steps as a lease renewing on its own
//! (`Shared::renew`): see `Shared::visit` and `Shared::batch_outcome`. The batch only shares the round
//! trip. A lease that a node answers "not held" for is lost alone; a node error fails that node's vote for
//! every lease of the call, exactly as it would have failed each lease's own call. A manual extension holds
//! the lease's extension permit as usual; when it ends the lease's next renewal is planned afresh.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Engine;
use super::fanout::{Fanout, Pace, Parties};
use crate::batch_queue::{Batched, Entry};
use crate::machine::unconfirmed::counts;
use crate::machine::{Reply, Tally, WaitFor};
use crate::node::{ExtendItem, NodeError, NodeErrorKind};

/// A lease in a batch about to be sent.
struct Pending {
    lease: Arc<dyn Batched>,
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
            .profiles
            .iter()
            .map(|p| p.batch_limit)
            .min()
            .unwrap_or(0);
        (limit > 0).then_some(max.min(limit))
    }
}

/// Queues `entries`, starting the driver if none runs and waking it if it sleeps past one of them.
pub(crate) fn queue(engine: &Arc<Engine>, entries: impl IntoIterator<Item = Entry>) {
    let Some(spawner) = &engine.spawner else {
        return;
    };
    if engine.batcher.push(entries, true) {
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
            self.engine.batcher.driver_gone();
        }
    }
}

/// A batch on its way. Dropped before its round ended (by its spawner, or a runtime shutting down), it gives
/// the leases whose outcome it has not handled their extension permits back and queues them again, due now.
struct InFlight {
    engine: Arc<Engine>,
    batch: Vec<Pending>,
    /// Per lease, whether its outcome is still to be handled.
    open: Vec<bool>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let entries: Vec<Entry> = self
            .batch
            .iter()
            .zip(&self.open)
            .filter(|(_, open)| **open)
            .filter_map(|(p, _)| p.lease.abandon())
            .collect();
        // Not started from here: a spawner that just dropped this batch may drop a driver too. A running
        // driver takes them; otherwise the next queued entry starts one.
        self.engine.batcher.push(entries, false);
    }
}

/// The renewer's loop: visits the leases as they fall due and sends their batches.
async fn drive(engine: &Arc<Engine>) {
    let window = engine
        .config
        .renewal_batching()
        .map_or(Duration::ZERO, |(w, _)| w);
    let size = engine.batch_size().unwrap_or(1);
    while let Some(due) = engine.batcher.next_due(&engine.timer, window).await {
        let now = engine.timer.now();
        let mut batch = Vec::new();
        for d in due {
            let Some((lease, timeout, valid_until)) = d.visit() else {
                continue;
            };
            let span = crate::trace::span(crate::trace::SpanOf::Renewal(
                lease.key(),
                engine.mode,
                lease.id(),
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
    if let Some(spawner) = &engine.spawner {
        let mut flight = InFlight {
            engine: Arc::clone(engine),
            batch,
            open,
        };
        spawner.spawn(Box::pin(async move {
            let engine = Arc::clone(&flight.engine);
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
    let unconfirmed: Vec<Option<Box<[u64]>>> = batch.iter().map(|p| p.lease.prepare()).collect();
    let items: Vec<ExtendItem<'_>> = batch
        .iter()
        .map(|p| ExtendItem::new(p.lease.key(), p.lease.token(), p.lease.ttl()))
        .collect();
    let n = engine.nodes.len();
    let quorum = engine.quorum();
    let mut tallies: Vec<Tally> = (0..batch.len())
        .map(|_| Tally::new(n, quorum, WaitFor::Decision))
        .collect();
    let started = engine.timer.now();
    let wall_started = engine.timer.wall_now();
    let mut fanout = Fanout::new(n, |i| engine.nodes[i].extend_many(&items));
    std::future::poll_fn(|cx| {
        fanout.poll(
            cx,
            &engine.timer,
            Pace {
                started,
                grace: true,
            },
            &mut Parties {
                tallies: &mut tallies,
                deadline: |j: usize| batch[j].deadline,
                open,
            },
            |i, result, tallies| {
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
                        Ok(flags)
                            if flags[j]
                                && !counts(unconfirmed[j].as_deref(), i, batch[j].lease.ttl()) =>
                        {
                            Reply::Failed(NodeError::ambiguous(
                                NodeErrorKind::Other,
                                "extended, but not counted: an earlier, shorter extension of this lease \
                                 may still be applied on this node after it",
                            ))
                        }
                        Ok(flags) if flags[j] => Reply::Yes,
                        Ok(_) => Reply::No,
                        Err(e) => Reply::Failed(e.clone()),
                    };
                    tally.handle_reply(i, reply);
                }
            },
            // A lease whose round failed is handled at once, while the calls go on for the others.
            |j, tally| queue(engine, settle(&batch[j], tally, started, wall_started)),
        )
    })
    .await;
    drop(fanout);
    let mut next = Vec::with_capacity(batch.len());
    for (j, (p, tally)) in batch.iter().zip(&tallies).enumerate() {
        if std::mem::replace(&mut open[j], false) {
            next.extend(settle(p, tally, started, wall_started));
        }
    }
    queue(engine, next);
}

/// Handles the outcome of one lease's part of a batched round that started at `started`, in its renewal
/// span; returns the renewer's entry for its next visit, if there is one.
fn settle(
    p: &Pending,
    tally: &Tally,
    started: Instant,
    wall_started: Option<std::time::SystemTime>,
) -> Option<Entry> {
    // The lease's events of this round (extended, at risk, lost) in its renewal span.
    let _in = crate::trace::enter(&p.span);
    p.lease.settle(tally, started, wall_started, p.valid_until)
}
