//! Batched renewal: many leases of one manager renewed by one `extend_many` call per node and window.

use redlease::{LeaseState, LossReason, NodeWrapper, RedisNode};
use redlease_testkit::{EventKind, History, MemoryNode, Op, for_each_seed};

use crate::support::*;

/// `leases` leases of one batching manager, acquired at one instant and renewed every 10 s for 2 minutes.
fn hold_many(n: usize, leases: usize, max_batch: usize) -> (Cluster, Vec<redlease::Lease>) {
    let cfg = config().with_renewal_batching(ms(5), max_batch);
    let mut c = Cluster::with_spawner(n, 40, cfg);
    let held: Vec<_> = (0..leases)
        .map(|i| {
            c.try_acquire(&c.manager.lock(format!("job:{i}")).auto_renew(secs(10)))
                .unwrap()
        })
        .collect();
    (c, held)
}

#[test]
fn batched_renewal_renews_every_lease_with_one_call_per_node_and_batch() {
    for n in [1usize, 3] {
        let (mut c, held) = hold_many(n, 250, 100);
        let start = c.now();
        c.sim.run_for(secs(120));
        for lease in &held {
            assert_eq!(lease.state(), LeaseState::Held, "n={n}");
            assert!(lease.valid_until() > c.now() + secs(15), "n={n}");
        }
        for (i, node) in c.nodes.iter().enumerate() {
            for j in [0, 249] {
                let ttl = node.pttl(&format!("job:{j}")).flatten().unwrap();
                assert!(ttl > secs(15), "n={n} node {i} job:{j}: {ttl:?}");
            }
        }
        // 11 renewal waves of 250 leases (each up to 5 ms late), each in batches of at most 100: 3 calls
        // per node per wave, against 250 one by one.
        for f in &c.faults {
            let calls = f.calls(Op::Extend);
            assert!(
                (11 * 3..=12 * 3).contains(&calls),
                "n={n}: {calls} extension calls in {:?}",
                c.now() - start
            );
        }
        drop(held);
    }
}

#[test]
fn a_lease_lost_in_a_batch_does_not_affect_the_others() {
    let (mut c, held) = hold_many(3, 20, 100);
    // Someone deletes job:7 on two of three nodes: at the next wave it alone is not held any more.
    c.nodes[0].del("job:7");
    c.nodes[1].del("job:7");
    let signal = held[7].lost();
    c.sim.run_for(secs(11));
    assert_eq!(c.sim.block_on(signal), LossReason::NotHeld);
    for (i, lease) in held.iter().enumerate() {
        if i != 7 {
            assert_eq!(lease.state(), LeaseState::Held, "job:{i}");
        }
    }
    assert!(
        c.holders("job:7", held[7].token().as_str()).is_empty(),
        "the lost lease's last token was cleaned up"
    );
}

#[test]
fn a_failing_node_puts_the_whole_batch_at_risk_and_a_later_batch_recovers_it() {
    let (mut c, held) = hold_many(1, 10, 100);
    c.faults[0].script(
        Op::Extend,
        [redlease_testkit::Fault::Fail(
            redlease::NodeErrorKind::Connection,
        )],
    );
    // The first wave (at 10 s) fails as one call; the retry a retry-delay later succeeds for all.
    c.sim.run_for(secs(10) + ms(50));
    let at_risk = held
        .iter()
        .filter(|l| l.state() == LeaseState::AtRisk)
        .count();
    assert_eq!(
        at_risk, 10,
        "one failed call fails every lease of the batch"
    );
    c.sim.run_for(secs(2));
    assert!(held.iter().all(|l| l.state() == LeaseState::Held));
}

/// A node that forwards everything but claims no batch support.
struct NoBatches(MemoryNode);

impl NodeWrapper for NoBatches {
    type Inner = MemoryNode;
    fn inner(&self) -> &MemoryNode {
        &self.0
    }
    fn extend_many_limit(&self) -> usize {
        0
    }
}

#[test]
fn without_batch_support_each_lease_renews_on_its_own() {
    let sim_seed = 41;
    let mut sim = redlease_testkit::Sim::new(sim_seed);
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    let (faulty, faults) = redlease_testkit::FaultyNode::new(NoBatches(node), clock.clone());
    assert_eq!(faulty.extend_many_limit(), 0);
    let manager = redlease::LockManager::single(faulty, config().with_renewal_batching(ms(5), 100))
        .unwrap()
        .with_timer(clock.clone())
        .with_spawner(sim.spawner());
    let held: Vec<_> = (0..5)
        .map(|i| {
            let lock = manager.lock(format!("job:{i}")).auto_renew(secs(10));
            sim.block_on(async move { lock.try_acquire().await })
                .unwrap()
        })
        .collect();
    sim.run_for(secs(31));
    assert!(held.iter().all(|l| l.state() == LeaseState::Held));
    assert_eq!(
        faults.calls(Op::Extend),
        15,
        "3 renewals of 5 leases, one call each"
    );
}

/// Batched renewal under every hostile fault, pauses and skewed clocks: each client holds up to four
/// keys at once through one manager, so batches carry several leases; the checker finds no overlap.
#[test]
fn batched_renewal_never_overlaps_under_hostile_faults_over_300_seeds() {
    let mut batched_rounds = 0;
    for_each_seed(0..300, |seed| {
        let n = [1usize, 3, 5][(seed % 3) as usize];
        let horizon = secs(8);
        let cfg = config()
            .with_expiry(secs(2))
            .with_retry_delay(ms(50))
            .with_jitter_seed(seed)
            .with_renewal_batching(ms(3), 3);
        let mut c = Cluster::hostile(n, seed, cfg);
        let history = History::new();
        for id in 0..3u64 {
            let (manager, clock) = c.hostile_client(id, &history, horizon, 2);
            for k in 0..4 {
                let mut lock = manager.lock(format!("r{k}"));
                if n == 1 {
                    lock = lock.fenced(format!("r{k}:fence"));
                }
                let rng = c.sim.rng();
                c.sim.client(id).spawn(crate::history::renewing_client(
                    lock,
                    clock.clone(),
                    rng,
                    horizon,
                ));
            }
        }
        assert!(
            c.sim.run_until_idle(secs(120)),
            "seed {seed}: clients stuck"
        );
        c.assert_every_lock_key_has_ttl();
        if let Err(v) = history.check() {
            panic!("seed {seed}: {v}");
        }
        batched_rounds += history
            .events()
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Extended { .. }))
            .count();
    });
    assert!(
        batched_rounds > 1_000,
        "only {batched_rounds} batched renewals"
    );
}

#[test]
fn renewal_batching_settings_are_checked() {
    for (cfg, what) in [
        (config().with_renewal_batching(ms(5), 0), "max_batch"),
        (config().with_renewal_batching(ms(5), 1001), "max_batch"),
        (config().with_renewal_batching(secs(60), 10), "window"),
    ] {
        let err = cfg.validate().unwrap_err();
        assert!(err.to_string().contains(what), "{err}");
    }
}
