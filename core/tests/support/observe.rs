//! Shared by the `tracing` and `metrics` feature tests: one node on virtual time and the scenario.
#![allow(dead_code)]

use std::time::Duration;

use redlease::{Config, Lease, LockManager, NodeErrorKind, Timer};
use redlease_testkit::{Fault, Faults, FaultyNode, MemoryNode, Op, Sim, VirtualClock};

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One node on virtual time, with a spawner.
pub(crate) struct World {
    pub(crate) sim: Sim,
    pub(crate) clock: VirtualClock,
    pub(crate) node: MemoryNode,
    pub(crate) faults: Faults,
    pub(crate) manager: LockManager,
}

pub(crate) fn world(seed: u64) -> World {
    world_with(seed, |c| c)
}

/// [`world`] with the manager's configuration adjusted by `config`.
pub(crate) fn world_with(seed: u64, config: impl FnOnce(Config) -> Config) -> World {
    let sim = Sim::new(seed);
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    let (faulty, faults) = FaultyNode::new(node.clone(), clock.clone());
    let config = config(
        Config::default()
            .with_jitter_seed(seed)
            .with_expiry(Duration::from_secs(30))
            .with_retry_delay(ms(50)),
    );
    let manager = LockManager::single(faulty, config)
        .unwrap()
        .with_timer(clock.clone())
        .with_spawner(sim.spawner());
    World {
        sim,
        clock,
        node,
        faults,
        manager,
    }
}

/// The scenario: a contended acquisition of `report` (its holder leaves after 120 ms), then a self-renewing
/// lease on `job` whose first renewal fails (at risk, recovered on the retry) and which is lost when someone
/// deletes its key. Returns the raw token value of the `job` lease, read from the node.
pub(crate) fn scenario(w: &mut World, manager: &LockManager) -> String {
    let report = manager.lock("report");
    let holder = {
        let report = report.clone();
        w.sim
            .block_on(async move { report.try_acquire().await })
            .unwrap()
    };
    let clock = w.clock.clone();
    w.sim.spawn(async move {
        clock.sleep_until(clock.now() + ms(120)).await;
        holder.release().await.unwrap();
    });
    let waiter = w
        .sim
        .block_on(async move { report.acquire_within(Duration::from_secs(2)).await })
        .unwrap();
    w.sim
        .block_on(async move { waiter.release().await })
        .unwrap();

    w.faults
        .script(Op::Extend, [Fault::Fail(NodeErrorKind::Connection)]);
    let job = manager.lock("job").auto_renew(Duration::from_secs(10));
    let lease: Lease = w
        .sim
        .block_on(async move { job.try_acquire().await })
        .unwrap();
    let token = String::from_utf8(w.node.get("job").unwrap()).unwrap();
    assert_eq!(token, lease.token().as_str());
    w.sim.run_for(Duration::from_secs(11));
    assert_eq!(lease.state(), redlease::LeaseState::Held);
    w.node.del("job");
    w.sim.run_for(Duration::from_secs(11));
    assert!(!lease.is_held());
    drop(lease);
    w.sim.run_for(Duration::from_secs(1));
    token
}
