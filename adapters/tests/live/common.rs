//! Shared helpers of the live tests: building nodes of every kind against temporary servers.

use std::sync::Arc;
use std::time::Duration;

use redlease::{Config, NodeError, RedisNode};
use redlease_adapters::fred::FredNode;
use redlease_adapters::fred::fred::prelude::{
    Builder, ClientLike, Config as FredConfig, ReconnectPolicy,
};
use redlease_adapters::redis::{MultiplexedNode, RedisRsNode, redis};

/// The kinds of node the single-server tests run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    RedisMultiplexed,
    RedisManager,
    FredClient,
    FredPool,
}

pub(crate) const ALL_BACKENDS: [Backend; 4] = [
    Backend::RedisMultiplexed,
    Backend::RedisManager,
    Backend::FredClient,
    Backend::FredPool,
];

fn fred_builder(url: &str) -> Builder {
    let config = FredConfig::from_url(url).expect("fred config from url");
    let mut builder = Builder::from_config(config);
    builder
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_millis(500);
            c.internal_command_timeout = Duration::from_millis(500);
        })
        .set_policy(ReconnectPolicy::new_constant(0, 20));
    builder
}

/// A connected node of `backend` for the server at `url`.
pub(crate) async fn node(backend: Backend, url: &str) -> Arc<dyn RedisNode> {
    match backend {
        Backend::RedisMultiplexed => {
            let client = redis::Client::open(url).expect("redis-rs client");
            Arc::new(MultiplexedNode::connect(&client).await.expect("connect"))
        }
        Backend::RedisManager => {
            let client = redis::Client::open(url).expect("redis-rs client");
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_millis(500)))
                .set_response_timeout(Some(Duration::from_millis(500)))
                .set_number_of_retries(2);
            let conn = client
                .get_connection_manager_with_config(config)
                .await
                .expect("connection manager");
            Arc::new(RedisRsNode::new(conn).with_endpoint(url))
        }
        Backend::FredClient => {
            let client = fred_builder(url).build().expect("fred client");
            client.init().await.expect("fred init");
            Arc::new(FredNode::new(client))
        }
        Backend::FredPool => {
            let pool = fred_builder(url).build_pool(2).expect("fred pool");
            pool.init().await.expect("fred pool init");
            Arc::new(FredNode::new(pool))
        }
    }
}

/// A fred client (not yet connected) for `url`.
pub(crate) fn fred_client(url: &str) -> redlease_adapters::fred::fred::clients::Client {
    fred_builder(url).build().expect("fred client")
}

/// Short-TTL config for live tests: one attempt, small retry delay.
pub(crate) fn config(expiry: Duration) -> Config {
    Config::default()
        .expiry(expiry)
        .attempts(1)
        .retry_delay(Duration::from_millis(10))
}

/// A unique key for one test case (a fresh server per test keeps them apart anyway).
pub(crate) fn key(name: &str, backend: Backend) -> String {
    format!("live:{{{name}:{backend:?}}}:lock")
}

/// The fence key sharing `key`'s hash tag.
pub(crate) fn fence_of(key: &str) -> String {
    key.replace(":lock", ":fence")
}

/// The first node error inside a redlease error, if any.
pub(crate) fn first_node_error(err: &redlease::Error) -> Option<NodeError> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(node_err) = e.downcast_ref::<NodeError>() {
            return Some(node_err.clone());
        }
        source = e.source();
    }
    None
}

/// The full chain of messages of an error.
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        out.push_str(" <- ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}
