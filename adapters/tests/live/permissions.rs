//! Refusals no retry can change (ACL denials, a lock key of another type, an unusable fence counter) and a
//! read-only replica, through the manager on every backend: the same answer with one attempt or three,
//! nothing written, and (counted on the server) exactly one attempt's commands.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{Error, LockManager, NodeErrorKind, RedisNode, Token, Ttl};
use redlease_testkit::server::{Flavor, RedisServer};

use crate::common::{
    self, ALL_BACKENDS, chain, first_node_error, has_lua, on_every_server, preload,
};

use crate::stats::Stats;

/// A retry after a refusal would wait at least this long: far above one round on a loaded machine.
const RETRY_DELAY: Duration = Duration::from_secs(2);

fn config() -> redlease::Config {
    redlease::Config::default()
        .with_expiry(Duration::from_secs(10))
        .with_attempts(3)
        .with_retry_delay(RETRY_DELAY)
}

fn attempts_of(err: &Error) -> Option<u32> {
    match err {
        Error::NotAcquired { attempts, .. } => Some(*attempts),
        _ => None,
    }
}

/// Whether the server offers the native release (`DELIFEQ`, Valkey 9.1): a user refused the scripts' path
/// must be refused it too to be refused a lease.
fn offers_delifeq(flavor: Flavor) -> bool {
    matches!(flavor, Flavor::Valkey91 | Flavor::Valkey91NoLua)
}

/// `rules` with the native release denied too where the server offers it.
fn without_natives<'a>(flavor: Flavor, rules: &[&'a str]) -> Vec<&'a str> {
    let mut rules = rules.to_vec();
    if offers_delifeq(flavor) {
        rules.push("-delifeq");
    }
    rules
}

/// An ACL user on `server` with `rules`, and the URL to log in as it.
pub(crate) fn acl_user(server: &RedisServer, name: &str, rules: &[&str]) -> String {
    let mut args = vec!["ACL", "SETUSER", name, "reset", "on", ">userpw", "~*", "&*"];
    args.extend_from_slice(rules);
    server.cmd(&args);
    format!("redis://{name}:userpw@127.0.0.1:{}/0", server.port())
}

#[test]
fn acl_refusals_end_the_acquisition_at_once_with_an_auth_error_before_any_write() {
    on_every_server(
        "acl_refusals_end_the_acquisition_at_once_with_an_auth_error_before_any_write",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            // Without scripts a lease could be taken (SET) but never extended or released; without DEL or GET
            // the scripts themselves would be refused halfway through a lease's life. Where the server offers
            // the native commands, each user is refused `DELIFEQ` too (a user who may run them holds leases
            // without scripts: `a_user_without_eval_holds_leases_on_valkey_9_1_and_gets_an_auth_error_on_redis_7_0`).
            let users: [(&str, &[&str]); 4] = [
                ("noeval", &["+@all", "-eval", "-evalsha"]),
                ("noscripting", &["+@all", "-@scripting"]),
                ("nodel", &["+@all", "-del"]),
                ("noget", &["+@all", "-get"]),
            ];
            for (user, rules) in users {
                let url = acl_user(&server, user, &without_natives(flavor, rules));
                for backend in ALL_BACKENDS {
                    let what = format!("{backend:?} as {user}");
                    let node = common::unprobed(backend, &url).await;
                    let k = common::key(&format!("acl-{user}"), backend);
                    for (attempts, fenced) in [(1, false), (3, false), (3, true)] {
                        let manager = LockManager::single(
                            Arc::clone(&node),
                            config().with_attempts(attempts),
                        )
                        .unwrap();
                        let before = Stats::of(&server);
                        let started = Instant::now();
                        let lock = manager.lock(&k);
                        let lock = if fenced {
                            lock.fenced(common::fence_of(&k))
                        } else {
                            lock
                        };
                        let err = lock.acquire().await.unwrap_err();
                        let took = started.elapsed();
                        let seen = Stats::of(&server).since(&before);
                        assert!(!err.is_contended(), "{what}: {err}");
                        let node_err = first_node_error(&err)
                            .unwrap_or_else(|| panic!("{what}: no node error: {err}"));
                        assert_eq!(
                            node_err.kind(),
                            NodeErrorKind::Auth,
                            "{what}: {}",
                            chain(&err)
                        );
                        assert!(!node_err.is_ambiguous(), "{what}");
                        assert!(!chain(&err).contains("userpw"), "{what}: password leaked");
                        // One attempt, whatever `attempts` says: one capability check (its EVAL, and where the
                        // server offers DELIFEQ its refused probe), nothing written.
                        assert_eq!(
                            attempts_of(&err),
                            Some(1),
                            "{what} attempts={attempts}: {err}"
                        );
                        assert_eq!(seen.sent("set"), 0, "{what}: a SET was sent: {seen:?}");
                        let check = 1 + u64::from(offers_delifeq(flavor));
                        assert_eq!(seen.lock_commands(), check, "{what}: {seen:?}");
                        assert!(
                            took < RETRY_DELAY,
                            "{what}: {took:?}: a retry pause was taken"
                        );
                        assert_eq!(seen.connections, 0, "{what}: reconnected: {seen:?}");
                        assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{what}");
                        assert_eq!(
                            server.cmd(&["EXISTS", &common::fence_of(&k)]),
                            "0",
                            "{what}"
                        );
                    }
                }
            }
        },
    );
}

