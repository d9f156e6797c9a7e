//! Push handoff on real servers: waiting acquisitions are woken by the release's notification (`PUBLISH`, or
//! `SPUBLISH` on a cluster), one subscriber connection per node serves every waiter of a client, and nothing
//! stays subscribed once the waiters are gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlease::notify::channel;
use redlease::{Config, EventKind, LeaseEvent, LockManager, Observer, RedisNode};
use redlease_adapters::redis::{ClusterNode, redis};
use redlease_adapters::scripts;
use redlease_testkit::proxy::FaultProxy;
use redlease_testkit::server::{Flavor, RedisCluster, RedisServer};

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
        .with_expiry(Duration::from_secs(10))
        .with_retry_delay(Duration::from_secs(30))
        .with_retry_jitter(0.0)
        .with_max_retry_delay(Duration::from_secs(30))
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

/// Counts acquisitions, those that waited because an earlier attempt found the lock held by another owner
/// (`Acquired { contended: true }`), the longest such wait, and contended acquisitions that gave up (at their
/// deadline). An acquisition whose earlier attempt failed otherwise (a round that timed out under load) is
/// retried without waiting for a notification, so it is not counted.
#[derive(Default)]
struct Attempts {
    acquired: AtomicU64,
    contended: AtomicU64,
    /// The longest `waited` of a contended acquisition, in microseconds.
    longest_wait_us: AtomicU64,
    /// Contended acquisitions that gave up (at their deadline).
    expired: AtomicU64,
}

