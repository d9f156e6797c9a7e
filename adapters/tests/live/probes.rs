//! The capability check on real servers: it writes nothing a user can see, and never stands between a
//! release or an extension and the server.

use std::sync::Arc;
use std::time::Duration;

use redlease::{NodeErrorKind, RedisNode, Token, Ttl};
use redlease_adapters::Timeouts;
use redlease_adapters::fred::ClientNode;
use redlease_adapters::redis::{MultiplexedNode, redis};
use redlease_testkit::server::{Flavor, RedisServer};

use crate::common::{self, Backend, has_lua, on_every_server, on_servers};

/// Reconnecting nodes of every kind, not yet checked: the lazy ones of the one-line managers, a
/// `ConnectionManager`, a fred client and pool.
async fn reconnecting_nodes(url: &str) -> Vec<(&'static str, Arc<dyn RedisNode>)> {
    let timeouts = Timeouts::new(Duration::from_millis(500), Duration::from_millis(500)).unwrap();
    vec![
        (
            "redis-rs lazy",
            Arc::new(MultiplexedNode::lazy(redis::Client::open(url).unwrap())),
        ),
        (
            "fred lazy",
            Arc::new(ClientNode::from_url(url, timeouts).unwrap()),
        ),
        (
            "redis-rs manager",
            common::unprobed(Backend::RedisManager, url).await,
        ),
        (
            "fred client",
            common::unprobed(Backend::FredClient, url).await,
        ),
        ("fred pool", common::unprobed(Backend::FredPool, url).await),
    ]
}

/// Calls `op` until it answers with something other than a connection error (the first calls after the
/// server dropped the node's connections may fail while it reconnects), at most 40 times 50 ms apart.
async fn after_reconnecting<T, F, Fut>(what: &str, mut op: F) -> Result<T, redlease::NodeError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, redlease::NodeError>>,
{
    let mut last = None;
    for _ in 0..40 {
        match op().await {
            Err(e) if matches!(e.kind(), NodeErrorKind::Connection | NodeErrorKind::Io) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
    panic!("{what}: still not reconnected: {last:?}")
}

/// Issue 22 #2: a lease taken before the server reached `maxmemory`, whose node then reconnects (the server
/// closed its connections), is still extended (where a script can run: `PEXPIRE` is allowed under OOM) and
/// released (`DEL`/`DELIFEQ` are): the capability check, whose `SET` probes are refused under OOM, does not
/// run first.
#[test]
fn release_and_extend_work_under_oom_after_a_reconnect() {
    on_every_server(
        "release_and_extend_work_under_oom_after_a_reconnect",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let ttl = Ttl::from_millis(5_000).unwrap();
            for (name, node) in reconnecting_nodes(&server.url()).await {
                let k = format!("oom:{{{name}}}:lock");
                let token = Token::random().unwrap();
                // The previous node's round closed every connection: this one may reconnect first.
                let taken = after_reconnecting(name, || node.acquire(&k, &token, ttl)).await;
                assert!(taken.unwrap(), "{name}");
                server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
                server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
                if has_lua(flavor) {
                    let long = Ttl::from_millis(60_000).unwrap();
                    let extended = after_reconnecting(name, || node.extend(&k, &token, long)).await;
                    assert!(
                        extended.unwrap_or_else(|e| panic!("{name}: extend under OOM: {e}")),
                        "{name}"
                    );
                    let pttl: i64 = server.cmd(&["PTTL", &k]).parse().unwrap();
                    assert!(pttl > 50_000, "{name}: PTTL {pttl} after the extension");
                }
                let released = after_reconnecting(name, || node.release(&k, &token)).await;
                assert!(
                    released.unwrap_or_else(|e| panic!("{name}: release under OOM: {e}")),
                    "{name}"
                );
                assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{name}");
                server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
            }
        },
    );
}

/// Issue 22 #10: the `DELIFEQ` probe (inside the probe scripts, and as a plain command where no script runs)
/// deletes nothing, even a key that holds the probe's own string: a retried acquisition on such a key,
/// which checks the connection first with that key, is contended and leaves the value.
#[test]
fn the_capability_check_never_deletes_a_users_key() {
    on_servers(
        "the_capability_check_never_deletes_a_users_key",
        &[Flavor::Valkey91, Flavor::Valkey91NoLua],
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let ttl = Ttl::from_millis(5_000).unwrap();
            for (name, node) in reconnecting_nodes(&server.url()).await {
                let k = format!("user:{{{name}}}:key");
                let value = "redlease:probe:never-a-token";
                server.cmd(&["SET", &k, value]);
                let token = Token::random().unwrap();
                let taken = node.acquire(&k, &token, ttl).await;
                assert_eq!(server.cmd(&["GET", &k]), value, "{name}: {taken:?}");
                assert!(!taken.unwrap(), "{name}: contended");
            }
        },
    );
}
