//! A slow quorum: proxy latency on a majority of three, so that the acquisition round takes longer than the
//! TTL minus the drift allowance. Every node applies the SET, yet the acquisition fails (no validity left) and
//! the clean-up goes to every node.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlease::{LockManager, NotAcquiredReason};
use redlease_testkit::proxy::ProxyMode;

use crate::common::{self, BACKENDS, Proxied, key, not_acquired_reason, on_every_server};

/// Each chunk through a slow proxy waits this long, so a round trip takes at least twice as long (kept under
/// redis-rs' default 500 ms response timeout, so the slow nodes answer rather than fail).
const LATENCY: Duration = Duration::from_millis(200);
const TTL: Duration = Duration::from_millis(1000);
/// With a drift factor of 0.7 the drift allowance is 702 ms: a round longer than 298 ms leaves no validity,
/// while the operation timeout (900 ms) still lets the slow nodes answer.
const DRIFT_FACTOR: f64 = 0.7;
const OP: Duration = Duration::from_millis(900);

#[test]
fn redlock_slow_majority_applies_the_set_but_acquisition_fails_without_validity_and_is_cleaned_everywhere()
 {
    on_every_server(
        "redlock_slow_majority_applies_the_set_but_acquisition_fails_without_validity_and_is_cleaned_everywhere",
        |flavor| async move {
            for backend in BACKENDS {
                let set = Proxied::start(flavor, 3);
                let nodes = common::nodes(backend, &set.urls()).await;
                let cfg = common::config(TTL, OP).with_drift_factor(DRIFT_FACTOR);
                let manager = LockManager::redlock_dyn(nodes, cfg).unwrap();
                let k = key("slow-quorum", backend);
                // Each connection's first acquisition also checks the server (its capabilities, its run_id
                // for the restart quarantine): done here, before the latency, so that the slow round below is
                // one round trip per node (400 ms) and not two, which on a loaded machine could pass OP.
                let warm = manager
                    .lock(format!("{k}:warm-up"))
                    .try_acquire()
                    .await
                    .unwrap_or_else(|e| panic!("{backend:?}: warm-up: {e}"));
                warm.release().await.unwrap();
                set.reset_stats();
                set.proxies[0].set_mode(ProxyMode::Latency(LATENCY));
                set.proxies[1].set_mode(ProxyMode::Latency(LATENCY));

                // Watch every server directly while the acquisition runs: each must hold a value at some point.
                let seen: Arc<Vec<AtomicBool>> =
                    Arc::new((0..3).map(|_| AtomicBool::new(false)).collect());
                let stop = Arc::new(AtomicBool::new(false));
                let ports: Vec<u16> = set.servers.iter().map(|s| s.port()).collect();
                let watcher = {
                    let (seen, stop, k) = (Arc::clone(&seen), Arc::clone(&stop), k.clone());
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::SeqCst) {
                            for (i, port) in ports.iter().enumerate() {
                                if !raw_get(*port, &k).is_empty() {
                                    seen[i].store(true, Ordering::SeqCst);
                                }
                            }
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    })
                };

                let started = Instant::now();
                let err = manager
                    .lock(&k)
                    .try_acquire()
                    .await
                    .expect_err("acquired after the validity was used up");
                let elapsed = started.elapsed();
                stop.store(true, Ordering::SeqCst);
                watcher.join().unwrap();

                assert_eq!(
                    not_acquired_reason(&err),
                    Some(NotAcquiredReason::ValidityExhausted),
                    "{backend:?}: {err}"
                );
                assert!(!err.is_contended(), "{backend:?}");
                assert!(
                    elapsed >= 2 * LATENCY,
                    "{backend:?}: {elapsed:?}: the latency was not applied"
                );
                let seen: Vec<bool> = seen.iter().map(|b| b.load(Ordering::SeqCst)).collect();
                assert_eq!(
                    seen,
                    vec![true; 3],
                    "{backend:?}: the SET did not reach every node"
                );
                // Clean-up went everywhere and was confirmed within its round: nothing is left, and every node ran
                // exactly two scripts (acquire and compare-and-delete).
                assert_eq!(
                    set.values(&k).concat(),
                    "",
                    "{backend:?}: {:?}",
                    set.values(&k)
                );
                assert_eq!(set.lock_calls(), vec![2, 2, 2], "{backend:?}");

                // Without the latency the same lock is acquired normally.
                set.proxies[0].set_mode(ProxyMode::Forward);
                set.proxies[1].set_mode(ProxyMode::Forward);
                let lease = manager.lock(&k).try_acquire().await.unwrap();
                lease.release().await.unwrap();
            }
        },
    );
}

/// `GET key` on a fresh connection to `127.0.0.1:port` (usable from a plain thread).
fn raw_get(port: u16, key: &str) -> String {
    use std::io::{BufRead, BufReader, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len());
    if stream.write_all(request.as_bytes()).is_err() {
        return String::new();
    }
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || !line.starts_with('$') || line.starts_with("$-1") {
        return String::new();
    }
    let mut value = String::new();
    let _ = reader.read_line(&mut value);
    value.trim_end().to_owned()
}
