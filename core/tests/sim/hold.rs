//! Hold limits (`Lock::max_hold`): renewal stops at the limit and the lease ends there with a reason of its
//! own, at the boundary, batched, with Redlock, inside `run`.

use std::time::{Duration, Instant};

use redlease::{ConfigError, Error, LeaseState, LossReason, Timer};
use redlease_testkit::Op;

use crate::support::*;

/// The validity one zero-latency round of a `ttl` lease gives (the TTL less the drift allowance), measured on
/// a lease of a throwaway key.
fn validity_of_one_round(c: &mut Cluster, ttl: Duration) -> Duration {
    let lock = c.manager.lock("probe").expiry(ttl);
    let start = c.now();
    let lease = c.try_acquire(&lock).unwrap();
    let validity = lease.valid_until() - start;
    c.sim
        .block_on(async move { lease.release().await })
        .unwrap();
    validity
}

fn extends(c: &Cluster) -> u64 {
    c.faults[0].calls(Op::Extend)
}

/// Renewal every second of a 3 s lease whose limit falls exactly where a renewal's validity ends (`extra`
/// zero: that renewal covers the limit, none follows) or 1 ms beyond (one more renewal is needed). Either
/// way the lease ends at the limit to the millisecond, with `HoldLimit`, and its key is deleted there.
fn ends_at_the_limit(n: usize, batched: bool, extra: Duration) {
    let cfg = if batched {
        config().with_renewal_batching(ms(5), 100)
    } else {
        config()
    };
    let mut c = Cluster::with_spawner(n, 71, cfg);
    let ttl = secs(3);
    let validity = validity_of_one_round(&mut c, ttl);
    let limit = secs(7) + validity + extra;
    let lock = c
        .manager
        .lock("job")
        .expiry(ttl)
        .auto_renew(secs(1))
        .max_hold(limit);
    let before = extends(&c);
    let start = c.now();
    let lease = c.try_acquire(&lock).unwrap();
    let token = lease.token().as_str().to_owned();
    let signal = lease.lost();
    assert!(lease.valid_until() <= start + limit);

    c.sim.run_for(limit - ms(1));
    assert_eq!(lease.state(), LeaseState::Held, "n={n} batched={batched}");
    assert_eq!(c.holders("job", &token).len(), n, "held everywhere");
    assert_eq!(
        lease.valid_until(),
        start + limit,
        "believed valid up to the limit and no further"
    );
    // Renewed at 1 s … 7 s; the renewal at 7 s covers the limit exactly, or falls 1 ms short of it.
    let renewals = if extra.is_zero() { 7 } else { 8 };
    assert_eq!(
        extends(&c) - before,
        renewals,
        "n={n} batched={batched} extra={extra:?}"
    );

    c.sim.run_for(ms(1));
    assert_eq!(c.now(), start + limit);
    assert_eq!(lease.state(), LeaseState::Lost(LossReason::HoldLimit));
    assert_eq!(c.sim.block_on(signal), LossReason::HoldLimit);
    assert_eq!(c.now(), start + limit, "the signal fired at the limit");
    // The renewer deleted the key at the limit (zero latency: at once), so the next holder need not wait.
    c.sim.run_for(ms(1));
    assert!(
        c.holders("job", &token).is_empty(),
        "n={n} batched={batched}"
    );
    let other = c.manager.lock("job").expiry(ttl);
    assert!(c.try_acquire(&other).is_ok(), "another holder at once");
    // No renewal at or after the limit.
    let after = extends(&c);
    c.sim.run_for(secs(30));
    assert_eq!(extends(&c), after, "renewal stopped at the limit");
    match c.sim.block_on(async move { lease.release().await }) {
        Err(Error::Lost {
            reason: LossReason::HoldLimit,
            ..
        }) => {}
        other => panic!("release after the limit: {other:?}"),
    }
}

#[test]
fn a_renewal_that_covers_the_limit_exactly_is_the_last_and_the_lease_ends_at_the_limit() {
    for n in [1, 3] {
        ends_at_the_limit(n, false, Duration::ZERO);
    }
}

#[test]
fn a_limit_one_millisecond_past_a_renewals_validity_takes_one_more_renewal_and_ends_at_the_limit() {
    for n in [1, 3] {
        ends_at_the_limit(n, false, ms(1));
    }
}

#[test]
fn a_batched_lease_ends_at_its_hold_limit_like_one_renewed_alone() {
    for n in [1, 3] {
        ends_at_the_limit(n, true, Duration::ZERO);
        ends_at_the_limit(n, true, ms(1));
    }
}

