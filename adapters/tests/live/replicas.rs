//! Replicas and restarts on real server processes: the durability policy (`WAIT`/`WAITAOF` after each
//! write) against a primary with one replica, `WAITAOF` detection, `run_id` after a restart, and the
//! Redlock restart quarantine with servers killed and restarted without persistence.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlease::{
    Durability, EventKind, LeaseEvent, LockManager, NodeErrorKind, NotAcquiredReason, Observer,
    ReplicaWait,
};
use redlease_testkit::server::{Flavor, RedisServer, RedisServers};

use crate::common::{self, ALL_BACKENDS, Backend, config, key, on_every_server};

#[derive(Default, Clone)]
struct NotReplicated(Arc<Mutex<Vec<Option<u32>>>>);

impl Observer for NotReplicated {
    fn event(&self, event: &LeaseEvent<'_>) {
        if let EventKind::NotReplicated { acknowledged, .. } = event.kind {
            self.0.lock().unwrap().push(acknowledged);
        }
    }
}

const TTL: Duration = Duration::from_secs(5);

fn wait() -> ReplicaWait {
    ReplicaWait::new(1, Duration::from_millis(200))
}

#[test]
fn required_durability_waits_for_the_replica_and_fails_clearly_when_it_is_stopped() {
    on_every_server(
        "required_durability_waits_for_the_replica_and_fails_clearly_when_it_is_stopped",
        |flavor| async move {
            let primary = RedisServer::start_flavor(flavor, &[]);
            let replica = primary.start_replica(&[]);
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &primary.url()).await;
                let seen = NotReplicated::default();
                // With the replica up, its acknowledgement may take a while on a loaded machine: this
                // manager waits up to 2 s for it (its TTL is 5 s) (a healthy replica answers at once, so it costs nothing
                // here). The one for the stopped replica waits 200 ms, and fails after that.
                let patient = LockManager::single(
                    Arc::clone(&node),
                    config(TTL).with_durability(Durability::Required(ReplicaWait::new(
                        1,
                        Duration::from_secs(2),
                    ))),
                )
                .unwrap()
                .with_observer(seen.clone());
                let manager = LockManager::single(
                    node,
                    config(TTL).with_durability(Durability::Required(wait())),
                )
                .unwrap()
                .with_observer(seen.clone());
                let k = key("durable", backend);
                let f = common::fence_of(&k);
                // With the replica up: acquired, and the replica has the lock and the fence when it returns.
                let lease = patient.lock(&k).fenced(&f).try_acquire().await.unwrap();
                assert_eq!(
                    replica.cmd(&["GET", &k]),
                    lease.token().as_str(),
                    "{backend:?}"
                );
                assert_eq!(
                    replica.cmd(&["GET", &f]),
                    lease.fencing_token().unwrap().to_string(),
                    "{backend:?}"
                );
                lease.extend(TTL).await.unwrap();
                lease.release().await.unwrap();
                assert!(seen.0.lock().unwrap().is_empty(), "{backend:?}");

                // The replica stopped: the acquisition fails with the cause and leaves no key on the primary.
                replica.pause();
                let err = manager.lock(&k).fenced(&f).try_acquire().await.unwrap_err();
                replica.resume();
                assert!(
                    matches!(
                        &err,
                        redlease::Error::NotAcquired {
                            reason: NotAcquiredReason::NotReplicated,
                            ..
                        }
                    ),
                    "{backend:?}: {err:?}"
                );
                assert!(
                    common::chain(&err).contains("acknowledged by 0 of 1 required replica"),
                    "{backend:?}: {err}"
                );
                assert_eq!(primary.cmd(&["EXISTS", &k]), "0", "{backend:?}: released");
                assert_eq!(seen.0.lock().unwrap().as_slice(), [Some(0)], "{backend:?}");
                primary
                    .wait_for_replicas(1, Duration::from_secs(10))
                    .unwrap();
            }
        },
    );
}

