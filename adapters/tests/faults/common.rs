//! Shared helpers of the fault tests: nodes of each backend, servers behind fault proxies, script-call
//! counters, a seeded generator and polling helpers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{Config, Error, NotAcquiredReason, RedisNode};
use redlease_adapters::scripts;
use redlease_testkit::proxy::FaultProxy;
use redlease_testkit::server::{Flavor, RedisServer, RedisServers};

#[path = "../shared/backends.rs"]
mod backends;
pub(crate) use backends::{Backend, fred_builder, node};

#[path = "../shared/flavors.rs"]
mod flavors;
pub(crate) use flavors::{CLUSTERS, has_lua, on_every_server, on_servers};

/// redis-rs multiplexed and fred client: the two adapters in their most common form.
pub(crate) const BACKENDS: [Backend; 2] = [Backend::RedisMultiplexed, Backend::FredClient];

/// The reconnecting backends, for scenarios whose connection must work again after a cut.
pub(crate) const RECONNECTING: [Backend; 2] = [Backend::RedisManager, Backend::FredClient];

/// Nodes of `backend`, one per URL, in order.
pub(crate) async fn nodes(backend: Backend, urls: &[String]) -> Vec<Arc<dyn RedisNode>> {
    let mut out = Vec::with_capacity(urls.len());
    for url in urls {
        out.push(node(backend, url).await);
    }
    out
}

/// Short-TTL configuration: one attempt, a small retry delay, the given operation timeout.
pub(crate) fn config(expiry: Duration, op_timeout: Duration) -> Config {
    Config::default()
        .with_expiry(expiry)
        .with_attempts(1)
        .with_retry_delay(Duration::from_millis(20))
        .with_operation_timeout(op_timeout)
}

/// A key unique to one scenario and backend.
pub(crate) fn key(name: &str, backend: Backend) -> String {
    format!("faults:{{{name}:{backend:?}}}:lock")
}

/// Loads every script, so that the first call is one `EVALSHA` (no `NOSCRIPT` round trip that a stalled or
/// cut connection could leave half done) and script-call counts are exact.
pub(crate) fn preload(server: &RedisServer) {
    if !has_lua(server.flavor()) {
        // No Lua: nothing to load (the nodes use native commands).
        return;
    }
    for script in scripts::ALL {
        server.cmd(&["SCRIPT", "LOAD", script.source]);
    }
}

/// Script executions (`EVALSHA` and `EVAL` calls) since the last `CONFIG RESETSTAT`.
pub(crate) fn script_calls(server: &RedisServer) -> u64 {
    server
        .cmd(&["INFO", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_eval"))
        .filter_map(|l| l.split(['=', ',']).nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Calls of `command` (lowercase) since the last `CONFIG RESETSTAT`.
pub(crate) fn command_calls(server: &RedisServer, command: &str) -> u64 {
    server
        .cmd(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Lock commands executed since the last `CONFIG RESETSTAT`: scripts, the plain `SET NX PX` that the
/// first attempt of an acquisition sends (the test's own admin commands must not use `SET` meanwhile), and
/// on Valkey the native `SET … IFEQ` (counted as `set`), `DELIFEQ` and the `EXEC` of a Lua-less transaction.
pub(crate) fn lock_calls(server: &RedisServer) -> u64 {
    server
        .cmd(&["INFO", "commandstats"])
        .lines()
        .filter(|l| {
            l.starts_with("cmdstat_eval")
                || l.starts_with("cmdstat_set:")
                || l.starts_with("cmdstat_delifeq:")
                || l.starts_with("cmdstat_exec:")
        })
        .filter_map(|l| l.split(['=', ',']).nth(1)?.parse::<u64>().ok())
        .sum()
}

/// The value under `key` on `server` (`""` when missing).
pub(crate) fn get(server: &RedisServer, key: &str) -> String {
    server.cmd(&["GET", key])
}

/// `PTTL` of `key` on `server` (-2 when missing, -1 without TTL).
pub(crate) fn pttl(server: &RedisServer, key: &str) -> i64 {
    server
        .cmd(&["PTTL", key])
        .parse()
        .expect("PTTL is an integer")
}

/// How long a test waits for a call beyond the quorum to land. A fresh Redlock acquisition returns at the
/// quorum and abandons the remaining calls; redis-rs's multiplexed connection discards an abandoned request
/// it had not yet written (`redis` 1.8, `multiplexed_connection.rs`: "nothing to receive our output"), so
/// on a loaded machine such a node may never get the key. A scenario that needs it there acquires again.
pub(crate) const LANDED_WITHIN: Duration = Duration::from_secs(2);

/// How many acquisitions such a scenario tries before failing.
pub(crate) const LANDING_TRIES: u32 = 5;

/// Polls `check` every 10 ms until it holds or `within` passes; returns whether it held.
pub(crate) async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The reason of a failed acquisition.
pub(crate) fn not_acquired_reason(err: &Error) -> Option<NotAcquiredReason> {
    match err {
        Error::NotAcquired { reason, .. } => Some(*reason),
        _ => None,
    }
}

/// Whether any node error of a failed acquisition was ambiguous.
pub(crate) fn any_ambiguous(err: &Error) -> bool {
    match err {
        Error::NotAcquired {
            last_error: Some(q),
            ..
        } => q.any_ambiguous(),
        Error::Lost {
            source: Some(q), ..
        } => q.any_ambiguous(),
        Error::Quorum(q) => q.any_ambiguous(),
        _ => false,
    }
}

/// The tokio spawner for managers that run background renewal and clean-up.
pub(crate) fn tokio_spawner(task: redlease::Task) {
    tokio::spawn(task);
}

/// `n` servers, each behind its own fault proxy (all forwarding at first).
pub(crate) struct Proxied {
    pub(crate) servers: RedisServers,
    pub(crate) proxies: Vec<FaultProxy>,
}

impl Proxied {
    pub(crate) fn start(flavor: Flavor, n: usize) -> Self {
        let servers = RedisServers::start_flavor(flavor, n);
        let proxies = servers
            .iter()
            .map(|s| FaultProxy::start(s.addr().parse().expect("server address")).expect("proxy"))
            .collect();
        for server in servers.iter() {
            preload(server);
        }
        Self { servers, proxies }
    }

    /// The proxies' URLs, in server order.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.proxies
            .iter()
            .map(|p| format!("{}/0", p.url()))
            .collect()
    }

    /// Every server's value under `key`, in order.
    pub(crate) fn values(&self, key: &str) -> Vec<String> {
        self.servers.iter().map(|s| get(s, key)).collect()
    }

    pub(crate) fn reset_stats(&self) {
        for s in self.servers.iter() {
            s.cmd(&["CONFIG", "RESETSTAT"]);
        }
    }

    pub(crate) fn lock_calls(&self) -> Vec<u64> {
        self.servers.iter().map(lock_calls).collect()
    }
}

/// A small seeded generator (splitmix64), so that a failing run can be replayed from its seed.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The seed from `REDLEASE_SEED`, else one from the clock.
pub(crate) fn seed() -> u64 {
    match std::env::var("REDLEASE_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("REDLEASE_SEED={s:?} is not a u64")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

/// A fred client (not yet connected) for `url`, with the tests' timeouts and reconnection policy.
pub(crate) fn fred_client(url: &str) -> redlease_adapters::fred::fred::clients::Client {
    fred_builder(url).build().expect("fred client")
}
