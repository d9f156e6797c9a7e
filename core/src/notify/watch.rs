//! [`Watch`]: one waiter's registration for the releases of one key on one node.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use super::*;

/// One waiter's registration for the releases of one key on one node: an RAII guard (dropping it
/// unregisters, and unsubscribes the channel when it was the last waiter).
///
/// Call protocol, per attempt: [`begin_attempt`](Self::begin_attempt) before sending it,
/// [`end_attempt`](Self::end_attempt) with its outcome; after a contended attempt
/// [`subscribe`](Self::subscribe), then poll [`poll_notified`](Self::poll_notified) (which also drives the
/// notifier's subscription commands) together with a timer, and attempt again when it is ready.
pub struct Watch {
    pub(super) shared: Arc<Shared>,
    pub(super) id: usize,
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch").field("id", &self.id).finish()
    }
}

impl Watch {
    /// Marks `token` as this waiter's own: its releases (clean-ups of this acquisition's failed attempts)
    /// wake nobody on this channel.
    pub fn own(&mut self, token: &crate::Token) {
        let Ok(tag) = <[u8; PAYLOAD_LEN]>::try_from(payload(token).as_bytes()) else {
            return;
        };
        let mut st = self.shared.lock();
        if let Some(w) = st.waiter(self.id) {
            if !w.own.contains(&tag) {
                w.own.push(tag);
            }
        }
    }

    /// Makes a message on this waiter's channel wake every waiter of the channel (of this notifier), not
    /// only the longest registered: for locks where the one that may go next is not known to the client (a
    /// fair lock's queue head, every waiting reader of a read/write lock).
    pub(crate) fn wake_every_waiter(&mut self) {
        let mut st = self.shared.lock();
        if let Some(w) = st.waiter(self.id) {
            w.all = true;
        }
    }

    /// An attempt is about to be sent: a notification held is used by it.
    pub fn begin_attempt(&mut self) {
        let mut st = self.shared.lock();
        let Some(w) = st.waiter(self.id) else { return };
        if w.attempting {
            return;
        }
        w.attempting = true;
        w.triggered = w.notified;
        w.notified = false;
        let name = w.channel.clone();
        if let Some(c) = st.channels.get_mut(&name) {
            c.attempts += 1;
        }
    }

    /// The attempt ended with `outcome`. After a win, a message that arrived meanwhile is spent; after
    /// [`Held`](Outcome::Held), one is delivered once no attempt is in flight; after
    /// [`Failed`](Outcome::Failed), one that arrived meanwhile goes to another waiter (this one retries
    /// after its pause).
    pub fn end_attempt(&mut self, outcome: Outcome) {
        let mut wake = Vec::new();
        {
            let mut st = self.shared.lock();
            let Some(w) = st.waiter(self.id) else { return };
            if !w.attempting {
                return;
            }
            let triggered = w.triggered;
            w.attempting = false;
            w.triggered = false;
            let name = w.channel.clone();
            st.attempt_ended(&name, self.id, outcome, triggered, &mut wake);
        }
        wake.into_iter().for_each(Waker::wake);
    }

    /// Asks for the channel's subscription (after a contended attempt). `now` is the caller's clock, used to
    /// retry a failed subscription no sooner than a second later.
    pub fn subscribe(&mut self, now: Instant) -> Subscription {
        let mut st = self.shared.lock();
        st.now_hint = Some(now);
        let Some(name) = st.waiter(self.id).map(|w| w.channel.clone()) else {
            return Subscription::Failed;
        };
        let counted = st.counted_channels();
        let max = st.max_channels;
        let Some(sub) = st.channels.get(&name).map(|c| c.sub) else {
            return Subscription::Failed;
        };
        let (next, answer) = match sub {
            Sub::Active => (Sub::Active, Subscription::Active),
            Sub::Leaving => {
                // Still subscribed: cancel the queued unsubscription.
                st.queue.retain(|op| *op != Op::Unsubscribe(name.clone()));
                (Sub::Active, Subscription::Active)
            }
            Sub::Queued | Sub::Subscribing => (sub, Subscription::Pending),
            Sub::Unsubscribing { .. } => (Sub::Unsubscribing { back: true }, Subscription::Pending),
            Sub::Failed(Some(at)) if now < at => (sub, Subscription::Failed),
            Sub::None | Sub::Failed(_) => {
                if counted >= max {
                    st.stats.over_budget += 1;
                    return Subscription::OverBudget;
                }
                st.queue.push_back(Op::Subscribe(name.clone()));
                (Sub::Queued, Subscription::Pending)
            }
        };
        if let Some(c) = st.channels.get_mut(&name) {
            c.sub = next;
        }
        answer
    }

