//! Cluster nodes of both clients over a testkit `RedisCluster` (shared by the live and fault tiers).

use std::time::Duration;

use redlease_adapters::fred::FredNode;
use redlease_adapters::fred::fred::prelude::{
    Builder, ClientLike, Config as FredConfig, ServerConfig,
};
use redlease_adapters::redis::{ClusterNode, redis};
use redlease_testkit::server::RedisCluster;

/// A redis-rs cluster node with release notifications (its own subscriber connections).
pub(crate) async fn redis_rs_node(cluster: &RedisCluster) -> ClusterNode {
    let builder = || {
        redis::cluster::ClusterClientBuilder::new(cluster.urls())
            .connection_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
    };
    ClusterNode::connect_with_subscriber(builder(), builder())
        .await
        .unwrap()
}

pub(crate) async fn fred_node(
    cluster: &RedisCluster,
) -> FredNode<redlease_adapters::fred::fred::clients::Client> {
    let config = FredConfig {
        server: ServerConfig::new_clustered(
            cluster
                .nodes()
                .iter()
                .map(|n| ("127.0.0.1".to_owned(), n.port()))
                .collect::<Vec<_>>(),
        ),
        ..FredConfig::default()
    };
    let client = Builder::from_config(config).build().unwrap();
    client.init().await.unwrap();
    FredNode::new(client)
}
