//! What a node implements for release notifications: its subscriber connection ([`Subscriber`]), and the
//! [`Inbox`] it delivers to.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::Waker;

use crate::node_error::NodeError;

use super::*;

/// A subscription command in flight, owned so that any waiter can poll it.
pub type SubscribeFuture = Pin<Box<dyn Future<Output = Result<(), NodeError>> + Send + 'static>>;

/// A node's subscriber connection: what a [`Notifier`] needs from the node.
///
/// The notifier calls these one at a time (never two subscription commands at once) and only for channels
/// that [`channel`] built.
pub trait Subscriber: Send + Sync + 'static {
    /// Subscribes to `channel`, opening the subscriber connection first if there is none, and completes
    /// once the server has confirmed the subscription. Every message on a subscribed channel goes to
    /// [`Inbox::deliver`] of the latest `inbox` given; a dropped connection to [`Inbox::lost`] (the notifier
    /// then subscribes its channels again).
    fn subscribe(&self, inbox: Inbox, channel: &str) -> SubscribeFuture;

    /// Unsubscribes from `channel`; completes once the server has confirmed it.
    fn unsubscribe(&self, channel: &str) -> SubscribeFuture;

    /// Closes the subscriber connection now, without waiting (the server drops every subscription of a
    /// closed connection). Called when no subscribed channel has a waiter left; the next
    /// [`subscribe`](Self::subscribe) opens a new connection.
    fn close(&self);
}

/// Where a [`Subscriber`] delivers what its connection receives. Cheap to clone; does not keep the notifier
/// alive. An inbox belongs to one connection: after [`lost`](Self::lost) or a close, its deliveries are
/// ignored (the next `subscribe` call brings a new one).
#[derive(Clone)]
pub struct Inbox {
    pub(super) shared: Weak<Shared>,
    pub(super) generation: u64,
}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field("generation", &self.generation)
            .finish()
    }
}

impl Inbox {
    /// The subscriber connection this inbox belongs to, as a number that grows with every new connection: a
    /// [`Subscriber`] keeps the connection it opened for one generation and opens a new one when
    /// [`subscribe`](Subscriber::subscribe) brings an inbox of a later generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A message `payload` arrived on `channel`.
    pub fn deliver(&self, channel: &[u8], payload: &[u8]) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        let mut wake = Vec::new();
        {
            let mut st = shared.lock();
            if st.generation != self.generation {
                return;
            }
            if let Some(filter) = &st.filter {
                if !filter(channel) {
                    st.stats.filtered += 1;
                    return;
                }
            }
            if st.own_release(channel, payload) {
                st.stats.own += 1;
                return;
            }
            st.stats.notifications += 1;
            st.notify_channel(channel, &mut wake);
        }
        wake.into_iter().for_each(Waker::wake);
    }

    /// Messages of this connection were dropped before they reached the inbox (a client library's bounded
    /// message queue overflowed): every channel gets a notification, as after a confirmed subscription, so
    /// that one attempt per channel catches a release whose message was among them.
    pub fn missed(&self) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let mut wake = Vec::new();
        {
            let mut st = shared.lock();
            if st.generation != self.generation {
                return;
            }
            st.stats.missed += 1;
            let names: Vec<String> = st.channels.keys().cloned().collect();
            for name in names {
                st.notify_channel(&name, &mut wake);
            }
        }
        wake.into_iter().for_each(Waker::wake);
    }

    /// The subscriber connection dropped: every subscription of it is gone. Waiters fall back to polling
    /// until their channels are subscribed again (on a new connection), which counts as a notification.
    pub fn lost(&self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.lost(self.generation);
        }
    }
}

/// Decides whether a message on a channel is delivered (see [`Notifier::set_filter`]).
pub type Filter = Arc<dyn Fn(&str) -> bool + Send + Sync>;
