//! A lost reply followed by a retry through the manager. The first attempt's write is applied, its reply is
//! lost, its connection cut and the link down for a moment (the proxy); meanwhile the server is made to
//! refuse scripts (an ACL), so the clean-up sent once the link is back is refused (`NOPERM`, a definite
//! refusal: nothing ran) and our token stays on the server; the next attempt of the same acquisition must
//! recognise its own token instead of calling the key contended (or, fenced, issuing a second fencing
//! number). (Where the clean-up's outcome is unknown instead, the retry uses a fresh token by design: see the
//! README's safety model.)

use std::time::{Duration, Instant};

use redlease::LockManager;
use redlease_testkit::proxy::ProxyMode;
use redlease_testkit::server::{Flavor, RedisServer};

use crate::common::{self, Proxied, RECONNECTING, get, key, on_every_server};

const TTL: Duration = Duration::from_secs(10);
/// The clean-up must reach the server, reconnected, and its refusal come back within one round: a round that
/// timed out would make the clean-up's outcome unknown, and the retry would then use a fresh token by design.
/// 800 ms leaves room for the reconnection on a loaded machine (300 ms did not, at a load average of 5).
const OP: Duration = Duration::from_millis(800);
/// The pause before the retry: the window in which the test lifts the ACL after the clean-up was refused (it
/// reacts within milliseconds; the rest is room for a loaded machine). Measured from the start it must
/// also cover attempt 1's round and the clean-up's (`lifted < retry_at` below).
const RETRY_DELAY: Duration = Duration::from_millis(2 * 800 + 900);
/// fred's clean-up never reaches the server while the link is down: with fail-fast it is refused at once,
/// unsent (definite). The link stays down until that clean-up is certainly over: attempt 1's round and the
/// clean-up round are each cut at the operation timeout.
const FRED_LINK_DOWN: Duration = Duration::from_millis(2 * 800 + 700);
/// The retry comes well after the link is back.
const FRED_RETRY_DELAY: Duration = Duration::from_millis(2 * 800 + 700 + 2_000);

