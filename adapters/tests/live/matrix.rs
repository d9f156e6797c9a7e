//! The server matrix: Redis 7.0, Valkey 8.1, Valkey 9.1, Valkey 9.1 without Lua, and a Valkey 9.1 Cluster,
//! each in every command mode it supports. Every test names its server in its name and in its output
//! (`matrix: <server> <backend> <mode>: …`).

use std::sync::Arc;
use std::time::Duration;

use redlease::{
    LockManager, NodeErrorKind, PermitOp, PermitReply, RedisNode, SystemTimer, Token, Ttl,
};
use redlease_adapters::Commands;
use redlease_adapters::fred::FredNode;
use redlease_adapters::fred::fred::prelude::{ClientLike, EventInterface};
use redlease_adapters::redis::{ManagedNode, redis};
use redlease_testkit::conformance;
use redlease_testkit::proxy::FaultProxy;
use redlease_testkit::server::{Flavor, RedisServer};

use crate::common::{self, ALL_BACKENDS, Backend, first_node_error, on_servers};

/// The modes a flavor supports (the others are checked to fail in
/// `pinned_modes_fail_with_a_typed_error_before_any_write`).
fn modes(flavor: Flavor) -> &'static [Commands] {
    match flavor {
        Flavor::Redis | Flavor::Valkey81 => &[Commands::Automatic, Commands::Scripts],
        Flavor::Valkey91NoLua => &[Commands::Automatic, Commands::Native],
        _ => &[Commands::Automatic, Commands::Scripts, Commands::Native],
    }
}

/// Which paths a node must have chosen: (native release, native extend, native acquire/inspect).
fn expected_paths(flavor: Flavor, mode: Commands) -> (bool, bool, bool) {
    match (flavor, mode) {
        (_, Commands::Scripts) => (false, false, false),
        (_, Commands::Native) | (Flavor::Valkey91NoLua, _) => (true, true, true),
        // Where scripts run, the extension is the script (`SET … IFEQ … PX` could shorten a key).
        (Flavor::Redis, _) => (false, false, false),
        (Flavor::Valkey81, _) => (false, false, false),
        _ => (true, false, false),
    }
}

/// The conformance suite and a permit round trip for one backend in one mode, on `server`.
async fn conformance_of(
    flavor: Flavor,
    server: &RedisServer,
    reader: &dyn conformance::StateReader,
    mode: Commands,
    backend: Backend,
) {
    let (node, caps) = common::node_in(backend, &server.url(), mode).await;
    let chosen = (
        caps.native_release(),
        caps.native_extend(),
        caps.native_acquire(),
    );
    assert_eq!(
        chosen,
        expected_paths(flavor, mode),
        "{flavor} {backend:?} {mode:?}: {caps:?}"
    );
    if let Err(failure) = conformance::run_with_reader(&*node, reader, &SystemTimer).await {
        panic!("matrix: {flavor} {backend:?} {mode:?} ({caps:?}): {failure}");
    }
    // The semaphore case passes vacuously for a node that answers `Unsupported`: every node of the
    // matrix must run it.
    let k = common::key(&format!("matrix-permit-{mode:?}"), backend);
    let token = Token::random().unwrap();
    let ttl = Ttl::from_millis(10_000).unwrap();
    let one = PermitOp::Acquire { permits: 1 };
    for (op, want) in [
        (one, PermitReply::Done),
        (PermitOp::Release, PermitReply::Done),
    ] {
        match node.permit(&k, &token, ttl, op).await {
            Ok(reply) => assert_eq!(reply, want, "{flavor} {backend:?} {mode:?} {op:?}"),
            Err(e) => panic!("matrix: {flavor} {backend:?} {mode:?}: permit {op:?}: {e}"),
        }
    }
    // So do the read/write and fair lock cases (without Lua too: the watched transactions).
    let claim = Ttl::from_millis(2_000).unwrap();
    let fair = PermitOp::AcquireFair { claim, queue: 10 };
    let write = PermitOp::AcquireExclusive { claim, fence: None };
    for op in [PermitOp::AcquireShared, write, fair] {
        let k = common::key(&format!("matrix-rw-{mode:?}"), backend);
        for (op, want) in [
            (op, PermitReply::Done),
            (PermitOp::Release, PermitReply::Done),
        ] {
            match node.permit(&k, &token, ttl, op).await {
                Ok(reply) => assert_eq!(reply, want, "{flavor} {backend:?} {mode:?} {op:?}"),
                Err(e) => panic!("matrix: {flavor} {backend:?} {mode:?}: permit {op:?}: {e}"),
            }
        }
    }
    eprintln!("matrix: {flavor} {backend:?} {mode:?}: conformance passed ({caps:?})");
}

