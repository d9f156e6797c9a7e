//! Shared helpers of the live tests: building nodes of every kind against temporary servers.

use std::time::Duration;

use redlease::{Config, NodeError};

#[path = "../shared/backends.rs"]
mod backends;
pub(crate) use backends::{Backend, PROBE_KEY, fred_builder, node, node_in, unprobed, unprobed_in};

#[path = "../shared/flavors.rs"]
mod flavors;
pub(crate) use flavors::{CLUSTERS, EVERY_SERVER, WITH_LUA, has_lua, on_every_server, on_servers};

pub(crate) const ALL_BACKENDS: [Backend; 4] = [
    Backend::RedisMultiplexed,
    Backend::RedisManager,
    Backend::FredClient,
    Backend::FredPool,
];

/// A fred client (not yet connected) for `url`.
pub(crate) fn fred_client(url: &str) -> redlease_adapters::fred::fred::clients::Client {
    fred_builder(url).build().expect("fred client")
}

/// Short-TTL config for live tests: one attempt, small retry delay, and rounds of at least 300 ms (the
/// default, expiry / 5, would give a 500 ms lease 100 ms rounds, which a loaded two-core machine running
/// four servers' test bodies at once exceeds now and then — a Lua-less fenced acquisition is three round
/// trips), at most half the expiry. Tests about timeouts set their own.
pub(crate) fn config(expiry: Duration) -> Config {
    let default = Config::default().operation_timeout_for(expiry);
    let op = default.max(Duration::from_millis(300)).min(expiry / 2);
    Config::default()
        .with_expiry(expiry)
        .with_attempts(1)
        .with_retry_delay(Duration::from_millis(10))
        .with_operation_timeout(op)
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

/// Loads every script, so that one script call is one `EVALSHA` (no `NOSCRIPT` → `EVAL` pair to count);
/// nothing on a server without Lua.
pub(crate) fn preload(server: &redlease_testkit::server::RedisServer) {
    if has_lua(server.flavor()) {
        for script in redlease_adapters::scripts::ALL {
            server.cmd(&["SCRIPT", "LOAD", script.source]);
        }
    }
}

/// The lock commands (scripts, `SET`, `DELIFEQ`, `EXEC`) sent to `server` since its last `CONFIG RESETSTAT`.
pub(crate) fn lock_calls(server: &redlease_testkit::server::RedisServer) -> u64 {
    crate::stats::Stats::of(server).lock_commands()
}
