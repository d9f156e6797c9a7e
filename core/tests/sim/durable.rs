//! The durability policy and fence regression detection, on in-memory nodes (the real-server tests are in
//! the adapters' live suite).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlease::{
    ConfigError, Durability, EventKind, LeaseEvent, LockManager, NodeErrorKind, NotAcquiredReason,
    Observer, ReplicaWait,
};

use crate::support::*;

#[derive(Default, Clone)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Observer for Seen {
    fn event(&self, event: &LeaseEvent<'_>) {
        let line = match &event.kind {
            EventKind::NotReplicated {
                acknowledged,
                wanted,
                error,
                ..
            } => format!(
                "not_replicated {acknowledged:?}/{wanted} {:?}",
                error.map(|e| e.kind())
            ),
            EventKind::FenceRegressed {
                fence, previous, ..
            } => {
                format!("fence_regressed {fence} <= {previous}")
            }
            EventKind::NodeRestarted { node, .. } => format!("restarted {node}"),
            EventKind::AtRisk { .. } => "at_risk".into(),
            _ => return,
        };
        self.0.lock().unwrap().push(line);
    }
}

fn wait() -> ReplicaWait {
    ReplicaWait::new(1, ms(100))
}

fn single(durability: Durability, replicas: Option<u32>) -> (Cluster, Seen) {
    let mut c = Cluster::new(1, 3, config().with_durability(durability));
    c.nodes[0].set_replicas(replicas);
    let seen = Seen::default();
    c.manager = c.manager.clone().with_observer(seen.clone());
    (c, seen)
}

#[test]
fn required_durability_without_acknowledgement_fails_clearly_and_releases_the_key() {
    let (mut c, seen) = single(Durability::Required(wait()), Some(0));
    let lock = c.manager.lock("jobs").fenced("jobs:fence");
    let err = c.try_acquire(&lock).expect_err("no replica acknowledged");
    assert!(
        matches!(
            &err,
            redlease::Error::NotAcquired {
                reason: NotAcquiredReason::NotReplicated,
                ..
            }
        ),
        "{err:?}"
    );
    let text = crate::support::chain(&err);
    assert!(text.contains("0 of 1 required replica"), "{text}");
    assert!(c.nodes[0].get("jobs").is_none(), "the key was released");
    assert_eq!(
        seen.0.lock().unwrap().as_slice(),
        ["not_replicated Some(0)/1 None"]
    );
    // With a replica acknowledging, the same lock is acquired.
    c.nodes[0].set_replicas(Some(1));
    let lease = c.try_acquire(&lock).unwrap();
    assert!(lease.fencing_token().is_some());
    std::mem::forget(lease);
}

#[test]
fn required_durability_on_a_node_that_cannot_wait_fails_with_the_cause() {
    let (mut c, _seen) = single(Durability::Required(wait()), None);
    let err = c.try_acquire(&c.manager.lock("jobs")).unwrap_err();
    let text = crate::support::chain(&err);
    assert!(
        text.contains("waiting for replicas failed") && text.contains("unsupported"),
        "{text}"
    );
    assert!(c.nodes[0].get("jobs").is_none());
}

#[test]
fn best_effort_durability_reports_the_shortfall_and_keeps_the_lease() {
    let (mut c, seen) = single(Durability::BestEffort(wait()), Some(0));
    let lease = c.try_acquire(&c.manager.lock("jobs")).unwrap();
    assert!(lease.is_held());
    assert_eq!(
        seen.0.lock().unwrap().as_slice(),
        ["not_replicated Some(0)/1 None"]
    );
    std::mem::forget(lease);
}

#[test]
fn an_unacknowledged_extension_under_required_durability_is_a_failed_extension() {
    let (mut c, seen) = single(Durability::Required(wait()), Some(1));
    let lease = c.try_acquire(&c.manager.lock("jobs")).unwrap();
    c.nodes[0].set_replicas(Some(0));
    let err = c
        .sim
        .block_on(async { lease.extend(Duration::from_secs(30)).await })
        .expect_err("not acknowledged");
    match &err {
        redlease::Error::Quorum(q) => {
            assert_eq!(q.errors[0].1.kind(), NodeErrorKind::NotReplicated)
        }
        other => panic!("expected a failed extension, got {other:?}"),
    }
    // At risk, still held until its deadline, and an acknowledged retry recovers it.
    assert!(lease.is_held());
    assert_eq!(
        seen.0.lock().unwrap().as_slice(),
        ["not_replicated Some(0)/1 None", "at_risk"]
    );
    c.nodes[0].set_replicas(Some(1));
    c.sim
        .block_on(async { lease.extend(Duration::from_secs(30)).await })
        .unwrap();
    std::mem::forget(lease);
}

#[test]
fn durability_settings_that_cannot_work_are_refused_before_anything_is_sent() {
    let bad = [
        config().with_durability(Durability::Required(ReplicaWait::new(0, ms(100)))),
        config().with_durability(Durability::BestEffort(ReplicaWait::new(1, Duration::ZERO))),
        config()
            .with_expiry(Duration::from_secs(1))
            .with_durability(Durability::Required(ReplicaWait::new(1, ms(900)))),
    ];
    for config in bad {
        assert!(
            LockManager::single(redlease_testkit::MemoryNode::new(), config.clone()).is_err(),
            "{config:?}"
        );
    }
    let nodes: Vec<_> = (0..3)
        .map(|_| redlease_testkit::MemoryNode::new())
        .collect();
    assert!(matches!(
        LockManager::redlock(
            nodes,
            config().with_durability(Durability::Required(wait()))
        ),
        Err(ConfigError::Durability(_))
    ));
}