#[test]
fn run_drops_stuck_work_at_the_hold_limit_and_deletes_the_key() {
    for n in [1, 3] {
        let mut c = Cluster::new(n, 72, config());
        let clock = c.clock.clone();
        let lock = c
            .manager
            .lock("job")
            .expiry(secs(3))
            .renew_every(secs(1))
            .max_hold(secs(10));
        let start = c.now();
        let (result, ended, nodes) = c.sim.block_on({
            let nodes = c.nodes.clone();
            async move {
                let lease = lock.try_acquire().await.unwrap();
                let result = lease.run(std::future::pending::<()>()).await;
                let ended = clock.now();
                let token = lease.token().as_str().to_owned();
                let mut holding = 0;
                for node in &nodes {
                    if value_of(node, "job").await.as_deref() == Some(token.as_bytes()) {
                        holding += 1;
                    }
                }
                (result, ended, holding)
            }
        });
        match result {
            Err(Error::Lost {
                reason: LossReason::HoldLimit,
                ..
            }) => {}
            other => panic!("n={n}: {other:?}"),
        }
        assert_eq!(ended, start + secs(10), "n={n}: stopped at the limit");
        assert_eq!(nodes, 0, "n={n}: run deleted the key before returning");
        assert_eq!(c.sim.live_tasks(), 0, "nothing was spawned");
    }
}

#[test]
fn a_manual_extension_never_moves_the_deadline_past_the_hold_limit() {
    let mut c = Cluster::new(1, 73, config());
    let lock = c.manager.lock("job").max_hold(secs(10));
    let start = c.now();
    let lease = c.try_acquire(&lock).unwrap();
    assert_eq!(lease.valid_until(), start + secs(10), "30 s TTL, capped");
    c.sim.run_for(secs(5));
    c.sim
        .block_on(lease.extend(secs(60)))
        .expect("extended on the node");
    assert_eq!(lease.valid_until(), start + secs(10));
    c.sim.run_for(secs(5));
    assert_eq!(lease.state(), LeaseState::Lost(LossReason::HoldLimit));
    match c.sim.block_on(lease.extend(secs(60))) {
        Err(Error::Lost {
            reason: LossReason::HoldLimit,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_managers_default_hold_limit_applies_and_a_lock_overrides_it() {
    let mut c = Cluster::new(1, 74, config().with_max_hold(Some(secs(4))));
    let start = c.now();
    let lease = c.try_acquire(&c.manager.lock("a")).unwrap();
    assert_eq!(lease.valid_until(), start + secs(4));
    let lock = c.manager.lock("b").max_hold(secs(8));
    assert_eq!(lock.effective_max_hold(), Some(secs(8)));
    let lease = c.try_acquire(&lock).unwrap();
    assert_eq!(lease.valid_until(), start + secs(8));
    // Without a limit: the TTL less the drift allowance.
    let mut free = Cluster::new(1, 74, config());
    let lease = free.try_acquire(&free.manager.lock("a")).unwrap();
    assert!(lease.valid_until() > free.now() + secs(29));
}

#[test]
fn a_zero_hold_limit_is_refused_before_anything_is_sent() {
    let mut c = Cluster::new(1, 75, config());
    let lock = c.manager.lock("job").max_hold(Duration::ZERO);
    assert!(matches!(
        lock.validate(),
        Err(Error::Config(ConfigError::ZeroDuration {
            field: "max_hold"
        }))
    ));
    assert!(matches!(
        c.try_acquire(&lock),
        Err(Error::Config(ConfigError::ZeroDuration {
            field: "max_hold"
        }))
    ));
    assert_eq!(c.calls(), 0);
    assert!(matches!(
        config().with_max_hold(Some(Duration::ZERO)).validate(),
        Err(ConfigError::ZeroDuration { field: "max_hold" })
    ));
}

#[test]
fn an_unrenewed_lease_reports_the_hold_limit_at_the_limit_not_an_expiry() {
    let mut c = Cluster::new(3, 76, config());
    let lock = c.manager.lock("job").max_hold(secs(2));
    let start: Instant = c.now();
    let lease = c.try_acquire(&lock).unwrap();
    let signal = lease.lost();
    assert_eq!(c.sim.block_on(signal), LossReason::HoldLimit);
    assert_eq!(c.clock.now(), start + secs(2));
}
