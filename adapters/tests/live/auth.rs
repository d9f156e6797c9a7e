//! Authentication and authorisation failures: definite `Auth` errors without secrets in any message.

use std::time::{Duration, Instant};

use redlease::{LockManager, NodeErrorKind, RedisNode, Token, Ttl};
use redlease_adapters::fred as fred_adapter;
use redlease_adapters::redis::{self as redis_adapter, MultiplexedNode, redis};
use redlease_testkit::server::RedisServer;

use crate::common::{self, chain, first_node_error, on_every_server};

use crate::stats::Stats;

const PASSWORD: &str = "s3cret-pw-4711";
const WRONG: &str = "wrong-pw-0815";

fn assert_no_secret(text: &str) {
    assert!(!text.contains(PASSWORD), "password leaked: {text}");
    assert!(!text.contains(WRONG), "attempted password leaked: {text}");
}

#[test]
fn missing_or_wrong_password_is_a_definite_auth_error_without_secrets() {
    on_every_server(
        "missing_or_wrong_password_is_a_definite_auth_error_without_secrets",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &["--requirepass", PASSWORD]);
            let ttl = Ttl::from_millis(1000).unwrap();
            let token = Token::random().unwrap();

            // No password. redis-rs opens the connection and every command is refused with NOAUTH; fred's
            // connection handshake is refused already, and its error classifies the same way.
            use redlease_adapters::fred::fred::prelude::ClientLike;
            let client = common::fred_client(&server.url());
            let err = client.init().await.unwrap_err();
            let node_err = fred_adapter::node_error(&err);
            assert_eq!(node_err.kind(), NodeErrorKind::Auth, "fred: {err}");
            assert!(!node_err.is_ambiguous());
            assert_no_secret(&chain(&node_err));
            let nodes: Vec<(&str, Box<dyn RedisNode>)> = vec![(
                "redis-rs",
                Box::new(
                    MultiplexedNode::connect(&redis::Client::open(server.url()).unwrap())
                        .await
                        .unwrap(),
                ),
            )];
            for (name, node) in nodes {
                let err = node.acquire("k", &token, ttl).await.unwrap_err();
                assert_eq!(err.kind(), NodeErrorKind::Auth, "{name}: {err}");
                assert!(!err.is_ambiguous(), "{name}");
                assert_no_secret(&chain(&err));
                assert!(
                    !chain(&err).contains(token.as_str()),
                    "{name}: token leaked"
                );
                // Through the manager: not contention, the node error is kept, and no retry (one attempt, no new
                // connection: counted on the server).
                let manager = LockManager::single(
                    node,
                    common::config(Duration::from_secs(1)).with_attempts(3),
                )
                .unwrap();
                let mut admin = Admin::new(&server);
                let before = admin.stats();
                let err = manager.lock("k").acquire().await.unwrap_err();
                let seen = admin.stats().since(&before);
                assert!(!err.is_contended(), "{name}: {err}");
                assert_eq!(
                    first_node_error(&err).unwrap().kind(),
                    NodeErrorKind::Auth,
                    "{name}"
                );
                assert!(
                    matches!(err, redlease::Error::NotAcquired { attempts: 1, .. }),
                    "{name}: retried: {err}"
                );
                assert_eq!(seen.connections, 0, "{name}: {seen:?}");
                assert_no_secret(&chain(&err));
                assert_eq!(server.cmd(&["EXISTS", "k"]), "0");
            }

            // Wrong password: the connection itself is refused; the classified error is Auth and definite.
            let wrong_url = server.url_with_password(WRONG);
            let err = MultiplexedNode::connect(&redis::Client::open(wrong_url.as_str()).unwrap())
                .await
                .unwrap_err();
            let node_err = redis_adapter::node_error(&err);
            assert_eq!(node_err.kind(), NodeErrorKind::Auth, "redis-rs: {err}");
            assert!(!node_err.is_ambiguous());
            assert_no_secret(&chain(&node_err));

            let client = common::fred_client(&wrong_url);
            let err = client.init().await.unwrap_err();
            let node_err = fred_adapter::node_error(&err);
            assert_eq!(node_err.kind(), NodeErrorKind::Auth, "fred: {err}");
            assert!(!node_err.is_ambiguous());
            assert_no_secret(&chain(&node_err));

            // The right password works for both.
            let good = server.url_with_password(PASSWORD);
            let node = MultiplexedNode::connect(&redis::Client::open(good.as_str()).unwrap())
                .await
                .unwrap();
            assert!(node.acquire("k", &token, ttl).await.unwrap());
            assert!(node.release("k", &token).await.unwrap());
            assert_no_secret(&format!("{node:?} {:?}", node.profile().endpoint));
            let node = common::node(common::Backend::FredClient, &good).await;
            assert!(node.acquire("k", &token, ttl).await.unwrap());
            assert!(node.release("k", &token).await.unwrap());
            assert_no_secret(&node.profile().endpoint.unwrap_or_default());
        },
    );
}

