//! The start-up check (`LockManager::check`) on the simulator: each node's own answer, a hung node cut at
//! the check's bound, a partitioned one, a node without a check of its own (read instead), and nothing
//! written.

use std::sync::Arc;
use std::time::Duration;

use redlease::{
    CommandPaths, Config, Error, NodeErrorKind, NodeWrapper, Path, Readiness, RedisNode, Timer,
};
use redlease_testkit::{Fault, FaultyNode, MemoryNode, Op, Sim};

/// A node without a start-up check of its own (the trait's default answer).
struct NoCheck(MemoryNode);

#[redlease::async_trait]
impl NodeWrapper for NoCheck {
    type Inner = MemoryNode;

    fn inner(&self) -> &MemoryNode {
        &self.0
    }

    async fn readiness(&self, _key: &str) -> Readiness {
        Readiness::Unknown
    }
}

#[test]
fn the_start_up_check_reports_each_node_and_is_bounded_by_its_start_up_bound() {
    let mut sim = Sim::new(7);
    let clock = sim.clock();
    let memories: Vec<MemoryNode> = (0..5)
        .map(|_| MemoryNode::with_timer(clock.clone()))
        .collect();
    let faulty = |m: &MemoryNode| FaultyNode::new(m.clone(), clock.clone());
    let (ready, _) = faulty(&memories[0]);
    let (hung, hang) = faulty(&memories[1]);
    hang.always(Op::Inspect, Fault::Hang);
    let (cut, partition) = faulty(&memories[2]);
    partition.partition();
    let plain = NoCheck(memories[3].clone());
    let (refusing, refusal) = FaultyNode::new(NoCheck(memories[4].clone()), clock.clone());
    refusal.always(Op::Inspect, Fault::Fail(NodeErrorKind::Auth));
    let nodes: Vec<Arc<dyn RedisNode>> = vec![
        Arc::new(ready),
        Arc::new(hung),
        Arc::new(cut),
        Arc::new(plain),
        Arc::new(refusing),
    ];
    let config = Config::default().with_expiry(Duration::from_secs(5));
    let timeout = config
        .operation_timeout_for(config.expiry())
        .max(redlease::CHECK_TIMEOUT_FLOOR);
    let manager = sim.redlock(nodes.iter().map(Arc::clone), config).unwrap();

    let started = clock.now();
    let report = sim.block_on(manager.check("jobs:{nightly}:lock")).unwrap();
    let took = clock.now() - started;
    // The hung node is given up at the check's bound (the operation timeout, at least 2 s), not later.
    assert!(
        took >= timeout && took <= timeout + Duration::from_millis(5),
        "{took:?}"
    );

    let r: Vec<&Readiness> = report.nodes.iter().map(|n| &n.readiness).collect();
    // The memory node's own answer: the paths of a Redis 7 server.
    assert_eq!(
        r[0].paths(),
        Some(CommandPaths::scripts().with_acquire(Path::Native))
    );
    assert_eq!(
        (r[0].reachable(), r[0].authenticated(), r[0].permitted()),
        (Some(true), Some(true), Some(true))
    );
    assert!(
        matches!(r[1], Readiness::Unreachable(e) if e.kind() == NodeErrorKind::Timeout),
        "{}",
        r[1]
    );
    assert!(
        matches!(r[2], Readiness::Unreachable(e) if e.kind() == NodeErrorKind::Connection),
        "{}",
        r[2]
    );
    assert_eq!(r[2].reachable(), Some(false));
    // Without a check of its own the node is read: it answered, nothing more is known.
    assert!(matches!(r[3], Readiness::Answered), "{}", r[3]);
    assert_eq!((r[3].permitted(), r[3].paths()), (None, None));
    assert!(
        matches!(r[4], Readiness::Failed(e) if e.kind() == NodeErrorKind::Auth),
        "{}",
        r[4]
    );
    assert_eq!(report.quorum, 3);
    assert!(!report.quorum_ready() && !report.all_ready());
    let failed: Vec<usize> = report.failed().map(|n| n.index).collect();
    assert_eq!(failed, [1, 2, 4]);
    let text = report.to_string();
    assert_eq!(text.lines().count(), 5, "{text}");
    assert!(
        text.lines()
            .nth(2)
            .unwrap()
            .starts_with("node 2 (memory://")
            && text.contains("unreachable"),
        "{text}"
    );
    // The check wrote nothing anywhere.
    assert!(memories.iter().all(|m| m.keys().is_empty()));

    // Healed: three of five ready is a quorum.
    partition.heal();
    let report = sim.block_on(manager.check("jobs:{nightly}:lock")).unwrap();
    assert!(report.quorum_ready() && !report.all_ready(), "{report}");

    // A key the manager would refuse is refused here too, before anything is sent.
    let calls = refusal.calls(Op::Inspect);
    assert!(matches!(
        sim.block_on(manager.check("")),
        Err(Error::Config(_))
    ));
    assert_eq!(refusal.calls(Op::Inspect), calls);
}
