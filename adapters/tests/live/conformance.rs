//! The independent reader of the testkit's conformance suite: every state read by a second connection
//! (`GET` + `PTTL`), not through the node's own `inspect`. The suite itself runs with it on every server and
//! backend in every command mode in `matrix.rs` (`conformance_on_*`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use redlease::{KeyState, NodeError, RedisNode, SystemTimer, Token, Ttl, async_trait};
use redlease_adapters::redis::redis;
use redlease_testkit::conformance::{self, StateReader};
use redlease_testkit::server::RedisServer;

use crate::common::{self, on_every_server};

/// Reads a key with `GET` and `PTTL` on its own redis-rs connection (a cluster connection routes both).
pub(crate) struct GetPttl<C>(pub(crate) C);

#[async_trait]
impl<C> StateReader for GetPttl<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn read(&self, key: &str) -> Result<Option<KeyState>, String> {
        let mut conn = self.0.clone();
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let Some(value) = value else {
            return Ok(None);
        };
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
        Ok(Some(KeyState::new(value, ttl)))
    }
}

/// A reader over a fresh multiplexed connection to `url`.
pub(crate) async fn reader(url: &str) -> GetPttl<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).unwrap();
    GetPttl(client.get_multiplexed_async_connection().await.unwrap())
}

/// A node that only pretends to extend: it answers `true` for its own key but never sends `PEXPIRE`, and its
/// `inspect` reports the TTL it pretended to set (never shortening one it pretended before, as the contract
/// asks). Checked through its own `inspect` it looks correct.
struct PretendsToExtend {
    inner: std::sync::Arc<dyn RedisNode>,
    claimed: Mutex<HashMap<String, Duration>>,
}

impl PretendsToExtend {
    /// An acquisition's own-token branch keeps (and may lengthen) what was pretended; any other acquisition
    /// forgets it.
    async fn claim_again(&self, key: &str, token: &Token, ttl: Ttl) -> Result<(), NodeError> {
        let ours = self
            .inner
            .inspect(key)
            .await?
            .is_some_and(|s| s.holds(token));
        let mut claimed = self.claimed.lock().unwrap();
        match claimed.get_mut(key) {
            Some(c) if ours => *c = (*c).max(ttl.as_duration()),
            _ => {
                claimed.remove(key);
            }
        }
        Ok(())
    }
}

#[async_trait]
impl RedisNode for PretendsToExtend {
    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        self.claim_again(key, token, ttl).await?;
        self.inner.acquire(key, token, ttl).await
    }
    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError> {
        self.claim_again(key, token, ttl).await?;
        self.inner.acquire_fenced(key, fence_key, token, ttl).await
    }
    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        self.inner.release(key, token).await
    }
    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        let ours = self
            .inner
            .inspect(key)
            .await?
            .is_some_and(|s| s.holds(token));
        if ours {
            let mut claimed = self.claimed.lock().unwrap();
            let longest = claimed
                .get(key)
                .map_or(ttl.as_duration(), |&c| c.max(ttl.as_duration()));
            claimed.insert(key.to_owned(), longest);
        }
        Ok(ours)
    }
    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        let state = self.inner.inspect(key).await?;
        let claimed = self.claimed.lock().unwrap().get(key).copied();
        Ok(state.map(|s| KeyState::new(s.value, claimed.or(s.ttl))))
    }
}

#[test]
fn the_independent_reader_catches_a_node_whose_inspect_agrees_with_its_own_bug() {
    on_every_server(
        "the_independent_reader_catches_a_node_whose_inspect_agrees_with_its_own_bug",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            let node = PretendsToExtend {
                inner: common::node(common::Backend::RedisMultiplexed, &server.url()).await,
                claimed: Mutex::new(HashMap::new()),
            };
            // Through its own inspect the broken node passes...
            conformance::run(&node, &SystemTimer)
                .await
                .expect("the self-consistent node passes the inspect-based run");
            // ...the independent reader sees that the TTL never changed.
            let reader = reader(&server.url()).await;
            let failure = conformance::run_with_reader(&node, &reader, &SystemTimer)
                .await
                .expect_err("a node that never extends passed with an independent reader");
            assert_eq!(
                failure.case, "extend_only_own_token_and_never_creates",
                "{failure}"
            );
        },
    );
}