/// An admin connection that survives the password rotation: its own ACL user, one persistent connection (so
/// that it adds nothing to the connection count between two snapshots).
struct Admin(redis::Connection);

impl Admin {
    fn new(server: &RedisServer) -> Self {
        server.cmd(&[
            "ACL",
            "SETUSER",
            "admin",
            "on",
            ">admin-pw-1",
            "~*",
            "&*",
            "+@all",
        ]);
        let url = format!("redis://admin:admin-pw-1@127.0.0.1:{}/0", server.port());
        Self(redis::Client::open(url).unwrap().get_connection().unwrap())
    }

    fn cmd(&mut self, args: &[&str]) -> redis::Value {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.0).unwrap()
    }

    fn stats(&mut self) -> Stats {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .arg("commandstats")
            .query(&mut self.0)
            .unwrap();
        // The persistent admin connection opens nothing; undo the one the delta expects for a snapshot.
        let mut stats = Stats::parse(&info);
        stats.connections += 1;
        stats
    }
}

/// The calls a test makes after the rotation, and how long one may take: a refused authentication is
/// answered at once; a client that retried with backoff (redis-rs's default: 6 retries) would take seconds.
const CALLS: u64 = 4;
const PROMPT: Duration = Duration::from_millis(1500);

#[test]
fn a_rotated_password_is_a_prompt_definite_auth_error_without_a_retry_loop() {
    on_every_server(
        "a_rotated_password_is_a_prompt_definite_auth_error_without_a_retry_loop",
        |flavor| async move {
            use redlease_adapters::fred::FredNode;
            use redlease_adapters::fred::fred::prelude::{ClientLike, ReconnectPolicy};
            use redlease_adapters::redis::{LazyNode, ManagedNode};
            let server = RedisServer::start_flavor(flavor, &["--requirepass", PASSWORD]);
            let mut admin = Admin::new(&server);
            let url = server.url_with_password(PASSWORD);
            let ttl = Ttl::from_millis(5000).unwrap();
            for name in ["ManagedNode", "LazyNode", "FredClient"] {
                admin.cmd(&["CONFIG", "SET", "requirepass", PASSWORD]);
                let client = redis::Client::open(url.as_str()).unwrap();
                let node: Box<dyn RedisNode> = match name {
                    // The adapter's own choice of reconnection settings.
                    "ManagedNode" => Box::new(ManagedNode::connect(&client).await.unwrap()),
                    "LazyNode" => Box::new(LazyNode::with_config(
                        client,
                        redis::AsyncConnectionConfig::new()
                            .set_connection_timeout(Some(Duration::from_millis(500)))
                            .set_response_timeout(Some(Duration::from_millis(500))),
                    )),
                    _ => {
                        // fred reconnects by its own policy: two attempts here, so that its count is bounded too.
                        let mut builder = common::fred_builder(&url);
                        builder.set_policy(ReconnectPolicy::new_constant(2, 100));
                        let client = builder.build().unwrap();
                        client.init().await.unwrap();
                        Box::new(FredNode::new(client))
                    }
                };
                let token = Token::random().unwrap();
                assert!(node.acquire("before", &token, ttl).await.unwrap(), "{name}");
                assert!(node.release("before", &token).await.unwrap(), "{name}");

                // Rotate the password and cut the node's connection: it must log in again, with the old password.
                admin.cmd(&["CONFIG", "SET", "requirepass", WRONG]);
                admin.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
                tokio::time::sleep(Duration::from_millis(100)).await;
                let before = admin.stats();
                let mut definite = 0;
                for call in 0..CALLS {
                    let started = Instant::now();
                    let err = node
                        .acquire(&format!("after:{call}"), &token, ttl)
                        .await
                        .unwrap_err();
                    let took = started.elapsed();
                    assert!(took < PROMPT, "{name} call {call}: took {took:?}: {err}");
                    assert_no_secret(&chain(&err));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if call == 0 && (err.is_ambiguous() || err.kind() == NodeErrorKind::Connection)
                    {
                        // Only the call that met the cut connection, before the client tried to log in again.
                        continue;
                    }
                    assert!(!err.is_ambiguous(), "{name} call {call}: {err}");
                    assert_eq!(
                        err.kind(),
                        NodeErrorKind::Auth,
                        "{name} call {call}: {}",
                        chain(&err)
                    );
                    definite += 1;
                }
                assert!(
                    definite >= CALLS - 1,
                    "{name}: {definite} definite auth errors"
                );
                // No retry loop: over the calls and a quiet second, at most one connection attempt per call (and one
                // reconnection the client starts by itself after the cut), never a stream of them.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let seen = admin.stats().since(&before);
                assert!(
                    seen.connections <= CALLS + 2,
                    "{name}: {} connection attempts for {CALLS} calls",
                    seen.connections
                );
                assert_eq!(seen.lock_commands(), 0, "{name}: {seen:?}");
                drop(node);
            }
        },
    );
}
