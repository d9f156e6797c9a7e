//! The notifier's shared state: channels, waiters and the queue of subscription commands, and the
//! decisions on them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::task::Waker;
use std::time::Instant;

use crate::node_error::NodeError;

use super::*;

/// Counters of a [`Notifier`], for tests and operators.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotifierStats {
    /// Channels subscribed, or being subscribed or unsubscribed, now (what the budget counts).
    pub channels: usize,
    /// Registered waiters now.
    pub waiters: usize,
    /// Whether a subscriber connection may be open (something was subscribed since the last close).
    pub connected: bool,
    /// Subscriptions confirmed so far.
    pub subscribes: u64,
    /// Unsubscriptions confirmed so far.
    pub unsubscribes: u64,
    /// Times the subscriber connection was closed because no waiter needed it any more.
    pub closes: u64,
    /// Times the subscriber connection was reported lost.
    pub lost: u64,
    /// Messages delivered (after the filter).
    pub notifications: u64,
    /// Messages the [filter](Notifier::set_filter) dropped.
    pub filtered: u64,
    /// Messages ignored because a waiter of the channel released that token itself ([`Watch::own`]).
    pub own: u64,
    /// Waiters woken by a message or by a confirmed subscription.
    pub wakeups: u64,
    /// Notifications held back because an attempt of the channel's waiters was in flight (delivered when it
    /// ends without a win).
    pub deferred: u64,
    /// Notifications that woke nobody because a waiter of the channel already held one.
    pub coalesced: u64,
    /// Times the subscriber reported messages dropped before delivery ([`Inbox::missed`]).
    pub missed: u64,
    /// Subscriptions refused because the budget was used up (those waiters polled).
    pub over_budget: u64,
    /// Subscriptions that failed (those waiters polled).
    pub failures: u64,
}

/// How an attempt ended, for [`Watch::end_attempt`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The acquisition holds the lock now.
    Won,
    /// Another owner holds the lock (the attempt was answered).
    Held,
    /// The attempt failed (errors, timeouts, too few nodes, validity used up): it says nothing about the
    /// lock. A notification that arrived meanwhile goes to another waiter; the one that started the attempt
    /// stays with this waiter, which retries after its pause.
    Failed,
}

/// What [`Watch::subscribe`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Subscription {
    /// Confirmed by the server: a release from now on is delivered.
    Active,
    /// Asked for and not confirmed yet (its confirmation will wake the waiter); poll meanwhile.
    Pending,
    /// The channel budget is used up: poll.
    OverBudget,
    /// Subscribing failed recently: poll.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sub {
    /// Not subscribed on the server.
    None,
    /// A subscription is queued.
    Queued,
    /// The subscription command is in flight.
    Subscribing,
    /// Subscribed.
    Active,
    /// Subscribed, with an unsubscription queued (cancelled if a waiter comes back first).
    Leaving,
    /// The unsubscription is in flight; `back`: a waiter came back meanwhile, subscribe again after it.
    Unsubscribing { back: bool },
    /// Subscribing failed; not tried again before this instant (`None`: at once).
    Failed(Option<Instant>),
}

impl Sub {
    /// Whether the server holds (or is about to hold) this subscription: what the budget counts.
    pub(super) fn counts(self) -> bool {
        !matches!(self, Sub::None | Sub::Failed(_))
    }
}

pub(super) struct Channel {
    /// Registered waiters, longest registered first.
    pub(super) waiters: VecDeque<usize>,
    pub(super) sub: Sub,
    /// Attempts of this channel's waiters in flight.
    pub(super) attempts: usize,
    /// A message arrived while attempts were in flight: delivered when they end without a win.
    pub(super) pending: bool,
}

impl Channel {
    pub(super) fn new() -> Self {
        Self {
            waiters: VecDeque::new(),
            sub: Sub::None,
            attempts: 0,
            pending: false,
        }
    }
}

