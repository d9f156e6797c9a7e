//! Authentication and authorisation failures: definite `Auth` errors without secrets in any message.

use std::time::Duration;

use redlease::{LockManager, NodeErrorKind, RedisNode, Token, Ttl};
use redlease_adapters::fred as fred_adapter;
use redlease_adapters::redis::{self as redis_adapter, MultiplexedNode, redis};
use redlease_testkit::server::RedisServer;

use crate::common::{self, chain, first_node_error};

const PASSWORD: &str = "s3cret-pw-4711";
const WRONG: &str = "wrong-pw-0815";

fn assert_no_secret(text: &str) {
    assert!(!text.contains(PASSWORD), "password leaked: {text}");
    assert!(!text.contains(WRONG), "attempted password leaked: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_password_is_a_definite_auth_error_without_secrets() {
    let Some(server) = RedisServer::start_with_or_skip(
        "missing_or_wrong_password_is_a_definite_auth_error_without_secrets",
        &["--requirepass", PASSWORD],
    ) else {
        return;
    };
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
        // Through the manager: not contention, the node error is kept, and no retry loop (one attempt).
        let manager =
            LockManager::single(node, common::config(Duration::from_secs(1)).attempts(3)).unwrap();
        let started = std::time::Instant::now();
        let err = manager.lock("k").acquire().await.unwrap_err();
        assert!(!err.is_contended(), "{name}: {err}");
        assert_eq!(
            first_node_error(&err).unwrap().kind(),
            NodeErrorKind::Auth,
            "{name}"
        );
        assert_no_secret(&chain(&err));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{name}: {:?}",
            started.elapsed()
        );
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
    assert_no_secret(&format!("{node:?} {:?}", node.endpoint()));
    let node = common::node(common::Backend::FredClient, &good).await;
    assert!(node.acquire("k", &token, ttl).await.unwrap());
    assert!(node.release("k", &token).await.unwrap());
    assert_no_secret(&node.endpoint().unwrap_or_default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_without_eval_gets_a_definite_auth_error() {
    let Some(server) =
        RedisServer::start_or_skip("acl_user_without_eval_gets_a_definite_auth_error")
    else {
        return;
    };
    server.cmd(&[
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">lockerpw",
        "~*",
        "+@all",
        "-eval",
        "-evalsha",
    ]);
    let url = format!("redis://locker:lockerpw@127.0.0.1:{}/0", server.port());
    let ttl = Ttl::from_millis(1000).unwrap();
    let token = Token::random().unwrap();
    for backend in common::ALL_BACKENDS {
        let node = common::node(backend, &url).await;
        let err = node.acquire("k", &token, ttl).await.unwrap_err();
        assert_eq!(err.kind(), NodeErrorKind::Auth, "{backend:?}: {err}");
        assert!(!err.is_ambiguous(), "{backend:?}");
        assert!(!chain(&err).contains("lockerpw"));
        assert_eq!(server.cmd(&["EXISTS", "k"]), "0");
    }
}
