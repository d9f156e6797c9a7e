//! Redundancy of Redlock leases on real servers (issue 21): after an acquisition, the lease's key is on
//! every healthy server — the acquisition wins at a quorum and lets stragglers go, and the lease writes its
//! key (with its own token) where it was not confirmed.

use std::time::{Duration, Instant};

use redlease::{Config, Lease, LockManager};
use redlease_adapters::redis::redis;
use redlease_adapters::runtime::TokioSpawner;
use redlease_testkit::server::{Flavor, RedisServers};

use crate::common::on_servers;

type Build = fn(&[String], Config) -> LockManager;

const CLIENTS: [(&str, Build); 2] = [
    ("redis-rs", |urls, cfg| {
        redlease_adapters::redis::redlock(urls, cfg).unwrap()
    }),
    ("fred", |urls, cfg| {
        redlease_adapters::fred::redlock(urls, cfg).unwrap()
    }),
];

/// Acquisitions on one warm manager, and on fresh managers (one each), per client. A measuring run takes
/// more: `REDLEASE_REDUNDANCY_WARM` / `REDLEASE_REDUNDANCY_FRESH` (the closing notes quote such runs).
const WARM: usize = 300;
const FRESH: usize = 30;

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// How many of `leases` hold their key on every server, waiting up to `patience` for the background
/// writes: the leases missing somewhere at the end are returned as (key, servers holding it).
async fn spread(
    conns: &mut [redis::aio::MultiplexedConnection],
    leases: &[Lease],
    patience: Duration,
) -> Vec<(String, usize)> {
    let keys: Vec<&str> = leases.iter().map(Lease::key).collect();
    let until = Instant::now() + patience;
    loop {
        let mut missing = Vec::new();
        let mut holders = vec![0usize; leases.len()];
        for conn in conns.iter_mut() {
            let values: Vec<Option<String>> = redis::cmd("MGET")
                .arg(&keys)
                .query_async(conn)
                .await
                .unwrap();
            for (j, v) in values.iter().enumerate() {
                if v.as_deref() == Some(leases[j].token().as_str()) {
                    holders[j] += 1;
                }
            }
        }
        for (j, &h) in holders.iter().enumerate() {
            if h < conns.len() {
                missing.push((keys[j].to_owned(), h));
            }
        }
        if missing.is_empty() || Instant::now() >= until {
            return missing;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_redlock_lease_is_held_on_every_healthy_server_after_its_acquisition() {
    on_servers(
        "a_redlock_lease_is_held_on_every_healthy_server_after_its_acquisition",
        &[Flavor::Redis],
        |flavor| async move {
            let servers = RedisServers::start_flavor(flavor, 3);
            let urls = servers.urls();
            let mut conns = Vec::new();
            for url in &urls {
                let client = redis::Client::open(url.as_str()).unwrap();
                conns.push(client.get_multiplexed_async_connection().await.unwrap());
            }
            let cfg = Config::default().with_expiry(Duration::from_secs(30));
            for (client, build) in CLIENTS {
                let spawner = TokioSpawner::current().unwrap();
                let warm = build(&urls, cfg.clone()).with_spawner(spawner.clone());
                let mut leases = Vec::new();
                for i in 0..count("REDLEASE_REDUNDANCY_WARM", WARM) {
                    let k = format!("spread:{client}:warm:{i}");
                    leases.push(warm.lock(k).try_acquire().await.unwrap());
                }
                for i in 0..count("REDLEASE_REDUNDANCY_FRESH", FRESH) {
                    let fresh = build(&urls, cfg.clone()).with_spawner(spawner.clone());
                    let k = format!("spread:{client}:fresh:{i}");
                    leases.push(fresh.lock(k).try_acquire().await.unwrap());
                }
                // The background writes take one round trip; 5 s is far beyond what a loaded machine adds.
                let missing = spread(&mut conns, &leases, Duration::from_secs(5)).await;
                assert!(
                    missing.is_empty(),
                    "{client} on {flavor:?}: {} of {} leases not on every server: {missing:?}",
                    missing.len(),
                    leases.len()
                );
                for lease in leases {
                    lease.release().await.unwrap();
                }
            }
        },
    );
}
