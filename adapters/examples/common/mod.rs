//! Shared by the examples: where the Redis servers come from, and how to connect to them.
//!
//! Each example uses only part of this module.
#![allow(dead_code)]

use std::error::Error;
use std::time::Duration;

use redlease_adapters::redis::redis::aio::MultiplexedConnection;
use redlease_adapters::redis::redis::{AsyncConnectionConfig, Client};
use redlease_adapters::redis::{MultiplexedNode, RedisRsNode};
use redlease_testkit::server::{RedisServers, find_redis_server};

pub(crate) type BoxError = Box<dyn Error + Send + Sync>;

/// The servers an example talks to.
pub(crate) struct Servers {
    /// Their URLs, in order.
    pub(crate) urls: Vec<String>,
    /// Temporary servers started by the example (killed when dropped), when none were given.
    pub(crate) temporary: Option<RedisServers>,
}

/// `n` servers: the comma-separated URLs in `REDLEASE_NODES`, else the one in `REDIS_URL`, else `n` temporary
/// `redis-server`s on free loopback ports (no persistence), started here.
pub(crate) fn servers(n: usize) -> Result<Servers, BoxError> {
    let non_empty = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let given = non_empty("REDLEASE_NODES")
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .or_else(|| non_empty("REDIS_URL").map(|v| vec![v.trim().to_owned()]));
    if let Some(urls) = given {
        if urls.len() != n {
            return Err(format!(
                "this example needs {n} Redis URL(s) in REDLEASE_NODES / REDIS_URL, got {}",
                urls.len()
            )
            .into());
        }
        let shown: Vec<String> = urls.iter().map(|u| endpoint(u)).collect::<Result<_, _>>()?;
        println!("using {}", shown.join(", "));
        return Ok(Servers {
            urls,
            temporary: None,
        });
    }
    if find_redis_server().is_none() {
        return Err(
            "no REDIS_URL or REDLEASE_NODES given, and no redis-server binary found to start a \
                    temporary one (install Redis, or set REDIS_SERVER to its path)"
                .into(),
        );
    }
    let temporary = RedisServers::start(n);
    let urls = temporary.urls();
    println!(
        "no REDIS_URL or REDLEASE_NODES given: started {n} temporary redis-server(s) at {}",
        urls.join(", ")
    );
    Ok(Servers {
        urls,
        temporary: Some(temporary),
    })
}

/// `redis://host:port/db` of a URL, without credentials.
pub(crate) fn endpoint(url: &str) -> Result<String, BoxError> {
    let client = Client::open(url)?;
    let info = client.get_connection_info();
    Ok(format!(
        "redis://{}/{}",
        info.addr(),
        info.redis_settings().db()
    ))
}

/// A multiplexed connection with the client timeouts redlease recommends: a short connection timeout, and a
/// response timeout of about the operation timeout (redlease cuts every round at that timeout anyway).
pub(crate) async fn connection(url: &str) -> Result<MultiplexedConnection, BoxError> {
    let client = Client::open(url)?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_millis(500)));
    Ok(client
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

/// A redlease node over its own [`connection`], reporting the URL without credentials as its endpoint.
pub(crate) async fn node(url: &str) -> Result<MultiplexedNode, BoxError> {
    Ok(RedisRsNode::new(connection(url).await?).with_endpoint(endpoint(url)?))
}
