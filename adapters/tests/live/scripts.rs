//! Script identity and the NOSCRIPT fallback.

use std::time::Duration;

use redlease::{RedisNode, Token, Ttl};
use redlease_adapters::Commands;
use redlease_adapters::scripts;
use redlease_testkit::server::{Flavor, RedisServer, on_each_flavor};

use crate::common::{self, ALL_BACKENDS, EVERY_SERVER, WITH_LUA, has_lua, key, on_every_server};

#[test]
fn every_precomputed_sha1_equals_script_load() {
    let test = "every_precomputed_sha1_equals_script_load";
    on_each_flavor(test, &EVERY_SERVER, |flavor| {
        let server = RedisServer::start_flavor(flavor, &[]);
        for script in scripts::ALL {
            let loaded = server.try_cmd(&["SCRIPT", "LOAD", script.source]);
            if has_lua(flavor) {
                assert_eq!(loaded.as_deref(), Ok(script.sha1), "{}", script.name);
            } else {
                // No script can be loaded: the refusal the capability check recognises as "no Lua here".
                let err = loaded.expect_err(script.name);
                assert!(err.contains("Could not find scripting engine"), "{err}");
            }
        }
        eprintln!("{test} on {flavor}: {} scripts checked", scripts::ALL.len());
    });
}

/// The native commands one operation sends, with their counts (`("set", 1)`).
type NativeCalls = [(&'static str, u64)];

/// `calls` and `failed_calls` of one command from `INFO commandstats`.
fn stats(server: &RedisServer, command: &str) -> (u64, u64) {
    let info = server.cmd(&["INFO", "commandstats"]);
    let Some(line) = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
    else {
        return (0, 0);
    };
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .map_or(0, |v| v.parse().unwrap())
    };
    (field("calls"), field("failed_calls"))
}

#[test]
fn script_flush_between_operations_still_succeeds_executing_once() {
    on_every_server(
        "script_flush_between_operations_still_succeeds_executing_once",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let ttl = Ttl::from_millis(5000).unwrap();
            // Pinned to scripts on every server with Lua (every operation a script), and in the automatic
            // mode (on Valkey some operations native, which a flush cannot touch; without Lua all of them).
            let modes: &[Commands] = if has_lua(flavor) {
                &[Commands::Scripts, Commands::Automatic]
            } else {
                &[Commands::Automatic]
            };
            for &mode in modes {
                for backend in ALL_BACKENDS {
                    let (node, caps) = common::node_in(backend, &server.url(), mode).await;
                    let what = format!("{backend:?} {mode:?} ({caps:?})");
                    let k = key(&format!("flush-{mode:?}"), backend);
                    let f = common::fence_of(&k);
                    let token = Token::random().unwrap();
                    // (name, whether it runs natively, the native commands one execution sends)
                    let ops: [(&str, bool, &NativeCalls); 4] = [
                        ("acquire", caps.native_acquire(), &[("set", 1)]),
                        (
                            "acquire_fenced",
                            caps.native_acquire(),
                            // Two transactions, and the connection's first proof that the fence key
                            // may be written: a third whose EXEC aborts (nothing runs).
                            &[("exec", 3), ("set", 1), ("incr", 1)],
                        ),
                        // The watched extension: WATCH, GET, MULTI PEXPIRE … GT EXEC (never SET … IFEQ,
                        // which would shorten a key a longer extension set).
                        (
                            "extend",
                            caps.native_extend(),
                            &[("set", 0), ("watch", 1), ("pexpire", 1), ("exec", 1)],
                        ),
                        ("release", caps.native_release(), &[("delifeq", 1)]),
                    ];
                    for (name, native, commands) in ops {
                        server.cmd(&["SCRIPT", "FLUSH"]);
                        server.cmd(&["CONFIG", "RESETSTAT"]);
                        match name {
                            "acquire" => assert!(node.acquire(&k, &token, ttl).await.unwrap()),
                            "acquire_fenced" => {
                                server.cmd(&["DEL", &k]);
                                assert_eq!(
                                    node.acquire_fenced(&k, &f, &token, ttl).await.unwrap(),
                                    Some(1),
                                    "{what}"
                                );
                                // Executed once: the counter moved by exactly one.
                                assert_eq!(server.cmd(&["GET", &f]), "1", "{what}");
                                server.cmd(&["DEL", &f]);
                            }
                            "extend" => assert!(node.extend(&k, &token, ttl).await.unwrap()),
                            _ => assert!(node.release(&k, &token).await.unwrap()),
                        }
                        if native {
                            // No script at all; each native command executed once, without error.
                            assert_eq!(stats(&server, "evalsha"), (0, 0), "{what} {name}");
                            assert_eq!(stats(&server, "eval"), (0, 0), "{what} {name}");
                            for &(command, calls) in commands {
                                let aborted =
                                    u64::from(name == "acquire_fenced" && command == "exec");
                                assert_eq!(
                                    stats(&server, command),
                                    (calls, aborted),
                                    "{what} {name}: {command}"
                                );
                            }
                        } else {
                            // One EVALSHA refused with NOSCRIPT, then exactly one EVAL.
                            assert_eq!(stats(&server, "evalsha"), (1, 1), "{what} {name}: EVALSHA");
                            assert_eq!(stats(&server, "eval"), (1, 0), "{what} {name}: EVAL");
                        }
                    }
                    assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{what}");
                    if !caps.native_acquire() {
                        // With the scripts cached (acquire's was flushed since: load it again), only EVALSHA
                        // is sent.
                        assert!(node.acquire(&k, &token, ttl).await.unwrap());
                        assert!(node.release(&k, &token).await.unwrap());
                        server.cmd(&["CONFIG", "RESETSTAT"]);
                        assert!(node.acquire(&k, &token, ttl).await.unwrap());
                        assert!(node.release(&k, &token).await.unwrap());
                        let releases = u64::from(!caps.native_release());
                        assert_eq!(stats(&server, "evalsha"), (1 + releases, 0), "{what}");
                        assert_eq!(stats(&server, "eval"), (0, 0), "{what}");
                    }
                }
            }
        },
    );
}

