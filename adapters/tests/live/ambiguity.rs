//! Ambiguity: a command that reached the server but whose reply was lost is reported as ambiguous, never
//! re-sent by the client, and recognised as ours by a retry; a refused connection is definite.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{NodeErrorKind, RedisNode, Token, Ttl};
use redlease_adapters::fred::FredNode;
use redlease_adapters::redis::{RedisRsNode, redis};
use redlease_testkit::proxy::{FaultProxy, ProxyMode};
use redlease_testkit::server::RedisServer;

use crate::common::{self, ALL_BACKENDS, Backend, on_every_server};

#[test]
fn reply_lost_after_execution_is_ambiguous_not_resent_and_a_retry_recognises_its_token() {
    on_every_server(
        "reply_lost_after_execution_is_ambiguous_not_resent_and_a_retry_recognises_its_token",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            common::preload(&server);
            let direct = common::node(Backend::RedisMultiplexed, &server.url()).await;
            let ttl = Ttl::from_millis(5000).unwrap();
            for backend in ALL_BACKENDS {
                let proxy = FaultProxy::start(server.addr().parse().unwrap()).unwrap();
                let node = common::node(backend, &format!("{}/0", proxy.url())).await;
                let token = Token::random().unwrap();
                let k = common::key("lost-reply", backend);
                // What one undisturbed acquisition of a free key sends on this server (a script and the SET
                // inside it, or without Lua a SET NX): the reference for "sent once".
                server.cmd(&["CONFIG", "RESETSTAT"]);
                let reference = format!("{k}:reference");
                assert!(node.acquire(&reference, &token, ttl).await.unwrap());
                let once = common::lock_calls(&server);
                assert!(node.release(&reference, &token).await.unwrap());
                proxy.set_mode(ProxyMode::DropReplies);
                server.cmd(&["CONFIG", "RESETSTAT"]);
                let call = {
                    let node = Arc::clone(&node);
                    let (k, token) = (k.clone(), token.clone());
                    tokio::spawn(async move { node.acquire(&k, &token, ttl).await })
                };
                // The request reaches the server and runs; then the connection drops without a reply.
                let applied_by = Instant::now() + Duration::from_secs(2);
                while server.cmd(&["EXISTS", &k]) == "0" {
                    assert!(
                        Instant::now() < applied_by,
                        "{backend:?}: the request never reached the server"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                proxy.reset();
                // A client that re-sent the command after reconnecting would wait for the (dropped) reply forever.
                let err = tokio::time::timeout(Duration::from_secs(2), call)
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{backend:?}: no answer: the command was re-sent after reconnecting")
                    })
                    .unwrap()
                    .unwrap_err();
                assert!(err.is_ambiguous(), "{backend:?}: {err}");
                assert_eq!(server.cmd(&["GET", &k]), token.as_str());
                // Not re-sent after the client reconnects.
                proxy.set_mode(ProxyMode::Forward);
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert_eq!(
                    common::lock_calls(&server),
                    once,
                    "{backend:?}: the command was re-sent"
                );
                // A retry of the same acquisition recognises its own token.
                assert!(
                    direct.acquire(&k, &token, ttl).await.unwrap(),
                    "{backend:?}"
                );
                assert!(direct.release(&k, &token).await.unwrap());
            }
        },
    );
}

#[test]
fn client_response_timeouts_are_ambiguous_timeouts() {
    on_every_server(
        "client_response_timeouts_are_ambiguous_timeouts",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let proxy = FaultProxy::start(server.addr().parse().unwrap()).unwrap();
            let url = format!("{}/0", proxy.url());
            let ttl = Ttl::from_millis(5000).unwrap();
            let token = Token::random().unwrap();

            let client = redis::Client::open(url.as_str()).unwrap();
            let config = redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(Duration::from_millis(150)));
            let conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .unwrap();
            let redis_node = RedisRsNode::new(conn);
            let fred_client = common::fred_client(&url);
            redlease_adapters::fred::fred::prelude::ClientLike::init(&fred_client)
                .await
                .unwrap();
            let fred_node =
                FredNode::new(fred_client).with_command_timeout(Duration::from_millis(150));
            let nodes: [(&str, &dyn RedisNode); 2] =
                [("redis-rs", &redis_node), ("fred", &fred_node)];

            proxy.set_mode(ProxyMode::Blackhole);
            for (name, node) in nodes {
                let started = Instant::now();
                let err = node.acquire("k", &token, ttl).await.unwrap_err();
                assert_eq!(err.kind(), NodeErrorKind::Timeout, "{name}: {err}");
                assert!(err.is_ambiguous(), "{name}");
                assert!(started.elapsed() < Duration::from_secs(1), "{name}");
            }
        },
    );
}

/// How long one call to a dead server may take: every backend's connection timeout is 500 ms, and a refused
/// connection is answered by the kernel at once; a call that waits for a reply that can never come would take
/// the whole response timeout (500 ms) or hang.
const PROMPT: Duration = Duration::from_millis(400);

