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
    assert!(err.to_string().contains("restarted"), "{err}");
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
