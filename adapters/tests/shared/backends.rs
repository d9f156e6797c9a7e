//! The node kinds the live and fault test binaries run against, built the same way in both.
//!
//! Included by each binary's `common` module with `#[path]`; each binary uses a subset of the kinds.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use redlease::RedisNode;
use redlease_adapters::fred::FredNode;
use redlease_adapters::fred::fred::prelude::{
    Builder, ClientLike, Config as FredConfig, ReconnectPolicy,
};
use redlease_adapters::redis::{MultiplexedNode, RedisRsNode, redis};

/// A kind of node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// redis-rs `MultiplexedConnection`: never reconnects.
    RedisMultiplexed,
    /// redis-rs `ConnectionManager`: reconnects, for scenarios that heal a connection a proxy cut.
    RedisManager,
    /// fred `Client`: reconnects; redlease sends every command with `max_attempts: 1` and `fail_fast`.
    FredClient,
    /// fred `Pool` of two clients.
    FredPool,
}

/// A fred builder for `url` with short connection and internal-command timeouts.
pub(crate) fn fred_builder(url: &str) -> Builder {
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

/// A connected node of `backend` for the server (or proxy) at `url`.
pub(crate) async fn node(backend: Backend, url: &str) -> Arc<dyn RedisNode> {
    let client = || redis::Client::open(url).expect("redis-rs client");
    match backend {
        Backend::RedisMultiplexed => Arc::new(
            MultiplexedNode::connect(&client())
                .await
                .expect("multiplexed connect"),
        ),
        Backend::RedisManager => {
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_millis(500)))
                .set_response_timeout(Some(Duration::from_millis(500)))
                .set_number_of_retries(2);
            let conn = client()
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
