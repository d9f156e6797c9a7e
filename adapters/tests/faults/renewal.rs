//! Renewal under faults: a stall shorter than the remaining validity makes the lease "at risk" and then held
//! again; a failure that persists makes the loss signal fire by the validity deadline — before anyone else
//! can take the lock.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlease::{Lease, LeaseState, LockManager, LossReason};
use redlease_testkit::proxy::ProxyMode;
use redlease_testkit::server::{RedisServer, RedisServers};

use crate::common::{self, BACKENDS, Proxied, config, key, on_every_server};

const TTL: Duration = Duration::from_millis(1000);
const INTERVAL: Duration = Duration::from_millis(150);
const OP: Duration = Duration::from_millis(100);
const STALL: Duration = Duration::from_millis(400);

/// Waits until a renewal of `lease` has succeeded (its deadline moved), at most one TTL: an ordering, not a
/// guess of how long a renewal takes on a loaded machine.
async fn one_renewal_succeeded(lease: &Lease) {
    let first = lease.valid_until();
    let started = Instant::now();
    while lease.valid_until() == first {
        assert!(
            started.elapsed() < TTL,
            "no renewal succeeded within one TTL"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Inside `lease.run`: stalls the servers for `STALL` with `pause`/`resume`, and returns the states seen
/// (sampled every 5 ms) during the stall and until the lease is held again.
async fn stall_and_watch(
    lease: &Lease,
    pause: impl Fn(),
    resume: impl Fn(),
) -> (Vec<LeaseState>, Option<Duration>) {
    let mut states = Vec::new();
    pause();
    let stalled = Instant::now();
    while stalled.elapsed() < STALL {
        states.push(lease.state());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    resume();
    let resumed = Instant::now();
    let mut recovered = None;
    while resumed.elapsed() < Duration::from_secs(2) {
        let state = lease.state();
        states.push(state);
        if state == LeaseState::Held {
            recovered = Some(resumed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (states, recovered)
}

fn check_transient(what: &str, states: &[LeaseState], recovered: Option<Duration>, lease: &Lease) {
    assert!(
        states.contains(&LeaseState::AtRisk),
        "{what}: never at risk during a {STALL:?} stall: {states:?}"
    );
    assert!(
        !states.iter().any(|s| matches!(s, LeaseState::Lost(_))),
        "{what}: lost during a stall shorter than the validity: {states:?}"
    );
    let recovered = recovered.unwrap_or_else(|| panic!("{what}: not held again: {states:?}"));
    // The next retry (20 ms pause) plus one round, with room for a loaded machine.
    assert!(
        recovered <= Duration::from_millis(20) + OP + Duration::from_millis(400),
        "{what}: held again only after {recovered:?}"
    );
    assert!(!lease.lost().has_ended(), "{what}");
}

#[test]
fn a_stall_shorter_than_the_validity_makes_the_lease_at_risk_then_held_again() {
    on_every_server(
        "a_stall_shorter_than_the_validity_makes_the_lease_at_risk_then_held_again",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            common::preload(&server);
            for backend in BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let manager = LockManager::single(node, config(TTL, OP)).unwrap();
                let k = key("transient", backend);
                let lease = manager
                    .lock(&k)
                    .renew_every(INTERVAL)
                    .try_acquire()
                    .await
                    .unwrap();
                let (states, recovered) = lease
                    .run(async {
                        // Let one renewal succeed first.
                        one_renewal_succeeded(&lease).await;
                        stall_and_watch(&lease, || server.pause(), || server.resume()).await
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
                check_transient(&format!("{backend:?}"), &states, recovered, &lease);
                assert_eq!(common::get(&server, &k), lease.token().as_str());
                lease.release().await.unwrap();
                assert_eq!(common::get(&server, &k), "");
            }
        },
    );
}

#[test]
fn redlock_a_stalled_majority_makes_the_lease_at_risk_then_held_again() {
    on_every_server(
        "redlock_a_stalled_majority_makes_the_lease_at_risk_then_held_again",
        |flavor| async move {
            let servers = RedisServers::start_flavor(flavor, 3);
            for s in servers.iter() {
                common::preload(s);
            }
            for backend in BACKENDS {
                let nodes = common::nodes(backend, &servers.urls()).await;
                let manager = LockManager::redlock_dyn(nodes, config(TTL, OP)).unwrap();
                let k = key("transient-redlock", backend);
                let lease = manager
                    .lock(&k)
                    .renew_every(INTERVAL)
                    .try_acquire()
                    .await
                    .unwrap();
                let (states, recovered) = lease
                    .run(async {
                        one_renewal_succeeded(&lease).await;
                        stall_and_watch(
                            &lease,
                            || {
                                servers[0].pause();
                                servers[1].pause();
                            },
                            || {
                                servers[0].resume();
                                servers[1].resume();
                            },
                        )
                        .await
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
                check_transient(&format!("{backend:?} redlock"), &states, recovered, &lease);
                lease.release().await.unwrap();
                assert_eq!(
                    servers
                        .iter()
                        .map(|s| common::get(s, &k))
                        .collect::<String>(),
                    ""
                );
            }
        },
    );
}

/// Holds the lease through its proxies while they are blackholed on `hung` nodes, with a competitor taking
/// the lock directly on the servers as soon as they let it. Returns (loss reason, when the loss signal
/// fired, the lease's final validity deadline, when the competitor got the lock, whether "at risk" was seen).
async fn persistent_failure(
    set: &Proxied,
    manager: &LockManager,
    competitor: &LockManager,
    k: &str,
    hung: &[usize],
) -> (LossReason, Instant, Instant, Instant, bool) {
    let lease = manager
        .lock(k)
        .renew_every(INTERVAL)
        .try_acquire()
        .await
        .unwrap();
    let signal = lease.lost();
    let competitor_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let stop = Arc::new(AtomicBool::new(false));
    let rival = {
        let (competitor, k, at, stop) = (
            competitor.clone(),
            k.to_owned(),
            Arc::clone(&competitor_at),
            Arc::clone(&stop),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Ok(rival) = competitor.lock(&k).try_acquire().await {
                    *at.lock().unwrap() = Some(Instant::now());
                    let _ = rival.release().await;
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    for &i in hung {
        set.proxies[i].set_mode(ProxyMode::Blackhole);
    }
    let mut at_risk = false;
    // When the work stopped: `run` drops it the moment the lease is lost, then finishes deleting the token
    // (bounded by the operation timeout) before it returns.
    let stopped = StopTime::default();
    let reason = lease
        .run(async {
            let _stopped = stopped.guard();
            tokio::pin!(signal);
            loop {
                tokio::select! {
                    reason = &mut signal => break reason,
                    () = tokio::time::sleep(Duration::from_millis(5)) => {
                        at_risk |= lease.state() == LeaseState::AtRisk;
                    }
                }
            }
        })
        .await;
    let returned_at = Instant::now();
    let lost_at = stopped.at().expect("the work stopped");
    assert!(
        returned_at <= lost_at + OP + Duration::from_millis(300),
        "run returned {:?} after the work stopped: more than its clean-up round",
        returned_at - lost_at
    );
    let reason = match reason {
        Ok(reason) => reason,
        // `run` itself noticed the loss first.
        Err(redlease::Error::Lost { reason, .. }) => reason,
        Err(e) => panic!("{e}"),
    };
    let valid_until = lease.valid_until();
    // The competitor gets the lock once the servers expire our key.
    let deadline = Instant::now() + Duration::from_secs(3);
    while competitor_at.lock().unwrap().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::SeqCst);
    rival.await.unwrap();
    let competitor_at = competitor_at
        .lock()
        .unwrap()
        .expect("the competitor never got the lock");
    (reason, lost_at, valid_until, competitor_at, at_risk)
}

#[test]
fn a_persistent_renewal_failure_fires_the_loss_signal_by_the_deadline_before_anyone_else_acquires()
{
    on_every_server(
        "a_persistent_renewal_failure_fires_the_loss_signal_by_the_deadline_before_anyone_else_acquires",
        |flavor| async move {
            for backend in BACKENDS {
                for (n, hung) in [(1, &[0][..]), (3, &[0, 1][..])] {
                    let set = Proxied::start(flavor, n);
                    // A drift allowance of 5 % (52 ms) is the margin between our deadline and the servers' expiry.
                    let cfg = config(TTL, OP).with_drift_factor(0.05);
                    let through_proxies = common::nodes(backend, &set.urls()).await;
                    let direct =
                        common::nodes(common::Backend::RedisMultiplexed, &set.servers.urls()).await;
                    let (manager, competitor) = if n == 1 {
                        (
                            LockManager::single(Arc::clone(&through_proxies[0]), cfg.clone())
                                .unwrap(),
                            LockManager::single(Arc::clone(&direct[0]), cfg).unwrap(),
                        )
                    } else {
                        (
                            LockManager::redlock_dyn(through_proxies, cfg.clone()).unwrap(),
                            LockManager::redlock_dyn(direct, cfg).unwrap(),
                        )
                    };
                    let what = format!("{backend:?} n={n} hung={hung:?}");
                    let k = key(&format!("persistent-{n}"), backend);
                    let (reason, lost_at, valid_until, competitor_at, at_risk) =
                        persistent_failure(&set, &manager, &competitor, &k, hung).await;
                    assert!(at_risk, "{what}: never at risk before the loss");
                    assert_eq!(reason, LossReason::Expired, "{what}");
                    // The signal fires at the deadline; this task learns of it after a wake-up, for which one
                    // operation timeout is left on a loaded machine...
                    assert!(
                        lost_at <= valid_until + OP,
                        "{what}: lost {:?} after the validity deadline",
                        lost_at - valid_until
                    );
                    // ...and, what matters, strictly before the competitor could take the lock.
                    assert!(
                        lost_at < competitor_at,
                        "{what}: competitor acquired {:?} before our loss signal",
                        lost_at - competitor_at
                    );
                }
            }
        },
    );
}

/// Records when a future holding its guard stopped (completed or was dropped).
#[derive(Default, Clone)]
struct StopTime(Arc<std::sync::Mutex<Option<Instant>>>);

struct StopGuard(StopTime);

impl StopTime {
    fn guard(&self) -> StopGuard {
        StopGuard(self.clone())
    }
    fn at(&self) -> Option<Instant> {
        *self.0.lock().unwrap()
    }
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        *self.0.0.lock().unwrap() = Some(Instant::now());
    }
}
