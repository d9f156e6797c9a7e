//! Batched renewal on real servers: hundreds of leases of one manager renewed with one script call per
//! batch (without Lua, one watched `PEXPIRE … GT` per lease), each lease still held; on a cluster, one call per slot.

use std::time::Duration;

use redlease::{ExtendItem, LeaseState, LockManager, RedisNode, Token, Ttl};
use redlease_testkit::server::{RedisCluster, RedisServer};

use crate::common::{self, ALL_BACKENDS, CLUSTERS, config, on_every_server, on_servers};
use crate::stats::Stats;

const TTL: Duration = Duration::from_millis(900);
const RENEW: Duration = Duration::from_millis(250);
const LEASES: usize = 300;

#[test]
fn batched_renewal_keeps_300_leases_with_a_few_script_calls_per_wave() {
    on_every_server(
        "batched_renewal_keeps_300_leases_with_a_few_script_calls_per_wave",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            // Without Lua every extension is a watched transaction of its own, and a node's transactions
            // pass its gate one at a time: a batch of 100 is 100 transactions in a row, which on a loaded
            // machine (CI's live lane) outlasted a 180 ms round (TTL / 5) and lost leases. Three times the TTL
            // and interval there: the same number of rounds, each with three times the time.
            let scale = if common::has_lua(flavor) { 1 } else { 3 };
            let (ttl, renew) = (TTL * scale, RENEW * scale);
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let manager = LockManager::single(
                    node,
                    // Three attempts: an acquisition round that times out (180 ms) on a loaded machine is
                    // retried, as a caller would.
                    config(ttl)
                        .with_attempts(3)
                        .with_renewal_batching(Duration::from_millis(10), 100),
                )
                .unwrap()
                .with_spawner(|task| {
                    tokio::spawn(task);
                });
                // All at once, as a service starting its jobs would: leases acquired further apart than the
                // batching window renew in batches of their own, which stay apart, so one after another on a
                // loaded machine (a few ms each) they would spread over dozens of windows per wave.
                let tasks: Vec<_> = (0..LEASES)
                    .map(|i| {
                        let lock = manager
                            .lock(format!("live:{{batch:{backend:?}}}:{i}"))
                            .auto_renew(renew);
                        tokio::spawn(async move { lock.acquire().await })
                    })
                    .collect();
                let mut held = Vec::new();
                for task in tasks {
                    held.push(task.await.unwrap().unwrap());
                }
                let before = Stats::of(&server);
                // Two TTLs: without renewal every lease would have expired.
                tokio::time::sleep(ttl * 2).await;
                let sent = Stats::of(&server).since(&before);
                // Kept: none lost. A renewal round that timed out on a loaded machine (rounds are TTL / 5 =
                // 180 ms, and four servers' bodies run at once on two cores) leaves its leases at risk until
                // the next one succeeds, still valid: that is allowed, a loss is not.
                let mut at_risk = 0;
                for (i, lease) in held.iter().enumerate() {
                    match lease.state() {
                        LeaseState::Held => {}
                        LeaseState::AtRisk => at_risk += 1,
                        other => panic!("{backend:?} lease {i}: {other:?}"),
                    }
                }
                if at_risk > 0 {
                    eprintln!(
                        "{backend:?}: {at_risk} of {LEASES} leases at risk (a renewal round timed out)"
                    );
                }
                let pttl: i64 = server
                    .cmd(&[
                        "PTTL",
                        &format!("live:{{batch:{backend:?}}}:{}", LEASES - 1),
                    ])
                    .parse()
                    .unwrap();
                assert!(
                    pttl > 0,
                    "{backend:?}: the last lease's key is alive ({pttl} ms)"
                );
                // About 7 waves of 300 leases in 1.8 s; one by one that is ~2,100 extension calls, batched at most
                // 100 per call (a wave may straddle a window: a few more calls, never hundreds).
                let calls = sent.sent("evalsha") + sent.sent("eval");
                if common::has_lua(flavor) {
                    let extends = sent.sent("pexpire");
                    assert!(
                        extends >= 2 * LEASES as u64,
                        "{backend:?}: only {extends} PEXPIREs ran"
                    );
                    // At least ten extensions per call on average: one by one would be one per call. Acquired
                    // at once, the leases share about three full batches per wave (~21 calls); ten per call
                    // leaves room for waves that a loaded machine splits.
                    assert!(
                        calls * 10 <= extends,
                        "{backend:?}: {calls} script calls for {extends} extensions"
                    );
                } else {
                    // No script can batch them: each lease is extended by its own watched `PEXPIRE … GT`
                    // (an extension never shortens a key), and the leases are held all the same.
                    let extends = sent.sent("pexpire");
                    assert!(
                        extends >= 2 * LEASES as u64,
                        "{backend:?}: only {extends} watched PEXPIREs ran"
                    );
                    assert_eq!(calls, 0, "{backend:?}: a script was sent");
                }
                for lease in held {
                    lease.release().await.unwrap();
                }
            }
        },
    );
}

#[test]
fn a_cluster_batch_spanning_slots_is_one_call_per_slot_with_every_answer_in_place() {
    let test = "a_cluster_batch_spanning_slots_is_one_call_per_slot_with_every_answer_in_place";
    on_servers(test, &CLUSTERS, |flavor| async move {
        let Some(cluster) = RedisCluster::start_flavor_or_skip(test, flavor) else {
            return;
        };
        let nodes: Vec<Box<dyn RedisNode>> = vec![
            Box::new(crate::cluster::redis_rs_node(&cluster).await),
            Box::new(crate::cluster::fred_node(&cluster).await),
        ];
        for (n, node) in nodes.iter().enumerate() {
            let ttl = Ttl::from_millis(60_000).unwrap();
            let ours = Token::random().unwrap();
            let other = Token::random().unwrap();
            // Keys in many slots (no shared hash tag); every third one held by someone else.
            let keys: Vec<String> = (0..30).map(|i| format!("batch:{n}:{i}")).collect();
            for (i, k) in keys.iter().enumerate() {
                let t = if i % 3 == 0 { &other } else { &ours };
                assert!(
                    node.acquire(k, t, Ttl::from_millis(5_000).unwrap())
                        .await
                        .unwrap()
                );
            }
            let items: Vec<ExtendItem<'_>> = keys
                .iter()
                .map(|k| ExtendItem::new(k, &ours, ttl))
                .collect();
            let flags = node.extend_many(&items).await.unwrap();
            let expected: Vec<bool> = (0..keys.len()).map(|i| i % 3 != 0).collect();
            assert_eq!(flags, expected, "node {n}");
            for (i, k) in keys.iter().enumerate() {
                let state = node.inspect(k).await.unwrap().unwrap();
                let left = state.ttl.unwrap();
                if i % 3 == 0 {
                    assert!(left <= Duration::from_secs(5), "node {n} key {i}: {left:?}");
                } else {
                    assert!(left > Duration::from_secs(50), "node {n} key {i}: {left:?}");
                }
            }
        }
    });
}
