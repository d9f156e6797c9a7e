//! Extension under partial failure in Redlock mode: with a slow minority it succeeds on the majority; with a
//! majority slow or hung it fails, the lease is lost at once, and its token is deleted wherever a node still
//! answers (the slow node's late extension is followed by the clean-up, so it never outlives it).

use std::time::{Duration, Instant};

use redlease::{Error, LeaseState, LockManager, LossReason};
use redlease_testkit::proxy::ProxyMode;

use crate::common::{self, BACKENDS, Proxied, config, get, key, on_every_server, pttl};

const TTL: Duration = Duration::from_millis(1500);
/// "Decided by the healthy nodes" is asserted as "returned before the operation timeout": this leaves
/// OP minus two loopback round trips as room for scheduling on a loaded machine.
const OP: Duration = Duration::from_millis(400);
/// Longer than the operation timeout: a node behind this latency misses every round.
const SLOW: Duration = Duration::from_millis(800);
const SLACK: Duration = Duration::from_millis(400);

#[test]
fn redlock_extend_succeeds_with_a_slow_minority_and_fails_lost_and_cleaned_with_a_faulty_majority()
{
    on_every_server(
        "redlock_extend_succeeds_with_a_slow_minority_and_fails_lost_and_cleaned_with_a_faulty_majority",
        |flavor| async move {
            for backend in BACKENDS {
                let set = Proxied::start(flavor, 3);
                let nodes = common::nodes(backend, &set.urls()).await;
                let manager = LockManager::redlock_dyn(nodes, config(TTL, OP)).unwrap();
                let k = key("extend-partial", backend);
                let lease = manager.lock(&k).try_acquire().await.unwrap();
                let token = lease.token().as_str().to_owned();
                // The acquisition returns at a quorum; the third write lands within its round.
                assert!(
                    common::eventually(OP, || set.values(&k) == vec![token.clone(); 3]).await,
                    "{backend:?}: {:?}",
                    set.values(&k)
                );

                // Slow minority: the extension is decided by the two healthy nodes.
                set.proxies[0].set_mode(ProxyMode::Latency(SLOW));
                let before = lease.valid_until();
                let started = Instant::now();
                lease
                    .extend(Duration::from_secs(5))
                    .await
                    .unwrap_or_else(|e| panic!("{backend:?}: extend with a slow minority: {e}"));
                assert!(
                    started.elapsed() < OP,
                    "{backend:?}: waited for the slow node"
                );
                assert!(
                    lease.valid_until() > before + Duration::from_secs(3),
                    "{backend:?}"
                );
                for i in [1, 2] {
                    let ms = pttl(&set.servers[i], &k);
                    assert!(ms > 4000 && ms <= 5000, "{backend:?} node {i}: PTTL {ms}");
                }
                assert_eq!(lease.state(), LeaseState::Held);

                // Faulty majority: node 0 still slow, node 1 hung. The extension fails within a round plus the
                // give-up clean-up round; the lease is lost at once.
                set.proxies[1].set_mode(ProxyMode::Blackhole);
                let signal = lease.lost();
                let started = Instant::now();
                let err = lease
                    .extend(Duration::from_secs(5))
                    .await
                    .expect_err("extended without a majority");
                let elapsed = started.elapsed();
                assert!(
                    matches!(
                        err,
                        Error::Lost {
                            reason: LossReason::ExtendFailed,
                            ..
                        }
                    ),
                    "{backend:?}: {err}"
                );
                assert!(elapsed <= 2 * OP + SLACK, "{backend:?}: took {elapsed:?}");
                assert_eq!(
                    lease.state(),
                    LeaseState::Lost(LossReason::ExtendFailed),
                    "{backend:?}"
                );
                assert!(
                    signal.is_lost(),
                    "{backend:?}: the loss signal did not fire"
                );
                assert_eq!(
                    tokio::time::timeout(Duration::from_millis(100), signal).await,
                    Ok(LossReason::ExtendFailed)
                );
                // The healthy minority node was cleaned by the give-up round itself.
                assert_eq!(
                    get(&set.servers[2], &k),
                    "",
                    "{backend:?}: healthy node not cleaned"
                );
                // The slow node receives the late extension and then the clean-up, in order: it ends empty.
                assert!(
                    common::eventually(Duration::from_secs(3), || get(&set.servers[0], &k)
                        .is_empty())
                    .await,
                    "{backend:?}: slow node still holds {:?}",
                    get(&set.servers[0], &k)
                );
                // The hung node never saw the failed extension: it keeps the earlier 5 s TTL and expires by itself.
                assert_eq!(get(&set.servers[1], &k), token, "{backend:?}");
                let ms = pttl(&set.servers[1], &k);
                assert!(ms > 0 && ms <= 5000, "{backend:?}: hung node PTTL {ms}");
                // A later release reports the loss.
                let err = lease.release().await.expect_err("released a lost lease");
                assert!(err.is_lost(), "{backend:?}: {err}");
            }
        },
    );
}
