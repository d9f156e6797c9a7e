//! Runs the demo binary: in memory, against temporary `redis-server`s (single node and Redlock), and with bad
//! configurations. The live cases skip with a `SKIP` line (one per binary and missing binary) when no `redis-server` is installed
//! (and fail instead with `REDLEASE_REQUIRE_REDIS=1`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};

use redlease_testkit::server::{RedisServer, RedisServers, free_port};

const ACQUISITIONS: usize = 12;

fn demo(nodes: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_redlease-demo"));
    match nodes {
        Some(nodes) => cmd.env("REDLEASE_NODES", nodes),
        None => cmd.env_remove("REDLEASE_NODES"),
    };
    cmd.output().expect("run the demo binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The lines reporting an acquisition.
fn holds(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.contains(" holds the lock "))
        .collect()
}

/// The fencing tokens printed, in order.
fn fences(stdout: &str) -> Vec<u64> {
    holds(stdout)
        .iter()
        .map(|l| {
            let rest = l
                .split("fencing token")
                .nth(1)
                .unwrap_or_else(|| panic!("no fence in {l:?}"));
            rest.split_whitespace().next().unwrap().parse().unwrap()
        })
        .collect()
}

fn assert_succeeded(out: &Output) -> String {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed ({}):\n{stdout}\n{}",
        out.status,
        text(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("{ACQUISITIONS} acquisitions in"))
            && stdout.contains("; 0 while another worker held the lock"),
        "{stdout}"
    );
    assert_eq!(holds(&stdout).len(), ACQUISITIONS, "{stdout}");
    stdout
}

fn assert_config_error(nodes: &str, expected: &str) {
    let out = demo(Some(nodes));
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{nodes:?}: {}\n{stderr}",
        out.status
    );
    assert!(stderr.contains(expected), "{nodes:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{nodes:?}: {stderr}");
    assert!(holds(&text(&out.stdout)).is_empty());
}

#[test]
fn without_configuration_the_demo_runs_in_memory_with_increasing_fencing_tokens() {
    let out = demo(None);
    let stdout = assert_succeeded(&out);
    assert!(stdout.contains("in-memory backend"), "{stdout}");
    // A fresh in-memory counter: exactly 1, 2, …, 12.
    assert_eq!(
        fences(&stdout),
        (1..=ACQUISITIONS as u64).collect::<Vec<_>>()
    );
    assert!(
        stdout.contains("0 with a fencing token that did not increase"),
        "{stdout}"
    );
}

#[test]
fn one_redis_url_runs_the_demo_fenced_on_that_server() {
    let Some(server) =
        RedisServer::start_or_skip("one_redis_url_runs_the_demo_fenced_on_that_server")
    else {
        return;
    };
    let out = demo(Some(&server.url()));
    let stdout = assert_succeeded(&out);
    assert!(
        stdout.contains(&format!(
            "Redis backend (redis-rs), single node {}",
            server.url()
        )),
        "{stdout}"
    );
    assert_eq!(
        fences(&stdout),
        (1..=ACQUISITIONS as u64).collect::<Vec<_>>()
    );
    // The tokens came from the server: its counter saw every acquisition, and the lock was released.
    assert_eq!(
        server.cmd(&["GET", "demo:{report}:fence"]),
        ACQUISITIONS.to_string()
    );
    assert_eq!(server.cmd(&["EXISTS", "demo:{report}:lock"]), "0");

    // A second run continues from the server's counter.
    let stdout = assert_succeeded(&demo(Some(&server.url())));
    let expected: Vec<u64> = (ACQUISITIONS as u64 + 1..=2 * ACQUISITIONS as u64).collect();
    assert_eq!(fences(&stdout), expected);
}

#[test]
fn three_redis_urls_run_the_demo_as_redlock_without_fencing() {
    let Some(servers) = RedisServers::start_or_skip(
        "three_redis_urls_run_the_demo_as_redlock_without_fencing",
        3,
    ) else {
        return;
    };
    let urls = servers.urls();
    let out = demo(Some(&urls.join(",")));
    let stdout = assert_succeeded(&out);
    assert!(
        stdout.contains(&format!(
            "Redlock over 3 nodes (quorum 2): {}",
            urls.join(", ")
        )),
        "{stdout}"
    );
    for line in holds(&stdout) {
        assert!(!line.contains("fencing token"), "{line}");
        // `token abcd… valid for 1.98s`: a 4-character prefix, never the whole token.
        let token = line
            .split("token ")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        assert_eq!(token.chars().count(), 5, "{line}");
        assert!(token.ends_with('…'), "{line}");
        let valid: f64 = line
            .split("valid for ")
            .nth(1)
            .unwrap()
            .trim_end_matches('s')
            .parse()
            .unwrap();
        assert!(valid > 0.0 && valid < 2.0, "{line}");
    }
    // One server named twice is not a Redlock set of independent servers.
    assert_config_error(
        &format!("{},{},{}", urls[0], urls[1], urls[0]),
        &format!("names endpoint {} a second time", urls[0]),
    );
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(
            server.cmd(&["EXISTS", "demo:{report}:lock"]),
            "0",
            "server {i}"
        );
        assert_eq!(
            server.cmd(&["EXISTS", "demo:{report}:fence"]),
            "0",
            "server {i}"
        );
    }
}

#[test]
fn bad_node_lists_fail_with_a_message_and_exit_code_2() {
    assert_config_error(
        "redis://127.0.0.1:7001,redis://127.0.0.1:7002",
        "2 URLs given; use one",
    );
    assert_config_error(
        "redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003,redis://127.0.0.1:7004",
        "4 URLs given",
    );
    assert_config_error("http://127.0.0.1:7001", "entry 1 is not a valid Redis URL");
    assert_config_error(
        "redis://127.0.0.1:7001,,redis://127.0.0.1:7002",
        "entry 2 of 3 is empty",
    );
    // Nothing listens on a port just released; the password never appears in the message.
    let port = free_port();
    let out = demo(Some(&format!("redis://:hunter2@127.0.0.1:{port}")));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot connect to redis://127.0.0.1:{port}/0")),
        "{stderr}"
    );
    assert!(
        !stderr.contains("hunter2") && !stderr.contains("panicked"),
        "{stderr}"
    );
}
