//! Push handoff: waiting acquisitions woken by release notifications (`redlease::notify`), under virtual
//! time with in-memory nodes. Delivery is synchronous in the simulation (a release delivers its message
//! before it returns), so "woken by the release" is an exact instant here.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::notify::channel;
use redlease::{Config, Lease, RedisNode, Timer};
use redlease_testkit::cancel::{SimHost, each_poll};
use redlease_testkit::{EventKind, Fault, History, Op, Sim, for_each_seed};

use crate::support::*;

/// Polling so slow that any progress within a test's virtual seconds comes from notifications.
fn no_polling() -> Config {
    config()
        .with_expiry(secs(30))
        .with_retry_delay(secs(100))
        .with_max_retry_delay(secs(100))
        .with_retry_jitter(0.0)
}

/// Spawns a waiter for `lock` that records when it acquired, then releases at once.
fn spawn_waiter(
    c: &Cluster,
    lock: &redlease::Lock,
    patience: Duration,
) -> Arc<Mutex<Option<Instant>>> {
    let got = Arc::new(Mutex::new(None));
    let (l, g, k) = (lock.clone(), got.clone(), c.clock.clone());
    c.sim.spawn(async move {
        if let Ok(lease) = l.acquire_within(patience).await {
            *g.lock().unwrap() = Some(k.now());
            let _ = lease.release().await;
        }
    });
    got
}

fn release(c: &mut Cluster, lease: Lease) -> Instant {
    c.sim
        .block_on(async move { lease.release().await.unwrap() });
    c.now()
}

#[test]
fn a_waiter_acquires_at_the_instant_of_the_release_not_at_its_next_poll() {
    let mut c = Cluster::new(1, 1, no_polling());
    let lock = c.manager.lock("job");
    let held = c.try_acquire(&lock).unwrap();
    let got = spawn_waiter(&c, &lock, secs(60));
    c.sim.run_for(ms(500));
    assert_eq!(
        c.nodes[0].numsub(&channel("job")),
        1,
        "the waiter subscribed"
    );
    let released = release(&mut c, held);
    c.sim.run_for(ms(10));
    assert_eq!(
        *got.lock().unwrap(),
        Some(released),
        "woken by the release itself"
    );
    assert_eq!(
        c.nodes[0].numsub(&channel("job")),
        0,
        "unsubscribed after the last waiter"
    );
    assert_eq!(c.nodes[0].subscriber_connections(), 0);
    // Attempt 1 (held), the attempt the confirmed subscription triggers (held), the one the release triggers.
    assert_eq!(c.faults[0].calls(Op::Acquire), 1 + 3);
}

#[test]
fn a_lost_notification_costs_at_most_the_holders_remaining_ttl() {
    let mut c = Cluster::new(1, 2, no_polling());
    let lock = c.manager.lock("job").expiry(secs(2));
    let held = c.try_acquire(&lock).unwrap();
    let t0 = c.now();
    let got = spawn_waiter(&c, &lock, secs(60));
    c.sim.run_for(ms(300));
    c.faults[0].drop_notifications(1);
    let released = release(&mut c, held);
    c.sim.run_for(secs(5));
    let at = got.lock().unwrap().expect("acquired");
    assert_eq!(c.faults[0].dropped_notifications(), 1);
    assert!(
        at > released,
        "not woken by the release: its notification was lost"
    );
    // The waiter's last attempt (right after its subscription was confirmed, at t0) learned the holder's
    // TTL, 2 s: it tried again 1 ms after that (no jitter here).
    assert_eq!(at, t0 + secs(2) + ms(1));
}

#[test]
fn a_release_that_publishes_nothing_is_noticed_within_max_retry_delay() {
    // A client that does not publish (here: a plain DEL) while the lock has a long TTL: the waiter's wait
    // is bounded by max_retry_delay.
    let mut c = Cluster::new(1, 3, no_polling().with_max_retry_delay(ms(800)));
    let lock = c.manager.lock("job");
    let _held = c.try_acquire(&lock).unwrap();
    let got = spawn_waiter(&c, &lock, secs(60));
    c.sim.run_for(ms(100));
    let deleted = c.now();
    assert!(c.nodes[0].del("job"));
    c.sim.run_for(secs(5));
    let at = got.lock().unwrap().expect("acquired");
    assert!(
        at > deleted && at <= deleted + ms(800),
        "acquired {:?} after the silent release",
        at - deleted
    );
}