    /// Whether the channel's subscription is confirmed now.
    pub fn is_active(&self) -> bool {
        let st = self.shared.lock();
        st.waiters
            .get(self.id)
            .and_then(Option::as_ref)
            .and_then(|w| st.channels.get(&w.channel))
            .is_some_and(|c| c.sub == Sub::Active)
    }

    /// Ready when this waiter holds a notification (a message, or the confirmation of its subscription);
    /// meanwhile drives the notifier's queued subscription commands. Stays ready until the next
    /// [`begin_attempt`](Self::begin_attempt). `now` is the caller's clock (see
    /// [`subscribe`](Self::subscribe)).
    pub fn poll_notified(&mut self, cx: &mut Context<'_>, now: Instant) -> Poll<()> {
        self.drive(cx, now);
        let mut st = self.shared.lock();
        let Some(w) = st.waiter(self.id) else {
            return Poll::Pending;
        };
        if w.notified {
            return Poll::Ready(());
        }
        match &mut w.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Polls the subscription command in flight (starting queued ones) until one is pending or none is left.
    pub(super) fn drive(&mut self, cx: &mut Context<'_>, now: Instant) {
        let shared = &self.shared;
        loop {
            let (op, mut fut, generation, run) = {
                let mut st = shared.lock();
                st.now_hint = Some(now);
                st.next_run += 1;
                let run = st.next_run;
                match std::mem::replace(&mut st.op, OpSlot::Running(run)) {
                    running @ OpSlot::Running(_) => {
                        // Another thread polls it right now.
                        st.op = running;
                        return;
                    }
                    OpSlot::Stored {
                        op,
                        fut,
                        generation,
                        ..
                    } => (op, fut, generation, run),
                    OpSlot::Idle => {
                        let Some(op) = st.next_op() else {
                            st.op = OpSlot::Idle;
                            return;
                        };
                        let generation = st.generation;
                        let inbox = Inbox {
                            shared: Arc::downgrade(shared),
                            generation,
                        };
                        let fut = match &op {
                            Op::Subscribe(name) => {
                                st.stats.connected = true;
                                shared.subscriber.subscribe(inbox, name)
                            }
                            Op::Unsubscribe(name) => shared.subscriber.unsubscribe(name),
                        };
                        (op, fut, generation, run)
                    }
                }
            };
            let polled = fut.as_mut().poll(cx);
            let mut wake = Vec::new();
            {
                let mut st = shared.lock();
                let ours = matches!(st.op, OpSlot::Running(r) if r == run);
                if st.generation != generation || !ours {
                    // The connection was lost or closed meanwhile: this command's outcome does not count.
                    if ours {
                        st.op = OpSlot::Idle;
                    }
                    drop(st);
                    drop(fut);
                    continue;
                }
                match polled {
                    Poll::Pending => {
                        st.op = OpSlot::Stored {
                            op,
                            fut,
                            generation,
                            driver: self.id,
                        };
                        return;
                    }
                    Poll::Ready(result) => {
                        st.op = OpSlot::Idle;
                        st.completed(op, result, &mut wake);
                    }
                }
            }
            wake.into_iter().for_each(Waker::wake);
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut wake = Vec::new();
        let close = {
            let mut st = self.shared.lock();
            let Some(w) = st.waiters.get_mut(self.id).and_then(Option::take) else {
                return;
            };
            st.free.push(self.id);
            let name = w.channel;
            let mut pass_on = w.notified;
            if let Some(c) = st.channels.get_mut(&name) {
                c.waiters.retain(|&id| id != self.id);
                if w.attempting {
                    c.attempts = c.attempts.saturating_sub(1);
                    // The attempt may never reach the server: whatever started it goes to someone else.
                    pass_on |= w.triggered || c.pending;
                    if c.attempts > 0 && pass_on {
                        c.pending = true;
                        pass_on = false;
                    } else if c.attempts == 0 {
                        c.pending = false;
                    }
                }
            }
            if pass_on {
                st.notify_channel(&name, &mut wake);
            }
            // The one who polled the command in flight is gone: another waiter takes over.
            if matches!(st.op, OpSlot::Stored { driver, .. } if driver == self.id) {
                st.wake_driver(Some(self.id), &mut wake);
            }
            let empty = st.channels.get(&name).is_some_and(|c| c.waiters.is_empty());
            let close = empty && st.channel_left(&name);
            if !close && !st.queue.is_empty() && matches!(st.op, OpSlot::Idle) {
                st.wake_driver(Some(self.id), &mut wake);
            }
            close
        };
        if close {
            self.shared.subscriber.close();
        }
        wake.into_iter().for_each(Waker::wake);
    }
}
