//! Leased semaphores on real servers (issue 25): `RedisNode::permit` through both clients on every
//! single-server setup (scripts, and `WATCH`/`MULTI` without Lua), and a Redlock semaphore whose quorum is
//! every node.

use std::io::BufRead;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::notify::channel;
use redlease::{Config, LockManager, NodeErrorKind, PermitOp, RedisNode, Token, Ttl};
use redlease_adapters::Commands;
use redlease_testkit::server::{RedisServer, RedisServers};

use crate::common::{self, ALL_BACKENDS, Backend, config, on_every_server, on_servers};
use crate::push::{eventually, numsub};

/// How many holders the semaphore at `key` has on `server` (expired ones included until purged).
fn members(server: &RedisServer, key: &str) -> usize {
    server.cmd(&["ZCARD", key]).trim().parse().unwrap()
}

#[test]
fn every_node_answers_permit_operations_on_every_server() {
    // The conformance case returns early for a node that answers `Unsupported`; this one does not.
    on_every_server(
        "every_node_answers_permit_operations_on_every_server",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let k = common::key("permit-supported", backend);
                let token = Token::random().unwrap();
                let ttl = Ttl::from_millis(5_000).unwrap();
                let one = PermitOp::Acquire { permits: 1 };
                let r = node.permit(&k, &token, ttl, one).await;
                assert_eq!(
                    r.unwrap(),
                    redlease::PermitReply::Done,
                    "{flavor} {backend:?}"
                );
                // A sorted set scored by the server's clock; the key expires with its latest permit.
                let score: u64 = server.cmd(&["ZSCORE", &k, token.as_str()]).parse().unwrap();
                let time = server.cmd(&["TIME"]);
                let secs: u64 = time.lines().next().unwrap().trim().parse().unwrap();
                let left = score.saturating_sub(secs * 1000);
                assert!(
                    (3_000..=6_000).contains(&left),
                    "{flavor} {backend:?}: expiry {left} ms ahead of the server's time"
                );
                let pttl: i64 = server.cmd(&["PTTL", &k]).parse().unwrap();
                assert!(
                    (4_000..=5_000).contains(&pttl),
                    "{flavor} {backend:?}: PTTL {pttl}"
                );
                let r = node.permit(&k, &token, ttl, PermitOp::Release).await;
                assert_eq!(r.unwrap(), redlease::PermitReply::Done);
                assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{flavor} {backend:?}");
                // A key of another type: a typed, permanent refusal before anything is written.
                server.cmd(&["SET", &k, "not-a-semaphore"]);
                let err = node.permit(&k, &token, ttl, one).await.unwrap_err();
                assert_eq!(err.kind(), NodeErrorKind::WrongType, "{flavor} {backend:?}");
                assert!(!err.is_ambiguous(), "{flavor} {backend:?}: {err}");
                for op in [PermitOp::Extend, PermitOp::Release] {
                    let r = node.permit(&k, &token, ttl, op).await.unwrap();
                    assert_eq!(r, redlease::PermitReply::NotHeld, "{flavor} {backend:?}");
                }
                assert_eq!(server.cmd(&["GET", &k]), "not-a-semaphore");
                assert_eq!(server.cmd(&["PTTL", &k]), "-1", "{flavor} {backend:?}");
            }
        },
    );
}

#[test]
fn ten_concurrent_acquisitions_of_three_permits_give_exactly_three() {
    on_every_server(
        "ten_concurrent_acquisitions_of_three_permits_give_exactly_three",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in ALL_BACKENDS {
                // Two connections, so that the acquisitions also race between clients.
                let mut managers = Vec::new();
                for _ in 0..2 {
                    let node = common::node(backend, &server.url()).await;
                    managers
                        .push(LockManager::single(node, config(Duration::from_secs(10))).unwrap());
                }
                let key = common::key("ten-of-three", backend);
                let tasks: Vec<_> = (0..10)
                    .map(|i| {
                        let semaphore = managers[i % 2].semaphore(key.clone(), 3).unwrap();
                        tokio::spawn(async move { semaphore.try_acquire().await })
                    })
                    .collect();
                let mut leases = Vec::new();
                let mut contended = 0;
                for task in tasks {
                    match task.await.unwrap() {
                        Ok(lease) => leases.push(lease),
                        Err(err) if err.is_contended() => contended += 1,
                        Err(err) => panic!("{flavor} {backend:?}: {}", common::chain(&err)),
                    }
                }
                assert_eq!(leases.len(), 3, "{flavor} {backend:?}: holders");
                assert_eq!(contended, 7, "{flavor} {backend:?}");
                assert_eq!(members(&server, &key), 3, "{flavor} {backend:?}");
                for lease in leases {
                    let token = lease.token().as_str().to_owned();
                    assert_ne!(server.cmd(&["ZSCORE", &key, &token]), "");
                    lease.release().await.unwrap();
                }
                assert_eq!(server.cmd(&["EXISTS", &key]), "0", "{flavor} {backend:?}");
            }
        },
    );
}