#[test]
fn a_cut_subscriber_connection_is_polled_over_and_then_subscribed_again() {
    let mut c = Cluster::new(
        1,
        4,
        no_polling()
            .with_retry_delay(ms(200))
            .with_max_retry_delay(secs(100)),
    );
    let lock = c.manager.lock("job");
    let held = c.try_acquire(&lock).unwrap();
    let got = spawn_waiter(&c, &lock, secs(60));
    c.sim.run_for(ms(50));
    let notifier = c.nodes[0].notifier().unwrap().clone();
    assert_eq!(notifier.stats().subscribes, 1);
    let calls = c.faults[0].calls(Op::Acquire);
    c.faults[0].cut_subscriptions();
    assert_eq!(
        c.nodes[0].numsub(&channel("job")),
        0,
        "the connection is gone"
    );
    c.sim.run_for(ms(50));
    // The waiter drove the subscription again on a new connection; its confirmation triggered an attempt.
    let stats = notifier.stats();
    assert_eq!((stats.lost, stats.subscribes), (1, 2), "{stats:?}");
    assert_eq!(c.faults[0].calls(Op::Acquire), calls + 1);
    assert_eq!(c.nodes[0].numsub(&channel("job")), 1);
    let released = release(&mut c, held);
    c.sim.run_for(ms(10));
    assert_eq!(*got.lock().unwrap(), Some(released));
}

#[test]
fn waiters_beyond_the_channel_budget_poll_instead_of_failing() {
    let sim = Sim::new(5);
    let clock = sim.clock();
    let node = redlease_testkit::MemoryNode::with_timer(clock.clone()).with_max_channels(2);
    let manager = redlease::LockManager::single(
        node.clone(),
        no_polling()
            .with_retry_delay(ms(200))
            .with_retry_jitter(0.0),
    )
    .unwrap()
    .with_timer(clock.clone());
    let mut c = Cluster {
        sim,
        clock,
        nodes: vec![node.clone()],
        faults: Vec::new(),
        manager,
    };
    let keys = ["a", "b", "c", "d"];
    let held: Vec<Lease> = keys
        .iter()
        .map(|k| c.try_acquire(&c.manager.lock(*k)).unwrap())
        .collect();
    let waiters: Vec<_> = keys
        .iter()
        .map(|k| spawn_waiter(&c, &c.manager.lock(*k), secs(60)))
        .collect();
    c.sim.run_for(ms(50));
    let stats = node.notifier().unwrap().stats();
    assert_eq!(stats.channels, 2, "{stats:?}");
    assert_eq!(node.subscribed_channels(), 2);
    assert!(stats.over_budget >= 2, "{stats:?}");
    assert_eq!(stats.waiters, 4, "every waiter still waits: {stats:?}");
    let released: Vec<Instant> = held.into_iter().map(|l| release(&mut c, l)).collect();
    c.sim.run_for(secs(1));
    let mut pushed = 0;
    for (i, got) in waiters.iter().enumerate() {
        let at = got
            .lock()
            .unwrap()
            .unwrap_or_else(|| panic!("waiter {i} gave up"));
        let waited = at - released[i];
        assert!(waited <= ms(200), "waiter {i} waited {waited:?}");
        if waited.is_zero() {
            pushed += 1;
        }
    }
    assert_eq!(
        pushed, 2,
        "the two subscribed waiters were woken, the others polled"
    );
    assert_eq!(node.subscriber_connections(), 0);
}