impl Observer for Attempts {
    fn event(&self, event: &LeaseEvent<'_>) {
        match event.kind {
            EventKind::Acquired {
                contended, waited, ..
            } => {
                self.acquired.fetch_add(1, Ordering::SeqCst);
                if contended {
                    self.contended.fetch_add(1, Ordering::SeqCst);
                    let us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
                    self.longest_wait_us.fetch_max(us, Ordering::SeqCst);
                }
            }
            // `acquire_within` gives up only at its deadline (reported as contention, or as the deadline).
            EventKind::NotAcquired {
                contended: true, ..
            } => {
                self.expired.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
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
        // 600 ms is long enough for well over 50 handoffs after waiting on an idle machine, and short, because
        // these loops keep both cores busy and other live tests (replica acknowledgements within 200 ms) run
        // beside them. On a loaded machine (CI's live lane, a Lua-less server whose waiting attempts pass
        // the node's transaction gate one at a time) 600 ms gave as few as 13: the loops then go on until
        // 20 acquisitions met contention, for at most 20 s.
        let start = Instant::now();
        let (end, cap) = (
            start + Duration::from_millis(600),
            start + Duration::from_secs(20),
        );
        let mut tasks = Vec::new();
        for i in 0..8 {
            let (lock, holding, overlaps, wins, attempts) = (
                lock.clone(),
                Arc::clone(&holding),
                Arc::clone(&overlaps),
                Arc::clone(&wins),
                Arc::clone(&attempts),
            );
            tasks.push(tokio::spawn(async move {
                let more = || {
                    let now = Instant::now();
                    now < end || (now < cap && attempts.contended.load(Ordering::SeqCst) < 20)
                };
                while more() {
                    // Under load a call can time out: the claims below do not depend on every call.
                    let Ok(lease) = lock.acquire_within(Duration::from_secs(5)).await else {
                        continue;
                    };
                    if holding.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    wins[i].fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    holding.store(false, Ordering::SeqCst);
                    let _ = lease.release().await;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let stats = notifier.stats();
        // Acquisitions that met contention waited for the lock. With 30 s between polls and the holder's TTL
        // (10 s) as the time to try again, only a notification (or the confirmation of a subscription) can
        // end such a wait early — or the attempt itself, when the holder was already gone by the time it
        // read the TTL (then it tries again at once, woken by nobody). So a release that went unheard shows
        // as a wait that reaches the 5 s deadline. (Counting wake-ups against contended acquisitions missed
        // that last case: a few acquisitions more than wake-ups under load.)
        let woken = attempts.contended.load(Ordering::SeqCst);
        let longest = Duration::from_micros(attempts.longest_wait_us.load(Ordering::SeqCst));
        let expired = attempts.expired.load(Ordering::SeqCst);
        let distribution: Vec<u64> = wins.iter().map(|w| w.load(Ordering::SeqCst)).collect();
        eprintln!(
            "push: {flavor} {backend:?}: {} acquisitions, {woken} after contention (longest wait \
             {longest:?}, {expired} gave up); wins per task {distribution:?} (fairness is not promised); \
             notifier {stats:?}",
            attempts.acquired.load(Ordering::SeqCst)
        );
        assert_eq!(overlaps.load(Ordering::SeqCst), 0, "{flavor} {backend:?}");
        assert!(
            woken >= 20,
            "{flavor} {backend:?}: only {woken} acquisitions after contention"
        );
        assert_eq!(
            expired, 0,
            "{flavor} {backend:?}: {expired} waiting acquisitions reached their deadline: a release went \
             unheard"
        );
        // Half the deadline: far above a woken waiter's wait, even on a loaded machine.
        assert!(
            longest < Duration::from_millis(2500),
            "{flavor} {backend:?}: a waiting acquisition waited {longest:?}"
        );
        assert!(
            stats.notifications > 0 && stats.wakeups > 0,
            "{flavor} {backend:?}: nobody was woken by a release: {stats:?}"
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

/// 1,000 waiters on 100 keys through one client: one subscriber connection, one subscription per channel;
/// then half the keys are released (their waiters take turns) and the other half's waiters are dropped where
/// they wait. Nothing stays subscribed.
async fn thousand_waiters_on_a_hundred_keys(flavor: Flavor, test: &str) {
    let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
        return;
    };
    for backend in [Backend::RedisMultiplexed, Backend::FredClient] {
        let node = common::node(backend, &server.url()).await;
        let notifier = node.notifier().expect("the node notifies").clone();
        // Errors under load (a timed-out attempt) fall back to a 500 ms retry: this test is about what is
        // subscribed, not how fast.
        let config = no_polling().with_retry_delay(Duration::from_millis(500));
        let waiters = LockManager::single(Arc::clone(&node), config.clone()).unwrap();
        let holders =
            LockManager::single(common::node(backend, &server.url()).await, config).unwrap();
        let keys: Vec<String> = (0..100)
            .map(|i| format!("push:{{thousand:{backend:?}:{i}}}:lock"))
            .collect();
        // Held for the whole test (not renewed): half are released below, half only at the end, which on a
        // loaded machine without Lua comes more than the default 10 s TTL later.
        let mut held = Vec::new();
        for k in &keys {
            let lock = holders.lock(k).expiry(Duration::from_secs(120));
            held.push(lock.try_acquire().await.unwrap());
        }
        let done = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for j in 0..1000 {
            let (lock, done) = (waiters.lock(&keys[j % 100]), Arc::clone(&done));
            let notifier = notifier.clone();
            let key = keys[j % 100].clone();
            tasks.push(tokio::spawn(async move {
                let lease = match lock.acquire_within(Duration::from_secs(90)).await {
                    Ok(lease) => lease,
                    Err(e) => panic!("{e} ({key}); notifier {:?}", notifier.stats()),
                };
                done.fetch_add(1, Ordering::SeqCst);
                // A release that times out under load leaves the key to its TTL (10 s): the next
                // waiter then takes it at its TTL bound.
                let _ = lease.release().await;
            }));
        }
        // The notifier subscribes one channel at a time: with fred (`SUBSCRIBE`, then a `PING` behind it)
        // beside CI's other test lanes, 100 channels took more than 10 s (31 and 10 done by then in two
        // runs; 2 s on an idle machine). This test is about what is subscribed, not how fast.
        let all_waiting = eventually(Duration::from_secs(60), || {
            let s = notifier.stats();
            s.waiters == 1000 && s.channels == 100 && s.subscribes >= 100
        })
        .await;
        assert!(all_waiting, "{flavor} {backend:?}: {:?}", notifier.stats());
        assert_eq!(
            subscriber_connections(&server),
            1,
            "{flavor} {backend:?}: one subscriber connection for 1,000 waiters"
        );
        for k in keys.iter().step_by(17) {
            assert_eq!(
                numsub(&server, false, &channel(k)),
                1,
                "{flavor} {backend:?} {k}"
            );
        }
        // Keys 0-49 are released: their ten waiters each take them in turn, woken one by one.
        let kept = held.split_off(50);
        for lease in held {
            lease.release().await.unwrap();
        }
        // The waiters of keys 50-99 are dropped where they wait.
        let mut finishing = Vec::new();
        for (j, task) in tasks.into_iter().enumerate() {
            if j % 100 >= 50 {
                task.abort();
            } else {
                finishing.push(task);
            }
        }
        for task in finishing {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("a waiter of a released key finished")
                .unwrap();
        }
        assert_eq!(done.load(Ordering::SeqCst), 500, "{flavor} {backend:?}");
        let clean = eventually(Duration::from_secs(5), || {
            let s = notifier.stats();
            s.waiters == 0
                && s.channels == 0
                && subscriber_connections(&server) == 0
                && keys
                    .iter()
                    .all(|k| numsub(&server, false, &channel(k)) == 0)
        })
        .await;
        assert!(
            clean,
            "{flavor} {backend:?}: still subscribed after the waiters finished or were dropped: {:?}, {} \
             subscriber connections",
            notifier.stats(),
            subscriber_connections(&server)
        );
        eprintln!(
            "push: {flavor} {backend:?}: 1,000 waiters on 100 keys: {:?}",
            notifier.stats()
        );
        for lease in kept {
            lease.release().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waiters_on_a_hundred_keys_share_one_subscriber_connection_and_leave_nothing_subscribed_on_redis_7_0()
 {
    thousand_waiters_on_a_hundred_keys(
        Flavor::Redis,
        "a_thousand_waiters_on_a_hundred_keys_share_one_subscriber_connection_and_leave_nothing_subscribed_on_redis_7_0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waiters_on_a_hundred_keys_share_one_subscriber_connection_and_leave_nothing_subscribed_on_valkey_9_1()
 {
    thousand_waiters_on_a_hundred_keys(
        Flavor::Valkey91,
        "a_thousand_waiters_on_a_hundred_keys_share_one_subscriber_connection_and_leave_nothing_subscribed_on_valkey_9_1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_beyond_the_channel_budget_poll_and_still_acquire() {
    let test = "waiters_beyond_the_channel_budget_poll_and_still_acquire";
    let Some(server) = RedisServer::start_flavor_or_skip(test, Flavor::Redis, &[]) else {
        return;
    };
    for backend in [Backend::RedisMultiplexed, Backend::FredClient] {
        let node = common::node(backend, &server.url()).await;
        let notifier = node.notifier().expect("the node notifies").clone();
        notifier.set_max_channels(5);
        let polling = Duration::from_millis(100);
        let waiters =
            LockManager::single(Arc::clone(&node), no_polling().with_retry_delay(polling)).unwrap();
        let holders =
            LockManager::single(common::node(backend, &server.url()).await, no_polling()).unwrap();
        let keys: Vec<String> = (0..10)
            .map(|i| format!("push:{{budget:{backend:?}:{i}}}:lock"))
            .collect();
        let mut held = Vec::new();
        for k in &keys {
            held.push(holders.lock(k).try_acquire().await.unwrap());
        }
        let mut tasks = Vec::new();
        for k in &keys {
            let lock = waiters.lock(k);
            tasks.push(tokio::spawn(async move {
                let lease = lock.acquire_within(Duration::from_secs(10)).await.unwrap();
                let _ = lease.release().await;
            }));
        }
        assert!(
            eventually(Duration::from_secs(5), || notifier.stats().over_budget >= 5).await,
            "{backend:?}: {:?}",
            notifier.stats()
        );
        let subscribed = || {
            keys.iter()
                .filter(|k| numsub(&server, false, &channel(k)) > 0)
                .count()
        };
        assert!(
            eventually(Duration::from_secs(5), || subscribed() == 5).await,
            "{backend:?}: {} channels subscribed, the budget is 5",
            subscribed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(subscribed(), 5, "{backend:?}: never more than the budget");
        for lease in held {
            lease.release().await.unwrap();
        }
        for task in tasks {
            // Those beyond the budget poll every 100 ms: all are done well within a second.
            tokio::time::timeout(Duration::from_secs(3), task)
                .await
                .expect("a waiter beyond the budget acquired by polling")
                .unwrap();
        }
        assert!(
            eventually(Duration::from_secs(3), || subscriber_connections(&server)
                == 0)
            .await,
            "{backend:?}"
        );
    }
}

/// A waiter whose notification does not arrive still acquires once the holder's TTL (as reported to its last
/// attempt) has run out: a notification the fault proxy drops, and a release by a client that does not
/// publish (the release script of earlier versions); each on both adapters, the four at once.
async fn lost_notifications(flavor: Flavor, test: &str) {
    let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
        return;
    };
    let server = Arc::new(server);
    let mut cases = Vec::new();
    for backend in [Backend::RedisMultiplexed, Backend::FredClient] {
        for silent in [false, true] {
            cases.push(tokio::spawn(lost_notification(
                Arc::clone(&server),
                flavor,
                backend,
                silent,
            )));
        }
    }
    for case in cases {
        case.await.unwrap();
    }
}

async fn lost_notification(
    server: Arc<RedisServer>,
    flavor: Flavor,
    backend: Backend,
    silent: bool,
) {
    // Long enough that the setup (subscribing, the attempt that learns the TTL) fits on a loaded machine.
    let ttl = Duration::from_millis(2500);
    let what = format!("{flavor} {backend:?} silent {silent}");
    let proxy = FaultProxy::start(server.addr().parse().unwrap()).unwrap();
    let node = common::node(backend, &format!("{}/0", proxy.url())).await;
    let notifier = node.notifier().expect("the node notifies").clone();
    let waiters = LockManager::single(Arc::clone(&node), no_polling()).unwrap();
    let holders =
        LockManager::single(common::node(backend, &server.url()).await, no_polling()).unwrap();
    let key = format!("push:{{lost:{backend:?}:{silent}}}:lock");
    let held = holders.lock(&key).expiry(ttl).try_acquire().await.unwrap();
    let taken = Instant::now();
    let lock = waiters.lock(&key);
    let waiter = tokio::spawn(async move {
        let lease = lock.acquire_within(Duration::from_secs(20)).await.unwrap();
        let at = Instant::now();
        let _ = lease.release().await;
        at
    });
    assert!(
        eventually(Duration::from_secs(2), || numsub(
            &server,
            false,
            &channel(&key)
        ) == 1)
        .await,
        "{what}: the waiter subscribed"
    );
    // Let the attempt the confirmed subscription triggers learn the holder's TTL.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = notifier.stats().notifications;
    if silent {
        let token = held.token().as_str().to_owned();
        std::mem::forget(held);
        // A compare-and-delete that publishes nothing: the script, or Valkey's own `DELIFEQ` without Lua.
        let reply = if common::has_lua(flavor) {
            server.cmd(&["EVAL", scripts::RELEASE_SILENT.source, "1", &key, &token])
        } else {
            server.cmd(&["DELIFEQ", &key, &token])
        };
        assert_eq!(reply, "1", "{what}: released before its TTL");
    } else {
        proxy.drop_next_messages(1);
        held.release().await.unwrap();
    }
    let released = Instant::now();
    let at = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter acquired")
        .unwrap();
    let waited = at - released;
    eprintln!(
        "push: {what}: acquired {waited:?} after the release, {:?} after the holder took the lock (TTL {ttl:?})",
        at - taken
    );
    assert_eq!(
        notifier.stats().notifications,
        before,
        "{what}: no notification arrived"
    );
    if !silent {
        assert_eq!(proxy.dropped_messages(), 1, "{what}");
    }
    assert!(
        waited >= Duration::from_millis(300),
        "{what}: woken {waited:?} after the release, as if notified"
    );
    assert!(
        at - taken <= ttl + Duration::from_millis(1500),
        "{what}: acquired {:?} after the holder took a {ttl:?} lock",
        at - taken
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_or_unpublished_notification_costs_at_most_the_holders_ttl_on_redis_7_0() {
    lost_notifications(
        Flavor::Redis,
        "a_lost_or_unpublished_notification_costs_at_most_the_holders_ttl_on_redis_7_0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_or_unpublished_notification_costs_at_most_the_holders_ttl_on_valkey_9_1() {
    lost_notifications(
        Flavor::Valkey91,
        "a_lost_or_unpublished_notification_costs_at_most_the_holders_ttl_on_valkey_9_1",
    )
    .await;
}

/// A key whose slot another node than the first (the one the clients are pointed at first) serves.
fn key_on_another_node(cluster: &RedisCluster) -> String {
    (0..)
        .map(|i| format!("push:{{cluster:{i}}}:lock"))
        .find(|k| {
            cluster.nodes()[0]
                .try_cmd(&["GET", k])
                .is_err_and(|e| e.starts_with("MOVED"))
        })
        .expect("a key of another node")
}

async fn cluster_waiter(flavor: Flavor, test: &str) {
    let Some(cluster) = RedisCluster::start_flavor_or_skip(test, flavor) else {
        return;
    };
    let key = key_on_another_node(&cluster);
    let shardnumsub = |n: &RedisServer| numsub(n, true, &channel(&key));
    for fred in [false, true] {
        let make = || {
            redis::cluster::ClusterClientBuilder::new(cluster.urls())
                .connection_timeout(Duration::from_millis(500))
                .response_timeout(Duration::from_millis(500))
        };
        let (waiting, holding): (Arc<dyn RedisNode>, Arc<dyn RedisNode>) = if fred {
            (
                Arc::new(crate::cluster::fred_node(&cluster).await),
                Arc::new(crate::cluster::fred_node(&cluster).await),
            )
        } else {
            (
                Arc::new(
                    ClusterNode::connect_with_subscriber(make(), make())
                        .await
                        .unwrap(),
                ),
                Arc::new(ClusterNode::connect(make()).await.unwrap()),
            )
        };
        let notifier = waiting.notifier().expect("the node notifies").clone();
        let waiters = LockManager::single(waiting, no_polling()).unwrap();
        let holders = LockManager::single(holding, no_polling()).unwrap();
        let held = holders.lock(&key).try_acquire().await.unwrap();
        let lock = waiters.lock(&key);
        let waiter = tokio::spawn(async move {
            let lease = lock.acquire_within(Duration::from_secs(10)).await.unwrap();
            let at = Instant::now();
            lease.release().await.unwrap();
            at
        });
        assert!(
            eventually(Duration::from_secs(3), || cluster
                .nodes()
                .iter()
                .map(shardnumsub)
                .sum::<u64>()
                == 1)
            .await,
            "{flavor} fred {fred}: subscribed"
        );
        // The sharded subscription lives on the slot's owner, not on the node the client started from.
        assert_eq!(shardnumsub(&cluster.nodes()[0]), 0, "{flavor} fred {fred}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await.unwrap();
        let released = Instant::now();
        let at = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter acquired")
            .unwrap();
        assert!(
            at - released < Duration::from_secs(1),
            "{flavor} fred {fred}: acquired {:?} after the release (polling is 30 s)",
            at - released
        );
        assert!(notifier.stats().notifications >= 1, "{flavor} fred {fred}");
        assert!(
            eventually(Duration::from_secs(3), || cluster
                .nodes()
                .iter()
                .all(|n| shardnumsub(n) == 0 && subscriber_connections(n) == 0))
            .await,
            "{flavor} fred {fred}: still subscribed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_waiter_on_a_key_of_another_node_is_woken_by_a_sharded_notification_on_redis_7_0()
{
    cluster_waiter(
        Flavor::Redis,
        "a_cluster_waiter_on_a_key_of_another_node_is_woken_by_a_sharded_notification_on_redis_7_0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_waiter_on_a_key_of_another_node_is_woken_by_a_sharded_notification_on_valkey_9_1()
 {
    cluster_waiter(
        Flavor::Valkey91,
        "a_cluster_waiter_on_a_key_of_another_node_is_woken_by_a_sharded_notification_on_valkey_9_1",
    )
    .await;
}

/// A user without permission for any channel: releases still work (the script's publish is a `pcall`, the
/// native `PUBLISH` is pipelined behind the `DELIFEQ` and its refusal ignored). A waiter whose subscription
/// is refused polls (redis-rs reports the refusal); fred reports a refused `SUBSCRIBE` as success, so its
/// waiter is bounded by `max_retry_delay` instead.
async fn without_channel_permission(flavor: Flavor, test: &str) {
    let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
        return;
    };
    let url = crate::permissions::acl_user(&server, "nochannels", &["resetchannels", "+@all"]);
    let polling = Duration::from_millis(100);
    let bound = Duration::from_secs(1);
    for backend in [Backend::RedisMultiplexed, Backend::FredClient] {
        let node = common::node(backend, &url).await;
        let notifier = node.notifier().expect("the node notifies").clone();
        let manager = LockManager::single(
            Arc::clone(&node),
            no_polling()
                .with_retry_delay(polling)
                .with_max_retry_delay(bound),
        )
        .unwrap();
        let key = format!("push:{{nochannels:{backend:?}}}:lock");
        let held = manager.lock(&key).try_acquire().await.unwrap();
        let lock = manager.lock(&key);
        let waiter = tokio::spawn(async move {
            let lease = lock.acquire_within(Duration::from_secs(10)).await.unwrap();
            let at = Instant::now();
            lease.release().await.unwrap();
            at
        });
        let refused_seen = backend != Backend::FredClient;
        if refused_seen {
            assert!(
                eventually(Duration::from_secs(3), || notifier.stats().failures >= 1).await,
                "{flavor} {backend:?}: the subscription was refused: {:?}",
                notifier.stats()
            );
        } else {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let report = held.release().await.unwrap();
        assert_eq!(report.deleted(), 1, "{flavor} {backend:?}: {report:?}");
        let released = Instant::now();
        let at = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter acquired")
            .unwrap();
        let limit = if refused_seen {
            polling * 5
        } else {
            bound + polling * 3
        };
        assert!(
            at - released <= limit,
            "{flavor} {backend:?}: acquired {:?} after the release (limit {limit:?})",
            at - released
        );
        assert_eq!(notifier.stats().notifications, 0, "{flavor} {backend:?}");
        assert_eq!(server.cmd(&["EXISTS", &key]), "0", "{flavor} {backend:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_channel_permission_releases_and_waits_by_polling_on_redis_7_0() {
    without_channel_permission(
        Flavor::Redis,
        "a_user_without_channel_permission_releases_and_waits_by_polling_on_redis_7_0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_channel_permission_releases_and_waits_by_polling_on_valkey_9_1() {
    without_channel_permission(
        Flavor::Valkey91,
        "a_user_without_channel_permission_releases_and_waits_by_polling_on_valkey_9_1",
    )
    .await;
}

/// Commands the server ran of `name` (`INFO commandstats`; commands run inside scripts count too).
fn command_calls(server: &RedisServer, name: &str) -> u64 {
    let prefix = format!("cmdstat_{name}:calls=");
    server
        .cmd(&["INFO", "commandstats"])
        .lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix(&prefix)
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// A release nobody waits for publishes nothing (the waiter marker is absent), while a waiter, plain or
/// fenced, is still woken by the release's notification long before the holder's TTL (and its 30 s polls).
async fn release_publishes_only_for_waiters(flavor: Flavor, test: &str) {
    let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
        return;
    };
    for backend in BACKENDS {
        let what = format!("{flavor} {backend:?}");
        let node = common::node(backend, &server.url()).await;
        let manager = LockManager::single(Arc::clone(&node), no_polling()).unwrap();
        let key = format!("push:{{quiet:{backend:?}}}:lock");
        let publishes = command_calls(&server, "publish");
        for _ in 0..20 {
            let lease = manager.lock(&key).try_acquire().await.unwrap();
            assert_eq!(lease.release().await.unwrap().deleted(), 1, "{what}");
        }
        assert_eq!(
            command_calls(&server, "publish"),
            publishes,
            "{what}: releases without a waiter published"
        );
        for fenced in [false, true] {
            let lock = |m: &LockManager| {
                let lock = m.lock(&key);
                if fenced {
                    lock.fenced(format!("push:{{quiet:{backend:?}}}:fence"))
                } else {
                    lock
                }
            };
            let held = lock(&manager).try_acquire().await.unwrap();
            let waiting = lock(&manager);
            let waiter = tokio::spawn(async move {
                let lease = waiting
                    .acquire_within(Duration::from_secs(20))
                    .await
                    .unwrap();
                let at = Instant::now();
                let _ = lease.release().await;
                at
            });
            assert!(
                eventually(Duration::from_secs(3), || numsub(
                    &server,
                    false,
                    &channel(&key)
                ) == 1)
                .await,
                "{what} fenced {fenced}: the waiter subscribed"
            );
            // The attempt the confirmed subscription triggers marks the key; a release before it is seen
            // by that attempt, so the test does not depend on when it lands.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let publishes = command_calls(&server, "publish");
            held.release().await.unwrap();
            let released = Instant::now();
            let at = tokio::time::timeout(Duration::from_secs(15), waiter)
                .await
                .expect("the waiter acquired")
                .unwrap();
            // Well inside the holder's 10 s TTL and the waiter's 30 s polls: only a notification (or, had
            // the release landed before the marking attempt, that attempt) wakes it this soon.
            let waited = at.saturating_duration_since(released);
            eprintln!("push: {what} fenced {fenced}: acquired {waited:?} after the release");
            assert!(
                waited < Duration::from_secs(5),
                "{what} fenced {fenced}: woken {waited:?} after the release"
            );
            assert!(
                command_calls(&server, "publish") > publishes,
                "{what} fenced {fenced}: the release a waiter was marked for published nothing"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_publishes_only_when_a_waiter_may_listen_on_redis_7_0() {
    release_publishes_only_for_waiters(
        Flavor::Redis,
        "a_release_publishes_only_when_a_waiter_may_listen_on_redis_7_0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_publishes_only_when_a_waiter_may_listen_on_valkey_9_1() {
    release_publishes_only_for_waiters(
        Flavor::Valkey91,
        "a_release_publishes_only_when_a_waiter_may_listen_on_valkey_9_1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_publishes_only_when_a_waiter_may_listen_on_valkey_9_1_without_lua() {
    release_publishes_only_for_waiters(
        Flavor::Valkey91NoLua,
        "a_release_publishes_only_when_a_waiter_may_listen_on_valkey_9_1_without_lua",
    )
    .await;
}

/// A `lock_all` set released in one step (the multi-key release script) publishes only for the keys a
/// waiter may be listening on: released 20 times with nobody waiting it publishes nothing, and with a waiter
/// on one of its three keys it publishes exactly once (that key's waiter marker) and still wakes the waiter
/// long before the set's 10 s TTL and the waiter's 30 s polls.
async fn multi_key_release_publishes_only_for_waiters(flavor: Flavor, test: &str) {
    let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
        return;
    };
    for backend in BACKENDS {
        let what = format!("{flavor} {backend:?}");
        let node = common::node(backend, &server.url()).await;
        let manager = LockManager::single(Arc::clone(&node), no_polling()).unwrap();
        let keys: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|k| format!("push:{{many:{backend:?}}}:{k}"))
            .collect();
        let set = manager.lock_all(keys.iter().map(String::as_str));
        let publishes = command_calls(&server, "publish");
        for _ in 0..20 {
            set.try_acquire().await.unwrap().release().await.unwrap();
        }
        assert_eq!(
            command_calls(&server, "publish"),
            publishes,
            "{what}: multi-key releases without a waiter published"
        );
        // The releases went by the multi-key script, not key by key.
        assert!(
            server
                .cmd(&["SCRIPT", "EXISTS", scripts::RELEASE_MANY.sha1])
                .contains('1'),
            "{what}: the multi-key release script was never run"
        );
        let held = set.try_acquire().await.unwrap();
        let waiting = manager.lock(&keys[1]);
        let waiter = tokio::spawn(async move {
            let lease = waiting
                .acquire_within(Duration::from_secs(20))
                .await
                .unwrap();
            (Instant::now(), lease)
        });
        assert!(
            eventually(Duration::from_secs(3), || numsub(
                &server,
                false,
                &channel(&keys[1])
            ) == 1)
            .await,
            "{what}: the waiter subscribed"
        );
        // The attempt the confirmed subscription triggers marks the key; a release before it is seen by
        // that attempt, so the test does not depend on when it lands.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let publishes = command_calls(&server, "publish");
        held.release().await.unwrap();
        let released = Instant::now();
        let (at, lease) = tokio::time::timeout(Duration::from_secs(15), waiter)
            .await
            .expect("the waiter acquired")
            .unwrap();
        let waited = at.saturating_duration_since(released);
        eprintln!("push: {what}: multi-key release, waiter acquired {waited:?} after it");
        assert!(
            waited < Duration::from_secs(2),
            "{what}: woken {waited:?} after the multi-key release"
        );
        assert_eq!(
            command_calls(&server, "publish") - publishes,
            1,
            "{what}: the multi-key release publishes for the waited-for key only"
        );
        lease.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_release_publishes_only_for_keys_a_waiter_may_listen_on_redis_7_0() {
    multi_key_release_publishes_only_for_waiters(
        Flavor::Redis,
        "a_multi_key_release_publishes_only_for_keys_a_waiter_may_listen_on_redis_7_0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_release_publishes_only_for_keys_a_waiter_may_listen_on_valkey_9_1() {
    multi_key_release_publishes_only_for_waiters(
        Flavor::Valkey91,
        "a_multi_key_release_publishes_only_for_keys_a_waiter_may_listen_on_valkey_9_1",
    )
    .await;
}

/// A semaphore or a read/write or fair lock's side, for the permit tests below.
#[derive(Clone)]
enum Permits {
    Semaphore(redlease::Semaphore),
    Lock(redlease::Lock),
}

impl Permits {
    async fn try_acquire(&self) -> Result<redlease::Lease, redlease::Error> {
        match self {
            Self::Semaphore(s) => s.try_acquire().await,
            Self::Lock(l) => l.try_acquire().await,
        }
    }

    async fn acquire_within(&self, patience: Duration) -> Result<redlease::Lease, redlease::Error> {
        match self {
            Self::Semaphore(s) => s.acquire_within(patience).await,
            Self::Lock(l) => l.acquire_within(patience).await,
        }
    }
}

/// Permit releases (a semaphore's, a read/write lock's reader and writer, a fair lock's) that nobody waits
/// for publish nothing (no acquisition was blocked, so no waiter marker), while a waiter the permits block
/// is still woken by the release long before the holder's 10 s TTL and its 30 s polls.
async fn permit_releases_publish_only_for_waiters(flavor: Flavor, test: &str) {
    let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
        return;
    };
    for backend in BACKENDS {
        let node = common::node(backend, &server.url()).await;
        let manager = LockManager::single(Arc::clone(&node), no_polling()).unwrap();
        let (sem_key, rw_key, fair_key) = (
            format!("push:{{permits:{backend:?}}}:sem"),
            format!("push:{{permits:{backend:?}}}:rw"),
            format!("push:{{permits:{backend:?}}}:fair"),
        );
        let sem = Permits::Semaphore(manager.semaphore(&sem_key, 1).unwrap());
        let rw = manager.rw_lock(&rw_key);
        let (read, write) = (
            Permits::Lock(rw.read().clone()),
            Permits::Lock(rw.write().clone()),
        );
        let fair = Permits::Lock(manager.lock(&fair_key).fair());
        // (what, key, the holder's side, the side of a waiter it blocks)
        let cases = [
            ("semaphore", &sem_key, &sem, &sem),
            ("rw read", &rw_key, &read, &write),
            ("rw write", &rw_key, &write, &read),
            ("fair", &fair_key, &fair, &fair),
        ];
        // Every kind's count, so that a failure shows each.
        let mut published = Vec::new();
        for (kind, _, holder, _) in cases {
            let publishes = command_calls(&server, "publish");
            for _ in 0..20 {
                let lease = holder.try_acquire().await.unwrap();
                lease.release().await.unwrap();
            }
            published.push((kind, command_calls(&server, "publish") - publishes));
        }
        assert!(
            published.iter().all(|(_, n)| *n == 0),
            "{flavor} {backend:?}: 20 permit releases without a waiter published {published:?}"
        );
        for (kind, key, holder, waiting) in cases {
            let what = format!("{flavor} {backend:?} {kind}");
            let held = holder.try_acquire().await.unwrap();
            let waiting = waiting.clone();
            let waiter = tokio::spawn(async move {
                let lease = waiting
                    .acquire_within(Duration::from_secs(20))
                    .await
                    .unwrap();
                let at = Instant::now();
                let _ = lease.release().await;
                at
            });
            assert!(
                eventually(Duration::from_secs(3), || numsub(
                    &server,
                    false,
                    &channel(key)
                ) == 1)
                .await,
                "{what}: the waiter subscribed"
            );
            // The attempt the confirmed subscription triggers marks the key; a release before it is seen
            // by that attempt, so the test does not depend on when it lands.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let publishes = command_calls(&server, "publish");
            held.release().await.unwrap();
            let released = Instant::now();
            let at = tokio::time::timeout(Duration::from_secs(15), waiter)
                .await
                .expect("the waiter acquired")
                .unwrap();
            // Well inside the holder's 10 s TTL and the waiter's 30 s polls: only a notification (or, had
            // the release landed before the marking attempt, that attempt) wakes it this soon.
            let waited = at.saturating_duration_since(released);
            eprintln!("push: {what}: acquired {waited:?} after the release");
            assert!(
                waited < Duration::from_secs(5),
                "{what}: woken {waited:?} after the release"
            );
            assert!(
                command_calls(&server, "publish") > publishes,
                "{what}: the release a waiter was marked for published nothing"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_publishes_only_when_a_waiter_may_listen_on_redis_7_0() {
    permit_releases_publish_only_for_waiters(
        Flavor::Redis,
        "a_permit_release_publishes_only_when_a_waiter_may_listen_on_redis_7_0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_publishes_only_when_a_waiter_may_listen_on_valkey_9_1() {
    permit_releases_publish_only_for_waiters(
        Flavor::Valkey91,
        "a_permit_release_publishes_only_when_a_waiter_may_listen_on_valkey_9_1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_publishes_only_when_a_waiter_may_listen_on_valkey_9_1_without_lua() {
    permit_releases_publish_only_for_waiters(
        Flavor::Valkey91NoLua,
        "a_permit_release_publishes_only_when_a_waiter_may_listen_on_valkey_9_1_without_lua",
    )
    .await;
}

/// A permit waiter whose notification is lost (the subscriber connection's message dropped by a proxy) is
/// still bounded by the wait its blocked attempt reported: the holder's permit's TTL, not its 30 s polls.
async fn lost_permit_notifications(flavor: Flavor, test: &str) {
    let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
        return;
    };
    for backend in [Backend::RedisMultiplexed, Backend::FredClient] {
        for kind in ["semaphore", "fair"] {
            let ttl = Duration::from_millis(2500);
            let what = format!("{flavor} {backend:?} {kind}");
            let proxy = FaultProxy::start(server.addr().parse().unwrap()).unwrap();
            let node = common::node(backend, &format!("{}/0", proxy.url())).await;
            let notifier = node.notifier().expect("the node notifies").clone();
            let waiters = LockManager::single(Arc::clone(&node), no_polling()).unwrap();
            let holders =
                LockManager::single(common::node(backend, &server.url()).await, no_polling())
                    .unwrap();
            let key = format!("push:{{lost-permit:{backend:?}:{kind}}}:lock");
            let side = |m: &LockManager| match kind {
                "semaphore" => Permits::Semaphore(m.semaphore(&key, 1).unwrap().expiry(ttl)),
                _ => Permits::Lock(m.lock(&key).fair().expiry(ttl)),
            };
            let held = side(&holders).try_acquire().await.unwrap();
            let taken = Instant::now();
            let waiting = side(&waiters);
            let waiter = tokio::spawn(async move {
                let lease = waiting
                    .acquire_within(Duration::from_secs(20))
                    .await
                    .unwrap();
                let at = Instant::now();
                let _ = lease.release().await;
                at
            });
            assert!(
                eventually(Duration::from_secs(2), || numsub(
                    &server,
                    false,
                    &channel(&key)
                ) == 1)
                .await,
                "{what}: the waiter subscribed"
            );
            // Let the attempt the confirmed subscription triggers mark the key and learn the permit's TTL.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let before = notifier.stats().notifications;
            let publishes = command_calls(&server, "publish");
            proxy.drop_next_messages(1);
            held.release().await.unwrap();
            let released = Instant::now();
            let at = tokio::time::timeout(Duration::from_secs(10), waiter)
                .await
                .expect("the waiter acquired")
                .unwrap();
            let waited = at - released;
            eprintln!(
                "push: {what}: acquired {waited:?} after the release, {:?} after the holder took the permit \
                 (TTL {ttl:?})",
                at - taken
            );
            assert!(
                command_calls(&server, "publish") > publishes,
                "{what}: the release a waiter was marked for published nothing"
            );
            assert_eq!(
                notifier.stats().notifications,
                before,
                "{what}: no notification arrived"
            );
            assert_eq!(proxy.dropped_messages(), 1, "{what}");
            assert!(
                waited >= Duration::from_millis(300),
                "{what}: woken {waited:?} after the release, as if notified"
            );
            assert!(
                at - taken <= ttl + Duration::from_millis(1500),
                "{what}: acquired {:?} after the holder took a {ttl:?} permit",
                at - taken
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_permit_notification_costs_at_most_the_holders_ttl_on_redis_7_0() {
    lost_permit_notifications(
        Flavor::Redis,
        "a_lost_permit_notification_costs_at_most_the_holders_ttl_on_redis_7_0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_permit_notification_costs_at_most_the_holders_ttl_on_valkey_9_1_without_lua() {
    lost_permit_notifications(
        Flavor::Valkey91NoLua,
        "a_lost_permit_notification_costs_at_most_the_holders_ttl_on_valkey_9_1_without_lua",
    )
    .await;
}

/// A user whose ACL key patterns cover the lock keys but not the waiter markers (`~push:*`, and `~probe:*`
/// for the harness's capability check): acquisitions,
/// waits and releases work as before (the marker is a script argument, not a declared key, so the scripts
/// are not refused; its own commands are, and a release that cannot read the marker publishes), and a
/// waiter is woken by the release's notification.
async fn markers_outside_the_users_keys(flavor: Flavor, test: &str) {
    let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
        return;
    };
    let url = crate::permissions::acl_user(
        &server,
        "lockkeys",
        &["resetkeys", "~push:*", "~probe:*", "+@all"],
    );
    for backend in [Backend::RedisMultiplexed, Backend::FredClient] {
        let what = format!("{flavor} {backend:?}");
        let node = common::node(backend, &url).await;
        let manager = LockManager::single(Arc::clone(&node), no_polling()).unwrap();
        let key = format!("push:{{lockkeys:{backend:?}}}:lock");
        let held = manager.lock(&key).try_acquire().await.unwrap();
        let lock = manager.lock(&key);
        let waiter = tokio::spawn(async move {
            let lease = lock.acquire_within(Duration::from_secs(20)).await.unwrap();
            let at = Instant::now();
            lease.release().await.unwrap();
            at
        });
        assert!(
            eventually(Duration::from_secs(3), || numsub(
                &server,
                false,
                &channel(&key)
            ) == 1)
            .await,
            "{what}: the waiter subscribed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let report = held.release().await.unwrap();
        assert_eq!(report.deleted(), 1, "{what}: {report:?}");
        let released = Instant::now();
        let at = tokio::time::timeout(Duration::from_secs(15), waiter)
            .await
            .expect("the waiter acquired")
            .unwrap();
        // Far inside the holder's 10 s TTL and the 30 s polls: a notification woke it.
        assert!(
            at.saturating_duration_since(released) < Duration::from_secs(5),
            "{what}: woken {:?} after the release",
            at.saturating_duration_since(released)
        );
        let marker = redlease::notify::waiting_key(&key).unwrap();
        assert_eq!(
            server.cmd(&["EXISTS", &marker]),
            "0",
            "{what}: no marker written"
        );
        // A `lock_all` set alike: the multi-key release, which cannot read its keys' markers, publishes.
        let many = [
            format!("push:{{lockkeys:{backend:?}}}:many-a"),
            format!("push:{{lockkeys:{backend:?}}}:many-b"),
        ];
        let held = manager
            .lock_all(many.iter().map(String::as_str))
            .try_acquire()
            .await
            .unwrap();
        let lock = manager.lock(&many[1]);
        let waiter = tokio::spawn(async move {
            let lease = lock.acquire_within(Duration::from_secs(20)).await.unwrap();
            let at = Instant::now();
            lease.release().await.unwrap();
            at
        });
        assert!(
            eventually(Duration::from_secs(3), || numsub(
                &server,
                false,
                &channel(&many[1])
            ) == 1)
            .await,
            "{what} lock_all: the waiter subscribed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await.unwrap();
        let released = Instant::now();
        let at = tokio::time::timeout(Duration::from_secs(15), waiter)
            .await
            .expect("the waiter acquired")
            .unwrap();
        assert!(
            at.saturating_duration_since(released) < Duration::from_secs(5),
            "{what} lock_all: woken {:?} after the release",
            at.saturating_duration_since(released)
        );
        // Permits alike: the blocked attempt's marker is refused (in the script, or the plain commands
        // under the Lua-less attempt's WATCH, whose claim still goes in), and the release, which cannot
        // read the marker, publishes.
        let (sem_key, rw_key, fair_key) = (
            format!("push:{{lockkeys:{backend:?}}}:sem"),
            format!("push:{{lockkeys:{backend:?}}}:rw"),
            format!("push:{{lockkeys:{backend:?}}}:fair"),
        );
        let sem = Permits::Semaphore(manager.semaphore(&sem_key, 1).unwrap());
        let rw = manager.rw_lock(&rw_key);
        let (read, write) = (
            Permits::Lock(rw.read().clone()),
            Permits::Lock(rw.write().clone()),
        );
        let fair = Permits::Lock(manager.lock(&fair_key).fair());
        for (kind, key, holder, waiting) in [
            ("semaphore", &sem_key, &sem, &sem),
            ("rw read", &rw_key, &read, &write),
            ("rw write", &rw_key, &write, &read),
            ("fair", &fair_key, &fair, &fair),
        ] {
            let what = format!("{what} {kind}");
            let held = holder.try_acquire().await.unwrap();
            let waiting = waiting.clone();
            let waiter = tokio::spawn(async move {
                let lease = waiting
                    .acquire_within(Duration::from_secs(20))
                    .await
                    .unwrap();
                let at = Instant::now();
                lease.release().await.unwrap();
                at
            });
            assert!(
                eventually(Duration::from_secs(3), || numsub(
                    &server,
                    false,
                    &channel(key)
                ) == 1)
                .await,
                "{what}: the waiter subscribed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            held.release().await.unwrap();
            let released = Instant::now();
            let at = tokio::time::timeout(Duration::from_secs(15), waiter)
                .await
                .expect("the waiter acquired")
                .unwrap();
            assert!(
                at.saturating_duration_since(released) < Duration::from_secs(5),
                "{what}: woken {:?} after the release",
                at.saturating_duration_since(released)
            );
            let marker = redlease::notify::waiting_key(key).unwrap();
            assert_eq!(
                server.cmd(&["EXISTS", &marker]),
                "0",
                "{what}: no marker written"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_touch_the_waiter_markers_still_waits_and_releases_on_redis_7_0() {
    markers_outside_the_users_keys(
        Flavor::Redis,
        "a_user_who_may_not_touch_the_waiter_markers_still_waits_and_releases_on_redis_7_0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_touch_the_waiter_markers_still_waits_and_releases_on_valkey_9_1_without_lua()
 {
    markers_outside_the_users_keys(
        Flavor::Valkey91NoLua,
        "a_user_who_may_not_touch_the_waiter_markers_still_waits_and_releases_on_valkey_9_1_without_lua",
    )
    .await;
}

/// A subscription the notifier reports confirmed is one the server has: `PUBSUB NUMSUB` counts it at that
/// moment, on every adapter, with 150 ms between client and server each way on the subscriber connection
/// (opened first, without delay, for another key), so that a confirmation given before the server's answer
/// shows. fred took `SUBSCRIBE` as answered once written: a release published in that window woke nobody
/// (`PUBLISH` answered 0 receivers while the waiter believed it listened).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_subscription_is_on_the_server_for_every_adapter() {
    let test = "a_confirmed_subscription_is_on_the_server_for_every_adapter";
    let Some(server) = RedisServer::start_flavor_or_skip(test, Flavor::Redis, &[]) else {
        return;
    };
    let proxy = FaultProxy::start(server.addr().parse().unwrap()).unwrap();
    for backend in common::ALL_BACKENDS {
        let node = common::node(backend, &format!("{}/0", proxy.url())).await;
        let notifier = node.notifier().expect("the node notifies").clone();
        // Opens the subscriber connection.
        let mut first = notifier.watch(&format!("push:{{first:{backend:?}}}:lock"));
        assert!(
            confirmed(&mut first).await,
            "{backend:?}: {:?}",
            notifier.stats()
        );
        proxy.set_mode(redlease_testkit::proxy::ProxyMode::Latency(
            Duration::from_millis(150),
        ));
        let key = format!("push:{{confirmed:{backend:?}}}:lock");
        let mut watch = notifier.watch(&key);
        assert!(
            confirmed(&mut watch).await,
            "{backend:?}: never confirmed: {:?}",
            notifier.stats()
        );
        assert_eq!(
            numsub(&server, false, &channel(&key)),
            1,
            "{backend:?}: confirmed, but the server has no subscriber on the channel"
        );
        proxy.set_mode(redlease_testkit::proxy::ProxyMode::Forward);
    }
}

/// Subscribes `watch` and waits (up to 10 s) for the confirmation that wakes it; whether it is then active.
async fn confirmed(watch: &mut redlease::notify::Watch) -> bool {
    let _ = watch.subscribe(Instant::now());
    tokio::time::timeout(
        Duration::from_secs(10),
        std::future::poll_fn(|cx| watch.poll_notified(cx, Instant::now()).map(|_| ())),
    )
    .await
    .is_ok()
        && watch.is_active()
}

// The setups the tests above were first written without (Valkey 8.1; Valkey 9.1 with and without Lua). Not the
// thousand waiters without Lua: each Lua-less waiting attempt is a transaction, and a node's transactions pass
// its gate one at a time, so 1,000 first attempts took over 10 s on a loaded machine (60 of 100 channels
// subscribed in CI); the Lua-less waiting path is covered by the eight-waiter, lost-notification and marker
// tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_waiters_on_one_key_are_each_woken_by_a_release_on_valkey_8_1() {
    eight_waiters_on_one_key(
        Flavor::Valkey81,
        "eight_waiters_on_one_key_are_each_woken_by_a_release_on_valkey_8_1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waiters_on_a_hundred_keys_share_one_subscriber_connection_and_leave_nothing_subscribed_on_valkey_8_1()
 {
    thousand_waiters_on_a_hundred_keys(Flavor::Valkey81, "a_thousand_waiters_on_a_hundred_keys_share_one_subscriber_connection_and_leave_nothing_subscribed_on_valkey_8_1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_or_unpublished_notification_costs_at_most_the_holders_ttl_on_valkey_8_1() {
    lost_notifications(
        Flavor::Valkey81,
        "a_lost_or_unpublished_notification_costs_at_most_the_holders_ttl_on_valkey_8_1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_or_unpublished_notification_costs_at_most_the_holders_ttl_on_valkey_9_1_without_lua()
 {
    lost_notifications(Flavor::Valkey91NoLua, "a_lost_or_unpublished_notification_costs_at_most_the_holders_ttl_on_valkey_9_1_without_lua").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_channel_permission_releases_and_waits_by_polling_on_valkey_8_1() {
    without_channel_permission(
        Flavor::Valkey81,
        "a_user_without_channel_permission_releases_and_waits_by_polling_on_valkey_8_1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_channel_permission_releases_and_waits_by_polling_on_valkey_9_1_without_lua()
{
    without_channel_permission(
        Flavor::Valkey91NoLua,
        "a_user_without_channel_permission_releases_and_waits_by_polling_on_valkey_9_1_without_lua",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_publishes_only_when_a_waiter_may_listen_on_valkey_8_1() {
    release_publishes_only_for_waiters(
        Flavor::Valkey81,
        "a_release_publishes_only_when_a_waiter_may_listen_on_valkey_8_1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_touch_the_waiter_markers_still_waits_and_releases_on_valkey_8_1() {
    markers_outside_the_users_keys(
        Flavor::Valkey81,
        "a_user_who_may_not_touch_the_waiter_markers_still_waits_and_releases_on_valkey_8_1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_touch_the_waiter_markers_still_waits_and_releases_on_valkey_9_1() {
    markers_outside_the_users_keys(
        Flavor::Valkey91,
        "a_user_who_may_not_touch_the_waiter_markers_still_waits_and_releases_on_valkey_9_1",
    )
    .await;
}
