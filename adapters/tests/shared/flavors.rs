//! Running one live test on every server of the matrix: Redis 7.0, Valkey 8.1, Valkey 9.1 and Valkey 9.1
//! without Lua (and, for the cluster tests, a Redis and a Valkey 9.1 Cluster).
//!
//! Included by each binary's `common` module with `#[path]`.
#![allow(dead_code)]

use std::future::Future;

use redlease_testkit::server::{Flavor, on_each_flavor};

/// Every single-server flavor.
pub(crate) const EVERY_SERVER: [Flavor; 4] = Flavor::ALL;

/// The servers that run Lua scripts (for tests of the scripts themselves).
pub(crate) const WITH_LUA: [Flavor; 3] = [Flavor::Redis, Flavor::Valkey81, Flavor::Valkey91];

/// The flavors a three-master cluster runs on: Redis 7.0 and Valkey 9.1.
pub(crate) const CLUSTERS: [Flavor; 2] = [Flavor::Redis, Flavor::Valkey91];

/// Runs `body` once per flavor, each on its own thread with its own two-worker tokio runtime (what
/// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` gives a test), concurrently; a failure names
/// the flavor (see [`on_each_flavor`]).
pub(crate) fn on_servers<F, Fut>(test: &str, flavors: &[Flavor], body: F)
where
    F: Fn(Flavor) -> Fut + Sync,
    Fut: Future<Output = ()>,
{
    on_each_flavor(test, flavors, |flavor| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
            .block_on(body(flavor));
    });
}

/// [`on_servers`] on every single-server flavor.
pub(crate) fn on_every_server<F, Fut>(test: &str, body: F)
where
    F: Fn(Flavor) -> Fut + Sync,
    Fut: Future<Output = ()>,
{
    on_servers(test, &EVERY_SERVER, body);
}

/// Whether the server runs Lua scripts.
pub(crate) fn has_lua(flavor: Flavor) -> bool {
    flavor != Flavor::Valkey91NoLua
}