#[test]
fn a_node_without_notifications_is_polled_as_before() {
    let sim = Sim::new(6);
    let clock = sim.clock();
    let node = redlease_testkit::MemoryNode::with_timer(clock.clone()).without_notifications();
    let (faulty, faults) = redlease_testkit::FaultyNode::new(node.clone(), clock.clone());
    let manager = redlease::LockManager::single(
        faulty,
        config()
            .with_expiry(secs(30))
            .with_retry_delay(ms(200))
            .with_retry_jitter(0.0),
    )
    .unwrap()
    .with_timer(clock.clone());
    let mut c = Cluster {
        sim,
        clock,
        nodes: vec![node.clone()],
        faults: vec![faults],
        manager,
    };
    let lock = c.manager.lock("job");
    let held = c.try_acquire(&lock).unwrap();
    let t0 = c.now();
    let got = spawn_waiter(&c, &lock, secs(60));
    c.sim.run_for(ms(1_100));
    let released = release(&mut c, held);
    c.sim.run_for(secs(1));
    // Attempts at 0, 200, …, 1000 ms, then at 1200 ms after the release at 1100 ms.
    assert_eq!(*got.lock().unwrap(), Some(t0 + ms(1_200)));
    assert!(released < t0 + ms(1_200));
    assert_eq!(c.faults[0].calls(Op::Acquire), 1 + 7);
    assert_eq!(node.subscriber_connections(), 0, "nothing ever subscribed");
}

#[test]
fn in_redlock_a_notification_from_any_node_triggers_an_attempt() {
    let mut c = Cluster::new(3, 7, no_polling());
    let lock = c.manager.lock("job");
    let held = c.try_acquire(&lock).unwrap();
    let got = spawn_waiter(&c, &lock, secs(60));
    c.sim.run_for(ms(100));
    for i in 0..3 {
        assert_eq!(c.nodes[i].numsub(&channel("job")), 1, "node {i}");
    }
    // Only node 2's notification arrives.
    c.faults[0].drop_notifications(1);
    c.faults[1].drop_notifications(1);
    let released = release(&mut c, held);
    c.sim.run_for(ms(10));
    assert_eq!(*got.lock().unwrap(), Some(released));
    assert_eq!(c.faults[2].passed_notifications(), 1);
    for i in 0..3 {
        assert_eq!(c.nodes[i].subscriber_connections(), 0, "node {i}");
    }
}

/// `n` tasks of one client take turns on one key: wait, hold 1 ms, release, pause 1 ms.
fn handoffs(seed: u64, n: usize, rounds: u64) -> (Vec<u64>, u64, u64) {
    let mut c = Cluster::new(1, seed, no_polling());
    let lock = c.manager.lock("job");
    let holding = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let wins: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let total = Arc::new(AtomicU64::new(0));
    for i in 0..n {
        let (lock, clock, holding, overlaps, wins, total) = (
            lock.clone(),
            c.clock.clone(),
            holding.clone(),
            overlaps.clone(),
            wins.clone(),
            total.clone(),
        );
        c.sim.spawn(async move {
            while total.load(Ordering::SeqCst) < rounds {
                let lease = lock.acquire_within(secs(60)).await.unwrap();
                if holding.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                wins[i].fetch_add(1, Ordering::SeqCst);
                total.fetch_add(1, Ordering::SeqCst);
                clock.sleep_until(clock.now() + ms(1)).await;
                holding.store(false, Ordering::SeqCst);
                lease.release().await.unwrap();
                clock.sleep_until(clock.now() + ms(1)).await;
            }
        });
    }
    let started = c.now();
    assert!(c.sim.run_until_idle(secs(60)), "seed {seed}: stuck");
    let elapsed = c.now() - started;
    let attempts = c.faults[0].calls(Op::Acquire);
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    (
        wins.iter().map(|w| w.load(Ordering::SeqCst)).collect(),
        attempts,
        elapsed.as_millis() as u64,
    )
}

#[test]
fn one_release_wakes_one_waiter_of_a_client_and_the_wins_are_spread_but_not_promised_fair() {
    let (wins, attempts, elapsed_ms) = handoffs(8, 8, 400);
    let total: u64 = wins.iter().sum();
    eprintln!(
        "push sim: 8 waiters, {total} acquisitions in {elapsed_ms} ms of virtual time, {attempts} attempts; \
         wins per waiter {wins:?} (fairness is not promised)"
    );
    // Every handoff takes 2 ms of holding and pausing, never a poll (100 s apart).
    assert!(elapsed_ms < 2 * 400 + 100, "{elapsed_ms} ms");
    // One attempt per handoff (the woken waiter's), plus each waiter's first attempt and subscription
    // confirmation, and each releaser's own first attempt after its pause: not one per waiter per release.
    assert!(
        attempts <= 3 * total + 16,
        "{attempts} attempts for {total} handoffs"
    );
    assert!(wins.iter().all(|&w| w > 0), "{wins:?}");
}