#[test]
fn a_released_permit_wakes_a_waiter_promptly() {
    on_every_server(
        "a_released_permit_wakes_a_waiter_promptly",
        |flavor| async move {
            // Polling so slow, and permits so long, that only the release's notification explains a prompt
            // wake-up.
            let expiry = Duration::from_secs(10);
            let slow = Config::default()
                .with_expiry(expiry)
                .with_retry_delay(Duration::from_secs(30))
                .with_retry_jitter(0.0)
                .with_max_retry_delay(Duration::from_secs(30));
            let bound = expiry / 5;
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in ALL_BACKENDS {
                let holders =
                    LockManager::single(common::node(backend, &server.url()).await, slow.clone())
                        .unwrap();
                let waiters =
                    LockManager::single(common::node(backend, &server.url()).await, slow.clone())
                        .unwrap();
                let key = common::key("wake", backend);
                let held = holders.semaphore(key.clone(), 2).unwrap();
                let first = held.try_acquire().await.unwrap();
                let second = held.try_acquire().await.unwrap();
                let waiting = waiters.semaphore(key.clone(), 2).unwrap();
                let waiter = tokio::spawn(async move {
                    let lease = waiting
                        .acquire_within(Duration::from_secs(8))
                        .await
                        .unwrap();
                    (Instant::now(), lease)
                });
                assert!(
                    eventually(Duration::from_secs(3), || numsub(
                        &server,
                        false,
                        &channel(&key)
                    ) == 1)
                    .await,
                    "{flavor} {backend:?}: the waiter subscribed"
                );
                // Let the attempt that the confirmed subscription triggers find the semaphore full.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let released = Instant::now();
                first.release().await.unwrap();
                let (at, lease) = tokio::time::timeout(Duration::from_secs(9), waiter)
                    .await
                    .expect("the waiter took the permit")
                    .unwrap();
                let waited = at - released;
                eprintln!(
                    "semaphore: {flavor} {backend:?}: the waiter took the permit {waited:?} after the release"
                );
                assert!(
                    waited < bound,
                    "{flavor} {backend:?}: woken {waited:?} after the release (bound {bound:?})"
                );
                assert_eq!(members(&server, &key), 2);
                lease.release().await.unwrap();
                second.release().await.unwrap();
                assert_eq!(server.cmd(&["EXISTS", &key]), "0", "{flavor} {backend:?}");
            }
        },
    );
}

/// The environment variable that makes [`a_killed_holders_permit_comes_back_within_its_ttl`] (and
/// [`a_killed_reader_or_writer_frees_its_share_within_its_ttl`]) the holder process:
/// `<url> <backend> <key> <permit|read|write>`.
const HOLDER_ENV: &str = "REDLEASE_SEMAPHORE_HOLDER";

/// The holder process: takes the one permit (or a read or the write share of a read/write lock), renews it
/// while "working" forever, and says so on stdout.
async fn hold_forever(spec: &str) {
    let mut parts = spec.split(' ');
    let (url, backend, key, kind) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let backend = ALL_BACKENDS
        .into_iter()
        .find(|b| format!("{b:?}") == backend)
        .unwrap();
    let node = common::node(backend, url).await;
    let manager = LockManager::single(node, config(KILL_TTL)).unwrap();
    let lock = share(&manager, key, kind).renew_every(KILL_TTL / 4);
    let lease = lock.try_acquire().await.unwrap();
    let lost = lease
        .run(async {
            // On a line of its own: the test harness has printed "test … … " without a newline.
            println!("\nredlease-semaphore-holder: HELD");
            std::future::pending::<()>().await;
        })
        .await;
    panic!("the holder lost its permit while alive: {lost:?}");
}

/// What the holder of the kill tests takes at `key`: the one permit of a semaphore (`permit`), or a read
/// (`read`) or the write share (`write`) of a read/write lock.
enum Share {
    Permit(redlease::Semaphore),
    Rw(redlease::Lock),
}

fn share(manager: &LockManager, key: &str, kind: &str) -> Share {
    match kind {
        "read" => Share::Rw(manager.rw_lock(key).read().clone()),
        "write" => Share::Rw(manager.rw_lock(key).write().clone()),
        _ => Share::Permit(manager.semaphore(key, 1).unwrap()),
    }
}

impl Share {
    fn renew_every(self, interval: Duration) -> Self {
        match self {
            Self::Permit(s) => Self::Permit(s.renew_every(interval)),
            Self::Rw(l) => Self::Rw(l.renew_every(interval)),
        }
    }

    async fn try_acquire(&self) -> Result<redlease::Lease, redlease::Error> {
        match self {
            Self::Permit(s) => s.try_acquire().await,
            Self::Rw(l) => l.try_acquire().await,
        }
    }
}

/// Whether an acquisition failed only because its node call exceeded the operation timeout.
fn timed_out(err: &redlease::Error) -> bool {
    common::first_node_error(err).is_some_and(|e| e.kind() == NodeErrorKind::Timeout)
}

/// The permits' TTL in the kill test.
const KILL_TTL: Duration = Duration::from_millis(1000);