/// `rejected_calls` of `EVALSHA`, `EVAL` and `DELIFEQ` (`INFO commandstats`): clean-ups (scripts, or the
/// native release) the server refused before running them.
fn rejected_scripts(server: &RedisServer) -> u64 {
    server
        .cmd(&["INFO", "commandstats"])
        .lines()
        .filter(|l| {
            ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_delifeq:"]
                .iter()
                .any(|c| l.starts_with(c))
        })
        .filter_map(|l| {
            l.split_once("rejected_calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Counts the ended clean-up rounds of failed attempts (the manager's lease events).
#[derive(Clone, Default)]
struct CleanupsSeen(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl CleanupsSeen {
    fn failed_attempts(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl redlease::Observer for CleanupsSeen {
    fn event(&self, event: &redlease::LeaseEvent<'_>) {
        if matches!(
            event.kind,
            redlease::EventKind::Cleanup {
                cause: redlease::CleanupCause::FailedAttempt,
                ..
            }
        ) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

#[test]
fn a_retry_after_a_lost_reply_and_a_refused_clean_up_recognises_its_own_token() {
    on_every_server(
        "a_retry_after_a_lost_reply_and_a_refused_clean_up_recognises_its_own_token",
        |flavor| async move {
            for backend in RECONNECTING {
                for fenced in [false, true] {
                    let set = Proxied::start(flavor, 1);
                    let server = &set.servers[0];
                    let what = format!("{backend:?} fenced={fenced}");
                    let node = common::node(backend, &set.urls()[0]).await;
                    // Exactly one retry: a third attempt would also succeed without recognising the token (the
                    // clean-up after a "contended" second attempt deletes our own key).
                    let fred = matches!(backend, common::Backend::FredClient);
                    let config = common::config(TTL, OP)
                        .with_attempts(2)
                        .with_retry_delay(if fred { FRED_RETRY_DELAY } else { RETRY_DELAY })
                        .with_retry_jitter(0.0);
                    let cleanups = CleanupsSeen::default();
                    let manager = LockManager::single(node, config)
                        .unwrap()
                        .with_observer(cleanups.clone());
                    let k = key(&format!("lost-retry-{fenced}"), backend);
                    let f = k.replace(":lock", ":fence");
                    let mut lock = manager.lock(&k);
                    if fenced {
                        lock = lock.fenced(&f);
                    }
                    // Warm the connection and the script cache, so that the acquisition's first request is its write.
                    // (On keys of their own: deleting a counter this manager drew from would be a fence regression,
                    // which the manager refuses.)
                    let mut warm = manager.lock(format!("{k}:warm"));
                    if fenced {
                        warm = warm.fenced(format!("{f}:warm"));
                    }
                    warm.try_acquire().await.unwrap().release().await.unwrap();
                    let proxy = &set.proxies[0];
                    let rejected = rejected_scripts(server);

                    // The first attempt's write runs; its reply is lost with its connection, and the link is down.
                    if fenced && !common::has_lua(flavor) {
                        // Without Lua the fenced acquisition is three steps, and the first writes nothing: the
                        // reply lost is that of the second, the lock's `SET`.
                        proxy.lose_reply_to_then(b"\r\nSET\r\n", ProxyMode::Refuse);
                    } else {
                        proxy.lose_next_reply_then(ProxyMode::Refuse);
                    }
                    let started = Instant::now();
                    let acquisition = tokio::spawn({
                        let lock = lock.clone();
                        async move { lock.acquire().await }
                    });
                    assert!(
                        common::eventually(Duration::from_secs(5), || proxy.dropped_replies() >= 1)
                            .await,
                        "{what}: no reply was lost"
                    );
                    let on_server = get(server, &k);
                    assert!(
                        !on_server.is_empty(),
                        "{what}: the first write was not applied"
                    );
                    let lifted = if fred {
                        // fred: the clean-up is refused unsent while the link is down; bring it back after that.
                        tokio::time::sleep(FRED_LINK_DOWN.saturating_sub(started.elapsed())).await;
                        proxy.set_mode(ProxyMode::Forward);
                        assert_eq!(
                            rejected_scripts(server),
                            rejected,
                            "{what}: the clean-up reached the server"
                        );
                        started.elapsed()
                    } else {
                        // redis-rs reconnects and sends the clean-up once the link is back: the server now refuses
                        // scripts, so the clean-up is refused (NOPERM), definitely.
                        // (And where Valkey offers it, DELIFEQ: the clean-up's native path.)
                        let mut refuse = vec!["ACL", "SETUSER", "default", "-evalsha", "-eval"];
                        if matches!(flavor, Flavor::Valkey91 | Flavor::Valkey91NoLua) {
                            refuse.push("-delifeq");
                        }
                        server.cmd(&refuse);
                        proxy.set_mode(ProxyMode::Forward);
                        // Lifted only once the clean-up round is over: a refused native delete may be followed,
                        // in the same round, by another way to delete (the adapters try the paths the user may
                        // run), which would succeed once the limit is lifted and rotate the token by design.
                        let over = common::eventually(Duration::from_secs(5), || {
                            cleanups.failed_attempts() >= 1
                        })
                        .await;
                        assert!(over, "{what}: no clean-up round ended");
                        let refused = rejected_scripts(server) > rejected;
                        server.cmd(&["ACL", "SETUSER", "default", "+@all"]);
                        assert!(refused, "{what}: no clean-up was refused");
                        started.elapsed()
                    };

                    let lease = acquisition.await.unwrap().unwrap_or_else(|e| {
                        panic!("{what}: the retry did not recognise its own token: {e}")
                    });
                    let retry_at = if fred { FRED_RETRY_DELAY } else { RETRY_DELAY };
                    assert!(
                        lifted < retry_at,
                        "{what}: the link or the limit came back only after {lifted:?}, maybe after the retry was sent"
                    );
                    assert_eq!(lease.token().as_str(), on_server, "{what}");
                    assert_eq!(get(server, &k), on_server, "{what}");
                    if fenced {
                        // One acquisition, one fencing number: the retry returned the number the lost write issued.
                        assert_eq!(lease.fencing_token(), Some(1), "{what}");
                        assert_eq!(get(server, &f), "1", "{what}");
                    }
                    lease.release().await.unwrap();
                    assert_eq!(get(server, &k), "", "{what}");
                }
            }
        },
    );
}
