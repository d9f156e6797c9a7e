//! Leased semaphores (`LockManager::semaphore`): at most N holders, permits timed by the node's clock,
//! renewed, released and lost like leases, and the Redlock quorum rule.

use std::time::Duration;

use redlease::{
    ConfigError, Error, LeaseState, NotAcquiredReason, PermitOp, PermitReply, RedisNode, Timer,
    Token, Ttl, semaphore_quorum,
};
use redlease_testkit::{History, MemoryNode, Op};

use crate::support::*;

#[test]
fn at_most_n_hold_a_permit_and_a_released_one_is_taken_again() {
    for n in [1, 5] {
        let mut c = Cluster::new(n, 111, config());
        let api = c.manager.semaphore("api", 3).unwrap();
        let mut held = Vec::new();
        let mut refused = 0;
        for _ in 0..10 {
            match c.sim.block_on({
                let api = api.clone();
                async move { api.try_acquire().await }
            }) {
                Ok(lease) => held.push(lease),
                Err(e) => {
                    assert!(e.is_contended(), "n={n}: {e}");
                    refused += 1;
                }
            }
        }
        assert_eq!((held.len(), refused), (3, 7), "n={n}");
        let first = held.remove(0);
        c.sim
            .block_on(async move { first.release().await })
            .unwrap();
        let again = c.sim.block_on({
            let api = api.clone();
            async move { api.try_acquire().await }
        });
        assert!(again.is_ok(), "n={n}: a released permit is free again");
    }
}

#[test]
fn a_dead_holders_permit_comes_back_at_its_ttl_by_the_nodes_clock() {
    let mut c = Cluster::new(1, 112, config());
    let api = c.manager.semaphore("api", 1).unwrap().expiry(secs(5));
    let lease = c
        .sim
        .block_on({
            let api = api.clone();
            async move { api.try_acquire().await }
        })
        .unwrap();
    // The holder dies: nothing releases or renews its permit.
    std::mem::forget(lease);
    c.sim.run_for(secs(5) - ms(1));
    let r = c.sim.block_on({
        let api = api.clone();
        async move { api.try_acquire().await }
    });
    assert!(r.unwrap_err().is_contended());
    c.sim.run_for(ms(1));
    let r = c.sim.block_on(async move { api.try_acquire().await });
    assert!(r.is_ok(), "the permit expired on the node's clock");
}

#[test]
fn a_permit_is_renewed_and_lost_like_a_lease() {
    let mut c = Cluster::with_spawner(3, 113, config().with_expiry(secs(3)));
    let api = c.manager.semaphore("api", 1).unwrap().auto_renew(secs(1));
    let lease = c
        .sim
        .block_on({
            let api = api.clone();
            async move { api.try_acquire().await }
        })
        .unwrap();
    c.sim.run_for(secs(30));
    assert_eq!(lease.state(), LeaseState::Held, "renewed for ten TTLs");
    assert!(c.faults[0].calls(Op::Extend) >= 29);
    // The permits vanish from every node (a restart without persistence): the next renewal finds it gone.
    for node in &c.nodes {
        node.restart();
    }
    c.sim.run_for(secs(2));
    assert!(
        matches!(lease.state(), LeaseState::Lost(_)),
        "{:?}",
        lease.state()
    );
}

#[test]
fn a_waiter_is_woken_by_a_permits_release() {
    let mut c = Cluster::new(1, 114, config());
    let api = c.manager.semaphore("api", 1).unwrap();
    let holder = c
        .sim
        .block_on({
            let api = api.clone();
            async move { api.try_acquire().await }
        })
        .unwrap();
    let clock = c.clock.clone();
    let result = std::sync::Arc::new(std::sync::Mutex::new(None));
    c.sim.spawn({
        let result = result.clone();
        async move {
            let r = api.acquire_within(secs(20)).await;
            *result.lock().unwrap() = Some((r.is_ok(), clock.now()));
        }
    });
    c.sim.run_for(secs(5));
    assert!(result.lock().unwrap().is_none(), "still waiting");
    let released = c.now();
    c.sim
        .block_on(async move { holder.release().await })
        .unwrap();
    c.sim.run_for(ms(100));
    let (won, at) = result.lock().unwrap().take().expect("woken");
    assert!(won);
    assert!(
        at - released < ms(50),
        "woken {:?} after the release",
        at - released
    );
}

