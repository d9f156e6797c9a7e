use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use redlease::{Error, LeaseState, LossReason, NotAcquiredReason, Timer};
use redlease_testkit::{Delivery, EventKind, Fault, Faults, History, Op, RandomFaults};

use crate::support::*;

const FOREIGN: &str = "someone-else";

#[test]
fn every_occupancy_mask_succeeds_iff_free_nodes_reach_quorum() {
    for n in [1usize, 3, 5] {
        for mask in 0u32..(1 << n) {
            let mut c = Cluster::new(n, u64::from(mask), config());
            let occupied: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
            for &i in &occupied {
                c.nodes[i].set("job", FOREIGN, Some(secs(60)));
            }
            let lock = c.manager.lock("job");
            let result = c.try_acquire(&lock);
            let free = n - occupied.len();
            let quorum = n / 2 + 1;
            match result {
                Ok(lease) => {
                    assert!(
                        free >= quorum,
                        "n={n} mask={mask:b}: acquired with only {free} free nodes"
                    );
                    let ours = c.holders("job", lease.token().as_str());
                    assert_eq!(
                        ours.len(),
                        free,
                        "n={n} mask={mask:b}: our token should be on every free node"
                    );
                    c.sim
                        .block_on(async move { lease.release().await })
                        .unwrap();
                }
                Err(e) => {
                    assert!(
                        free < quorum,
                        "n={n} mask={mask:b}: failed with {free} free nodes: {e}"
                    );
                    assert!(
                        e.is_contended(),
                        "n={n} mask={mask:b}: expected contention, got {e:?}"
                    );
                    for i in 0..n {
                        if occupied.contains(&i) {
                            assert_eq!(c.nodes[i].get("job").as_deref(), Some(FOREIGN.as_bytes()));
                        } else {
                            assert_eq!(
                                c.nodes[i].get("job"),
                                None,
                                "n={n} mask={mask:b}: node {i} not cleaned"
                            );
                        }
                    }
                }
            }
            // Foreign values survive everything, with their TTL untouched.
            for &i in &occupied {
                assert_eq!(c.nodes[i].get("job").as_deref(), Some(FOREIGN.as_bytes()));
                assert_eq!(c.nodes[i].pttl("job"), Some(Some(secs(60))));
            }
        }
    }
}

#[test]
fn partial_acquisition_is_cleaned_up_on_every_node_that_took_it() {
    let mut c = Cluster::new(5, 1, config());
    for i in [0, 2, 4] {
        c.nodes[i].set("job", FOREIGN, Some(secs(60)));
    }
    let lock = c.manager.lock("job");
    let err = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap_err();
    assert!(err.is_contended());
    // Nodes 1 and 3 accepted our SET and must have been cleaned by compare-and-delete.
    assert_eq!(c.faults[1].calls(Op::Release), 1);
    assert_eq!(c.faults[3].calls(Op::Release), 1);
    assert_eq!(c.nodes[1].get("job"), None);
    assert_eq!(c.nodes[3].get("job"), None);
    // Nodes that refused us are not sent a useless delete.
    assert_eq!(c.faults[0].calls(Op::Release), 0);
}

#[test]
fn foreign_token_is_never_deleted_or_extended() {
    for n in [1usize, 3, 5] {
        let mut c = Cluster::new(n, 2, config());
        let lock = c.manager.lock("job").expiry(secs(10));
        let lease = c
            .sim
            .block_on(async move { lock.try_acquire().await })
            .unwrap();
        // Our key vanishes everywhere (e.g. a server-side expiry we did not see) and another owner takes over.
        for node in &c.nodes {
            node.set("job", FOREIGN, Some(secs(60)));
        }
        let extend = c.sim.block_on(async { lease.extend(secs(10)).await });
        assert!(
            matches!(
                extend,
                Err(Error::Lost {
                    reason: LossReason::NotHeld,
                    ..
                })
            ),
            "n={n}: {extend:?}"
        );
        let release = c.sim.block_on(async move { lease.release().await });
        assert!(
            matches!(release, Err(Error::Lost { .. })),
            "n={n}: {release:?}"
        );
        for node in &c.nodes {
            assert_eq!(node.get("job").as_deref(), Some(FOREIGN.as_bytes()));
            assert_eq!(node.pttl("job"), Some(Some(secs(60))));
        }
    }
}

