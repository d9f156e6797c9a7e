//! The server's identity ([`run_id`], from `INFO server`) and replica acknowledgement
//! ([`wait_replicas`]: `WAIT` / `WAITAOF`).

use redlease::{NodeError, NodeErrorKind, ReplicaWait, RunId};

use crate::scripts::{Reply, Script};

use super::probe::{ProbeState, denied};
use super::{Transport, note};

/// Names `INFO server` in messages.
pub(super) const INFO: Script = Script {
    name: "INFO server (run_id)",
    source: "",
    sha1: "",
};

/// Names `WAIT`/`WAITAOF` in messages.
pub(super) const WAIT: Script = Script {
    name: "WAIT for replicas",
    source: "",
    sha1: "",
};

fn not_on_a_cluster(what: &str) -> NodeError {
    NodeError::not_applied(
        NodeErrorKind::Unsupported,
        format!(
            "{what} is not supported on a Redis Cluster node (one node per shard would be needed)"
        ),
    )
}

/// The server's run id, from `INFO server` on the connection that carries `key`'s commands. A user who may
/// not run `INFO` gets [`NodeErrorKind::Unsupported`] (the core then cannot detect restarts of this node,
/// and counts it as before).
///
/// The core asks after an acquisition's reply, and counts that reply only if this answer is the run id of
/// the server that gave it. So this never answers from memory unless the transport names the connection
/// ([`Transport::connection_id`]) and the remembered id was read on that very connection: the `INFO` went
/// out and came back while it was the open one. A connection the client replaced unnoticed (a background
/// reconnection after a restart) would otherwise be answered for with the old server's id, and the restart
/// missed. Where the transport cannot name its connection (a reconnecting client), every call asks.
///
/// A run id that differs from the one seen before is a restart (or a failover) that this node saw: the
/// report carries how long ago it happened ([`RunId::with_restarted_ago`], from the new server's
/// `uptime_in_seconds`, rounded down so that the quarantine is never shorter), so that a manager that
/// never recorded the old id still quarantines the node, and one that meets the new id late counts from
/// the restart rather than from when it looked.
pub(crate) async fn run_id(t: &impl Transport, key: &str) -> Result<RunId, NodeError> {
    if t.clustered() {
        return Err(not_on_a_cluster("run_id"));
    }
    t.notice_reconnections();
    let before = t.connection_id(key);
    if let Some(id) = remembered(t, before) {
        return Ok(id);
    }
    let reply = match note(t, t.command(&INFO, key, &["INFO", "server"]).await) {
        Ok(reply) => reply,
        Err(e) if denied(&e) || e.kind() == NodeErrorKind::Auth => {
            return Err(NodeError::not_applied(
                NodeErrorKind::Unsupported,
                format!("INFO is not permitted, so restarts cannot be detected: {e}"),
            )
            .with_source(e));
        }
        Err(e) => return Err(e),
    };
    let after = t.connection_id(key);
    learned(t, reply, before, after)
}

/// What [`run_id`] answers from memory for the connection `conn` ([`Transport::connection_id`] before the
/// call): the run id read on that very connection, if any. `None`: [`run_id`] would ask the server.
pub(super) fn remembered(t: &impl Transport, conn: Option<u64>) -> Option<RunId> {
    let state = t.probe().lock();
    match (conn, &state.run_id) {
        (Some(conn), Some((on, id))) if conn == *on => Some(reported(&state, id.clone())),
        _ => None,
    }
}

