//! Restarted nodes: a Redlock node restarted without persistence forgets the locks it held. The restart
//! quarantine keeps it out of quorums for one lock TTL; without it, the history checker finds two holders.

use std::time::Duration;

use redlease::{Config, EventKind, LeaseEvent, NodeErrorKind, NotAcquiredReason, Observer};
use redlease_testkit::{History, Violation};

use crate::support::*;

/// Collects the indices of the nodes reported restarted.
#[derive(Default, Clone)]
struct Restarts(std::sync::Arc<std::sync::Mutex<Vec<(usize, Duration)>>>);

impl Observer for Restarts {
    fn event(&self, event: &LeaseEvent<'_>) {
        if let EventKind::NodeRestarted {
            node,
            quarantined_for,
            ..
        } = event.kind
        {
            self.0.lock().unwrap().push((node, quarantined_for));
        }
    }
}

const EXPIRY: Duration = Duration::from_secs(10);

/// Client 1 holds the lock (10 s TTL, no renewal: it believes it holds it until its deadline); client 2
/// tries, is refused, and a majority of the nodes (0 and 1) is then restarted without persistence — an
/// immediate restart, as a crash-looping container or a process supervisor does. Client 2 tries again right
/// after. Returns the history, client 2's second result and the restarts it saw.
fn restart_majority_while_held(
    config: Config,
) -> (
    History,
    Result<redlease::Lease, redlease::Error>,
    Restarts,
    Cluster,
) {
    let mut c = Cluster::new(3, 7, config.with_expiry(EXPIRY));
    let history = History::new();
    let restarts = Restarts::default();
    let one = c.manager.clone().with_observer(history.recorder(1));
    let two = c
        .manager
        .clone()
        .with_observer((history.recorder(2), restarts.clone()));
    let held = c
        .try_acquire(&one.lock("orders"))
        .expect("client 1 acquires");
    let refused = c.try_acquire(&two.lock("orders")).unwrap_err();
    assert!(refused.is_contended(), "{refused}");
    c.sim.run_for(secs(1));
    c.nodes[0].restart();
    c.nodes[1].restart();
    let second = c.try_acquire(&two.lock("orders"));
    // Client 1 still believes it holds the lock: its deadline has not passed.
    assert!(
        held.is_held(),
        "client 1 still holds until {:?}",
        held.valid_until()
    );
    std::mem::forget(held);
    (history, second, restarts, c)
}

#[test]
fn without_quarantine_a_restarted_majority_lets_two_clients_hold_and_the_checker_names_them() {
    let (history, second, restarts, _c) =
        restart_majority_while_held(config().with_restart_quarantine(None));
    let lease = second.expect("without quarantine the restarted majority grants the lock again");
    assert!(lease.is_held());
    match history.check() {
        Err(Violation::Overlap {
            lock,
            first,
            second,
        }) => {
            assert_eq!(lock, "orders");
            assert_eq!((first.0, second.0), (1, 2), "the two holders are named");
        }
        other => panic!("the checker must flag two holders, got {other:?}"),
    }
    assert!(
        restarts.0.lock().unwrap().is_empty(),
        "no run_id tracking without quarantine"
    );
    std::mem::forget(lease);
}

#[test]
fn with_quarantine_restarted_nodes_are_not_counted_and_the_checker_finds_nothing() {
    let (history, second, restarts, mut c) = restart_majority_while_held(config());
    let err = second.expect_err("the restarted majority must not grant the lock");
    match &err {
        redlease::Error::NotAcquired {
            reason: NotAcquiredReason::TooFewNodes,
            last_error: Some(q),
            ..
        } => {
            let kinds: Vec<(usize, NodeErrorKind)> =
                q.errors.iter().map(|(i, e)| (*i, e.kind())).collect();
            assert_eq!(
                kinds,
                vec![(0, NodeErrorKind::Restarted), (1, NodeErrorKind::Restarted)]
            );
        }
        other => panic!("expected too few nodes because of the quarantine, got {other}"),
    }
    assert!(crate::support::chain(&err).contains("restarted"), "{err}");
    // The quarantined nodes' writes were cleaned up: nothing of client 2's is left behind.
    assert!(c.nodes[0].keys().is_empty() && c.nodes[1].keys().is_empty());
    let seen: Vec<usize> = restarts.0.lock().unwrap().iter().map(|r| r.0).collect();
    assert_eq!(seen, vec![0, 1], "both restarts are reported");
    assert!(restarts.0.lock().unwrap().iter().all(|(_, q)| *q == EXPIRY));
    assert_eq!(history.check(), Ok(()));

    // After one lock TTL the quarantine ends (and client 1's lease has expired): client 2 gets the lock.
    c.sim.run_for(EXPIRY);
    let two = c.manager.clone().with_observer(history.recorder(2));
    let lease = c
        .try_acquire(&two.lock("orders"))
        .expect("acquired after the quarantine");
    assert!(lease.is_held());
    assert_eq!(history.check(), Ok(()));
    std::mem::forget(lease);
}