/// A cluster with a holder, a second waiter in the background (`other`), and the lock under test.
struct Env {
    c: Cluster,
    other: Arc<Mutex<Option<Instant>>>,
    released: Arc<Mutex<Option<Instant>>>,
}

impl SimHost for Env {
    fn sim(&mut self) -> &mut Sim {
        &mut self.c.sim
    }
}

/// The holder releases 1 s in; a background waiter (registered first: it is the one a release wakes) is
/// running; the lock renews itself every second when acquired.
fn waiting_env(n: usize, seed: u64) -> Env {
    let mut c = Cluster::with_spawner(n, seed, no_polling());
    let lock = c.manager.lock("job");
    let held = c.try_acquire(&lock).unwrap();
    let released = Arc::new(Mutex::new(None));
    let (r, clock) = (released.clone(), c.clock.clone());
    c.sim.spawn(async move {
        clock.sleep_until(clock.now() + secs(1)).await;
        held.release().await.unwrap();
        *r.lock().unwrap() = Some(clock.now());
    });
    // Every attempt waits 30 ms before it is sent, so that a cut can drop one that never reached a node
    // (then only the notification passed on wakes the other waiter: no clean-up publishes for it).
    for f in &c.faults {
        f.always(Op::Acquire, Fault::Delay(ms(30)));
    }
    // The other waiter comes 100 ms later: the cut one subscribes first and is the one a release wakes.
    let other = Arc::new(Mutex::new(None));
    let (l, g, k) = (lock.clone(), other.clone(), c.clock.clone());
    c.sim.spawn(async move {
        k.sleep_until(k.now() + ms(100)).await;
        if let Ok(lease) = l.acquire_within(secs(60)).await {
            *g.lock().unwrap() = Some(k.now());
            let _ = lease.release().await;
        }
    });
    Env { c, other, released }
}

#[test]
fn cancelling_a_waiting_acquisition_at_every_await_point_leaves_no_subscription_no_renewal_and_no_lost_wakeup()
 {
    for n in [1usize, 3] {
        let polls = each_poll(
            || waiting_env(n, 9),
            |env| {
                let lock = env.c.manager.lock("job").auto_renew(secs(1));
                async move {
                    // Completed: the lease is dropped at once (its renewal stops with it).
                    let _ = lock.acquire_within(secs(60)).await;
                }
            },
            |env, cut| {
                let c = &mut env.c;
                assert!(
                    c.sim.run_until_idle(secs(10)),
                    "{n} nodes, {cut:?}: tasks left"
                );
                // The background waiter was not robbed of its wake-up by the cut one: it acquired at the
                // release (or, when the cut one won and dropped its lease, at that release).
                let released = env.released.lock().unwrap().expect("released");
                let other = env
                    .other
                    .lock()
                    .unwrap()
                    .expect("the other waiter acquired");
                assert!(
                    other >= released && other <= released + ms(100),
                    "{n} nodes, {cut:?}: the other waiter acquired {:?} after the release",
                    other.saturating_duration_since(released)
                );
                for (i, node) in c.nodes.iter().enumerate() {
                    assert_eq!(
                        node.subscriber_connections(),
                        0,
                        "{n} nodes, {cut:?}: node {i}"
                    );
                    let stats = node.notifier().unwrap().stats();
                    assert_eq!(
                        (stats.channels, stats.waiters),
                        (0, 0),
                        "{n} nodes, {cut:?}: node {i}: {stats:?}"
                    );
                }
                let extends: u64 = c.faults.iter().map(|f| f.calls(Op::Extend)).sum();
                c.sim.run_for(secs(30));
                let after: u64 = c.faults.iter().map(|f| f.calls(Op::Extend)).sum();
                assert_eq!(after, extends, "{n} nodes, {cut:?}: renewal after the cut");
                c.assert_every_lock_key_has_ttl();
            },
        );
        assert!(polls >= 3, "{n} nodes: only {polls} polls");
    }
}