/// The run id in `reply`, an `INFO server` answer that went out while the transport named connection
/// `before` and came back while it named `after` (see [`Transport::connection_id`]), with what [`run_id`]
/// does with it: a restart seen (a run id other than the one seen before, or a server younger than the
/// node's first answer) forgets what was learned about the old server and is dated by the new one's uptime;
/// the id is remembered for a connection that carried the `INFO` from start to end. Shared by [`run_id`]
/// and the acquisition that pipelines its `INFO` behind its `SET` (so both update the same state alike).
pub(super) fn learned(
    t: &impl Transport,
    reply: Reply,
    before: Option<u64>,
    after: Option<u64>,
) -> Result<RunId, NodeError> {
    let Reply::Bytes(text) = reply else {
        return Err(NodeError::not_applied(
            NodeErrorKind::Protocol,
            "INFO server did not answer with text",
        ));
    };
    let [id, uptime] = info_fields(&text, ["run_id", "uptime_in_seconds"]);
    let id = id.ok_or_else(|| {
        NodeError::not_applied(NodeErrorKind::Protocol, "INFO server has no run_id line")
    })?;
    let id = RunId::new(id);
    let uptime = uptime
        .and_then(|s| s.parse::<u64>().ok())
        .map(std::time::Duration::from_secs);
    let now = std::time::Instant::now();
    let mut state = t.probe().lock();
    let restarted = match (&state.seen_run_id, state.first_contact, uptime) {
        // Another server process than the one seen before.
        (Some(seen), _, _) => *seen != id,
        // No run id read before, but a server answered this node earlier than this one started: it restarted
        // out of sight. The uptime is a difference of whole wall-clock seconds: the process may have run up
        // to a second longer than it says, or a second less, hence [`UPTIME_MARGIN`] (so a restart less than
        // about 2.5 s after the node's first answer, before any run id was read, is not told apart from a
        // server that started just before that answer).
        (None, Some(first), Some(uptime)) => {
            uptime + UPTIME_MARGIN < now.saturating_duration_since(first)
        }
        (None, _, _) => false,
    };
    if restarted {
        // What was learned may be about the old server (a connection replaced without a failed call in
        // between), so the next call checks again.
        state.caps = None;
        state.no_waitaof = false;
        state.writable_fences.clear();
        // Started at most `uptime` less a second ago (see above: rounded to whole seconds), so that the
        // quarantine is never shorter than from the restart; without an uptime, seen now.
        let ago = uptime.map_or(std::time::Duration::ZERO, |u| {
            u.saturating_sub(std::time::Duration::from_secs(1))
        });
        state.restarted_at = Some(now.checked_sub(ago).unwrap_or(now));
    }
    state.seen_run_id = Some(id.clone());
    // Remembered only for a connection that carried the `INFO` from start to end.
    state.run_id = match (before, after) {
        (Some(b), Some(a)) if a == b => Some((a, id.clone())),
        _ => None,
    };
    Ok(reported(&state, id))
}

/// The value of `name` in an `INFO` reply (`name:value` lines), if present, UTF-8 and not empty.
pub(crate) fn info_field<'a>(text: &'a [u8], name: &str) -> Option<&'a str> {
    let [value] = info_fields(text, [name]);
    value
}

/// The values of `names` in an `INFO` reply, as [`info_field`] finds each (the first `name:` line decides),
/// in one pass over the bytes that ends once every name has its line. A fred or reconnecting node reads
/// `run_id` and `uptime_in_seconds` after every won Redlock attempt: decoding the whole reply as text and
/// scanning it once per name cost more than the rest of the acquisition (`callgrind`: ~40 k instructions a
/// node).
pub(crate) fn info_fields<'a, const N: usize>(
    text: &'a [u8],
    names: [&str; N],
) -> [Option<&'a str>; N] {
    let mut values = [None; N];
    let mut decided = [false; N];
    let mut left = N;
    for line in text.split(|&b| b == b'\n') {
        if left == 0 {
            break;
        }
        for ((value, done), name) in values.iter_mut().zip(decided.iter_mut()).zip(names) {
            if *done {
                continue;
            }
            let Some(rest) = line
                .strip_prefix(name.as_bytes())
                .and_then(|rest| rest.strip_prefix(b":"))
            else {
                continue;
            };
            *done = true;
            left -= 1;
            *value = std::str::from_utf8(rest)
                .ok()
                .map(str::trim)
                .filter(|v| !v.is_empty());
        }
    }
    values
}

/// How much longer than its `uptime_in_seconds` a server may have run (see [`run_id`]): a second for the
/// rounding, and half a second for the server's cached clock.
const UPTIME_MARGIN: std::time::Duration = std::time::Duration::from_millis(1500);

