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

/// A node that forwards everything but claims no batch support, and counts the batches it is asked for
/// anyway (answering them unsupported, as such a node would).
struct NoBatches(MemoryNode, std::sync::Arc<std::sync::atomic::AtomicUsize>);

#[redlease::async_trait]
impl NodeWrapper for NoBatches {
    type Inner = MemoryNode;
    fn inner(&self) -> &MemoryNode {
        &self.0
    }
    fn profile(&self) -> redlease::NodeProfile {
        self.0.profile().with_batch_limit(0)
    }
    async fn extend_many(
        &self,
        _items: &[redlease::ExtendItem<'_>],
    ) -> Result<Vec<bool>, redlease::NodeError> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(redlease::NodeError::not_applied(
            redlease::NodeErrorKind::Unsupported,
            "no batches here",
        ))
    }
}

#[test]
fn without_batch_support_each_lease_renews_on_its_own() {
    let sim_seed = 41;
    let mut sim = redlease_testkit::Sim::new(sim_seed);
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (faulty, faults) =
        redlease_testkit::FaultyNode::new(NoBatches(node, asked.clone()), clock.clone());
    assert_eq!(faulty.profile().batch_limit, 0);
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
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a node whose profile has no batch limit is never sent a batch"
    );
}

/// Counts the batches its node is sent (and forwards them).
struct CountsBatches(MemoryNode, std::sync::Arc<std::sync::atomic::AtomicUsize>);

#[redlease::async_trait]
impl NodeWrapper for CountsBatches {
    type Inner = MemoryNode;
    fn inner(&self) -> &MemoryNode {
        &self.0
    }
    async fn extend_many(
        &self,
        items: &[redlease::ExtendItem<'_>],
    ) -> Result<Vec<bool>, redlease::NodeError> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0.extend_many(items).await
    }
}

#[test]
fn under_a_durability_policy_each_lease_renews_on_its_own_and_waits_for_its_replicas() {
    let mut sim = redlease_testkit::Sim::new(43);
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    node.set_replicas(Some(1));
    let batches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (faulty, faults) =
        redlease_testkit::FaultyNode::new(CountsBatches(node, batches.clone()), clock.clone());
    let durable = redlease::Durability::Required(redlease::ReplicaWait::new(1, ms(100)));
    let manager = redlease::LockManager::single(
        faulty,
        config()
            .with_renewal_batching(ms(5), 100)
            .with_durability(durable),
    )
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
    // A batch has no per-lease replica wait: batching is off under a durability policy.
    assert_eq!(
        batches.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a batch was sent under a durability policy"
    );
    assert_eq!(
        faults.calls(Op::Extend),
        15,
        "3 renewals of 5 leases, one call each"
    );
}