/// A hostile client that waits for the lock (with notifications), holds it a little, and releases or drops
/// it; now and then its acquisition is cancelled.
async fn waiting_client(
    lock: redlease::Lock,
    clock: redlease_testkit::SkewedClock,
    mut rng: redlease::machine::Jitter,
    horizon: Duration,
) {
    let end = clock.now() + horizon;
    while clock.now() < end {
        let patience = ms(100 + rng.next_u64() % 3_000);
        let attempt = lock.acquire_within(patience);
        let lease = if rng.next_u64() % 6 == 0 {
            let cut = ms(rng.next_u64() % 400);
            let mut attempt = std::pin::pin!(attempt);
            let mut timer = clock.sleep_until(clock.now() + cut);
            std::future::poll_fn(|cx| {
                if let std::task::Poll::Ready(r) = attempt.as_mut().poll(cx) {
                    return std::task::Poll::Ready(r.ok());
                }
                timer.as_mut().poll(cx).map(|()| None)
            })
            .await
        } else {
            attempt.await.ok()
        };
        let Some(lease) = lease else { continue };
        // Hold while watching the loss signal (a careful holder).
        let hold = ms(rng.next_u64() % 300);
        let mut lost = std::pin::pin!(lease.lost());
        let mut timer = clock.sleep_until(clock.now() + hold);
        std::future::poll_fn(|cx| {
            if lost.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
            timer.as_mut().poll(cx)
        })
        .await;
        if rng.next_u64() % 5 == 0 {
            drop(lease);
        } else {
            let _ = lease.release().await;
        }
    }
}

#[test]
fn notified_waiters_under_every_random_fault_never_overlap_over_300_seeds() {
    let (mut acquisitions, mut woken, mut dropped) = (0, 0, 0);
    for_each_seed(0..300, |seed| {
        let n = [1usize, 3, 5][(seed % 3) as usize];
        let config = config()
            .with_expiry(secs(2))
            .with_retry_delay(ms(50))
            .with_max_retry_delay(ms(700))
            .with_jitter_seed(seed);
        let mut c = Cluster::hostile(n, seed, config);
        let history = History::new();
        for id in 0..4u64 {
            let (manager, clock) = c.hostile_client(id, &history, secs(10), 1);
            let lock = manager.lock("r");
            let rng = c.sim.rng();
            c.sim
                .client(id)
                .spawn(waiting_client(lock, clock, rng, secs(10)));
        }
        // Subscriber connections drop now and then.
        let (faults, clock) = (c.faults.clone(), c.clock.clone());
        let mut rng = c.sim.rng();
        c.sim.spawn(async move {
            for _ in 0..3 {
                clock
                    .sleep_until(clock.now() + ms(rng.next_u64() % 4_000))
                    .await;
                faults[(rng.next_u64() % faults.len() as u64) as usize].cut_subscriptions();
            }
        });
        assert!(c.sim.run_until_idle(secs(120)), "seed {seed}: stuck");
        c.assert_every_lock_key_has_ttl();
        if let Err(v) = history.check() {
            panic!("seed {seed}: {v}");
        }
        acquisitions += history
            .events()
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Acquired { .. }))
            .count();
        for (i, node) in c.nodes.iter().enumerate() {
            let stats = node.notifier().unwrap().stats();
            woken += stats.wakeups;
            dropped += c.faults[i].dropped_notifications();
            assert_eq!(
                (stats.channels, stats.waiters),
                (0, 0),
                "seed {seed}: node {i} still subscribed after every client finished: {stats:?}"
            );
            assert_eq!(node.subscriber_connections(), 0, "seed {seed}: node {i}");
        }
    });
    eprintln!(
        "push history: {acquisitions} acquisitions, {woken} wake-ups, {dropped} notifications dropped"
    );
    assert!(acquisitions > 3_000, "only {acquisitions} acquisitions");
    assert!(
        woken > 3_000,
        "only {woken} wake-ups: notifications were hardly used"
    );
    assert!(dropped > 100, "only {dropped} notifications dropped");
}

