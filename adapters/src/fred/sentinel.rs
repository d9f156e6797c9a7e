//! A fred client for the primary behind Redis Sentinel, set up to follow it after a failover.

use std::time::Duration;

use fred::prelude::{Builder, ReconnectPolicy};
use fred::types::config::{Config, ServerConfig};

/// A fred [`Builder`] for the primary the Sentinels at `sentinels` (`(host, port)`) monitor as
/// `master_name` (`ServerConfig::Sentinel`): build a [`Client`](fred::clients::Client) or a
/// [`Pool`](fred::clients::Pool) from it and wrap it in a [`FredNode`](super::FredNode), like any fred
/// client.
///
/// fred asks the Sentinels for the primary (`SENTINEL get-master-addr-by-name`) at each (re)connection, so
/// it follows a failover only if it reconnects. A dead primary breaks the connection; one that stops
/// answering with its connection open (`SIGSTOP`, a hung host) does not, so a [`FredNode`](super::FredNode)
/// tells a Sentinel client to reconnect (`force_reconnection`) when one of its commands times out or is cut
/// by the operation timeout. The builder sets a reconnect policy (a constant 100 ms
/// between attempts, without limit; replace it with [`Builder::set_policy`] if you like, but keep one) and
/// connection and internal-command timeouts of 500 ms (keep them at most the operation timeout). While the
/// old primary is dead and the Sentinels still name it, the node's calls fail at once and definitely (not
/// connected, nothing sent: the node's fail-fast); the first call after fred connected to the new primary
/// runs the capability check again, and [`run_id`](redlease::RedisNode::run_id) reports the new server's.
/// The node's endpoint is `redis-sentinel://host:port,…/<master name>/<db>` (the Sentinels, sorted; the
/// same form as a redis-rs [`SentinelNode`](crate::redis::SentinelNode)'s).
///
/// Credentials for the primary go in the config ([`Builder::with_config`]); Sentinels with their own need
/// fred's `sentinel-auth` feature.
///
/// ```no_run
/// use redlease::{Config, LockManager};
/// use redlease_adapters::fred::{FredNode, sentinel_builder, fred::prelude::*};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let client = sentinel_builder(vec![("10.0.0.1", 26379), ("10.0.0.2", 26379)], "mymaster").build()?;
/// client.init().await?;
/// let manager = LockManager::single(FredNode::new(client), redlease::Config::default())?;
/// # Ok(())
/// # }
/// ```
pub fn sentinel_builder<H: Into<String>>(sentinels: Vec<(H, u16)>, master_name: &str) -> Builder {
    let config = Config {
        server: ServerConfig::new_sentinel(sentinels, master_name),
        ..Config::default()
    };
    let mut builder = Builder::from_config(config);
    builder
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_millis(500);
            c.internal_command_timeout = Duration::from_millis(500);
        })
        .set_policy(ReconnectPolicy::new_constant(0, 100));
    builder
}
