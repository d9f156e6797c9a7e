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

use std::time::Duration;

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
    in_slot_of(CHANNEL_PREFIX, key).unwrap_or_else(|| key.to_owned())
}

/// `prefix` and `key`, with `key` in braces unless it has a hash tag already (so the name shares its Redis
/// Cluster slot), or `None` when `key` cannot be put in braces (it holds a `}` but no hash tag). Written
/// straight into a string of the right size: a release builds two of these, and `format!` cost several
/// times as much on that path.
fn in_slot_of(prefix: &str, key: &str) -> Option<String> {
    let tagged = has_hash_tag(key.as_bytes());
    if !tagged && key.contains('}') {
        return None;
    }
    let mut name = String::with_capacity(prefix.len() + key.len() + 2);
    name.push_str(prefix);
    if tagged {
        name.push_str(key);
    } else {
        name.push('{');
        name.push_str(key);
        name.push('}');
    }
    Some(name)
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
    in_slot_of(WAITING_PREFIX, key)
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

mod notifier;
mod state;
mod subscriber;
mod watch;

pub use notifier::Notifier;
use state::*;
pub use state::{NotifierStats, Outcome, Subscription};
pub use subscriber::{Filter, Inbox, SubscribeFuture, Subscriber};
pub use watch::Watch;

#[cfg(test)]
mod tests;