/// `id` as reported: with how long ago this node saw it replace another run id, if it did.
pub(super) fn reported(state: &ProbeState, id: RunId) -> RunId {
    match state.restarted_at {
        Some(at) if state.seen_run_id.as_ref() == Some(&id) => id.with_restarted_ago(at.elapsed()),
        _ => id,
    }
}

/// `WAIT replicas timeout`, or `WAITAOF 0 replicas timeout`, on the connection that carries `key`'s
/// commands. A server without `WAITAOF` (Redis before 7.2) answers "unknown command": reported as
/// [`NodeErrorKind::Unsupported`] and remembered for the connection.
pub(crate) async fn wait_replicas(
    t: &impl Transport,
    key: &str,
    wait: ReplicaWait,
) -> Result<u32, NodeError> {
    if t.clustered() {
        return Err(not_on_a_cluster("wait_replicas"));
    }
    // `WAIT` counts its own connection's writes: on a connection that replaced the one that carried the
    // write (a reconnect in between), it would count none of it (and answer at once where a connection that
    // wrote nothing waits for nothing).
    t.notice_reconnections();
    if t.probe().written_before_a_reconnect(key) {
        return Err(NodeError::not_applied(
            NodeErrorKind::Connection,
            "WAIT for replicas: the connection that carried the write was replaced since (a reconnect), and \
             WAIT on this one would not count that write (not sent)",
        ));
    }
    let unsupported = || {
        NodeError::not_applied(
            NodeErrorKind::Unsupported,
            "the server has no WAITAOF (Redis 7.2+ and Valkey have it): it cannot wait for the replicas' \
             append-only files",
        )
    };
    if wait.aof && t.probe().lock().no_waitaof {
        return Err(unsupported());
    }
    let replicas = wait.replicas.to_string();
    // At least 1 ms: `WAIT n 0` blocks forever.
    let millis = wait
        .timeout
        .as_millis()
        .clamp(1, u128::from(u32::MAX))
        .to_string();
    let args: Vec<&str> = if wait.aof {
        vec!["WAITAOF", "0", &replicas, &millis]
    } else {
        vec!["WAIT", &replicas, &millis]
    };
    let reply = match note(t, t.wait_command(&WAIT, key, &args).await) {
        Ok(reply) => reply,
        Err(e) if wait.aof && unknown_command(&e) => {
            t.probe().lock().no_waitaof = true;
            return Err(unsupported().with_source(e));
        }
        Err(e) => return Err(e),
    };
    let count = match (&reply, wait.aof) {
        (Reply::Int(n), false) => Some(*n),
        // WAITAOF answers [local fsyncs, replica fsyncs].
        (Reply::Array(items), true) => match items.get(1) {
            Some(Reply::Int(n)) => Some(*n),
            _ => None,
        },
        _ => None,
    };
    count.and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
        NodeError::not_applied(
            NodeErrorKind::Protocol,
            format!("{}: unexpected reply", args[0]),
        )
    })
}