#[test]
fn a_quarantined_minority_does_not_block_a_healthy_majority() {
    let mut c = Cluster::new(3, 9, config().with_expiry(EXPIRY));
    let lease = c.try_acquire(&c.manager.lock("a")).unwrap();
    c.sim
        .block_on(async move { lease.release().await.map(|_| ()) })
        .unwrap();
    c.nodes[2].restart();
    let lease = c
        .try_acquire(&c.manager.lock("a"))
        .expect("nodes 0 and 1 suffice");
    assert_eq!(c.holders("a", lease.token().as_str()), vec![0, 1, 2]);
    std::mem::forget(lease);
}

/// Faults injected into `run_id` (`Op::RunId`): a lookup that never answers on one of three nodes is bounded
/// by the operation timeout and that node's yes is not counted (the other two suffice); lookups that fail on
/// two of three make the attempt fail (a yes whose restart could not be ruled out is not a vote), and the
/// clean-up leaves nothing behind. The history checker finds nothing either way.
#[test]
fn run_id_lookups_that_hang_or_fail_are_bounded_and_never_counted_as_votes() {
    use redlease_testkit::{Fault, Op};
    let mut c = Cluster::new(3, 11, config().with_expiry(EXPIRY));
    let history = History::new();
    let one = c.manager.clone().with_observer(history.recorder(1));
    let two = c.manager.clone().with_observer(history.recorder(2));
    c.faults[0].script(Op::RunId, [Fault::Hang]);
    let started = c.now();
    let lease = c
        .try_acquire(&one.lock("orders"))
        .expect("nodes 1 and 2 suffice");
    let bound = config().operation_timeout_for(EXPIRY);
    assert!(
        c.now() - started <= bound + ms(10),
        "bounded by the operation timeout"
    );
    assert_eq!(c.faults[0].calls(Op::RunId), 1);
    assert!(
        c.try_acquire(&two.lock("orders"))
            .unwrap_err()
            .is_contended(),
        "held"
    );
    let token = lease.token().as_str().to_owned();
    c.sim
        .block_on(async move { lease.release().await.map(|_| ()) })
        .unwrap();
    assert!(
        c.holders("orders", &token).is_empty(),
        "released everywhere"
    );

    for i in [0, 1] {
        c.faults[i].script(Op::RunId, [Fault::Fail(NodeErrorKind::Connection)]);
    }
    let err = c.try_acquire(&one.lock("orders")).unwrap_err();
    match &err {
        redlease::Error::NotAcquired {
            reason: NotAcquiredReason::TooFewNodes,
            last_error: Some(q),
            ..
        } => {
            let failed: Vec<usize> = q.errors.iter().map(|(i, _)| *i).collect();
            assert_eq!(failed, vec![0, 1], "{err}");
            assert!(q.errors.iter().all(|(_, e)| e.is_ambiguous()), "{err}");
            assert!(
                crate::support::chain(&err).contains("run_id could not be read"),
                "{err}"
            );
        }
        other => panic!("expected too few nodes, got {other}"),
    }
    assert!(
        c.nodes.iter().all(|n| n.keys().is_empty()),
        "the clean-up deleted the uncounted writes"
    );
    let lease = c
        .try_acquire(&two.lock("orders"))
        .expect("nothing left behind");
    assert_eq!(history.check(), Ok(()));
    std::mem::forget(lease);
}

/// A run id that cannot be read rules a node's yes out only where a yes is a Redlock vote: in single mode
/// (observed, so it is asked) the acquisition stands and the lookup's failure changes nothing; on Redlock a
/// node that answered "held" stays a definite no (the attempt is contention, not a failure of nodes).
#[test]
fn a_failed_run_id_lookup_spoils_only_a_redlock_yes() {
    use redlease_testkit::{Fault, Op};
    let mut c = Cluster::new(1, 19, config().with_expiry(EXPIRY));
    let observed = c.manager.clone().with_observer(Restarts::default());
    c.faults[0].script(Op::RunId, [Fault::Fail(NodeErrorKind::Connection)]);
    let lease = c
        .try_acquire(&observed.lock("single"))
        .expect("single mode: a lookup that failed is only not reported");
    assert_eq!(c.faults[0].calls(Op::RunId), 1, "asked (observed)");
    std::mem::forget(lease);

    let mut c = Cluster::new(3, 19, config().with_expiry(EXPIRY));
    for node in &c.nodes {
        node.set("held", b"someone-else", Some(EXPIRY));
    }
    for f in &c.faults {
        f.script(Op::RunId, [Fault::Fail(NodeErrorKind::Connection)]);
    }
    let err = c.try_acquire(&c.manager.lock("held")).unwrap_err();
    assert!(err.is_contended(), "held everywhere: contention, got {err}");
}

