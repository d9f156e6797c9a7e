//! Replies lost after execution in Redlock mode (the proxy forwards requests and drops replies) on a
//! minority and on a majority of three servers. The single-node case is in the live tests
//! (`live::ambiguity`).

use std::time::{Duration, Instant};

use redlease::{LockManager, NotAcquiredReason};
use redlease_testkit::proxy::ProxyMode;

use crate::common::{self, Backend, Proxied, config, key, not_acquired_reason, on_every_server};

const TTL: Duration = Duration::from_secs(10);
const OP: Duration = Duration::from_millis(200);
const SLACK: Duration = Duration::from_millis(400);

#[test]
fn redlock_lost_replies_on_a_minority_still_acquire_and_release_and_on_a_majority_fail_ambiguous_and_clean_up()
 {
    on_every_server(
        "redlock_lost_replies_on_a_minority_still_acquire_and_release_and_on_a_majority_fail_ambiguous_and_clean_up",
        |flavor| async move {
            for backend in [
                Backend::RedisMultiplexed,
                Backend::RedisManager,
                Backend::FredClient,
                Backend::FredPool,
            ] {
                // Fresh servers and proxies per backend: a dropped reply leaves a connection that must be cut.
                let set = Proxied::start(flavor, 3);
                let nodes = common::nodes(backend, &set.urls()).await;
                let manager = LockManager::redlock_dyn(nodes, config(TTL, OP)).unwrap();

                // Minority: node 0 executes everything but its replies vanish.
                set.proxies[0].set_mode(ProxyMode::DropReplies);
                // The scenario needs the silent node to have applied the acquisition: its call is abandoned at
                // the quorum, and redis-rs drops it unsent if not yet written (see `common::LANDED_WITHIN`);
                // then acquire again, on another key.
                let mut tries = 0;
                let (k, lease) = loop {
                    tries += 1;
                    let k = key(&format!("lost-minority-{tries}"), backend);
                    set.reset_stats();
                    let started = Instant::now();
                    let lease = manager.lock(&k).try_acquire().await.unwrap_or_else(|e| {
                        panic!("{backend:?}: one lost reply out of three: {e}")
                    });
                    assert!(
                        started.elapsed() < OP,
                        "{backend:?}: waited for the silent node"
                    );
                    let token = lease.token().as_str().to_owned();
                    // The silent node did apply the acquisition.
                    let applied = common::eventually(common::LANDED_WITHIN, || {
                        set.values(&k) == vec![token.clone(); 3]
                    })
                    .await;
                    if applied {
                        break (k, lease);
                    }
                    assert!(
                        tries < common::LANDING_TRIES,
                        "{backend:?}: {tries} acquisitions, the silent node applied none: {:?}",
                        set.values(&k)
                    );
                    eprintln!(
                        "{backend:?}: acquisition {tries} never reached the silent node (abandoned unsent); again"
                    );
                    lease.release().await.unwrap();
                };
                // Release waits for every node up to the operation timeout, succeeds on the majority, and the silent
                // node deletes the key too.
                let started = Instant::now();
                lease
                    .release()
                    .await
                    .unwrap_or_else(|e| panic!("{backend:?}: release with one lost reply: {e}"));
                let elapsed = started.elapsed();
                assert!(
                    elapsed <= OP + SLACK,
                    "{backend:?}: release took {elapsed:?}"
                );
                assert!(
                    common::eventually(Duration::from_secs(2), || set
                        .values(&k)
                        .concat()
                        .is_empty())
                    .await,
                    "{backend:?}: left {:?}",
                    set.values(&k)
                );
                // Each node ran exactly acquire + release: nothing was re-sent.
                assert_eq!(set.lock_calls(), vec![2, 2, 2], "{backend:?}");

                // Majority: nodes 0 and 1 execute but never answer.
                let k = key("lost-majority", backend);
                set.reset_stats();
                set.proxies[1].set_mode(ProxyMode::DropReplies);
                let started = Instant::now();
                let err = manager
                    .lock(&k)
                    .try_acquire()
                    .await
                    .expect_err("acquired without a majority of replies");
                let elapsed = started.elapsed();
                assert!(!err.is_contended(), "{backend:?}: {err}");
                assert_eq!(
                    not_acquired_reason(&err),
                    Some(NotAcquiredReason::TooFewNodes),
                    "{backend:?}: {err}"
                );
                assert!(
                    common::any_ambiguous(&err),
                    "{backend:?}: lost replies are ambiguous: {err}"
                );
                assert!(
                    elapsed <= 2 * OP + SLACK,
                    "{backend:?}: took {elapsed:?} (round + clean-up)"
                );
                // The clean-up went to every node that may have applied the acquisition (all three): the silent
                // nodes executed it too, so nothing of ours is left, and nothing ran twice.
                assert!(
                    common::eventually(Duration::from_secs(2), || set
                        .values(&k)
                        .concat()
                        .is_empty())
                    .await,
                    "{backend:?}: left {:?}",
                    set.values(&k)
                );
                assert_eq!(set.lock_calls(), vec![2, 2, 2], "{backend:?}");

                // Heal: forward again and cut the connections that lost replies. Reconnecting clients work again;
                // a redis-rs MultiplexedConnection never reconnects (documented), so it is not healed.
                for p in &set.proxies {
                    p.set_mode(ProxyMode::Forward);
                    p.reset();
                }
                if backend == Backend::RedisMultiplexed {
                    continue;
                }
                let deadline = Instant::now() + Duration::from_secs(3);
                let lease = loop {
                    match manager.lock(&k).try_acquire().await {
                        Ok(lease) => break lease,
                        Err(e) => {
                            assert!(
                                !e.is_contended(),
                                "{backend:?}: a free key is contended: {e}"
                            );
                            assert!(Instant::now() < deadline, "{backend:?}: never healed: {e}");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                };
                let ours = set
                    .values(&k)
                    .iter()
                    .filter(|v| *v == lease.token().as_str())
                    .count();
                assert!(
                    ours >= 2,
                    "{backend:?}: our token on {ours} nodes after healing"
                );
                lease.release().await.unwrap();
            }
        },
    );
}