#[test]
fn release_and_extend_report_a_refused_read_instead_of_not_held() {
    on_every_server(
        "release_and_extend_report_a_refused_read_instead_of_not_held",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            // The scripts may run; the GET inside them may not (nor, where offered, the native DELIFEQ, which
            // needs no GET and would release the lease).
            let url = acl_user(
                &server,
                "noget",
                &without_natives(flavor, &["+@all", "-get"]),
            );
            let ttl = Ttl::from_millis(10_000).unwrap();
            for backend in ALL_BACKENDS {
                let node = common::unprobed(backend, &url).await;
                let token = Token::random().unwrap();
                let k = common::key("noget", backend);
                server.cmd(&["SET", &k, token.as_str(), "PX", "10000"]);
                let err = node.release(&k, &token).await.unwrap_err();
                assert_eq!(err.kind(), NodeErrorKind::Auth, "{backend:?}: {err}");
                assert!(!err.is_ambiguous(), "{backend:?}");
                let err = node.extend(&k, &token, ttl).await.unwrap_err();
                assert_eq!(err.kind(), NodeErrorKind::Auth, "{backend:?}: {err}");
                assert!(!err.is_ambiguous(), "{backend:?}");
                // Still ours, untouched.
                assert_eq!(server.cmd(&["GET", &k]), token.as_str(), "{backend:?}");
                server.cmd(&["DEL", &k]);
            }
        },
    );
}

#[test]
fn a_wrong_type_lock_key_gives_the_same_wrong_type_answer_with_one_attempt_or_three_without_a_retry()
 {
    on_every_server(
        "a_wrong_type_lock_key_gives_the_same_wrong_type_answer_with_one_attempt_or_three_without_a_retry",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            preload(&server);
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let k = common::key("hash-lock", backend);
                server.cmd(&["HSET", &k, "field", "1"]);
                for (attempts, fenced) in [(1, false), (3, false), (1, true), (3, true)] {
                    let what = format!("{backend:?} attempts={attempts} fenced={fenced}");
                    let manager =
                        LockManager::single(Arc::clone(&node), config().with_attempts(attempts))
                            .unwrap();
                    let lock = manager.lock(&k);
                    let lock = if fenced {
                        lock.fenced(common::fence_of(&k))
                    } else {
                        lock
                    };
                    let before = Stats::of(&server);
                    let started = Instant::now();
                    let err = lock.acquire().await.unwrap_err();
                    let took = started.elapsed();
                    let seen = Stats::of(&server).since(&before);
                    assert!(!err.is_contended(), "{what}: {err}");
                    let node_err =
                        first_node_error(&err).unwrap_or_else(|| panic!("{what}: {err}"));
                    assert_eq!(
                        node_err.kind(),
                        NodeErrorKind::WrongType,
                        "{what}: {}",
                        chain(&err)
                    );
                    assert!(
                        node_err.message().contains("lock key"),
                        "{what}: the message does not name the lock key: {node_err}"
                    );
                    assert_eq!(attempts_of(&err), Some(1), "{what}: {err}");
                    // One attempt's commands: one, except for a fenced acquisition without Lua, which reads
                    // the counter in a transaction before its `SET NX` meets the key (then a plain `GET`), and
                    // on the connection's first one (attempts=1 comes first) proves the counter writable in a
                    // transaction that runs nothing.
                    let one_attempt = match (fenced && !has_lua(flavor), attempts) {
                        (false, _) => 1,
                        (true, 1) => 3,
                        (true, _) => 2,
                    };
                    assert_eq!(seen.lock_commands(), one_attempt, "{what}: {seen:?}");
                    assert!(took < RETRY_DELAY, "{what}: {took:?}");
                    assert_eq!(server.cmd(&["TYPE", &k]), "hash", "{what}");
                    assert_eq!(
                        server.cmd(&["EXISTS", &common::fence_of(&k)]),
                        "0",
                        "{what}"
                    );
                }
                server.cmd(&["DEL", &k]);
            }
        },
    );
}

