//! Three-master clusters of Redis 7.0 and of Valkey 9.1: fenced locks with one hash tag work; keys in
//! different slots are refused before sending; the conformance suite passes in every command mode; a moved
//! slot is never followed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{LockManager, NodeErrorKind, RedisNode, SystemTimer, Token, Ttl};
use redlease_adapters::Commands;
use redlease_adapters::redis::{ClusterNode, redis};
use redlease_adapters::slot::hash_slot;
use redlease_testkit::server::{Flavor, RedisCluster};

use crate::common::{self, CLUSTERS, first_node_error, on_servers};

/// Scripts sent to any node (run, or refused like a redirected one), and `MOVED` replies sent by any node.
fn scripts_and_redirections(cluster: &RedisCluster) -> (u64, u64) {
    let mut out = (0, 0);
    for n in cluster.nodes() {
        let s = crate::stats::Stats::of(n);
        out.0 += s.sent("eval") + s.sent("evalsha");
        out.1 += n
            .cmd(&["INFO", "errorstats"])
            .lines()
            .find_map(|l| l.strip_prefix("errorstat_MOVED:count="))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap());
    }
    out
}

#[path = "../shared/clusters.rs"]
mod clusters;
pub(crate) use clusters::{fred_node, redis_rs_node};

/// eval + evalsha calls over all nodes.
fn script_calls(cluster: &RedisCluster) -> u64 {
    cluster
        .nodes()
        .iter()
        .map(|n| {
            n.cmd(&["INFO", "commandstats"])
                .lines()
                .filter(|l| l.starts_with("cmdstat_eval"))
                .filter_map(|l| l.split(['=', ',']).nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

#[test]
fn cluster_fenced_locks_with_one_hash_tag_work_and_cross_slot_keys_fail_before_sending() {
    let test =
        "cluster_fenced_locks_with_one_hash_tag_work_and_cross_slot_keys_fail_before_sending";
    on_servers(test, &CLUSTERS, |flavor| async move {
        let Some(cluster) = RedisCluster::start_flavor_or_skip(test, flavor) else {
            return;
        };
        // Our slot computation agrees with the server's.
        for key in [
            "foo",
            "bar",
            "orders:{42}:lock",
            "{}x",
            "a{b}c{d}",
            "redlease:{tag}:fence",
            "",
        ] {
            let server_slot: u16 = cluster.nodes()[0]
                .cmd(&["CLUSTER", "KEYSLOT", key])
                .parse()
                .unwrap();
            assert_eq!(hash_slot(key.as_bytes()), server_slot, "{key:?}");
        }

        let nodes: Vec<(&str, Arc<dyn RedisNode>)> = vec![
            ("redis-rs", Arc::new(redis_rs_node(&cluster).await)),
            ("fred", Arc::new(fred_node(&cluster).await)),
        ];
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(2000).unwrap();
        for (name, node) in nodes {
            let manager =
                LockManager::single(Arc::clone(&node), common::config(Duration::from_secs(2)))
                    .unwrap();
            let (k, f) = (
                format!("orders:{{{name}}}:lock"),
                format!("orders:{{{name}}}:fence"),
            );
            let lease = manager.lock(&k).fenced(&f).try_acquire().await.unwrap();
            assert_eq!(lease.fencing_token(), Some(1), "{name}");
            assert_eq!(
                cluster.cmd_for_key(&k, &["GET", &k]),
                lease.token().as_str()
            );
            lease.extend(Duration::from_secs(2)).await.unwrap();
            lease.release().await.unwrap();
            let lease = manager.lock(&k).fenced(&f).try_acquire().await.unwrap();
            assert_eq!(lease.fencing_token(), Some(2), "{name}");
            lease.release().await.unwrap();

            // Different slots: a clear CrossSlot error naming both keys, before any command is sent.
            let (k2, f2) = (format!("{name}:plain:lock"), format!("{name}:plain:fence"));
            assert_ne!(hash_slot(k2.as_bytes()), hash_slot(f2.as_bytes()));
            let before = script_calls(&cluster);
            let node_err = node
                .acquire_fenced(&k2, &f2, &token, ttl)
                .await
                .unwrap_err();
            assert_eq!(script_calls(&cluster), before, "{name}: a command was sent");
            assert_eq!(node_err.kind(), NodeErrorKind::CrossSlot, "{name}");
            assert!(!node_err.is_ambiguous());
            assert!(
                node_err.message().contains(&k2) && node_err.message().contains(&f2),
                "{node_err}"
            );
            // Through the manager: the same error, reported as a failed acquisition (not contention).
            let err = manager
                .lock(&k2)
                .fenced(&f2)
                .try_acquire()
                .await
                .unwrap_err();
            assert!(!err.is_contended(), "{name}: {err}");
            let node_err = first_node_error(&err).unwrap_or_else(|| panic!("{name}: {err}"));
            assert_eq!(node_err.kind(), NodeErrorKind::CrossSlot, "{name}");
            assert_eq!(cluster.cmd_for_key(&k2, &["EXISTS", &k2]), "0");
            assert_eq!(cluster.cmd_for_key(&f2, &["EXISTS", &f2]), "0");

            // A read/write lock's fenced writer: the same rule.
            let (k, f) = (
                format!("report:{{{name}}}:lock"),
                format!("report:{{{name}}}:fence"),
            );
            let rw = manager.rw_lock(&k).fenced(&f);
            for expected in [1, 2] {
                let writer = rw.write().try_acquire().await.unwrap();
                assert_eq!(writer.fencing_token(), Some(expected), "{name}");
                writer.release().await.unwrap();
            }
            let before = script_calls(&cluster);
            let write = redlease::PermitOp::AcquireExclusive {
                claim: ttl,
                fence: Some(&f2),
            };
            let node_err = node.permit(&k2, &token, ttl, write).await.unwrap_err();
            assert_eq!(script_calls(&cluster), before, "{name}: a command was sent");
            assert_eq!(node_err.kind(), NodeErrorKind::CrossSlot, "{name}");
            assert!(!node_err.is_ambiguous());
            // Through the manager: the same error, and nothing written (the writer's withdrawal of a
            // claim it might have left is a release of the lock key alone).
            let err = manager
                .rw_lock(&k2)
                .fenced(&f2)
                .write()
                .try_acquire()
                .await
                .unwrap_err();
            let node_err = first_node_error(&err).unwrap_or_else(|| panic!("{name}: {err}"));
            assert_eq!(node_err.kind(), NodeErrorKind::CrossSlot, "{name}");
            assert_eq!(cluster.cmd_for_key(&k2, &["EXISTS", &k2]), "0");
            assert_eq!(cluster.cmd_for_key(&f2, &["EXISTS", &f2]), "0");
        }
    });
}

#[test]
fn cluster_nodes_pass_the_conformance_suite_in_every_mode() {
    let test = "cluster_nodes_pass_the_conformance_suite_in_every_mode";
    on_servers(test, &CLUSTERS, |flavor| async move {
        let Some(cluster) = RedisCluster::start_flavor_or_skip(test, flavor) else {
            return;
        };
        // Every state read independently, over a cluster connection of its own.
        let client = redis::cluster::ClusterClientBuilder::new(cluster.urls())
            .build()
            .unwrap();
        let reader = crate::conformance::GetPttl(client.get_async_connection().await.unwrap());
        // Redis has no native conditional commands (a node pinned to them is refused, see
        // `pinned_modes_fail_with_a_typed_error_before_any_write`).
        let modes: &[Commands] = match flavor {
            Flavor::Redis => &[Commands::Automatic, Commands::Scripts],
            _ => &[Commands::Automatic, Commands::Scripts, Commands::Native],
        };
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        for &mode in modes {
            let nodes: [(&str, Arc<dyn RedisNode>); 2] = [
                (
                    "redis-rs",
                    Arc::new(redis_rs_node(&cluster).await.with_commands(mode)),
                ),
                (
                    "fred",
                    Arc::new(fred_node(&cluster).await.with_commands(mode)),
                ),
            ];
            for (name, node) in nodes {
                let what = format!("{flavor} cluster {name} {mode:?}");
                if let Err(failure) =
                    redlease_testkit::conformance::run_with_reader(&*node, &reader, &SystemTimer)
                        .await
                {
                    panic!("{what}: {failure}");
                }
                // Plain (unfenced) keys in any slot are routed to their node.
                for key in ["a", "b", "c", "d", "e"] {
                    assert!(node.acquire(key, &token, ttl).await.unwrap(), "{what}");
                    assert!(node.release(key, &token).await.unwrap(), "{what}");
                }
                eprintln!("{what}: conformance passed");
            }
        }
    });
}

/// The index of the node owning `slot`, and every node's id, from `CLUSTER NODES`.
fn slot_owner(cluster: &RedisCluster, slot: u16) -> (usize, Vec<String>) {
    let ids: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.cmd(&["CLUSTER", "MYID"]))
        .collect();
    let nodes = cluster.nodes()[0].cmd(&["CLUSTER", "NODES"]);
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let owns = fields.iter().skip(8).any(|range| {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            match (lo.parse::<u16>(), hi.parse::<u16>()) {
                (Ok(lo), Ok(hi)) => (lo..=hi).contains(&slot),
                _ => false,
            }
        });
        if owns {
            let owner = ids.iter().position(|id| id == fields[0]).unwrap();
            return (owner, ids);
        }
    }
    panic!("no owner of slot {slot}: {nodes}");
}

#[test]
fn a_moved_slot_is_a_definite_cluster_error_never_a_resend_and_the_next_call_is_routed_anew() {
    let test =
        "a_moved_slot_is_a_definite_cluster_error_never_a_resend_and_the_next_call_is_routed_anew";
    on_servers(test, &CLUSTERS, |flavor| async move {
        let Some(cluster) = RedisCluster::start_flavor_or_skip(test, flavor) else {
            return;
        };
        // redis-rs built from a builder that asks for 16 retries: the adapter must still never follow (re-send).
        let builder = redis::cluster::ClusterClientBuilder::new(cluster.urls())
            .retries(16)
            .connection_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500));
        let nodes: Vec<(&str, Arc<dyn RedisNode>)> = vec![
            (
                "redis-rs",
                Arc::new(ClusterNode::connect(builder).await.unwrap()),
            ),
            ("fred", Arc::new(fred_node(&cluster).await)),
        ];
        let ttl = Ttl::from_millis(5000).unwrap();
        for (name, node) in nodes {
            let k = format!("moved:{{{name}}}:lock");
            let slot = hash_slot(k.as_bytes());
            let token = Token::random().unwrap();
            // Connections, slot map and capability check in place.
            assert!(node.acquire(&k, &token, ttl).await.unwrap(), "{name}");
            assert!(node.release(&k, &token).await.unwrap(), "{name}");
            // Move the (empty) slot to another primary behind the client's back.
            let (owner, ids) = slot_owner(&cluster, slot);
            let target = (owner + 1) % ids.len();
            for i in [target, owner, (owner + 2) % ids.len()] {
                cluster.nodes()[i].cmd(&[
                    "CLUSTER",
                    "SETSLOT",
                    &slot.to_string(),
                    "NODE",
                    &ids[target],
                ]);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while slot_owner(&cluster, slot).0 != target {
                assert!(Instant::now() < deadline, "{name}: the slot did not move");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let before = scripts_and_redirections(&cluster);
            let err = node.acquire(&k, &token, ttl).await.unwrap_err();
            assert_eq!(err.kind(), NodeErrorKind::Cluster, "{name}: {err}");
            assert!(
                !err.is_ambiguous(),
                "{name}: a redirection is a refusal: {err}"
            );
            // Sent once, to the old owner, which refused it: nothing ran anywhere.
            // Sent once (refused with MOVED, counted as a rejected call); following the redirection would send it
            // again to the new owner.
            let after = scripts_and_redirections(&cluster);
            assert_eq!(after.1 - before.1, 1, "{name}: one MOVED reply");
            assert_eq!(
                after.0 - before.0,
                1,
                "{name}: followed the redirection: {}",
                common::chain(&err)
            );
            assert_eq!(cluster.cmd_for_key(&k, &["EXISTS", &k]), "0", "{name}");
            // The client refreshed its slot map: a later call reaches the new owner.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match node.acquire(&k, &token, ttl).await {
                    Ok(true) => break,
                    Ok(false) => panic!("{name}: contended"),
                    Err(e) => {
                        assert!(!e.is_ambiguous(), "{name}: {e}");
                        assert!(Instant::now() < deadline, "{name}: never routed anew: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            assert_eq!(
                cluster.nodes()[target].cmd(&["GET", &k]),
                token.as_str(),
                "{name}: not on the new owner"
            );
            assert!(node.release(&k, &token).await.unwrap(), "{name}");
        }
    });
}