#[test]
fn a_fence_counter_that_went_backwards_is_detected_reported_and_refused() {
    let (mut c, seen) = single(Durability::Off, None);
    let lock = c.manager.lock("jobs").fenced("jobs:fence");
    for _ in 0..3 {
        let lease = c.try_acquire(&lock).unwrap();
        c.sim
            .block_on(async move { lease.release().await.map(|_| ()) })
            .unwrap();
    }
    // A restart without persistence: the counter starts again at 1.
    c.nodes[0].restart();
    let err = c
        .try_acquire(&lock)
        .expect_err("a regressed fence is not handed out");
    match &err {
        redlease::Error::NotAcquired {
            reason: NotAcquiredReason::Refused,
            last_error: Some(q),
            ..
        } => assert_eq!(q.errors[0].1.kind(), NodeErrorKind::FenceRegressed),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(crate::support::chain(&err).contains("raise_fence"), "{err}");
    assert!(c.nodes[0].get("jobs").is_none(), "the lock was released");
    let events = seen.0.lock().unwrap().clone();
    assert!(events.contains(&"restarted 0".to_string()), "{events:?}");
    assert!(
        events.contains(&"fence_regressed 1 <= 3".to_string()),
        "{events:?}"
    );
    // The documented remedy: raise the counter, then acquire.
    let manager = c.manager.clone();
    c.sim
        .block_on(async move { manager.raise_fence("jobs:fence", 3).await })
        .unwrap();
    let lease = c.try_acquire(&lock).unwrap();
    assert_eq!(lease.fencing_token(), Some(4));
    std::mem::forget(lease);
}

/// Injected through the fault wrapper (`Op::WaitReplicas`), so a user can test their handling without real
/// replicas: a wait that never answers under the required policy fails the acquisition within the round's
/// bound (operation timeout plus the wait's own timeout) and the clean-up releases the key; the history
/// checker finds nothing, and the lock is free for the next client at once.
#[test]
fn a_replica_wait_that_never_answers_fails_the_required_acquisition_in_bounded_time_and_releases_the_key()
 {
    let (mut c, _seen) = single(Durability::Required(wait()), Some(1));
    let history = redlease_testkit::History::new();
    let one = c.manager.clone().with_observer(history.recorder(1));
    let two = c.manager.clone().with_observer(history.recorder(2));
    c.faults[0].script(
        redlease_testkit::Op::WaitReplicas,
        [redlease_testkit::Fault::Hang],
    );
    let started = c.now();
    let err = c.try_acquire(&one.lock("jobs")).unwrap_err();
    let took = c.now() - started;
    let bound = config().operation_timeout_for(config().expiry()) + wait().timeout;
    assert!(took <= bound + ms(10), "took {took:?}, bound {bound:?}");
    assert!(
        took >= wait().timeout,
        "it waited for the wait's answer: {took:?}"
    );
    assert!(
        matches!(err, redlease::Error::NotAcquired { .. }),
        "{err:?}"
    );
    assert_eq!(
        c.faults[0].calls(redlease_testkit::Op::WaitReplicas),
        1,
        "one wait, no retry within the attempt"
    );
    assert!(c.nodes[0].get("jobs").is_none(), "the key was released");
    let lease = c.try_acquire(&two.lock("jobs")).expect("the lock is free");
    assert_eq!(history.check(), Ok(()));
    std::mem::forget(lease);
}

/// `Fault::Acknowledged` injects a shortfall: the required policy refuses the lease after the wait's
/// timeout (as a server's `WAIT` answers), naming the count; best effort keeps it and reports it.
#[test]
fn an_injected_acknowledgement_shortfall_is_refused_under_required_and_reported_under_best_effort()
{
    use redlease_testkit::{Fault, Op};
    let (mut c, seen) = single(Durability::Required(ReplicaWait::new(2, ms(100))), Some(2));
    let history = redlease_testkit::History::new();
    let one = c
        .manager
        .clone()
        .with_observer((history.recorder(1), seen.clone()));
    c.faults[0].script(Op::WaitReplicas, [Fault::Acknowledged(1)]);
    let started = c.now();
    let err = c.try_acquire(&one.lock("jobs")).unwrap_err();
    assert!(
        c.now() - started >= ms(100),
        "a shortfall answers after the timeout"
    );
    let text = crate::support::chain(&err);
    assert!(text.contains("1 of 2 required replica"), "{text}");
    assert!(c.nodes[0].get("jobs").is_none(), "the key was released");
    assert_eq!(
        seen.0.lock().unwrap().as_slice(),
        ["not_replicated Some(1)/2 None"]
    );
    // The script ran out: the inner node's two acknowledgements count again.
    let lease = c.try_acquire(&one.lock("jobs")).unwrap();
    assert_eq!(history.check(), Ok(()));
    std::mem::forget(lease);

    let (mut c, seen) = single(Durability::BestEffort(wait()), Some(1));
    c.faults[0].always(Op::WaitReplicas, Fault::Acknowledged(0));
    let lease = c.try_acquire(&c.manager.lock("jobs")).unwrap();
    assert!(lease.is_held());
    assert_eq!(
        seen.0.lock().unwrap().as_slice(),
        ["not_replicated Some(0)/1 None"]
    );
    std::mem::forget(lease);
}
