//! `CLIENT KILL` with a command in flight. The server is stopped (SIGSTOP) while the adapter writes a lock
//! command and an admin connection writes `CLIENT KILL TYPE normal`; on SIGCONT the server handles both in
//! one event-loop turn, in either order: the kill may come before the command is read (never executed) or
//! after it ran but before its reply was written (executed, reply lost). A client that re-sent the command
//! after reconnecting would turn a successful release into "not held" (or run a stale acquisition); the
//! adapters must report an error or the true result, and the same node must work for the next operation.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{RedisNode, Token, Ttl};
use redlease_testkit::server::{Flavor, RedisServer};

use redlease_adapters::fred::FredNode;
use redlease_adapters::fred::fred::prelude::ClientLike;

use crate::common::{self, command_calls, get, on_every_server, script_calls};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Acquire a free key: the only right answers are "acquired" or an error.
    Acquire,
    /// Release our own key: the only right answers are "released" or an error.
    Release,
}

/// An admin connection opened (and accepted by the server) before the server is stopped.
struct Admin(BufReader<TcpStream>);

impl Admin {
    fn connect(port: u16) -> Self {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut admin = Self(BufReader::new(stream));
        admin.send(&["PING"]);
        assert_eq!(admin.reply(), "+PONG");
        admin
    }

    fn send(&mut self, args: &[&str]) {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.0.get_mut().write_all(out.as_bytes()).unwrap();
    }

    fn reply(&mut self) -> String {
        let mut line = String::new();
        self.0.read_line(&mut line).unwrap();
        line.trim_end().to_owned()
    }
}

/// How one iteration ended, for the summary line.
#[derive(Debug, Default)]
struct Tally {
    correct: u32,
    error_not_run: u32,
    error_run: u32,
}

/// How often the command of `op` ran since the last `CONFIG RESETSTAT` (the node's capability check has
/// run, so each is one command): the acquire script, or without Lua `SET NX`; the release script, or where
/// Valkey offers it `DELIFEQ`.
fn op_calls(server: &RedisServer, op: Op) -> u64 {
    let flavor = server.flavor();
    match op {
        Op::Acquire if !common::has_lua(flavor) => command_calls(server, "set"),
        Op::Release if matches!(flavor, Flavor::Valkey91 | Flavor::Valkey91NoLua) => {
            command_calls(server, "delifeq")
        }
        _ => script_calls(server),
    }
}

