//! Release notifications: how a waiting acquisition learns that a lock was released, instead of polling.
//!
//! A release (compare-and-delete) publishes a message on a channel derived from the lock key
//! ([`channel`]) when a waiter may be listening: the adapters' nodes publish only while the key's waiter
//! marker ([`waiting_key`]) exists, which the attempts of waiting acquisitions set when they find the lock
//! held. A node that can subscribe offers a [`Notifier`] ([`RedisNode::notifier`](crate::RedisNode::notifier)): one per node
//! object (its clones share it), owning **one subscriber connection** through a [`Subscriber`] the node
//! implements, shared by every waiter of that client.
//!
//! # What a waiting acquisition does
//!
//! [`Lock::acquire_until`](crate::Lock::acquire_until) and [`acquire_within`](crate::Lock::acquire_within)
//! register a [`Watch`] on every node before their first attempt (in memory only: nothing is sent), and ask
//! for a subscription only when an attempt found the lock held. Until the subscription is confirmed they keep
//! the polling cadence ([`Config::retry_delay`](crate::Config::retry_delay)); once it is, they wait for a
//! notification, for the holder's remaining TTL (when the node reported it: its attempts ask for it,
//! [`ClaimRequest::wants_ttl`](crate::ClaimRequest::wants_ttl)), or for the deadline, whichever comes first,
//! but never longer than [`Config::max_retry_delay`](crate::Config::max_retry_delay). A confirmed subscription counts as a
//! notification itself: a release that happened before it was in place is caught by the attempt it triggers.
//!
//! # Who is woken
//!
//! One attempt per client is enough to take a released lock, so a message wakes **one** waiter of the
//! channel (the longest registered), not all of them, and none while an attempt of this client on that lock
//! is already in flight: when that attempt wins, the message is spent; when it loses, the next waiter is
//! woken. A waiter dropped while it holds a notification, or while the attempt a notification started is in
//! flight, passes the notification on. Waiters of one client are served in registration order, but nothing
//! is promised between clients or between a waiter and a new acquisition that does not wait: **fairness is
//! not guaranteed**.
//!
//! Read/write and fair locks are the exception: who may go next is decided on the server (the head of a fair
//! lock's queue, which need not be this client's longest-registered waiter; every waiting reader once a
//! writer leaves), so a message wakes **every** waiter of the channel.
//!
//! # The subscription budget
//!
//! A channel is subscribed while it has waiters and unsubscribed when its last waiter is gone; when no
//! subscribed channel has a waiter left, the subscriber connection is closed at once (the server forgets its
//! subscriptions with it), so nothing stays subscribed after the last waiter — also when a waiting future is
//! dropped at any await point ([`Watch`] is an RAII guard). A notifier subscribes at most
//! [`max_channels`](Notifier::max_channels) channels; a waiter that would need one more waits by polling
//! instead of failing.
//!
//! # Who drives the subscriber connection
//!
//! The core never spawns. `SUBSCRIBE` and `UNSUBSCRIBE` are futures ([`Subscriber`]) that the waiting
//! acquisitions themselves poll while they wait: one at a time per notifier, handed from waiter to waiter when
//! the one polling it goes away. The one step that cannot wait for a poll — the last waiter leaving — is
//! synchronous: [`Subscriber::close`] drops the connection.
//!
//! # Writing a notifier for your own node
//!
//! Implement [`Subscriber`] (subscribe and unsubscribe on a dedicated connection, deliver every message to the
//! [`Inbox`] it was given, report a dropped connection with [`Inbox::lost`], close the connection on
//! [`close`](Subscriber::close)), build a [`Notifier`] from it and return it from
//! [`RedisNode::notifier`](crate::RedisNode::notifier). A wrapper node forwards the inner node's notifier.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use redlease::notify::{Inbox, Notifier, SubscribeFuture, Subscriber};
//!
//! /// A subscriber for an in-process "server" that publishes by calling `Inbox::deliver` itself.
//! #[derive(Default)]
//! struct Local { inbox: Arc<Mutex<Option<(Inbox, Vec<String>)>>> }
//!
//! impl Subscriber for Local {
//!     fn subscribe(&self, inbox: Inbox, channel: &str) -> SubscribeFuture {
//!         // A real server calls `inbox.deliver(channel, payload)` for every message on the channel.
//!         let (state, channel) = (self.inbox.clone(), channel.to_owned());
//!         Box::pin(async move {
//!             let mut s = state.lock().unwrap();
//!             let (_, channels) = s.get_or_insert_with(|| (inbox, Vec::new()));
//!             channels.push(channel);
//!             Ok(())
//!         })
//!     }
//!     fn unsubscribe(&self, channel: &str) -> SubscribeFuture {
//!         let (state, channel) = (self.inbox.clone(), channel.to_owned());
//!         Box::pin(async move {
//!             if let Some((_, channels)) = &mut *state.lock().unwrap() {
//!                 channels.retain(|c| *c != channel);
//!             }
//!             Ok(())
//!         })
//!     }
//!     fn close(&self) {
//!         *self.inbox.lock().unwrap() = None;
//!     }
//! }
//!
//! let notifier = Notifier::new(Local::default(), 1024);
//! assert_eq!(notifier.stats().channels, 0);
//! ```

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::node_error::NodeError;

