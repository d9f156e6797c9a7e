use super::*;
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use std::time::Instant;

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
    // The waiter marker is named the same way, and has no name where the channel is the key itself.
    assert_eq!(
        waiting_key("a:{t}:lock").as_deref(),
        Some("redlease:waiting:a:{t}:lock")
    );
    assert_eq!(
        waiting_key("a{b").as_deref(),
        Some("redlease:waiting:{a{b}")
    );
    assert_eq!(waiting_key("a{}b"), None);
    assert_eq!(waiting_key("x}"), None);
}
