//! [`Notifier`]: one node's release notifications, shared by every waiter of that client.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};

use super::*;

/// The release notifications of one node: its subscriber connection, the channels subscribed on it and the
/// waiters registered for them. Cheap to clone (clones share everything).
///
/// Built by a node implementation from its [`Subscriber`]; the core uses it through [`Watch`]es. See the
/// [module docs](crate::notify) for what it guarantees.
#[derive(Clone)]
pub struct Notifier {
    pub(super) shared: Arc<Shared>,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Notifier {
    /// A notifier over `subscriber` that subscribes at most `max_channels` channels at a time (at least 1).
    pub fn new(subscriber: impl Subscriber, max_channels: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    channels: HashMap::new(),
                    waiters: Vec::new(),
                    free: Vec::new(),
                    queue: VecDeque::new(),
                    op: OpSlot::Idle,
                    generation: 0,
                    max_channels: max_channels.max(1),
                    filter: None,
                    stats: NotifierStats::default(),
                    now_hint: None,
                    next_run: 0,
                }),
                subscriber: Box::new(subscriber),
            }),
        }
    }

    /// Sets the channel budget (at least 1). Channels subscribed beyond a lowered budget stay until their
    /// waiters are gone; new subscriptions wait for room.
    pub fn set_max_channels(&self, max_channels: usize) {
        self.shared.lock().max_channels = max_channels.max(1);
    }

    /// The channel budget: the most channels subscribed at once. Waiters beyond it poll.
    pub fn max_channels(&self) -> usize {
        self.shared.lock().max_channels
    }

    /// The counters.
    pub fn stats(&self) -> NotifierStats {
        let st = self.shared.lock();
        let mut stats = st.stats;
        stats.channels = st.counted_channels();
        stats.waiters = st.channels.values().map(|c| c.waiters.len()).sum();
        stats
    }

    /// Whether `self` and `other` are the same notifier (clones of one).
    pub fn same(&self, other: &Notifier) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Registers a waiter for releases of `key` (nothing is sent; see [`Watch`]).
    pub fn watch(&self, key: &str) -> Watch {
        let name = channel(key);
        let mut st = self.shared.lock();
        let waiter = Waiter {
            channel: name.clone(),
            waker: None,
            notified: false,
            attempting: false,
            triggered: false,
            own: Vec::new(),
            all: false,
        };
        let id = match st.free.pop() {
            Some(id) => {
                st.waiters[id] = Some(waiter);
                id
            }
            None => {
                st.waiters.push(Some(waiter));
                st.waiters.len() - 1
            }
        };
        st.channels
            .entry(name)
            .or_insert_with(Channel::new)
            .waiters
            .push_back(id);
        drop(st);
        Watch {
            shared: Arc::clone(&self.shared),
            id,
        }
    }

    /// Installs (or, with `None`, removes) a filter that decides for each message whether it is delivered:
    /// for wrappers that inject faults (a dropped notification) and for tests.
    pub fn set_filter(&self, filter: Option<Filter>) {
        self.shared.lock().filter = filter;
    }

    /// Drops the subscriber connection as if it had failed: every subscription is lost, waiters poll until
    /// their channels are subscribed again on a new connection. For fault injection and tests.
    pub fn disconnect(&self) {
        let generation = self.shared.lock().generation;
        self.shared.subscriber.close();
        self.shared.lost(generation);
    }
}
