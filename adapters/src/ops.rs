//! The lock operations, written once on top of the two primitives each client adapter supplies.

use redlease::{KeyState, NodeError, Token, Ttl, async_trait};

use crate::scripts::{self, Reply, Script};
use crate::slot;

/// What a client adapter provides: running one of our scripts, and a plain `SET NX PX`.
#[async_trait]
pub(crate) trait Transport: Send + Sync {
    /// Runs `script` with `keys` and `args`: `EVALSHA`, and exactly one `EVAL` after a `NOSCRIPT` reply.
    async fn eval(&self, script: &Script, keys: &[&str], args: &[&str])
    -> Result<Reply, NodeError>;

    /// `SET key value NX PX ttl_ms`, its reply as sent.
    async fn set_nx_px(&self, key: &str, value: &str, ttl_ms: u64) -> Result<Reply, NodeError>;

    /// Whether the keys of one call must share a Redis Cluster slot (checked before anything is sent).
    fn clustered(&self) -> bool;
}

pub(crate) async fn acquire(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    let ttl = ttl.as_millis().to_string();
    let reply = t
        .eval(&scripts::ACQUIRE, &[key], &[token.as_str(), &ttl])
        .await?;
    scripts::parse_flag(&scripts::ACQUIRE, reply)
}

/// `SET key token NX PX ttl`: one plain command for a token never sent before.
pub(crate) async fn acquire_fresh(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    let reply = t.set_nx_px(key, token.as_str(), ttl.as_millis()).await?;
    scripts::parse_set_nx(reply)
}

pub(crate) async fn acquire_fenced(
    t: &impl Transport,
    key: &str,
    fence_key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<Option<u64>, NodeError> {
    if t.clustered() {
        slot::check_same_slot(key, fence_key)?;
    }
    let ttl = ttl.as_millis().to_string();
    let reply = t
        .eval(
            &scripts::ACQUIRE_FENCED,
            &[key, fence_key],
            &[token.as_str(), &ttl],
        )
        .await?;
    scripts::parse_fence(reply)
}

pub(crate) async fn release(
    t: &impl Transport,
    key: &str,
    token: &Token,
) -> Result<bool, NodeError> {
    let reply = t.eval(&scripts::RELEASE, &[key], &[token.as_str()]).await?;
    scripts::parse_flag(&scripts::RELEASE, reply)
}

pub(crate) async fn extend(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    let ttl = ttl.as_millis().to_string();
    let reply = t
        .eval(&scripts::EXTEND, &[key], &[token.as_str(), &ttl])
        .await?;
    scripts::parse_flag(&scripts::EXTEND, reply)
}

pub(crate) async fn inspect(t: &impl Transport, key: &str) -> Result<Option<KeyState>, NodeError> {
    let reply = t.eval(&scripts::INSPECT, &[key], &[]).await?;
    scripts::parse_inspect(reply)
}
