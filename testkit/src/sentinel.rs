//! A Redis Sentinel deployment on loopback for live failover tests: a primary, one replica and three
//! Sentinels (`<server> sentinel.conf --sentinel`), each a [`RedisServer`] of its own — free ports, checked
//! by process id before use, killed with the test process however it ends (see [`crate::server`]).
//!
//! The Sentinels watch the primary with a quorum of 2 and [`SentinelSet::DOWN_AFTER`], so that after
//! [`SentinelSet::kill_primary`] the replica is promoted within a few seconds (a short
//! [`TILT_PERIOD`](SentinelSet::TILT_PERIOD) for a starved machine, and a forced failover after
//! [`FORCE_AFTER`](SentinelSet::FORCE_AFTER) if none started). Redis 7.0 or Valkey (whose `valkey-server`
//! runs as a Sentinel with `--sentinel` too). The replica replicates through a [`FaultProxy`]
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
    /// When [`kill_primary`](Self::kill_primary) killed the primary.
    killed_at: Option<Instant>,
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
    /// `failover-timeout`. Long, because it is also how long a Sentinel waits before it "fixes" a replica
    /// that replicates from another address than the primary's (the replica here replicates through the
    /// [`replication_link`](Self::replication_link)): after that the replica would bypass the proxy, and a
    /// test that drops its replication stream would drop nothing. The price: a failed election is retried
    /// only after twice this, so [`wait_for_failover`](Self::wait_for_failover) forces one instead.
    pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
    /// How long a Sentinel stays in TILT mode (`SENTINEL DEBUG tilt-period`; the default is 30 s). A Sentinel
    /// whose timer ran more than 2 s late (a starved machine) enters TILT and neither calls the primary down
    /// nor fails over meanwhile; it still pings, so after a short TILT its view of the servers is fresh.
    pub const TILT_PERIOD: Duration = Duration::from_millis(1000);
    /// When [`wait_for_failover`](Self::wait_for_failover) forces a failover (`SENTINEL FAILOVER`) if none is
    /// in progress: [`DOWN_AFTER`](Self::DOWN_AFTER) after the kill the primary is called down, and an
    /// election normally ends within a second; five more seconds of margin. (A failover in progress is left
    /// alone: a stuck election ends after 10 s, and then one is forced.)
    pub const FORCE_AFTER: Duration = Duration::from_secs(6);

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
        let sentinels: Vec<RedisServer> = thread::scope(|s| {
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
        for sentinel in &sentinels {
            // Redis 7.0+ and Valkey have `SENTINEL DEBUG`; without it the default 30 s TILT applies. `INFO`
            // every second (the default is 10 s until the primary is agreed down) keeps the replica's state
            // fresh enough for a forced failover (see `wait_for_failover`), which refuses a replica whose last
            // `INFO` is older than 5 s.
            let _ = sentinel.try_cmd(&[
                "SENTINEL",
                "DEBUG",
                "tilt-period",
                &Self::TILT_PERIOD.as_millis().to_string(),
                "info-period",
                "1000",
            ]);
        }
        let set = SentinelSet {
            primary,
            replica,
            link,
            sentinels,
            killed_at: None,
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

    /// Waits until the replica has applied everything written to the primary so far: its replication offset
    /// (`slave_repl_offset`) reaches the primary's (`master_repl_offset`, read first).
    ///
    /// Not `WAIT 1` from a connection of its own: `WAIT` counts its own connection's writes, and where a
    /// connection that wrote nothing waits for nothing (Valkey; Redis 7.2+) it would answer 1 at once.
    ///
    /// # Errors
    /// When the replica had not caught up within `timeout` (both offsets in the message).
    pub fn wait_replicated(&self, timeout: Duration) -> Result<(), String> {
        fn offset(server: &RedisServer, field: &str) -> Result<u64, String> {
            let info = server.try_cmd(&["INFO", "replication"])?;
            info.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| format!("no {field} in INFO replication on port {}", server.port()))
        }
        let target = offset(&self.primary, "master_repl_offset")?;
        let until = Instant::now() + timeout;
        loop {
            let reached = offset(&self.replica, "slave_repl_offset")?;
            if reached >= target {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(format!(
                    "the replica reached offset {reached} of the primary's {target} within {timeout:?}"
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the primary (SIGKILL): the Sentinels promote the replica after [`DOWN_AFTER`](Self::DOWN_AFTER)
    /// and an election.
    pub fn kill_primary(&mut self) {
        self.primary.kill();
        self.killed_at = Some(Instant::now());
    }

    /// Whether any Sentinel is failing over now (`failover_in_progress` in its flags).
    fn failover_in_progress(&self) -> bool {
        self.sentinels.iter().any(|s| {
            Self::field(&Self::master_state(s), "flags")
                .is_some_and(|f| f.contains("failover_in_progress"))
        })
    }

    /// Each Sentinel's TILT state (`INFO sentinel`), for messages.
    fn tilt_states(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| {
                let info = s.try_cmd(&["INFO", "sentinel"]).unwrap_or_default();
                let tilt = info
                    .lines()
                    .filter(|l| l.starts_with("sentinel_tilt"))
                    .collect::<Vec<_>>()
                    .join(" ");
                format!("{}: {tilt}", s.port())
            })
            .collect()
    }

    /// Waits until every Sentinel names the replica as the primary and the replica says it is one (`ROLE`);
    /// returns how long that took.
    ///
    /// If no Sentinel has started a failover [`FORCE_AFTER`](Self::FORCE_AFTER) after
    /// [`kill_primary`](Self::kill_primary) (on a loaded machine elections can fail in a row, or a starved
    /// Sentinel sits in TILT for [`TILT_PERIOD`](Self::TILT_PERIOD)), it forces one with `SENTINEL FAILOVER`
    /// (no agreement needed; the others follow the new configuration) and says so on stderr. What the
    /// clients see is the same: the replica is promoted while the old primary is dead.
    ///
    /// # Errors
    /// What the Sentinels (their TILT state and logs) and the replica said last, after `timeout`.
    pub fn wait_for_failover(&self, timeout: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        let mut forced = false;
        loop {
            let reported = self.reported_primary();
            let role = self.replica.try_cmd(&["ROLE"]).unwrap_or_default();
            if reported == Some(self.replica.port()) && role.starts_with("master") {
                return Ok(started.elapsed());
            }
            let since_kill = self.killed_at.map(|at| at.elapsed());
            if !forced
                && since_kill.is_some_and(|d| d >= Self::FORCE_AFTER)
                && !role.starts_with("master")
                && !self.failover_in_progress()
            {
                forced = true;
                // One Sentinel fails over (the first that accepts); the others follow its new epoch.
                let mut answers = Vec::new();
                for sentinel in &self.sentinels {
                    match sentinel.try_cmd(&["SENTINEL", "FAILOVER", Self::MASTER_NAME]) {
                        Ok(ok) => {
                            answers.push(format!("{}: {ok}", sentinel.port()));
                            break;
                        }
                        Err(e) => answers.push(format!("{}: {e}", sentinel.port())),
                    }
                }
                eprintln!(
                    "sentinel: no failover {since_kill:?} after the kill; forced one ({answers:?}; TILT: {:?})",
                    self.tilt_states()
                );
            }
            if started.elapsed() >= timeout {
                let logs: Vec<String> = self
                    .sentinels
                    .iter()
                    .map(|s| format!("sentinel on port {}:\n{}", s.port(), s.log_tail()))
                    .collect();
                return Err(format!(
                    "no failover within {timeout:?}: the sentinels report {reported:?} (replica {}), its ROLE \
                     {role:?}, TILT {:?}\n{}",
                    self.replica.port(),
                    self.tilt_states(),
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

    /// The set fails over, and the replication link decides what the promoted replica has; its Sentinels
    /// leave TILT after [`SentinelSet::TILT_PERIOD`].
    fn a_killed_primary_is_replaced_by_the_replica_with_what_reached_it(flavor: Flavor) {
        let test =
            format!("a_killed_primary_is_replaced_by_the_replica_with_what_reached_it ({flavor})");
        let Some(mut set) = SentinelSet::start_or_skip(&test, flavor) else {
            return;
        };
        for sentinel in set.sentinels() {
            let debug = sentinel.cmd(&["SENTINEL", "DEBUG"]);
            let period = SentinelSet::TILT_PERIOD.as_millis().to_string();
            assert!(debug.contains(&format!("TILT-PERIOD\n{period}")), "{debug}");
        }
        assert_eq!(set.reported_primary(), Some(set.primary().port()));
        // The Sentinels leave the replica on the link (they "fix" a replica of another address after the
        // failover timeout; with a 2 s one and INFO every second it bypassed the proxy within 3 s).
        thread::sleep(Duration::from_secs(3));
        let link_port = format!("master_port:{}", set.replication_link().addr().port());
        let info = set.replica().cmd(&["INFO", "replication"]);
        assert!(info.lines().any(|l| l.trim() == link_port), "{info}");
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

    /// Sentinels that can never agree the primary is down (a quorum of 4 of 3): `wait_for_failover` forces
    /// the failover `FORCE_AFTER` the kill.
    #[test]
    fn a_failover_that_does_not_start_by_itself_is_forced() {
        let test = "a_failover_that_does_not_start_by_itself_is_forced";
        let Some(mut set) = SentinelSet::start_or_skip(test, Flavor::Redis) else {
            return;
        };
        for sentinel in set.sentinels() {
            sentinel.cmd(&["SENTINEL", "SET", SentinelSet::MASTER_NAME, "quorum", "4"]);
        }
        set.kill_primary();
        let took = set.wait_for_failover(Duration::from_secs(30)).unwrap();
        assert!(took >= SentinelSet::FORCE_AFTER, "{took:?}");
        assert_eq!(set.replica().cmd(&["SET", "after", "1"]), "OK");
    }

    #[test]
    fn a_killed_redis_7_0_primary_is_replaced_by_the_replica_with_what_reached_it() {
        a_killed_primary_is_replaced_by_the_replica_with_what_reached_it(Flavor::Redis);
    }

    #[test]
    fn a_killed_valkey_9_1_primary_is_replaced_by_the_replica_with_what_reached_it() {
        a_killed_primary_is_replaced_by_the_replica_with_what_reached_it(Flavor::Valkey91);
    }
}
