//! Fault tests of redlease on real processes (not published).
//!
//! - `src/bin/redlease-worker.rs`: a lock client run as several OS processes by the tests in `tests/`
//!   (multi-process contention, holder pause).
//! - `tests/contention.rs`: several worker processes contend for one lock in single and Redlock mode; their
//!   holder intervals must not overlap and a non-atomic read-modify-write counter must lose no update.
//! - `tests/pause.rs`: the holding process is `SIGSTOP`ped longer than its TTL; a second process acquires
//!   with a larger fencing token; the first one's loss signal has fired when it resumes and the fenced store
//!   rejects its late write.
//! - `tests/soak.rs`: a seeded random nemesis (server pauses, kills and restarts, proxy faults, script cache
//!   flushes) against single and Redlock setups, checked by the testkit's history checker.
//!
//! This library holds what the worker and the tests share: the fenced store, the shared wall clock, a
//! seeded random generator and node construction.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redlease::machine::Jitter;
use redlease_adapters::fred::{FredNode, fred};
use redlease_adapters::redis::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redlease_adapters::redis::redis::{self, RedisResult};
use redlease_adapters::redis::{ManagedNode, MultiplexedNode, RedisRsNode};

/// Nanoseconds since the Unix epoch (`CLOCK_REALTIME`): the clock every process on the machine shares, used to
/// compare holder intervals reported by different processes.
pub fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// A fenced store: a Redis hash `{fence, value}` that accepts a write only with a fencing token larger than the
/// one it stored last. `KEYS[1]` store, `ARGV[1]` token, `ARGV[2]` value. Returns `{accepted (0|1), fence now
/// stored}`. The comparison runs on decimal strings of equal length first, so tokens above 2^53 compare exactly.
pub const FENCED_WRITE: &str = r#"local cur = redis.call('HGET', KEYS[1], 'fence')
local new = ARGV[1]
if cur then
  if #new < #cur or (#new == #cur and new <= cur) then
    return {0, cur}
  end
end
redis.call('HSET', KEYS[1], 'fence', new, 'value', ARGV[2])
return {1, new}
"#;

/// What the fenced store answered to one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedWrite {
    /// Whether the write was accepted.
    pub accepted: bool,
    /// The fence the store holds after the write.
    pub stored: u64,
}

/// Writes `value` to the fenced store at `store` with fencing token `fence` (see [`FENCED_WRITE`]).
///
/// # Errors
/// A Redis error, or a reply of an unexpected shape.
pub async fn fenced_write(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    store: &str,
    fence: u64,
    value: &str,
) -> RedisResult<FencedWrite> {
    let (accepted, stored): (i64, String) = redis::cmd("EVAL")
        .arg(FENCED_WRITE)
        .arg(1)
        .arg(store)
        .arg(fence.to_string())
        .arg(value)
        .query_async(conn)
        .await?;
    let stored = stored.parse().map_err(|_| {
        redis::RedisError::from((
            redis::ErrorKind::Parse,
            "the fenced store holds a non-numeric fence",
        ))
    })?;
    Ok(FencedWrite {
        accepted: accepted == 1,
        stored,
    })
}

/// Reads an integer key (absent = 0).
///
/// # Errors
/// A Redis error or a non-integer value.
pub async fn get_counter(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    key: &str,
) -> RedisResult<i64> {
    let v: Option<i64> = redis::cmd("GET").arg(key).query_async(conn).await?;
    Ok(v.unwrap_or(0))
}

/// A multiplexed redis-rs node for `url`, with the URL as endpoint (no reconnection; for the short-lived
/// workers, which fail loudly if their server goes away).
///
/// # Errors
/// When the server cannot be reached.
pub async fn multiplexed_node(url: &str) -> RedisResult<MultiplexedNode> {
    let client = redis::Client::open(url)?;
    MultiplexedNode::connect(&client).await
}

/// A reconnecting redis-rs node for `url` (through a fault proxy in the soak): small connection and response
/// timeouts, quick reconnection, and `endpoint` as its identity (the real server behind the proxy, so that
/// Redlock's duplicate-endpoint check sees the true topology).
///
/// # Errors
/// When the first connection cannot be made.
pub async fn managed_node(
    url: &str,
    endpoint: &str,
    timeout: Duration,
) -> RedisResult<ManagedNode> {
    let client = redis::Client::open(url)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100));
    let conn: ConnectionManager = client.get_connection_manager_with_config(config).await?;
    Ok(RedisRsNode::new(conn).with_endpoint(endpoint))
}

/// A fred client node for `url` (through a fault proxy in the soak): connection and internal command timeouts
/// of `timeout`, reconnecting every 20 ms without limit. redlease's fred node sends every lock command at most
/// once and fails fast while disconnected.
///
/// # Errors
/// When the client cannot be built or its first connection fails.
pub async fn fred_node(
    url: &str,
    timeout: Duration,
) -> Result<FredNode<fred::clients::Client>, fred::error::Error> {
    use fred::prelude::{Builder, ClientLike, Config as FredConfig, ReconnectPolicy};
    let config = FredConfig::from_url(url)?;
    let mut builder = Builder::from_config(config);
    builder
        .with_connection_config(|c| {
            c.connection_timeout = timeout;
            c.internal_command_timeout = timeout;
        })
        .set_policy(ReconnectPolicy::new_constant(0, 20));
    let client = builder.build()?;
    client.init().await?;
    Ok(FredNode::new(client))
}

/// A seeded pseudo-random generator (SplitMix64, redlease's jitter generator) with the helpers the nemesis and
/// the workers need. The same seed gives the same sequence.
#[derive(Debug, Clone)]
pub struct Rng(Jitter);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(Jitter::from_seed(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A uniform integer in `[0, n)` (`0` when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A uniform integer in `[lo, hi]`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// A duration of `[lo_ms, hi_ms]` milliseconds.
    pub fn millis(&mut self, lo_ms: u64, hi_ms: u64) -> Duration {
        Duration::from_millis(self.range(lo_ms, hi_ms))
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.0.next_unit() < p
    }

    /// A uniformly chosen element index of a slice of length `len` (`len > 0`).
    pub fn pick(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_reproducible_and_in_range() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..1000 {
            let x = a.range(3, 9);
            assert_eq!(x, b.range(3, 9));
            assert!((3..=9).contains(&x));
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }
}
