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
use redlease_adapters::redis::{ManagedNode, MultiplexedNode, redis};
use redlease_adapters::{Capabilities, Commands};

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

/// The example key of the tests' eager capability checks.
pub(crate) const PROBE_KEY: &str = "probe:{warm-up}";

/// A connected node of `backend` for the server (or proxy) at `url`, its capability check already run (so
/// that a test's first acquisition is exactly one lock command, as every later one).
pub(crate) async fn node(backend: Backend, url: &str) -> Arc<dyn RedisNode> {
    build(backend, url, true, Commands::Automatic).await
}

/// [`node`] in the given [`Commands`] mode, with what its capability check learned.
pub(crate) async fn node_in(
    backend: Backend,
    url: &str,
    commands: Commands,
) -> (Arc<dyn RedisNode>, Capabilities) {
    let client = || redis::Client::open(url).expect("redis-rs client");
    match backend {
        Backend::RedisMultiplexed => {
            let node = MultiplexedNode::connect(&client())
                .await
                .expect("multiplexed connect")
                .with_commands(commands);
            node.probe(PROBE_KEY).await.expect("capability check");
            let caps = node.capabilities().expect("checked");
            (Arc::new(node), caps)
        }
        Backend::RedisManager => {
            let node = ManagedNode::connect(&client())
                .await
                .expect("connection manager")
                .with_commands(commands);
            node.probe(PROBE_KEY).await.expect("capability check");
            let caps = node.capabilities().expect("checked");
            (Arc::new(node), caps)
        }
        Backend::FredClient => {
            let client = fred_builder(url).build().expect("fred client");
            client.init().await.expect("fred init");
            let node = FredNode::new(client).with_commands(commands);
            node.probe(PROBE_KEY).await.expect("capability check");
            let caps = node.capabilities().expect("checked");
            (Arc::new(node), caps)
        }
        Backend::FredPool => {
            let pool = fred_builder(url).build_pool(2).expect("fred pool");
            pool.init().await.expect("fred pool init");
            let node = FredNode::new(pool).with_commands(commands);
            node.probe(PROBE_KEY).await.expect("capability check");
            let caps = node.capabilities().expect("checked");
            (Arc::new(node), caps)
        }
    }
}

/// An unchecked node of `backend` in `commands` mode.
pub(crate) async fn unprobed_in(
    backend: Backend,
    url: &str,
    commands: Commands,
) -> Arc<dyn RedisNode> {
    build(backend, url, false, commands).await
}

/// A connected node of `backend` for `url` whose capability check runs at its first acquisition.
pub(crate) async fn unprobed(backend: Backend, url: &str) -> Arc<dyn RedisNode> {
    build(backend, url, false, Commands::Automatic).await
}

async fn build(backend: Backend, url: &str, probe: bool, commands: Commands) -> Arc<dyn RedisNode> {
    let client = || redis::Client::open(url).expect("redis-rs client");
    match backend {
        Backend::RedisMultiplexed => {
            let node = MultiplexedNode::connect(&client())
                .await
                .expect("multiplexed connect")
                .with_commands(commands);
            if probe {
                node.probe(PROBE_KEY).await.expect("capability check");
            }
            Arc::new(node)
        }
        Backend::RedisManager => {
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_millis(500)))
                .set_response_timeout(Some(Duration::from_millis(500)))
                // Reconnection retried (with backoff), for scenarios that heal a cut connection.
                .set_number_of_retries(2);
            let node = ManagedNode::connect_with_config(&client(), config)
                .await
                .expect("connection manager")
                .with_endpoint(url)
                .with_commands(commands);
            if probe {
                node.probe(PROBE_KEY).await.expect("capability check");
            }
            Arc::new(node)
        }
        Backend::FredClient => {
            let client = fred_builder(url).build().expect("fred client");
            client.init().await.expect("fred init");
            let node = FredNode::new(client).with_commands(commands);
            if probe {
                node.probe(PROBE_KEY).await.expect("capability check");
            }
            Arc::new(node)
        }
        Backend::FredPool => {
            let pool = fred_builder(url).build_pool(2).expect("fred pool");
            pool.init().await.expect("fred pool init");
            let node = FredNode::new(pool).with_commands(commands);
            if probe {
                node.probe(PROBE_KEY).await.expect("capability check");
            }
            Arc::new(node)
        }
    }
}
