//! The capability check on real servers: it never writes to (or deletes) a user's key, and never stands
//! between a release or an extension and the server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{NodeErrorKind, RedisNode, Token, Ttl};
use redlease_adapters::redis::{LazyNode, redis};
use redlease_testkit::proxy::FaultProxy;
use redlease_testkit::server::RedisServer;

use crate::common::{self, Backend, on_every_server};

/// The reconnecting node kinds.
const RECONNECTING: [&str; 4] = [
    "redis-rs lazy",
    "redis-rs manager",
    "fred client",
    "fred pool",
];

/// A reconnecting node of kind `name` through `url` (a proxy whose connections the test cuts), checked.
async fn reconnecting(name: &str, url: &str) -> Arc<dyn RedisNode> {
    match name {
        "redis-rs lazy" => {
            let lazy = LazyNode::new(redis::Client::open(url).unwrap());
            lazy.probe(common::PROBE_KEY).await.unwrap();
            Arc::new(lazy)
        }
        "redis-rs manager" => common::node(Backend::RedisManager, url).await,
        "fred client" => common::node(Backend::FredClient, url).await,
        _ => common::node(Backend::FredPool, url).await,
    }
}

/// Cuts the node's connections and waits until it answers again (`run_id` reads only: it checks nothing),
/// so that its next call goes on a new connection that no capability check has seen.
async fn cut_and_reconnect(proxy: &FaultProxy, name: &str, node: &dyn RedisNode, key: &str) {
    proxy.reset();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match node.run_id(key).await {
            Ok(_) => return,
            Err(e) => assert!(
                Instant::now() < deadline,
                "{name}: no reconnection within 10 s: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `op` again while it fails definitely (nothing sent) on the connection, at most five times: a reconnecting
/// node may learn that its connection was replaced only between the `WATCH` and the `EXEC` of its first
/// transaction on the new one (fred announces reconnections on a channel of its own), and then refuses that
/// transaction unsent — what the core does next is try again.
async fn until_sent<T, F: std::future::Future<Output = Result<T, redlease::NodeError>>>(
    mut op: impl FnMut() -> F,
) -> Result<T, redlease::NodeError> {
    let mut tries = 0;
    loop {
        match op().await {
            Err(e) if e.kind() == NodeErrorKind::Connection && !e.is_ambiguous() && tries < 5 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

/// A server at `maxmemory` refuses every command that may grow memory (`SET`), but runs `PEXPIRE`, `DEL`,
/// `DELIFEQ`, the extend and release scripts and the watched `MULTI … PEXPIRE … EXEC`. After a reconnect the
/// node has not checked its new connection; a check first would send `SET … PX 0` probes, refused with
/// `OOM`, and the lease would live out its TTL. Release and extension go without it, on every server and
/// every reconnecting node.
#[test]
fn release_and_extend_work_under_oom_after_a_reconnect() {
    on_every_server(
        "release_and_extend_work_under_oom_after_a_reconnect",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let proxy = FaultProxy::start(server.addr().parse().unwrap()).unwrap();
            let ttl = Ttl::from_millis(5_000).unwrap();
            for name in RECONNECTING {
                let node = reconnecting(name, &proxy.url()).await;
                let k = format!("live:{{oom-reconnect:{name}}}:lock");
                let token = Token::random().unwrap();
                assert!(node.acquire(&k, &token, ttl).await.unwrap(), "{name}");
                server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
                // Acquisitions are refused (definitely): the server is full.
                let err = node
                    .acquire(&format!("{k}:2"), &token, ttl)
                    .await
                    .unwrap_err();
                assert_eq!(err.kind(), NodeErrorKind::OutOfMemory, "{name}: {err}");

                cut_and_reconnect(&proxy, name, node.as_ref(), &k).await;
                let extended =
                    until_sent(|| node.extend(&k, &token, Ttl::from_millis(60_000).unwrap())).await;
                assert!(
                    extended.as_ref().is_ok_and(|ok| *ok),
                    "{flavor:?} {name}: extend under OOM after a reconnect: {extended:?}"
                );
                let pttl: i64 = server.cmd(&["PTTL", &k]).parse().unwrap();
                assert!(pttl > 50_000, "{name}: PTTL {pttl} after the extension");

                // A batch of extensions (renewal batching) goes the same way.
                cut_and_reconnect(&proxy, name, node.as_ref(), &k).await;
                let item = redlease::ExtendItem::new(&k, &token, Ttl::from_millis(70_000).unwrap());
                let batch = until_sent(|| node.extend_many(std::slice::from_ref(&item))).await;
                assert!(
                    batch.as_ref().is_ok_and(|flags| flags == &[true]),
                    "{flavor:?} {name}: batch extension under OOM after a reconnect: {batch:?}"
                );

                cut_and_reconnect(&proxy, name, node.as_ref(), &k).await;
                let released = until_sent(|| node.release(&k, &token)).await;
                assert!(
                    released.as_ref().is_ok_and(|ok| *ok),
                    "{flavor:?} {name}: release under OOM after a reconnect: {released:?}"
                );
                assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{name}");
                server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
            }
        },
    );
}

/// The check learns whether the server offers `DELIFEQ` without deleting anything: a lock key that holds
/// the very string an earlier check compared with (`redlease:probe:never-a-token`), or any other value,
/// is left alone, and the acquisition that ran the check reports it held. Every server, every node kind,
/// with scripts and without.
#[test]
fn the_capability_check_never_deletes_a_key_whatever_it_holds() {
    on_every_server(
        "the_capability_check_never_deletes_a_key_whatever_it_holds",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let ttl = Ttl::from_millis(5_000).unwrap();
            for backend in common::ALL_BACKENDS {
                for commands in [
                    redlease_adapters::Commands::Automatic,
                    redlease_adapters::Commands::Native,
                ] {
                    if commands == redlease_adapters::Commands::Native
                        && !matches!(
                            flavor,
                            redlease_testkit::server::Flavor::Valkey91
                                | redlease_testkit::server::Flavor::Valkey91NoLua
                        )
                    {
                        continue;
                    }
                    let what = format!("{backend:?} {commands:?}");
                    let k = format!("live:{{never-delete:{what}}}:lock");
                    server.cmd(&["SET", &k, "redlease:probe:never-a-token"]);
                    let node = common::unprobed_in(backend, &server.url(), commands).await;
                    let token = Token::random().unwrap();
                    // The first acquisition on the connection runs the check.
                    let taken = node
                        .claim(redlease::ClaimRequest::new(&k, &token, ttl).fresh(true))
                        .await
                        .map(redlease::Claim::is_taken);
                    assert_eq!(
                        server.cmd(&["GET", &k]),
                        "redlease:probe:never-a-token",
                        "{what}: the check deleted the key ({taken:?})"
                    );
                    assert!(!taken.unwrap(), "{what}: acquired a held key");
                    server.cmd(&["DEL", &k]);
                }
            }
        },
    );
}
