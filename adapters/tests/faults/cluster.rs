//! A hung shard of a Redis Cluster: the master owning one key's slot is stopped (SIGSTOP) while a lease on
//! a key of another master renews. Operations on the hung shard's key are bounded by the operation timeout
//! and fail; the other shard's lease is renewed throughout as if nothing happened (a cluster client must not
//! let one node's silence hold up the connections to the others, nor refresh its slot map in a way that
//! does); once the master answers again, its key is taken. Both clients, Redis 7.0 and Valkey 9.1 clusters.
//!
//! The pause stays below the cluster's node timeout (2 s): longer, and the other masters mark it failed;
//! `cluster-require-full-coverage no` is set anyway, so that a slow machine stretching the pause does not
//! take the healthy shard down with it (that would be the cluster's choice, not the client's).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{Config, LeaseState, LockManager, RedisNode};
use redlease_testkit::server::RedisCluster;

#[path = "../shared/clusters.rs"]
mod clusters;

use crate::common::{CLUSTERS, on_servers};

const OP: Duration = Duration::from_millis(250);
const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_millis(250);
/// How long the hung master stays stopped: several renewal intervals, below the 2 s cluster node timeout.
const PAUSE: Duration = Duration::from_millis(1_300);
/// Room for scheduling on a loaded machine above the rounds a bound counts.
const SLACK: Duration = Duration::from_millis(400);

/// A key (with a hash tag of its own) whose slot master `index` owns: the one node that answers a command
/// on it without a `MOVED` redirection.
fn key_owned_by(cluster: &RedisCluster, index: usize, what: &str) -> String {
    (0..10_000)
        .map(|i| format!("fault:{{{what}:{i}}}:lock"))
        .find(|k| {
            cluster.nodes()[index]
                .try_cmd(&["EXISTS", k])
                .is_ok_and(|r| r == "0")
        })
        .unwrap_or_else(|| panic!("no key of master {index} among 10,000 tags"))
}

#[test]
fn a_hung_cluster_master_bounds_its_keys_operations_and_never_holds_up_another_masters_lease() {
    let test =
        "a_hung_cluster_master_bounds_its_keys_operations_and_never_holds_up_another_masters_lease";
    on_servers(test, &CLUSTERS, |flavor| async move {
        let Some(cluster) = RedisCluster::start_flavor_or_skip(test, flavor) else {
            return;
        };
        for n in cluster.nodes() {
            n.cmd(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
        }
        let nodes: [(&str, Arc<dyn RedisNode>); 2] = [
            (
                "redis-rs",
                Arc::new(clusters::redis_rs_node(&cluster).await),
            ),
            ("fred", Arc::new(clusters::fred_node(&cluster).await)),
        ];
        for (client, node) in nodes {
            let what = format!("{flavor} {client}");
            let config = Config::default()
                .with_expiry(TTL)
                .with_attempts(1)
                .with_operation_timeout(OP);
            let manager = LockManager::single(node, config)
                .unwrap()
                .with_spawner(|task| {
                    tokio::spawn(task);
                });
            let healthy = key_owned_by(&cluster, 1, &format!("healthy:{client}"));
            let hung = key_owned_by(&cluster, 0, &format!("hung:{client}"));
            // Warm every connection: the hung master's too.
            let lease = manager
                .lock(&healthy)
                .auto_renew(RENEW)
                .try_acquire()
                .await
                .unwrap();
            manager
                .lock(&hung)
                .try_acquire()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();

            cluster.nodes()[0].pause();
            let paused = Instant::now();
            // On the hung master: one round and its clean-up, each cut at the operation timeout.
            let started = Instant::now();
            let err = manager.lock(&hung).try_acquire().await.unwrap_err();
            let took = started.elapsed();
            assert!(
                took <= OP * 2 + SLACK,
                "{what}: an acquisition on the hung master took {took:?} (operation timeout {OP:?})"
            );
            assert!(!err.is_contended(), "{what}: {err}");
            // The other master's lease: renewed through the pause, never at risk.
            let mut states = Vec::new();
            while paused.elapsed() < PAUSE {
                states.push(lease.state());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Asked of its master directly (`cmd_for_key` would try the stopped one first).
            let pttl: u64 = cluster.nodes()[1].cmd(&["PTTL", &healthy]).parse().unwrap();
            cluster.nodes()[0].resume();
            assert!(
                states.iter().all(|s| *s == LeaseState::Held),
                "{what}: the healthy master's lease left Held during the pause: {:?}",
                states.iter().find(|s| **s != LeaseState::Held)
            );
            // Renewed every 250 ms: the key's TTL was refreshed within the last few intervals.
            assert!(
                Duration::from_millis(pttl) >= TTL - RENEW * 2 - SLACK,
                "{what}: the healthy key's PTTL is {pttl} ms after {PAUSE:?}: not renewed"
            );

            // Back: the hung master's key is taken again (its connection may need a reconnection first).
            let deadline = Instant::now() + Duration::from_secs(10);
            let back = loop {
                match manager.lock(&hung).try_acquire().await {
                    Ok(l) => break l,
                    Err(e) => assert!(
                        Instant::now() < deadline,
                        "{what}: the master that answers again still fails: {e}"
                    ),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            back.release().await.unwrap();
            assert_eq!(lease.state(), LeaseState::Held, "{what}");
            lease.release().await.unwrap();
        }
    });
}
