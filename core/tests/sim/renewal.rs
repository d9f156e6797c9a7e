use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use redlease::{ConfigError, Error, LeaseState, LossReason, NodeErrorKind, Timer};
use redlease_testkit::{Fault, Op};

use crate::support::*;

#[test]
fn auto_renew_holds_a_30s_lease_through_10_minutes_in_the_background() {
    for n in [1usize, 3, 5] {
        let mut c = Cluster::with_spawner(n, 20, config());
        let lock = c.manager.lock("job").auto_renew(secs(10));
        let lease = c
            .sim
            .block_on(async move { lock.try_acquire().await })
            .unwrap();
        let token = lease.token().as_str().to_owned();
        let start = c.now();
        for minute in 1..=10u64 {
            c.sim.run_for(secs(60));
            assert_eq!(lease.state(), LeaseState::Held, "n={n} minute {minute}");
            for node in &c.nodes {
                let left = node.pttl("job").flatten().expect("key with a TTL");
                assert!(
                    left > secs(19),
                    "n={n} minute {minute}: PTTL {left:?} fell below the threshold"
                );
            }
            assert_eq!(c.holders("job", &token).len(), n);
        }
        assert_eq!(c.now() - start, secs(600));
        c.sim.run_for(ms(1));
        // One renewal every 10 s: 60 in 10 minutes (the last at 600 s), on every node.
        assert_eq!(c.faults[0].calls(Op::Extend), 60, "n={n}");
        c.sim
            .block_on(async move { lease.release().await })
            .unwrap();
        assert!(c.holders("job", &token).is_empty());
        let calls = c.calls();
        c.sim.run_for(secs(120));
        assert_eq!(c.calls(), calls, "n={n}: no renewal after release");
        assert!(c.sim.run_until_idle(secs(1)), "the renewal task ended");
    }
}

#[test]
fn scoped_run_renews_without_spawning_and_returns_the_work_result() {
    let mut c = Cluster::new(3, 21, config());
    let clock = c.clock.clone();
    let lock = c.manager.lock("job").renew_every(secs(10));
    let (out, extends) = c.sim.block_on({
        let faults = c.faults[0].clone();
        async move {
            let lease = lock.try_acquire().await.unwrap();
            let out = lease
                .run(async {
                    clock.sleep_until(clock.now() + secs(600)).await;
                    "done"
                })
                .await
                .unwrap();
            let extends = faults.calls(Op::Extend);
            lease.release().await.unwrap();
            (out, extends)
        }
    });
    assert_eq!(out, "done");
    assert_eq!(extends, 60);
    assert_eq!(c.sim.live_tasks(), 0, "nothing was spawned");
    let calls = c.calls();
    c.sim.run_for(secs(60));
    assert_eq!(c.calls(), calls);
}

#[test]
fn transient_renewal_failure_shows_at_risk_then_recovers() {
    for n in [1usize, 3] {
        let mut c = Cluster::with_spawner(n, 22, config());
        let lock = c.manager.lock("job").auto_renew(secs(10));
        let lease = c
            .sim
            .block_on(async move { lock.try_acquire().await })
            .unwrap();
        for f in &c.faults {
            f.script(
                Op::Extend,
                [
                    Fault::Fail(NodeErrorKind::Connection),
                    Fault::Fail(NodeErrorKind::Connection),
                ],
            );
        }
        c.sim.run_for(secs(10) + ms(1));
        assert_eq!(lease.state(), LeaseState::AtRisk, "n={n}");
        assert!(lease.is_held());
        // Retries every 200 ms (the retry delay): the second fails, the third succeeds.
        c.sim.run_for(ms(200));
        assert_eq!(lease.state(), LeaseState::AtRisk, "n={n}");
        c.sim.run_for(ms(200));
        assert_eq!(lease.state(), LeaseState::Held, "n={n}");
        assert_eq!(lease.valid_until(), c.now() - ms(1) + secs(30) - ms(302));
        c.sim.run_for(secs(60));
        assert_eq!(lease.state(), LeaseState::Held);
    }
}

#[test]
fn persistent_renewal_failure_reports_loss_no_later_than_the_validity_deadline() {
    for n in [1usize, 3, 5] {
        for fault in [
            Fault::Fail(NodeErrorKind::Connection),
            Fault::Hang,
            Fault::ReplyLost,
        ] {
            let mut c = Cluster::with_spawner(n, 23, config());
            let lock = c.manager.lock("job").auto_renew(secs(10));
            let lease = c
                .sim
                .block_on(async move { lock.try_acquire().await })
                .unwrap();
            let deadline = lease.valid_until();
            for f in &c.faults {
                f.always(Op::Extend, fault.clone());
            }
            let signal = lease.lost();
            let reason = c.sim.block_on(signal.clone());
            assert_eq!(reason, LossReason::Expired, "n={n} {fault:?}");
            assert!(
                c.now() <= deadline,
                "n={n} {fault:?}: loss signalled after the deadline"
            );
            assert!(
                c.faults[0].calls(Op::Extend) > 1,
                "renewal retried meanwhile"
            );
            // The signal stays fired, for every clone and for new ones.
            assert_eq!(c.sim.block_on(signal), LossReason::Expired);
            assert_eq!(c.sim.block_on(lease.lost()), LossReason::Expired);
            assert_eq!(lease.state(), LeaseState::Lost(LossReason::Expired));
            c.sim.run_for(secs(5));
            let calls = c.faults[0].calls(Op::Extend);
            c.sim.run_for(secs(60));
            assert_eq!(
                c.faults[0].calls(Op::Extend),
                calls,
                "renewal stopped after the loss"
            );
            assert!(matches!(
                c.sim.block_on(async move { lease.release().await }),
                Err(Error::Lost { .. })
            ));
        }
    }
}

