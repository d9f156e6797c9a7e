//! Batched renewal: the background renewals of many leases of one manager, due within a short window of
//! each other, go to each node as one [`RedisNode::extend_many`](crate::RedisNode::extend_many) call.
//!
//! Each lease keeps its own token, TTL, unconfirmed-extension record, validity (measured from the batch
//! round's start), at-risk and loss handling: the batch only shares the round trip. A lease that a node
//! answers "not held" for is lost alone; a node error fails that node's vote for every lease of the call,
//! exactly as it would have failed each lease's own call.
//!
//! The first renewal to arrive opens a window of [`Config::renewal_batching`](crate::Config) length; when
//! it closes, or when the batch is full, the batch is sent on the manager's spawner. A renewal is therefore
//! late by at most the window, and a batch never holds more than the configured size (nor more than any
//! node's [`extend_many_limit`](crate::RedisNode::extend_many_limit)).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::driver::{Engine, grace_floor};
use crate::lease::{Extension, Shared};
use crate::machine::{Reply, Tally, Verdict, WaitFor};
use crate::node::{ExtendItem, NodeError, NodeErrorKind, NodeFuture, Ttl};

/// The renewals waiting for the next batch of one manager.
#[derive(Default)]
pub(crate) struct Batcher {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    pending: Vec<Pending>,
    /// A flush is scheduled for the open window.
    scheduled: bool,
}

struct Pending {
    lease: Arc<Shared>,
    ttl: Ttl,
    /// When this lease's round must end (its renewal's round timeout, counted from the submission, so
    /// that waiting for the batch never lets a round run past what the lease's schedule allowed).
    deadline: Instant,
    reply: Arc<ReplySlot>,
}

/// Where a batch leaves one lease's outcome for its renewal loop.
#[derive(Default)]
struct ReplySlot(Mutex<(Option<Extension>, Option<Waker>)>);