#[test]
fn an_unusable_fence_counter_is_refused_once_by_name_and_nothing_is_written() {
    on_every_server(
        "an_unusable_fence_counter_is_refused_once_by_name_and_nothing_is_written",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            preload(&server);
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let k = common::key("fence", backend);
                let f = common::fence_of(&k);
                // (setup, expected text of the message): a counter with a TTL would restart after expiring.
                let cases: [(&[&str], &str); 5] = [
                    (&["SET", &f, "41", "PX", "600000"], "has a TTL"),
                    (&["HSET", &f, "n", "1"], "another type"),
                    (&["SET", &f, "forty-one"], "non-negative integer"),
                    (&["SET", &f, "-3"], "non-negative integer"),
                    (&["SET", &f, "9223372036854775807"], "exhausted"),
                ];
                for (setup, text) in cases {
                    let what = format!("{backend:?} {setup:?}");
                    server.cmd(setup);
                    let dump_before = server.cmd(&["DUMP", &f]);
                    let pttl_before: i64 = server.cmd(&["PTTL", &f]).parse().unwrap();
                    let manager = LockManager::single(Arc::clone(&node), config()).unwrap();
                    let before = Stats::of(&server);
                    let err = manager.lock(&k).fenced(&f).acquire().await.unwrap_err();
                    let seen = Stats::of(&server).since(&before);
                    let node_err =
                        first_node_error(&err).unwrap_or_else(|| panic!("{what}: {err}"));
                    assert_eq!(
                        node_err.kind(),
                        NodeErrorKind::Fence,
                        "{what}: {}",
                        chain(&err)
                    );
                    assert!(!node_err.is_ambiguous(), "{what}");
                    assert!(
                        node_err.message().contains(&f) && node_err.message().contains(text),
                        "{what}: the message does not name the fence key and its problem: {node_err}"
                    );
                    assert_eq!(attempts_of(&err), Some(1), "{what}: {err}");
                    assert_eq!(seen.lock_commands(), 1, "{what}: {seen:?}");
                    // Nothing written: no lock key, the counter as it was (value and TTL).
                    assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{what}");
                    assert_eq!(server.cmd(&["DUMP", &f]), dump_before, "{what}");
                    let pttl: i64 = server.cmd(&["PTTL", &f]).parse().unwrap();
                    assert!(
                        pttl <= pttl_before && (pttl_before < 0) == (pttl < 0),
                        "{what}"
                    );
                    server.cmd(&["DEL", &f]);
                }
            }
        },
    );
}

/// Without Lua, a user who may read the fence key but not write it is refused before the lock is written,
/// with an `Auth` error naming the fence key (not a lock written, an `INCR` refused and the lock deleted).
#[test]
fn a_fence_key_the_user_may_read_but_not_write_is_refused_by_name_before_the_lock_is_written() {
    common::on_servers(
        "a_fence_key_the_user_may_read_but_not_write_is_refused_by_name_before_the_lock_is_written",
        &[Flavor::Valkey91NoLua],
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let url = acl_user(
                &server,
                "readfence",
                &["+@all", "resetkeys", "~*:lock", "%R~*:fence"],
            );
            for backend in ALL_BACKENDS {
                let what = format!("{backend:?}");
                let node = common::unprobed(backend, &url).await;
                let k = common::key("read-only-fence", backend);
                let f = common::fence_of(&k);
                server.cmd(&["SET", &f, "5"]);
                let manager = LockManager::single(node, config()).unwrap();
                // The capability check (its probes include SETs that write nothing) runs here.
                manager
                    .lock(&k)
                    .try_acquire()
                    .await
                    .unwrap()
                    .release()
                    .await
                    .unwrap();
                let before = Stats::of(&server);
                let err = manager.lock(&k).fenced(&f).acquire().await.unwrap_err();
                let seen = Stats::of(&server).since(&before);
                let node_err = first_node_error(&err).unwrap_or_else(|| panic!("{what}: {err}"));
                assert_eq!(
                    node_err.kind(),
                    NodeErrorKind::Auth,
                    "{what}: {}",
                    chain(&err)
                );
                assert!(!node_err.is_ambiguous(), "{what}");
                assert!(
                    node_err.message().contains(&f),
                    "{what}: the fence key is not named: {node_err}"
                );
                assert_eq!(attempts_of(&err), Some(1), "{what}: {err}");
                assert_eq!(
                    seen.sent("set"),
                    0,
                    "{what}: the lock was written: {seen:?}"
                );
                assert_eq!(seen.sent("delifeq"), 0, "{what}: a write undone: {seen:?}");
                assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{what}");
                assert_eq!(server.cmd(&["GET", &f]), "5", "{what}");
            }
        },
    );
}