/// The prefix of every notification channel.
pub const CHANNEL_PREFIX: &str = "redlease:released:";

/// The default budget of channels per notifier (see [`Notifier::max_channels`]).
pub const DEFAULT_MAX_CHANNELS: usize = 1024;

/// How long a channel whose subscription failed is not asked for again (its waiters poll meanwhile).
const RETRY_FAILED: Duration = Duration::from_secs(1);

/// Whether `key` has a Redis Cluster hash tag: a non-empty part between its first `{` and the next `}`.
fn has_hash_tag(key: &[u8]) -> bool {
    match key.iter().position(|&b| b == b'{') {
        Some(open) => key[open + 1..]
            .iter()
            .position(|&b| b == b'}')
            .is_some_and(|close| close > 0),
        None => false,
    }
}

/// The channel on which releases of `key` are published, always in `key`'s Redis Cluster hash slot (so a
/// sharded `SPUBLISH` from the release script and the waiter's `SSUBSCRIBE` reach the key's shard):
///
/// - a key with a hash tag: `redlease:released:` + key (the prefix has no braces, so the tag is the key's);
/// - a key without one and without `}`: `redlease:released:{` + key + `}` (the whole key becomes the tag,
///   which Redis hashes exactly as the untagged key);
/// - any other key (one with a `}` but no valid tag, such as `a}b`): the key itself.
///
/// ```
/// use redlease::notify::channel;
/// assert_eq!(channel("orders:{42}:lock"), "redlease:released:orders:{42}:lock");
/// assert_eq!(channel("jobs:nightly"), "redlease:released:{jobs:nightly}");
/// assert_eq!(channel("odd}key"), "odd}key");
/// ```
pub fn channel(key: &str) -> String {
    if has_hash_tag(key.as_bytes()) {
        format!("{CHANNEL_PREFIX}{key}")
    } else if !key.contains('}') {
        format!("{CHANNEL_PREFIX}{{{key}}}")
    } else {
        key.to_owned()
    }
}

/// The prefix of every waiter marker key (see [`waiting_key`]).
pub const WAITING_PREFIX: &str = "redlease:waiting:";

/// How much longer than the holder's remaining TTL a waiter marker lives (see [`waiting_key`]), in ms: the
/// waiter's next attempt, due when the holder's TTL runs out, lands well inside it and marks again.
pub const WAITING_MARGIN_MS: u64 = 1000;