pub(super) struct Waiter {
    pub(super) channel: String,
    pub(super) waker: Option<Waker>,
    /// Holds a notification not yet used by an attempt.
    pub(super) notified: bool,
    /// An attempt is in flight.
    pub(super) attempting: bool,
    /// The attempt in flight was started by a notification.
    pub(super) triggered: bool,
    /// [`payload`]s of this waiter's own tokens.
    pub(super) own: Vec<[u8; PAYLOAD_LEN]>,
    /// A message wakes every waiter of the channel, not one ([`Watch::wake_every_waiter`]).
    pub(super) all: bool,
}

#[derive(Clone, PartialEq, Eq)]
pub(super) enum Op {
    Subscribe(String),
    Unsubscribe(String),
}

pub(super) enum OpSlot {
    Idle,
    /// An op in flight, waiting for its next poll; `driver` polled it last.
    Stored {
        op: Op,
        fut: SubscribeFuture,
        generation: u64,
        driver: usize,
    },
    /// Being polled right now (taken out of the lock) by the poll numbered so.
    Running(u64),
}

pub(super) struct State {
    pub(super) channels: HashMap<String, Channel>,
    pub(super) waiters: Vec<Option<Waiter>>,
    pub(super) free: Vec<usize>,
    pub(super) queue: VecDeque<Op>,
    pub(super) op: OpSlot,
    /// The subscriber connection's generation: bumped when it is lost or closed.
    pub(super) generation: u64,
    pub(super) max_channels: usize,
    pub(super) filter: Option<Filter>,
    pub(super) stats: NotifierStats,
    /// The latest clock reading a caller passed in (the core reads no clock of its own).
    pub(super) now_hint: Option<Instant>,
    /// Numbers the polls of a command taken out of the lock, so that a reset does not clobber a newer one.
    pub(super) next_run: u64,
}

pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    pub(super) subscriber: Box<dyn Subscriber>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn lost(&self, generation: u64) {
        let mut wake = Vec::new();
        {
            let mut st = self.lock();
            if st.generation != generation {
                return;
            }
            st.stats.lost += 1;
            st.reset_connection();
            // Subscribe again where waiters remain; until then their waiters poll (wake them to look).
            let names: Vec<String> = st.channels.keys().cloned().collect();
            for name in names {
                let Some(c) = st.channels.get_mut(&name) else {
                    continue;
                };
                if c.waiters.is_empty() {
                    st.channels.remove(&name);
                } else {
                    c.sub = Sub::Queued;
                    st.queue.push_back(Op::Subscribe(name));
                }
            }
            st.wake_all_waiting(&mut wake);
        }
        wake.into_iter().for_each(Waker::wake);
    }
}

impl State {
    /// Whether a waiter of `channel` released the token whose payload this is.
    pub(super) fn own_release(&self, channel: &str, payload: &[u8]) -> bool {
        let Ok(payload) = <[u8; PAYLOAD_LEN]>::try_from(payload) else {
            return false;
        };
        self.channels.get(channel).is_some_and(|c| {
            c.waiters.iter().any(|&id| {
                self.waiters[id]
                    .as_ref()
                    .is_some_and(|w| w.own.contains(&payload))
            })
        })
    }

    pub(super) fn waiter(&mut self, id: usize) -> Option<&mut Waiter> {
        self.waiters.get_mut(id).and_then(Option::as_mut)
    }

    /// Forgets the connection: every subscription is gone and so is any command in flight.
    pub(super) fn reset_connection(&mut self) {
        self.generation += 1;
        self.op = OpSlot::Idle;
        self.queue.clear();
        for c in self.channels.values_mut() {
            if !matches!(c.sub, Sub::Failed(_)) {
                c.sub = Sub::None;
            }
        }
        self.stats.connected = false;
    }

    pub(super) fn counted_channels(&self) -> usize {
        self.channels.values().filter(|c| c.sub.counts()).count()
    }

    /// Delivers one notification to `channel`: to its longest-registered waiter, unless one of its waiters
    /// holds one already, or (deferred) while one of its attempts is in flight.
    pub(super) fn notify_channel(&mut self, channel: &str, wake: &mut Vec<Waker>) {
        self.notify_channel_except(channel, None, wake);
    }