/// `Durability::Required` on nodes that open their connection at first use (lazy redis-rs and fred nodes, and
/// the one-line URL managers built on them): the first acquisition and extension, written on the connection
/// the call itself opened, are waited for there and succeed.
#[test]
fn required_durability_holds_on_lazy_nodes_and_url_managers_from_their_first_write() {
    on_every_server(
        "required_durability_holds_on_lazy_nodes_and_url_managers_from_their_first_write",
        |flavor| async move {
            use redlease_adapters::fred::{self as fred_adapter, FredNode};
            use redlease_adapters::redis::{self as redis_adapter, LazyNode, redis};
            let primary = RedisServer::start_flavor(flavor, &[]);
            let _replica = primary.start_replica(&[]);
            primary
                .wait_for_replicas(1, Duration::from_secs(10))
                .unwrap();
            let url = primary.url();
            let durable = || {
                config(TTL).with_durability(Durability::Required(ReplicaWait::new(
                    1,
                    Duration::from_secs(2),
                )))
            };
            let managers: Vec<(&str, LockManager)> = vec![
                (
                    "redis::single",
                    redis_adapter::single(&url, durable()).unwrap(),
                ),
                (
                    "fred::single",
                    fred_adapter::single(&url, durable()).unwrap(),
                ),
                (
                    "LazyNode",
                    LockManager::single(
                        LazyNode::new(redis::Client::open(url.as_str()).unwrap()),
                        durable(),
                    )
                    .unwrap(),
                ),
                (
                    "FredNode::lazy",
                    LockManager::single(FredNode::lazy(common::fred_client(&url)), durable())
                        .unwrap(),
                ),
            ];
            for (what, manager) in managers {
                let k = format!("live:{{lazy-durable:{what}}}:lock");
                let lease =
                    manager.lock(&k).try_acquire().await.unwrap_or_else(|e| {
                        panic!("{what}: first acquisition: {}", common::chain(&e))
                    });
                lease
                    .extend(TTL)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: first extension: {}", common::chain(&e)));
                lease.release().await.unwrap();
            }
        },
    );
}

/// A durability wait longer than the operation timeout, on the URL managers: a replica that acknowledges
/// after the operation timeout but within the wait is waited for (the client's response timeout covers the
/// wait), not cut into an ambiguous failure.
#[test]
fn url_managers_wait_for_a_replica_longer_than_the_operation_timeout() {
    on_every_server(
        "url_managers_wait_for_a_replica_longer_than_the_operation_timeout",
        |flavor| async move {
            use redlease_adapters::fred as fred_adapter;
            use redlease_adapters::redis as redis_adapter;
            let primary = RedisServer::start_flavor(flavor, &[]);
            let replica = primary.start_replica(&[]);
            primary
                .wait_for_replicas(1, Duration::from_secs(10))
                .unwrap();
            let op = Duration::from_millis(300);
            let late = Duration::from_millis(900);
            let durable = || {
                config(TTL)
                    .with_operation_timeout(op)
                    .with_durability(Durability::Required(ReplicaWait::new(
                        1,
                        Duration::from_secs(3),
                    )))
            };
            let url = primary.url();
            let managers = [
                (
                    "redis::single",
                    redis_adapter::single(&url, durable()).unwrap(),
                ),
                (
                    "fred::single",
                    fred_adapter::single(&url, durable()).unwrap(),
                ),
            ];
            for (what, manager) in managers {
                let k = format!("live:{{long-wait:{what}}}:lock");
                // Connected and checked first, so that the acquisition below is one write and its WAIT.
                manager
                    .lock(format!("{k}:warm"))
                    .try_acquire()
                    .await
                    .unwrap();
                replica.pause();
                let resume = {
                    let pid = replica.pid().unwrap();
                    std::thread::spawn(move || {
                        std::thread::sleep(late);
                        let _ = std::process::Command::new("kill")
                            .args(["-CONT", &pid.to_string()])
                            .status();
                    })
                };
                let started = std::time::Instant::now();
                let acquired = manager.lock(&k).try_acquire().await;
                let took = started.elapsed();
                resume.join().unwrap();
                let lease = acquired
                    .unwrap_or_else(|e| panic!("{what}: after {took:?}: {}", common::chain(&e)));
                assert!(
                    took >= late,
                    "{what}: {took:?}: the replica was not waited for"
                );
                assert_eq!(replica.cmd(&["GET", &k]), lease.token().as_str(), "{what}");
                lease.release().await.unwrap();
            }
        },
    );
}

#[test]
fn best_effort_durability_reports_a_stopped_replica_and_keeps_the_lease() {
    on_every_server(
        "best_effort_durability_reports_a_stopped_replica_and_keeps_the_lease",
        |flavor| async move {
            let primary = RedisServer::start_flavor(flavor, &[]);
            let replica = primary.start_replica(&[]);
            for backend in [Backend::RedisManager, Backend::FredPool] {
                let node = common::node(backend, &primary.url()).await;
                let seen = NotReplicated::default();
                let manager = LockManager::single(
                    node,
                    config(TTL).with_durability(Durability::BestEffort(wait())),
                )
                .unwrap()
                .with_observer(seen.clone());
                let k = key("best-effort", backend);
                replica.pause();
                let lease = manager.lock(&k).try_acquire().await;
                replica.resume();
                let lease = lease.unwrap();
                assert!(lease.is_held());
                assert_eq!(primary.cmd(&["GET", &k]), lease.token().as_str());
                assert_eq!(seen.0.lock().unwrap().as_slice(), [Some(0)], "{backend:?}");
                lease.release().await.unwrap();
                primary
                    .wait_for_replicas(1, Duration::from_secs(10))
                    .unwrap();
            }
        },
    );
}