/// One holder process of `backend` on `server` (`kind`: see [`share`]), killed while it renews its share:
/// how long after the kill the share came back (a contender — another permit, a writer for a read share,
/// a reader for the write share — got it). `test` is the test that runs the holder in the child.
async fn killed_holder(
    server: &RedisServer,
    backend: Backend,
    exe: &std::path::Path,
    (test, kind): (&str, &str),
) -> Duration {
    let flavor = server.flavor();
    let key = common::key(&format!("killed-{kind}"), backend);
    let mut child = std::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(
            HOLDER_ENV,
            format!("{} {backend:?} {key} {kind}", server.url()),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let held = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line == "redlease-semaphore-holder: HELD")
    });
    let held = tokio::time::timeout(Duration::from_secs(20), held)
        .await
        .expect("the holder took its permit")
        .unwrap();
    assert!(held, "{flavor} {backend:?}: the holder never held");
    let manager =
        LockManager::single(common::node(backend, &server.url()).await, config(KILL_TTL)).unwrap();
    let contender = match kind {
        "read" => "write",
        "write" => "read",
        other => other,
    };
    let semaphore = share(&manager, &key, contender);
    // Alive, the holder renews: its share outlasts its TTL.
    tokio::time::sleep(KILL_TTL * 3 / 2).await;
    let err = semaphore.try_acquire().await.unwrap_err();
    assert!(err.is_contended(), "{flavor} {backend:?}: {err}");
    child.kill().unwrap();
    let killed = Instant::now();
    child.wait().unwrap();
    let lease = loop {
        match semaphore.try_acquire().await {
            Ok(lease) => break lease,
            Err(err) if err.is_contended() => {}
            // A round that exceeded the operation timeout on the loaded machine (all servers' holders and
            // contenders run at once): polled again; the bound below still holds it to one round.
            Err(err) if timed_out(&err) => {
                eprintln!("{flavor} {backend:?}: {}", common::chain(&err))
            }
            Err(err) => panic!("{flavor} {backend:?}: {}", common::chain(&err)),
        }
        assert!(
            killed.elapsed() < KILL_TTL * 3,
            "{flavor} {backend:?}: the permit never came back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let back = killed.elapsed();
    lease.release().await.unwrap();
    back
}

#[test]
fn a_killed_holders_permit_comes_back_within_its_ttl() {
    if let Ok(spec) = std::env::var(HOLDER_ENV) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(hold_forever(&spec));
        return;
    }
    let exe = std::env::current_exe().unwrap();
    on_every_server(
        "a_killed_holders_permit_comes_back_within_its_ttl",
        |flavor| {
            let exe = exe.clone();
            async move {
                let server = RedisServer::start_flavor(flavor, &[]);
                // One holder process per backend, all at once.
                let what = (
                    "semaphore::a_killed_holders_permit_comes_back_within_its_ttl",
                    "permit",
                );
                let hold = |i: usize| killed_holder(&server, ALL_BACKENDS[i], &exe, what);
                let (a, b, c, d) = tokio::join!(hold(0), hold(1), hold(2), hold(3));
                let backs = [a, b, c, d];
                // Back by its expiry: within the TTL, plus at most one polling attempt (bounded by the
                // operation timeout) and its pause; and not at once (nothing released it: it expired, at
                // least a TTL less one renewal interval after its last renewal).
                let op = config(KILL_TTL).operation_timeout_for(KILL_TTL);
                let bound = KILL_TTL + op + Duration::from_millis(10);
                for (backend, back) in ALL_BACKENDS.iter().zip(backs) {
                    eprintln!(
                        "semaphore: {flavor} {backend:?}: a killed holder's permit came back {back:?} after \
                         the kill (TTL {KILL_TTL:?}, renewed every {:?})",
                        KILL_TTL / 4
                    );
                    assert!(
                        back <= bound,
                        "{flavor} {backend:?}: back {back:?} after the kill (TTL {KILL_TTL:?}, bound {bound:?})"
                    );
                    assert!(
                        back >= KILL_TTL / 2,
                        "{flavor} {backend:?}: back {back:?} after the kill, before it could expire"
                    );
                }
            }
        },
    );
}

#[test]
fn a_killed_reader_or_writer_frees_its_share_within_its_ttl() {
    const TEST: &str = "semaphore::a_killed_reader_or_writer_frees_its_share_within_its_ttl";
    if let Ok(spec) = std::env::var(HOLDER_ENV) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(hold_forever(&spec));
        return;
    }
    let exe = std::env::current_exe().unwrap();
    // Every server: without Lua the shares are the watched transactions' entries.
    on_every_server(TEST, |flavor| {
        let exe = exe.clone();
        async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for kind in ["read", "write"] {
                // One holder process per backend, all at once.
                let hold = |i: usize| killed_holder(&server, ALL_BACKENDS[i], &exe, (TEST, kind));
                let (a, b, c, d) = tokio::join!(hold(0), hold(1), hold(2), hold(3));
                // As for a permit: back by its expiry, within the TTL plus one polling attempt and its
                // pause, and not before it could expire.
                let op = config(KILL_TTL).operation_timeout_for(KILL_TTL);
                let bound = KILL_TTL + op + Duration::from_millis(10);
                for (backend, back) in ALL_BACKENDS.iter().zip([a, b, c, d]) {
                    eprintln!(
                        "rw: {flavor} {backend:?}: a killed {kind} holder's share came back {back:?} after \
                         the kill (TTL {KILL_TTL:?}, renewed every {:?})",
                        KILL_TTL / 4
                    );
                    assert!(
                        back <= bound,
                        "{flavor} {backend:?} {kind}: back {back:?} after the kill (bound {bound:?})"
                    );
                    assert!(
                        back >= KILL_TTL / 2,
                        "{flavor} {backend:?} {kind}: back {back:?}, before it could expire"
                    );
                }
            }
        }
    });
}

