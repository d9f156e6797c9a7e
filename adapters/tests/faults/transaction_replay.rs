//! A transaction whose reply is lost runs once. fred re-sends a whole `MULTI … EXEC` after reconnecting,
//! whatever `max_attempts` says (its transaction API allows one more attempt), from inside its connection
//! task — so one call ran its writes twice, and the copy could run after the caller gave up. Both adapters
//! must send a transaction once and report the lost reply as an error.

use std::sync::Arc;
use std::time::Duration;

use redlease::RedisNode;
use redlease_adapters::fred::FredNode;
use redlease_adapters::fred::fred::prelude::ClientLike;
use redlease_testkit::proxy::{FaultProxy, ProxyMode};
use redlease_testkit::server::{Flavor, RedisServer};

use crate::common::{self, command_calls};

/// On a server without Lua an inspection is one transaction (`MULTI GET PTTL EXEC`): its reply is lost (the
/// proxy drops it and closes the connection) and `EXEC` must have run exactly once, a second later, for
/// every reconnecting node — fred as built and without fail-fast, a fred pool, and redis-rs's connection
/// manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_whose_reply_is_lost_runs_once() {
    let test = "a_transaction_whose_reply_is_lost_runs_once";
    let Some(server) = RedisServer::start_flavor_or_skip(test, Flavor::Valkey91NoLua, &[]) else {
        return;
    };
    let proxy = FaultProxy::start(server.addr().parse().unwrap()).unwrap();
    let url = format!("{}/0", proxy.url());
    let mut cases: Vec<(String, Arc<dyn RedisNode>)> = Vec::new();
    for backend in common::RECONNECTING {
        cases.push((format!("{backend:?}"), common::node(backend, &url).await));
    }
    let client = common::fred_client(&url);
    client.init().await.unwrap();
    cases.push((
        "FredClientNoFailFast".to_owned(),
        Arc::new(FredNode::new(client).with_fail_fast(false)),
    ));
    cases.push((
        "FredPool".to_owned(),
        common::node(common::Backend::FredPool, &url).await,
    ));
    for (name, node) in &cases {
        let key = format!("replay:{{{name}}}:lock");
        // Checked and connected: the next transaction is the inspection's own.
        node.inspect(&key).await.unwrap();
        server.cmd(&["CONFIG", "RESETSTAT"]);
        proxy.lose_reply_to_then(b"EXEC", ProxyMode::Forward);
        let answer = tokio::time::timeout(Duration::from_secs(10), node.inspect(&key)).await;
        // Whatever the answer, a re-sending client has reconnected and re-sent by now.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            command_calls(&server, "exec"),
            1,
            "{name}: the transaction ran more than once (answer {answer:?})"
        );
        assert!(
            matches!(answer, Ok(Err(_))),
            "{name}: a lost reply must be an error, not {answer:?}"
        );
        // And the node works again.
        let mut recovered = false;
        for _ in 0..50 {
            if node.inspect(&key).await.is_ok() {
                recovered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(recovered, "{name}: never answered again");
    }
}