/// The waiter marker of `key`: a key, in `key`'s Redis Cluster hash slot, that tells a release whether a
/// waiter may be listening on [`channel(key)`](channel), so that a release nobody waits for publishes
/// nothing.
///
/// The protocol (what the adapters' nodes do): an attempt of a waiting acquisition
/// (a [`RedisNode::claim`](crate::RedisNode::claim) with [`wants_ttl`](crate::ClaimRequest::wants_ttl), or a
/// fenced acquisition) that finds the
/// lock held sets the marker **in the same atomic step, or before it reads the holder's remaining TTL**,
/// to live at least that TTL plus [`WAITING_MARGIN_MS`] (never shortening it); a release publishes only
/// when, after its delete, the marker exists (or cannot be read). A release that lands before the marker is
/// written is seen by the attempt itself (the lock is free, or its remaining TTL reads as gone and the waiter
/// tries again at once); every later one publishes while the waiter waits, since the waiter tries again (and
/// marks again) before the marker expires. A waiter whose notification is lost anyway (a dropped subscriber
/// connection, a marker write refused under `maxmemory`) still waits at most its usual bound: the holder's
/// remaining TTL or [`Config::max_retry_delay`](crate::Config::max_retry_delay).
///
/// Permits — a [semaphore](crate::Semaphore)'s, a [read/write](crate::RwLock) or [fair](crate::Lock::fair)
/// lock's — keep the same marker of their key, on the same terms: an acquisition
/// ([`RedisNode::permit`](crate::RedisNode::permit)) that the permits block marks it in the atomic step that
/// read them, to live at least the wait it reports (the time until the earliest blocking permit, a writer's
/// claim or a queue place expires) plus [`WAITING_MARGIN_MS`], never shortening it; a release that removed
/// a permit publishes only when, after the removal, the marker exists (or cannot be read). The waiter's next
/// attempt comes at the latest when that reported wait ends (or at
/// [`Config::max_retry_delay`](crate::Config::max_retry_delay)), inside the marker's life, and marks again.
/// A node cannot tell a waiting acquisition's permit call from a single try's, so any blocked permit
/// acquisition marks. Nothing deletes a marker (other waiters of the key may rely on it): it expires by
/// itself, and a release within its life publishes even after the waiters are gone.
///
/// `None` for a key with a `}` but no valid hash tag (such as `a}b`): no other key shares its slot, so its
/// releases always publish, as before markers.
///
/// ```
/// use redlease::notify::waiting_key;
/// assert_eq!(waiting_key("orders:{42}:lock").as_deref(), Some("redlease:waiting:orders:{42}:lock"));
/// assert_eq!(waiting_key("jobs:nightly").as_deref(), Some("redlease:waiting:{jobs:nightly}"));
/// assert_eq!(waiting_key("odd}key"), None);
/// ```
pub fn waiting_key(key: &str) -> Option<String> {
    if has_hash_tag(key.as_bytes()) {
        Some(format!("{WAITING_PREFIX}{key}"))
    } else if !key.contains('}') {
        Some(format!("{WAITING_PREFIX}{{{key}}}"))
    } else {
        None
    }
}

/// How many leading characters of the released token a release publishes (see [`payload`]).
pub const PAYLOAD_LEN: usize = 8;

/// The message a release of `token` publishes: the token's first [`PAYLOAD_LEN`] characters (32 of its 160
/// random bits, of a token that is no longer valid once released). Waiters use it to ignore the releases
/// their own acquisition makes (the clean-up of a failed Redlock attempt) which free nothing for them.
///
/// ```
/// let token = redlease::Token::random().unwrap();
/// assert_eq!(redlease::notify::payload(&token), &token.as_str()[..8]);
/// ```
pub fn payload(token: &crate::Token) -> &str {
    let s = token.as_str();
    s.get(..PAYLOAD_LEN).unwrap_or(s)
}

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
    shared: Weak<Shared>,
    generation: u64,
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
enum Sub {
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
    fn counts(self) -> bool {
        !matches!(self, Sub::None | Sub::Failed(_))
    }
}

struct Channel {
    /// Registered waiters, longest registered first.
    waiters: VecDeque<usize>,
    sub: Sub,
    /// Attempts of this channel's waiters in flight.
    attempts: usize,
    /// A message arrived while attempts were in flight: delivered when they end without a win.
    pending: bool,
}

impl Channel {
    fn new() -> Self {
        Self {
            waiters: VecDeque::new(),
            sub: Sub::None,
            attempts: 0,
            pending: false,
        }
    }
}