/// `Fault::RunId` reports a changed server without restarting the in-memory node (which keeps its keys):
/// the core quarantines the node, emits `NodeRestarted`, and does not count its yes; a changed minority
/// does not block the healthy majority.
#[test]
fn an_injected_run_id_change_quarantines_the_node_and_is_reported() {
    use redlease_testkit::{Fault, Op};
    let mut c = Cluster::new(3, 13, config().with_expiry(EXPIRY));
    let restarts = Restarts::default();
    let manager = c.manager.clone().with_observer(restarts.clone());
    let lease = c.try_acquire(&manager.lock("a")).unwrap();
    c.sim
        .block_on(async move { lease.release().await.map(|_| ()) })
        .unwrap();
    for i in [0, 1] {
        c.faults[i].always(
            Op::RunId,
            Fault::RunId(redlease::RunId::new(format!("other-{i}"))),
        );
    }
    let err = c.try_acquire(&manager.lock("a")).unwrap_err();
    match &err {
        redlease::Error::NotAcquired {
            last_error: Some(q),
            ..
        } => {
            let kinds: Vec<(usize, NodeErrorKind)> =
                q.errors.iter().map(|(i, e)| (*i, e.kind())).collect();
            assert_eq!(
                kinds,
                vec![(0, NodeErrorKind::Restarted), (1, NodeErrorKind::Restarted)]
            );
        }
        other => panic!("expected the quarantine to refuse, got {other}"),
    }
    let seen: Vec<usize> = restarts.0.lock().unwrap().iter().map(|r| r.0).collect();
    assert_eq!(seen, vec![0, 1], "one event per changed node");
    assert!(c.nodes.iter().all(|n| n.keys().is_empty()), "cleaned up");
    // After the quarantine (node 1 keeps its new id), one more change on node 0 only: nodes 1 and 2 carry
    // the quorum.
    c.sim.run_for(EXPIRY);
    c.faults[0].always(Op::RunId, Fault::RunId(redlease::RunId::new("third")));
    let lease = c
        .try_acquire(&manager.lock("a"))
        .expect("nodes 1 and 2 suffice");
    assert_eq!(
        restarts.0.lock().unwrap().len(),
        3,
        "node 0's second change"
    );
    std::mem::forget(lease);
}

/// The run id is asked after each acquisition reply where it can matter: always on Redlock (the restart
/// quarantine), in single mode only when somebody listens for the `NodeRestarted` event it would raise
/// (an observer, or with the `tracing` feature a subscriber: this binary sets none, so the feature alone
/// listens to nothing).
#[test]
fn run_id_is_asked_on_redlock_always_and_in_single_mode_only_when_observed() {
    use redlease_testkit::Op;
    for (n, observed, expected) in [(1, false, 0), (1, true, 1), (3, false, 1), (3, true, 1)] {
        let mut c = Cluster::new(n, 17, config().with_expiry(EXPIRY));
        let manager = if observed {
            c.manager.clone().with_observer(Restarts::default())
        } else {
            c.manager.clone()
        };
        let lease = c.try_acquire(&manager.lock("a")).unwrap();
        std::mem::forget(lease);
        for f in &c.faults {
            assert_eq!(
                f.calls(Op::RunId),
                expected,
                "{n} nodes, observed {observed}"
            );
        }
    }
}

