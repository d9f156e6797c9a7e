//! A Redis Sentinel deployment on loopback for live failover tests: a primary, one replica and three
//! Sentinels (`<server> sentinel.conf --sentinel`), each a [`RedisServer`] of its own — free ports, checked
//! by process id before use, killed with the test process however it ends (see [`crate::server`]).
//!
//! The Sentinels watch the primary with a quorum of 2, [`SentinelSet::DOWN_AFTER`] and
//! [`SentinelSet::FAILOVER_TIMEOUT`], so that after [`SentinelSet::kill_primary`] the replica is promoted
//! within a few seconds. The replica replicates through a [`FaultProxy`]
//! ([`replication_link`](SentinelSet::replication_link)), so a test decides which writes reach it:
//! [`ProxyMode::DropReplies`](crate::proxy::ProxyMode::DropReplies) throws the replication stream away
//! while the replica's acknowledgements still reach the primary (whose `WAIT` then counts 0), without the
//! replica or the Sentinels seeing anything wrong.
//!
//! ```no_run
//! use std::time::Duration;
//! use redlease_testkit::sentinel::SentinelSet;
//! use redlease_testkit::server::Flavor;
//!
//! let Some(mut set) = SentinelSet::start_or_skip("failover", Flavor::Redis) else { return };
//! set.primary().cmd(&["SET", "k", "v"]);
//! set.wait_replicated(Duration::from_secs(5)).unwrap();
//! set.kill_primary();
//! set.wait_for_failover(Duration::from_secs(30)).unwrap();
//! assert_eq!(set.replica().cmd(&["GET", "k"]), "v");
//! ```

// Test helpers must fail loudly (see `server`).
#![allow(clippy::panic, clippy::expect_used)]

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use crate::proxy::FaultProxy;
use crate::server::{Flavor, RedisServer};

/// A primary, its replica (behind a [`FaultProxy`]) and three Sentinels monitoring them; every process is
/// killed on drop.
pub struct SentinelSet {
    primary: RedisServer,
    replica: RedisServer,
    link: FaultProxy,
    sentinels: Vec<RedisServer>,
}

impl std::fmt::Debug for SentinelSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelSet")
            .field("primary", &self.primary)
            .field("replica", &self.replica)
            .field("sentinels", &self.sentinels)
            .finish_non_exhaustive()
    }
}

impl SentinelSet {
    /// The name the Sentinels monitor the primary under (`SENTINEL get-master-addr-by-name`).
    pub const MASTER_NAME: &'static str = "redlease";
    /// How many Sentinels run.
    pub const SENTINELS: usize = 3;
    /// How many Sentinels must agree that the primary is down.
    pub const QUORUM: usize = 2;
    /// `down-after-milliseconds`: how long the primary must not answer before a Sentinel calls it down. Long
    /// enough that a loaded machine does not fail over by mistake.
    pub const DOWN_AFTER: Duration = Duration::from_millis(1000);
    /// `failover-timeout`: also how soon a Sentinel retries a failover whose election failed (twice this).
    pub const FAILOVER_TIMEOUT: Duration = Duration::from_millis(2000);

    /// Starts the primary (`flavor`), the replica (through the proxy) and, once the replica is online, the
    /// three Sentinels; returns when every Sentinel knows the replica and the two other Sentinels. Panics
    /// when that does not happen within 20 s. Sentinels of [`Flavor::Valkey91NoLua`] run as
    /// [`Flavor::Valkey91`] (a Sentinel has no scripting to unload).
    pub fn start(flavor: Flavor) -> SentinelSet {
        let primary = RedisServer::start_flavor(flavor, &[]);
        // The primary would otherwise wait 5 s for more replicas before a diskless full sync.
        primary.cmd(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
        let upstream: SocketAddr = primary.addr().parse().expect("primary address");
        let link = FaultProxy::start(upstream)
            .unwrap_or_else(|e| panic!("start the replication proxy: {e}"));
        let link_port = link.addr().port().to_string();
        let replica = RedisServer::start_flavor(flavor, &["--replicaof", "127.0.0.1", &link_port]);
        primary
            .wait_for_replicas(1, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e}\nreplica log:\n{}", replica.log_tail()));
        let sentinel_flavor = match flavor {
            Flavor::Valkey91NoLua => Flavor::Valkey91,
            other => other,
        };
        let conf = format!(
            "sentinel monitor {name} 127.0.0.1 {port} {quorum}\n\
             sentinel down-after-milliseconds {name} {down}\n\
             sentinel failover-timeout {name} {failover}\n\
             sentinel parallel-syncs {name} 1\n",
            name = Self::MASTER_NAME,
            port = primary.port(),
            quorum = Self::QUORUM,
            down = Self::DOWN_AFTER.as_millis(),
            failover = Self::FAILOVER_TIMEOUT.as_millis(),
        );
        let sentinels = thread::scope(|s| {
            let handles: Vec<_> = (0..Self::SENTINELS)
                .map(|_| s.spawn(|| RedisServer::start_sentinel_process(sentinel_flavor, &conf)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| panic!("a sentinel failed to start"))
                })
                .collect()
        });
        let set = SentinelSet {
            primary,
            replica,
            link,
            sentinels,
        };
        set.wait_ready(Duration::from_secs(20));
        set
    }

    /// [`start`](Self::start), or `None` after printing a skip line when the server binary is missing (a
    /// failure instead under `REDLEASE_REQUIRE_REDIS=1`).
    pub fn start_or_skip(test: &str, flavor: Flavor) -> Option<SentinelSet> {
        flavor.available(test).then(|| Self::start(flavor))
    }