pub(super) fn unknown_command(e: &NodeError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("unknown command") || text.contains("unknown subcommand")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{block_on, native};

    fn info(run_id: &str) -> Result<Reply, NodeError> {
        Ok(Reply::Bytes(
            format!("# Server\r\nredis_version:7.0.15\r\nrun_id:{run_id}\r\n").into_bytes(),
        ))
    }

    /// `INFO` fields are read from the reply's bytes: the first `name:` line decides (empty or not UTF-8: no
    /// value), a longer name sharing the prefix is another field, CRLF and LF lines alike, and the fields are
    /// given back in the order asked whatever their order in the reply.
    #[test]
    fn info_fields_are_read_by_exact_name_from_the_first_line_that_has_it() {
        let text = b"# Server\r\nrun_id_extra:no\r\nuptime_in_seconds:42\nrun_id:abcd \r\nrun_id:later\r\nempty:\r\nbad:\xff\xfe\r\n";
        assert_eq!(
            info_fields(text, ["run_id", "uptime_in_seconds"]),
            [Some("abcd"), Some("42")]
        );
        assert_eq!(info_field(text, "empty"), None);
        assert_eq!(info_field(text, "bad"), None);
        assert_eq!(info_field(text, "missing"), None);
        assert_eq!(info_field(b"run_id:x", "run_id"), Some("x"), "no line end");
        assert_eq!(
            info_fields(b"empty:\r\nempty:late\r\n", ["empty"]),
            [None],
            "the first line decides"
        );
    }

    /// Capabilities checked on one server process and a `run_id` that then comes from another (the
    /// connection was replaced between the two, unnoticed): the capabilities are checked again.
    #[test]
    fn a_new_run_id_forgets_the_capabilities_learned_before_it() {
        let t = native();
        *t.conn.lock().unwrap() = Some(1);
        t.replies.lock().unwrap().push_back(info("aaaa"));
        assert_eq!(block_on(run_id(&t, "k")).unwrap().as_str(), "aaaa");
        assert!(t.probe.get().is_some(), "the same server: kept");
        // A reconnect forgets everything; the next acquisition checks (on server A) …
        t.probe.forget();
        t.probe.set(native().probe.get().unwrap());
        // … and the run_id asked after it comes from server B.
        t.replies.lock().unwrap().push_back(info("bbbb"));
        assert_eq!(block_on(run_id(&t, "k")).unwrap().as_str(), "bbbb");
        assert!(
            t.probe.get().is_none(),
            "checked again before the next call"
        );
        // Answered from memory afterwards (the same connection), with how long ago the restart was seen.
        let id = block_on(run_id(&t, "k")).unwrap();
        assert_eq!(id.as_str(), "bbbb");
        assert!(id.restarted_ago().is_some());
        assert_eq!(*t.sent.lock().unwrap(), ["INFO", "INFO"]);
    }

    /// The run id is remembered for the connection it was read on, and only where the transport names
    /// its connection: another connection (or one the client may have replaced unnoticed) is asked again,
    /// so a restart behind a replaced connection is never answered for with the old server's id.
    #[test]
    fn a_run_id_is_answered_from_memory_only_for_the_connection_it_was_read_on() {
        let t = native();
        *t.conn.lock().unwrap() = Some(1);
        t.replies.lock().unwrap().push_back(info("aaaa"));
        assert_eq!(block_on(run_id(&t, "k")).unwrap().as_str(), "aaaa");
        assert_eq!(block_on(run_id(&t, "k")).unwrap().as_str(), "aaaa");
        assert_eq!(t.sent.lock().unwrap().len(), 1, "answered from memory");
        // Another connection, opened without any failure the node saw: asked again.
        *t.conn.lock().unwrap() = Some(2);
        t.replies.lock().unwrap().push_back(info("bbbb"));
        let id = block_on(run_id(&t, "k")).unwrap();
        assert_eq!(id.as_str(), "bbbb");
        assert_eq!(t.sent.lock().unwrap().len(), 2);
        // A connection the transport cannot name: asked every time.
        *t.conn.lock().unwrap() = None;
        t.replies.lock().unwrap().push_back(info("bbbb"));
        t.replies.lock().unwrap().push_back(info("cccc"));
        assert_eq!(block_on(run_id(&t, "k")).unwrap().as_str(), "bbbb");
        assert_eq!(block_on(run_id(&t, "k")).unwrap().as_str(), "cccc");
        assert_eq!(t.sent.lock().unwrap().len(), 4);
    }

    /// A restart the node saw late is dated by the new server's uptime: the report says it happened
    /// (at least) that long ago, rounded down.
    #[test]
    fn a_changed_run_id_reports_the_restart_as_long_ago_as_the_servers_uptime() {
        let t = native();
        t.replies.lock().unwrap().push_back(info("aaaa"));
        let first = block_on(run_id(&t, "k")).unwrap();
        assert_eq!(first.restarted_ago(), None, "no restart seen yet");
        t.replies.lock().unwrap().push_back(Ok(Reply::Bytes(
            b"# Server\r\nrun_id:bbbb\r\nuptime_in_seconds:7\r\n".to_vec(),
        )));
        let ago = block_on(run_id(&t, "k")).unwrap().restarted_ago().unwrap();
        // At most the uptime less a second (the uptime is whole wall-clock seconds).
        assert!(ago >= std::time::Duration::from_secs(6), "{ago:?}");
        assert!(ago < std::time::Duration::from_secs(7), "{ago:?}");
    }
}