/// Every backend in every mode the flavor supports. The four backends of a mode run side by side on the one
/// server (each run of the suite keeps to a random key prefix of its own and spends most of its 3 s
/// sleeping: one after another, Valkey 9.1's twelve runs took half a minute); the modes one after another.
async fn conformance_on(flavor: Flavor, test: &str) {
    let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
        return;
    };
    let reader = crate::conformance::reader(&server.url()).await;
    for &mode in modes(flavor) {
        let [a, b, c, d] = ALL_BACKENDS;
        tokio::join!(
            conformance_of(flavor, &server, &reader, mode, a),
            conformance_of(flavor, &server, &reader, mode, b),
            conformance_of(flavor, &server, &reader, mode, c),
            conformance_of(flavor, &server, &reader, mode, d),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_redis_7_0() {
    conformance_on(Flavor::Redis, "conformance_on_redis_7_0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_valkey_8_1() {
    conformance_on(Flavor::Valkey81, "conformance_on_valkey_8_1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_valkey_9_1() {
    conformance_on(Flavor::Valkey91, "conformance_on_valkey_9_1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_valkey_9_1_without_lua() {
    conformance_on(
        Flavor::Valkey91NoLua,
        "conformance_on_valkey_9_1_without_lua",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_modes_fail_with_a_typed_error_before_any_write() {
    let test = "pinned_modes_fail_with_a_typed_error_before_any_write";
    let cases = [
        (Flavor::Redis, Commands::Native),
        (Flavor::Valkey81, Commands::Native),
        (Flavor::Valkey91NoLua, Commands::Scripts),
    ];
    for (flavor, mode) in cases {
        let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
            continue;
        };
        for backend in ALL_BACKENDS {
            let node = common::unprobed_in(backend, &server.url(), mode).await;
            let k = common::key("pinned", backend);
            let token = Token::random().unwrap();
            let ttl = Ttl::from_millis(10_000).unwrap();
            for (op, result) in [
                (
                    "claim (fresh)",
                    node.claim(redlease::ClaimRequest::new(&k, &token, ttl).fresh(true))
                        .await
                        .map(redlease::Claim::is_taken)
                        .map(|_| ()),
                ),
                ("acquire", node.acquire(&k, &token, ttl).await.map(|_| ())),
                (
                    "acquire_fenced",
                    node.acquire_fenced(&k, &common::fence_of(&k), &token, ttl)
                        .await
                        .map(|_| ()),
                ),
            ] {
                let err = result.expect_err(op);
                assert_eq!(
                    err.kind(),
                    NodeErrorKind::Unsupported,
                    "matrix: {flavor} {backend:?} {mode:?} {op}: {err}"
                );
                assert!(!err.is_ambiguous() && err.is_permanent(), "{err}");
            }
            assert_eq!(
                server.cmd(&["DBSIZE"]),
                "0",
                "{flavor} {backend:?} {mode:?}"
            );
            eprintln!(
                "matrix: {flavor} {backend:?} {mode:?}: refused as unsupported, nothing written"
            );
        }
    }
}

/// A lease's whole life through a manager: plain and fenced, extended and released, checked on the server.
async fn whole_life(server: &RedisServer, node: Arc<dyn RedisNode>, k: &str, what: &str) {
    let manager = LockManager::single(node, common::config(Duration::from_secs(10))).unwrap();
    for fenced in [false, true] {
        let lock = manager.lock(k);
        let lock = if fenced {
            lock.fenced(common::fence_of(k))
        } else {
            lock
        };
        let lease = lock
            .try_acquire()
            .await
            .unwrap_or_else(|e| panic!("{what} fenced={fenced}: {}", common::chain(&e)));
        assert_eq!(server.cmd(&["GET", k]), lease.token().as_str(), "{what}");
        lease.extend(Duration::from_secs(20)).await.unwrap();
        let pttl: i64 = server.cmd(&["PTTL", k]).parse().unwrap();
        assert!(pttl > 10_000, "{what} fenced={fenced}: PTTL {pttl}");
        lease.release().await.unwrap();
        assert_eq!(server.cmd(&["EXISTS", k]), "0", "{what} fenced={fenced}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_eval_holds_leases_on_valkey_9_1_and_gets_an_auth_error_on_redis_7_0() {
    let test = "a_user_without_eval_holds_leases_on_valkey_9_1_and_gets_an_auth_error_on_redis_7_0";
    for flavor in [Flavor::Valkey91, Flavor::Redis] {
        let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
            continue;
        };
        let url = crate::permissions::acl_user(&server, "noscripts", &["+@all", "-@scripting"]);
        for backend in ALL_BACKENDS {
            let node = common::unprobed(backend, &url).await;
            let k = common::key("noscripts", backend);
            let what = format!("matrix: {flavor} {backend:?} user without EVAL");
            if flavor == Flavor::Valkey91 {
                whole_life(&server, node, &k, &what).await;
                eprintln!("{what}: held, extended and released natively (plain and fenced)");
            } else {
                let manager =
                    LockManager::single(node, common::config(Duration::from_secs(10))).unwrap();
                let err = manager.lock(&k).try_acquire().await.unwrap_err();
                let node_err = first_node_error(&err).unwrap_or_else(|| panic!("{what}: {err}"));
                assert_eq!(node_err.kind(), NodeErrorKind::Auth, "{what}: {err}");
                assert!(!node_err.is_ambiguous(), "{what}: {err}");
                assert!(common::chain(&err).contains("EVAL"), "{what}: {err}");
                assert_eq!(server.cmd(&["DBSIZE"]), "0", "{what}");
                eprintln!("{what}: refused with a definite auth error: {err}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_and_script_paths_interoperate_on_one_key() {
    let test = "native_and_script_paths_interoperate_on_one_key";
    let Some(server) = RedisServer::start_flavor_or_skip(test, Flavor::Valkey91, &[]) else {
        return;
    };
    for backend in ALL_BACKENDS {
        let (scripts, _) = common::node_in(backend, &server.url(), Commands::Scripts).await;
        let (native, _) = common::node_in(backend, &server.url(), Commands::Native).await;
        let k = common::key("interop", backend);
        let f = common::fence_of(&k);
        let short = Ttl::from_millis(5_000).unwrap();
        let long = Ttl::from_millis(50_000).unwrap();
        let pttl = |k: &str| server.cmd(&["PTTL", k]).parse::<i64>().unwrap();
        for (taker, other, names) in [
            (&scripts, &native, "scripts -> native"),
            (&native, &scripts, "native -> scripts"),
        ] {
            let token = Token::random().unwrap();
            assert!(
                taker
                    .claim(redlease::ClaimRequest::new(&k, &token, short).fresh(true))
                    .await
                    .map(redlease::Claim::is_taken)
                    .unwrap(),
                "{names}"
            );
            assert!(other.extend(&k, &token, long).await.unwrap(), "{names}");
            assert!(pttl(&k) > 10_000, "{backend:?} {names}");
            // The other path recognises the holder's token as its own on a retry, and refuses another.
            assert!(other.acquire(&k, &token, long).await.unwrap(), "{names}");
            assert!(
                !other
                    .acquire(&k, &Token::random().unwrap(), long)
                    .await
                    .unwrap()
            );
            assert!(other.inspect(&k).await.unwrap().unwrap().holds(&token));
            assert!(other.release(&k, &token).await.unwrap(), "{names}");
            assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{backend:?} {names}");
        }
        // One fence counter, incremented by both paths in turn.
        let mut last = 0;
        for node in [&scripts, &native, &scripts, &native] {
            let token = Token::random().unwrap();
            let fence = node
                .acquire_fenced(&k, &f, &token, short)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(fence, last + 1, "{backend:?}");
            last = fence;
            assert!(node.release(&k, &token).await.unwrap());
        }
        eprintln!("matrix: valkey 9.1 {backend:?}: scripts and native interoperate on one key");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_path_is_chosen_again_after_the_server_is_replaced_by_another_binary() {
    let test = "the_path_is_chosen_again_after_the_server_is_replaced_by_another_binary";
    if !Flavor::Valkey91.available(test) || !Flavor::Valkey91NoLua.available(test) {
        return;
    }
    let Some(mut server) = RedisServer::start_flavor_or_skip(test, Flavor::Redis, &[]) else {
        return;
    };
    let client = redis::Client::open(server.url()).unwrap();
    let managed = ManagedNode::connect(&client).await.unwrap();
    let fred_client = common::fred_client(&server.url());
    fred_client.init().await.unwrap();
    let fred = FredNode::new(fred_client);
    let nodes: [(&str, Arc<dyn RedisNode>); 2] = [
        ("redis-rs manager", Arc::new(managed.clone())),
        ("fred client", Arc::new(fred.clone())),
    ];
    let caps = |i: usize| {
        if i == 0 {
            managed.capabilities()
        } else {
            fred.capabilities()
        }
    };
    for flavor in [Flavor::Redis, Flavor::Valkey91NoLua, Flavor::Valkey91] {
        if flavor != server.flavor() {
            server.try_restart_as(flavor).unwrap();
        }
        for (i, (name, node)) in nodes.iter().enumerate() {
            let k = format!("restart:{{{name}}}:lock");
            let what = format!("matrix: {flavor} {name}");
            // The first calls after the restart may meet the old connection's failure; the node reconnects.
            let manager =
                LockManager::single(Arc::clone(node), common::config(Duration::from_secs(10)))
                    .unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let lease = loop {
                match manager
                    .lock(&k)
                    .fenced(common::fence_of(&k))
                    .try_acquire()
                    .await
                {
                    Ok(lease) => break lease,
                    Err(e) => {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "{what}: {}",
                            common::chain(&e)
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            };
            lease.extend(Duration::from_secs(20)).await.unwrap();
            lease.release().await.unwrap();
            let caps = caps(i).unwrap_or_else(|| panic!("{what}: unchecked"));
            let expected = expected_paths(flavor, Commands::Automatic);
            assert_eq!(
                (
                    caps.native_release(),
                    caps.native_extend(),
                    caps.native_acquire()
                ),
                expected,
                "{what}: {caps:?}"
            );
            eprintln!("matrix: {what}: paths chosen anew after the restart ({caps:?})");
        }
    }
}

/// A server replaced behind one address (a load balancer or floating address in front of a failover, here
/// a [`FaultProxy`] retargeted from Valkey 9.1 to Redis 7.0) by clients that reconnect in the background,
/// so that no call fails in between: a RESP3 `ConnectionManager` and fred clients (with and without
/// fail-fast). Their next `run_id` is the new server's (the restart quarantine depends on it), and the next
/// lease checks the new server's capabilities (Redis 7.0 has no `DELIFEQ`) instead of sending what the old
/// one offered. A RESP3 manager given to `ManagedNode::new` is not watched: there the first refused native
/// command (`SET … IFEQ`, `DELIFEQ`) makes the node check again, and the lease still extends and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_replaced_behind_one_address_is_checked_again_without_a_failed_call() {
    let test = "a_server_replaced_behind_one_address_is_checked_again_without_a_failed_call";
    let Some(valkey) = RedisServer::start_flavor_or_skip(test, Flavor::Valkey91, &[]) else {
        return;
    };
    let Some(redis) = RedisServer::start_flavor_or_skip(test, Flavor::Redis, &[]) else {
        return;
    };
    let proxy = FaultProxy::start(valkey.addr().parse().unwrap()).unwrap();
    let resp3 = redis::Client::open(format!("{}?protocol=resp3", proxy.url())).unwrap();
    let managed = ManagedNode::connect(&resp3).await.unwrap();
    // Built by the user: no watch for the background reconnection; the refused DELIFEQ / SET IFEQ tell.
    let unwatched = ManagedNode::new(resp3.get_connection_manager().await.unwrap());
    let fred_default = common::fred_client(&proxy.url());
    fred_default.init().await.unwrap();
    let fred_waiting = common::fred_client(&proxy.url());
    fred_waiting.init().await.unwrap();
    let mut reconnects = [fred_default.reconnect_rx(), fred_waiting.reconnect_rx()];
    let fred_default = FredNode::new(fred_default);
    let fred_waiting = FredNode::new(fred_waiting).with_fail_fast(false);
    let nodes: [(&str, Arc<dyn RedisNode>); 4] = [
        ("redis-rs manager (RESP3)", Arc::new(managed.clone())),
        ("fred client", Arc::new(fred_default.clone())),
        (
            "fred client without fail-fast",
            Arc::new(fred_waiting.clone()),
        ),
        (
            "redis-rs manager (RESP3) given to new",
            Arc::new(unwatched.clone()),
        ),
    ];
    let caps = |i: usize| match i {
        0 => managed.capabilities(),
        1 => fred_default.capabilities(),
        2 => fred_waiting.capabilities(),
        _ => unwatched.capabilities(),
    };
    let cycle = |node: Arc<dyn RedisNode>, k: String| async move {
        let manager = LockManager::single(node, common::config(Duration::from_secs(10))).unwrap();
        let lease = manager.lock(&k).try_acquire().await?;
        lease.extend(Duration::from_secs(20)).await?;
        lease.release().await
    };
    for (i, (name, node)) in nodes.iter().enumerate() {
        cycle(Arc::clone(node), format!("replaced:{{{name}}}:before"))
            .await
            .unwrap_or_else(|e| panic!("{name} on valkey 9.1: {}", common::chain(&e)));
        assert!(
            caps(i).unwrap().native_release(),
            "{name}: DELIFEQ on valkey 9.1"
        );
        assert_eq!(
            node.run_id("k").await.unwrap().as_str(),
            valkey.run_id().unwrap(),
            "{name}"
        );
    }
    let accepted = proxy.accepted();
    proxy.retarget(redis.addr().parse().unwrap());
    // Wait for the background reconnections (bounded): four new connections through the proxy, and fred's
    // announcements of its two.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while proxy.accepted() < accepted + 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the clients never reconnected by themselves"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for rx in &mut reconnects {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("fred announces its reconnection")
            .unwrap();
    }
    for (i, (name, node)) in nodes.iter().enumerate() {
        let watched = i < 3;
        if !watched {
            // The extension's SET IFEQ and the release's DELIFEQ are refused as unknown (nothing changed):
            // the node forgets what it learned and goes again by the path a new check finds.
            cycle(Arc::clone(node), format!("replaced:{{{name}}}:after"))
                .await
                .unwrap_or_else(|e| panic!("{name} on redis 7.0: {}", common::chain(&e)));
        }
        let id = node
            .run_id("k")
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            id.as_str(),
            redis.run_id().unwrap(),
            "{name}: reported the replaced server's run_id"
        );
        cycle(Arc::clone(node), format!("replaced:{{{name}}}:after:2"))
            .await
            .unwrap_or_else(|e| panic!("{name} on redis 7.0: {}", common::chain(&e)));
        let caps = caps(i).unwrap();
        assert!(
            !caps.native_release(),
            "{name}: checked again on redis 7.0: {caps:?}"
        );
        eprintln!(
            "matrix: {name}: valkey 9.1 replaced by redis 7.0 behind one address, checked again"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_fenced_acquisition_refuses_a_bad_counter_before_writing_the_lock() {
    let test = "native_fenced_acquisition_refuses_a_bad_counter_before_writing_the_lock";
    let Some(server) = RedisServer::start_flavor_or_skip(test, Flavor::Valkey91NoLua, &[]) else {
        return;
    };
    for backend in [Backend::RedisMultiplexed, Backend::FredClient] {
        let (node, _) = common::node_in(backend, &server.url(), Commands::Automatic).await;
        let k = common::key("badfence", backend);
        let f = common::fence_of(&k);
        let ttl = Ttl::from_millis(10_000).unwrap();
        let token = Token::random().unwrap();
        for (setup, needle) in [
            (vec!["SET", &f, "7", "PX", "100000"], "has a TTL"),
            (vec!["RPUSH", &f, "x"], "another type"),
            (vec!["SET", &f, "abc"], "non-negative integer"),
            (vec!["SET", &f, "-3"], "non-negative integer"),
            (vec!["SET", &f, "9223372036854775807"], "exhausted"),
        ] {
            server.cmd(&["DEL", &f]);
            server.cmd(&setup);
            let err = node.acquire_fenced(&k, &f, &token, ttl).await.unwrap_err();
            assert_eq!(
                err.kind(),
                NodeErrorKind::Fence,
                "{backend:?} {setup:?}: {err}"
            );
            assert!(!err.is_ambiguous(), "{err}");
            assert!(
                err.message().contains(needle),
                "{backend:?} {setup:?}: {err}"
            );
            assert_eq!(
                server.cmd(&["EXISTS", &k]),
                "0",
                "{backend:?} {setup:?}: lock written"
            );
        }
        server.cmd(&["DEL", &f]);
        eprintln!(
            "matrix: valkey 9.1 without Lua {backend:?}: bad fence counters refused before writing"
        );
    }
}

#[test]
fn a_user_without_multi_exec_or_incr_gets_a_definite_auth_error_naming_it_before_any_write_without_lua()
 {
    let test = "a_user_without_multi_exec_or_incr_gets_a_definite_auth_error_naming_it_before_any_write_without_lua";
    // The Lua-less path: Valkey 9.1 without Lua, and Valkey 9.1 for a user who may not run scripts.
    on_servers(
        test,
        &[Flavor::Valkey91NoLua, Flavor::Valkey91],
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for (user, command) in [
                ("nomulti", "multi"),
                ("noexec", "exec"),
                ("noincr", "incr"),
                ("nowatch", "watch"),
                ("nopexpire", "pexpire"),
            ] {
                let denied = format!("-{command}");
                let url =
                    crate::permissions::acl_user(&server, user, &["+@all", "-@scripting", &denied]);
                for backend in ALL_BACKENDS {
                    let what = format!("{flavor} {backend:?} as {user}");
                    let node = common::unprobed(backend, &url).await;
                    let k = common::key(&format!("tx-{user}"), backend);
                    let f = common::fence_of(&k);
                    let token = Token::random().unwrap();
                    let ttl = Ttl::from_millis(10_000).unwrap();
                    let refused = |op: &str, result: Result<String, redlease::NodeError>| {
                        let err = result.expect_err(op);
                        assert_eq!(err.kind(), NodeErrorKind::Auth, "{what} {op}: {err}");
                        assert!(!err.is_ambiguous(), "{what} {op}: {err}");
                        assert!(
                            err.message().contains(&format!("'{command}'")),
                            "{what} {op}: the message does not name {command}: {err}"
                        );
                    };
                    let fmt = |r: Result<bool, redlease::NodeError>| r.map(|b| b.to_string());
                    refused(
                        "claim (fresh)",
                        fmt(node
                            .claim(redlease::ClaimRequest::new(&k, &token, ttl).fresh(true))
                            .await
                            .map(redlease::Claim::is_taken)),
                    );
                    refused("acquire", fmt(node.acquire(&k, &token, ttl).await));
                    refused(
                        "acquire_fenced",
                        node.acquire_fenced(&k, &f, &token, ttl)
                            .await
                            .map(|v| format!("{v:?}")),
                    );
                    refused("extend", fmt(node.extend(&k, &token, ttl).await));
                    refused("release", fmt(node.release(&k, &token).await));
                    // Inspection needs the transaction, not INCR, WATCH or PEXPIRE.
                    let inspected = node.inspect(&k).await.map(|v| format!("{v:?}"));
                    if matches!(command, "incr" | "watch" | "pexpire") {
                        assert_eq!(inspected.unwrap(), "None", "{what}");
                    } else {
                        refused("inspect", inspected);
                    }
                    // Through a manager: the first attempt ends it, nothing written.
                    let manager = LockManager::single(
                        Arc::clone(&node),
                        common::config(Duration::from_secs(10)).with_attempts(3),
                    )
                    .unwrap();
                    let err = manager.lock(&k).fenced(&f).try_acquire().await.unwrap_err();
                    assert!(!err.is_contended(), "{what}: {err}");
                    assert!(
                        matches!(err, redlease::Error::NotAcquired { attempts: 1, .. }),
                        "{what}: {err}"
                    );
                    assert_eq!(
                        server.cmd(&["DBSIZE"]),
                        "0",
                        "{what}: something was written"
                    );
                    // The connection is intact, and nothing was remembered: once the ACL allows it, the same
                    // node holds a fenced lease.
                    server.cmd(&["ACL", "SETUSER", user, &format!("+{command}")]);
                    whole_life(&server, Arc::clone(&node), &k, &what).await;
                    server.cmd(&["ACL", "SETUSER", user, &denied]);
                    server.cmd(&["FLUSHALL"]);
                    eprintln!(
                        "matrix: {what}: refused by name before any write; works once allowed"
                    );
                }
            }
        },
    );
}
