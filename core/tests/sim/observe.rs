//! The lease event hook: what an observer is told, in order, for contention, renewal failure and recovery,
//! releases with failing nodes, clean-ups and loss.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlease::{
    AttemptOutcome, CleanupCause, EventKind, LeaseEvent, LossReason, NodeErrorKind, NodeReply,
    NotAcquiredReason, Observer, Timer,
};
use redlease_testkit::{Fault, History, Op};

use crate::support::*;

/// An owned summary of one event.
#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Attempt {
        attempt: u32,
        replies: String,
        won: bool,
        reason: Option<NotAcquiredReason>,
    },
    Acquired {
        attempts: u32,
        contended: bool,
        waited: Duration,
    },
    NotAcquired {
        reason: NotAcquiredReason,
        contended: bool,
    },
    Extension {
        renewal: bool,
        replies: String,
    },
    Extended {
        renewal: bool,
    },
    AtRisk {
        error_kinds: Vec<NodeErrorKind>,
        first: bool,
    },
    Recovered {
        at_risk_for: Duration,
    },
    Lost(LossReason),
    Released {
        dropped: bool,
    },
    ReleaseRound {
        replies: String,
    },
    Cleanup {
        cause: CleanupCause,
        replies: String,
    },
}

/// Records `(lease number, summary)` for every event.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(u64, Ev)>>>);

impl Recorder {
    fn events(&self) -> Vec<(u64, Ev)> {
        self.0.lock().unwrap().clone()
    }

    fn of(&self, lease: u64) -> Vec<Ev> {
        self.events()
            .into_iter()
            .filter(|(l, _)| *l == lease)
            .map(|(_, e)| e)
            .collect()
    }
}

impl Observer for Recorder {
    fn event(&self, e: &LeaseEvent<'_>) {
        let replies = |nodes: &redlease::Nodes<'_>| format!("{nodes:?}");
        let ev = match &e.kind {
            EventKind::Attempt {
                attempt,
                nodes,
                outcome,
                ..
            } => Ev::Attempt {
                attempt: *attempt,
                replies: replies(nodes),
                won: matches!(outcome, AttemptOutcome::Won { .. }),
                reason: match outcome {
                    AttemptOutcome::Failed(r) => Some(*r),
                    _ => None,
                },
            },
            EventKind::Acquired {
                attempts,
                contended,
                waited,
                ..
            } => Ev::Acquired {
                attempts: *attempts,
                contended: *contended,
                waited: *waited,
            },
            EventKind::NotAcquired {
                reason, contended, ..
            } => Ev::NotAcquired {
                reason: *reason,
                contended: *contended,
            },
            EventKind::Extension { renewal, nodes, .. } => Ev::Extension {
                renewal: *renewal,
                replies: replies(nodes),
            },
            EventKind::Extended { renewal, .. } => Ev::Extended { renewal: *renewal },
            EventKind::AtRisk { error, first, .. } => Ev::AtRisk {
                first: *first,
                error_kinds: error
                    .map(|q| q.errors.iter().map(|(_, e)| e.kind()).collect())
                    .unwrap_or_default(),
            },
            EventKind::Recovered { at_risk_for, .. } => Ev::Recovered {
                at_risk_for: *at_risk_for,
            },
            EventKind::Lost { reason, .. } => Ev::Lost(*reason),
            EventKind::Released { dropped, .. } => Ev::Released { dropped: *dropped },
            EventKind::ReleaseRound { nodes, .. } => Ev::ReleaseRound {
                replies: replies(nodes),
            },
            EventKind::Cleanup { cause, nodes, .. } => Ev::Cleanup {
                cause: *cause,
                replies: replies(nodes),
            },
            _ => return,
        };
        self.0.lock().unwrap().push((e.lease.get(), ev));
    }
}

