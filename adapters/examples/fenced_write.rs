//! A fenced resource rejects a stale holder's late write.
//!
//! The resource is a Redis key updated only through a small Lua script that remembers the largest fencing
//! token it has accepted and refuses writes carrying a smaller one (`UPDATE … WHERE last_fence <= $fence` in
//! SQL terms; an equal token is the same holder writing again).
//!
//! Holder A acquires the fenced lock and then stalls (think GC pause) past its lease. Holder B acquires with
//! a larger fencing token and writes. A wakes up and writes with its old token: the resource rejects it, and
//! B's value stays. A's release then reports the lease as lost.
//!
//! ```sh
//! cargo run -p redlease-adapters --features redis,tokio --example fenced_write
//! REDIS_URL=redis://127.0.0.1:7001 cargo run -p redlease-adapters --features redis,tokio --example fenced_write
//! ```
//!
//! Without `REDIS_URL` (or `REDLEASE_NODES` with one URL) it starts a temporary `redis-server`.

use std::time::Duration;

use redlease::{Config, Lock, LockManager};
use redlease_adapters::redis::redis;

#[path = "common/mod.rs"]
mod common;
use common::BoxError;

const LOCK_KEY: &str = "report:{42}:lock";
const FENCE_KEY: &str = "report:{42}:fence";
/// The protected resource and the largest fencing token it has accepted.
const DATA_KEY: &str = "report:{42}:data";
const LAST_FENCE_KEY: &str = "report:{42}:data-fence";
/// Short, so the example's stall is short; a lease's operation timeout is a fifth of it (200 ms a round),
/// enough for a round on a loaded machine (at 300 ms, 60 ms rounds timed out under load).
const TTL: Duration = Duration::from_millis(1000);

/// KEYS[1]: the data, KEYS[2]: the largest accepted fence; ARGV[1]: the writer's fence, ARGV[2]: the value.
/// Returns `{1, previous largest}` when the write is accepted, `{0, largest}` when it is refused.
const FENCED_SET: &str = r"
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local fence = tonumber(ARGV[1])
if fence < last then
  return {0, last}
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return {1, last}
";

/// What the run showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FencedOutcome {
    pub(crate) stale_fence: u64,
    pub(crate) new_fence: u64,
    /// Whether the resource refused the stale holder's write.
    pub(crate) stale_write_rejected: bool,
    /// Whether the stale holder's release reported the lease as lost.
    pub(crate) stale_release_reported_lost: bool,
    /// The value the resource holds at the end.
    pub(crate) final_value: String,
}

/// Writes `value` to the resource with `fence`; returns whether it was accepted and the largest fence the
/// resource had accepted before.
async fn fenced_set(
    conn: &mut redis::aio::MultiplexedConnection,
    fence: u64,
    value: &str,
) -> Result<(bool, u64), BoxError> {
    // Plain EVAL keeps the example short; in production load the script once and call EVALSHA (redis-rs:
    // `redis::Script`, behind its `script` feature).
    let (accepted, last): (i64, u64) = redis::cmd("EVAL")
        .arg(FENCED_SET)
        .arg(2)
        .arg(DATA_KEY)
        .arg(LAST_FENCE_KEY)
        .arg(fence)
        .arg(value)
        .query_async(conn)
        .await?;
    Ok((accepted == 1, last))
}

/// A lock handle and a connection to the resource, as one holder process would have them.
async fn holder(url: &str) -> Result<(Lock, redis::aio::MultiplexedConnection), BoxError> {
    let manager =
        LockManager::single(common::node(url).await?, Config::default().with_expiry(TTL))?;
    Ok((
        manager.lock(LOCK_KEY).fenced(FENCE_KEY),
        common::connection(url).await?,
    ))
}

/// Plays the scenario against the Redis at `url`; fails unless the stale write is rejected.
pub(crate) async fn run(url: &str) -> Result<FencedOutcome, BoxError> {
    // Two holders with their own connections, like two processes.
    let (lock_a, mut conn_a) = holder(url).await?;
    let (lock_b, mut conn_b) = holder(url).await?;

    let lease_a = lock_a.acquire().await?;
    let fence_a = lease_a
        .fencing_token()
        .ok_or("a fenced lock issues a token")?;
    println!("A acquired the lock with fencing token {fence_a} (lease TTL {TTL:?}, not renewed)");
    let (accepted, _) = fenced_set(&mut conn_a, fence_a, "written by A, first").await?;
    println!("A writes with token {fence_a}: accepted = {accepted}");
    if !accepted {
        return Err("the resource refused the current holder's write".into());
    }

    // A stalls longer than its lease: nothing renews it, and it does not notice.
    println!("A stalls for {:?}…", TTL * 2);
    tokio::time::sleep(TTL * 2).await;

    let lease_b = lock_b.acquire().await?;
    let fence_b = lease_b
        .fencing_token()
        .ok_or("a fenced lock issues a token")?;
    println!("B acquired the lock with fencing token {fence_b}");
    // B writes twice with its one token: an equal token is the same holder, so the resource accepts it.
    for value in ["written by B, first", "written by B"] {
        let (accepted, _) = fenced_set(&mut conn_b, fence_b, value).await?;
        println!("B writes with token {fence_b}: accepted = {accepted}");
        if !accepted {
            return Err("the resource refused the current holder's write".into());
        }
    }

    // A wakes up and carries on as if it still held the lock.
    let (accepted, last) = fenced_set(&mut conn_a, fence_a, "written by A, late").await?;
    if accepted {
        println!("A's late write with token {fence_a} was ACCEPTED: the resource is not fenced");
    } else {
        println!(
            "A's late write with token {fence_a} was rejected: the resource has accepted token {last}"
        );
    }
    let stale_release = lease_a.release().await;
    match &stale_release {
        Ok(_) => println!("A's release succeeded"),
        Err(e) => println!("A's release: {e}"),
    }
    lease_b.release().await?;

    let final_value: String = redis::cmd("GET")
        .arg(DATA_KEY)
        .query_async(&mut conn_b)
        .await?;
    println!("the resource holds {final_value:?}");
    let outcome = FencedOutcome {
        stale_fence: fence_a,
        new_fence: fence_b,
        stale_write_rejected: !accepted,
        stale_release_reported_lost: stale_release.as_ref().is_err_and(|e| e.is_lost()),
        final_value,
    };
    if fence_b <= fence_a || accepted || outcome.final_value != "written by B" {
        return Err(format!("fencing did not protect the resource: {outcome:?}").into());
    }
    Ok(outcome)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let servers = common::servers(1)?;
    run(&servers.urls[0]).await?;
    Ok(())
}