async fn one(
    server: &RedisServer,
    node: &Arc<dyn RedisNode>,
    backend: &str,
    op: Op,
    kill_first: bool,
    round: u32,
    tally: &mut Tally,
) {
    let what = format!("{backend} {op:?} kill_first={kill_first} round={round}");
    let ttl = Ttl::from_millis(10_000).unwrap();
    let k = format!("kill:{{{backend}}}:{op:?}:{kill_first}:{round}");
    let token = Token::random().unwrap();
    if op == Op::Release {
        server.cmd(&["SET", &k, token.as_str(), "PX", "10000"]);
    }
    let mut admin = Admin::connect(server.port());
    server.cmd(&["CONFIG", "RESETSTAT"]);

    server.pause();
    let call = |node: Arc<dyn RedisNode>, k: String, token: Token| {
        tokio::spawn(async move {
            match op {
                Op::Acquire => node.acquire(&k, &token, ttl).await,
                Op::Release => node.release(&k, &token).await,
            }
        })
    };
    let handle = if kill_first {
        admin.send(&["CLIENT", "KILL", "TYPE", "normal"]);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let h = call(Arc::clone(node), k.clone(), token.clone());
        tokio::time::sleep(Duration::from_millis(50)).await;
        h
    } else {
        let h = call(Arc::clone(node), k.clone(), token.clone());
        tokio::time::sleep(Duration::from_millis(50)).await;
        admin.send(&["CLIENT", "KILL", "TYPE", "normal"]);
        tokio::time::sleep(Duration::from_millis(20)).await;
        h
    };
    server.resume();
    let killed = admin.reply();
    assert!(
        killed.starts_with(':'),
        "{what}: CLIENT KILL replied {killed}"
    );

    let result = tokio::time::timeout(Duration::from_secs(3), handle)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer after the kill (re-sent and waiting?)"))
        .unwrap();
    // Give a re-sending client time to reconnect and replay, then count what ran.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ran = op_calls(server, op);
    let value = get(server, &k);
    assert!(ran <= 1, "{what}: the command ran {ran} times (re-sent)");
    match (op, &result) {
        (Op::Acquire, Ok(true)) => {
            assert_eq!(ran, 1, "{what}");
            assert_eq!(
                value,
                token.as_str(),
                "{what}: acquired but the key holds {value:?}"
            );
            tally.correct += 1;
        }
        (Op::Release, Ok(true)) => {
            assert_eq!(ran, 1, "{what}");
            assert_eq!(value, "", "{what}: released but the key remains");
            tally.correct += 1;
        }
        (_, Ok(false)) => {
            panic!("{what}: wrong answer (false) for a command that must succeed; ran {ran}")
        }
        (_, Err(e)) => {
            // Unsent (definite) or sent (ambiguous); the state must match what actually ran.
            if !e.is_ambiguous() {
                assert_eq!(ran, 0, "{what}: a definite error but the command ran: {e}");
            }
            let expected_if_ran = if op == Op::Acquire {
                token.as_str()
            } else {
                ""
            };
            let expected_if_not = if op == Op::Acquire {
                ""
            } else {
                token.as_str()
            };
            if ran == 1 {
                assert_eq!(value, expected_if_ran, "{what}: {e}");
                tally.error_run += 1;
            } else {
                assert_eq!(value, expected_if_not, "{what}: {e}");
                tally.error_not_run += 1;
            }
        }
    }

    // The same node works for the next operation (after its reconnection).
    let k2 = format!("{k}:after");
    let t2 = Token::random().unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match node.acquire(&k2, &t2, ttl).await {
            Ok(true) => break,
            Ok(false) => panic!("{what}: a fresh key reported contended after the kill"),
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "{what}: node never recovered: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert_eq!(get(server, &k2), t2.as_str(), "{what}");
    let state = node.inspect(&k2).await.unwrap().expect("the key exists");
    assert!(state.holds(&t2), "{what}: inspect answered for another key");
    assert!(node.release(&k2, &t2).await.unwrap(), "{what}");
    assert_eq!(node.inspect(&k2).await.unwrap(), None, "{what}");
    server.cmd(&["DEL", &k]);
}

#[test]
fn client_kill_with_a_command_in_flight_never_yields_a_wrong_answer_and_the_node_recovers() {
    on_every_server(
        "client_kill_with_a_command_in_flight_never_yields_a_wrong_answer_and_the_node_recovers",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            common::preload(&server);
            // Reconnecting clients only: a redis-rs MultiplexedConnection never reconnects after a kill. fred runs
            // twice: as built (`fail_fast`), and with `with_fail_fast(false)`, where only `max_attempts: 1` stands
            // between a closed connection and a replay.
            let mut cases: Vec<(String, Arc<dyn RedisNode>)> = Vec::new();
            for backend in common::RECONNECTING {
                cases.push((
                    format!("{backend:?}"),
                    common::node(backend, &server.url()).await,
                ));
            }
            let client = common::fred_client(&server.url());
            client.init().await.unwrap();
            cases.push((
                "FredClientNoFailFast".to_owned(),
                Arc::new(FredNode::new(client).with_fail_fast(false)),
            ));
            // A pool: every command for one key on one member's connection, each member reconnecting by itself.
            cases.push((
                "FredPool".to_owned(),
                common::node(common::Backend::FredPool, &server.url()).await,
            ));
            for (name, node) in &cases {
                let mut tally = Tally::default();
                for round in 0..3 {
                    for op in [Op::Acquire, Op::Release] {
                        for kill_first in [true, false] {
                            one(&server, node, name, op, kill_first, round, &mut tally).await;
                        }
                    }
                }
                println!("{name}: {tally:?}");
                assert!(
                    tally.error_run > 0,
                    "{name}: no iteration lost the reply of an executed command: {tally:?}"
                );
            }
        },
    );
}