#[test]
fn the_clean_up_of_a_failed_redlock_attempt_does_not_wake_the_acquisition_that_made_it() {
    // Another owner holds nodes 1 and 2; node 0 is free. Each attempt takes node 0 and cleans it up again,
    // which publishes a release there: one that frees nothing for this acquisition. (It publishes because a
    // waiter marker lives on node 0 — another client's waiter may be listening there; without one, a
    // clean-up nobody waits for publishes nothing.)
    let mut c = Cluster::new(3, 10, no_polling());
    for i in [1, 2] {
        c.nodes[i].set("job", "someone-else", Some(secs(20)));
    }
    let marker = redlease::notify::waiting_key("job").unwrap();
    c.nodes[0].set(&marker, "1", Some(secs(60)));
    // Every call takes 1 ms, so that a waiter woken by its own clean-ups would spin through thousands of
    // attempts in these seconds (instead of livelocking one virtual instant).
    for f in &c.faults {
        f.always_all(Fault::Delay(ms(1)));
    }
    let lock = c.manager.lock("job");
    let got = spawn_waiter(&c, &lock, secs(60));
    c.sim.run_for(secs(5));
    let stats = c.nodes[0].notifier().unwrap().stats();
    assert!(c.nodes[0].published() >= 2, "its clean-ups published");
    // The first clean-up came before the subscription; the second reached the waiter and was ignored.
    assert_eq!(stats.own, 1, "{stats:?}");
    assert_eq!(
        stats.wakeups, 1,
        "only the confirmed subscription woke it: {stats:?}"
    );
    // Attempt 1 and the attempt the confirmed subscriptions trigger; then it waits for the other owner's
    // TTL (20 s), not woken by its own clean-ups.
    assert_eq!(c.faults[0].calls(Op::Acquire), 2);
    c.sim.run_for(secs(20));
    assert!(
        got.lock().unwrap().is_some(),
        "acquired once the other owner's keys expired"
    );
}

#[test]
fn waiters_of_a_failing_node_retry_at_their_pace_instead_of_bouncing_a_notification() {
    let mut c = Cluster::new(1, 11, no_polling().with_retry_delay(secs(1)));
    let lock = c.manager.lock("job");
    let held = c.try_acquire(&lock).unwrap();
    let token = held.token().clone();
    let _first = spawn_waiter(&c, &lock, secs(300));
    c.sim.run_for(ms(10));
    let _second = spawn_waiter(&c, &lock, secs(300));
    c.sim.run_for(ms(10));
    let before = c.faults[0].calls(Op::Acquire);
    // From now on every call fails after up to 1 ms, and the holder's key is released on the server
    // itself (which publishes): the notified attempt fails.
    c.faults[0].random(redlease_testkit::RandomFaults::new(1, 1.0, 0.0, 0.0, ms(1)));
    let node = c.nodes[0].clone();
    assert!(
        c.sim
            .block_on(async move { node.release("job", &token).await.unwrap() })
    );
    std::mem::forget(held);
    c.sim.run_for(secs(5));
    let attempts = c.faults[0].calls(Op::Acquire) - before;
    // The notified waiter tries once, then once a second (its pause); the other is not woken for a
    // failure. Bouncing the notification between them would be thousands of attempts.
    assert!(
        (2..=10).contains(&attempts),
        "{attempts} attempts in 5 s against a failing node"
    );
}

#[test]
fn an_acquisition_that_gets_the_lock_at_once_sends_nothing_more_than_before() {
    let mut c = Cluster::new(1, 12, no_polling());
    let lock = c.manager.lock("job");
    let l = lock.clone();
    let lease = c
        .sim
        .block_on(async move { l.acquire_within(secs(10)).await })
        .unwrap();
    assert_eq!(c.faults[0].total_calls(), 1, "one SET NX");
    let stats = c.nodes[0].notifier().unwrap().stats();
    assert_eq!((stats.subscribes, stats.waiters), (0, 0), "{stats:?}");
    c.sim
        .block_on(async move { lease.release().await.unwrap() });
}

