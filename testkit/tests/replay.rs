//! A seed replays exactly: `Sim::single` seeds the manager's retry jitter from the simulation's seed, so
//! contended retries under random faults happen at the same virtual instants every run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use redlease::{Config, Timer};
use redlease_testkit::{EventKind, FaultyNode, History, MemoryNode, RandomFaults, Sim};

/// Everything a run decided, on the virtual clock relative to its start (runs start at different real
/// instants): who acquired when, until when, with which fence; every extension, loss and release; and how
/// many calls the node saw.
#[derive(Debug, PartialEq)]
struct Trace {
    events: Vec<(u64, Duration, String)>,
    calls: u64,
    ended: Duration,
}

fn run(seed: u64) -> Trace {
    let mut sim = Sim::new(seed);
    let clock = sim.clock();
    let t0 = clock.now();
    let (node, faults) = FaultyNode::with_spawner(
        MemoryNode::with_timer(clock.clone()),
        clock.clone(),
        sim.spawner(),
    );
    faults.random(RandomFaults::hostile(seed));
    let node = std::sync::Arc::new(node);
    let history = History::new();
    // Three clients, each its own manager on the one node, none with a `jitter_seed` of its own.
    for client in 0..3u64 {
        let config = Config::default()
            .with_expiry(Duration::from_secs(2))
            .with_retry_delay(Duration::from_millis(100))
            .with_attempts(10);
        let manager = sim
            .single(std::sync::Arc::clone(&node), config)
            .unwrap()
            .with_spawner(sim.client(client))
            .with_observer(history.recorder(client));
        let lock = manager
            .lock("nightly")
            .auto_renew(Duration::from_millis(500));
        let c = clock.clone();
        sim.client(client).spawn(async move {
            for _ in 0..4 {
                if let Ok(lease) = lock.acquire().await {
                    let work = c.sleep_until(c.now() + Duration::from_millis(700));
                    let _ = lease.run(work).await;
                    let _ = lease.release().await;
                }
            }
        });
    }
    assert!(
        sim.run_until_idle(Duration::from_secs(600)),
        "seed {seed}: stuck"
    );
    assert_eq!(history.check(), Ok(()), "seed {seed}");
    let rel = |t: Instant| t.saturating_duration_since(t0);
    let events = history
        .events()
        .into_iter()
        .map(|e| {
            let kind = match e.kind {
                EventKind::Acquired { valid_until, fence } => {
                    format!("acquired until {:?} fence {fence:?}", rel(valid_until))
                }
                EventKind::Extended { valid_until } => {
                    format!("extended until {:?}", rel(valid_until))
                }
                other => format!("{other:?}"),
            };
            (e.client, rel(e.at), kind)
        })
        .collect();
    Trace {
        events,
        calls: faults.total_calls(),
        ended: rel(clock.now()),
    }
}

#[test]
fn twenty_replays_of_one_seed_with_managers_from_the_sim_are_identical() {
    for seed in [3, 11] {
        let first = run(seed);
        // Contended: some acquisitions retried (at jittered instants), several leases taken.
        let acquired = first
            .events
            .iter()
            .filter(|e| e.2.starts_with("acquired"))
            .count();
        assert!(acquired >= 4, "seed {seed}: {acquired} acquisitions");
        for replay in 1..20 {
            assert_eq!(run(seed), first, "seed {seed}: replay {replay} differs");
        }
    }
}

#[test]
fn the_sim_gives_each_manager_its_own_seed_and_keeps_a_seed_the_config_has() {
    let sim = Sim::new(5);
    let a = sim.seeded(Config::default()).jitter_seed().unwrap();
    let b = sim.seeded(Config::default()).jitter_seed().unwrap();
    assert_ne!(a, b);
    assert_eq!(Sim::new(5).seeded(Config::default()).jitter_seed(), Some(a));
    assert_ne!(Sim::new(6).seeded(Config::default()).jitter_seed(), Some(a));
    assert_eq!(
        sim.seeded(Config::default().with_jitter_seed(42))
            .jitter_seed(),
        Some(42)
    );
}