#[test]
fn a_redlock_semaphore_of_two_permits_over_three_servers_needs_all_three() {
    on_every_server(
        "a_redlock_semaphore_of_two_permits_over_three_servers_needs_all_three",
        |flavor| async move {
            // One set of servers for every backend (their keys are distinct).
            let servers = RedisServers::start_flavor(flavor, 3);
            for backend in ALL_BACKENDS {
                let mut nodes: Vec<Arc<dyn RedisNode>> = Vec::new();
                for server in servers.iter() {
                    nodes.push(common::node(backend, &server.url()).await);
                }
                let cfg = config(Duration::from_secs(10))
                    .with_operation_timeout(Duration::from_millis(500));
                let manager = LockManager::redlock_dyn(nodes, cfg).unwrap();
                assert_eq!(redlease::semaphore_quorum(3, 2), Some(3));
                let key = common::key("redlock-two", backend);
                let semaphore = manager.semaphore(key.clone(), 2).unwrap();
                let a = semaphore.try_acquire().await.unwrap();
                let b = semaphore.try_acquire().await.unwrap();
                // Each permit is held on every node (the quorum is all three).
                for (i, server) in servers.iter().enumerate() {
                    for lease in [&a, &b] {
                        let score = server.cmd(&["ZSCORE", &key, lease.token().as_str()]);
                        assert_ne!(score, "", "{flavor} {backend:?}: node {i}");
                    }
                }
                let err = semaphore.try_acquire().await.unwrap_err();
                assert!(err.is_contended(), "{flavor} {backend:?}: {err}");
                a.release().await.unwrap();
                // A foreign permit on one node fills it: the other two have room, a majority that would admit
                // a third holder with a lock's quorum, but not all three.
                let time = servers[2].cmd(&["TIME"]);
                let secs: u64 = time.lines().next().unwrap().trim().parse().unwrap();
                let far = (secs * 1000 + 60_000).to_string();
                servers[2].cmd(&["ZADD", &key, &far, "foreign"]);
                let err = semaphore.try_acquire().await.unwrap_err();
                assert!(err.is_contended(), "{flavor} {backend:?}: {err}");
                for (i, server) in servers.iter().enumerate() {
                    let expected = if i == 2 { 2 } else { 1 };
                    assert_eq!(
                        members(server, &key),
                        expected,
                        "{flavor} {backend:?}: node {i}: nothing of the failed attempt left"
                    );
                }
                // The foreign permit gone: a second holder again, on all three.
                servers[2].cmd(&["ZREM", &key, "foreign"]);
                let c = semaphore.try_acquire().await.unwrap();
                for server in servers.iter() {
                    assert_ne!(server.cmd(&["ZSCORE", &key, c.token().as_str()]), "");
                }
                c.release().await.unwrap();
                b.release().await.unwrap();
                for server in servers.iter() {
                    assert_eq!(server.cmd(&["EXISTS", &key]), "0", "{flavor} {backend:?}");
                }
            }
        },
    );
}

#[test]
fn permits_survive_a_script_flush_and_are_renewed_and_released_under_oom() {
    on_every_server(
        "permits_survive_a_script_flush_and_are_renewed_and_released_under_oom",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let ttl = Ttl::from_millis(5_000).unwrap();
            let two = PermitOp::Acquire { permits: 2 };
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let k = common::key("flush-oom", backend);
                let token = Token::random().unwrap();
                // A flushed script cache: loaded again (NOSCRIPT → EVAL) and run once.
                server.cmd(&["SCRIPT", "FLUSH"]);
                let r = node.permit(&k, &token, ttl, two).await.unwrap();
                assert_eq!(r, redlease::PermitReply::Done, "{flavor} {backend:?}");
                assert_eq!(members(&server, &k), 1, "{flavor} {backend:?}");
                server.cmd(&["SCRIPT", "FLUSH"]);
                let r = node
                    .permit(&k, &token, ttl, PermitOp::Extend)
                    .await
                    .unwrap();
                assert_eq!(r, redlease::PermitReply::Done, "{flavor} {backend:?}");

                // Out of memory: a new permit is refused (definitely); the holder's renewal and release
                // still work where Lua runs (without it, `ZADD` cannot run under OOM at all).
                server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
                let other = Token::random().unwrap();
                let err = node.permit(&k, &other, ttl, two).await.unwrap_err();
                assert_eq!(
                    err.kind(),
                    NodeErrorKind::OutOfMemory,
                    "{flavor} {backend:?}: {err}"
                );
                assert!(!err.is_ambiguous(), "{flavor} {backend:?}: {err}");
                assert_eq!(members(&server, &k), 1, "{flavor} {backend:?}");
                let long = Ttl::from_millis(60_000).unwrap();
                let extended = node.permit(&k, &token, long, PermitOp::Extend).await;
                let pttl: i64 = server.cmd(&["PTTL", &k]).parse().unwrap();
                if common::has_lua(flavor) {
                    assert_eq!(
                        extended.unwrap(),
                        redlease::PermitReply::Done,
                        "{flavor} {backend:?}: extend under OOM"
                    );
                    assert!(pttl > 50_000, "{flavor} {backend:?}: PTTL {pttl}");
                } else {
                    let err = extended.unwrap_err();
                    assert_eq!(
                        err.kind(),
                        NodeErrorKind::OutOfMemory,
                        "{flavor} {backend:?}"
                    );
                    assert!(!err.is_ambiguous(), "{flavor} {backend:?}: {err}");
                    assert!(pttl <= 5_000, "{flavor} {backend:?}: PTTL {pttl}");
                }
                let r = node.permit(&k, &token, ttl, PermitOp::Release).await;
                assert_eq!(
                    r.unwrap(),
                    redlease::PermitReply::Done,
                    "{flavor} {backend:?}: release under OOM"
                );
                assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{flavor} {backend:?}");
                server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
            }
        },
    );
}