    /// [`notify_channel`](Self::notify_channel), passing over the waiter `except`.
    pub(super) fn notify_channel_except(
        &mut self,
        channel: &str,
        except: Option<usize>,
        wake: &mut Vec<Waker>,
    ) {
        let Some(c) = self.channels.get_mut(channel) else {
            return;
        };
        if c.attempts > 0 {
            c.pending = true;
            self.stats.deferred += 1;
            return;
        }
        // A fair lock or a read/write lock: the waiter that can go next is not the longest registered (the
        // queue's head on the server, every waiting reader): every waiter looks.
        let all = c
            .waiters
            .iter()
            .any(|&id| self.waiters[id].as_ref().is_some_and(|w| w.all));
        if all {
            for &id in c.waiters.iter().filter(|&&id| Some(id) != except) {
                if let Some(w) = self.waiters[id].as_mut().filter(|w| !w.notified) {
                    w.notified = true;
                    self.stats.wakeups += 1;
                    if let Some(waker) = w.waker.take() {
                        wake.push(waker);
                    }
                }
            }
            return;
        }
        let Some(&head) = c.waiters.iter().find(|&&id| Some(id) != except) else {
            return;
        };
        let holds = c
            .waiters
            .iter()
            .any(|&id| self.waiters[id].as_ref().is_some_and(|w| w.notified));
        if holds {
            self.stats.coalesced += 1;
            return;
        }
        if let Some(w) = self.waiters[head].as_mut() {
            w.notified = true;
            self.stats.wakeups += 1;
            if let Some(waker) = w.waker.take() {
                wake.push(waker);
            }
        }
    }

    /// Wakes every waiter that waits (is not attempting), so that it looks at its state again.
    pub(super) fn wake_all_waiting(&mut self, wake: &mut Vec<Waker>) {
        for w in self.waiters.iter_mut().flatten() {
            if !w.attempting {
                if let Some(waker) = w.waker.take() {
                    wake.push(waker);
                }
            }
        }
    }

    /// Wakes one waiting waiter (other than `except`) to drive the queued subscription commands.
    pub(super) fn wake_driver(&mut self, except: Option<usize>, wake: &mut Vec<Waker>) {
        for (id, w) in self.waiters.iter_mut().enumerate() {
            if Some(id) == except {
                continue;
            }
            if let Some(w) = w {
                if !w.attempting {
                    if let Some(waker) = w.waker.take() {
                        wake.push(waker);
                        return;
                    }
                }
            }
        }
    }

    /// Whether any subscribed (or subscribing) channel still has a waiter.
    pub(super) fn any_live_subscription(&self) -> bool {
        self.channels
            .values()
            .any(|c| c.sub.counts() && !c.waiters.is_empty())
    }

    /// A channel lost its last waiter: unsubscribe it, or close the connection when no subscribed channel
    /// has a waiter left. Returns whether the subscriber must be closed.
    pub(super) fn channel_left(&mut self, name: &str) -> bool {
        let Some(c) = self.channels.get_mut(name) else {
            return false;
        };
        match c.sub {
            Sub::None | Sub::Failed(_) => {
                self.channels.remove(name);
                return self.close_if_idle();
            }
            Sub::Queued => {
                // Never sent: forget it.
                self.queue
                    .retain(|op| *op != Op::Subscribe(name.to_owned()));
                self.channels.remove(name);
                return self.close_if_idle();
            }
            Sub::Subscribing | Sub::Active => {
                c.sub = Sub::Leaving;
            }
            Sub::Unsubscribing { .. } => {
                c.sub = Sub::Unsubscribing { back: false };
            }
            Sub::Leaving => {}
        }
        if self.close_if_idle() {
            return true;
        }
        if matches!(self.channels.get(name).map(|c| c.sub), Some(Sub::Leaving))
            && !self.queue.contains(&Op::Unsubscribe(name.to_owned()))
        {
            self.queue.push_back(Op::Unsubscribe(name.to_owned()));
        }
        false
    }