/// The shared renewer visits the lease due first, whatever order the leases were queued in: a short lease
/// queued before a long one is renewed on its own schedule, not when the long one falls due.
#[test]
fn the_renewer_serves_the_earliest_due_lease_first_whatever_the_queue_order() {
    let mut sim = redlease_testkit::Sim::new(47);
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    let batches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = CountsBatches(node, batches.clone());
    let manager =
        redlease::LockManager::single(counted, config().with_renewal_batching(ms(5), 100))
            .unwrap()
            .with_timer(clock.clone())
            .with_spawner(sim.spawner());
    // The short lease first (renewed every second), then the long one (every 20 s).
    let short = manager.lock("short").expiry(secs(3)).auto_renew(secs(1));
    let short = sim
        .block_on(async move { short.try_acquire().await })
        .unwrap();
    let long = manager.lock("long").expiry(secs(60)).auto_renew(secs(20));
    let long = sim
        .block_on(async move { long.try_acquire().await })
        .unwrap();
    sim.run_for(ms(10_500));
    assert_eq!(
        short.state(),
        LeaseState::Held,
        "the short lease waited behind the long one"
    );
    assert_eq!(long.state(), LeaseState::Held);
    assert_eq!(
        batches.load(std::sync::atomic::Ordering::SeqCst),
        10,
        "ten renewals of the short lease in ten seconds, one batch each, the long one not yet due"
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

/// Records the start of every automatic renewal round (its end minus its duration), per key.
#[derive(Default)]
struct RoundStarts(std::sync::Mutex<std::collections::HashMap<String, Vec<std::time::Instant>>>);

impl redlease::Observer for RoundStarts {
    fn event(&self, event: &redlease::LeaseEvent<'_>) {
        if let redlease::EventKind::Extension {
            renewal: true,
            round,
            ..
        } = event.kind
        {
            self.0
                .lock()
                .unwrap()
                .entry(event.key.to_string())
                .or_default()
                .push(event.at - round);
        }
    }
}

/// `leases` leases of a batching manager (5 ms window, batches of 100) acquired 1 ms apart, renewed every
/// 10 s, with the observer installed.
fn hold_spread(
    leases: usize,
    starts: &std::sync::Arc<RoundStarts>,
) -> (Cluster, Vec<redlease::Lease>) {
    let mut c = Cluster::with_spawner(1, 40, config().with_renewal_batching(ms(5), 100));
    c.manager = c
        .manager
        .clone()
        .with_observer(std::sync::Arc::clone(starts));
    let held = (0..leases)
        .map(|i| {
            let lease = c
                .try_acquire(&c.manager.lock(format!("job:{i}")).auto_renew(secs(10)))
                .unwrap();
            c.sim.run_for(ms(1));
            lease
        })
        .collect();
    (c, held)
}

/// The window gathers the leases due soon after the first one into its batch by renewing them early; none
/// waits for a batch past its schedule (a batch used to wait for its window to close, so the first lease of
/// a batch that did not fill was renewed a whole window late).
#[test]
fn batched_renewals_are_never_later_than_their_schedule() {
    let starts = std::sync::Arc::new(RoundStarts::default());
    let (mut c, held) = hold_spread(250, &starts);
    c.sim.run_for(secs(65));
    assert!(held.iter().all(|l| l.state() == LeaseState::Held));
    let starts = starts.0.lock().unwrap();
    let mut rounds = 0;
    for (key, s) in starts.iter() {
        assert!(s.len() >= 5, "{key}: {} renewals in 65 s", s.len());
        for pair in s.windows(2) {
            let gap = pair[1] - pair[0];
            // Scheduled 10 s after the previous round's start; at most the window early, never late.
            assert!(
                gap <= secs(10) && gap >= secs(10) - ms(5),
                "{key}: renewed {gap:?} after the previous round"
            );
            rounds += 1;
        }
    }
    assert!(rounds >= 250 * 4, "{rounds} renewal gaps");
    // 250 leases within 250 ms, in 5 ms windows: about 42 batches a wave, against 250 calls one by one.
    let calls = c.faults[0].calls(redlease_testkit::Op::Extend);
    assert!(calls <= 6 * 60, "{calls} extension calls in 6 waves");
    drop(held);
}

/// Leases renewed in batches have no task (and no sleep) of their own: the manager's renewer sleeps once
/// for all of them. (They used to keep one renewal task each, asleep between rounds.)
#[test]
fn batched_leases_keep_no_task_or_sleep_of_their_own() {
    let starts = std::sync::Arc::new(RoundStarts::default());
    let (mut c, held) = hold_spread(250, &starts);
    c.sim.run_for(secs(25));
    assert!(held.iter().all(|l| l.state() == LeaseState::Held));
    let tasks = c.sim.live_tasks();
    let sleeps = c.clock.pending_sleeps();
    assert!(tasks <= 2, "{tasks} live tasks for 250 batched leases");
    assert!(
        sleeps <= 2,
        "{sleeps} pending sleeps for 250 batched leases"
    );
    // Released: the renewer has nothing left and ends.
    for lease in held {
        c.sim.block_on(lease.release()).unwrap();
    }
    c.sim.run_for(secs(11));
    assert_eq!(
        c.sim.live_tasks(),
        0,
        "the renewer ended with its last lease"
    );
}

/// A manual extension of a batched lease — to a TTL shorter than what it has left (its deadline moves
/// earlier), at times around its batch round, with every extension answered 50 ms late so that the two
/// overlap — hands the lease back to the renewer, which plans afresh and keeps renewing it.
#[test]
fn a_batched_lease_extended_by_hand_keeps_being_renewed() {
    for at in [ms(5_000), ms(9_960), ms(9_990), ms(10_000), ms(10_020)] {
        let starts = std::sync::Arc::new(RoundStarts::default());
        let (mut c, held) = hold_spread(3, &starts);
        let acquired = c.now() - ms(3);
        c.sim.run_for(at - ms(60));
        c.faults[0].script(
            redlease_testkit::Op::Extend,
            (0..6).map(|_| redlease_testkit::Fault::SlowReply(ms(50))),
        );
        c.sim.run_for(ms(60));
        c.sim.block_on(held[0].extend(secs(12))).unwrap();
        c.sim.run_for(secs(60));
        for (i, lease) in held.iter().enumerate() {
            assert_eq!(lease.state(), LeaseState::Held, "at {at:?}: job:{i}");
            assert!(
                lease.valid_until() > c.now() + secs(15),
                "at {at:?}: job:{i} valid for {:?}",
                lease.valid_until() - c.now()
            );
        }
        let starts = starts.0.lock().unwrap();
        let last = starts["job:0"].last().copied().unwrap();
        assert!(
            last > acquired + at + secs(50),
            "at {at:?}: job:0 last renewed {:?} after its acquisition",
            last - acquired
        );
    }
}

/// `Lease::run` of a lease without background renewal renews it through the manager's renewer too, in
/// batches; when `run` returns the renewer lets go of it.
#[test]
fn leases_renewed_by_run_share_batches_and_are_let_go_when_run_returns() {
    use redlease::Timer;
    let mut c = Cluster::with_spawner(1, 40, config().with_renewal_batching(ms(5), 100));
    let done = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    for i in 0..2 {
        let lease = c.try_acquire(&c.manager.lock(format!("job:{i}"))).unwrap();
        let (clock, done) = (c.clock.clone(), std::sync::Arc::clone(&done));
        c.sim.spawn(async move {
            let work = clock.sleep_until(clock.now() + secs(65));
            let ok = lease.run(work).await.is_ok();
            done.lock().unwrap().push((ok, lease));
        });
    }
    c.sim.run_for(secs(66));
    let done = std::mem::take(&mut *done.lock().unwrap());
    assert!(done.len() == 2 && done.iter().all(|(ok, _)| *ok));
    // Default 30 s TTL, renewed every 10 s: 6 waves, one call each for both leases.
    let calls = c.faults[0].calls(redlease_testkit::Op::Extend);
    assert_eq!(calls, 6, "{calls} extension calls");
    c.sim.run_for(secs(40));
    assert_eq!(
        c.faults[0].calls(redlease_testkit::Op::Extend),
        6,
        "renewed after run returned"
    );
    assert!(
        done.iter().all(|(_, l)| l.state() != LeaseState::Held),
        "expired once nothing renews them"
    );
}

/// A spawner that drops (without running) as many of the next tasks as `drops` says.
fn dropping_spawner(
    sim: &redlease_testkit::Sim,
    drops: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> impl redlease::Spawn + 'static {
    use std::sync::atomic::Ordering::SeqCst;
    let (inner, drops) = (sim.spawner(), std::sync::Arc::clone(drops));
    move |task: redlease::Task| {
        if drops
            .fetch_update(SeqCst, SeqCst, |d| d.checked_sub(1))
            .is_err()
        {
            redlease::Spawn::spawn(&inner, task);
        }
    }
}

/// A batch or the renewer itself dropped by the spawner (a runtime shutting down, a spawner that sheds
/// tasks) leaves no lease stuck: a dropped batch gives its leases their extension permits back and queues
/// them again (manual extensions do not hang, the next batch renews them), and a dropped renewer lets the
/// next queued lease start another.
#[test]
fn a_batch_or_renewer_dropped_by_the_spawner_leaves_no_lease_stuck() {
    use redlease::Timer;
    use std::sync::atomic::Ordering::SeqCst;
    let mut sim = redlease_testkit::Sim::new(43);
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    let drops = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let manager =
        redlease::LockManager::single(node.clone(), config().with_renewal_batching(ms(5), 100))
            .unwrap()
            .with_timer(clock.clone())
            .with_spawner(dropping_spawner(&sim, &drops));
    let acquire = |sim: &mut redlease_testkit::Sim, key: &str| {
        let lock = manager.lock(key).auto_renew(secs(10));
        sim.block_on(async move { lock.try_acquire().await })
            .unwrap()
    };
    // The renewer's first driver is dropped: the next lease queued starts another.
    drops.store(1, SeqCst);
    let a = acquire(&mut sim, "a");
    assert_eq!(drops.load(SeqCst), 0, "the driver was spawned and dropped");
    let b = acquire(&mut sim, "b");
    // The first wave's batch is dropped: its leases are queued again and renewed by the next.
    sim.run_for(secs(10) - ms(10));
    drops.store(1, SeqCst);
    sim.run_for(ms(20));
    assert_eq!(drops.load(SeqCst), 0, "the batch was spawned and dropped");
    // Not stuck holding the extension permit: a manual extension goes through at once.
    let extended = sim.block_on_for_polls(a.extend(secs(30)), 100);
    assert!(matches!(extended, Some(Ok(()))), "{extended:?}");
    sim.run_for(secs(60));
    for lease in [&a, &b] {
        assert_eq!(lease.state(), LeaseState::Held);
        assert!(lease.valid_until() > clock.now() + secs(15));
    }
}

/// Issue 21: a batched round ends for each lease at its own deadline. A long lease (operation timeout 500 ms)
/// batched with a short job lease (200 ms) against a node that answers in 300 ms stays held, as it does when
/// renewed alone; the short lease's round times out at its own 200 ms.
#[test]
fn a_short_lease_in_a_batch_does_not_cut_a_long_leases_round() {
    let cfg = config().with_renewal_batching(ms(5), 100);
    let mut c = Cluster::with_spawner(1, 41, cfg);
    let long = c
        .try_acquire(&c.manager.lock("long").expiry(secs(30)).auto_renew(secs(2)))
        .unwrap();
    let short = c
        .try_acquire(&c.manager.lock("short").expiry(secs(1)).auto_renew(ms(500)))
        .unwrap();
    let start = c.now();
    c.sim.run_for(ms(1_900));
    assert_eq!(short.state(), LeaseState::Held);
    let calls = c.faults[0].calls(Op::Extend);
    // The wave at 2 s renews both leases in one call, answered after 300 ms.
    c.faults[0].script(Op::Extend, [redlease_testkit::Fault::SlowReply(ms(300))]);
    c.sim.run_for(ms(450));
    assert_eq!(
        c.faults[0].calls(Op::Extend),
        calls + 1,
        "one batched call at 2 s ({:?} in)",
        c.now() - start
    );
    assert_eq!(
        long.state(),
        LeaseState::Held,
        "the long lease's round was cut at the short lease's deadline"
    );
    assert!(
        long.valid_until() > start + secs(31),
        "{:?}",
        long.remaining()
    );
    assert_eq!(
        short.state(),
        LeaseState::AtRisk,
        "the short lease's round timed out at its own deadline"
    );
}
