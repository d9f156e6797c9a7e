//! Restart detection on real processes: a Redlock client that saw every server before must notice a
//! server killed and restarted empty (no persistence) while another client's lease relies on it, whatever
//! its client, the server, and whether its connection was replaced in the background or on its next call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{Config, LockManager, RedisNode};
use redlease_testkit::server::RedisServers;

use crate::common::{self, Backend, config, on_every_server};

/// Long enough that client 1's lease outlives two restarts and client 2's attempts on a loaded machine.
const TTL: Duration = Duration::from_secs(10);

/// The ways a client builds its Redlock manager.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// `redis::redlock(urls, config)`: lazy redis-rs nodes.
    RedisUrls,
    /// `fred::redlock(urls, config)`: lazy fred nodes.
    FredUrls,
    /// redis-rs `ConnectionManager` nodes.
    RedisManager,
    /// fred `Client` nodes.
    FredClient,
}

async fn manager(kind: Kind, urls: &[String], cfg: Config) -> LockManager {
    let nodes = |backend| async move {
        let mut nodes: Vec<Arc<dyn RedisNode>> = Vec::new();
        for url in urls {
            nodes.push(common::node(backend, url).await);
        }
        nodes
    };
    match kind {
        Kind::RedisUrls => redlease_adapters::redis::redlock(urls, cfg).unwrap(),
        Kind::FredUrls => redlease_adapters::fred::redlock(urls, cfg).unwrap(),
        Kind::RedisManager => {
            LockManager::redlock_dyn(nodes(Backend::RedisManager).await, cfg).unwrap()
        }
        Kind::FredClient => {
            LockManager::redlock_dyn(nodes(Backend::FredClient).await, cfg).unwrap()
        }
    }
}

/// How client 2 first talked to the servers, before the restart.
#[derive(Debug, Clone, Copy)]
enum Contact {
    /// `LockManager::check` (the start-up check): no run id read.
    Check,
    /// A look at the lock's holder (`Lock::holder_info`): reads only, no run id read.
    Holder,
    /// An attempt at the held lock, refused as contended.
    Contended,
    /// A lease of another key, taken and released.
    Acquired,
}

