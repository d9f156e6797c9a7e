//! Every server flavor of the live matrix starts, is the binary it claims, and can replace another on a port.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use redlease_testkit::server::{Flavor, RedisServer};

fn version_line(server: &RedisServer) -> String {
    let info = server.cmd(&["INFO", "server"]);
    let key = match server.flavor() {
        Flavor::Redis => "redis_version:",
        _ => "valkey_version:",
    };
    info.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("{}: no {key} in INFO", server.flavor()))
        .trim()
        .to_owned()
}

#[test]
fn each_flavor_runs_the_binary_it_names() {
    for flavor in Flavor::ALL {
        let Some(server) =
            RedisServer::start_flavor_or_skip("each_flavor_runs_the_binary_it_names", flavor, &[])
        else {
            continue;
        };
        let version = version_line(&server);
        match flavor {
            Flavor::Redis => assert!(version.starts_with('7'), "{version}"),
            Flavor::Valkey81 => assert_eq!(version, "8.1.8"),
            Flavor::Valkey91 | Flavor::Valkey91NoLua => assert_eq!(version, "9.1.2"),
            other => panic!("untested flavor {other}"),
        }
        let eval = server.try_cmd(&["EVAL", "return 1", "0"]);
        if flavor == Flavor::Valkey91NoLua {
            let err = eval.expect_err("Lua was unloaded");
            assert!(err.contains("scripting engine"), "{err}");
        } else {
            assert_eq!(eval.unwrap(), "1", "{flavor}");
        }
    }
}

#[test]
fn a_server_can_be_replaced_by_another_flavor_on_the_same_port() {
    let test = "a_server_can_be_replaced_by_another_flavor_on_the_same_port";
    if !Flavor::Valkey91.available(test) {
        return;
    }
    let Some(mut server) = RedisServer::start_flavor_or_skip(test, Flavor::Redis, &[]) else {
        return;
    };
    let port = server.port();
    let before = server.run_id().unwrap().to_owned();
    server.try_restart_as(Flavor::Valkey91).unwrap();
    assert_eq!(server.port(), port);
    assert_eq!(server.flavor(), Flavor::Valkey91);
    assert_eq!(version_line(&server), "9.1.2");
    assert_ne!(server.run_id().unwrap(), before);
    server.try_restart_as(Flavor::Valkey91NoLua).unwrap();
    assert!(server.try_cmd(&["EVAL", "return 1", "0"]).is_err());
}

#[test]
fn on_each_flavor_runs_every_flavor_and_names_the_one_that_failed() {
    use std::sync::Mutex;
    let test = "on_each_flavor_runs_every_flavor_and_names_the_one_that_failed";
    if !Flavor::ALL.iter().all(|f| f.available(test)) {
        return;
    }
    let ran = Mutex::new(Vec::new());
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        redlease_testkit::server::on_each_flavor(test, &Flavor::ALL, |flavor| {
            ran.lock().unwrap().push(flavor);
            assert_ne!(flavor, Flavor::Valkey81, "deliberate failure");
        });
    }));
    let payload = outcome.expect_err("a body failed, so the test must fail");
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        message.contains("failed on valkey-8.1.8: assertion")
            && message.contains("deliberate failure"),
        "{message}"
    );
    assert!(!message.contains("on redis"), "{message}");
    // Every body ran, the failing one did not stop the others.
    let mut ran = ran.into_inner().unwrap();
    ran.sort_by_key(|f| f.name());
    let mut all = Flavor::ALL.to_vec();
    all.sort_by_key(|f| f.name());
    assert_eq!(ran, all);
}