/// `WAITAOF` is detected per server: Valkey 8.1 and 9.1 have it (and it counts a replica's AOF fsync),
/// Redis 7.0 does not (a clear `Unsupported`, and the required policy fails with that cause).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waitaof_is_detected_per_server() {
    let test = "waitaof_is_detected_per_server";
    for flavor in [Flavor::Redis, Flavor::Valkey81, Flavor::Valkey91] {
        let Some(primary) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
            continue;
        };
        let _replica = primary.start_replica(&["--appendonly", "yes"]);
        // In sync first: the nodes wait for the write itself (on a wait connection of their own), which an
        // initial synchronisation holds up.
        primary
            .wait_for_replicas(1, Duration::from_secs(10))
            .unwrap();
        let has_waitaof = flavor != Flavor::Redis;
        for backend in [Backend::RedisMultiplexed, Backend::FredClient] {
            let node = common::node(backend, &primary.url()).await;
            let k = key("aof", backend);
            primary.cmd(&["SET", &k, "x"]);
            let got = node
                .wait_replicas(&k, ReplicaWait::new(1, Duration::from_secs(2)).aof())
                .await;
            match (has_waitaof, &got) {
                (true, Ok(1)) => {}
                (false, Err(e)) if e.kind() == NodeErrorKind::Unsupported => {
                    assert!(e.message().contains("WAITAOF"), "{e}");
                }
                _ => panic!("{flavor:?} {backend:?}: WAITAOF gave {got:?}"),
            }
            // Plain WAIT works everywhere.
            let plain = node
                .wait_replicas(&k, ReplicaWait::new(1, Duration::from_secs(2)))
                .await;
            assert_eq!(plain.ok(), Some(1), "{flavor:?} {backend:?}");
            if !has_waitaof {
                let manager = LockManager::single(
                    node,
                    config(TTL).with_durability(Durability::Required(wait().aof())),
                )
                .unwrap();
                let err = manager.lock(key("aof-policy", backend)).try_acquire().await;
                let err = err.unwrap_err();
                assert!(common::chain(&err).contains("WAITAOF"), "{err}");
            }
        }
    }
}

