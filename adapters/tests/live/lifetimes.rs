//! Lease lifetimes and composition on real servers (issue 24): several keys at once, a lease handed to
//! another manager, hold limits — on every single-server setup and on clusters, both clients.

use std::time::{Duration, Instant};

use redlease::{Error, LeaseTicket, LockManager, LossReason};
use redlease_testkit::server::{RedisCluster, RedisServer};

use crate::common::{self, ALL_BACKENDS, CLUSTERS, config, key, on_every_server, on_servers};

const TTL: Duration = Duration::from_millis(1_000);

#[test]
fn lock_all_handoff_and_hold_limits_work_on_every_server() {
    on_every_server(
        "lock_all_handoff_and_hold_limits_work_on_every_server",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in ALL_BACKENDS {
                let manager =
                    LockManager::single(common::node(backend, &server.url()).await, config(TTL))
                        .unwrap();
                let worker =
                    LockManager::single(common::node(backend, &server.url()).await, config(TTL))
                        .unwrap();
                let (a, b, c) = (
                    key("all-a", backend),
                    key("all-b", backend),
                    key("all-c", backend),
                );

                // All or nothing: "b" is held, so a set over a, b, c takes none of them.
                server.cmd(&["SET", &b, "someone-else", "PX", "5000"]);
                let set = manager.lock_all([c.as_str(), a.as_str(), b.as_str()]);
                let e = set.try_acquire().await.unwrap_err();
                assert!(e.is_contended(), "{backend:?}: {e}");
                assert_eq!(
                    server.cmd(&["EXISTS", &a, &c]),
                    "0",
                    "{backend:?}: nothing left"
                );
                server.cmd(&["DEL", &b]);
                let all = set.try_acquire().await.unwrap();
                for lease in all.leases() {
                    assert_eq!(server.cmd(&["GET", lease.key()]), lease.token().as_str());
                }
                all.release().await.unwrap();
                assert_eq!(
                    server.cmd(&["EXISTS", &a, &b, &c]),
                    "0",
                    "{backend:?}: released"
                );

                // Handed to another manager (another connection), resumed with its own TTL.
                let lease = manager
                    .lock(&a)
                    .with_holder_info("dispatcher")
                    .try_acquire()
                    .await
                    .unwrap();
                let token = lease.token().as_str().to_owned();
                let wire = lease.handoff().unwrap().encode();
                let ticket: LeaseTicket = wire.parse().unwrap();
                let resumed = worker
                    .lock(&a)
                    .expiry(TTL * 5)
                    .resume(&ticket)
                    .await
                    .unwrap();
                assert_eq!(resumed.token().as_str(), token);
                let pttl: i64 = server.cmd(&["PTTL", &a]).parse().unwrap();
                assert!(
                    pttl > TTL.as_millis() as i64,
                    "{backend:?}: the worker's TTL, {pttl} ms"
                );
                let holder = manager.lock(&a).holder_info().await.unwrap().unwrap();
                assert_eq!(holder.info(), Some("dispatcher"));
                resumed.release().await.unwrap();
                // A ticket whose key is gone is refused as not held.
                let r = worker.lock(&a).resume(&ticket).await;
                assert!(
                    matches!(
                        r,
                        Err(Error::Lost {
                            reason: LossReason::NotHeld,
                            ..
                        })
                    ),
                    "{backend:?}: {r:?}"
                );

                // A hold limit ends renewed work at the limit and deletes the key.
                let limited = manager
                    .lock(&c)
                    .expiry(Duration::from_millis(600))
                    .renew_every(Duration::from_millis(200))
                    .max_hold(Duration::from_millis(1_500));
                let started = Instant::now();
                let lease = limited.try_acquire().await.unwrap();
                let r = lease.run(std::future::pending::<()>()).await;
                let took = started.elapsed();
                assert!(
                    matches!(
                        r,
                        Err(Error::Lost {
                            reason: LossReason::HoldLimit,
                            ..
                        })
                    ),
                    "{backend:?}: {r:?}"
                );
                // Renewed past one TTL, stopped by the limit (not before it; the acquisition round counts).
                assert!(
                    took >= Duration::from_millis(1_400),
                    "{backend:?}: ended after {took:?}"
                );
                assert_eq!(
                    server.cmd(&["EXISTS", &c]),
                    "0",
                    "{backend:?}: deleted at the limit"
                );
            }
        },
    );
}

#[test]
fn lock_all_across_slots_and_handoff_work_on_clusters() {
    let test = "lock_all_across_slots_and_handoff_work_on_clusters";
    on_servers(test, &CLUSTERS, |flavor| async move {
        let Some(cluster) = RedisCluster::start_flavor_or_skip(test, flavor) else {
            return;
        };
        let managers = [
            (
                "redis-rs",
                LockManager::single(crate::cluster::redis_rs_node(&cluster).await, config(TTL))
                    .unwrap(),
            ),
            (
                "fred",
                LockManager::single(crate::cluster::fred_node(&cluster).await, config(TTL))
                    .unwrap(),
            ),
        ];
        for (name, manager) in &managers {
            // Keys without a shared hash tag: different slots, each its own lease.
            let keys: Vec<String> = (0..4).map(|i| format!("lifetimes:{name}:{i}")).collect();
            let all = manager
                .lock_all(keys.iter().map(String::as_str))
                .try_acquire()
                .await
                .unwrap();
            assert_eq!(all.leases().len(), 4);
            assert!(all.is_held());
            all.extend(TTL * 3).await.unwrap();
            all.release().await.unwrap();
            let lease = manager.lock(&keys[0]).try_acquire().await.unwrap();
            let ticket = lease.handoff().unwrap();
            let (_, other) = &managers[usize::from(*name == "redis-rs")];
            let resumed = other.lock(&keys[0]).resume(&ticket).await.unwrap();
            resumed.release().await.unwrap();
            assert!(
                manager
                    .lock(&keys[0])
                    .holder_info()
                    .await
                    .unwrap()
                    .is_none(),
                "{flavor} {name}"
            );
        }
    });
}