#[test]
fn release_after_expiry_reports_lost_and_keeps_the_new_owners_key() {
    for n in [1usize, 3] {
        let mut c = Cluster::new(n, 3, config());
        let lock = c.manager.lock("job").expiry(secs(1));
        let old = c.sim.block_on({
            let lock = lock.clone();
            async move { lock.try_acquire().await }
        });
        let old = old.unwrap();
        c.clock.advance(secs(2));
        let new = c.sim.block_on({
            let lock = lock.clone();
            async move { lock.try_acquire().await }
        });
        let new = new.unwrap();
        let err = c
            .sim
            .block_on(async move { old.release().await })
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Lost {
                    reason: LossReason::Expired,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(c.holders("job", new.token().as_str()).len(), n);
    }
}

/// Four workers contend for one fenced lock on one node whose requests fail, hang, lose replies, arrive
/// late after the caller gave up, and (with `delivery`) are reordered: acquisitions retry, reuse their token,
/// recognise their own late writes and clean up. Returns the history and the node's fault counters.
fn fenced_contention_under_faults(seed: u64, delivery: Delivery) -> (History, Faults) {
    let mut c = Cluster::new(
        1,
        seed,
        config().with_expiry(secs(2)).with_retry_delay(ms(10)),
    );
    c.faults[0].random(
        RandomFaults::new(seed, 0.03, 0.02, 0.06, ms(5))
            .slow_reply(0.03)
            .late(0.06, ms(900))
            .late_after_error(0.04)
            .delivery(delivery),
    );
    let clock = c.clock.clone();
    let history = History::new();
    let done = Arc::new(AtomicUsize::new(0));
    for worker in 0..4u64 {
        let lock = c.manager.lock("migrate").fenced("migrate:fence");
        let (history, done, clock) = (history.clone(), done.clone(), clock.clone());
        c.sim.spawn(async move {
            while done.load(SeqCst) < 1000 {
                let Ok(lease) = lock.acquire_within(secs(60)).await else {
                    continue;
                };
                done.fetch_add(1, SeqCst);
                history.record(
                    worker,
                    "migrate",
                    clock.now(),
                    EventKind::Acquired {
                        valid_until: lease.valid_until(),
                        fence: lease.fencing_token(),
                    },
                );
                clock.sleep_until(clock.now() + ms(1 + worker)).await;
                history.record(worker, "migrate", clock.now(), EventKind::Released);
                let _ = lease.release().await;
            }
        });
    }
    assert!(
        c.sim.run_until_idle(secs(36_000)),
        "seed {seed}: workers stuck"
    );
    (history, c.faults[0].clone())
}

#[test]
fn fencing_tokens_strictly_increase_over_1000_acquisitions_with_retries_lost_replies_and_late_applies()
 {
    for (seed, delivery) in [(4u64, Delivery::Fifo), (5, Delivery::Pool)] {
        let (history, faults) = fenced_contention_under_faults(seed, delivery);
        // The faults really happened: ambiguous replies forced retries, and requests landed after their
        // caller had given up (and were reordered on the pool).
        let late = faults.applied_after_caller_left(Op::AcquireFenced)
            + faults.applied_after_caller_left(Op::Release);
        assert!(late >= 20, "{delivery:?}: only {late} late applies");
        assert!(
            faults.calls(Op::AcquireFenced) > 1100,
            "{delivery:?}: too few retries ({} SETs for 1000 leases)",
            faults.calls(Op::AcquireFenced)
        );
        if delivery == Delivery::Pool {
            assert!(faults.reordered() > 0);
        }
        assert!(history.acquisitions() >= 1000);
        let workers: std::collections::HashSet<u64> =
            history.events().iter().map(|e| e.client).collect();
        assert!(
            workers.len() > 1,
            "acquisitions should be spread over workers"
        );
        // Tokens strictly increase in acquisition order, and no two believed-held intervals overlap.
        if let Err(v) = history.check() {
            panic!("seed {seed} ({delivery:?}): {v}");
        }
    }
}

#[test]
fn hung_single_node_bounds_every_operation_by_the_operation_timeout() {
    let mut c = Cluster::new(1, 5, config());
    let timeout = c.manager.config().operation_timeout_for(secs(30));
    assert_eq!(timeout, ms(500));
    c.faults[0].always_all(Fault::Hang);
    let lock = c.manager.lock("job");
    let start = c.now();
    let err = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap_err();
    // One acquisition round and one cleanup round, each cut at the operation timeout.
    assert_eq!(c.now() - start, timeout * 2);
    match err {
        Error::NotAcquired {
            reason: NotAcquiredReason::TooFewNodes,
            last_error: Some(q),
            ..
        } => {
            assert_eq!(q.errors.len(), 1);
            assert!(q.errors[0].1.is_ambiguous());
        }
        other => panic!("{other:?}"),
    }
    extend_release_renewal_and_run_are_bounded_on_a_hung_node(timeout);
}

/// Acquires "job" on a healthy node, then hangs it.
fn hung_after_acquire(seed: u64, spawner: bool, renew: bool) -> (Cluster, redlease::Lease) {
    let mut c = if spawner {
        Cluster::with_spawner(1, seed, config())
    } else {
        Cluster::new(1, seed, config())
    };
    let mut lock = c.manager.lock("job");
    if renew && spawner {
        lock = lock.auto_renew(secs(5));
    } else if renew {
        lock = lock.renew_every(secs(5));
    }
    let lease = c.try_acquire(&lock).unwrap();
    c.faults[0].always_all(Fault::Hang);
    (c, lease)
}

fn extend_release_renewal_and_run_are_bounded_on_a_hung_node(timeout: std::time::Duration) {
    // extend: one extension round cut at the timeout; nothing proves the lease gone, so it is at risk.
    let (mut c, lease) = hung_after_acquire(50, false, false);
    let start = c.now();
    let err = c
        .sim
        .block_on(async { lease.extend(secs(30)).await })
        .unwrap_err();
    assert_eq!(c.now() - start, timeout, "{err:?}");
    assert!(matches!(err, Error::Quorum(_)), "{err:?}");
    assert!(
        matches!(lease.state(), LeaseState::AtRisk),
        "{:?}",
        lease.state()
    );

    // release: one round, cut at the timeout; it cannot tell whether the lease was held.
    let (mut c, lease) = hung_after_acquire(51, false, false);
    let start = c.now();
    let err = c
        .sim
        .block_on(async move { lease.release().await })
        .unwrap_err();
    assert_eq!(c.now() - start, timeout, "{err:?}");
    assert!(matches!(err, Error::Quorum(_)), "{err:?}");

    // Background renewal: every renewal round is cut at the timeout, and the loss is signalled by the
    // validity deadline; afterwards nothing talks to the node any more.
    let (mut c, lease) = hung_after_acquire(52, true, true);
    let deadline = lease.valid_until();
    let signal = lease.lost();
    let reason = c.sim.block_on(signal);
    assert!(
        c.now() <= deadline,
        "loss signalled {:?} late",
        c.now() - deadline
    );
    assert!(
        matches!(reason, LossReason::Expired | LossReason::ExtendFailed),
        "{reason:?}"
    );
    let renewals = c.faults[0].calls(Op::Extend);
    assert!(renewals >= 2, "renewal kept trying: {renewals} rounds");
    drop(lease);
    assert!(
        c.sim.run_until_idle(timeout * 4),
        "renewal and clean-up end"
    );
    let calls = c.calls();
    c.sim.run_for(secs(120));
    assert_eq!(c.calls(), calls);

    // run(): renewal inside the future; the work is stopped by the deadline, and run returns within one
    // more operation timeout (its clean-up).
    let (mut c, lease) = hung_after_acquire(53, false, true);
    let deadline = lease.valid_until();
    let clock = c.clock.clone();
    let r = c.sim.block_on(async {
        lease
            .run(async {
                clock.sleep_until(clock.now() + secs(600)).await;
            })
            .await
    });
    assert!(matches!(r, Err(Error::Lost { .. })), "{r:?}");
    assert!(
        c.now() <= deadline + timeout,
        "run returned {:?} after the deadline",
        c.now().saturating_duration_since(deadline)
    );
    assert!(c.faults[0].calls(Op::Extend) >= 2);
}

#[test]
fn redlock_proceeds_past_a_hung_minority_without_waiting() {
    for n in [3usize, 5] {
        let mut c = Cluster::new(n, 6, config());
        for f in c.faults.iter().take(n / 2) {
            f.always_all(Fault::Hang);
        }
        let lock = c.manager.lock("job");
        let start = c.now();
        let lease = c
            .sim
            .block_on(async move { lock.try_acquire().await })
            .unwrap();
        assert_eq!(
            c.now(),
            start,
            "a decided round does not wait for hung nodes"
        );
        let t = c.now();
        c.sim
            .block_on(async { lease.extend(secs(30)).await })
            .unwrap();
        // An extension is a script: a won round waits the grace floor (50 ms) for the stragglers, far less
        // than the 500 ms operation timeout.
        assert_eq!(c.now() - t, ms(50));
        let t = c.now();
        c.sim
            .block_on(async move { lease.release().await })
            .unwrap();
        // Release reaches every node it can: it waits for the hung ones up to the operation timeout.
        assert_eq!(c.now() - t, ms(500));
    }
}

#[test]
fn slow_quorum_fails_although_its_sets_succeeded() {
    let cfg = config()
        .with_expiry(ms(1000))
        .with_operation_timeout(ms(995));
    let mut c = Cluster::new(3, 7, cfg);
    for f in &c.faults {
        f.script(Op::Acquire, [Fault::Delay(ms(990))]);
    }
    let lock = c.manager.lock("job");
    let err = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotAcquired {
                reason: NotAcquiredReason::ValidityExhausted,
                ..
            }
        ),
        "{err:?}"
    );
    for (i, f) in c.faults.iter().enumerate() {
        assert_eq!(f.applied(Op::Acquire), 1, "node {i} applied the SET");
        assert_eq!(f.calls(Op::Release), 1, "node {i} was sent the cleanup");
        assert_eq!(c.nodes[i].get("job"), None, "node {i} still holds the key");
    }
}