#[test]
fn run_id_is_the_servers_and_changes_after_a_restart() {
    on_every_server(
        "run_id_is_the_servers_and_changes_after_a_restart",
        |flavor| async move {
            let mut server = RedisServer::start_flavor(flavor, &[]);
            let nodes: Vec<_> = {
                let mut v = Vec::new();
                for backend in [
                    Backend::RedisManager,
                    Backend::FredClient,
                    Backend::FredPool,
                ] {
                    v.push((backend, common::node(backend, &server.url()).await));
                }
                v
            };
            let before = server.run_id().unwrap().to_owned();
            for (backend, node) in &nodes {
                let id = node.run_id("k").await.unwrap();
                assert_eq!(id.as_str(), before, "{backend:?}");
            }
            server.restart();
            let after = server.run_id().unwrap().to_owned();
            assert_ne!(before, after);
            for (backend, node) in &nodes {
                // The first call after the restart may fail (the old connection is gone); within a few calls the
                // node reports the new server's id, never the old one once it has reconnected.
                let mut seen = None;
                for _ in 0..50 {
                    let _ = node.inspect("k").await;
                    if let Ok(id) = node.run_id("k").await
                        && id.as_str() == after
                    {
                        seen = Some(id);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert!(seen.is_some(), "{backend:?}: never reported the new run_id");
            }
        },
    );
}

/// The simulator's restart scenario on real processes: two of three Redlock servers are killed and
/// restarted without persistence while client 1 holds the lock; client 2, which saw them before, does not
/// count them (quarantine) and is refused; without quarantine it would get the lock.
#[test]
fn restarted_redlock_servers_are_quarantined_on_real_processes() {
    on_every_server(
        "restarted_redlock_servers_are_quarantined_on_real_processes",
        |flavor| async move {
            let mut servers = RedisServers::start_flavor(flavor, 3);
            for quarantine in [true, false] {
                let mut nodes = Vec::new();
                for url in servers.urls() {
                    nodes.push(common::node(Backend::RedisManager, &url).await);
                }
                let cfg = config(TTL).with_attempts(3);
                let cfg = if quarantine {
                    cfg
                } else {
                    cfg.with_restart_quarantine(None)
                };
                let one = LockManager::redlock_dyn(nodes.clone(), cfg.clone()).unwrap();
                let two = LockManager::redlock_dyn(nodes, cfg).unwrap();
                let k = format!("live:restart:{quarantine}");
                let held = one.lock(&k).try_acquire().await.unwrap();
                assert!(two.lock(&k).try_acquire().await.unwrap_err().is_contended());
                servers.get_mut(0).restart();
                servers.get_mut(1).restart();
                let second = two.lock(&k).acquire().await;
                assert!(held.is_held(), "client 1 still believes it holds the lock");
                match (quarantine, second) {
                    (true, Err(err)) => {
                        let restarted = common::first_node_error(&err).map(|e| e.kind());
                        assert_eq!(restarted, Some(NodeErrorKind::Restarted), "{err}");
                    }
                    (false, Ok(lease)) => {
                        // The unsafe outcome the quarantine prevents: two holders at once.
                        assert!(lease.is_held() && held.is_held());
                        lease.release().await.unwrap();
                    }
                    (q, other) => panic!("quarantine {q}: unexpected {other:?}"),
                }
                let _ = held.release().await;
            }
        },
    );
}

/// `WAIT` counts its own connection's writes. A client that reconnected between a write and its `WAIT`
/// (in the background: a RESP3 `ConnectionManager`, fred) would wait on a connection that carried none of
/// it — and where a connection that wrote nothing waits for nothing (Valkey), count the replica at once
/// whether or not it has the write. The nodes refuse that `WAIT` (definitely, not sent); the next write's
/// `WAIT` is counted again.
#[test]
fn a_wait_on_a_connection_that_replaced_the_writing_one_is_refused() {
    use redlease::{RedisNode, Token, Ttl};
    use redlease_adapters::fred::FredNode;
    use redlease_adapters::fred::fred::prelude::{ClientLike, EventInterface};
    use redlease_adapters::redis::{ManagedNode, redis};
    use redlease_testkit::proxy::FaultProxy;
    on_every_server(
        "a_wait_on_a_connection_that_replaced_the_writing_one_is_refused",
        |flavor| async move {
            let primary = RedisServer::start_flavor(flavor, &[]);
            let _replica = primary.start_replica(&[]);
            let proxy = FaultProxy::start(primary.addr().parse().unwrap()).unwrap();
            let resp3 = redis::Client::open(format!("{}?protocol=resp3", proxy.url())).unwrap();
            let managed = ManagedNode::connect(&resp3).await.unwrap();
            let fred = common::fred_client(&proxy.url());
            fred.init().await.unwrap();
            let mut reconnected = fred.reconnect_rx();
            let nodes: [(&str, Arc<dyn RedisNode>); 2] = [
                ("redis-rs manager (RESP3)", Arc::new(managed)),
                ("fred client", Arc::new(FredNode::new(fred))),
            ];
            let ttl = Ttl::from_duration(TTL).unwrap();
            let mut tokens = Vec::new();
            for (name, node) in &nodes {
                let (k, t) = (format!("live:rewait:{{{name}}}"), Token::random().unwrap());
                assert!(
                    node.claim(redlease::ClaimRequest::new(&k, &t, ttl).fresh(true))
                        .await
                        .map(redlease::Claim::is_taken)
                        .unwrap(),
                    "{name}"
                );
                assert_eq!(node.wait_replicas(&k, wait()).await.unwrap(), 1, "{name}");
                tokens.push((k, t));
            }
            let accepted = proxy.accepted();
            proxy.reset();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while proxy.accepted() < accepted + 2 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no background reconnection"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::timeout(Duration::from_secs(10), reconnected.recv())
                .await
                .expect("fred announces its reconnection")
                .unwrap();
            for ((name, node), (k, t)) in nodes.iter().zip(&tokens) {
                let err = node
                    .wait_replicas(k, wait())
                    .await
                    .expect_err("a WAIT that cannot count the write");
                assert_eq!(err.kind(), NodeErrorKind::Connection, "{name}: {err}");
                assert!(!err.is_ambiguous(), "{name}: {err}");
                assert!(err.message().contains("replaced"), "{name}: {err}");
                // A write on the new connection is waited for again.
                assert!(node.extend(k, t, ttl).await.unwrap(), "{name}");
                assert_eq!(node.wait_replicas(k, wait()).await.unwrap(), 1, "{name}");
                assert!(node.release(k, t).await.unwrap(), "{name}");
            }
        },
    );
}