#[test]
fn a_redlock_semaphore_counts_a_permit_only_on_a_pigeonhole_quorum() {
    // The rule: (permits + 1) · q > permits · n.
    assert_eq!(semaphore_quorum(3, 1), Some(2));
    assert_eq!(semaphore_quorum(3, 2), Some(3));
    assert_eq!(semaphore_quorum(5, 2), Some(4));
    // Why a majority is not enough: three clients, two permits, three nodes, each node holding two permits
    // (its capacity) — yet every client holds a permit on a majority of the nodes. Three holders.
    let nodes: Vec<MemoryNode> = (0..3).map(|_| MemoryNode::new()).collect();
    let tokens: Vec<Token> = (0..3).map(|_| Token::random().unwrap()).collect();
    let ttl = Ttl::from_millis(60_000).unwrap();
    let placement = [[0, 1], [1, 2], [0, 2]];
    let majorities = redlease_testkit::block_on(async {
        for (node, clients) in nodes.iter().zip(placement) {
            for c in clients {
                let r = node
                    .permit("api", &tokens[c], ttl, PermitOp::Acquire { permits: 2 })
                    .await
                    .unwrap();
                assert_eq!(r, PermitReply::Done);
            }
        }
        let mut majorities = 0;
        for token in &tokens {
            let mut on = 0;
            for node in &nodes {
                if node
                    .permit("api", token, ttl, PermitOp::Extend)
                    .await
                    .unwrap()
                    == PermitReply::Done
                {
                    on += 1;
                }
            }
            if on >= 2 {
                majorities += 1;
            }
        }
        majorities
    });
    assert_eq!(majorities, 3, "a bare majority lets 3 hold 2 permits");
    // The manager asks for all three nodes here: with one down, no permit is handed out at all.
    let mut c = Cluster::new(3, 115, config());
    let api = c.manager.semaphore("api", 2).unwrap();
    c.faults[2].partition();
    match c.sim.block_on(async move { api.try_acquire().await }) {
        Err(Error::NotAcquired {
            reason: NotAcquiredReason::TooFewNodes,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn zero_permits_is_refused_before_anything_is_sent() {
    let c = Cluster::new(1, 116, config());
    assert!(matches!(
        c.manager.semaphore("api", 0),
        Err(Error::Config(ConfigError::Semaphore(_)))
    ));
    assert_eq!(c.calls(), 0);
}

/// One hostile client of a semaphore: waits for a permit, holds it a while (renewed in the background or
/// not, sometimes with a hold limit), then releases or drops it.
async fn permit_client(
    api: redlease::Semaphore,
    clock: redlease_testkit::SkewedClock,
    mut rng: redlease::machine::Jitter,
    horizon: Duration,
) {
    let end = clock.now() + horizon;
    while clock.now() < end {
        let mut api = api.clone();
        if rng.next_u64() % 2 == 0 {
            api = api.auto_renew(ms(400 + rng.next_u64() % 400));
        }
        if rng.next_u64() % 5 == 0 {
            api = api.max_hold(ms(500 + rng.next_u64() % 2_000));
        }
        let Ok(lease) = api.acquire_within(ms(100 + rng.next_u64() % 1_500)).await else {
            clock
                .sleep_until(clock.now() + ms(1 + rng.next_u64() % 200))
                .await;
            continue;
        };
        hold_or_lost(&lease, &clock, ms(rng.next_u64() % 2_000)).await;
        if rng.next_u64() % 4 == 0 {
            drop(lease);
        } else {
            let _ = lease.release().await;
        }
    }
}

/// Five hostile clients (skewed clocks, pauses, late and reordered requests, every random fault) share a
/// semaphore of 2 permits on 1, 3 or 5 nodes: never more than 2 believed holders, every loss reported by
/// its deadline. `REDLEASE_SEMAPHORE_SEEDS` runs more seeds.
#[test]
fn a_semaphore_never_has_more_holders_than_permits_under_hostile_faults() {
    let mut total = 0;
    let seeds = hostile_seeds("REDLEASE_SEMAPHORE_SEEDS", 1_000, |seed| {
        let mut c = hostile_cluster(seed);
        let history = History::new();
        let horizon = secs(8);
        for id in 0..5u64 {
            let (manager, clock) = c.hostile_client(id, &history, horizon, 2);
            let api = manager.semaphore("api", 2).unwrap();
            let rng = c.sim.rng();
            c.sim
                .client(id)
                .spawn(permit_client(api, clock, rng, horizon));
        }
        assert!(
            c.sim.run_until_idle(secs(120)),
            "seed {seed}: clients stuck"
        );
        if let Err(v) = history.check_holders(2) {
            panic!("seed {seed}: {v}");
        }
        total += history.acquisitions();
    });
    assert!(
        total > seeds as usize * 3,
        "only {total} permits over {seeds} seeds"
    );
}

/// `permits` permits of a batching manager's semaphore (5 ms window, batches of 100) and `readers` read
/// shares of a read/write lock, all renewed in the background every 10 s.
fn hold_permits(
    n: usize,
    permits: usize,
    readers: usize,
) -> (Cluster, Vec<redlease::Lease>, Vec<redlease::Lease>) {
    let cfg = config().with_renewal_batching(ms(5), 100);
    let mut c = Cluster::with_spawner(n, 117, cfg);
    let api = c
        .manager
        .semaphore("api", permits.max(1) as u32)
        .unwrap()
        .auto_renew(secs(10));
    let held: Vec<_> = (0..permits)
        .map(|_| {
            let api = api.clone();
            c.sim
                .block_on(async move { api.try_acquire().await })
                .unwrap()
        })
        .collect();
    let rw = c.manager.rw_lock("report");
    let read = rw.read().clone().auto_renew(secs(10));
    let shares: Vec<_> = (0..readers)
        .map(|_| c.try_acquire(&read).unwrap())
        .collect();
    (c, held, shares)
}

#[test]
fn batched_renewal_renews_permits_with_one_call_per_node_and_batch() {
    for n in [1usize, 3] {
        let (mut c, held, shares) = hold_permits(n, 250, 0);
        let start = c.now();
        c.sim.run_for(secs(120));
        for lease in &held {
            assert_eq!(lease.state(), LeaseState::Held, "n={n}");
            assert!(lease.valid_until() > c.now() + secs(15), "n={n}");
        }
        // 11 renewal waves of 250 permits (each up to 5 ms late), each in batches of at most 100: 3 calls
        // per node per wave, against 250 one by one.
        for f in &c.faults {
            let calls = f.calls(Op::Extend);
            assert!(
                (11 * 3..=12 * 3).contains(&calls),
                "n={n}: {calls} extension calls in {:?}",
                c.now() - start
            );
        }
        drop((held, shares));
    }
}

#[test]
fn read_shares_and_a_fair_holder_renew_in_batches_too() {
    let (mut c, held, shares) = hold_permits(1, 0, 40);
    let fair = c.manager.lock("printer").fair().auto_renew(secs(10));
    let fair_lease = c.try_acquire(&fair).unwrap();
    let before = c.faults[0].calls(Op::Extend);
    c.sim.run_for(secs(61));
    assert!(shares.iter().all(|l| l.state() == LeaseState::Held));
    assert_eq!(fair_lease.state(), LeaseState::Held);
    // 6 waves: one call for the 40 readers and one for the fair holder each (their own managers' renewers),
    // against 41 one by one.
    assert_eq!(c.faults[0].calls(Op::Extend) - before, 12);
    drop((held, shares, fair_lease));
}

/// A node that extends lock keys in a batch but not permits (as a Lua-less server): the permits' batch
/// falls back to one extension per permit inside the call, and they stay held.
#[test]
fn permits_renew_one_by_one_where_the_node_cannot_batch_them() {
    struct LocksOnly(MemoryNode);
    #[redlease::async_trait]
    impl redlease::NodeWrapper for LocksOnly {
        type Inner = MemoryNode;
        fn inner(&self) -> &MemoryNode {
            &self.0
        }
        async fn extend_many(
            &self,
            items: &[redlease::ExtendItem<'_>],
        ) -> Result<Vec<bool>, redlease::NodeError> {
            if items.iter().any(|i| i.permit) {
                return Err(redlease::NodeError::not_applied(
                    redlease::NodeErrorKind::Unsupported,
                    "no permit batches",
                ));
            }
            self.0.extend_many(items).await
        }
    }
    let mut sim = redlease_testkit::Sim::new(118);
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    let (faulty, faults) = redlease_testkit::FaultyNode::new(LocksOnly(node), clock.clone());
    let manager = redlease::LockManager::single(faulty, config().with_renewal_batching(ms(5), 100))
        .unwrap()
        .with_timer(clock.clone())
        .with_spawner(sim.spawner());
    let api = manager.semaphore("api", 5).unwrap().auto_renew(secs(10));
    let held: Vec<_> = (0..5)
        .map(|_| {
            let api = api.clone();
            sim.block_on(async move { api.try_acquire().await })
                .unwrap()
        })
        .collect();
    sim.run_for(secs(31));
    assert!(held.iter().all(|l| l.state() == LeaseState::Held));
    // 3 waves, each one (refused) batch call and then one extension per permit inside it.
    assert_eq!(faults.calls(Op::Extend), 3 * (1 + 5));
}

/// Records each lease of a client as a client of its own (`(client + 1) << 32 | lease`), so that one client
/// may hold several permits at once in the history.
struct PerLease {
    history: History,
    client: u64,
    clock: redlease_testkit::SkewedClock,
}

impl redlease::Observer for PerLease {
    fn event(&self, event: &redlease::LeaseEvent<'_>) {
        let id = ((self.client + 1) << 32) | (event.lease.get() & 0xFFFF_FFFF);
        redlease::Observer::event(
            &self.history.recorder(id).on_clock(self.clock.clone()),
            event,
        );
    }
}

/// Batched permit renewal under every hostile condition: four clients each run two permit holders through
/// one semaphore (so their renewals share batches) of 3 permits on 1, 3 or 5 nodes; never more than 3
/// believed holders. `REDLEASE_SEMAPHORE_SEEDS` runs more seeds.
#[test]
fn batched_permits_never_exceed_the_count_under_hostile_faults() {
    let mut renewed = 0;
    let seeds = hostile_seeds("REDLEASE_SEMAPHORE_SEEDS", 1_000, |seed| {
        let n = [1usize, 3, 5][(seed % 3) as usize];
        let cfg = config()
            .with_expiry(secs(2))
            .with_retry_delay(ms(50))
            .with_jitter_seed(seed)
            .with_renewal_batching(ms(3), 3);
        let mut c = Cluster::hostile(n, seed, cfg);
        let history = History::new();
        let horizon = secs(8);
        for id in 0..4u64 {
            let (manager, clock) = c.hostile_client(id, &history, horizon, 2);
            let manager = manager.with_observer(PerLease {
                history: history.clone(),
                client: id,
                clock: clock.clone(),
            });
            let api = manager.semaphore("api", 3).unwrap();
            for _ in 0..2 {
                let rng = c.sim.rng();
                c.sim
                    .client(id)
                    .spawn(permit_client(api.clone(), clock.clone(), rng, horizon));
            }
        }
        assert!(
            c.sim.run_until_idle(secs(120)),
            "seed {seed}: clients stuck"
        );
        // The clients' pauses, for each of their leases.
        let events = history.events();
        let checked = History::new();
        for e in &events {
            if let redlease_testkit::EventKind::Paused { .. } = e.kind {
                let mut ids: Vec<u64> = events
                    .iter()
                    .map(|l| l.client)
                    .filter(|l| l >> 32 == e.client + 1)
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                for id in ids {
                    let mut copy = e.clone();
                    copy.client = id;
                    checked.push(copy);
                }
            } else {
                checked.push(e.clone());
            }
        }
        if let Err(v) = checked.check_holders(3) {
            panic!("seed {seed}: {v}");
        }
        renewed += events
            .iter()
            .filter(|e| matches!(e.kind, redlease_testkit::EventKind::Extended { .. }))
            .count();
    });
    assert!(renewed > seeds as usize * 3, "only {renewed} renewals");
}

/// Permit releases nobody waits for publish nothing (no acquisition was blocked, so the node has no waiter
/// marker), for a semaphore, a read/write lock's reader and writer and a fair lock; and a waiter blocked
/// behind a holder that renews a short permit for seconds — long after its first marking attempt, with
/// polls of 30 s — is still woken by the release at once: each of its attempts, due when the permit it
/// was told about expires, marks the key again before the marker runs out.
#[test]
fn permit_releases_publish_only_for_waiters_and_a_long_waiter_is_still_woken() {
    let slow = config()
        .with_retry_delay(secs(30))
        .with_max_retry_delay(secs(30));
    let mut c = Cluster::with_spawner(1, 117, slow);
    let sem = c.manager.semaphore("api", 1).unwrap();
    let rw = c.manager.rw_lock("doc");
    let fair = c.manager.lock("printer").fair();
    for _ in 0..20 {
        c.sim.block_on({
            let (sem, read, write, fair) = (
                sem.clone(),
                rw.read().clone(),
                rw.write().clone(),
                fair.clone(),
            );
            async move {
                sem.try_acquire().await.unwrap().release().await.unwrap();
                read.try_acquire().await.unwrap().release().await.unwrap();
                write.try_acquire().await.unwrap().release().await.unwrap();
                fair.try_acquire().await.unwrap().release().await.unwrap();
            }
        });
    }
    assert_eq!(c.nodes[0].published(), 0, "releases without a waiter");
    // A holder renewing a 1 s permit every 300 ms.
    let holder = c
        .sim
        .block_on({
            let sem = sem.expiry(secs(1)).auto_renew(ms(300));
            async move { sem.try_acquire().await }
        })
        .unwrap();
    let clock = c.clock.clone();
    let result = std::sync::Arc::new(std::sync::Mutex::new(None));
    c.sim.spawn({
        let result = result.clone();
        async move {
            // The lease is kept (a dropped one is released, and publishes too while the marker lives).
            let r = sem.acquire_within(secs(60)).await;
            *result.lock().unwrap() = Some((r, clock.now()));
        }
    });
    c.sim.run_for(ms(7_300));
    assert!(result.lock().unwrap().is_none(), "still waiting");
    assert!(holder.is_held(), "renewed");
    let released = c.now();
    c.sim
        .block_on(async move { holder.release().await })
        .unwrap();
    c.sim.run_for(ms(100));
    let (won, at) = result.lock().unwrap().take().expect("woken");
    let _lease = won.unwrap();
    assert!(
        at - released < ms(50),
        "woken {:?} after the release",
        at - released
    );
    assert_eq!(
        c.nodes[0].published(),
        1,
        "the release the waiter marked for"
    );
}
