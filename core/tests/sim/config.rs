use std::sync::Arc;

use redlease::{Config, ConfigError, Error, LockManager, RedisNode};
use redlease_testkit::{FaultyNode, MemoryNode, Op};

use crate::support::*;

#[test]
fn bad_topologies_are_rejected_at_construction() {
    let nodes = |k: usize| (0..k).map(|_| MemoryNode::new()).collect::<Vec<_>>();
    for k in [0usize, 1, 2, 4, 6] {
        let err = LockManager::redlock(nodes(k), Config::default()).unwrap_err();
        assert!(
            matches!(err, ConfigError::Topology(_)),
            "{k} nodes: {err:?}"
        );
    }
    for k in [3usize, 5, 7] {
        assert_eq!(
            LockManager::redlock(nodes(k), Config::default())
                .unwrap()
                .quorum(),
            k / 2 + 1
        );
    }
    // The same server twice (clones share an endpoint) is not independent.
    let a = MemoryNode::new();
    let err =
        LockManager::redlock(vec![a.clone(), a, MemoryNode::new()], Config::default()).unwrap_err();
    assert!(
        matches!(err, ConfigError::Topology(ref m) if m.contains("endpoint")),
        "{err:?}"
    );
    // The same node object twice.
    let shared: Arc<dyn RedisNode> = Arc::new(MemoryNode::new());
    let err = LockManager::redlock_dyn(
        vec![shared.clone(), shared, Arc::new(MemoryNode::new())],
        Config::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::Topology(_)));
}

#[test]
fn invalid_configuration_is_rejected_at_construction() {
    let bad = [
        Config::default().with_expiry(secs(0)),
        Config::default().with_expiry(ms(2)),
        Config::default().with_expiry(std::time::Duration::MAX),
        Config::default().with_attempts(0),
        Config::default().with_retry_delay(secs(0)),
        Config::default().with_drift_factor(1.0),
        Config::default().with_drift_factor(-0.5),
        Config::default().with_retry_jitter(2.0),
        Config::default().with_operation_timeout(secs(0)),
        Config::default().with_operation_timeout(secs(30)),
    ];
    for config in bad {
        assert!(
            LockManager::single(MemoryNode::new(), config.clone()).is_err(),
            "{config:?}"
        );
    }
}

#[test]
fn bad_lock_descriptions_fail_before_any_command_is_sent() {
    let mut c = Cluster::new(1, 30, config());
    let m = c.manager.clone();
    let cases: Vec<(redlease::Lock, &str)> = vec![
        (m.lock(""), "empty key"),
        (m.lock("k").fenced(""), "empty fence key"),
        (m.lock("k").fenced("k"), "fence key equal to lock key"),
        (m.lock("k").expiry(secs(0)), "zero expiry"),
        (m.lock("k").expiry(ms(1)), "1 ms expiry"),
        (
            m.lock("k").expiry(ms(400)).auto_renew(ms(400)),
            "renewal interval equal to expiry",
        ),
        (m.lock("k").auto_renew(secs(0)), "zero renewal interval"),
    ];
    for (lock, what) in cases {
        assert!(matches!(lock.validate(), Err(Error::Config(_))), "{what}");
        let r = c.sim.block_on(async move { lock.acquire().await });
        assert!(matches!(r, Err(Error::Config(_))), "{what}: {r:?}");
    }
    assert_eq!(c.calls(), 0, "nothing was sent");
    // Extend validates its TTL the same way.
    let lock = c.manager.lock("ok");
    let lease = c.sim.block_on(async move { lock.acquire().await }).unwrap();
    let before = c.faults[0].calls(Op::Extend);
    for bad in [secs(0), ms(3), std::time::Duration::MAX] {
        let r = c.sim.block_on(async { lease.extend(bad).await });
        assert!(matches!(r, Err(Error::Config(_))), "{bad:?}: {r:?}");
    }
    assert_eq!(c.faults[0].calls(Op::Extend), before);
    assert!(
        lease.is_held(),
        "a rejected extension does not touch the lease"
    );
}