#[test]
fn lost_reply_then_retry_recognises_its_own_token() {
    for fenced in [false, true] {
        let mut c = Cluster::new(1, 8, config());
        let op = if fenced {
            Op::AcquireFenced
        } else {
            Op::Acquire
        };
        c.faults[0].script(op, [Fault::ReplyLost]);
        // The cleanup of the ambiguous attempt cannot reach the node either.
        c.faults[0].script(
            Op::Release,
            [Fault::Fail(redlease::NodeErrorKind::Connection)],
        );
        let mut lock = c.manager.lock("job");
        if fenced {
            lock = lock.fenced("job:fence");
        }
        let start = c.now();
        let lease = c.sim.block_on(async move { lock.acquire().await }).unwrap();
        assert_eq!(c.faults[0].calls(op), 2, "exactly one retry");
        assert!(
            c.now() - start >= ms(200),
            "the retry waited for the retry delay"
        );
        assert_eq!(c.holders("job", lease.token().as_str()), vec![0]);
        if fenced {
            assert_eq!(
                lease.fencing_token(),
                Some(1),
                "the retry reuses the fence it was issued"
            );
            assert_eq!(c.nodes[0].get("job:fence").as_deref(), Some(&b"1"[..]));
        }
    }
}

#[test]
fn contended_acquire_retries_with_jittered_delays_then_reports_contention() {
    let mut c = Cluster::new(3, 9, config().with_attempts(4));
    for node in &c.nodes {
        node.set("job", FOREIGN, Some(secs(60)));
    }
    let lock = c.manager.lock("job");
    let start = c.now();
    let err = c
        .sim
        .block_on(async move { lock.acquire().await })
        .unwrap_err();
    let elapsed = c.now() - start;
    assert!(matches!(
        err,
        Error::NotAcquired {
            attempts: 4,
            reason: NotAcquiredReason::Contended,
            ..
        }
    ));
    assert!(
        elapsed >= ms(600) && elapsed <= ms(900),
        "three pauses of 200-300 ms, got {elapsed:?}"
    );
    assert_eq!(c.faults[0].calls(Op::Acquire), 4);
}

