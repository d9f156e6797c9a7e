//! A long job: a lease held by auto-renewal for more than ten TTLs. After every renewal the lease observes,
//! the key on the servers (every server in single mode, a quorum in Redlock mode) holds our token with a PTTL
//! that outlasts our own validity deadline and never exceeds the TTL; the job ends held and the release
//! removes the key.
//!
//! "Outlasts our deadline" is exact, not a guess: a renewal round that starts at `s` sets the key's TTL at
//! some time `t ≥ s` and gives the lease validity until `s + ttl − drift`, so the key expires at
//! `t + ttl > valid_until`, and a PTTL read that returned at `r` saw more than `valid_until − r`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{Lease, LockManager, RedisNode};
use redlease_testkit::server::{RedisServer, RedisServers};

use crate::common::{self, ALL_BACKENDS, Backend, config, key, on_every_server};

/// Sixteen backend × server combinations renew at once on two cores, beside the rest of the live tier, and
/// the check after each renewal runs two `redis-cli` processes per server: a renewal may start a few hundred
/// milliseconds late. The lease survives a renewal that is up to TTL − INTERVAL − drift (about 590 ms) late.
const TTL: Duration = Duration::from_millis(800);
const INTERVAL: Duration = Duration::from_millis(200);
/// The explicit operation timeout (the default, ttl / 5, would be 160 ms a round).
const OP: Duration = Duration::from_millis(250);
const JOB: Duration = Duration::from_millis(10 * 800 + 250);

/// Holds `lease` for [`JOB`], checking the servers after every renewal; returns the number of renewals.
async fn hold_and_check(what: &str, lease: &Lease, servers: &[&RedisServer], quorum: usize) -> u32 {
    let token = lease.token().as_str().to_owned();
    let started = Instant::now();
    let mut seen = lease.valid_until();
    let mut renewals = 0;
    while started.elapsed() < JOB {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let valid_until = lease.valid_until();
        if valid_until == seen {
            continue;
        }
        seen = valid_until;
        renewals += 1;
        let mut good = 0;
        let mut seen_on = Vec::new();
        for server in servers {
            let value = server.cmd(&["GET", lease.key()]);
            let pttl: i64 = server.cmd(&["PTTL", lease.key()]).parse().unwrap();
            let floor = valid_until
                .saturating_duration_since(Instant::now())
                .as_millis() as i64
                - 1;
            if value == token && pttl >= floor && pttl <= TTL.as_millis() as i64 {
                good += 1;
            }
            seen_on.push((value == token, pttl, floor));
        }
        assert!(
            good >= quorum,
            "{what}: after renewal {renewals} ({:?} into the job, valid for {:?} more), (ours, PTTL, floor) \
             per server: {seen_on:?}",
            started.elapsed(),
            valid_until.saturating_duration_since(Instant::now())
        );
    }
    renewals
}

async fn long_job(
    backend: Backend,
    nodes: Vec<Arc<dyn RedisNode>>,
    servers: &[&RedisServer],
    background: bool,
) {
    let what = format!(
        "{backend:?} on {} server(s), background={background}",
        servers.len()
    );
    let cfg = config(TTL).with_operation_timeout(OP);
    let mut manager = if nodes.len() == 1 {
        LockManager::single(Arc::clone(&nodes[0]), cfg)
    } else {
        LockManager::redlock_dyn(nodes, cfg)
    }
    .unwrap();
    if background {
        manager = manager.with_spawner(|task| {
            tokio::spawn(task);
        });
    }
    let quorum = manager.quorum();
    let k = key(&format!("long-job-{}", servers.len()), backend);
    let lock = manager.lock(&k);
    let lock = if background {
        lock.auto_renew(INTERVAL)
    } else {
        lock.renew_every(INTERVAL)
    };
    let lease = lock.try_acquire().await.unwrap();
    // Without a spawner, renewal runs inside `run` while the job does.
    let renewals = lease
        .run(hold_and_check(&what, &lease, servers, quorum))
        .await
        .unwrap_or_else(|e| panic!("{what}: the job lost its lease: {e}"));
    // A lease held through ten TTLs was renewed at least ten times.
    assert!(
        renewals >= 10,
        "{what}: only {renewals} renewals in {JOB:?}"
    );
    assert!(lease.is_held(), "{what}");
    lease.release().await.unwrap();
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(
            server.cmd(&["EXISTS", &k]),
            "0",
            "{what}: left on server {i}"
        );
    }
    eprintln!("{what}: {renewals} renewals in {JOB:?}");
}

#[test]
fn a_job_of_ten_ttls_keeps_the_key_outlasting_the_lease_after_every_renewal() {
    on_every_server(
        "a_job_of_ten_ttls_keeps_the_key_outlasting_the_lease_after_every_renewal",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let url = server.url();
            let mut nodes = Vec::new();
            for backend in ALL_BACKENDS {
                nodes.push(common::node(backend, &url).await);
            }
            let s = [&server];
            // The backends hold their jobs at the same time, each on its own key.
            let [a, b, c, d] = ALL_BACKENDS;
            let [na, nb, nc, nd] = <[_; 4]>::try_from(nodes).ok().unwrap();
            tokio::join!(
                long_job(a, vec![na], &s, true),
                long_job(b, vec![nb], &s, false),
                long_job(c, vec![nc], &s, true),
                long_job(d, vec![nd], &s, false),
            );
        },
    );
}

#[test]
fn a_redlock_job_of_ten_ttls_keeps_a_quorum_of_keys_outlasting_the_lease_after_every_renewal() {
    on_every_server(
        "a_redlock_job_of_ten_ttls_keeps_a_quorum_of_keys_outlasting_the_lease_after_every_renewal",
        |flavor| async move {
            let servers = RedisServers::start_flavor(flavor, 3);
            let s: Vec<&RedisServer> = servers.iter().collect();
            let mut per_backend = Vec::new();
            for backend in [Backend::RedisMultiplexed, Backend::FredClient] {
                let mut nodes = Vec::new();
                for url in servers.urls() {
                    nodes.push(common::node(backend, &url).await);
                }
                per_backend.push((backend, nodes));
            }
            let [(a, na), (b, nb)] = <[_; 2]>::try_from(per_backend).ok().unwrap();
            tokio::join!(long_job(a, na, &s, true), long_job(b, nb, &s, false));
        },
    );
}
