//! Extension under partial failure in Redlock mode: with a slow minority it succeeds on the majority; with a
//! majority slow or hung it fails without proving the lease gone, so the lease stays held until its deadline,
//! at risk, and a retry succeeds once a majority answers again.

use std::time::{Duration, Instant};

use redlease::{Error, LeaseState, LockManager};
use redlease_testkit::proxy::ProxyMode;

use crate::common::{self, BACKENDS, Proxied, config, get, key, on_every_server, pttl};

const TTL: Duration = Duration::from_millis(3000);
/// The operation timeout: long enough that a round decided by the healthy nodes ends well before it.
const OP: Duration = Duration::from_millis(1000);
/// Longer than the operation timeout: a node behind this latency misses every round, and its reply comes
/// back no earlier than this (so a round that returns sooner was decided without it).
const SLOW: Duration = Duration::from_millis(1200);
/// What the extensions ask for.
const EXTENDED: Duration = Duration::from_secs(8);
const SLACK: Duration = Duration::from_millis(400);

#[test]
fn redlock_extend_succeeds_with_a_slow_minority_and_fails_at_risk_and_retryable_with_a_faulty_majority()
 {
    on_every_server(
        "redlock_extend_succeeds_with_a_slow_minority_and_fails_at_risk_and_retryable_with_a_faulty_majority",
        |flavor| async move {
            for backend in BACKENDS {
                let set = Proxied::start(flavor, 3);
                let nodes = common::nodes(backend, &set.urls()).await;
                let manager = LockManager::redlock_dyn(nodes, config(TTL, OP)).unwrap();
                let k = key("extend-partial", backend);
                // The scenario needs the key on all three nodes. The acquisition returns at a quorum and
                // abandons the third call, which redis-rs does not send if its connection had not written
                // it yet (a loaded machine): then acquire again (see `common::LANDED_WITHIN`).
                let mut tries = 0;
                let (lease, token) = loop {
                    tries += 1;
                    let lease = manager.lock(&k).try_acquire().await.unwrap();
                    let token = lease.token().as_str().to_owned();
                    let landed = common::eventually(common::LANDED_WITHIN, || {
                        set.values(&k) == vec![token.clone(); 3]
                    })
                    .await;
                    if landed {
                        break (lease, token);
                    }
                    assert!(
                        tries < common::LANDING_TRIES,
                        "{backend:?}: {tries} acquisitions, never on all three nodes: {:?}",
                        set.values(&k)
                    );
                    eprintln!(
                        "{backend:?}: acquisition {tries} never reached a node (abandoned unsent); again"
                    );
                    lease.release().await.unwrap();
                };

                // Slow minority: the extension is decided by the two healthy nodes.
                set.proxies[0].set_mode(ProxyMode::Latency(SLOW));
                let before = lease.valid_until();
                let started = Instant::now();
                lease
                    .extend(EXTENDED)
                    .await
                    .unwrap_or_else(|e| panic!("{backend:?}: extend with a slow minority: {e}"));
                // Decided by the healthy nodes: before the operation timeout (the quorum's time plus the
                // straggler grace, at most three times the quorum's time; a 1 s timeout leaves room for a
                // loaded machine), whereas waiting for the slow node would last the whole round.
                let took = started.elapsed();
                assert!(took < OP, "{backend:?}: waited {took:?} for the slow node");
                assert!(
                    lease.valid_until() > before + Duration::from_secs(3),
                    "{backend:?}"
                );
                for i in [1, 2] {
                    let ms = pttl(&set.servers[i], &k);
                    assert!(ms > 7000 && ms <= 8000, "{backend:?} node {i}: PTTL {ms}");
                }
                assert_eq!(lease.state(), LeaseState::Held);
                if !common::has_lua(flavor) {
                    // Without Lua an extension is three round trips (`WATCH`, `GET`, `MULTI PEXPIRE … GT
                    // EXEC`: no single native command compares the token and never shortens the key), and a
                    // node slower than the operation timeout never gets past the first inside a round: the
                    // round's end drops the rest unsent, so node 0 keeps the acquisition's TTL and loses the
                    // key before the retry below could count it (with Lua, the one script lands late and
                    // extends it). What holds here: the slow node was never half-extended.
                    let ms = pttl(&set.servers[0], &k);
                    assert!(
                        ms <= TTL.as_millis() as i64,
                        "{backend:?} node 0: PTTL {ms}"
                    );
                    lease.release().await.unwrap();
                    continue;
                }

                // Faulty majority: node 0 still slow, node 1 hung. The extension fails within one round, but no
                // reply proved the lease gone: it stays held until its deadline, at risk, and can be retried.
                set.proxies[1].set_mode(ProxyMode::Blackhole);
                let signal = lease.lost();
                let deadline = lease.valid_until();
                let started = Instant::now();
                let err = lease
                    .extend(EXTENDED)
                    .await
                    .expect_err("extended without a majority");
                let elapsed = started.elapsed();
                assert!(matches!(err, Error::Quorum(_)), "{backend:?}: {err:?}");
                assert!(elapsed <= OP + SLACK, "{backend:?}: took {elapsed:?}");
                assert!(
                    matches!(lease.state(), LeaseState::AtRisk),
                    "{backend:?}: {:?}",
                    lease.state()
                );
                assert_eq!(lease.valid_until(), deadline, "{backend:?}");
                assert!(!signal.has_ended(), "{backend:?}: the loss signal fired");
                // Nothing was deleted: the healthy node holds our token.
                assert_eq!(get(&set.servers[2], &k), token, "{backend:?}");

                // The slow node recovers: the retry is decided by nodes 0 and 2, and the lease is held again.
                set.proxies[0].set_mode(ProxyMode::Forward);
                // The failed round's request and reply may still be in the slow proxy for up to SLOW each
                // way, and node 0's connection delivers replies in order: give the backlog 2 × SLOW to drain
                // (the lease is valid for about 8 s from the first extension; 2–5 s of it have passed).
                tokio::time::sleep(2 * SLOW).await;
                assert!(
                    lease.valid_until() > Instant::now(),
                    "{backend:?}: the lease ran out before the retry"
                );
                lease.extend(EXTENDED).await.unwrap_or_else(|e| {
                    panic!("{backend:?}: retry after the slow node recovered: {e}")
                });
                assert_eq!(lease.state(), LeaseState::Held, "{backend:?}");
                assert!(lease.valid_until() > deadline, "{backend:?}");
                for i in [0, 2] {
                    let ms = pttl(&set.servers[i], &k);
                    assert!(ms > 7000 && ms <= 8000, "{backend:?} node {i}: PTTL {ms}");
                }
                // The hung node never saw either failed extension: it keeps the earlier 8 s TTL at most.
                assert_eq!(get(&set.servers[1], &k), token, "{backend:?}");
                let report = lease
                    .release()
                    .await
                    .unwrap_or_else(|e| panic!("{backend:?}: release: {e}"));
                assert!(report.deleted() >= 2, "{backend:?}: {report:?}");
                for i in [0, 2] {
                    assert_eq!(get(&set.servers[i], &k), "", "{backend:?} node {i}");
                }
            }
        },
    );
}