#[test]
fn deleted_key_is_reported_lost_at_the_next_renewal() {
    let mut c = Cluster::with_spawner(3, 24, config());
    let lock = c.manager.lock("job").auto_renew(secs(10));
    let lease = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap();
    let start = c.now();
    for node in &c.nodes {
        node.del("job");
    }
    let reason = c.sim.block_on(lease.lost());
    assert_eq!(reason, LossReason::NotHeld);
    assert_eq!(c.now() - start, secs(10), "lost at the first renewal");
}

#[test]
fn run_stops_the_work_when_the_lease_is_lost() {
    let mut c = Cluster::new(1, 25, config());
    let clock = c.clock.clone();
    let node = c.nodes[0].clone();
    let polls = Arc::new(AtomicU32::new(0));
    let lock = c.manager.lock("job").renew_every(secs(10));
    let start = c.now();
    let result = c.sim.block_on({
        let polls = polls.clone();
        async move {
            let lease = lock.try_acquire().await.unwrap();
            let r = lease
                .run(async {
                    loop {
                        polls.fetch_add(1, Ordering::SeqCst);
                        if clock.now() - start > secs(15) {
                            node.set("job", "thief", Some(secs(60)));
                        }
                        clock.sleep_until(clock.now() + secs(1)).await;
                    }
                })
                .await;
            (r.map(|_: ()| ()), lease)
        }
    });
    let (r, lease) = result;
    assert!(
        matches!(
            r,
            Err(Error::Lost {
                reason: LossReason::NotHeld,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(
        c.now() - start,
        secs(20),
        "the renewal at 20 s found the thief"
    );
    let polled = polls.load(Ordering::SeqCst);
    c.sim.run_for(secs(10));
    assert_eq!(polls.load(Ordering::SeqCst), polled, "the work was dropped");
    assert_eq!(c.nodes[0].get("job").as_deref(), Some(&b"thief"[..]));
    drop(lease);
}

#[test]
fn lease_without_renewal_expires_at_its_deadline() {
    // Neither `run` nor background renewal: nothing renews it, and its loss signal fires at the deadline.
    let mut c = Cluster::new(3, 26, config());
    let lock = c.manager.lock("job").expiry(secs(5));
    let lease = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap();
    let deadline = lease.valid_until();
    let calls = c.calls();
    let reason = c.sim.block_on(lease.lost());
    assert_eq!(reason, LossReason::Expired);
    assert_eq!(c.now(), deadline);
    assert_eq!(lease.remaining(), std::time::Duration::ZERO);
    assert_eq!(c.calls(), calls, "nothing was sent");
}

#[test]
fn run_renews_a_lease_without_renew_every_at_a_third_of_its_ttl() {
    // `run` always renews: a 5 s lease runs 60 s of work, renewed every 5/3 s.
    let mut c = Cluster::new(3, 27, config());
    let lock = c.manager.lock("job").expiry(secs(5));
    let lease = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap();
    let clock = c.clock.clone();
    let start = c.now();
    let r = c.sim.block_on(async {
        lease
            .run(async {
                clock.sleep_until(clock.now() + secs(60)).await;
                7
            })
            .await
    });
    assert_eq!(r.unwrap(), 7);
    assert_eq!(c.now() - start, secs(60));
    assert!(lease.is_held());
    let extends = c.faults[0].calls(Op::Extend);
    assert!(
        (34..=37).contains(&extends),
        "{extends} renewals in 60 s at one per 5/3 s"
    );
    c.sim
        .block_on(async move { lease.release().await })
        .unwrap();
}

#[test]
fn auto_renew_without_a_spawner_is_refused_before_anything_is_sent() {
    let mut c = Cluster::new(3, 28, config());
    let lock = c.manager.lock("job").auto_renew(secs(10));
    assert!(matches!(
        lock.validate(),
        Err(Error::Config(ConfigError::AutoRenewWithoutSpawner))
    ));
    let err = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap_err();
    assert!(
        matches!(err, Error::Config(ConfigError::AutoRenewWithoutSpawner)),
        "{err:?}"
    );
    assert!(err.to_string().contains("spawner"), "{err}");
    assert_eq!(c.calls(), 0, "nothing was sent");
}