impl ReplySlot {
    fn put(&self, outcome: Extension) {
        let waker = {
            let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
            slot.0 = Some(outcome);
            slot.1.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Resolves with the lease's outcome once its batch has run.
struct Outcome(Arc<ReplySlot>);

impl Future for Outcome {
    type Output = Extension;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Extension> {
        let mut slot = self.0.0.lock().unwrap_or_else(|p| p.into_inner());
        match slot.0.take() {
            Some(outcome) => Poll::Ready(outcome),
            None => {
                slot.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
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

/// Renews `lease` to `ttl` in the next batch of its manager (whose [`Engine::batch_size`] is `Some(size)`),
/// its round ending at the latest `timeout` from now.
pub(crate) fn renew_in_batch(
    lease: &Arc<Shared>,
    ttl: Ttl,
    timeout: Duration,
    size: usize,
) -> impl Future<Output = Extension> + Send + 'static {
    let engine = Arc::clone(&lease.engine);
    let reply = Arc::new(ReplySlot::default());
    let pending = Pending {
        lease: Arc::clone(lease),
        ttl,
        deadline: crate::time::add(engine.timer.now(), timeout),
        reply: Arc::clone(&reply),
    };
    let (schedule, full) = {
        let mut q = engine
            .batcher
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        q.pending.push(pending);
        let schedule = !std::mem::replace(&mut q.scheduled, true);
        let full = if q.pending.len() >= size {
            Some(std::mem::take(&mut q.pending))
        } else {
            None
        };
        (schedule, full)
    };
    if let Some(spawner) = &engine.spawner {
        if let Some(batch) = full {
            // Full before its window closed: send it now; the window's flush takes what comes after.
            let engine = Arc::clone(&engine);
            spawner.spawn(Box::pin(async move { run_batch(&engine, batch).await }));
        }
        if schedule {
            let window = engine
                .config
                .renewal_batching()
                .map_or(Duration::ZERO, |w| w.0);
            let flush = Arc::clone(&engine);
            spawner.spawn(Box::pin(async move {
                let at = crate::time::add(flush.timer.now(), window);
                flush.timer.sleep_until(at).await;
                let batch = {
                    let mut q = flush
                        .batcher
                        .queue
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    q.scheduled = false;
                    std::mem::take(&mut q.pending)
                };
                for chunk in chunks(batch, size) {
                    let engine = Arc::clone(&flush);
                    if let Some(spawner) = &flush.spawner {
                        spawner.spawn(Box::pin(async move { run_batch(&engine, chunk).await }));
                    }
                }
            }));
        }
    }
    Outcome(reply)
}

fn chunks(mut batch: Vec<Pending>, size: usize) -> Vec<Vec<Pending>> {
    let mut out = Vec::new();
    while batch.len() > size {
        let rest = batch.split_off(size);
        out.push(std::mem::replace(&mut batch, rest));
    }
    if !batch.is_empty() {
        out.push(batch);
    }
    out
}

/// One batched extension round: every lease of `batch` on every node, one call per node.
async fn run_batch(engine: &Engine, batch: Vec<Pending>) {
    if batch.is_empty() {
        return;
    }
    let unconfirmed: Vec<Option<Box<[u64]>>> = batch
        .iter()
        .map(|p| p.lease.prepare_extension(p.ttl))
        .collect();
    let items: Vec<ExtendItem<'_>> = batch
        .iter()
        .map(|p| ExtendItem::new(&p.lease.key, &p.lease.token, p.ttl))
        .collect();
    let n = engine.nodes.len();
    let quorum = engine.quorum();
    let mut tallies: Vec<Tally> = (0..batch.len())
        .map(|_| Tally::new(n, quorum, WaitFor::Decision))
        .collect();
    let started = engine.timer.now();
    let wall_started = engine.timer.wall_now();
    let deadline = batch.iter().map(|p| p.deadline).min().unwrap_or(started);
    let timeout = deadline.saturating_duration_since(started);
    let mut calls: Vec<Option<NodeFuture<'_, Vec<bool>>>> = engine
        .nodes
        .iter()
        .map(|node| Some(node.extend_many(&items)))
        .collect();
    let mut sleep = engine.timer.sleep_until(deadline);
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
                    Ok(flags) if flags[j] && shorter_pending(&unconfirmed[j], i, batch[j].ttl) => {
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
        if answered == n {
            return Poll::Ready(());
        }
        if tallies.iter().all(Tally::is_done) {
            if !tallies.iter().any(|t| t.verdict() == Verdict::Quorum) {
                return Poll::Ready(());
            }
            // Won for some leases: the stragglers get the same grace as in a single lease's round.
            let grace = grace.get_or_insert_with(|| {
                let now = engine.timer.now();
                let took = now.saturating_duration_since(started);
                let wait = took.saturating_mul(2).max(grace_floor(timeout));
                engine
                    .timer
                    .sleep_until(crate::time::add(now, wait).min(deadline))
            });
            if grace.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        if sleep.as_mut().poll(cx).is_ready() {
            let e = NodeError::timed_out(timeout);
            for tally in &mut tallies {
                tally.handle_timeout(&e);
            }
            return Poll::Ready(());
        }
        Poll::Pending
    })
    .await;
    drop(calls);
    let ended = engine.timer.now();
    let wall = (wall_started, engine.timer.wall_now());
    let suspended = |allowance| crate::time::suspended((started, ended), wall, allowance);
    for ((p, tally), _) in batch.iter().zip(&tallies).zip(&unconfirmed) {
        let outcome = p
            .lease
            .finish_extension(p.ttl, true, tally, started, ended, wall, suspended);
        p.reply.put(outcome);
    }
}

/// Whether node `i` has an unconfirmed extension of this lease with a TTL shorter than `ttl` (see
/// `Shared::extend_once`): a yes from it does not count.
fn shorter_pending(unconfirmed: &Option<Box<[u64]>>, i: usize, ttl: Ttl) -> bool {
    unconfirmed
        .as_deref()
        .and_then(|u| u.get(i).copied())
        .is_some_and(|min| min != 0 && min < ttl.as_millis())
}