/// Waits until `replica` reports its link to the primary up.
async fn wait_for_sync(replica: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !replica
        .cmd(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < deadline, "the replica never synchronised");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn a_read_only_replica_refuses_every_operation_definitely_and_changes_nothing() {
    on_every_server(
        "a_read_only_replica_refuses_every_operation_definitely_and_changes_nothing",
        |flavor| async move {
            let primary = RedisServer::start_flavor(flavor, &[]);
            let port = primary.port().to_string();
            let replica = RedisServer::start_flavor(flavor, &["--replicaof", "127.0.0.1", &port]);
            wait_for_sync(&replica).await;
            let ttl = Ttl::from_millis(10_000).unwrap();
            for backend in ALL_BACKENDS {
                // Unprobed: the capability check itself meets the replica.
                let node: Arc<dyn RedisNode> = common::unprobed(backend, &replica.url()).await;
                let token = Token::random().unwrap();
                let k = common::key("replica", backend);
                let f = common::fence_of(&k);
                let readonly = |op: &str, r: Result<String, redlease::NodeError>| {
                    let err = r.expect_err(op);
                    assert_eq!(
                        err.kind(),
                        NodeErrorKind::ReadOnly,
                        "{backend:?} {op}: {err}"
                    );
                    assert!(!err.is_ambiguous(), "{backend:?} {op}");
                };
                let fmt = |r: Result<bool, redlease::NodeError>| r.map(|b| b.to_string());
                readonly(
                    "claim (fresh)",
                    fmt(node
                        .claim(redlease::ClaimRequest::new(&k, &token, ttl).fresh(true))
                        .await
                        .map(redlease::Claim::is_taken)),
                );
                readonly("acquire", fmt(node.acquire(&k, &token, ttl).await));
                readonly(
                    "acquire_fenced",
                    node.acquire_fenced(&k, &f, &token, ttl)
                        .await
                        .map(|v| format!("{v:?}")),
                );
                // Our key, written on the primary and replicated: release and extend must reach the write and be
                // refused there (not report "not held").
                primary.cmd(&["SET", &k, token.as_str(), "PX", "10000"]);
                let deadline = Instant::now() + Duration::from_secs(5);
                while replica.cmd(&["GET", &k]) != token.as_str() {
                    assert!(Instant::now() < deadline, "not replicated");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                readonly("release", fmt(node.release(&k, &token).await));
                readonly("extend", fmt(node.extend(&k, &token, ttl).await));
                // Through the manager: a definite ReadOnly cause, not contention.
                let manager =
                    LockManager::single(Arc::clone(&node), common::config(Duration::from_secs(10)))
                        .unwrap();
                let err = manager
                    .lock(format!("{k}:2"))
                    .try_acquire()
                    .await
                    .unwrap_err();
                assert!(!err.is_contended(), "{backend:?}: {err}");
                assert_eq!(
                    first_node_error(&err).map(|e| e.kind()),
                    Some(NodeErrorKind::ReadOnly),
                    "{backend:?}: {err}"
                );
                // Nothing changed on the primary; inspect (a read) works on the replica.
                assert_eq!(primary.cmd(&["GET", &k]), token.as_str(), "{backend:?}");
                let ttl_left: i64 = primary.cmd(&["PTTL", &k]).parse().unwrap();
                assert!(
                    ttl_left > 0 && ttl_left <= 10_000,
                    "{backend:?}: {ttl_left}"
                );
                assert!(node.inspect(&k).await.unwrap().unwrap().holds(&token));
                assert_eq!(primary.cmd(&["EXISTS", &f]), "0", "{backend:?}");
            }
        },
    );
}

#[test]
fn a_user_who_may_eval_but_not_evalsha_holds_extends_and_releases_through_eval() {
    on_every_server(
        "a_user_who_may_eval_but_not_evalsha_holds_extends_and_releases_through_eval",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let url = acl_user(&server, "noevalsha", &["+@all", "-evalsha"]);
            for backend in ALL_BACKENDS {
                let node = common::unprobed(backend, &url).await;
                let manager = LockManager::single(node, config()).unwrap();
                let k = common::key("noevalsha", backend);
                for fenced in [false, true] {
                    let lock = manager.lock(&k);
                    let lock = if fenced {
                        lock.fenced(common::fence_of(&k))
                    } else {
                        lock
                    };
                    let lease = lock
                        .try_acquire()
                        .await
                        .unwrap_or_else(|e| panic!("{backend:?} fenced={fenced}: {e}"));
                    assert_eq!(server.cmd(&["GET", &k]), lease.token().as_str());
                    lease.extend(Duration::from_secs(20)).await.unwrap();
                    let pttl: i64 = server.cmd(&["PTTL", &k]).parse().unwrap();
                    assert!(pttl > 10_000, "{backend:?} fenced={fenced}: PTTL {pttl}");
                    lease.release().await.unwrap();
                    assert_eq!(
                        server.cmd(&["EXISTS", &k]),
                        "0",
                        "{backend:?} fenced={fenced}"
                    );
                }
            }
        },
    );
}
