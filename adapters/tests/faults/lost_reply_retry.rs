//! A lost reply followed by a retry through the manager: the first attempt's write is applied but its reply
//! is lost, the clean-up after it never arrives, and the next attempt of the same acquisition must recognise
//! its own token instead of calling the key contended (or, fenced, issuing a second fencing number).

use std::time::{Duration, Instant};

use redlease::LockManager;
use redlease_testkit::proxy::ProxyMode;

use crate::common::{self, Proxied, RECONNECTING, get, key};

const TTL: Duration = Duration::from_secs(10);
const OP: Duration = Duration::from_millis(200);
/// The pause before the retry: the window in which the test heals the link (it reacts within milliseconds;
/// the rest is room for a loaded machine).
const RETRY_DELAY: Duration = Duration::from_millis(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_reply_recognises_its_own_token_through_the_manager() {
    for backend in RECONNECTING {
        for fenced in [false, true] {
            let Some(set) = Proxied::start_or_skip(
                "a_retry_after_a_lost_reply_recognises_its_own_token_through_the_manager",
                1,
            ) else {
                return;
            };
            let what = format!("{backend:?} fenced={fenced}");
            let node = common::node(backend, &set.urls()[0]).await;
            // Exactly one retry: a third attempt would also succeed without recognising the token (the
            // clean-up after a "contended" second attempt deletes our own key).
            let config = common::config(TTL, OP)
                .attempts(2)
                .retry_delay(RETRY_DELAY)
                .retry_jitter(0.0);
            let manager = LockManager::single(node, config).unwrap();
            let k = key(&format!("lost-retry-{fenced}"), backend);
            let f = k.replace(":lock", ":fence");
            let mut lock = manager.lock(&k);
            if fenced {
                lock = lock.fenced(&f);
            }
            // Warm the connection, so that the first request of the acquisition is its write.
            lock.try_acquire().await.unwrap().release().await.unwrap();
            set.servers[0].cmd(&["DEL", &f]);
            let proxy = &set.proxies[0];

            // The first attempt's write runs, its reply is lost, and then the link swallows requests.
            proxy.lose_next_reply_then(ProxyMode::Blackhole);
            let started = Instant::now();
            let acquisition = tokio::spawn({
                let lock = lock.clone();
                async move { lock.acquire().await }
            });
            // The clean-up after the failed attempt is swallowed: then the link heals (connections cut,
            // as a real network does to a stalled stream) and the retry goes through.
            let swallowed =
                common::eventually(Duration::from_secs(5), || proxy.swallowed_requests() >= 1)
                    .await;
            assert!(
                swallowed,
                "{what}: no clean-up was sent after the lost reply"
            );
            proxy.set_mode(ProxyMode::Forward);
            proxy.reset();
            let healed = started.elapsed();
            assert_eq!(proxy.dropped_replies(), 1, "{what}");
            // Our first attempt's token is on the server, though the client never learned it.
            let on_server = get(&set.servers[0], &k);
            assert!(
                !on_server.is_empty(),
                "{what}: the first write was not applied"
            );

            let lease = acquisition.await.unwrap().unwrap_or_else(|e| {
                panic!("{what}: the retry did not recognise its own token: {e}")
            });
            assert!(
                healed < OP + RETRY_DELAY,
                "{what}: healed only after {healed:?}, maybe after the retry was sent"
            );
            assert_eq!(lease.token().as_str(), on_server, "{what}");
            assert_eq!(get(&set.servers[0], &k), on_server, "{what}");
            if fenced {
                // One acquisition, one fencing number: the retry returned the number the lost write issued.
                assert_eq!(lease.fencing_token(), Some(1), "{what}");
                assert_eq!(get(&set.servers[0], &f), "1", "{what}");
            }
            lease.release().await.unwrap();
            assert_eq!(get(&set.servers[0], &k), "", "{what}");
        }
    }
}
