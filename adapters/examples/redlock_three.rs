//! Redlock across three independent Redis servers.
//!
//! One client acquires the lock on a majority (2 of 3), a second client is refused while it is held, the
//! holder extends and releases, and then the second client gets it. With temporary servers (none given), one
//! server is then killed to show that a majority of the remaining two still grants the lock.
//!
//! ```sh
//! cargo run -p redlease-adapters --features redis,tokio --example redlock_three
//! REDLEASE_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run -p redlease-adapters --features redis,tokio --example redlock_three
//! ```
//!
//! Without `REDLEASE_NODES` it starts three temporary `redis-server`s. Redlock issues no fencing tokens; use a
//! single Redis with fencing when a stale holder's writes must be rejected.

use std::time::Duration;

use redlease::{Config, LockManager};
use redlease_adapters::redis::redis;
use redlease_testkit::server::RedisServers;

#[path = "common/mod.rs"]
mod common;
use common::BoxError;

const KEY: &str = "jobs:rebuild-search-index:lock";
const TTL: Duration = Duration::from_secs(5);

/// What the run showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RedlockOutcome {
    /// Servers holding the first client's token right after it acquired.
    pub(crate) held_on: usize,
    /// Whether the second client was refused as contention while the first held the lock.
    pub(crate) second_refused: bool,
    /// Whether the second client acquired after the release.
    pub(crate) second_acquired_after_release: bool,
    /// With temporary servers: whether the lock was granted with one of three servers killed.
    pub(crate) acquired_with_one_killed: Option<bool>,
}

/// A client: its own connection to each server, and a Redlock manager over them.
async fn client(urls: &[String]) -> Result<LockManager, BoxError> {
    let mut nodes = Vec::with_capacity(urls.len());
    for url in urls {
        nodes.push(common::node(url).await?);
    }
    Ok(LockManager::redlock(
        nodes,
        Config::default().with_expiry(TTL).with_attempts(1),
    )?)
}

/// How many of the servers hold `token` under `KEY`.
async fn holders(urls: &[String], token: &str) -> Result<usize, BoxError> {
    let mut n = 0;
    for url in urls {
        let mut conn = common::connection(url).await?;
        let value: Option<String> = redis::cmd("GET").arg(KEY).query_async(&mut conn).await?;
        n += usize::from(value.as_deref() == Some(token));
    }
    Ok(n)
}

/// Plays the scenario on `urls` (three servers); `temporary` lets it kill one of them at the end.
pub(crate) async fn run(
    urls: &[String],
    temporary: Option<&mut RedisServers>,
) -> Result<RedlockOutcome, BoxError> {
    let first = client(urls).await?;
    let second = client(urls).await?;
    println!(
        "Redlock over {} servers, quorum {}",
        first.nodes(),
        first.quorum()
    );

    let lease = first.lock(KEY).acquire().await?;
    let held_on = holders(urls, lease.token().as_str()).await?;
    println!(
        "client 1 acquired: token {}, valid for {} ms, held on {held_on} of {} servers",
        lease.token(),
        lease.remaining().as_millis(),
        urls.len()
    );
    let refused = second.lock(KEY).try_acquire().await;
    let second_refused = matches!(&refused, Err(e) if e.is_contended());
    match &refused {
        Ok(_) => println!("client 2 acquired too: THE LOCK IS BROKEN"),
        Err(e) => println!("client 2 is refused: {e}"),
    }
    lease.extend(TTL).await?;
    println!(
        "client 1 extended: valid for {} ms",
        lease.remaining().as_millis()
    );
    lease.release().await?;
    println!("client 1 released");
    let after = second.lock(KEY).try_acquire().await;
    let second_acquired_after_release = after.is_ok();
    match after {
        Ok(lease) => {
            println!(
                "client 2 acquired after the release: token {}",
                lease.token()
            );
            lease.release().await?;
        }
        Err(e) => println!("client 2 still refused after the release: {e}"),
    }

    let acquired_with_one_killed = match temporary {
        Some(servers) => {
            servers.get_mut(0).kill();
            println!("killed the server at {}", urls[0]);
            let attempt = first.lock(KEY).try_acquire().await;
            let ok = attempt.is_ok();
            match attempt {
                Ok(lease) => {
                    println!(
                        "client 1 acquired with 2 of 3 servers: token {}, valid for {} ms",
                        lease.token(),
                        lease.remaining().as_millis()
                    );
                    lease.release().await?;
                }
                Err(e) => println!("client 1 failed with 2 of 3 servers: {e}"),
            }
            Some(ok)
        }
        None => None,
    };

    let outcome = RedlockOutcome {
        held_on,
        second_refused,
        second_acquired_after_release,
        acquired_with_one_killed,
    };
    if held_on < first.quorum()
        || !second_refused
        || !second_acquired_after_release
        || acquired_with_one_killed == Some(false)
    {
        return Err(format!("Redlock did not behave as expected: {outcome:?}").into());
    }
    Ok(outcome)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut servers = common::servers(3)?;
    run(&servers.urls, servers.temporary.as_mut()).await?;
    Ok(())
}