#[test]
fn after_the_server_died_every_backend_fails_promptly_and_definitely_without_sending() {
    on_every_server(
        "after_the_server_died_every_backend_fails_promptly_and_definitely_without_sending",
        |flavor| async move {
            let mut server = RedisServer::start_flavor(flavor, &[]);
            let ttl = Ttl::from_millis(5000).unwrap();
            let token = Token::random().unwrap();
            let mut nodes = Vec::new();
            for backend in ALL_BACKENDS {
                let node = match backend {
                    // The adapter's own reconnection settings (the tests' manager retries reconnections, with
                    // backoff, for scenarios that heal a cut connection).
                    Backend::RedisManager => Arc::new(
                        redlease_adapters::redis::ManagedNode::connect(
                            &redis::Client::open(server.url()).unwrap(),
                        )
                        .await
                        .unwrap(),
                    ),
                    _ => common::node(backend, &server.url()).await,
                };
                nodes.push((backend, node));
            }
            // Every connection is in use (and has run a script) before the server dies.
            for (backend, node) in &nodes {
                let k = common::key("before-kill", *backend);
                assert!(node.acquire(&k, &token, ttl).await.unwrap(), "{backend:?}");
            }
            server.kill();
            let nodes_again = nodes.clone();
            for (backend, node) in nodes {
                // The first call may meet the dying connection (ambiguous); once the node knows the connection is
                // gone, calls are refused before sending, promptly.
                let mut definite = 0;
                let deadline = Instant::now() + Duration::from_secs(3);
                while definite < 5 {
                    let started = Instant::now();
                    let err = tokio::time::timeout(
                        Duration::from_secs(5),
                        node.acquire("k", &token, ttl),
                    )
                    .await
                    .unwrap_or_else(|_| panic!("{backend:?}: a call to a dead server hung"))
                    .unwrap_err();
                    let took = started.elapsed();
                    if err.is_ambiguous() {
                        assert_eq!(
                            definite, 0,
                            "{backend:?}: ambiguous after a definite refusal: {err}"
                        );
                    } else {
                        assert_eq!(err.kind(), NodeErrorKind::Connection, "{backend:?}: {err}");
                        assert!(took < PROMPT, "{backend:?}: a refusal took {took:?}: {err}");
                        definite += 1;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "{backend:?}: still ambiguous after 3 s: {err}"
                    );
                }
                // Release and extend too: nothing can be sent, so nothing is ambiguous.
                let err = node.release("k", &token).await.unwrap_err();
                assert!(!err.is_ambiguous(), "{backend:?}: {err}");
                let err = node.extend("k", &token, ttl).await.unwrap_err();
                assert!(!err.is_ambiguous(), "{backend:?}: {err}");
            }
            // And it stays so while the server is down (fred keeps reconnecting in the background meanwhile).
            for round in 0..5 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                for (backend, node) in &nodes_again {
                    let started = Instant::now();
                    let err = tokio::time::timeout(
                        Duration::from_secs(5),
                        node.acquire("k", &token, ttl),
                    )
                    .await
                    .unwrap_or_else(|_| panic!("{backend:?} round {round}: a call hung"))
                    .unwrap_err();
                    assert!(!err.is_ambiguous(), "{backend:?} round {round}: {err}");
                    assert!(
                        started.elapsed() < PROMPT,
                        "{backend:?} round {round}: {:?}",
                        started.elapsed()
                    );
                }
            }
            // The server comes back (same port, empty): every reconnecting backend works again; a multiplexed
            // connection never reconnects (documented) and keeps refusing definitely.
            server.restart();
            for (backend, node) in &nodes_again {
                let deadline = Instant::now() + Duration::from_secs(5);
                loop {
                    match node.acquire("back", &token, ttl).await {
                        Ok(acquired) => {
                            assert!(acquired, "{backend:?}");
                            assert_ne!(*backend, Backend::RedisMultiplexed, "reconnected?");
                            break;
                        }
                        Err(e) if *backend == Backend::RedisMultiplexed => {
                            assert!(!e.is_ambiguous(), "{e}");
                            break;
                        }
                        Err(e) => {
                            assert!(
                                Instant::now() < deadline,
                                "{backend:?} never recovered: {e}"
                            );
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }
        },
    );
}

/// The client address (`ip:port`) of every command `MONITOR` reports on `server` that mentions `needle`,
/// recorded while `work` runs.
async fn clients_sending<F: std::future::Future<Output = ()>>(
    server: &RedisServer,
    needle: &str,
    work: F,
) -> std::collections::BTreeSet<String> {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::net::TcpStream::connect(server.addr()).unwrap();
    stream.write_all(b"*1\r\n$7\r\nMONITOR\r\n").unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), "+OK");
    work.await;
    // Commands from clients look like `+1700000000.123456 [0 127.0.0.1:54321] "EVALSHA" …`; the commands a
    // script runs carry `[0 lua]`.
    let mut seen = std::collections::BTreeSet::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if !line.contains(needle) {
                    continue;
                }
                if let Some(addr) = line
                    .split_once('[')
                    .and_then(|(_, rest)| rest.split_once(']'))
                    .and_then(|(inside, _)| inside.split_whitespace().nth(1))
                    && addr != "lua"
                {
                    seen.insert(addr.to_owned());
                }
            }
        }
    }
    seen
}

#[test]
fn a_fred_pool_sends_every_command_for_one_key_over_one_connection() {
    on_every_server(
        "a_fred_pool_sends_every_command_for_one_key_over_one_connection",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            // Four members: a round-robin pool would spread twenty commands over all of them.
            let pool = common::fred_builder(&server.url()).build_pool(4).unwrap();
            redlease_adapters::fred::fred::prelude::ClientLike::init(&pool)
                .await
                .unwrap();
            let node = FredNode::new(pool);
            let ttl = Ttl::from_millis(5000).unwrap();
            for k in ["pool:{a}:lock", "pool:{b}:lock", "pool:{c}:lock"] {
                let token = Token::random().unwrap();
                let addrs = clients_sending(&server, k, async {
                    for _ in 0..5 {
                        assert!(node.acquire(k, &token, ttl).await.unwrap());
                        assert!(node.extend(k, &token, ttl).await.unwrap());
                        assert!(node.inspect(k).await.unwrap().is_some());
                        assert!(node.release(k, &token).await.unwrap());
                    }
                })
                .await;
                assert_eq!(addrs.len(), 1, "{k}: sent over {addrs:?}");
            }
        },
    );
}
