//! Redlock with a stalled minority: one of three servers stopped with `SIGSTOP`. Acquisition latency is bounded
//! by the operation timeout, and a lease's validity is counted from the start of its round, so whatever the
//! round took is already gone from it.

use std::time::{Duration, Instant};

use redlease::LockManager;
use redlease_testkit::proxy::{FaultProxy, ProxyMode};
use redlease_testkit::server::RedisServers;

use crate::common::{self, Backend, config, on_every_server};

// Every bound below is an ordering, or leaves a whole share of these settings as room for scheduling on a
// loaded machine: OP_TIMEOUT − 2 × LATENCY (600 ms) for a quorum round, 2 × LATENCY (200 ms) between the
// test's clock reading and the library's, one OP_TIMEOUT for a round bounded by the timeout.
const TTL: Duration = Duration::from_secs(2);
const OP_TIMEOUT: Duration = Duration::from_millis(800);
/// Added by the proxies in front of the two healthy servers, to each request and to each reply.
const LATENCY: Duration = Duration::from_millis(100);

/// The README's drift allowance for a TTL and the default factor 0.01: `ceil(ttl × 0.01) + 2 ms`.
fn drift(ttl: Duration) -> Duration {
    Duration::from_millis((ttl.as_millis() as u64).div_ceil(100) + 2)
}

#[test]
fn redlock_with_a_stalled_minority_is_bounded_by_the_operation_timeout_and_validity_excludes_the_elapsed_time()
 {
    on_every_server(
        "redlock_with_a_stalled_minority_is_bounded_by_the_operation_timeout_and_validity_excludes_the_elapsed_time",
        |flavor| async move {
            for backend in [Backend::RedisMultiplexed, Backend::FredClient] {
                let servers = RedisServers::start_flavor(flavor, 3);
                // Server 0 is reached directly and will be stopped; servers 1 and 2 through latency proxies.
                let proxies: Vec<FaultProxy> = (1..3)
                    .map(|i| FaultProxy::start(servers[i].addr().parse().unwrap()).unwrap())
                    .collect();
                let nodes = vec![
                    common::node(backend, &servers[0].url()).await,
                    common::node(backend, &format!("{}/0", proxies[0].url())).await,
                    common::node(backend, &format!("{}/0", proxies[1].url())).await,
                ];
                let manager =
                    LockManager::redlock_dyn(nodes, config(TTL).with_operation_timeout(OP_TIMEOUT))
                        .unwrap();
                // Warm every connection (fred may finish its handshake lazily) before breaking anything.
                manager
                    .lock("warm:lock")
                    .try_acquire()
                    .await
                    .unwrap()
                    .release()
                    .await
                    .unwrap();

                servers[0].pause();
                for proxy in &proxies {
                    proxy.set_mode(ProxyMode::Latency(LATENCY));
                }

                // 1. The two healthy servers decide the round; it takes the proxies' latency, not the stall.
                let lock = manager.lock("stall:{a}:lock");
                let start = Instant::now();
                let lease = lock.try_acquire().await;
                let end = Instant::now();
                let elapsed = end - start;
                let lease = lease.unwrap_or_else(|e| panic!("{backend:?}: {}", common::chain(&e)));
                assert!(
                    elapsed >= 2 * LATENCY,
                    "{backend:?}: the round took {elapsed:?}, less than the proxies' latency: the test is not testing"
                );
                // Decided by the quorum: the round did not wait for the stalled server until the timeout.
                assert!(
                    elapsed < OP_TIMEOUT,
                    "{backend:?}: {elapsed:?}: the round waited for the stalled server (operation timeout {OP_TIMEOUT:?})"
                );
                // Validity is ttl − drift from the start of the round: what is left on return already excludes the
                // time the round took. A lease measured from the replies, which came at least 2 × LATENCY after the
                // start, would be valid until at least start + 2 × LATENCY + budget.
                let budget = TTL - drift(TTL);
                assert!(
                    lease.valid_until() < start + budget + 2 * LATENCY,
                    "{backend:?}: valid {:?} from the start of a {elapsed:?} round, counted from the replies rather \
             than from the round's start (ttl − drift = {budget:?})",
                    lease.valid_until() - start
                );
                assert!(
                    lease.valid_until() >= start + budget,
                    "{backend:?}: validity {:?} from the start, less than ttl − drift = {budget:?}",
                    lease.valid_until() - start
                );
                for proxy in &proxies {
                    proxy.set_mode(ProxyMode::Forward);
                }
                for i in 1..3 {
                    assert_eq!(
                        servers[i].cmd(&["GET", "stall:{a}:lock"]),
                        lease.token().as_str(),
                        "{backend:?}: server {i}"
                    );
                }
                // Extension and release work on the majority; release waits for the stalled one at most the timeout.
                lease.extend(TTL).await.unwrap();
                let released = Instant::now();
                lease.release().await.unwrap();
                let release_took = released.elapsed();
                // One round bounded by the timeout (a second OP_TIMEOUT as room for scheduling).
                assert!(
                    release_took < 2 * OP_TIMEOUT,
                    "{backend:?}: release took {release_took:?}"
                );

                // 2. One healthy server refuses (foreign value): only the stalled server could still decide, so the
                //    round ends at the operation timeout, and fails without calling it contention.
                servers[1].cmd(&["SET", "stall:{b}:lock", "foreign", "PX", "10000"]);
                let start = Instant::now();
                let err = manager
                    .lock("stall:{b}:lock")
                    .try_acquire()
                    .await
                    .unwrap_err();
                let elapsed = start.elapsed();
                // Two rounds bounded by the timeout (a third OP_TIMEOUT as room for scheduling).
                assert!(
                    elapsed >= OP_TIMEOUT && elapsed < OP_TIMEOUT * 3,
                    "{backend:?}: took {elapsed:?}; expected one round cut at the timeout ({OP_TIMEOUT:?}) plus a clean-up round bounded by it"
                );
                assert!(!err.is_contended(), "{backend:?}: {err}");
                assert_eq!(servers[1].cmd(&["GET", "stall:{b}:lock"]), "foreign");
                assert_eq!(servers[2].cmd(&["EXISTS", "stall:{b}:lock"]), "0");

                // After the resume the stopped server runs what was queued for it: our keys end up deleted or with a
                // TTL no longer than the lease's, never without one.
                servers[0].resume();
                for k in ["stall:{a}:lock", "stall:{b}:lock"] {
                    let pttl: i64 = servers[0].cmd(&["PTTL", k]).parse().unwrap();
                    assert!(
                        pttl == -2 || (0..=TTL.as_millis() as i64).contains(&pttl),
                        "{backend:?}: {k} on the resumed server has PTTL {pttl}"
                    );
                }
                // And the resumed server takes part again: with server 1 stopped now, servers 0 and 2 are the quorum.
                servers[1].pause();
                let lease = manager
                    .lock("stall:{c}:lock")
                    .acquire_within(Duration::from_secs(2))
                    .await;
                servers[1].resume();
                let lease = lease.unwrap_or_else(|e| panic!("{backend:?}: {}", common::chain(&e)));
                for i in [0, 2] {
                    assert_eq!(
                        servers[i].cmd(&["GET", "stall:{c}:lock"]),
                        lease.token().as_str(),
                        "{backend:?}: server {i} after the resume"
                    );
                }
                lease.release().await.unwrap();
            }
        },
    );
}