#[test]
fn a_fenced_writer_takes_a_larger_fence_with_each_grant_on_every_server() {
    on_every_server(
        "a_fenced_writer_takes_a_larger_fence_with_each_grant_on_every_server",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let manager = LockManager::single(node, config(Duration::from_secs(5))).unwrap();
                let key = common::key("fenced-writer", backend);
                let fence = common::fence_of(&key);
                let rw = manager.rw_lock(key.clone()).fenced(fence.clone());
                // Without Lua too: the counter's INCR is in the EXEC that grants the writer the lock.
                let first = rw.write().try_acquire().await.unwrap();
                assert_eq!(first.fencing_token(), Some(1), "{flavor} {backend:?}");
                assert_eq!(server.cmd(&["GET", &fence]), "1");
                // A reader and a second writer are turned away; the counter does not move.
                assert!(rw.read().try_acquire().await.unwrap_err().is_contended());
                assert!(rw.write().try_acquire().await.unwrap_err().is_contended());
                assert_eq!(server.cmd(&["GET", &fence]), "1", "{flavor} {backend:?}");
                first.extend(Duration::from_secs(5)).await.unwrap();
                assert_eq!(first.fencing_token(), Some(1));
                first.release().await.unwrap();
                let reader = rw.read().try_acquire().await.unwrap();
                assert_eq!(reader.fencing_token(), None, "{flavor} {backend:?}");
                reader.release().await.unwrap();
                // A counter raised by hand: the next writer goes above it.
                server.cmd(&["SET", &fence, "41"]);
                let second = rw.write().try_acquire().await.unwrap();
                assert_eq!(second.fencing_token(), Some(42), "{flavor} {backend:?}");
                second.release().await.unwrap();
                // A counter with a TTL is refused before anything is written.
                server.cmd(&["PEXPIRE", &fence, "60000"]);
                let err = rw.write().try_acquire().await.unwrap_err();
                let node_err = common::first_node_error(&err).unwrap();
                assert_eq!(
                    node_err.kind(),
                    NodeErrorKind::Fence,
                    "{flavor} {backend:?}: {err}"
                );
                assert_eq!(server.cmd(&["EXISTS", &key]), "0", "{flavor} {backend:?}");
            }
        },
    );
}

/// `calls` of `EVALSHA` from `INFO commandstats`.
fn evalsha_calls(server: &RedisServer) -> u64 {
    let info = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .map_or(0, |v| v.parse().unwrap())
}

#[test]
fn permits_renew_in_one_batch_per_wave_on_every_server() {
    on_every_server(
        "permits_renew_in_one_batch_per_wave_on_every_server",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            // Without Lua each permit's extension is a watched transaction of its own, through the node's
            // gate one at a time: a batch of 20 outlasted a 200 ms round (TTL / 5) in CI's loaded live lane
            // and lost permits. Three times the TTL there (the same number of waves).
            let ttl = Duration::from_millis(if common::has_lua(flavor) { 1000 } else { 3000 });
            let interval = ttl / 4;
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let cfg = config(ttl).with_renewal_batching(Duration::from_millis(20), 100);
                let manager = LockManager::single(node, cfg)
                    .unwrap()
                    .with_spawner(redlease_adapters::runtime::TokioSpawner::current().unwrap());
                let key = common::key("batched-permits", backend);
                let api = manager
                    .semaphore(key.clone(), 20)
                    .unwrap()
                    .auto_renew(interval);
                // All at once: acquisitions further apart than the batching window renew in batches of their
                // own, which stay apart. One after another on a loaded machine they spread over several
                // windows (72 calls in 13 waves were seen), which is not what this test measures.
                let tasks: Vec<_> = (0..20)
                    .map(|_| {
                        let api = api.clone();
                        tokio::spawn(async move { api.try_acquire().await })
                    })
                    .collect();
                let mut held = Vec::new();
                for task in tasks {
                    held.push(task.await.unwrap().unwrap());
                }
                common::preload(&server);
                let before = evalsha_calls(&server);
                let start = Instant::now();
                // Three TTLs with Lua; without, one and a half of the longer TTL (six waves, longer than a
                // TTL: a lease nothing renewed would be gone).
                let span = if common::has_lua(flavor) {
                    ttl * 3
                } else {
                    ttl * 3 / 2
                };
                tokio::time::sleep(span).await;
                let waves = (start.elapsed().as_millis() / interval.as_millis()) as u64 + 1;
                // Kept: none lost. A round that timed out on a loaded machine leaves its permits at risk
                // (still valid) until the next one succeeds: allowed; a loss is not.
                for lease in &held {
                    let state = lease.state();
                    assert!(
                        matches!(
                            state,
                            redlease::LeaseState::Held | redlease::LeaseState::AtRisk
                        ),
                        "{flavor} {backend:?}: {state:?}"
                    );
                }
                assert_eq!(members(&server, &key), 20, "{flavor} {backend:?}");
                let calls = evalsha_calls(&server) - before;
                eprintln!(
                    "semaphore: {flavor} {backend:?}: 20 permits renewed every {interval:?} for {:?}: {calls} \
                     script calls (one by one: about {})",
                    start.elapsed(),
                    20 * waves
                );
                if common::has_lua(flavor) {
                    // About one call per wave (acquisitions further apart than the window renew in separate
                    // batches, which stay apart); one by one would be 20 per wave.
                    assert!(
                        calls * 4 <= 20 * waves,
                        "{flavor} {backend:?}: {calls} script calls in {waves} waves"
                    );
                }
                for lease in held {
                    lease.release().await.unwrap();
                }
                assert_eq!(server.cmd(&["EXISTS", &key]), "0", "{flavor} {backend:?}");
            }
        },
    );
}