    /// What `SENTINEL MASTER <name>` says on `sentinel`, as field/value pairs.
    fn master_state(sentinel: &RedisServer) -> Vec<(String, String)> {
        let reply = sentinel
            .try_cmd(&["SENTINEL", "MASTER", Self::MASTER_NAME])
            .unwrap_or_default();
        let lines: Vec<&str> = reply.lines().collect();
        lines
            .chunks(2)
            .filter_map(|kv| match kv {
                [k, v] => Some(((*k).to_owned(), (*v).to_owned())),
                _ => None,
            })
            .collect()
    }

    fn field(state: &[(String, String)], name: &str) -> Option<String> {
        state
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    fn wait_ready(&self, timeout: Duration) {
        let until = Instant::now() + timeout;
        loop {
            let states: Vec<_> = self.sentinels.iter().map(Self::master_state).collect();
            let ready = states.iter().all(|st| {
                let num = |f: &str| {
                    Self::field(st, f)
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0)
                };
                num("num-slaves") >= 1 && num("num-other-sentinels") >= Self::SENTINELS - 1
            });
            if ready {
                return;
            }
            assert!(
                Instant::now() < until,
                "the sentinels did not discover the replica and each other within {timeout:?}: {states:?}\n\
                 first sentinel's log:\n{}",
                self.sentinels[0].log_tail()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The primary the Sentinels were started with (killed by [`kill_primary`](Self::kill_primary)).
    pub fn primary(&self) -> &RedisServer {
        &self.primary
    }

    /// The replica: the primary once [`wait_for_failover`](Self::wait_for_failover) returned.
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// The proxy the replica replicates through (replica → proxy → primary): its replies are the
    /// replication stream, its requests the replica's acknowledgements.
    pub fn replication_link(&self) -> &FaultProxy {
        &self.link
    }

    /// The Sentinels.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The Sentinels' addresses, `("127.0.0.1", port)`.
    pub fn sentinel_addrs(&self) -> Vec<(String, u16)> {
        self.sentinels
            .iter()
            .map(|s| ("127.0.0.1".to_owned(), s.port()))
            .collect()
    }

    /// The Sentinels' URLs, `redis://127.0.0.1:<port>`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port()))
            .collect()
    }

    /// The port every running Sentinel names as the primary now, if they agree.
    pub fn reported_primary(&self) -> Option<u16> {
        let mut ports = self.sentinels.iter().map(|s| {
            s.try_cmd(&["SENTINEL", "get-master-addr-by-name", Self::MASTER_NAME])
                .ok()
                .and_then(|r| r.lines().nth(1).and_then(|p| p.parse::<u16>().ok()))
        });
        let first = ports.next()??;
        ports.all(|p| p == Some(first)).then_some(first)
    }

    /// Waits until the primary has acknowledged replication of everything written so far (`WAIT 1`).
    ///
    /// # Errors
    /// When the replica did not acknowledge within `timeout`.
    pub fn wait_replicated(&self, timeout: Duration) -> Result<(), String> {
        let millis = timeout.as_millis().max(1).to_string();
        match self.primary.try_cmd(&["WAIT", "1", &millis])?.as_str() {
            "1" => Ok(()),
            n => Err(format!("WAIT 1 {millis}: {n} replicas acknowledged")),
        }
    }

    /// Kills the primary (SIGKILL): the Sentinels promote the replica after [`DOWN_AFTER`](Self::DOWN_AFTER)
    /// and an election.
    pub fn kill_primary(&mut self) {
        self.primary.kill();
    }

    /// Waits until every Sentinel names the replica as the primary and the replica says it is one (`ROLE`);
    /// returns how long that took. (A Sentinel whose timer ran more than 2 s late — a starved machine — stays
    /// in TILT mode for 30 s and does not fail over meanwhile: give `timeout` room for that.)
    ///
    /// # Errors
    /// What the Sentinels and the replica said last, after `timeout`.
    pub fn wait_for_failover(&self, timeout: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        loop {
            let reported = self.reported_primary();
            let role = self.replica.try_cmd(&["ROLE"]).unwrap_or_default();
            if reported == Some(self.replica.port()) && role.starts_with("master") {
                return Ok(started.elapsed());
            }
            if started.elapsed() >= timeout {
                let logs: Vec<String> = self
                    .sentinels
                    .iter()
                    .map(|s| format!("sentinel on port {}:\n{}", s.port(), s.log_tail()))
                    .collect();
                return Err(format!(
                    "no failover within {timeout:?}: the sentinels report {reported:?} (replica {}), its ROLE \
                     {role:?}\n{}",
                    self.replica.port(),
                    logs.join("\n")
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::proxy::ProxyMode;

    /// The set fails over, and the replication link decides what the promoted replica has.
    #[test]
    fn a_killed_primary_is_replaced_by_the_replica_with_what_reached_it() {
        let test = "a_killed_primary_is_replaced_by_the_replica_with_what_reached_it";
        let Some(mut set) = SentinelSet::start_or_skip(test, Flavor::Redis) else {
            return;
        };
        assert_eq!(set.reported_primary(), Some(set.primary().port()));
        set.primary().cmd(&["SET", "replicated", "1"]);
        set.wait_replicated(Duration::from_secs(5)).unwrap();
        set.replication_link().set_mode(ProxyMode::DropReplies);
        set.primary().cmd(&["SET", "lost", "1"]);
        assert!(set.wait_replicated(Duration::from_millis(300)).is_err());
        set.kill_primary();
        let took = set.wait_for_failover(Duration::from_secs(30)).unwrap();
        assert!(took >= SentinelSet::DOWN_AFTER, "{took:?}");
        assert_eq!(set.replica().cmd(&["GET", "replicated"]), "1");
        assert_eq!(set.replica().cmd(&["GET", "lost"]), "");
        assert_eq!(set.replica().cmd(&["SET", "after", "1"]), "OK");
    }
}