#[test]
fn a_contended_acquisition_reports_every_attempt_and_its_wait() {
    let mut c = Cluster::new(1, 40, config().with_retry_delay(ms(50)));
    let rec = Recorder::default();
    c.manager = c.manager.clone().with_observer(rec.clone());
    let lock = c.manager.lock("job");
    let holder = c.try_acquire(&lock).unwrap();
    let clock = c.clock.clone();
    c.sim.spawn(async move {
        clock.sleep_until(clock.now() + ms(120)).await;
        holder.release().await.unwrap();
    });
    let waiter = c
        .sim
        .block_on({
            let lock = lock.clone();
            async move { lock.acquire_within(secs(2)).await }
        })
        .unwrap();
    let events = rec.events();
    let holder_id = events[0].0;
    assert_eq!(
        rec.of(holder_id),
        vec![
            Ev::Attempt {
                attempt: 1,
                replies: "[yes]".into(),
                won: true,
                reason: None
            },
            Ev::Acquired {
                attempts: 1,
                contended: false,
                waited: Duration::ZERO
            },
            Ev::Released { dropped: false },
            Ev::ReleaseRound {
                replies: "[yes]".into()
            },
        ]
    );
    let waiter_id = events
        .iter()
        .map(|(l, _)| *l)
        .find(|l| *l != holder_id)
        .unwrap();
    let w = rec.of(waiter_id);
    let (last, attempts) = w.split_last().unwrap();
    let Ev::Acquired {
        attempts: n,
        contended: true,
        waited,
    } = last.clone()
    else {
        panic!("waiter's last event {last:?}");
    };
    // Retries 50 ms (+ jitter) apart until the holder leaves at 120 ms: at least three attempts.
    assert!(n >= 3, "{w:?}");
    assert!(waited >= ms(120) && waited < secs(2), "{waited:?}");
    assert_eq!(
        attempts.len(),
        n as usize,
        "one Attempt event per attempt: {w:?}"
    );
    for (i, a) in attempts.iter().enumerate() {
        let last = i + 1 == n as usize;
        assert_eq!(
            *a,
            Ev::Attempt {
                attempt: i as u32 + 1,
                replies: if last { "[yes]" } else { "[no]" }.into(),
                won: last,
                reason: (!last).then_some(NotAcquiredReason::Contended),
            }
        );
    }
    c.sim
        .block_on(async move { waiter.release().await })
        .unwrap();
}

#[test]
fn a_failed_renewal_is_at_risk_then_recovered_and_the_history_still_checks() {
    let config = config().with_expiry(secs(30)).with_retry_delay(ms(200));
    let mut c = Cluster::with_spawner(3, 41, config);
    let rec = Recorder::default();
    let history = History::new();
    c.manager = c
        .manager
        .clone()
        .with_observer((rec.clone(), history.clone()));
    // The first renewal round fails on two of three nodes: no quorum.
    for f in &c.faults[1..] {
        f.script(Op::Extend, [Fault::Fail(NodeErrorKind::Connection)]);
    }
    let lock = c.manager.lock("job").auto_renew(secs(10));
    let lease = c.try_acquire(&lock).unwrap();
    let id = rec.events()[0].0;
    c.sim.run_for(secs(11));
    let w = rec.of(id);
    assert_eq!(
        w[2..],
        [
            Ev::Extension {
                renewal: true,
                replies: "[yes, failed(connection), failed(connection)]".into()
            },
            Ev::AtRisk {
                error_kinds: vec![NodeErrorKind::Connection, NodeErrorKind::Connection],
                first: true
            },
            Ev::Extension {
                renewal: true,
                replies: "[yes, yes, yes]".into()
            },
            Ev::Extended { renewal: true },
            Ev::Recovered {
                at_risk_for: w
                    .iter()
                    .find_map(|e| match e {
                        Ev::Recovered { at_risk_for } => Some(*at_risk_for),
                        _ => None,
                    })
                    .unwrap()
            },
        ],
        "{w:#?}"
    );
    let Some(Ev::Recovered { at_risk_for }) = w.last() else {
        unreachable!()
    };
    // Retried after the retry delay (plus jitter of at most the same again).
    assert!(
        *at_risk_for >= ms(200) && *at_risk_for <= ms(400),
        "{at_risk_for:?}"
    );
    assert_eq!(lease.state(), redlease::LeaseState::Held);
    c.sim
        .block_on(async move { lease.release().await })
        .unwrap();
    assert_eq!(history.check(), Ok(()));
    assert_eq!(history.acquisitions(), 1);
}