#[test]
fn fair_waiters_arriving_within_one_millisecond_keep_their_order_on_every_server() {
    const TEST: &str =
        "fair_waiters_arriving_within_one_millisecond_keep_their_order_on_every_server";
    on_every_server(TEST, |flavor| async move {
        let server = RedisServer::start_flavor(flavor, &[]);
        let ttl = Ttl::from_millis(10_000).unwrap();
        let fair = PermitOp::AcquireFair {
            claim: Ttl::from_millis(10_000).unwrap(),
            queue: 20,
        };
        for backend in ALL_BACKENDS {
            let node = common::node(backend, &server.url()).await;
            let k = common::key("fair-ties", backend);
            let holder = Token::random().unwrap();
            assert_eq!(
                node.permit(&k, &holder, ttl, fair).await.unwrap(),
                redlease::PermitReply::Done
            );
            // Twenty waiters back to back (most within one millisecond of the server's clock), in the reverse
            // of their tokens' order: a tie of arrival times must not fall back to the tokens' order.
            let mut waiters: Vec<Token> = (0..20).map(|_| Token::random().unwrap()).collect();
            waiters.sort_by(|a, b| b.as_str().cmp(a.as_str()));
            for w in &waiters {
                let r = node.permit(&k, w, ttl, fair).await.unwrap();
                assert!(matches!(r, redlease::PermitReply::Full { .. }), "{r:?}");
            }
            // The queue holds 20: a 21st waiter is refused (definitely, nothing written); a waiter in it is
            // not.
            let before = server.cmd(&["ZRANGE", &k, "0", "-1"]);
            let err = node
                .permit(&k, &Token::random().unwrap(), ttl, fair)
                .await
                .unwrap_err();
            assert_eq!(
                err.kind(),
                NodeErrorKind::Busy,
                "{flavor} {backend:?}: {err}"
            );
            assert!(!err.is_ambiguous(), "{flavor} {backend:?}: {err}");
            assert_eq!(server.cmd(&["ZRANGE", &k, "0", "-1"]), before);
            let r = node.permit(&k, &waiters[19], ttl, fair).await.unwrap();
            assert!(matches!(r, redlease::PermitReply::Full { .. }), "{r:?}");
            node.permit(&k, &holder, ttl, PermitOp::Release)
                .await
                .unwrap();
            for (i, w) in waiters.iter().enumerate() {
                // Everyone behind the head is turned away; the head gets it.
                for later in &waiters[i + 1..] {
                    let r = node.permit(&k, later, ttl, fair).await.unwrap();
                    assert!(
                        matches!(r, redlease::PermitReply::Full { .. }),
                        "{flavor} {backend:?}: waiter {} of 20 went before waiter {i}",
                        i + 1
                    );
                }
                let r = node.permit(&k, w, ttl, fair).await.unwrap();
                assert_eq!(
                    r,
                    redlease::PermitReply::Done,
                    "{flavor} {backend:?}: waiter {i}"
                );
                node.permit(&k, w, ttl, PermitOp::Release).await.unwrap();
            }
            assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{flavor} {backend:?}");
        }
    });
}

/// Whether the read/write lock at `key` on `server` holds a writer's claim (`c:` and a token).
fn has_claim(server: &RedisServer, key: &str) -> bool {
    server
        .cmd(&["ZRANGE", key, "0", "-1"])
        .lines()
        .any(|m| m.trim().starts_with("c:"))
}

