//! What a server saw: connections accepted and commands sent, from one `INFO stats commandstats` (one admin
//! connection per snapshot), so that "no retry loop" is asserted by counting, not by timing.
#![allow(dead_code)]

use std::collections::BTreeMap;

use redlease_testkit::server::RedisServer;

/// The commands a lock operation sends at top level, on any server of the matrix.
const LOCK_COMMANDS: [&str; 5] = ["eval", "evalsha", "set", "delifeq", "exec"];

/// One snapshot of a server's counters.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stats {
    /// `total_connections_received` (includes the snapshot's own connection).
    pub(crate) connections: u64,
    /// Per command: `calls + rejected_calls` (every time a client sent it, executed or refused before
    /// execution, e.g. by the ACL). Commands run inside scripts count under their own names too.
    commands: BTreeMap<String, u64>,
}

impl Stats {
    /// Reads the counters of `server` over one admin connection.
    pub(crate) fn of(server: &RedisServer) -> Stats {
        Self::parse(&server.cmd(&["INFO", "stats", "commandstats"]))
    }

    /// Reads the counters with `INFO` text obtained some other way.
    pub(crate) fn parse(info: &str) -> Stats {
        let mut stats = Stats::default();
        for line in info.lines() {
            if let Some(v) = line.strip_prefix("total_connections_received:") {
                stats.connections = v.trim().parse().expect("total_connections_received");
            }
            if let Some(rest) = line.strip_prefix("cmdstat_") {
                let Some((name, fields)) = rest.split_once(':') else {
                    continue;
                };
                let field = |key: &str| -> u64 {
                    fields
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                        .map_or(0, |v| v.trim().parse().expect("commandstats field"))
                };
                stats
                    .commands
                    .insert(name.to_owned(), field("calls") + field("rejected_calls"));
            }
        }
        stats
    }

    /// How often `command` (lowercase, e.g. `"evalsha"`) was sent.
    pub(crate) fn sent(&self, command: &str) -> u64 {
        self.commands.get(command).copied().unwrap_or(0)
    }

    /// Top-level lock commands sent: `EVAL`, `EVALSHA`, `SET` (the fresh acquisition, and on Valkey
    /// `SET … IFEQ`), `DELIFEQ` and `EXEC` (a Lua-less transaction). (A `SET` inside a script counts too;
    /// redlease's acquire scripts only run when the fresh path was not used.)
    pub(crate) fn lock_commands(&self) -> u64 {
        LOCK_COMMANDS.iter().map(|c| self.sent(c)).sum()
    }

    /// The change from `before` to `self`: connections accepted by others than the two snapshots, and
    /// commands sent.
    pub(crate) fn since(&self, before: &Stats) -> Delta {
        let mut commands = BTreeMap::new();
        for (name, n) in &self.commands {
            let d = n - before.commands.get(name).copied().unwrap_or(0);
            if d > 0 {
                commands.insert(name.clone(), d);
            }
        }
        Delta {
            // This snapshot's own connection is counted in `self.connections`.
            connections: self.connections.saturating_sub(before.connections + 1),
            commands,
        }
    }
}

/// The difference between two [`Stats`] snapshots.
#[derive(Debug, Clone, Default)]
pub(crate) struct Delta {
    /// Connections accepted in between, not counting the later snapshot's own.
    pub(crate) connections: u64,
    commands: BTreeMap<String, u64>,
}

impl Delta {
    /// How often `command` was sent in between.
    pub(crate) fn sent(&self, command: &str) -> u64 {
        self.commands.get(command).copied().unwrap_or(0)
    }

    /// The [lock commands](Stats::lock_commands) sent in between.
    pub(crate) fn lock_commands(&self) -> u64 {
        LOCK_COMMANDS.iter().map(|c| self.sent(c)).sum()
    }
}