#[test]
fn a_release_reports_the_nodes_that_failed_and_a_failed_attempt_its_cleanup() {
    let mut c = Cluster::new(3, 42, config());
    let rec = Recorder::default();
    c.manager = c.manager.clone().with_observer(rec.clone());
    let lock = c.manager.lock("job");
    let lease = c.try_acquire(&lock).unwrap();
    let id = rec.events()[0].0;
    c.faults[2].always(Op::Release, Fault::Fail(NodeErrorKind::Timeout));
    let report = c
        .sim
        .block_on(async move { lease.release().await })
        .unwrap();
    assert_eq!(report.failures().len(), 1);
    assert_eq!(
        rec.of(id)[2..],
        [
            Ev::Released { dropped: false },
            Ev::ReleaseRound {
                replies: "[yes, yes, failed(timeout)]".into()
            }
        ]
    );
    c.faults[2].clear();
    // Another owner holds nodes 1 and 2 (the key on node 2 survived the failed release above: delete it).
    c.nodes[2].del("job");
    c.nodes[1].set("job", "someone-else", Some(secs(30)));
    c.nodes[2].set("job", "someone-else", Some(secs(30)));
    let err = c.try_acquire(&lock).unwrap_err();
    assert!(err.is_contended());
    let (id, _) = *rec.events().last().unwrap();
    assert_eq!(
        rec.of(id),
        vec![
            Ev::Attempt {
                attempt: 1,
                replies: "[yes, no, no]".into(),
                won: false,
                reason: Some(NotAcquiredReason::Contended)
            },
            // Only node 0 took our token: only it is cleaned (the others answer "no" without a call).
            Ev::Cleanup {
                cause: CleanupCause::FailedAttempt,
                replies: "[yes, no, no]".into()
            },
            Ev::NotAcquired {
                reason: NotAcquiredReason::Contended,
                contended: true
            },
        ]
    );
}

#[test]
fn a_lost_lease_reports_the_loss_then_its_cleanup() {
    let mut c = Cluster::with_spawner(1, 43, config().with_expiry(secs(30)));
    let rec = Recorder::default();
    c.manager = c.manager.clone().with_observer(rec.clone());
    let lease = c
        .try_acquire(&c.manager.lock("job").auto_renew(secs(10)))
        .unwrap();
    let id = rec.events()[0].0;
    // Someone deletes the key: the next renewal finds it gone.
    c.nodes[0].del("job");
    c.sim.run_for(secs(11));
    assert!(!lease.is_held());
    assert_eq!(
        rec.of(id)[2..],
        [
            Ev::Extension {
                renewal: true,
                replies: "[no]".into()
            },
            Ev::Lost(LossReason::NotHeld),
            Ev::Cleanup {
                cause: CleanupCause::Lost,
                replies: "[no]".into()
            },
        ]
    );
    // Dropping a lost lease reports nothing more than the background clean-up of its token.
    drop(lease);
    c.sim.run_for(secs(1));
    let after: Vec<Ev> = rec.of(id)[5..].to_vec();
    assert!(
        after.iter().all(|e| matches!(
            e,
            Ev::Cleanup {
                cause: CleanupCause::Dropped,
                ..
            }
        )),
        "{after:?}"
    );
}

#[test]
fn node_replies_are_a_view_of_the_round() {
    let mut c = Cluster::new(3, 44, config().with_operation_timeout(ms(100)));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s2 = Arc::clone(&seen);
    struct F(Arc<Mutex<Vec<String>>>);
    impl Observer for F {
        fn event(&self, e: &LeaseEvent<'_>) {
            if let EventKind::Attempt { nodes, .. } = &e.kind {
                let kinds: Vec<String> = nodes
                    .iter()
                    .map(|r| match r {
                        NodeReply::Yes => "yes".to_string(),
                        NodeReply::No => "no".into(),
                        NodeReply::Failed(e) => format!("{:?}", e.kind()),
                        NodeReply::Abandoned => "abandoned".into(),
                        _ => "?".into(),
                    })
                    .collect();
                self.0.lock().unwrap().push(format!(
                    "{} yes={} no={} failed={} abandoned={} required={} errors={:?}",
                    kinds.join(","),
                    nodes.yes(),
                    nodes.no(),
                    nodes.failed(),
                    nodes.abandoned(),
                    nodes.required(),
                    nodes.errors().map(|(i, _)| i).collect::<Vec<_>>()
                ));
            }
        }
    }
    c.manager = c.manager.clone().with_observer(F(s2));
    // Node 1 refuses, node 2 never answers: the round waits for node 2 until the operation timeout.
    c.faults[1].always(Op::Acquire, Fault::Fail(NodeErrorKind::OutOfMemory));
    c.faults[2].always(Op::Acquire, Fault::Hang);
    let lock = c.manager.lock("job");
    let _ = c.try_acquire(&lock).unwrap_err();
    assert_eq!(
        seen.lock().unwrap()[0],
        "yes,OutOfMemory,Timeout yes=1 no=0 failed=2 abandoned=0 required=2 errors=[1, 2]"
    );
    let _ = c.clock.now();
}