/// Each acquisition draws its own retry jitter from the manager: two contenders that met contention at the
/// same moment must not retry in lockstep. Here two acquisitions of one manager, one after the other, each
/// pause three times (the nodes answer at once, so the time taken is the pauses alone): their pauses differ.
#[test]
fn successive_acquisitions_of_one_manager_draw_their_own_retry_jitter() {
    let mut c = Cluster::new(3, 9, config().with_attempts(4));
    for node in &c.nodes {
        node.set("job", FOREIGN, Some(secs(60)));
    }
    let mut took = Vec::new();
    for _ in 0..2 {
        let lock = c.manager.lock("job");
        let start = c.now();
        let err = c
            .sim
            .block_on(async move { lock.acquire().await })
            .unwrap_err();
        assert!(err.is_contended(), "{err}");
        took.push(c.now() - start);
    }
    assert_ne!(took[0], took[1], "the same jitter twice: {took:?}");
}

#[test]
fn acquire_until_stops_at_the_deadline_and_wins_when_the_holder_leaves() {
    let mut c = Cluster::new(3, 10, config());
    for node in &c.nodes {
        node.set("job", FOREIGN, Some(secs(5)));
    }
    let lock = c.manager.lock("job");
    let start = c.now();
    let deadline = start + secs(2);
    let err = c
        .sim
        .block_on({
            let lock = lock.clone();
            async move { lock.acquire_until(deadline).await }
        })
        .unwrap_err();
    assert!(err.is_contended());
    assert!(c.now() <= deadline, "gave up by the deadline");
    let lease = c
        .sim
        .block_on(async move { lock.acquire_within(secs(10)).await })
        .unwrap();
    assert!(
        c.now() >= start + secs(5),
        "acquired once the foreign keys expired"
    );
    assert!(lease.is_held());
}

#[test]
fn an_extension_without_a_majority_leaves_the_lease_at_risk_and_retryable() {
    // Two of three nodes refuse the connection: nothing proves the lease gone, and it has almost its whole
    // validity left. It stays held, at risk, with the nodes' key untouched; a retry extends it.
    let mut c = Cluster::new(3, 11, config());
    let lock = c.manager.lock("job");
    let lease = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap();
    let token = lease.token().as_str().to_owned();
    let deadline = lease.valid_until();
    for f in &c.faults[1..] {
        f.script(
            Op::Extend,
            [Fault::Fail(redlease::NodeErrorKind::Connection)],
        );
    }
    let err = c
        .sim
        .block_on(async { lease.extend(secs(30)).await })
        .unwrap_err();
    match &err {
        Error::Quorum(q) => {
            assert_eq!((q.successes, q.required), (1, 2));
            assert_eq!(q.errors.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 2]);
        }
        other => panic!("{other:?}"),
    }
    assert!(!err.is_lost(), "{err}");
    assert!(
        matches!(lease.state(), LeaseState::AtRisk),
        "{:?}",
        lease.state()
    );
    assert_eq!(
        lease.valid_until(),
        deadline,
        "the old deadline still stands"
    );
    assert_eq!(c.holders("job", &token).len(), 3, "nothing was deleted");
    let signal = lease.lost();
    assert!(!signal.has_ended());

    // The nodes answer again: the retry extends the lease and it is held again.
    c.clock.advance(secs(1));
    c.sim
        .block_on(async { lease.extend(secs(30)).await })
        .unwrap();
    assert_eq!(lease.state(), LeaseState::Held);
    assert!(lease.valid_until() > deadline);

    // "Not held" on a majority still loses it at once.
    for node in &c.nodes[1..] {
        node.del("job");
    }
    let err = c
        .sim
        .block_on(async { lease.extend(secs(30)).await })
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Lost {
                reason: LossReason::NotHeld,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        c.holders("job", &token).is_empty(),
        "the remaining token was deleted"
    );
}