#[test]
fn a_key_over_the_size_limit_is_refused_before_any_command_is_sent() {
    let mut c = Cluster::new(1, 32, config());
    let huge = "k".repeat(2 << 20); // 2 MB
    let at_limit = "k".repeat(redlease::MAX_KEY_BYTES);
    let m = c.manager.clone();
    for (lock, which) in [
        (m.lock(huge.as_str()), "lock"),
        (m.lock("k").fenced(huge.as_str()), "fence"),
        (m.lock(format!("{at_limit}x")), "lock"),
    ] {
        let r = c.sim.block_on(async move { lock.try_acquire().await });
        let Err(Error::Config(redlease::ConfigError::KeyTooLong { which: w, len, max })) = &r
        else {
            panic!("{which}: {r:?}")
        };
        assert_eq!((*w, *max), (which, redlease::MAX_KEY_BYTES));
        assert!(*len > *max);
        let text = r.unwrap_err().to_string();
        assert!(text.len() < 100, "the message is short: {text}");
    }
    let r = c.sim.block_on(m.raise_fence(&huge, 7));
    assert!(
        matches!(
            r,
            Err(Error::Config(redlease::ConfigError::KeyTooLong { .. }))
        ),
        "{r:?}"
    );
    assert_eq!(c.calls(), 0, "nothing was sent");
    // A key of exactly the limit is sent.
    let lock = m.lock(at_limit);
    assert!(
        c.sim
            .block_on(async move { lock.try_acquire().await })
            .is_ok()
    );
}

#[test]
fn fencing_is_refused_in_redlock_mode() {
    let mut c = Cluster::new(3, 31, config());
    let lock = c.manager.lock("k").fenced("k:fence");
    assert!(matches!(lock.validate(), Err(Error::FencingUnsupported)));
    let r = c.try_acquire(&lock);
    assert!(matches!(r, Err(Error::FencingUnsupported)));
    assert_eq!(c.calls(), 0);
}

#[test]
fn ttl_edges_acquire_without_panicking() {
    // 4 and 5 ms leave 1-2 ms of validity after the 3 ms drift allowance; the operation timeout is ttl/5.
    for ms_ in [4u64, 5] {
        let mut c = Cluster::new(3, 32, config());
        let lock = c.manager.lock("k").expiry(ms(ms_));
        let lease = c
            .sim
            .block_on(async move { lock.try_acquire().await })
            .unwrap();
        assert_eq!(lease.valid_until() - c.now(), ms(ms_ - 3));
        c.sim.block_on(lease.lost());
        assert!(!lease.is_held());
    }
    // The largest TTL works and its deadline does not overflow.
    let mut c = Cluster::new(1, 33, config());
    let lock = c.manager.lock("k").expiry(redlease::Ttl::MAX.as_duration());
    let lease = c
        .sim
        .block_on(async move { lock.try_acquire().await })
        .unwrap();
    assert!(lease.remaining() > secs(3600 * 24 * 365 * 1000));
}

#[test]
fn node_errors_keep_their_source_chain() {
    let node = MemoryNode::new();
    let (faulty, faults) = FaultyNode::new(node, redlease::SystemTimer);
    faults.always_all(redlease_testkit::Fault::Fail(redlease::NodeErrorKind::Auth));
    let m = LockManager::single(faulty, Config::default()).unwrap();
    let err = redlease_testkit::block_on(m.lock("k").try_acquire()).unwrap_err();
    let Error::NotAcquired {
        last_error: Some(q),
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(q.errors[0].1.kind(), redlease::NodeErrorKind::Auth);
    let source = std::error::Error::source(&err).expect("quorum error");
    let node_err = source.source().expect("node error");
    assert!(node_err.to_string().contains("authentication"));
}

/// The acquisition futures a caller holds (and a task stores) stay small: the driver keeps one copy of what
/// crosses an await (the lease id and operation timeout live in its tokens), its rounds box only their node
/// calls. The bounds are the sizes when this test was written: `try_acquire` 1 000 B (the issue asks for at
/// most 1 016 B; it had grown to 1 048 B), `acquire_within` 1 016 B (it also keeps its watches and hint).
/// Since the acquisition's request travels as one value (`AcquireRequest`): 984 B and 1 000 B.
#[test]
fn acquisition_futures_stay_within_their_size_bound() {
    let manager = LockManager::single(MemoryNode::new(), Config::default()).unwrap();
    let lock = manager.lock("size");
    let sizes = [
        (
            "try_acquire",
            std::mem::size_of_val(&lock.try_acquire()),
            1_016,
        ),
        (
            "acquire_within",
            std::mem::size_of_val(&lock.acquire_within(std::time::Duration::from_secs(1))),
            1_016,
        ),
    ];
    for (what, size, bound) in sizes {
        eprintln!("the {what} future: {size} B (bound {bound} B)");
        assert!(
            size <= bound,
            "the {what} future is {size} B (bound {bound} B)"
        );
    }
}
