//! Redlock over 3 and 5 independent servers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{ConfigError, LockManager, RedisNode};
use redlease_adapters::redis::{MultiplexedNode, redis};
use redlease_testkit::server::RedisServers;

use crate::common::{self, Backend, config, on_every_server};

async fn nodes(servers: &RedisServers, backend: Backend) -> Vec<Arc<dyn RedisNode>> {
    let mut out = Vec::new();
    for server in servers.iter() {
        out.push(common::node(backend, &server.url()).await);
    }
    out
}

async fn occupancy_masks(servers: &RedisServers, backend: Backend) {
    let n = servers.len();
    // A generous operation timeout: the first round on fresh connections can be slow on a loaded machine,
    // and a node missing the round would turn a "free >= quorum" mask into a failure.
    let cfg = config(Duration::from_secs(5)).with_operation_timeout(Duration::from_secs(1));
    let manager = LockManager::redlock_dyn(nodes(servers, backend).await, cfg).unwrap();
    let quorum = n / 2 + 1;
    for mask in 0u32..(1 << n) {
        let k = format!("mask:{backend:?}:{mask}:lock");
        for i in 0..n {
            if mask & (1 << i) != 0 {
                servers[i].cmd(&["SET", &k, "foreign", "PX", "10000"]);
            }
        }
        let free = n - mask.count_ones() as usize;
        let result = manager.lock(&k).try_acquire().await;
        match result {
            Ok(lease) => {
                assert!(
                    free >= quorum,
                    "{backend:?} n={n} mask={mask:b}: acquired with {free} free"
                );
                let mut ours = 0;
                for i in 0..n {
                    let value = servers[i].cmd(&["GET", &k]);
                    if mask & (1 << i) != 0 {
                        assert_eq!(value, "foreign", "{backend:?} mask={mask:b} node {i}");
                    } else if value == lease.token().as_str() {
                        ours += 1;
                    } else {
                        // A free node may have missed the round (slow under load); it holds nothing else.
                        assert_eq!(value, "", "{backend:?} mask={mask:b} node {i}");
                    }
                }
                assert!(
                    ours >= quorum,
                    "{backend:?} mask={mask:b}: our token on only {ours} nodes"
                );
                lease.release().await.unwrap();
            }
            Err(err) => {
                assert!(
                    free < quorum,
                    "{backend:?} n={n} mask={mask:b}: {free} free but {err}"
                );
                assert!(err.is_contended(), "{backend:?} mask={mask:b}: {err}");
            }
        }
        // Nothing of ours is left anywhere; foreign values are untouched.
        for i in 0..n {
            let expected = if mask & (1 << i) != 0 { "foreign" } else { "" };
            assert_eq!(
                servers[i].cmd(&["GET", &k]),
                expected,
                "{backend:?} mask={mask:b} node {i}"
            );
        }
    }
}

#[test]
fn redlock_on_three_servers_succeeds_iff_a_quorum_is_free_for_every_mask() {
    on_every_server(
        "redlock_on_three_servers_succeeds_iff_a_quorum_is_free_for_every_mask",
        |flavor| async move {
            // One set of servers for both backends (their keys are distinct).
            let servers = RedisServers::start_flavor(flavor, 3);
            occupancy_masks(&servers, Backend::RedisMultiplexed).await;
            occupancy_masks(&servers, Backend::FredClient).await;
        },
    );
}

#[test]
fn redlock_on_five_servers_succeeds_iff_a_quorum_is_free_for_every_mask() {
    on_every_server(
        "redlock_on_five_servers_succeeds_iff_a_quorum_is_free_for_every_mask",
        |flavor| async move {
            let servers = RedisServers::start_flavor(flavor, 5);
            occupancy_masks(&servers, Backend::RedisManager).await;
            occupancy_masks(&servers, Backend::FredPool).await;
        },
    );
}