#[test]
fn a_release_during_an_attempt_of_the_same_client_wakes_no_one_when_that_attempt_wins() {
    let mut c = Cluster::new(1, 13, no_polling());
    let lock = c.manager.lock("job");
    let held = c.try_acquire(&lock).unwrap();
    let waiter = spawn_waiter(&c, &lock, secs(300));
    c.sim.run_for(ms(10));
    let waiter_calls = c.faults[0].calls(Op::Acquire);
    // A second acquisition of this client whose first attempt is in flight (sent 10 ms from now) when the
    // holder releases: it wins, and the waiter is not woken for a release that is no longer free.
    c.faults[0].script(Op::Acquire, [Fault::Delay(ms(10))]);
    let (l, k) = (lock.clone(), c.clock.clone());
    let newcomer = Arc::new(Mutex::new(None));
    let n = newcomer.clone();
    c.sim.spawn(async move {
        let lease = l.acquire_within(secs(300)).await.unwrap();
        *n.lock().unwrap() = Some(k.now());
        k.sleep_until(k.now() + ms(100)).await;
        lease.release().await.unwrap();
    });
    c.sim.run_for(ms(5));
    release(&mut c, held);
    c.sim.run_for(ms(50));
    assert!(
        newcomer.lock().unwrap().is_some(),
        "the attempt in flight won"
    );
    let stats = c.nodes[0].notifier().unwrap().stats();
    assert_eq!(stats.deferred, 1, "{stats:?}");
    assert_eq!(
        c.faults[0].calls(Op::Acquire),
        waiter_calls + 1,
        "only the newcomer's attempt: the waiter was not woken"
    );
    assert!(waiter.lock().unwrap().is_none());
    // The newcomer's release wakes it.
    c.sim.run_for(ms(100));
    assert!(waiter.lock().unwrap().is_some());
}

#[test]
fn a_plain_release_publishes_only_after_a_waiting_attempt_marked_the_key() {
    let mut c = Cluster::new(1, 14, no_polling());
    let lock = c.manager.lock("job");
    let set = c.manager.lock_all(["{many}:a", "{many}:b", "{many}:c"]);
    // Nobody waits: neither a plain release nor a multi-key one publishes.
    for _ in 0..5 {
        let lease = c.try_acquire(&lock).unwrap();
        release(&mut c, lease);
        c.sim
            .block_on({
                let set = set.clone();
                async move { set.try_acquire().await.unwrap().release().await }
            })
            .unwrap();
    }
    // A single try that finds the key held marks nothing either (it does not wait).
    let held = c.try_acquire(&lock).unwrap();
    assert!(c.try_acquire(&lock).is_err(), "contended");
    release(&mut c, held);
    assert_eq!(c.nodes[0].published(), 0, "releases without a waiter");
    assert_eq!(
        c.nodes[0].get(&redlease::notify::waiting_key("job").unwrap()),
        None,
        "no waiter marker"
    );
    // A waiter on the plain lock, and one on a key of the set.
    let held = c.try_acquire(&lock).unwrap();
    let got = spawn_waiter(&c, &lock, secs(60));
    let held_set = c
        .sim
        .block_on({
            let set = set.clone();
            async move { set.try_acquire().await }
        })
        .unwrap();
    let got_b = spawn_waiter(&c, &c.manager.lock("{many}:b"), secs(60));
    c.sim.run_for(ms(500));
    let released = release(&mut c, held);
    c.sim.run_for(ms(10));
    assert_eq!(*got.lock().unwrap(), Some(released), "woken by the release");
    // The waiter's own release publishes too: the marker outlives it (nothing deletes a marker).
    assert_eq!(c.nodes[0].published(), 2);
    c.sim
        .block_on(async move { held_set.release().await })
        .unwrap();
    let released = c.now();
    c.sim.run_for(ms(10));
    assert_eq!(
        *got_b.lock().unwrap(),
        Some(released),
        "woken by the set's release"
    );
    // The set's release published for its marked key only, then the waiter's release of it.
    assert_eq!(c.nodes[0].published(), 2 + 1 + 1);
}

