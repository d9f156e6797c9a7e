use redlease::{Error, LossReason, NotAcquiredReason, Timer};
use redlease_testkit::{Fault, Op};

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

#[test]
fn fencing_tokens_strictly_increase_over_1000_contended_acquisitions() {
    let mut c = Cluster::new(1, 4, config().expiry(secs(5)).retry_delay(ms(1)));
    let clock = c.clock.clone();
    let fences = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for worker in 0..8u64 {
        let lock = c.manager.lock("migrate").fenced("migrate:fence");
        let fences = fences.clone();
        let done = done.clone();
        let clock = clock.clone();
        c.sim.spawn(async move {
            while done.load(std::sync::atomic::Ordering::SeqCst) < 1000 {
                match lock.acquire_within(secs(60)).await {
                    Ok(lease) => {
                        let n = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        fences
                            .lock()
                            .unwrap()
                            .push((n, worker, lease.fencing_token().unwrap()));
                        clock.sleep_until(clock.now() + ms(1 + worker)).await;
                        lease.release().await.unwrap();
                    }
                    Err(e) => assert!(e.is_contended(), "{e:?}"),
                }
            }
        });
    }
    c.sim.run_until_idle(secs(3600));
    let fences = fences.lock().unwrap();
    assert!(fences.len() >= 1000);
    let workers: std::collections::HashSet<u64> = fences.iter().map(|f| f.1).collect();
    assert!(
        workers.len() > 1,
        "acquisitions should be spread over workers"
    );
    for pair in fences.windows(2) {
        assert!(
            pair[1].2 > pair[0].2,
            "fence {} after {}",
            pair[1].2,
            pair[0].2
        );
    }
    assert_eq!(fences.last().unwrap().2, fences.len() as u64);
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
        c.sim
            .block_on(async { lease.extend(secs(30)).await })
            .unwrap();
        assert_eq!(c.now(), start);
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
    let cfg = config().expiry(ms(1000)).operation_timeout(ms(995));
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
    let mut c = Cluster::new(3, 9, config().attempts(4));
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
fn extend_needs_a_majority_and_cleans_the_minority_on_failure() {
    let mut c = Cluster::new(3, 11, config());
    let lock = c.manager.lock("job");
    let lease = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap();
    let token = lease.token().as_str().to_owned();
    c.faults[1].script(
        Op::Extend,
        [Fault::Fail(redlease::NodeErrorKind::Connection)],
    );
    c.faults[2].script(
        Op::Extend,
        [Fault::Fail(redlease::NodeErrorKind::Connection)],
    );
    let err = c
        .sim
        .block_on(async { lease.extend(secs(30)).await })
        .unwrap_err();
    match &err {
        Error::Lost {
            reason: LossReason::ExtendFailed,
            source: Some(q),
            ..
        } => {
            assert_eq!((q.successes, q.required), (1, 2));
            assert_eq!(q.errors.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 2]);
        }
        other => panic!("{other:?}"),
    }
    assert!(std::error::Error::source(&err).is_some());
    assert!(
        c.holders("job", &token).is_empty(),
        "the minority that extended was cleaned up"
    );
    assert!(!lease.is_held());
    let signal = lease.lost();
    assert_eq!(c.sim.block_on(signal), LossReason::ExtendFailed);
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
    assert_eq!(c.nodes[2].pttl("job"), Some(Some(secs(10))));
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
    let mut c = Cluster::new(3, 14, config().operation_timeout(ms(995)));
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
    let mut c = Cluster::new(1, 18, config().attempts(2));
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
    // round lets the others answer for twice the quorum's time. Nodes 0 and 1 answer after 10 ms, node 2
    // after 15 ms: node 2 is extended too.
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

    // A hung node costs twice the quorum's time again, not the operation timeout.
    c.faults[0].script(Op::Extend, [Fault::Delay(ms(10))]);
    c.faults[1].script(Op::Extend, [Fault::Delay(ms(10))]);
    c.faults[2].script(Op::Extend, [Fault::Hang]);
    let start = c.now();
    c.sim
        .block_on(async { lease.extend(secs(20)).await })
        .unwrap();
    assert_eq!(c.now() - start, ms(30));

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