struct Waiter {
    channel: String,
    waker: Option<Waker>,
    /// Holds a notification not yet used by an attempt.
    notified: bool,
    /// An attempt is in flight.
    attempting: bool,
    /// The attempt in flight was started by a notification.
    triggered: bool,
    /// [`payload`]s of this waiter's own tokens.
    own: Vec<[u8; PAYLOAD_LEN]>,
    /// A message wakes every waiter of the channel, not one ([`Watch::wake_every_waiter`]).
    all: bool,
}

#[derive(Clone, PartialEq, Eq)]
enum Op {
    Subscribe(String),
    Unsubscribe(String),
}

enum OpSlot {
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

struct State {
    channels: HashMap<String, Channel>,
    waiters: Vec<Option<Waiter>>,
    free: Vec<usize>,
    queue: VecDeque<Op>,
    op: OpSlot,
    /// The subscriber connection's generation: bumped when it is lost or closed.
    generation: u64,
    max_channels: usize,
    filter: Option<Filter>,
    stats: NotifierStats,
    /// The latest clock reading a caller passed in (the core reads no clock of its own).
    now_hint: Option<Instant>,
    /// Numbers the polls of a command taken out of the lock, so that a reset does not clobber a newer one.
    next_run: u64,
}

struct Shared {
    state: Mutex<State>,
    subscriber: Box<dyn Subscriber>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lost(&self, generation: u64) {
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
    fn own_release(&self, channel: &str, payload: &[u8]) -> bool {
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

    fn waiter(&mut self, id: usize) -> Option<&mut Waiter> {
        self.waiters.get_mut(id).and_then(Option::as_mut)
    }

    /// Forgets the connection: every subscription is gone and so is any command in flight.
    fn reset_connection(&mut self) {
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

    fn counted_channels(&self) -> usize {
        self.channels.values().filter(|c| c.sub.counts()).count()
    }

    /// Delivers one notification to `channel`: to its longest-registered waiter, unless one of its waiters
    /// holds one already, or (deferred) while one of its attempts is in flight.
    fn notify_channel(&mut self, channel: &str, wake: &mut Vec<Waker>) {
        self.notify_channel_except(channel, None, wake);
    }

    /// [`notify_channel`](Self::notify_channel), passing over the waiter `except`.
    fn notify_channel_except(
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
    fn wake_all_waiting(&mut self, wake: &mut Vec<Waker>) {
        for w in self.waiters.iter_mut().flatten() {
            if !w.attempting {
                if let Some(waker) = w.waker.take() {
                    wake.push(waker);
                }
            }
        }
    }

    /// Wakes one waiting waiter (other than `except`) to drive the queued subscription commands.
    fn wake_driver(&mut self, except: Option<usize>, wake: &mut Vec<Waker>) {
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
    fn any_live_subscription(&self) -> bool {
        self.channels
            .values()
            .any(|c| c.sub.counts() && !c.waiters.is_empty())
    }

    /// A channel lost its last waiter: unsubscribe it, or close the connection when no subscribed channel
    /// has a waiter left. Returns whether the subscriber must be closed.
    fn channel_left(&mut self, name: &str) -> bool {
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
    fn close_if_idle(&mut self) -> bool {
        if !self.stats.connected || self.any_live_subscription() {
            return false;
        }
        self.reset_connection();
        self.channels.retain(|_, c| !c.waiters.is_empty());
        self.stats.closes += 1;
        true
    }

    /// The outcome of a subscription command.
    fn completed(&mut self, op: Op, result: Result<(), NodeError>, wake: &mut Vec<Waker>) {
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

/// The release notifications of one node: its subscriber connection, the channels subscribed on it and the
/// waiters registered for them. Cheap to clone (clones share everything).
///
/// Built by a node implementation from its [`Subscriber`]; the core uses it through [`Watch`]es. See the
/// [module docs](self) for what it guarantees.
#[derive(Clone)]
pub struct Notifier {
    shared: Arc<Shared>,
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

/// One waiter's registration for the releases of one key on one node: an RAII guard (dropping it
/// unregisters, and unsubscribes the channel when it was the last waiter).
///
/// Call protocol, per attempt: [`begin_attempt`](Self::begin_attempt) before sending it,
/// [`end_attempt`](Self::end_attempt) with its outcome; after a contended attempt
/// [`subscribe`](Self::subscribe), then poll [`poll_notified`](Self::poll_notified) (which also drives the
/// notifier's subscription commands) together with a timer, and attempt again when it is ready.
pub struct Watch {
    shared: Arc<Shared>,
    id: usize,
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
    fn drive(&mut self, cx: &mut Context<'_>, now: Instant) {
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

impl State {
    /// The next queued command that still applies (its state moved to in flight).
    fn next_op(&mut self) -> Option<Op> {
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

    fn attempt_ended(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A subscriber whose commands complete at once and which hands out its latest inbox.
    #[derive(Default, Clone)]
    struct Instant0(Arc<Mutex<Option<Inbox>>>);

    impl Subscriber for Instant0 {
        fn subscribe(&self, inbox: Inbox, _: &str) -> SubscribeFuture {
            *self.0.lock().unwrap() = Some(inbox);
            Box::pin(std::future::ready(Ok(())))
        }
        fn unsubscribe(&self, _: &str) -> SubscribeFuture {
            Box::pin(std::future::ready(Ok(())))
        }
        fn close(&self) {
            *self.0.lock().unwrap() = None;
        }
    }

    fn poll(w: &mut Watch, now: Instant) -> bool {
        let waker = Waker::noop();
        w.poll_notified(&mut Context::from_waker(waker), now)
            .is_ready()
    }

    /// Two channels with two waiters each, subscribed; the activation notifications used up.
    fn subscribed() -> (Notifier, Instant0, Vec<Watch>, Instant) {
        let sub = Instant0::default();
        let n = Notifier::new(sub.clone(), 8);
        let now = Instant::now();
        let mut ws = vec![n.watch("a"), n.watch("a"), n.watch("b"), n.watch("b")];
        for w in &mut ws {
            w.subscribe(now);
            poll(w, now);
        }
        for w in &mut ws {
            w.begin_attempt();
            w.end_attempt(Outcome::Held);
        }
        assert!(ws.iter_mut().all(|w| !poll(w, now)));
        (n, sub, ws, now)
    }

    #[test]
    fn missed_messages_wake_one_waiter_per_channel() {
        let (n, sub, mut ws, now) = subscribed();
        let inbox = sub.0.lock().unwrap().clone().unwrap();
        inbox.missed();
        let woken: Vec<bool> = ws.iter_mut().map(|w| poll(w, now)).collect();
        assert_eq!(woken, [true, false, true, false]);
        assert_eq!(n.stats().missed, 1);
    }

    #[test]
    fn an_inbox_of_a_lost_connection_delivers_nothing() {
        let (n, sub, mut ws, now) = subscribed();
        let old = sub.0.lock().unwrap().clone().unwrap();
        old.lost();
        // The waiters subscribe again (on a new connection): each channel's confirmation wakes one.
        let woken: Vec<bool> = ws.iter_mut().map(|w| poll(w, now)).collect();
        assert_eq!(woken, [true, false, true, false]);
        for w in &mut ws {
            w.begin_attempt();
            w.end_attempt(Outcome::Held);
        }
        let before = n.stats().notifications;
        old.deliver(channel("a").as_bytes(), b"12345678");
        old.missed();
        assert_eq!(
            n.stats().notifications,
            before,
            "stale deliveries are ignored"
        );
        assert!(ws.iter_mut().all(|w| !poll(w, now)));
        let new = sub.0.lock().unwrap().clone().unwrap();
        assert!(new.generation() > old.generation());
        new.deliver(channel("a").as_bytes(), b"12345678");
        assert!(poll(&mut ws[0], now));
    }

    #[test]
    fn channels_share_the_keys_hash_tag() {
        assert_eq!(channel("a:{t}:lock"), "redlease:released:a:{t}:lock");
        assert_eq!(channel("plain"), "redlease:released:{plain}");
        assert_eq!(channel("a{b"), "redlease:released:{a{b}");
        assert_eq!(channel("a{}b"), "a{}b");
        assert_eq!(channel("x}"), "x}");
    }
}
