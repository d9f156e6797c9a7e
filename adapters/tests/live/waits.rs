//! Durability waits on real processes: a `WAIT` blocks the connection it is sent on, so it must not be the
//! connection other leases and locks share.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{Durability, LockManager, RedisNode, ReplicaWait};
use redlease_adapters::fred::FredNode;
use redlease_adapters::fred::fred::prelude::*;
use redlease_adapters::redis::{ManagedNode, MultiplexedNode, redis};
use redlease_testkit::server::RedisServer;

use crate::common::{config, on_every_server};

const TTL: Duration = Duration::from_secs(3);
const LEASES: usize = 20;

/// The nodes that wait on connections of their own: redis-rs multiplexed and managed nodes from their
/// `connect` constructors and a lazy node (what `redis::single` builds); fred nodes over a connected client,
/// a lazy client (what `fred::single` builds) and a pool.
async fn nodes(url: &str) -> Vec<(&'static str, Arc<dyn RedisNode>)> {
    let client = redis::Client::open(url).unwrap();
    let fred_client = crate::common::fred_client(url);
    fred_client.init().await.unwrap();
    let fred_pool = crate::common::fred_builder(url).build_pool(2).unwrap();
    fred_pool.init().await.unwrap();
    vec![
        ("fred", Arc::new(FredNode::new(fred_client))),
        (
            "fred lazy",
            Arc::new(FredNode::lazy(crate::common::fred_client(url))),
        ),
        ("fred pool", Arc::new(FredNode::new(fred_pool))),
        (
            "multiplexed",
            Arc::new(MultiplexedNode::connect(&client).await.unwrap()),
        ),
        (
            "managed",
            Arc::new(ManagedNode::connect(&client).await.unwrap()),
        ),
        ("lazy", Arc::new(MultiplexedNode::lazy(client))),
    ]
}

/// With the replica stopped, every durability wait runs to its timeout. 20 `BestEffort` leases on one node
/// (one shared connection) are acquired and extended three times at once, while an unrelated lock on the
/// same node is taken and released: every acquisition and extension succeeds (the waits are reported, not
/// failed), and the unrelated lock never waits for them. On one shared connection the waits run one after
/// the other and hold up everything behind them: 20 waits of 300 ms are 6 s, longer than any round.
#[test]
fn durability_waits_never_hold_up_other_leases_or_locks_on_the_node() {
    on_every_server(
        "durability_waits_never_hold_up_other_leases_or_locks_on_the_node",
        |flavor| async move {
            let primary = RedisServer::start_flavor(flavor, &[]);
            let replica = primary.start_replica(&[]);
            primary
                .wait_for_replicas(1, Duration::from_secs(10))
                .unwrap();
            for (name, node) in nodes(&primary.url()).await {
                never_held_up(&format!("{flavor} {name}"), name, node, &replica).await;
            }
        },
    );
}

/// With `replica` (of `node`'s primary) stopped, every durability wait runs to its timeout: 20 `BestEffort`
/// leases on `node` are acquired and extended three times at once, while an unrelated lock on the same node
/// is taken and released; every acquisition and extension succeeds and the unrelated lock never waits for
/// them.
pub(crate) async fn never_held_up(
    what: &str,
    name: &str,
    node: Arc<dyn RedisNode>,
    replica: &RedisServer,
) {
    let wait = ReplicaWait::new(1, Duration::from_millis(300));
    let cfg = config(TTL);
    let op = cfg.operation_timeout_for(TTL);
    let waiting = LockManager::single(
        Arc::clone(&node),
        cfg.clone().with_durability(Durability::BestEffort(wait)),
    )
    .unwrap();
    let plain = LockManager::single(Arc::clone(&node), cfg).unwrap();
    // Warm up (connects a lazy node, runs the capability check).
    plain
        .lock(format!("waits:{{{name}}}:warm"))
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    replica.pause();
    let acquiring: Vec<_> = (0..LEASES)
        .map(|i| {
            let lock = waiting.lock(format!("waits:{{{name}:{i}}}:lock"));
            tokio::spawn(async move { lock.try_acquire().await })
        })
        .collect();
    let mut leases = Vec::new();
    for (i, task) in acquiring.into_iter().enumerate() {
        let lease = task.await.unwrap();
        leases.push(Arc::new(
            lease.unwrap_or_else(|e| panic!("{what}: lease {i}: {e}")),
        ));
    }
    for round in 0..3 {
        let extending: Vec<_> = leases
            .iter()
            .map(|lease| {
                let lease = Arc::clone(lease);
                tokio::spawn(async move { lease.extend(TTL).await })
            })
            .collect();
        let extended = async {
            let mut out = Vec::new();
            for task in extending {
                out.push(task.await.unwrap());
            }
            out
        };
        let unrelated = async {
            let started = Instant::now();
            let lease = plain
                .lock(format!("waits:{{{name}}}:unrelated"))
                .try_acquire()
                .await;
            let took = started.elapsed();
            (lease, took)
        };
        let (extended, (unrelated, took)) = tokio::join!(extended, unrelated);
        for (i, r) in extended.into_iter().enumerate() {
            assert!(
                r.is_ok(),
                "{what}: round {round}: extension of lease {i}: {r:?}"
            );
        }
        let unrelated =
            unrelated.unwrap_or_else(|e| panic!("{what}: round {round}: the unrelated lock: {e}"));
        // Within one operation timeout, as when no wait runs.
        assert!(
            took <= op,
            "{what}: round {round}: the unrelated lock took {took:?}"
        );
        unrelated.release().await.unwrap();
    }
    assert!(leases.iter().all(|l| l.is_held()), "{what}");
    replica.resume();
    for lease in leases {
        let Ok(lease) = Arc::try_unwrap(lease) else {
            panic!("{what}: a lease still shared");
        };
        lease.release().await.unwrap();
    }
}