/// A waiter's next attempt is planned from the TTL the current holder's answer reported, not from an
/// earlier holder's: the hint of the shortest TTL is forgotten before each attempt. (A cargo-mutants
/// survivor: without that reset, the first holder's 2 s stayed the minimum and the waiter tried every 2 s
/// while the second holder kept the lock for 10 s.)
#[test]
fn a_waiters_next_attempt_follows_the_current_holders_ttl_not_an_earlier_ones() {
    let mut c = Cluster::new(1, 3, no_polling());
    let first = c
        .try_acquire(&c.manager.lock("job").expiry(secs(2)))
        .unwrap();
    let got = spawn_waiter(&c, &c.manager.lock("job"), secs(60));
    c.sim.run_for(ms(300));
    // The first holder's release is not heard (its notification is lost) and a second holder takes the
    // lock at once, for 10 s: the waiter wakes at the first holder's expiry and finds the second.
    c.faults[0].drop_notifications(1);
    release(&mut c, first);
    let second = c
        .try_acquire(&c.manager.lock("job").expiry(secs(10)))
        .unwrap();
    let t1 = c.now();
    std::mem::forget(second);
    c.sim.run_for(secs(15));
    assert_eq!(
        got.lock().unwrap().expect("acquired"),
        t1 + secs(10) + ms(1)
    );
    // The first holder's and the second's acquisitions; the waiter's first attempt, the one its confirmed
    // subscription triggered, the one at the first holder's expiry, and the one at the second's.
    assert_eq!(c.faults[0].calls(Op::Acquire), 2 + 4);
}

/// A waiting acquisition polled again and again while nothing changes (spurious wake-ups, a `select!` loop
/// around it) keeps the sleep it armed for its wait: polls arm no further timers.
#[test]
fn a_waiting_acquisition_polled_again_and_again_arms_no_further_sleeps() {
    let mut c = Cluster::new(1, 21, no_polling());
    let sleeps = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    c.manager = c.manager.clone().with_timer(CountingTimer {
        clock: c.clock.clone(),
        sleeps: Arc::clone(&sleeps),
    });
    let lock = c.manager.lock("job");
    let _held = c.try_acquire(&lock).unwrap();
    let mut waiting = Box::pin(lock.acquire_within(secs(60)));
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    for _ in 0..3 {
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        c.sim.run_for(ms(1));
    }
    let armed = sleeps.load(Ordering::SeqCst);
    for _ in 0..20 {
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
    }
    assert_eq!(
        sleeps.load(Ordering::SeqCst),
        armed,
        "20 more polls armed nothing"
    );
}

/// The release's notification reaches a waiter while its attempt is still in flight — an attempt that the
/// node had already answered "held" (the reply is slow): the message is kept for the waiter, whose next
/// attempt starts as soon as that answer arrives, not at its fallback a holder's TTL later.
#[test]
fn a_release_notified_during_a_contended_attempt_starts_the_next_attempt_when_it_ends() {
    let mut c = Cluster::new(1, 22, no_polling());
    let lock = c.manager.lock("job");
    let held = c.try_acquire(&lock).unwrap();
    // The waiter's first attempt as usual; the one its confirmed subscription triggers is answered 40 ms
    // late (within the operation timeout).
    c.faults[0].script(Op::Acquire, [Fault::Delay(ms(0)), Fault::SlowReply(ms(40))]);
    let t0 = c.now();
    let got = spawn_waiter(&c, &lock, secs(60));
    c.sim.run_for(ms(10));
    assert_eq!(
        c.faults[0].calls(Op::Acquire),
        1 + 2,
        "the slow attempt is in flight"
    );
    let released = release(&mut c, held);
    assert!(released < t0 + ms(40));
    c.sim.run_for(secs(5));
    let at = got.lock().unwrap().expect("acquired");
    assert_eq!(at, t0 + ms(40), "right after the slow answer");
    assert_eq!(c.faults[0].calls(Op::Acquire), 1 + 3);
}

/// A notified wait that reaches the caller's deadline ends there, as contention, without one more attempt
/// at the deadline itself: the waiter's first attempt and the one its confirmed subscription triggered.
#[test]
fn a_wait_that_reaches_its_deadline_ends_there_without_another_attempt() {
    let mut c = Cluster::new(1, 23, no_polling());
    let lock = c.manager.lock("job");
    let _held = c.try_acquire(&lock).unwrap();
    let t0 = c.now();
    let waiting = lock.clone();
    let err = c
        .sim
        .block_on(async move { waiting.acquire_within(secs(2)).await })
        .unwrap_err();
    assert_eq!(c.now(), t0 + secs(2), "returned at the deadline");
    match err {
        redlease::Error::NotAcquired {
            attempts, reason, ..
        } => {
            assert_eq!(attempts, 2);
            assert_eq!(reason, redlease::NotAcquiredReason::Contended);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.faults[0].calls(Op::Acquire), 1 + 2);
}