#[test]
fn a_waiting_writer_holds_new_readers_off_and_goes_next_on_every_server() {
    const TEST: &str = "a_waiting_writer_holds_new_readers_off_and_goes_next_on_every_server";
    on_every_server(TEST, |flavor| async move {
        let server = RedisServer::start_flavor(flavor, &[]);
        for backend in ALL_BACKENDS {
            let node = common::node(backend, &server.url()).await;
            let manager = LockManager::single(node, config(Duration::from_secs(10)))
                .unwrap()
                .with_spawner(redlease_adapters::runtime::TokioSpawner::current().unwrap());
            let key = common::key("writer-preference", backend);
            let rw = manager.rw_lock(key.clone());
            let first = rw.read().try_acquire().await.unwrap();
            let second = rw.read().try_acquire().await.unwrap();
            let writer = tokio::spawn({
                let rw = rw.clone();
                async move {
                    let lease = rw.write().acquire_within(Duration::from_secs(20)).await;
                    (lease, Instant::now())
                }
            });
            // The waiting writer's claim is on the server: a new reader is held off, while the readers in
            // keep theirs (one renews it).
            assert!(
                eventually(Duration::from_secs(5), || has_claim(&server, &key)).await,
                "{flavor} {backend:?}: no claim"
            );
            for _ in 0..3 {
                let err = rw.read().try_acquire().await.unwrap_err();
                assert!(err.is_contended(), "{flavor} {backend:?}: {err}");
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            first.extend(Duration::from_secs(10)).await.unwrap();
            first.release().await.unwrap();
            assert!(
                !writer.is_finished(),
                "{flavor} {backend:?}: beside a reader"
            );
            second.release().await.unwrap();
            let released = Instant::now();
            let (lease, won) = writer.await.unwrap();
            let lease = lease.unwrap();
            // Woken by the release, or at the latest by its next attempt (at most max_retry_delay later),
            // which takes one round (at most the operation timeout).
            let waited = won.saturating_duration_since(released);
            eprintln!(
                "rw: {flavor} {backend:?}: the waiting writer got the lock {waited:?} after the last reader left"
            );
            let cfg = config(Duration::from_secs(10));
            let bound = cfg.max_retry_delay() + cfg.operation_timeout_for(Duration::from_secs(10));
            assert!(
                waited <= bound,
                "{flavor} {backend:?}: {waited:?} (bound {bound:?})"
            );
            assert!(
                !has_claim(&server, &key),
                "{flavor} {backend:?}: claim left"
            );
            let err = rw.read().try_acquire().await.unwrap_err();
            assert!(err.is_contended(), "{flavor} {backend:?}: {err}");
            lease.release().await.unwrap();
            rw.read()
                .try_acquire()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
            assert_eq!(server.cmd(&["EXISTS", &key]), "0", "{flavor} {backend:?}");
        }
    });
}

#[test]
fn readers_and_writers_racing_from_eight_connections_never_overlap_on_every_server() {
    const TEST: &str =
        "readers_and_writers_racing_from_eight_connections_never_overlap_on_every_server";
    on_every_server(TEST, |flavor| async move {
        let server = RedisServer::start_flavor(flavor, &[]);
        for backend in ALL_BACKENDS {
            let history = redlease_testkit::History::new();
            let key = common::key("rw-race", backend);
            let mut clients = Vec::new();
            // Clients 0–3 write, 4–7 read; each on its own connection, so that without Lua their watched
            // transactions abort one another.
            for id in 0..8u64 {
                let node = common::node(backend, &server.url()).await;
                let manager = LockManager::single(node, config(Duration::from_secs(2)))
                    .unwrap()
                    .with_observer(history.recorder(id));
                let rw = manager.rw_lock(key.clone());
                clients.push(tokio::spawn(async move {
                    let lock = if id < 4 {
                        rw.write().clone()
                    } else {
                        rw.read().clone()
                    };
                    let (mut won, mut contended, mut busy) = (0u32, 0u32, 0u32);
                    let end = Instant::now() + Duration::from_millis(2_000);
                    while Instant::now() < end {
                        match lock.try_acquire().await {
                            Ok(lease) => {
                                won += 1;
                                tokio::time::sleep(Duration::from_millis(2)).await;
                                lease.release().await.unwrap();
                            }
                            Err(err) if err.is_contended() => contended += 1,
                            // Without Lua: five aborted EXECs in a row (a definite error, nothing written).
                            Err(err)
                                if common::first_node_error(&err).is_some_and(|e| {
                                    e.kind() == NodeErrorKind::Busy && !e.is_ambiguous()
                                }) =>
                            {
                                busy += 1
                            }
                            // A round past the operation timeout on the loaded machine: not held.
                            Err(err) if timed_out(&err) => busy += 1,
                            Err(err) => panic!("client {id}: {}", common::chain(&err)),
                        }
                        tokio::time::sleep(Duration::from_millis(1 + id % 3)).await;
                    }
                    (won, contended, busy)
                }));
            }
            let mut totals = [[0u32; 3]; 2];
            for (id, client) in clients.into_iter().enumerate() {
                let (won, contended, busy) = client.await.unwrap();
                let side = &mut totals[usize::from(id >= 4)];
                side[0] += won;
                side[1] += contended;
                side[2] += busy;
            }
            eprintln!(
                "rw: {flavor} {backend:?}: 4 writers won {} times ({} contended, {} busy or timed out), 4 readers \
                 {} times ({} contended, {} busy or timed out) in 2 s",
                totals[0][0], totals[0][1], totals[0][2], totals[1][0], totals[1][1], totals[1][2]
            );
            if let Err(v) = history.check_readers_writers(|client| client < 4) {
                panic!("{flavor} {backend:?}: {v}");
            }
            assert!(
                totals[0][0] >= 5 && totals[1][0] >= 5,
                "{flavor} {backend:?}: {totals:?}"
            );
            assert!(
                totals[0][1] + totals[1][1] > 0,
                "{flavor} {backend:?}: no contention"
            );
            assert_eq!(server.cmd(&["EXISTS", &key]), "0", "{flavor} {backend:?}");
        }
    });
}

/// The entries of the read/write or fair lock at `key` live at least 50 ms past the server's `now`, and
/// its arrival markers whose place is such an entry, in arrival order: what a later operation can tell
/// apart (entries about to expire and markers of expired places count for nothing; the script purges them
/// where the Lua-less path may leave them to the next write).
fn live_entries(server: &RedisServer, key: &str, now: u64) -> (Vec<String>, Vec<String>) {
    let reply = server.cmd(&["ZRANGE", key, "0", "-1", "WITHSCORES"]);
    let lines: Vec<&str> = reply.lines().map(str::trim).collect();
    let pairs: Vec<(&str, u64)> = lines
        .chunks(2)
        .filter(|p| p.len() == 2)
        .map(|p| (p[0], p[1].parse::<f64>().unwrap() as u64))
        .collect();
    let order = 1_000_000_000_000_000u64;
    let mut entries: Vec<String> = pairs
        .iter()
        .filter(|(_, s)| *s < order && *s > now + 50)
        .map(|(m, _)| (*m).to_owned())
        .collect();
    entries.sort();
    let markers = pairs
        .iter()
        .filter(|(m, s)| *s >= order && entries.contains(&format!("c:{}", &m[2..])))
        .map(|(m, _)| (*m).to_owned())
        .collect();
    (entries, markers)
}

fn server_now(server: &RedisServer) -> u64 {
    let time = server.cmd(&["TIME"]);
    let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
    let (secs, micros) = (parts.next().unwrap(), parts.next().unwrap());
    secs * 1000 + micros / 1000
}

/// The Lua-less path against the script itself: on Valkey 9.1 (which runs both), a node pinned to scripts
/// and one pinned to native commands make the same random sequence of read/write, fenced-writer and fair
/// operations (four tokens; TTLs and claims of 60 s, 30 s or 1 ms, so that entries also expire between
/// steps; queues of one or two; extensions, releases, counters deleted) on two keys: every answer, every
/// fence, and the live entries and queue after each step are the same.
#[test]
fn the_lua_less_read_write_path_answers_as_the_rw_permit_script_does() {
    const TEST: &str = "the_lua_less_read_write_path_answers_as_the_rw_permit_script_does";
    on_servers(
        TEST,
        &[redlease_testkit::server::Flavor::Valkey91],
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in [Backend::RedisMultiplexed, Backend::FredClient] {
                let (script, _) = common::node_in(backend, &server.url(), Commands::Scripts).await;
                let (native, caps) =
                    common::node_in(backend, &server.url(), Commands::Native).await;
                assert!(caps.native_acquire(), "{caps:?}");
                let (ks, kn) = (
                    common::key("differential-script", backend),
                    common::key("differential-native", backend),
                );
                let (fs, fn_) = (common::fence_of(&ks), common::fence_of(&kn));
                let tokens: Vec<Token> = (0..4).map(|_| Token::random().unwrap()).collect();
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ backend as u64;
                let mut next = move |n: u64| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed % n
                };
                let millis = |ms: u64| Ttl::from_millis(ms).unwrap();
                let mut seen = std::collections::BTreeMap::<String, usize>::new();
                for step in 0..600 {
                    let token = &tokens[next(4) as usize];
                    let ttl = millis([60_000, 60_000, 60_000, 1][next(4) as usize]);
                    let claim = millis([30_000, 30_000, 1][next(3) as usize]);
                    let which = next(40);
                    let queue = 1 + next(2) as u32;
                    if which == 39 {
                        server.cmd(&["DEL", &fs, &fn_]);
                        continue;
                    }
                    let run = |node: &Arc<dyn RedisNode>, key: String, fence: String| {
                        let node = Arc::clone(node);
                        let token = token.clone();
                        async move {
                            let op = match which {
                                0..=9 => PermitOp::AcquireShared,
                                10..=15 => PermitOp::AcquireExclusive { claim, fence: None },
                                16..=23 => PermitOp::AcquireExclusive {
                                    claim,
                                    fence: Some(&fence),
                                },
                                24..=32 => PermitOp::AcquireFair { claim, queue },
                                33..=35 => PermitOp::Extend,
                                _ => PermitOp::Release,
                            };
                            let name = format!("{op:?}");
                            (name, node.permit(&key, &token, ttl, op).await)
                        }
                    };
                    let (name, by_script) = run(&script, ks.clone(), fs.clone()).await;
                    let (_, by_native) = run(&native, kn.clone(), fn_.clone()).await;
                    let now = server_now(&server);
                    let what = format!(
                        "{backend:?} step {step}: {name} ttl {ttl:?} by token {}",
                        &token.as_str()[..8]
                    );
                    let outcome = match (&by_script, &by_native) {
                        (
                            Ok(redlease::PermitReply::Full {
                                next_expiry: Some(a),
                            }),
                            Ok(redlease::PermitReply::Full {
                                next_expiry: Some(b),
                            }),
                        ) => {
                            assert!(
                                a.abs_diff(*b) <= Duration::from_millis(200),
                                "{what}: full for {a:?} by the script, {b:?} without Lua"
                            );
                            "full".to_owned()
                        }
                        (Ok(a), Ok(b)) => {
                            assert_eq!(a, b, "{what}");
                            format!("{a:?}")
                                .split([' ', '{'])
                                .next()
                                .unwrap()
                                .to_owned()
                        }
                        (Err(a), Err(b)) => {
                            assert_eq!(
                                (a.kind(), a.is_ambiguous()),
                                (b.kind(), b.is_ambiguous()),
                                "{what}: {a} / {b}"
                            );
                            format!("{:?}", a.kind())
                        }
                        _ => {
                            panic!("{what}: {by_script:?} by the script, {by_native:?} without Lua")
                        }
                    };
                    *seen.entry(format!("{name:.14} {outcome}")).or_default() += 1;
                    let (entries_s, markers_s) = live_entries(&server, &ks, now);
                    let (entries_n, markers_n) = live_entries(&server, &kn, now);
                    assert_eq!(entries_s, entries_n, "{what}: live entries");
                    assert_eq!(markers_s, markers_n, "{what}: queue");
                    assert_eq!(
                        server.cmd(&["GET", &fs]),
                        server.cmd(&["GET", &fn_]),
                        "{what}: fence counters"
                    );
                    // Entries of 1 ms expire before the next step.
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
                eprintln!("rw differential: {flavor} {backend:?}: {seen:?}");
            }
        },
    );
}