#[test]
fn a_failed_extension_that_is_not_retried_is_lost_at_the_deadline_with_its_cause() {
    let mut c = Cluster::new(1, 16, config().with_expiry(secs(5)));
    let lock = c.manager.lock("job");
    let lease = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap();
    let deadline = lease.valid_until();
    c.faults[0].script(
        Op::Extend,
        [Fault::Fail(redlease::NodeErrorKind::Connection)],
    );
    let err = c
        .sim
        .block_on(async { lease.extend(secs(5)).await })
        .unwrap_err();
    assert!(matches!(err, Error::Quorum(_)), "{err:?}");
    let cause = std::error::Error::source(&err)
        .and_then(std::error::Error::source)
        .map(ToString::to_string)
        .unwrap_or_default();
    assert!(
        cause.contains("connection"),
        "the source chain names the node error: {err}: {cause}"
    );
    let reason = c.sim.block_on(lease.lost());
    assert_eq!(reason, LossReason::Expired);
    assert_eq!(c.now(), deadline);
    let err = c
        .sim
        .block_on(async move { lease.release().await })
        .unwrap_err();
    assert!(err.is_lost(), "{err}");
}

#[test]
fn extend_with_a_majority_succeeds_and_moves_the_deadline() {
    let mut c = Cluster::new(5, 12, config());
    let lock = c.manager.lock("job").expiry(secs(10));
    let lease = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap();
    let before = lease.valid_until();
    c.faults[0].script(
        Op::Extend,
        [Fault::Fail(redlease::NodeErrorKind::Connection)],
    );
    c.faults[1].script(Op::Extend, [Fault::Hang]);
    c.clock.advance(secs(4));
    c.sim
        .block_on(async { lease.extend(secs(10)).await })
        .unwrap();
    assert_eq!(lease.valid_until(), before + secs(4));
    // The won round waited the 50 ms grace floor for the hung node before returning.
    assert_eq!(c.nodes[2].pttl("job"), Some(Some(secs(10) - ms(50))));
}

#[test]
fn extend_after_expiry_reports_lost_and_never_recreates_the_key() {
    for n in [1usize, 3] {
        let mut c = Cluster::new(n, 13, config());
        let lock = c.manager.lock("job").expiry(secs(1));
        let lease = c
            .sim
            .block_on(async move { lock.try_acquire().await })
            .unwrap();
        c.clock.advance(secs(2));
        let calls = c.calls();
        let err = c
            .sim
            .block_on(async { lease.extend(secs(1)).await })
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Lost {
                    reason: LossReason::Expired,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            c.calls(),
            calls,
            "no extension is sent for an expired lease"
        );
        // Deleted behind our back while still locally valid: extension refuses to re-create it.
        let lock = c.manager.lock("job2").expiry(secs(10));
        let lease = c
            .sim
            .block_on(async move { lock.try_acquire().await })
            .unwrap();
        for node in &c.nodes {
            node.del("job2");
        }
        let err = c
            .sim
            .block_on(async { lease.extend(secs(10)).await })
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Lost {
                    reason: LossReason::NotHeld,
                    ..
                }
            ),
            "{err:?}"
        );
        for node in &c.nodes {
            assert_eq!(node.get("job2"), None);
        }
    }
}