/// Two of three servers are killed and restarted empty while client 1 holds a lock on all three; client 2,
/// which talked to every server more than 2.5 s before (a start-up check, a look at the holder, a
/// contended attempt, or a lease of its own), keeps trying the lock for a while (right after the restart and later, after its
/// connections were replaced in the background). None of its attempts may succeed while client 1's lease
/// is valid: the restarted servers forgot client 1's keys, and only the restart quarantine (on by default)
/// keeps client 2 from counting them. Every client kind, with different pauses between the restart and
/// client 2's first attempt.
///
/// One test per client kind (each about 35 s: four rounds of most of a 10 s lease, one after another on its
/// own servers, which every round restarts), so that the kinds run side by side.
fn a_client_that_talked_to_every_server_never_counts_a_restarted_one(test: &str, kind: Kind) {
    on_every_server(test, |flavor| async move {
        let mut servers = RedisServers::start_flavor(flavor, 3);
        let urls = servers.urls();
        let cfg = config(TTL);
        let rounds = [
            (Contact::Check, 0u64),
            (Contact::Holder, 300),
            (Contact::Contended, 300),
            (Contact::Acquired, 700),
        ];
        for (round, (contact, pause_ms)) in rounds.into_iter().enumerate() {
            let what = format!("{kind:?} round {round} ({contact:?}, pause {pause_ms} ms)");
            let k = format!("live:restarts:{{{kind:?}:{round}}}:lock");
            // Fresh clients each round (client 1 is not held up by the quarantine of the last).
            let one = manager(kind, &urls, cfg.clone()).await;
            let two = manager(kind, &urls, cfg.clone()).await;
            let held = one.lock(&k).try_acquire().await.unwrap();
            let valid_until = Instant::now() + held.remaining();
            match contact {
                Contact::Check => {
                    let report = two.check(&k).await.unwrap();
                    assert!(report.quorum_ready(), "{what}: {report}");
                }
                Contact::Holder => {
                    two.lock(&k).holder_info().await.unwrap();
                }
                Contact::Contended => {
                    let err = two.lock(&k).try_acquire().await.unwrap_err();
                    assert!(err.is_contended(), "{what}: {err}");
                }
                Contact::Acquired => {
                    let other = format!("live:restarts:{{{kind:?}:{round}}}:other");
                    two.lock(other)
                        .try_acquire()
                        .await
                        .unwrap()
                        .release()
                        .await
                        .unwrap();
                }
            }
            // More than 2.5 s after client 2's first contact: a client that never read a run id
            // before tells the restart by the restarted server's uptime (`uptime_in_seconds` is whole
            // seconds; see `ops::run_id`). (The check reads the run id.)
            let quiet = match contact {
                Contact::Check => 300,
                _ => 2700,
            };
            tokio::time::sleep(Duration::from_millis(quiet)).await;
            servers.get_mut(0).restart();
            servers.get_mut(1).restart();
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            // Client 2 tries for as long as most of client 1's validity lasts.
            let stop = valid_until - Duration::from_millis(1500);
            let mut attempts = 0;
            while Instant::now() < stop {
                attempts += 1;
                if let Ok(second) = two.lock(&k).try_acquire().await {
                    let at = Instant::now();
                    let both = held.is_held() && at < valid_until;
                    let _ = second.release().await;
                    assert!(
                        !both,
                        "{what}: client 2 acquired at attempt {attempts}, {:?} before client 1's \
                                 lease ends: two holders",
                        valid_until - at
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(attempts > 0, "{what}: no attempt made");
            let _ = held.release().await;
        }
    });
}

#[test]
fn a_redis_url_client_that_talked_to_every_server_never_counts_a_restarted_one_while_a_lease_relies_on_it()
 {
    a_client_that_talked_to_every_server_never_counts_a_restarted_one(
        "a_redis_url_client_that_talked_to_every_server_never_counts_a_restarted_one_while_a_lease_relies_on_it",
        Kind::RedisUrls,
    );
}

#[test]
fn a_fred_url_client_that_talked_to_every_server_never_counts_a_restarted_one_while_a_lease_relies_on_it()
 {
    a_client_that_talked_to_every_server_never_counts_a_restarted_one(
        "a_fred_url_client_that_talked_to_every_server_never_counts_a_restarted_one_while_a_lease_relies_on_it",
        Kind::FredUrls,
    );
}

#[test]
fn a_redis_manager_client_that_talked_to_every_server_never_counts_a_restarted_one_while_a_lease_relies_on_it()
 {
    a_client_that_talked_to_every_server_never_counts_a_restarted_one(
        "a_redis_manager_client_that_talked_to_every_server_never_counts_a_restarted_one_while_a_lease_relies_on_it",
        Kind::RedisManager,
    );
}

#[test]
fn a_fred_client_that_talked_to_every_server_never_counts_a_restarted_one_while_a_lease_relies_on_it()
 {
    a_client_that_talked_to_every_server_never_counts_a_restarted_one(
        "a_fred_client_that_talked_to_every_server_never_counts_a_restarted_one_while_a_lease_relies_on_it",
        Kind::FredClient,
    );
}

/// Counts the core's `run_id` calls on one node; forwards everything else (the claim with its run id slot
/// included) as `NodeWrapper` does by default.
struct CountsRunIds {
    inner: Arc<dyn RedisNode>,
    calls: Arc<std::sync::atomic::AtomicU64>,
}

#[redlease::async_trait]
impl redlease::NodeWrapper for CountsRunIds {
    type Inner = Arc<dyn RedisNode>;

    fn inner(&self) -> &Self::Inner {
        &self.inner
    }

    async fn run_id(&self, key: &str) -> Result<redlease::RunId, redlease::NodeError> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        RedisNode::run_id(&*self.inner, key).await
    }
}

/// The restart check after each Redlock acquisition costs no round trip of its own: where a node would
/// have to ask the server (fred, a reconnecting `ConnectionManager`: they cannot name the connection a reply
/// came on), its `INFO server` rides behind the acquisition's `SET … NX GET` in one write and the core calls
/// no `run_id`; where the node answers from memory (a multiplexed connection), no `INFO` is sent while it
/// trusts its connection, and one rides with a `SET` after it stopped trusting it. Counted on the servers
/// (`INFO commandstats`): one `INFO` per `SET` on fred and `ConnectionManager`, never more than the `SET`s
/// on a multiplexed connection.
#[test]
fn a_redlock_acquisition_checks_for_restarts_without_a_separate_info_round_trip() {
    use crate::common::Backend;
    use crate::stats::Stats;
    use std::sync::atomic::{AtomicU64, Ordering};
    const N: u64 = 10;
    on_every_server(
        "a_redlock_acquisition_checks_for_restarts_without_a_separate_info_round_trip",
        |flavor| async move {
            let servers = RedisServers::start_flavor(flavor, 3);
            let urls = servers.urls();
            for backend in common::ALL_BACKENDS {
                let calls = Arc::new(AtomicU64::new(0));
                let mut nodes: Vec<Arc<dyn RedisNode>> = Vec::new();
                for url in &urls {
                    nodes.push(Arc::new(CountsRunIds {
                        inner: common::node(backend, url).await,
                        calls: calls.clone(),
                    }));
                }
                let manager = LockManager::redlock_dyn(nodes, config(TTL)).unwrap();
                let lock = manager.lock(format!("live:restarts:{{info:{backend:?}}}:lock"));
                // Warm: the first acquisition checks each connection's capabilities (its run id asked apart).
                for _ in 0..2 {
                    lock.try_acquire().await.unwrap().release().await.unwrap();
                }
                // What two snapshots alone count (each snapshot's own `INFO` shows in the next one).
                let before: Vec<_> = servers.iter().map(Stats::of).collect();
                let mid: Vec<_> = servers.iter().map(Stats::of).collect();
                let calls_before = calls.load(Ordering::Relaxed);
                for _ in 0..N {
                    lock.try_acquire().await.unwrap().release().await.unwrap();
                }
                let run_id_calls = calls.load(Ordering::Relaxed) - calls_before;
                for (i, server) in servers.iter().enumerate() {
                    let seen = Stats::of(server).since(&mid[i]);
                    let infos = seen.sent("info") - mid[i].since(&before[i]).sent("info");
                    let sets = seen.sent("set");
                    let what = format!("{backend:?}, server {i}: {infos} INFO, {sets} SET");
                    assert!(sets > 0, "{what}");
                    if backend == Backend::RedisMultiplexed {
                        // Answered from memory while the node trusts its connection. Whatever makes it forget
                        // what it learned (a failed or refused request does) makes the next claim ask again —
                        // pipelined with its SET, never a round trip of its own. Under load it does forget:
                        // CI saw 1 INFO with 9 SETs on Valkey 9.1 without Lua, and beside two `yes` loops up
                        // to 4 with 10 (which request reset it there is not pinned down).
                        assert!(infos <= sets, "{what}: every INFO rides with a SET");
                    } else {
                        assert_eq!(infos, sets, "{what}: one INFO with each SET, none apart");
                    }
                }
                if backend != Backend::RedisMultiplexed {
                    assert_eq!(
                        run_id_calls, 0,
                        "{backend:?}: the run id comes with the acquisition, never asked apart"
                    );
                }
            }
        },
    );
}
