//! A hung node (the proxy accepts and never answers): every operation — acquire, extend, release and each
//! renewal round — is bounded by the operation timeout; in Redlock mode the other nodes carry on.

use std::time::{Duration, Instant};

use redlease::{Error, LeaseState, LockManager, NotAcquiredReason};
use redlease_testkit::proxy::ProxyMode;

use crate::common::{
    self, BACKENDS, Proxied, config, get, key, not_acquired_reason, on_every_server, pttl,
};

const OP: Duration = Duration::from_millis(150);
/// Room for scheduling on a loaded machine above the rounds a bound counts.
const SLACK: Duration = Duration::from_millis(400);
/// The Redlock test's operation timeout: "decided without waiting for the hung node" is asserted as
/// "returned before the timeout", which leaves OP_REDLOCK minus two loopback round trips for scheduling.
const OP_REDLOCK: Duration = Duration::from_millis(400);

#[test]
fn hung_single_node_bounds_acquire_extend_release_and_renewal_by_the_operation_timeout() {
    on_every_server(
        "hung_single_node_bounds_acquire_extend_release_and_renewal_by_the_operation_timeout",
        |flavor| async move {
            for backend in BACKENDS {
                let set = Proxied::start(flavor, 1);
                let node = common::node(backend, &set.urls()[0]).await;
                let manager =
                    LockManager::single(node, config(Duration::from_secs(10), OP)).unwrap();
                let renewing = manager
                    .lock(key("hung-renew", backend))
                    .expiry(Duration::from_millis(1000))
                    .renew_every(Duration::from_millis(100));
                let renewed = renewing.try_acquire().await.unwrap();
                let to_extend = manager
                    .lock(key("hung-extend", backend))
                    .try_acquire()
                    .await
                    .unwrap();
                let to_release = manager
                    .lock(key("hung-release", backend))
                    .try_acquire()
                    .await
                    .unwrap();
                set.proxies[0].set_mode(ProxyMode::Blackhole);
                let hung_at = Instant::now();

                // Renewal: each round is cut at the operation timeout, so "at risk" shows within one interval plus
                // one round; the loss fires by the validity deadline.
                let mut at_risk_after = None;
                let result = renewed
                    .run(async {
                        loop {
                            if at_risk_after.is_none() && renewed.state() == LeaseState::AtRisk {
                                at_risk_after = Some(hung_at.elapsed());
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    })
                    .await;
                // `run` stops the work at the loss, then deletes the token (one round, cut at the operation timeout).
                let lost_at = Instant::now() - OP;
                let err = result.expect_err("renewed through a hung node");
                assert!(matches!(err, Error::Lost { .. }), "{backend:?}: {err}");
                let at_risk_after =
                    at_risk_after.unwrap_or_else(|| panic!("{backend:?}: never at risk"));
                assert!(
                    at_risk_after <= Duration::from_millis(100) + OP + SLACK,
                    "{backend:?}: at risk only after {at_risk_after:?}"
                );
                // The signal fires by the deadline; this task learns of it after a wake-up (one OP of room).
                assert!(
                    lost_at <= renewed.valid_until() + OP,
                    "{backend:?}: lost {:?} after the deadline",
                    lost_at - renewed.valid_until()
                );

                // Acquire: one round and one clean-up round, each cut at the operation timeout.
                let started = Instant::now();
                let err = manager
                    .lock(key("hung-acquire", backend))
                    .try_acquire()
                    .await
                    .expect_err("acquired through a hung node");
                let elapsed = started.elapsed();
                assert!(!err.is_contended(), "{backend:?}: {err}");
                assert_eq!(
                    not_acquired_reason(&err),
                    Some(NotAcquiredReason::TooFewNodes)
                );
                assert!(
                    elapsed <= 2 * OP + SLACK,
                    "{backend:?}: acquire took {elapsed:?}"
                );

                // Extend: one round, then the give-up clean-up round.
                let started = Instant::now();
                let err = to_extend
                    .extend(Duration::from_secs(10))
                    .await
                    .expect_err("extended through a hung node");
                let elapsed = started.elapsed();
                // Unanswered is not "gone": the lease is at risk until its deadline, not lost.
                assert!(matches!(err, Error::Quorum(_)), "{backend:?}: {err}");
                assert!(
                    elapsed <= OP + SLACK,
                    "{backend:?}: extend took {elapsed:?}"
                );
                assert!(
                    matches!(to_extend.state(), LeaseState::AtRisk),
                    "{backend:?}: {:?}",
                    to_extend.state()
                );
                assert!(!to_extend.lost().has_ended(), "{backend:?}");

                // Release: one round; the outcome is unknown, which is an error, not a success.
                let started = Instant::now();
                let err = to_release
                    .release()
                    .await
                    .expect_err("released through a hung node");
                let elapsed = started.elapsed();
                assert!(matches!(err, Error::Quorum(_)), "{backend:?}: {err}");
                assert!(
                    elapsed <= OP + SLACK,
                    "{backend:?}: release took {elapsed:?}"
                );

                // The keys the hung node could not clean up still carry their TTL (they expire by themselves).
                for name in ["hung-extend", "hung-release"] {
                    let ms = pttl(&set.servers[0], &key(name, backend));
                    assert!(ms > 0 && ms <= 10_000, "{backend:?} {name}: PTTL {ms}");
                }
            }
        },
    );
}

#[test]
fn redlock_with_a_hung_node_proceeds_with_the_others_and_a_hung_majority_fails_bounded() {
    on_every_server(
        "redlock_with_a_hung_node_proceeds_with_the_others_and_a_hung_majority_fails_bounded",
        |flavor| async move {
            for backend in BACKENDS {
                let set = Proxied::start(flavor, 3);
                let nodes = common::nodes(backend, &set.urls()).await;
                let manager =
                    LockManager::redlock_dyn(nodes, config(Duration::from_secs(2), OP_REDLOCK))
                        .unwrap()
                        .with_spawner(common::tokio_spawner);
                set.proxies[0].set_mode(ProxyMode::Blackhole);
                let k = key("hung-redlock", backend);

                // Acquire and extend are decided by the two live nodes, without waiting for the hung one.
                let started = Instant::now();
                let lease = manager
                    .lock(&k)
                    .expiry(Duration::from_millis(600))
                    .auto_renew(Duration::from_millis(100))
                    .try_acquire()
                    .await
                    .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
                assert!(
                    started.elapsed() < OP_REDLOCK,
                    "{backend:?}: acquire waited for the hung node"
                );
                let token = lease.token().as_str().to_owned();
                assert_eq!(get(&set.servers[1], &k), token);
                assert_eq!(get(&set.servers[2], &k), token);
                assert_eq!(
                    get(&set.servers[0], &k),
                    "",
                    "{backend:?}: the hung node got the request"
                );

                let started = Instant::now();
                lease.extend(Duration::from_secs(2)).await.unwrap();
                assert!(
                    started.elapsed() < OP_REDLOCK,
                    "{backend:?}: extend waited for the hung node"
                );

                // Background renewal keeps the lease held for several TTLs with one node hung.
                let mut states = Vec::new();
                for _ in 0..30 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    states.push(lease.state());
                }
                assert!(
                    states.iter().all(|s| *s == LeaseState::Held),
                    "{backend:?}: {states:?}"
                );
                for i in [1, 2] {
                    let ms = pttl(&set.servers[i], &k);
                    assert!(ms > 0 && ms <= 600, "{backend:?} node {i}: PTTL {ms}");
                }

                // Release waits for every node up to the operation timeout, then succeeds on the majority.
                let started = Instant::now();
                lease.release().await.unwrap();
                let elapsed = started.elapsed();
                assert!(
                    elapsed <= 2 * OP_REDLOCK,
                    "{backend:?}: release took {elapsed:?}"
                );
                assert_eq!(set.values(&k).concat(), "");

                // A hung majority: fails within a round plus a clean-up round, as too few nodes.
                set.proxies[1].set_mode(ProxyMode::Blackhole);
                let k = key("hung-majority", backend);
                let started = Instant::now();
                let err = manager
                    .lock(&k)
                    .try_acquire()
                    .await
                    .expect_err("acquired with a hung majority");
                let elapsed = started.elapsed();
                assert!(!err.is_contended(), "{backend:?}: {err}");
                assert_eq!(
                    not_acquired_reason(&err),
                    Some(NotAcquiredReason::TooFewNodes)
                );
                assert!(
                    elapsed <= 3 * OP_REDLOCK,
                    "{backend:?}: took {elapsed:?} (a round and a clean-up round)"
                );
                assert_eq!(
                    get(&set.servers[2], &k),
                    "",
                    "{backend:?}: live node not cleaned"
                );
            }
        },
    );
}