#[test]
fn redlock_survives_a_killed_minority_and_fails_fast_without_a_majority() {
    on_every_server(
        "redlock_survives_a_killed_minority_and_fails_fast_without_a_majority",
        |flavor| async move {
            for backend in [Backend::RedisManager, Backend::FredClient] {
                let mut servers = RedisServers::start_flavor(flavor, 5);
                let cfg = config(Duration::from_secs(1))
                    .with_operation_timeout(Duration::from_millis(150));
                let manager =
                    LockManager::redlock_dyn(nodes(&servers, backend).await, cfg).unwrap();

                // Minority (2 of 5) killed: acquire, extend and release still work.
                servers.get_mut(0).kill();
                servers.get_mut(1).kill();
                let lease = manager.lock("minority:lock").try_acquire().await.unwrap();
                for i in 2..5 {
                    assert_eq!(
                        servers[i].cmd(&["GET", "minority:lock"]),
                        lease.token().as_str()
                    );
                }
                lease.extend(Duration::from_secs(1)).await.unwrap();
                lease.release().await.unwrap();

                // Majority (3 of 5) killed: fails within the time bound, leaves nothing behind.
                servers.get_mut(2).kill();
                let started = Instant::now();
                let err = manager
                    .lock("majority:lock")
                    .try_acquire()
                    .await
                    .unwrap_err();
                let elapsed = started.elapsed();
                assert!(!err.is_contended(), "{backend:?}: {err}");
                assert!(
                    elapsed < Duration::from_millis(700),
                    "{backend:?}: took {elapsed:?}"
                );
                assert_eq!(servers[3].cmd(&["EXISTS", "majority:lock"]), "0");
                assert_eq!(servers[4].cmd(&["EXISTS", "majority:lock"]), "0");

                // Heal: restart the killed servers (empty); nothing of ours anywhere, and the lock works again.
                for i in 0..3 {
                    servers.get_mut(i).restart();
                }
                for i in 0..5 {
                    assert_eq!(servers[i].cmd(&["EXISTS", "majority:lock"]), "0");
                }
                let healed = Instant::now() + Duration::from_secs(3);
                loop {
                    match manager.lock("healed:lock").try_acquire().await {
                        Ok(lease) => {
                            lease.release().await.unwrap();
                            break;
                        }
                        Err(err) => {
                            assert!(
                                Instant::now() < healed,
                                "{backend:?}: never recovered: {err}"
                            );
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }
        },
    );
}

#[test]
fn redlock_rejects_one_server_named_twice_by_endpoint() {
    on_every_server(
        "redlock_rejects_one_server_named_twice_by_endpoint",
        |flavor| async move {
            let servers = RedisServers::start_flavor(flavor, 2);
            let client = |i: usize| redis::Client::open(servers[i].url()).unwrap();
            let a = MultiplexedNode::connect(&client(0)).await.unwrap();
            let a_again = MultiplexedNode::connect(&client(0)).await.unwrap();
            let b = MultiplexedNode::connect(&client(1)).await.unwrap();
            assert_eq!(a.profile().endpoint, a_again.profile().endpoint);
            assert_ne!(a.profile().endpoint, b.profile().endpoint);
            let err =
                LockManager::redlock([a, a_again, b], config(Duration::from_secs(1))).unwrap_err();
            assert!(matches!(err, ConfigError::Topology(_)), "{err}");
            // fred derives its endpoint the same way.
            let f0 = common::node(Backend::FredClient, &servers[0].url()).await;
            assert_eq!(f0.profile().endpoint, Some(servers[0].url()));
        },
    );
}

/// Lazy nodes of `kind` for `urls`, built without any I/O.
fn lazy_nodes(kind: &str, urls: &[String]) -> Vec<Arc<dyn RedisNode>> {
    use redlease_adapters::fred::FredNode;
    use redlease_adapters::redis::LazyNode;
    urls.iter()
        .map(|url| -> Arc<dyn RedisNode> {
            match kind {
                "LazyNode" => Arc::new(LazyNode::with_config(
                    redis::Client::open(url.as_str()).unwrap(),
                    redis::AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(Duration::from_millis(300)))
                        .set_response_timeout(Some(Duration::from_millis(500))),
                )),
                _ => Arc::new(FredNode::lazy(common::fred_client(url))),
            }
        })
        .collect()
}

#[test]
fn a_redlock_service_starts_with_a_minority_down_and_the_node_joins_when_it_comes_up() {
    on_every_server(
        "a_redlock_service_starts_with_a_minority_down_and_the_node_joins_when_it_comes_up",
        |flavor| async move {
            let mut servers = RedisServers::start_flavor(flavor, 3);
            let urls = servers.urls();
            servers[2].kill();
            for kind in ["LazyNode", "FredLazy"] {
                // Building the nodes and the manager sends nothing (no connection reaches the servers that are up),
                // so server 2 being down does not stop the start.
                let before: Vec<_> = (0..2)
                    .map(|i| crate::stats::Stats::of(&servers[i]))
                    .collect();
                let nodes = lazy_nodes(kind, &urls);
                let manager = LockManager::redlock_dyn(
                    nodes,
                    config(Duration::from_secs(10))
                        .with_operation_timeout(Duration::from_millis(800)),
                )
                .unwrap();
                for (i, before) in before.iter().enumerate() {
                    let seen = crate::stats::Stats::of(&servers[i]).since(before);
                    assert_eq!(
                        seen.connections, 0,
                        "{kind}: building connected to server {i}"
                    );
                }
                let k = format!("lazy:{{{kind}}}:lock");
                let lease = manager
                    .lock(&k)
                    .try_acquire()
                    .await
                    .unwrap_or_else(|e| panic!("{kind}: with two of three servers up: {e}"));
                let token = lease.token().as_str().to_owned();
                assert_eq!(servers[0].cmd(&["GET", &k]), token, "{kind}");
                assert_eq!(servers[1].cmd(&["GET", &k]), token, "{kind}");
                lease.release().await.unwrap();

                // Server 2 comes up (same port, empty): the next acquisitions reach it.
                servers[2].restart();
                // (A fresh acquisition returns at the quorum: the third node's SET may land a moment later, so each
                // lease gives it a little time before it is released. The deadline leaves room for the client's
                // reconnection delay on a loaded machine.)
                let deadline = Instant::now() + Duration::from_secs(20);
                loop {
                    let lease = manager.lock(&k).try_acquire().await.unwrap();
                    let token = lease.token().as_str().to_owned();
                    let landed_by = Instant::now() + Duration::from_millis(500);
                    let joined = loop {
                        if servers[2].try_cmd(&["GET", &k]).is_ok_and(|v| v == token) {
                            break true;
                        }
                        if Instant::now() > landed_by {
                            break false;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    };
                    lease.release().await.unwrap();
                    if joined {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "{kind}: the restarted server never received a lock"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // With all three up, a majority survives losing any one of them again.
                servers[2].kill();
                manager
                    .lock(&k)
                    .try_acquire()
                    .await
                    .unwrap()
                    .release()
                    .await
                    .unwrap();
            }
        },
    );
}

#[test]
fn a_lazy_fred_node_whose_first_connection_fails_after_its_wait_connects_when_the_server_answers() {
    use redlease_adapters::fred::FredNode;
    use redlease_adapters::fred::fred::prelude::{Builder, Config as FredConfig, ReconnectPolicy};
    use redlease_testkit::proxy::{FaultProxy, ProxyMode};
    on_every_server(
        "a_lazy_fred_node_whose_first_connection_fails_after_its_wait_connects_when_the_server_answers",
        |flavor| async move {
            let server = redlease_testkit::server::RedisServer::start_flavor(flavor, &[]);
            // The server is reachable but silent at first: fred's first attempt waits for its handshake's
            // reply (1.5 s) longer than the lazy node waits for the connection (its connection timeout,
            // 300 ms), then fails, and fred's connection task ends (`fail_fast`).
            let proxy = FaultProxy::start(server.addr().parse().unwrap()).unwrap();
            proxy.set_mode(ProxyMode::Blackhole);
            let config = FredConfig::from_url(&format!("{}/0", proxy.url())).unwrap();
            let mut builder = Builder::from_config(config);
            builder
                .with_connection_config(|c| {
                    c.connection_timeout = Duration::from_millis(300);
                    c.internal_command_timeout = Duration::from_millis(1500);
                })
                .set_policy(ReconnectPolicy::new_constant(0, 20));
            let node = FredNode::lazy(builder.build().unwrap());
            let ttl = redlease::Ttl::from_millis(5000).unwrap();
            let token = redlease::Token::random().unwrap();
            let err = node
                .claim(redlease::ClaimRequest::new("lazy:{silent}:lock", &token, ttl).fresh(true))
                .await
                .map(redlease::Claim::is_taken)
                .unwrap_err();
            assert!(!err.is_ambiguous(), "{err}");
            // fred's attempt is over (its handshake timed out) and its task ended; the server answers now.
            tokio::time::sleep(Duration::from_millis(2500)).await;
            proxy.set_mode(ProxyMode::Forward);
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match node
                    .claim(redlease::ClaimRequest::new("lazy:{back}:lock", &token, ttl).fresh(true))
                    .await
                    .map(redlease::Claim::is_taken)
                {
                    Ok(acquired) => {
                        assert!(acquired);
                        break;
                    }
                    Err(e) => {
                        assert!(
                            Instant::now() < deadline,
                            "the lazy node never connected again: {e}"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            assert_eq!(server.cmd(&["GET", "lazy:{back}:lock"]), token.as_str());
        },
    );
}