#[test]
fn inspect_reads_value_and_ttl_atomically() {
    on_every_server(
        "inspect_reads_value_and_ttl_atomically",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let k = key("inspect", backend);
                assert_eq!(node.inspect(&k).await.unwrap(), None);
                server.cmd(&["SET", &k, "value", "PX", "3000"]);
                let state = node.inspect(&k).await.unwrap().unwrap();
                assert_eq!(state.value, b"value");
                let ttl = state.ttl.unwrap();
                assert!(
                    ttl > Duration::from_millis(2500) && ttl <= Duration::from_secs(3),
                    "{ttl:?}"
                );
                server.cmd(&["PERSIST", &k]);
                assert_eq!(node.inspect(&k).await.unwrap().unwrap().ttl, None);
            }
        },
    );
}

#[test]
fn wrong_types_and_exhausted_fences_fail_definitely_before_writing() {
    on_every_server(
        "wrong_types_and_exhausted_fences_fail_definitely_before_writing",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let ttl = Ttl::from_millis(5000).unwrap();
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let token = Token::random().unwrap();
                let k = key("types", backend);
                let f = common::fence_of(&k);
                for (fence_value, kind) in [
                    ("not-a-number", redlease::NodeErrorKind::Fence),
                    ("-1", redlease::NodeErrorKind::Fence),
                    ("9223372036854775807", redlease::NodeErrorKind::Fence),
                ] {
                    server.cmd(&["SET", &f, fence_value]);
                    let err = node.acquire_fenced(&k, &f, &token, ttl).await.unwrap_err();
                    assert_eq!(err.kind(), kind, "{backend:?} {fence_value}: {err}");
                    assert!(!err.is_ambiguous());
                    assert_eq!(server.cmd(&["EXISTS", &k]), "0", "no lock key left behind");
                    assert_eq!(server.cmd(&["GET", &f]), fence_value);
                }
                server.cmd(&["DEL", &f]);
                server.cmd(&["HSET", &k, "field", "1"]);
                let err = node.acquire(&k, &token, ttl).await.unwrap_err();
                assert_eq!(
                    err.kind(),
                    redlease::NodeErrorKind::WrongType,
                    "{backend:?}"
                );
                assert!(!err.is_ambiguous());
                // Release and extend leave a key of another type alone and report "not ours".
                assert!(!node.release(&k, &token).await.unwrap());
                assert!(!node.extend(&k, &token, ttl).await.unwrap());
                assert_eq!(server.cmd(&["TYPE", &k]), "hash");
                server.cmd(&["DEL", &k]);
            }
        },
    );
}