/// Found by the hostile fault mix (`history::restarts_alone_never_overlap`, seed 4): two managers derived
/// from one with `with_timer` on clocks that disagree (60 s apart here; the hostile clients' clocks are up to
/// 10 s apart) shared one record of the nodes' run ids, with the quarantine's end as an instant of
/// whichever timer saw the restart. The manager behind saw the restart of two nodes and quarantined them
/// until an instant its clock reaches in 10 s — which the other manager's clock had passed long ago: that
/// one counted the restarted majority and took the lock its own client still held.
#[test]
fn managers_on_different_timers_do_not_share_a_quarantine_deadline() {
    use redlease_testkit::SkewedClock;
    let mut c = Cluster::new(3, 19, config().with_expiry(EXPIRY));
    let history = History::new();
    let holder = c.manager.clone().with_observer(history.recorder(1));
    let behind = c
        .manager
        .clone()
        .with_timer(SkewedClock::new(c.clock.clone(), 0.0).behind(secs(60)))
        .with_observer(history.recorder(2));
    let ahead = c.manager.clone().with_observer(history.recorder(3));
    let lease = c
        .try_acquire(&holder.lock("orders"))
        .expect("client 1 acquires");
    // Client 2 meets the nodes before the restart (contended), so it can tell that they restarted.
    let refused = c.try_acquire(&behind.lock("orders")).unwrap_err();
    assert!(refused.is_contended(), "{refused}");
    c.sim.run_for(secs(1));
    c.nodes[0].restart();
    c.nodes[1].restart();
    let err = c.try_acquire(&behind.lock("orders")).unwrap_err();
    assert!(
        matches!(
            err,
            redlease::Error::NotAcquired {
                reason: NotAcquiredReason::TooFewNodes,
                ..
            }
        ),
        "the restarted majority is quarantined for the manager that saw the restart: {err}"
    );
    let second = c.try_acquire(&ahead.lock("orders"));
    assert!(
        lease.is_held(),
        "client 1 still holds until {:?}",
        lease.valid_until()
    );
    assert_eq!(history.check(), Ok(()));
    assert!(
        second.is_err(),
        "the restarted majority granted the lock again while client 1 holds it"
    );
    std::mem::forget(lease);
    std::mem::forget(second);
}

/// Counts `run_id` calls and forwards everything else as `NodeWrapper` does by default (the claim with its
/// run id slot included).
struct CountsRunIds {
    inner: Box<dyn redlease::RedisNode>,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

#[redlease::async_trait]
impl redlease::NodeWrapper for CountsRunIds {
    type Inner = Box<dyn redlease::RedisNode>;

    fn inner(&self) -> &Self::Inner {
        &self.inner
    }

    async fn run_id(&self, key: &str) -> Result<redlease::RunId, redlease::NodeError> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.run_id(key).await
    }
}

/// A node that never reports a run id with its claim (it drops the request's slot, as a node written
/// before the slot existed does).
struct ReportsNoRunId(redlease_testkit::MemoryNode);

#[redlease::async_trait]
impl redlease::NodeWrapper for ReportsNoRunId {
    type Inner = redlease_testkit::MemoryNode;

    fn inner(&self) -> &Self::Inner {
        &self.0
    }

    async fn claim(
        &self,
        mut req: redlease::ClaimRequest<'_>,
    ) -> Result<redlease::Claim, redlease::NodeError> {
        req.run_id = None;
        redlease::RedisNode::claim(&self.0, req).await
    }
}

/// A node that reports its server's run id with the claim (the memory node fills the request's slot) is
/// not asked `run_id` after the reply, and that report alone quarantines a restarted majority; a node that
/// leaves the slot empty is asked `run_id`, as before, with the same verdicts.
#[test]
fn a_run_id_reported_with_the_claim_replaces_the_run_id_call() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    for reports in [true, false] {
        let mut sim = redlease_testkit::Sim::new(23);
        let clock = sim.clock();
        let calls = Arc::new(AtomicUsize::new(0));
        let servers: Vec<_> = (0..3)
            .map(|_| redlease_testkit::MemoryNode::with_timer(clock.clone()))
            .collect();
        let nodes = servers.iter().map(|s| {
            let inner: Box<dyn redlease::RedisNode> = if reports {
                Box::new(s.clone())
            } else {
                Box::new(ReportsNoRunId(s.clone()))
            };
            CountsRunIds {
                inner,
                calls: calls.clone(),
            }
        });
        let restarts = Restarts::default();
        let manager = redlease::LockManager::redlock(nodes, config().with_expiry(EXPIRY))
            .unwrap()
            .with_timer(clock.clone())
            .with_observer(restarts.clone());
        let lock = manager.lock("a");
        let lease = sim
            .block_on(async move { lock.try_acquire().await })
            .expect("acquired");
        std::mem::forget(lease);
        let expected = if reports { 0 } else { 3 };
        assert_eq!(
            calls.load(Ordering::Relaxed),
            expected,
            "run_id calls after one acquisition, reports {reports}"
        );
        // A restarted majority is seen either way, and quarantined.
        sim.run_for(secs(1));
        servers[0].restart();
        servers[1].restart();
        let lock = manager.lock("b");
        let err = sim
            .block_on(async move { lock.try_acquire().await })
            .expect_err("the restarted majority is quarantined");
        assert!(
            matches!(
                err,
                redlease::Error::NotAcquired {
                    reason: NotAcquiredReason::TooFewNodes,
                    ..
                }
            ),
            "reports {reports}: {err}"
        );
        let seen: Vec<usize> = restarts.0.lock().unwrap().iter().map(|r| r.0).collect();
        assert_eq!(seen, vec![0, 1], "reports {reports}");
        assert_eq!(calls.load(Ordering::Relaxed), 2 * expected);
    }
}
