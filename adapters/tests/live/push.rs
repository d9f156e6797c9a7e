//! Push handoff on real servers: waiting acquisitions are woken by the release's notification (`PUBLISH`, or
//! `SPUBLISH` on a cluster), one subscriber connection per node serves every waiter of a client, and nothing
//! stays subscribed once the waiters are gone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::notify::channel;
use redlease::{Config, EventKind, LeaseEvent, LockManager, Observer, RedisNode};
use redlease_testkit::server::{Flavor, RedisServer};

use crate::common::{self, Backend};

/// The backends of both adapters that the push tests run on.
const BACKENDS: [Backend; 3] = [
    Backend::RedisMultiplexed,
    Backend::FredClient,
    Backend::FredPool,
];

/// Polling so slow that nothing in these tests could be explained by it: progress within a test's few
/// seconds comes from notifications.
fn no_polling() -> Config {
    Config::default()
        .expiry(Duration::from_secs(10))
        .retry_delay(Duration::from_secs(30))
        .max_retry_delay(Duration::from_secs(30))
}

/// Subscriber connections of a server: `CLIENT LIST` entries subscribed to a channel (plain or sharded).
pub(crate) fn subscriber_connections(server: &RedisServer) -> usize {
    server
        .cmd(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| {
            line.split_whitespace().any(|field| {
                ["sub=", "ssub="].iter().any(|p| {
                    field
                        .strip_prefix(p)
                        .and_then(|n| n.parse::<u64>().ok())
                        .is_some_and(|n| n > 0)
                })
            })
        })
        .count()
}

/// `PUBSUB NUMSUB channel` (or `SHARDNUMSUB`).
pub(crate) fn numsub(server: &RedisServer, sharded: bool, channel: &str) -> u64 {
    let sub = if sharded { "SHARDNUMSUB" } else { "NUMSUB" };
    let reply = server.cmd(&["PUBSUB", sub, channel]);
    reply
        .lines()
        .nth(1)
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits (up to `limit`) until `done` holds; false if it never did.
pub(crate) async fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

/// Records each acquisition's attempt count.
#[derive(Default)]
struct Attempts(Mutex<Vec<u32>>);

impl Observer for Attempts {
    fn event(&self, event: &LeaseEvent<'_>) {
        if let EventKind::Acquired { attempts, .. } = event.kind {
            self.0.lock().unwrap().push(attempts);
        }
    }
}

/// 8 tasks share one key through one client: each waits for it, holds it 1 ms, releases it and pauses 1 ms.
async fn eight_waiters_on_one_key(flavor: Flavor, test: &str) {
    let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
        return;
    };
    for backend in BACKENDS {
        let node = common::node(backend, &server.url()).await;
        let notifier = node.notifier().expect("the node notifies").clone();
        let attempts = Arc::new(Attempts::default());
        let manager = LockManager::single(Arc::clone(&node), no_polling())
            .unwrap()
            .with_observer(Arc::clone(&attempts));
        let key = format!("push:{{eight:{backend:?}}}:lock");
        let lock = manager.lock(&key);
        let holding = Arc::new(AtomicBool::new(false));
        let overlaps = Arc::new(AtomicU64::new(0));
        let wins: Arc<Vec<AtomicU64>> = Arc::new((0..8).map(|_| AtomicU64::new(0)).collect());
        let end = Instant::now() + Duration::from_millis(1500);
        let mut tasks = Vec::new();
        for i in 0..8 {
            let (lock, holding, overlaps, wins) = (
                lock.clone(),
                Arc::clone(&holding),
                Arc::clone(&overlaps),
                Arc::clone(&wins),
            );
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let lease = lock.acquire_within(Duration::from_secs(5)).await.unwrap();
                    if holding.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    wins[i].fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    holding.store(false, Ordering::SeqCst);
                    lease.release().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let attempts = attempts.0.lock().unwrap().clone();
        let stats = notifier.stats();
        // Acquisitions that needed more than one attempt waited: with 30 s between polls, only a
        // notification (or the confirmation of the subscription, once per subscription) could wake them.
        let woken = attempts.iter().filter(|&&a| a > 1).count() as u64;
        let distribution: Vec<u64> = wins.iter().map(|w| w.load(Ordering::SeqCst)).collect();
        eprintln!(
            "push: {flavor} {backend:?}: {} acquisitions, {woken} after waiting; wins per task \
             {distribution:?} (fairness is not promised); notifier {stats:?}",
            attempts.len()
        );
        assert_eq!(overlaps.load(Ordering::SeqCst), 0, "{flavor} {backend:?}");
        assert!(
            woken >= 50,
            "{flavor} {backend:?}: only {woken} acquisitions after waiting"
        );
        assert!(
            stats.wakeups >= woken,
            "{flavor} {backend:?}: {woken} waiting acquisitions but {} wake-ups",
            stats.wakeups
        );
        assert!(
            stats.notifications + stats.subscribes >= woken,
            "{flavor} {backend:?}: {woken} waiting acquisitions, {} notifications, {} subscriptions",
            stats.notifications,
            stats.subscribes
        );
        assert!(
            eventually(Duration::from_secs(3), || numsub(
                &server,
                false,
                &channel(&key)
            ) == 0
                && subscriber_connections(&server) == 0)
            .await,
            "{flavor} {backend:?}: still subscribed after every waiter finished"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_waiters_on_one_key_are_each_woken_by_a_release_on_redis_7_0() {
    eight_waiters_on_one_key(
        Flavor::Redis,
        "eight_waiters_on_one_key_are_each_woken_by_a_release_on_redis_7_0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_waiters_on_one_key_are_each_woken_by_a_release_on_valkey_9_1() {
    eight_waiters_on_one_key(
        Flavor::Valkey91,
        "eight_waiters_on_one_key_are_each_woken_by_a_release_on_valkey_9_1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_waiters_on_one_key_are_each_woken_by_a_release_on_valkey_9_1_without_lua() {
    eight_waiters_on_one_key(
        Flavor::Valkey91NoLua,
        "eight_waiters_on_one_key_are_each_woken_by_a_release_on_valkey_9_1_without_lua",
    )
    .await;
}