#[test]
fn release_and_extend_work_under_oom_on_every_server_while_acquire_is_refused() {
    on_every_server(
        "release_and_extend_work_under_oom_on_every_server_while_acquire_is_refused",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let ttl = Ttl::from_millis(5000).unwrap();
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let token = Token::random().unwrap();
                let k = key("oom", backend);
                assert!(node.acquire(&k, &token, ttl).await.unwrap());
                // Load the scripts, then make every memory-growing command fail.
                assert!(node.extend(&k, &token, ttl).await.unwrap());
                assert!(node.release(&k, &token).await.unwrap());
                assert!(node.acquire(&k, &token, ttl).await.unwrap());
                server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
                let other = Token::random().unwrap();
                let err = node
                    .acquire(&format!("{k}:2"), &other, ttl)
                    .await
                    .unwrap_err();
                assert_eq!(
                    err.kind(),
                    redlease::NodeErrorKind::OutOfMemory,
                    "{backend:?}: {err}"
                );
                assert!(!err.is_ambiguous());
                let pttl_before: i64 = server.cmd(&["PTTL", &k]).parse().unwrap();
                let extended = node
                    .extend(&k, &token, Ttl::from_millis(60_000).unwrap())
                    .await;
                let pttl: i64 = server.cmd(&["PTTL", &k]).parse().unwrap();
                // The extend script (PEXPIRE) is allowed under OOM, and without Lua the watched `MULTI PEXPIRE
                // … GT EXEC` (no extension sends `SET`, which a full server refuses).
                assert!(
                    extended.unwrap(),
                    "{backend:?}: extend under OOM (before {pttl_before})"
                );
                assert!(pttl > 50_000, "{backend:?}: PTTL {pttl} after extend");
                // Another's lock is left alone: not extended, its TTL untouched.
                let theirs = format!("{k}:theirs");
                server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
                server.cmd(&["SET", &theirs, "another-token", "PX", "5000"]);
                server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
                assert!(
                    !node
                        .extend(&theirs, &token, Ttl::from_millis(60_000).unwrap())
                        .await
                        .unwrap(),
                    "{backend:?}"
                );
                let pttl: i64 = server.cmd(&["PTTL", &theirs]).parse().unwrap();
                assert!(pttl <= 5_000, "{backend:?}: PTTL {pttl} of another's lock");
                assert_eq!(server.cmd(&["GET", &theirs]), "another-token");
                assert!(
                    node.release(&k, &token).await.unwrap(),
                    "{backend:?}: release under OOM"
                );
                assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{backend:?}");
                server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
            }
        },
    );
}

/// Raw `EVAL` of a script (as a user of the public `scripts` module would send it), its reply as text.
fn raw_eval(
    server: &RedisServer,
    script: &scripts::Script,
    keys: &[&str],
    args: &[&str],
) -> Result<String, String> {
    let numkeys = keys.len().to_string();
    let mut cmd = vec!["EVAL", script.source, &numkeys];
    cmd.extend_from_slice(keys);
    cmd.extend_from_slice(args);
    server.try_cmd(&cmd)
}

#[test]
fn every_script_checks_its_arguments_before_its_first_write() {
    // The scripts as a user of the public `scripts` module sends them: on every server with Lua.
    on_each_flavor(
        "every_script_checks_its_arguments_before_its_first_write",
        &WITH_LUA,
        |flavor| {
            let server = RedisServer::start_flavor(flavor, &[]);
            let token = "0123456789abcdef0123456789abcdef01234567";
            let bad_ttls = [
                "0",
                "-5",
                "",
                "1.5",
                "1e3",
                "abc",
                " 100",
                "1000000000000000",
            ];
            for ttl in bad_ttls {
                // The fenced acquisition must not increment the counter before refusing (a partial write).
                server.cmd(&["SET", "f", "7"]);
                let err = raw_eval(
                    &server,
                    &scripts::ACQUIRE_FENCED,
                    &["k", "f"],
                    &[token, ttl],
                )
                .expect_err(ttl);
                assert!(err.contains("invalid TTL"), "{ttl:?}: {err}");
                assert_eq!(server.cmd(&["GET", "f"]), "7", "{ttl:?}: the fence moved");
                assert_eq!(server.cmd(&["EXISTS", "k"]), "0", "{ttl:?}");
                let err =
                    raw_eval(&server, &scripts::ACQUIRE, &["k"], &[token, ttl]).expect_err(ttl);
                assert!(err.contains("invalid TTL"), "{ttl:?}: {err}");
                assert_eq!(server.cmd(&["EXISTS", "k"]), "0", "{ttl:?}");
                // Extend with a non-positive TTL would delete the key (`PEXPIRE 0`) or set a wrong one.
                server.cmd(&["SET", "k", token, "PX", "60000"]);
                let err =
                    raw_eval(&server, &scripts::EXTEND, &["k"], &[token, ttl]).expect_err(ttl);
                assert!(err.contains("invalid TTL"), "{ttl:?}: {err}");
                assert_eq!(
                    server.cmd(&["GET", "k"]),
                    token,
                    "{ttl:?}: extend deleted the key"
                );
                let pttl: i64 = server.cmd(&["PTTL", "k"]).parse().unwrap();
                assert!(pttl > 50_000, "{ttl:?}: extend changed the TTL to {pttl}");
                server.cmd(&["DEL", "k"]);
            }
            // A missing TTL argument and an empty token are refused too.
            let err =
                raw_eval(&server, &scripts::ACQUIRE_FENCED, &["k", "f"], &[token]).unwrap_err();
            assert!(err.contains("invalid TTL"), "{err}");
            let err = raw_eval(&server, &scripts::ACQUIRE, &["k"], &["", "1000"]).unwrap_err();
            assert!(err.contains("invalid token"), "{err}");
            assert_eq!(server.cmd(&["GET", "f"]), "7");
            assert_eq!(server.cmd(&["EXISTS", "k"]), "0");
            // The largest TTL redlease sends (2^46 ms) is accepted.
            let max = redlease::Ttl::MAX.as_millis().to_string();
            assert_eq!(
                raw_eval(
                    &server,
                    &scripts::ACQUIRE_FENCED,
                    &["k", "f"],
                    &[token, &max]
                )
                .unwrap(),
                "8"
            );
            assert_eq!(
                raw_eval(&server, &scripts::EXTEND, &["k"], &[token, &max]).unwrap(),
                "1"
            );
        },
    );
}