#[test]
fn extend_that_leaves_no_validity_fails_and_is_cleaned_up() {
    let mut c = Cluster::new(3, 14, config().with_operation_timeout(ms(995)));
    let lock = c.manager.lock("job").expiry(secs(10));
    let lease = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap();
    let token = lease.token().as_str().to_owned();
    for f in &c.faults {
        f.script(Op::Extend, [Fault::Delay(ms(990))]);
    }
    // Every node extends to 1000 ms, but 990 ms of round + 12 ms of drift leave no validity.
    let err = c
        .sim
        .block_on(async { lease.extend(ms(1000)).await })
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Lost {
                reason: LossReason::ExtendFailed,
                source: None,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(c.holders("job", &token).is_empty());
}

#[test]
fn dropped_lease_is_released_in_the_background_when_a_spawner_is_set() {
    let mut c = Cluster::with_spawner(3, 15, config());
    let lock = c.manager.lock("job");
    let lease = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap();
    let token = lease.token().as_str().to_owned();
    let signal = lease.lost();
    drop(lease);
    assert!(c.sim.run_until_idle(secs(1)));
    assert!(c.holders("job", &token).is_empty());
    assert_eq!(c.sim.block_on(signal), LossReason::Released);
}

#[test]
fn timer_is_the_only_clock() {
    // Virtual time: a 30 s lease expires after 30 virtual seconds although no real time passes.
    let mut c = Cluster::new(1, 16, config());
    let lock = c.manager.lock("job");
    let lease = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap();
    let until = lease.valid_until();
    assert_eq!(until - c.now(), secs(30) - ms(302));
    let signal = lease.lost();
    assert_eq!(c.sim.block_on(signal), LossReason::Expired);
    assert_eq!(c.clock.now(), until);
}

#[test]
fn definite_failures_send_no_cleanup_but_unconfirmed_writes_are_cleaned_later() {
    // A definitely-not-applied error wrote nothing: no compare-and-delete is sent.
    let mut c = Cluster::new(1, 17, config());
    c.faults[0].script(
        Op::Acquire,
        [Fault::Fail(redlease::NodeErrorKind::CrossSlot)],
    );
    let err = c.try_acquire(&c.manager.lock("job")).unwrap_err();
    assert!(matches!(
        err,
        Error::NotAcquired {
            reason: NotAcquiredReason::Refused,
            ..
        }
    ));
    assert_eq!(c.faults[0].calls(Op::Release), 0);

    // Attempt 1 is applied but its reply lost, and its clean-up cannot reach the node. Attempt 2 fails
    // definitely; the write of attempt 1 is still unconfirmed, so attempt 2's clean-up deletes it.
    let mut c = Cluster::new(1, 18, config().with_attempts(2));
    c.faults[0].script(
        Op::Acquire,
        [
            Fault::ReplyLost,
            Fault::Fail(redlease::NodeErrorKind::Connection),
        ],
    );
    c.faults[0].script(
        Op::Release,
        [Fault::Fail(redlease::NodeErrorKind::Connection)],
    );
    let lock = c.manager.lock("job");
    let err = c
        .sim
        .block_on(async move { lock.acquire().await })
        .unwrap_err();
    assert!(
        matches!(err, Error::NotAcquired { attempts: 2, .. }),
        "{err:?}"
    );
    assert_eq!(c.faults[0].calls(Op::Release), 2);
    assert_eq!(
        c.nodes[0].get("job"),
        None,
        "the unconfirmed write was cleaned up"
    );
}

#[test]
fn a_won_script_round_lets_slightly_slower_nodes_answer_but_not_a_hung_one() {
    // Extension is a script, which may need a second request on a node with a cold script cache: a won
    // round lets the others answer for twice the quorum's time, at least 50 ms. Nodes 0 and 1 answer after
    // 10 ms, node 2 after 15 ms: node 2 is extended too.
    let mut c = Cluster::new(3, 19, config());
    let lease = c
        .try_acquire(&c.manager.lock("job").expiry(secs(10)))
        .unwrap();
    c.faults[0].script(Op::Extend, [Fault::Delay(ms(10))]);
    c.faults[1].script(Op::Extend, [Fault::Delay(ms(10))]);
    c.faults[2].script(Op::Extend, [Fault::Delay(ms(15))]);
    let start = c.now();
    c.sim
        .block_on(async { lease.extend(secs(20)).await })
        .unwrap();
    assert_eq!(c.now() - start, ms(15));
    for node in &c.nodes {
        let left = node.pttl("job").flatten().unwrap();
        assert!(left > secs(19), "every node was extended, PTTL {left:?}");
    }

    // A quick quorum still leaves the grace floor (50 ms) to a straggler whose second request a loaded
    // machine delayed: nodes 0 and 1 answer after 1 ms, node 2 after 40 ms, and node 2 is extended.
    c.faults[0].script(Op::Extend, [Fault::Delay(ms(1))]);
    c.faults[1].script(Op::Extend, [Fault::Delay(ms(1))]);
    c.faults[2].script(Op::Extend, [Fault::Delay(ms(40))]);
    let start = c.now();
    c.sim
        .block_on(async { lease.extend(secs(30)).await })
        .unwrap();
    assert_eq!(c.now() - start, ms(40));
    for node in &c.nodes {
        let left = node.pttl("job").flatten().unwrap();
        assert!(left > secs(29), "every node was extended, PTTL {left:?}");
    }

    // A hung node costs twice the quorum's time again, at least the floor, not the operation timeout.
    c.faults[0].script(Op::Extend, [Fault::Delay(ms(10))]);
    c.faults[1].script(Op::Extend, [Fault::Delay(ms(10))]);
    c.faults[2].script(Op::Extend, [Fault::Hang]);
    let start = c.now();
    c.sim
        .block_on(async { lease.extend(secs(20)).await })
        .unwrap();
    assert_eq!(c.now() - start, ms(60));
    c.faults[0].script(Op::Extend, [Fault::Delay(ms(40))]);
    c.faults[1].script(Op::Extend, [Fault::Delay(ms(40))]);
    c.faults[2].script(Op::Extend, [Fault::Hang]);
    let start = c.now();
    c.sim
        .block_on(async { lease.extend(secs(20)).await })
        .unwrap();
    assert_eq!(
        c.now() - start,
        ms(120),
        "twice the quorum's 40 ms beyond it"
    );

    // A fresh acquisition is one plain command per node, already sent when its reply is abandoned: it
    // returns at the quorum.
    for (f, fault) in c
        .faults
        .iter()
        .zip([Fault::Delay(ms(10)), Fault::Delay(ms(10)), Fault::Hang])
    {
        f.script(Op::Acquire, [fault]);
    }
    let start = c.now();
    c.try_acquire(&c.manager.lock("other")).unwrap();
    assert_eq!(c.now() - start, ms(10));
}

#[test]
fn an_acquisition_dropped_mid_round_is_cleaned_up_in_the_background_with_a_spawner() {
    for with_spawner in [true, false] {
        let mut c = if with_spawner {
            Cluster::with_spawner(3, 21, config())
        } else {
            Cluster::new(3, 21, config())
        };
        // Every node applies the SET at once but answers only 50 ms later.
        for f in &c.faults {
            f.script(Op::Acquire, [Fault::SlowReply(ms(50))]);
        }
        let lock = c.manager.lock("job").expiry(secs(10));
        let clock = c.clock.clone();
        let mut acquire = Box::pin(async move {
            let _ = lock.try_acquire().await;
        });
        // Poll until the SETs are applied, then drop the acquisition at 10 ms.
        let mut stop = clock.sleep_until(clock.now() + ms(10));
        c.sim.block_on(std::future::poll_fn(|cx| {
            let _ = acquire.as_mut().poll(cx);
            stop.as_mut().poll(cx)
        }));
        drop(acquire);
        assert_eq!(c.nodes.iter().filter(|n| n.get("job").is_some()).count(), 3);
        c.sim.run_for(secs(1));
        let left = c.nodes.iter().filter(|n| n.get("job").is_some()).count();
        if with_spawner {
            assert_eq!(left, 0, "the spawned clean-up deleted the abandoned writes");
        } else {
            assert_eq!(left, 3, "without a spawner the keys wait for their TTL");
            c.sim.run_for(secs(10));
            assert_eq!(c.nodes.iter().filter(|n| n.get("job").is_some()).count(), 0);
        }
    }
}

#[test]
fn a_late_clean_up_of_an_earlier_attempt_never_deletes_the_key_a_retry_won() {
    // Attempt 1's SET is applied but its reply lost; its compare-and-delete sits in a pool connection past
    // the operation timeout and lands 1.5 s later. Whatever the retries do meanwhile, the client must not
    // believe it holds a key that no node has: once the delete has landed, either the first client holds
    // nothing or a second client cannot acquire.
    for fenced in [false, true] {
        let mut c = Cluster::new(1, 60, config());
        let op = if fenced {
            Op::AcquireFenced
        } else {
            Op::Acquire
        };
        c.faults[0].delivery(Delivery::Pool);
        c.faults[0].script(op, [Fault::ReplyLost]);
        c.faults[0].script(Op::Release, [Fault::Late(ms(1_500))]);
        let mut lock = c.manager.lock("job");
        if fenced {
            lock = lock.fenced("job:fence");
        }
        let first = c.sim.block_on({
            let lock = lock.clone();
            async move { lock.acquire().await }
        });
        c.sim.run_for(secs(2));
        assert_eq!(
            c.faults[0].applied_after_caller_left(Op::Release),
            1,
            "the late clean-up landed"
        );
        let second = c.sim.block_on({
            let lock = lock.clone();
            async move { lock.try_acquire().await }
        });
        if let (Ok(first), Ok(_)) = (&first, &second) {
            assert!(
                !first.is_held(),
                "fenced {fenced}: two holders at once (the first holds for {:?} more)",
                first.valid_until() - c.now()
            );
        }
    }
}

#[test]
fn a_straggling_acquisition_request_never_shortens_a_longer_extension() {
    // Found by the everything-hostile simulation (seed 60 of `clients_paused_clocks_skewed_…`). Attempt 1's
    // SET is written but the connection resets (ambiguous at once) and it reaches the node, over another pool
    // connection, only 1.2 s later. Attempt 2 wins; the holder extends to 10 s; then the straggler lands on
    // the key that holds its own token, and the own-token branch sets the acquisition TTL (2 s) again: the key
    // would expire at about 3.2 s while the holder believes it holds it until about 10 s.
    for fenced in [false, true] {
        let mut c = Cluster::new(1, 61, config());
        let op = if fenced {
            Op::AcquireFenced
        } else {
            Op::Acquire
        };
        c.faults[0].delivery(Delivery::Pool);
        c.faults[0].script(op, [Fault::LateAfterError(ms(1_200))]);
        // Attempt 1's clean-up is refused (never applied), so attempt 2 keeps its token — the straggler
        // carries it. (A clean-up that was sent would give attempt 2 a new token, which the straggler
        // cannot touch.)
        c.faults[0].script(
            Op::Release,
            [Fault::Fail(redlease::NodeErrorKind::Connection)],
        );
        let mut lock = c.manager.lock("job").expiry(secs(2));
        if fenced {
            lock = lock.fenced("job:fence");
        }
        let first = c
            .sim
            .block_on({
                let lock = lock.clone();
                async move { lock.acquire().await }
            })
            .unwrap();
        // Fenced, the straggler is the acquisition script: landing on our own key it would set 2 s again, so
        // the core does not count that node for a longer extension (with one node the extension fails and the
        // lease is given up). Unfenced, attempt 1 was a plain `SET NX`, which never changes an existing key:
        // the extension may count the node. Either way, never two holders.
        let extended = c.sim.block_on(async { first.extend(secs(10)).await });
        assert_eq!(
            extended.is_ok(),
            !fenced,
            "fenced {fenced}: extension outcome {extended:?}"
        );
        c.sim.run_for(secs(3));
        assert_eq!(
            c.faults[0].applied_after_caller_left(op),
            1,
            "the straggler landed"
        );
        let second = c.sim.block_on({
            let lock = lock.clone();
            async move { lock.try_acquire().await }
        });
        assert!(
            !(first.is_held() && second.is_ok()),
            "fenced {fenced}: two holders at once (the first holds for {:?} more)",
            first.valid_until() - c.now()
        );
    }
}

#[test]
fn a_shortening_extension_in_flight_already_bounds_what_the_lease_believes() {
    // Found by the everything-hostile simulation (seed 46 without late acquisitions). A 30 s lease is
    // extended to 1 s: the node applies the extension at once, but its reply takes 100 ms, and 50 ms into the
    // round the client is paused for 2 s (GC, SIGSTOP). When the paused client resumes, its own tasks must not
    // see the lease as held until the old 30 s deadline: a manual extension to 1 s moves the lease's belief
    // to the round's start plus 1 s before the request is sent. (When this was found, the node applied the
    // shorter TTL, the key expired at about 1 s and another client took the lock. Since extensions never
    // shorten a key, the key keeps its 30 s: the lease's belief is conservative, the key is not.)
    let mut c = Cluster::new(1, 62, config());
    let lock = c.manager.lock("job").expiry(secs(30));
    let lease = std::sync::Arc::new(c.try_acquire(&lock).unwrap());
    c.faults[0].script(Op::Extend, [Fault::SlowReply(ms(100))]);
    let start = c.now();
    let seen: std::sync::Arc<std::sync::Mutex<Option<(bool, std::time::Instant)>>> = Arc::default();
    let client = c.sim.client(1);
    {
        let lease = lease.clone();
        client.spawn(async move {
            let _ = lease.extend(secs(1)).await;
        });
    }
    {
        // Another task of the same client, woken during the pause before the extension's reply.
        let (lease, seen, clock) = (lease.clone(), seen.clone(), c.clock.clone());
        client.spawn(async move {
            clock.sleep_until(start + ms(60)).await;
            *seen.lock().unwrap() = Some((lease.is_held(), lease.valid_until()));
        });
    }
    c.sim.run_for(ms(50));
    c.sim.pause(1, secs(2));
    c.sim.run_for(ms(1_100));
    let other = c.try_acquire(&c.manager.lock("job"));
    assert!(
        other.is_err(),
        "the extension to 1 s shortened the key: it must keep its 30 s"
    );
    let left = c.nodes[0].pttl("job").flatten().expect("the key has a TTL");
    assert!(left > secs(27), "the key has {left:?} left");
    assert!(c.sim.run_until_idle(secs(5)));
    let (held, until) = seen.lock().unwrap().unwrap();
    assert!(
        !held || until <= start + secs(1),
        "after the pause the lease still looked held until {:?} from the round's start",
        until - start
    );
}

/// A lease's `Debug` names its key, fence and state, and shows its token redacted (as `Token`'s own does).
#[test]
fn a_lease_debugs_as_its_key_fence_and_state_with_the_token_redacted() {
    let mut c = Cluster::new(1, 23, config());
    let lock = c.manager.lock("debugged").fenced("debugged:fence");
    let lease = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap();
    let shown = format!("{lease:?}");
    for part in ["Lease", "debugged", "fencing_token: Some(1)", "state"] {
        assert!(shown.contains(part), "{part} in {shown}");
    }
    assert!(!shown.contains(lease.token().as_str()), "{shown}");
    std::mem::forget(lease);
}

/// A lock's `Debug` shows how it is configured: key, expiry, renewal, fence key, hold limit and holder info.
#[test]
fn a_lock_debugs_as_its_configuration() {
    let c = Cluster::new(1, 24, config());
    let lock = c
        .manager
        .lock("configured")
        .expiry(secs(7))
        .auto_renew(secs(2))
        .fenced("configured:fence")
        .max_hold(secs(60))
        .with_holder_info("worker-3");
    let shown = format!("{lock:?}");
    for part in [
        "Lock",
        "\"configured\"",
        "expiry: 7s",
        "renew_every: Some(2s)",
        "background_renewal: true",
        "\"configured:fence\"",
        "max_hold: Some(60s)",
        "worker-3",
    ] {
        assert!(shown.contains(part), "{part} in {shown}");
    }
}

/// `fencing_token_i64` is the fence as a database's signed 64-bit integer: the same number, up to the
/// counter's last (`i64::MAX`, where Redis' `INCR` stops), and `None` for an unfenced lease.
#[test]
fn a_fence_reads_as_the_same_i64() {
    let mut c = Cluster::new(1, 29, config());
    let lease = {
        let lock = c.manager.lock("plain");
        c.sim
            .block_on(async move { lock.try_acquire().await })
            .unwrap()
    };
    assert_eq!(lease.fencing_token_i64(), None, "unfenced");
    std::mem::forget(lease);
    for (counter, fence) in [
        (None, Some(1)),
        (Some(41_u64), Some(42)),
        (Some(i64::MAX as u64 - 1), Some(i64::MAX)),
    ] {
        let key = format!("fenced:{counter:?}");
        let fence_key = format!("{key}:fence");
        if let Some(n) = counter {
            c.nodes[0].set(&fence_key, n.to_string().as_bytes(), None);
        }
        let lock = c.manager.lock(&key).fenced(fence_key);
        let lease = c
            .sim
            .block_on(async move { lock.try_acquire().await })
            .unwrap();
        assert_eq!(lease.fencing_token_i64(), fence, "counter {counter:?}");
        assert_eq!(
            lease.fencing_token(),
            Some(counter.unwrap_or(0) + 1),
            "counter {counter:?}"
        );
        std::mem::forget(lease);
    }
}