    /// Resets the connection when nothing subscribed has a waiter; returns whether it did (the caller then
    /// closes the subscriber, outside the lock).
    pub(super) fn close_if_idle(&mut self) -> bool {
        if !self.stats.connected || self.any_live_subscription() {
            return false;
        }
        self.reset_connection();
        self.channels.retain(|_, c| !c.waiters.is_empty());
        self.stats.closes += 1;
        true
    }

    /// The outcome of a subscription command.
    pub(super) fn completed(
        &mut self,
        op: Op,
        result: Result<(), NodeError>,
        wake: &mut Vec<Waker>,
    ) {
        match op {
            Op::Subscribe(name) => {
                let Some(c) = self.channels.get_mut(&name) else {
                    return;
                };
                match result {
                    Ok(()) => {
                        self.stats.subscribes += 1;
                        match c.sub {
                            Sub::Subscribing => {
                                c.sub = Sub::Active;
                                // Releases before the subscription was in place were not seen: one attempt.
                                self.notify_channel(&name, wake);
                            }
                            Sub::Leaving => {
                                // Its waiters left meanwhile: the unsubscription is queued.
                            }
                            _ => {}
                        }
                    }
                    Err(_) => {
                        self.stats.failures += 1;
                        let retry_at = self.now_hint.map(|now| crate::time::add(now, RETRY_FAILED));
                        c.sub = Sub::Failed(retry_at);
                        if c.waiters.is_empty() {
                            self.channels.remove(&name);
                        } else {
                            // Its waiters fall back to polling: wake them to look.
                            let ids: Vec<usize> = c.waiters.iter().copied().collect();
                            for id in ids {
                                if let Some(w) = self.waiters[id].as_mut() {
                                    if let Some(waker) = w.waker.take() {
                                        wake.push(waker);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            Op::Unsubscribe(name) => {
                let Some(c) = self.channels.get_mut(&name) else {
                    return;
                };
                if result.is_ok() {
                    self.stats.unsubscribes += 1;
                }
                match c.sub {
                    Sub::Unsubscribing { back: true } => {
                        c.sub = Sub::Queued;
                        self.queue.push_back(Op::Subscribe(name));
                    }
                    _ if c.waiters.is_empty() => {
                        self.channels.remove(&name);
                    }
                    _ => c.sub = Sub::None,
                }
            }
        }
    }
}

impl State {
    /// The next queued command that still applies (its state moved to in flight).
    pub(super) fn next_op(&mut self) -> Option<Op> {
        while let Some(op) = self.queue.pop_front() {
            match &op {
                Op::Subscribe(name) => {
                    if let Some(c) = self.channels.get_mut(name) {
                        if c.sub == Sub::Queued {
                            c.sub = Sub::Subscribing;
                            return Some(op);
                        }
                    }
                }
                Op::Unsubscribe(name) => {
                    if let Some(c) = self.channels.get_mut(name) {
                        if c.sub == Sub::Leaving {
                            c.sub = Sub::Unsubscribing { back: false };
                            return Some(op);
                        }
                    }
                }
            }
        }
        None
    }

    pub(super) fn attempt_ended(
        &mut self,
        name: &str,
        id: usize,
        outcome: Outcome,
        triggered: bool,
        wake: &mut Vec<Waker>,
    ) {
        let Some(c) = self.channels.get_mut(name) else {
            return;
        };
        c.attempts = c.attempts.saturating_sub(1);
        match outcome {
            Outcome::Won => c.pending = false,
            Outcome::Held => {
                if c.attempts == 0 && c.pending {
                    c.pending = false;
                    self.notify_channel(name, wake);
                }
            }
            Outcome::Failed => {
                // A message that arrived meanwhile is news: another waiter tries. The notification that
                // started this attempt stays with this waiter, which tries again after its pause: passing it
                // on would make waiters bounce it between them as fast as a refusing server answers.
                let _ = triggered;
                if c.attempts == 0 && c.pending {
                    c.pending = false;
                    self.notify_channel_except(name, Some(id), wake);
                }
            }
        }
    }
}