#[test]
fn the_capability_probe_writes_nothing_and_reports_set_nx_get_ifeq_and_delifeq_per_flavor() {
    let test =
        "the_capability_probe_writes_nothing_and_reports_set_nx_get_ifeq_and_delifeq_per_flavor";
    for flavor in [Flavor::Redis, Flavor::Valkey81, Flavor::Valkey91] {
        let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
            continue;
        };
        // [SET NX GET, SET IFEQ, DELIFEQ]: Redis 7.0 has only the first, Valkey 8.1 the first two, 9.1 all.
        let expected = match flavor {
            Flavor::Redis => "1\n0\n0",
            Flavor::Valkey81 => "1\n1\n0",
            _ => "1\n1\n1",
        };
        // The probe's own SETs are refused for their expiry, never executed; DELIFEQ compares with a value
        // no key holds.
        server.cmd(&["SET", "s", "v"]);
        server.cmd(&["HSET", "h", "a", "1"]);
        for keys in [&["k"][..], &["k", "f"], &["s"], &["h"]] {
            assert_eq!(
                raw_eval(&server, &scripts::PROBE, keys, &[]).unwrap(),
                expected,
                "{flavor} {keys:?}"
            );
        }
        assert_eq!(server.cmd(&["DBSIZE"]), "2", "{flavor}");
        assert_eq!(server.cmd(&["GET", "s"]), "v", "{flavor}");
        assert_eq!(server.cmd(&["EXISTS", "k"]), "0", "{flavor}");
    }
}

#[test]
fn the_fresh_acquire_script_never_touches_an_existing_key() {
    // The scripts as a user of the public `scripts` module sends them: on every server with Lua.
    on_each_flavor(
        "the_fresh_acquire_script_never_touches_an_existing_key",
        &WITH_LUA,
        |flavor| {
            let server = RedisServer::start_flavor(flavor, &[]);
            let token = "0123456789abcdef0123456789abcdef01234567";
            assert_eq!(
                raw_eval(&server, &scripts::ACQUIRE_FRESH, &["k"], &[token, "60000"]).unwrap(),
                "1"
            );
            assert_eq!(server.cmd(&["GET", "k"]), token);
            // A late copy of the same fresh acquisition: the key exists (even with this token), nothing changes.
            server.cmd(&["PEXPIRE", "k", "300000"]);
            assert_eq!(
                raw_eval(&server, &scripts::ACQUIRE_FRESH, &["k"], &[token, "1000"]).unwrap(),
                "0"
            );
            let pttl: i64 = server.cmd(&["PTTL", "k"]).parse().unwrap();
            assert!(pttl > 250_000, "the TTL was reset to {pttl}");
            server.cmd(&["HSET", "h", "a", "1"]);
            let err =
                raw_eval(&server, &scripts::ACQUIRE_FRESH, &["h"], &[token, "1000"]).unwrap_err();
            assert!(err.starts_with("WRONGTYPE the lock key h"), "{err}");
        },
    );
}
