//! Acquisition, release, extension and inspection of one lock key: the scripts, and the native paths
//! (`SET … NX GET`, `DELIFEQ`, the watched `PEXPIRE … GT`).

use redlease::{
    Claim, ClaimRequest, KeyState, NodeError, NodeErrorKind, RunIdSlot, Token, Ttl, notify,
};

use crate::Commands;
use crate::scripts::{self, Reply, Script};

use super::ledger::recorded;
use super::probe::{check, checked, from_script, lua_absent, script_probe_failed, scripts_denied};
use super::replication;
use super::wait::acquire_with_ttl;
use super::{
    Transport, Verb, Way, eval, note, note_refused, path, probe_tx, refused_command,
    script_unavailable, tx, way,
};

/// The lock key holds another type: worded as the scripts word it.
pub(super) fn lock_wrong_type(what: &Script, _key: &str, e: NodeError) -> NodeError {
    NodeError::not_applied(
        NodeErrorKind::WrongType,
        format!(
            "the {} command was refused: WRONGTYPE the lock key holds a value of another type",
            what.name
        ),
    )
    .with_source(e)
}

/// `SET key token <cond> PX ttl` (`cond` is `NX` or `IFEQ token`): whether it was set.
pub(super) async fn set_if(
    t: &impl Transport,
    what: &Script,
    key: &str,
    token: &Token,
    cond: &[&str],
    ttl: &str,
) -> Result<bool, NodeError> {
    let mut args = vec!["SET", key, token.as_str()];
    args.extend_from_slice(cond);
    args.extend_from_slice(&["PX", ttl]);
    let reply = note_refused(t, note(t, t.command(what, key, &args).await))?;
    scripts::parse_set_ok(what, reply)
}

/// The own-token branch of a Lua-less acquisition: the watched extension ([`extend_watched`]), which
/// extends a key holding our token to at least `ttl` and never shortens it, as the acquire script does (`SET
/// … IFEQ … PX` would set exactly `ttl`: a late retry could shorten a key a longer extension set). A lock key
/// of another type is worded as the scripts word it.
pub(super) async fn own_token_extend(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: &str,
) -> Result<bool, NodeError> {
    match extend_watched(t, key, token, ttl).await {
        Err(e) if e.kind() == NodeErrorKind::WrongType => {
            Err(lock_wrong_type(&scripts::WATCHED_EXTEND, key, e))
        }
        other => other,
    }
}

/// A retried acquisition without Lua: `SET NX PX`, and if the key exists, the watched extension of our token
/// (which extends its TTL without ever shortening it, as the acquire script does).
pub(super) async fn acquire_native(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: &str,
) -> Result<bool, NodeError> {
    if set_if(t, &scripts::SET_NX_PLAIN, key, token, &["NX"], ttl).await? {
        return Ok(true);
    }
    own_token_extend(t, key, token, ttl).await
}

async fn acquire_script(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    let ttl = ttl.as_millis().to_string();
    let reply = eval(t, &scripts::ACQUIRE, &[key], &[token.as_str(), &ttl]).await?;
    scripts::parse_flag(&scripts::ACQUIRE, reply)
}

async fn acquire_unrecorded(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    let caps = checked(t, key, None).await?;
    if caps.native_acquire() {
        return acquire_native(t, key, token, &ttl.as_millis().to_string()).await;
    }
    acquire_script(t, key, token, ttl).await
}

/// A fresh acquisition: on an unchecked connection the check and the acquisition in one script (or, without
/// Lua, the native probe first); then `SET key token NX GET PX ttl` where the server accepts it, else the
/// fresh-acquire script (or `SET NX PX` without Lua).
///
/// With a `report` slot ([`ClaimRequest::run_id`]), the `SET … NX GET` carries `INFO server` pipelined
/// behind it ([`Transport::command_and_publish`]: one write, one round trip, on the same connection,
/// neither re-sent) where [`run_id`](replication::run_id) would have to ask the server (not on a cluster,
/// and not where it answers from memory for the connection the `SET` takes); the answer goes through the
/// same bookkeeping as `run_id`'s ([`replication::learned`]) into the slot. The `INFO` is answered after the
/// `SET` on its connection, so its run id is that of the server that applied the `SET` or of a later one on
/// that connection (what the slot may hold). An `INFO` that failed leaves the slot empty (the core asks
/// `run_id`). The other forms leave it empty.
async fn fresh_acquire_unrecorded(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    report: Option<&RunIdSlot>,
) -> Result<bool, NodeError> {
    let ttl = ttl.as_millis().to_string();
    // One check at a time: the calls made meanwhile wait for its answer (and then take the path it found).
    let turn = match t.probe().get() {
        Some(_) => None,
        None => t.probe().check_turn().await,
    };
    let caps = match t.probe().get() {
        Some(caps) => caps,
        None if t.probe().mode() == Commands::Native => Box::pin(check(t, key, None)).await?,
        None => {
            let mode = t.probe().mode();
            let script = &scripts::PROBE_ACQUIRE;
            match note(
                t,
                t.script_once(Verb::Eval, script, &[key], &[token.as_str(), &ttl])
                    .await,
            ) {
                Ok(reply) => {
                    let (acquired, found) = scripts::parse_probe_acquire(reply)?;
                    t.probe().set(from_script(found, mode));
                    return Ok(acquired);
                }
                Err(e) => {
                    let caps = Box::pin(script_probe_failed(t, key, mode, e)).await?;
                    t.probe().set(caps);
                    caps
                }
            }
        }
    };
    drop(turn);
    if !caps.set_nx_get {
        if !caps.lua || caps.commands == Commands::Native {
            return set_if(t, &scripts::SET_NX_PLAIN, key, token, &["NX"], &ttl).await;
        }
        // Never the acquire script: its own-token branch resets the TTL, which a late copy of a fresh
        // acquisition must not do (the core relies on it).
        let reply = eval(t, &scripts::ACQUIRE_FRESH, &[key], &[token.as_str(), &ttl]).await?;
        return scripts::parse_flag(&scripts::ACQUIRE_FRESH, reply);
    }
    let args = ["SET", key, token.as_str(), "NX", "GET", "PX", &ttl];
    // Where `run_id` would ask the server after this reply: the question rides along.
    let ask = report.filter(|_| !t.clustered()).and_then(|slot| {
        t.notice_reconnections();
        let before = t.connection_id(key);
        replication::remembered(t, before)
            .is_none()
            .then_some((slot, before))
    });
    let (reply, info) = match ask {
        None => (t.command(&scripts::SET_NX, key, &args).await, None),
        Some((slot, before)) => {
            match t
                .command_and_publish(&scripts::SET_NX, key, &args, &["INFO", "server"])
                .await
            {
                Ok((reply, info)) => (Ok(reply), info.map(|info| (slot, before, info))),
                Err(e) => (Err(e), None),
            }
        }
    };
    let reply = note_refused(t, note(t, reply));
    if let (Ok(_), Some((slot, before, info))) = (&reply, info) {
        // As `run_id` would have read it: the same parsing and restart bookkeeping (a reply that is not a
        // run id leaves the slot empty, and the core asks `run_id`).
        let after = t.connection_id(key);
        if let Ok(id) = replication::learned(t, info, before, after) {
            slot.fill(id);
        }
    }
    match reply {
        Ok(reply) => scripts::parse_set_nx_get(reply),
        // Word it as the acquire script does: the lock key is the problem.
        Err(e) if e.kind() == NodeErrorKind::WrongType => {
            Err(lock_wrong_type(&scripts::SET_NX, key, e))
        }
        Err(e) => Err(e),
    }
}

/// The notification channel of `key` and the command that publishes on it: `SPUBLISH` (a sharded channel in
/// the key's slot) on a cluster, `PUBLISH` otherwise.
pub(super) fn publish_args(t: &impl Transport, key: &str) -> (String, &'static str) {
    let command = if t.clustered() { "SPUBLISH" } else { "PUBLISH" };
    (notify::channel(key), command)
}

/// Native release: `DELIFEQ key token`, with `PUBLISH channel payload` pipelined behind it (one round trip,
/// two commands). Not a transaction: a transaction cannot make the publish conditional either. A plain
/// pipeline is written once; a refused `PUBLISH` (a channel ACL) does not affect the `DELIFEQ` before it. So a release
/// that deleted nothing publishes too (a waiter then spends one attempt), and if the connection drops between
/// the two, the notification is lost (waiters wait for the TTL bound). 1 deleted, 0 not (another value,
/// absent, or another type: never touched).
///
/// Where the key has a waiter marker ([`notify::waiting_key`]), `EXISTS marker` is pipelined behind the
/// `DELIFEQ` instead, and the `PUBLISH` follows (a second round trip) only when the release deleted the key
/// and the marker exists or could not be read: a release nobody waits for publishes nothing. The `EXISTS`
/// runs after the delete, so a waiter's marker written later belongs to an attempt that finds the lock free.
pub(super) async fn release_native(
    t: &impl Transport,
    key: &str,
    token: &Token,
) -> Result<bool, NodeError> {
    let (channel, command) = publish_args(t, key);
    let what = &scripts::DELIFEQ;
    let marker = notify::waiting_key(key);
    let publish = [command, channel.as_str(), notify::payload(token)];
    let second: &[&str] = match &marker {
        Some(marker) => &["EXISTS", marker],
        None => &publish,
    };
    let sent = t
        .command_and_publish(what, key, &["DELIFEQ", key, token.as_str()], second)
        .await;
    match note_refused(t, note(t, sent)) {
        Ok((reply, waiting)) => {
            let deleted = scripts::parse_flag(what, reply)?;
            if deleted && marker.is_some() && waiting != Some(Reply::Int(0)) {
                // Whatever happens to it (a channel ACL, a dropped connection), the release is done; a
                // lost notification leaves waiters their usual bound.
                let _ = note(t, t.command(what, key, &publish).await);
            }
            Ok(deleted)
        }
        Err(e) if e.kind() == NodeErrorKind::WrongType => Ok(false),
        Err(e) => Err(e),
    }
}

pub(crate) async fn release(
    t: &impl Transport,
    key: &str,
    token: &Token,
) -> Result<bool, NodeError> {
    let released = release_unforgotten(t, key, token).await;
    // What this node recorded of a native fenced acquisition of the lock is forgotten only once the release
    // ran: a refused or failed one (a clean-up refused by the ACL, say) may leave the lock holding our token,
    // and the acquisition's retry must then recognise it as ours (as the script path does).
    if released.is_ok() {
        t.probe().forget_fence(key, token);
    }
    released
}

async fn release_unforgotten(
    t: &impl Transport,
    key: &str,
    token: &Token,
) -> Result<bool, NodeError> {
    let way = way(t, key, |c| c.native_release()).await?;
    if way == Way::Native {
        match release_native(t, key, token).await {
            // The server lacks `DELIFEQ` after all (it changed behind the connection; the check is forgotten):
            // nothing was deleted, so the release goes again by the path a new check finds.
            Err(e) if refused_command(&e) => {
                if path(t, key).await?.is_some_and(|c| c.native_release()) {
                    return Err(e);
                }
            }
            other => return other,
        }
    }
    let (channel, command) = publish_args(t, key);
    let marker = notify::waiting_key(key);
    let args: &[&str] = match &marker {
        Some(marker) => &[token.as_str(), &channel, command, marker],
        None => &[token.as_str(), &channel, command],
    };
    let reply = eval(t, &scripts::RELEASE, &[key], args).await;
    match reply {
        Err(e) if way == Way::ScriptElseNative && script_unavailable(&e) => {
            release_native(t, key, token).await
        }
        reply => scripts::parse_flag(&scripts::RELEASE, reply?),
    }
}

async fn extend_unrecorded(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    let ttl = ttl.as_millis().to_string();
    // Never `SET key token IFEQ token PX ttl`: it sets exactly `ttl`, so a late or duplicated copy with a
    // shorter TTL landing after a longer extension would shorten the key (an extension must never shorten
    // one). Where scripts run, the script compares the TTL; where they cannot (or the node is pinned to
    // native commands), the watched `PEXPIRE … GT`. Both only run `PEXPIRE`, which a server at `maxmemory`
    // still accepts.
    let watched = async || match extend_watched(t, key, token, &ttl).await {
        Err(e) if e.kind() == NodeErrorKind::WrongType => Ok(false),
        other => other,
    };
    let way = way(t, key, |c| c.native_extend()).await?;
    if way == Way::Native {
        match watched().await {
            // The server lacks a command of the transaction after all (it changed behind the connection; the
            // check is forgotten): nothing was changed, so the extension goes again by the path a new check
            // finds.
            Err(e) if refused_command(&e) => {
                t.probe().forget_checks();
                if path(t, key).await?.is_some_and(|c| c.native_extend()) {
                    return Err(e);
                }
            }
            other => return other,
        }
    }
    match eval(t, &scripts::EXTEND, &[key], &[token.as_str(), &ttl]).await {
        Err(e) if way == Way::ScriptElseNative && script_unavailable(&e) => watched().await,
        reply => scripts::parse_flag(&scripts::EXTEND, reply?),
    }
}

/// How many times the watched extension starts again after its `EXEC` was aborted by a change of the key
/// between `WATCH` and `EXEC` (another request of the same holder, or the key's expiry).
pub(super) const WATCHED_ATTEMPTS: usize = 3;

/// Compare-and-extend without Lua (the Lua-less or native extension, and the own-token branch of a Lua-less
/// acquisition): `WATCH key`, `GET key`, and only if the key holds our token `MULTI PEXPIRE key ttl GT EXEC`,
/// which the server runs only if nothing touched the key since the `WATCH` (so the compare and the expire
/// are one atomic step, as in the extend script); otherwise `UNWATCH`. `GT` keeps a longer TTL the key has: an
/// extension never shortens a key, so a late or duplicated copy of a shorter one changes nothing. (`SET …
/// IFEQ … PX` compares too, but sets exactly its TTL.) `PEXPIRE` is also what a server at `maxmemory` still
/// runs. From the `WATCH` to the `EXEC` the call holds the node's transaction gate, so that no other `EXEC`
/// of this node ends the `WATCH` in between, and a reconnect noticed in between fails the call before the
/// transaction is sent (a new connection has no `WATCH`). An `EXEC` aborted by the `WATCH` extended nothing:
/// the sequence starts again (at most [`WATCHED_ATTEMPTS`] times, then a definite error), so that a key that
/// expired or changed hands meanwhile answers "not ours" and one still ours is extended.
///
/// A lock key of another type is a `WrongType` error (the extension answers "not extended", an acquisition
/// reports it). What it cannot exclude: commands the application itself sends on the same connection (a
/// shared client's own `EXEC` or `UNWATCH` between the two steps). (`GT` bounds what such an unwatched
/// transaction can do: it never shortens a key.)
pub(super) async fn extend_watched(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: &str,
) -> Result<bool, NodeError> {
    for _ in 0..WATCHED_ATTEMPTS {
        if let Some(ours) = extend_watched_once(t, key, token, ttl).await? {
            return Ok(ours);
        }
    }
    let what = &scripts::WATCHED_EXTEND;
    Err(NodeError::not_applied(
        NodeErrorKind::Other,
        format!(
            "{}: the key changed between WATCH and EXEC {WATCHED_ATTEMPTS} times in a row, so nothing was \
             extended",
            what.name
        ),
    ))
}

/// One round of [`extend_watched`]: `Some(ours)`, or `None` when the `WATCH` aborted the `EXEC`.
async fn extend_watched_once(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: &str,
) -> Result<Option<bool>, NodeError> {
    let what = &scripts::WATCHED_EXTEND;
    let mut gate = super::gate(t, what).await;
    t.notice_reconnections();
    let generation = t.probe().generation();
    gate.watching(key);
    note(t, t.command(what, key, &["WATCH", key]).await)?;
    let ours = match note(t, t.command(what, key, &["GET", key]).await) {
        Ok(Reply::Bytes(value)) => value == token.as_str().as_bytes(),
        Ok(Reply::Nil) => false,
        other => {
            // Nothing to extend with: the WATCH is ended (also by the connection's end, if it failed).
            if t.command(what, key, &["UNWATCH"]).await.is_ok() {
                gate.unwatched();
            }
            return match other {
                Ok(reply) => Err(scripts::unexpected_reply(what, &reply)),
                Err(e) => Err(e),
            };
        }
    };
    if !ours {
        if note(t, t.command(what, key, &["UNWATCH"]).await).is_ok() {
            gate.unwatched();
        }
        return Ok(Some(false));
    }
    t.notice_reconnections();
    if t.probe().generation() != generation {
        return Err(NodeError::not_applied(
            NodeErrorKind::Connection,
            format!(
                "{}: the connection was replaced between WATCH and EXEC, so the extension could not be made \
                 conditional (not sent)",
                what.name
            ),
        ));
    }
    let replies = note(
        t,
        t.transaction(what, key, &[&["PEXPIRE", key, ttl, "GT"]])
            .await,
    );
    // Answered or not, the EXEC was sent: it ends the WATCH (or the connection did).
    gate.unwatched();
    let replies = replies?;
    match replies.as_slice() {
        // EXEC aborted: the key was touched since the WATCH.
        [] => Ok(None),
        // 1: extended; 0: the TTL it had was longer (kept). Ours either way.
        [Reply::Int(0 | 1)] => Ok(Some(true)),
        _ => Err(scripts::unexpected_reply(what, &Reply::Array(replies))),
    }
}

async fn inspect_native(t: &impl Transport, key: &str) -> Result<Option<KeyState>, NodeError> {
    let replies = note(
        t,
        tx(
            t,
            &scripts::TRANSACTION,
            key,
            &[&["GET", key], &["PTTL", key]],
        )
        .await,
    )?;
    scripts::parse_inspect_tx(replies)
}

/// [`inspect_native`] on a connection whose capability check has not run: the transaction is probed first
/// ([`Transport::probe_transaction`]), so that a user who may not run `MULTI` gets that refusal, not a
/// confused client.
async fn inspect_unchecked(t: &impl Transport, key: &str) -> Result<Option<KeyState>, NodeError> {
    note(t, probe_tx(t, &scripts::TRANSACTION, key).await)?;
    inspect_native(t, key).await
}

/// A read: by the known path, else (an unchecked connection) by the script, falling back to the
/// transaction where scripts cannot run. No capability check: inspection also works on a replica.
pub(crate) async fn inspect(t: &impl Transport, key: &str) -> Result<Option<KeyState>, NodeError> {
    match t.probe().get() {
        Some(caps) if caps.native_acquire() => return inspect_native(t, key).await,
        None if t.probe().mode() == Commands::Native => return inspect_unchecked(t, key).await,
        _ => {}
    }
    match eval(t, &scripts::INSPECT, &[key], &[]).await {
        Ok(reply) => scripts::parse_inspect(reply),
        Err(e)
            if t.probe().get().is_none()
                && t.probe().mode() == Commands::Automatic
                && (lua_absent(&e) || scripts_denied(&e)) =>
        {
            inspect_unchecked(t, key).await
        }
        Err(e) => Err(e),
    }
}

pub(crate) async fn acquire(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    recorded(t, key, || acquire_unrecorded(t, key, token, ttl), |ok| *ok).await
}

/// The fresh acquisition (`SET … NX GET`, or what the server allows), recorded as a write; with the run id
/// of the server that applied it reported in `report` where it is learned in the same exchange (see
/// [`fresh_acquire_unrecorded`]).
pub(crate) async fn fresh_acquire_reporting(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    report: Option<&RunIdSlot>,
) -> Result<bool, NodeError> {
    recorded(
        t,
        key,
        || fresh_acquire_unrecorded(t, key, token, ttl, report),
        |ok| *ok,
    )
    .await
}

/// [`RedisNode::claim`](redlease::RedisNode::claim): with [`wants_ttl`](ClaimRequest::wants_ttl), where the
/// node learns the holder's TTL (`with_ttl`), the waiting acquisition ([`acquire_with_ttl`]); otherwise the
/// fresh acquisition ([`fresh_acquire_reporting`]) or the own-token one ([`acquire`]), answering `Held` without a TTL
/// on contention. The same commands as each of those alone, except that a fresh one (waiting or not) with a
/// [run id slot](ClaimRequest::run_id) may pipeline `INFO server` behind its `SET … NX GET` to fill it
/// (see [`fresh_acquire_unrecorded`]); the other forms leave the slot empty.
pub(crate) async fn claim(
    t: &impl Transport,
    req: ClaimRequest<'_>,
    with_ttl: bool,
) -> Result<Claim, NodeError> {
    let ClaimRequest {
        key,
        token,
        ttl,
        fresh,
        wants_ttl,
        run_id,
        ..
    } = req;
    if wants_ttl && with_ttl {
        return acquire_with_ttl(t, key, token, ttl, fresh, run_id).await;
    }
    let taken = if fresh {
        fresh_acquire_reporting(t, key, token, ttl, run_id).await?
    } else {
        acquire(t, key, token, ttl).await?
    };
    Ok(Claim::from_taken(taken))
}

pub(crate) async fn extend(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    recorded(t, key, || extend_unrecorded(t, key, token, ttl), |ok| *ok).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{block_on, native};

    /// A claim sends what the call it replaced sent, form by form: a fresh one `SET … NX GET`, another the
    /// native acquisition (`SET NX PX`, then the watched look at the key); one that wants the holder's TTL
    /// then marks the waiter and reads the TTL (`MULTI SET PEXPIRE PTTL`), unless the node does not learn
    /// the TTL (a `SentinelNode`), which answers it as a claim without `wants_ttl`.
    #[test]
    fn each_form_of_a_contended_claim_sends_the_commands_of_the_call_it_replaced() {
        let ttl = Ttl::from_millis(1000).unwrap();
        let token = Token::random().unwrap();
        let left = Some(std::time::Duration::from_millis(500));
        for (fresh, wants_ttl, with_ttl, sent, remaining) in [
            (true, false, true, &["SET"][..], None),
            (
                true,
                true,
                true,
                &["SET", "MULTI SET PEXPIRE PTTL"][..],
                left,
            ),
            (true, true, false, &["SET"][..], None),
            (
                false,
                false,
                true,
                &["SET", "WATCH", "GET", "UNWATCH"][..],
                None,
            ),
            (
                false,
                true,
                true,
                &["SET", "WATCH", "GET", "UNWATCH", "MULTI SET PEXPIRE PTTL"][..],
                left,
            ),
            (
                false,
                true,
                false,
                &["SET", "WATCH", "GET", "UNWATCH"][..],
                None,
            ),
        ] {
            let t = native();
            let someone = || Ok(Reply::Bytes(b"someone".to_vec()));
            let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
            if fresh {
                // SET NX GET: the holder's value.
                t.replies.lock().unwrap().push_back(someone());
            } else {
                // SET NX PX: not set; WATCH, GET: another value; UNWATCH.
                t.replies
                    .lock()
                    .unwrap()
                    .extend([Ok(Reply::Nil), ok(), someone(), ok()]);
            }
            t.txs
                .lock()
                .unwrap()
                .push_back(Ok(vec![Reply::Nil, Reply::Int(0), Reply::Int(500)]));
            let req = ClaimRequest::new("l", &token, ttl)
                .fresh(fresh)
                .wants_ttl(wants_ttl);
            let claim = block_on(claim(&t, req, with_ttl)).unwrap();
            let what = format!("fresh {fresh}, wants_ttl {wants_ttl}, with_ttl {with_ttl}");
            assert_eq!(claim, Claim::Held { remaining }, "{what}");
            assert_eq!(*t.sent.lock().unwrap(), sent, "{what}");
        }
    }

    fn info(run_id: &str, uptime: u64) -> Reply {
        Reply::Bytes(
            format!("# Server\r\nrun_id:{run_id}\r\nuptime_in_seconds:{uptime}\r\n").into_bytes(),
        )
    }

    /// A fresh claim that asks for the run id, on a transport that cannot name its connection (fred), sends
    /// `INFO server` pipelined behind its `SET … NX GET` (one write: `command_and_publish`) and reports the
    /// answer; one whose transport knows its connection and remembers the run id read on it sends the `SET`
    /// alone (`run_id` answers from memory). Without a slot, the `SET` alone as before.
    #[test]
    fn a_fresh_claim_with_a_run_id_slot_pipelines_info_only_where_run_id_would_ask() {
        let ttl = Ttl::from_millis(1000).unwrap();
        let token = Token::random().unwrap();
        let claim_with = |t: &crate::ops::testing::Scripted, slot: Option<&RunIdSlot>| {
            t.replies.lock().unwrap().push_back(Ok(Reply::Nil));
            let mut req = ClaimRequest::new("l", &token, ttl).fresh(true);
            if let Some(slot) = slot {
                req = req.report_run_id(slot);
            }
            assert_eq!(block_on(claim(t, req, true)).unwrap(), Claim::Taken);
            std::mem::take(&mut *t.sent.lock().unwrap())
        };
        // A connection the transport cannot name: asked with the SET, every time.
        let t = native();
        for id in ["aaaa", "aaaa"] {
            t.seconds.lock().unwrap().push_back(Some(info(id, 100)));
            let slot = RunIdSlot::new();
            assert_eq!(claim_with(&t, Some(&slot)), ["SET+INFO"]);
            assert_eq!(slot.get().map(redlease::RunId::as_str), Some(id));
        }
        assert_eq!(
            t.tx_args.lock().unwrap().last().unwrap()[1],
            ["INFO", "server"]
        );
        // No slot: the SET alone.
        assert_eq!(claim_with(&t, None), ["SET"]);
        // A waiting fresh claim (one that wants the holder's TTL) that wins: the same.
        t.replies.lock().unwrap().push_back(Ok(Reply::Nil));
        t.seconds.lock().unwrap().push_back(Some(info("aaaa", 100)));
        let slot = RunIdSlot::new();
        let req = ClaimRequest::new("l", &token, ttl)
            .fresh(true)
            .wants_ttl(true)
            .report_run_id(&slot);
        assert_eq!(block_on(claim(&t, req, true)).unwrap(), Claim::Taken);
        assert_eq!(std::mem::take(&mut *t.sent.lock().unwrap()), ["SET+INFO"]);
        assert_eq!(slot.get().map(redlease::RunId::as_str), Some("aaaa"));
        // An INFO that failed (the second reply is `None`): the claim stands, the slot stays empty.
        t.seconds.lock().unwrap().push_back(None);
        let slot = RunIdSlot::new();
        assert_eq!(claim_with(&t, Some(&slot)), ["SET+INFO"]);
        assert!(slot.get().is_none());
        // A connection the transport names: asked once, with the SET; then remembered for it, so the SET
        // goes alone and the slot stays empty (the core's `run_id` answers from memory, no command).
        let t = native();
        *t.conn.lock().unwrap() = Some(1);
        t.seconds.lock().unwrap().push_back(Some(info("aaaa", 100)));
        let slot = RunIdSlot::new();
        assert_eq!(claim_with(&t, Some(&slot)), ["SET+INFO"]);
        assert_eq!(slot.get().map(redlease::RunId::as_str), Some("aaaa"));
        let slot = RunIdSlot::new();
        assert_eq!(claim_with(&t, Some(&slot)), ["SET"]);
        assert!(slot.get().is_none());
        let id = block_on(replication::run_id(&t, "l")).unwrap();
        assert_eq!(id.as_str(), "aaaa");
        assert!(t.sent.lock().unwrap().is_empty(), "answered from memory");
    }

    /// The run id a pipelined `INFO` reports goes through `run_id`'s bookkeeping: a changed one is a restart
    /// dated by the new server's uptime, and what was learned about the old server is forgotten.
    #[test]
    fn a_run_id_reported_with_a_claim_detects_a_restart_as_run_id_does() {
        let ttl = Ttl::from_millis(1000).unwrap();
        let t = native();
        let claim_reporting = |id: &str, uptime: u64| {
            let token = Token::random().unwrap();
            t.replies.lock().unwrap().push_back(Ok(Reply::Nil));
            t.seconds.lock().unwrap().push_back(Some(info(id, uptime)));
            let slot = RunIdSlot::new();
            let req = ClaimRequest::new("l", &token, ttl)
                .fresh(true)
                .report_run_id(&slot);
            assert_eq!(block_on(claim(&t, req, true)).unwrap(), Claim::Taken);
            slot.get().cloned().expect("reported")
        };
        assert_eq!(claim_reporting("aaaa", 100).restarted_ago(), None);
        assert!(t.probe.get().is_some());
        let restarted = claim_reporting("bbbb", 7);
        assert_eq!(restarted.as_str(), "bbbb");
        let ago = restarted.restarted_ago().expect("a restart seen");
        assert!(ago >= std::time::Duration::from_secs(6), "{ago:?}");
        assert!(ago < std::time::Duration::from_secs(7), "{ago:?}");
        assert!(
            t.probe.get().is_none(),
            "the old server's capabilities forgotten"
        );
        // `run_id` asked afterwards agrees, restart included.
        t.replies.lock().unwrap().push_back(Ok(info("bbbb", 8)));
        let asked = block_on(replication::run_id(&t, "l")).unwrap();
        assert_eq!(asked, restarted);
        assert!(asked.restarted_ago().is_some());
    }

    /// Without Lua the extension is the watched transaction: it extends only a key holding our token, with
    /// `PEXPIRE … GT` (never `SET … IFEQ … PX`, which would shorten a key a longer extension set); an `EXEC`
    /// the `WATCH` aborted starts it again; a TTL already longer (`GT` answers 0) is still "ours".
    #[test]
    fn an_extension_without_lua_is_a_watched_pexpire_gt_of_our_key_only() {
        let ttl = Ttl::from_millis(1000).unwrap();
        let token = Token::random().unwrap();
        let ours = || Ok(Reply::Bytes(token.as_str().as_bytes().to_vec()));
        let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
        // Ours: extended by the transaction.
        let t = native();
        t.replies.lock().unwrap().extend([ok(), ours()]);
        t.txs.lock().unwrap().push_back(Ok(vec![Reply::Int(1)]));
        assert!(block_on(extend(&t, "l", &token, ttl)).unwrap());
        assert_eq!(*t.sent.lock().unwrap(), ["WATCH", "GET", "MULTI PEXPIRE"]);
        assert_eq!(
            t.tx_args.lock().unwrap().last().unwrap(),
            &[vec!["PEXPIRE", "l", "1000", "GT"]]
        );
        // Ours with a longer TTL already: kept (GT answers 0), and still held.
        let t = native();
        t.replies.lock().unwrap().extend([ok(), ours()]);
        t.txs.lock().unwrap().push_back(Ok(vec![Reply::Int(0)]));
        assert!(block_on(extend(&t, "l", &token, ttl)).unwrap());
        // Touched between WATCH and EXEC: aborted, and the next round finds it ours and extends it.
        let t = native();
        t.replies
            .lock()
            .unwrap()
            .extend([ok(), ours(), ok(), ours()]);
        t.txs
            .lock()
            .unwrap()
            .extend([Ok(vec![]), Ok(vec![Reply::Int(1)])]);
        assert!(block_on(extend(&t, "l", &token, ttl)).unwrap());
        assert_eq!(
            *t.sent.lock().unwrap(),
            [
                "WATCH",
                "GET",
                "MULTI PEXPIRE",
                "WATCH",
                "GET",
                "MULTI PEXPIRE"
            ]
        );
        // Aborted every time: a definite error, never "not held".
        let t = native();
        for _ in 0..WATCHED_ATTEMPTS {
            t.replies.lock().unwrap().extend([ok(), ours()]);
            t.txs.lock().unwrap().push_back(Ok(vec![]));
        }
        let err = block_on(extend(&t, "l", &token, ttl)).unwrap_err();
        assert!(!err.is_ambiguous(), "{err}");
        // Another's: no transaction at all.
        let t = native();
        t.replies
            .lock()
            .unwrap()
            .extend([ok(), Ok(Reply::Bytes(b"theirs".to_vec())), ok()]);
        assert!(!block_on(extend(&t, "l", &token, ttl)).unwrap());
        assert_eq!(*t.sent.lock().unwrap(), ["WATCH", "GET", "UNWATCH"]);
        // A retried acquisition whose SET NX finds our key extends it the same way.
        let t = native();
        t.replies
            .lock()
            .unwrap()
            .extend([Ok(Reply::Nil), ok(), ours()]);
        t.txs.lock().unwrap().push_back(Ok(vec![Reply::Int(0)]));
        assert!(block_on(acquire(&t, "l", &token, ttl)).unwrap());
        assert_eq!(
            *t.sent.lock().unwrap(),
            ["SET", "WATCH", "GET", "MULTI PEXPIRE"]
        );
    }

    #[test]
    fn a_native_release_without_a_waiter_marker_publishes_nothing() {
        let t = native();
        let token = Token::random().unwrap();
        t.replies.lock().unwrap().extend([Ok(Reply::Int(1))]);
        t.seconds.lock().unwrap().push_back(Some(Reply::Int(0)));
        assert!(block_on(release(&t, "jobs:{7}:lock", &token)).unwrap());
        let args = t.tx_args.lock().unwrap().clone();
        assert_eq!(
            args,
            [vec![
                vec![
                    "DELIFEQ".to_owned(),
                    "jobs:{7}:lock".into(),
                    token.as_str().into()
                ],
                vec!["EXISTS".to_owned(), "redlease:waiting:jobs:{7}:lock".into()],
            ]]
        );
        assert_eq!(*t.sent.lock().unwrap(), ["DELIFEQ+EXISTS"]);
    }

    #[test]
    fn a_native_release_publishes_the_token_prefix_when_a_waiter_marker_exists_or_cannot_be_read() {
        for second in [Some(Reply::Int(1)), None] {
            let t = native();
            let token = Token::random().unwrap();
            t.replies
                .lock()
                .unwrap()
                .extend([Ok(Reply::Int(1)), Ok(Reply::Int(1))]);
            t.seconds.lock().unwrap().push_back(second.clone());
            assert!(block_on(release(&t, "jobs:{7}:lock", &token)).unwrap());
            assert_eq!(
                *t.sent.lock().unwrap(),
                ["DELIFEQ+EXISTS", "PUBLISH"],
                "{second:?}"
            );
        }
        // A release that deleted nothing announces nothing, marker or not.
        let t = native();
        let token = Token::random().unwrap();
        t.replies.lock().unwrap().extend([Ok(Reply::Int(0))]);
        t.seconds.lock().unwrap().push_back(Some(Reply::Int(1)));
        assert!(!block_on(release(&t, "jobs:{7}:lock", &token)).unwrap());
        assert_eq!(*t.sent.lock().unwrap(), ["DELIFEQ+EXISTS"]);
    }

    #[test]
    fn a_native_release_of_a_key_without_a_marker_slot_publishes_in_the_same_write() {
        let t = native();
        let token = Token::random().unwrap();
        t.replies.lock().unwrap().extend([Ok(Reply::Int(1))]);
        assert!(block_on(release(&t, "odd}key", &token)).unwrap());
        let args = t.tx_args.lock().unwrap().clone();
        assert_eq!(
            args,
            [vec![
                vec![
                    "DELIFEQ".to_owned(),
                    "odd}key".into(),
                    token.as_str().into()
                ],
                vec![
                    "PUBLISH".to_owned(),
                    "odd}key".into(),
                    token.as_str()[..8].into()
                ],
            ]]
        );
    }

    /// A call cut between its `WATCH` and its `EXEC` leaves the `WATCH` armed on the connection, where it
    /// would abort the next `EXEC` another call sends there (the cancellation fault test saw an inspect's
    /// transaction come back aborted). The next holder of the transaction gate ends it first; a watched
    /// extension that finished leaves nothing behind.
    #[test]
    fn a_watch_left_by_a_cut_call_is_ended_before_the_next_transaction() {
        let t = native();
        let key = "k";
        let token = Token::random().unwrap();
        // A watched extension that ran to its end: nothing is left to end.
        t.replies.lock().unwrap().extend([
            Ok(Reply::Bytes(b"OK".to_vec())),
            Ok(Reply::Bytes(token.as_str().as_bytes().to_vec())),
        ]);
        t.txs.lock().unwrap().push_back(Ok(vec![Reply::Int(1)]));
        assert!(block_on(extend_watched(&t, key, &token, "1000")).unwrap());
        t.txs
            .lock()
            .unwrap()
            .push_back(Ok(vec![Reply::Nil, Reply::Int(-2)]));
        assert_eq!(block_on(inspect_native(&t, key)).unwrap(), None);
        assert_eq!(
            std::mem::take(&mut *t.sent.lock().unwrap()),
            ["WATCH", "GET", "MULTI PEXPIRE", "MULTI GET PTTL"]
        );
        // A call cut after its WATCH (its gate dropped while watching): the next transaction ends it first,
        // once.
        {
            let mut gate = block_on(crate::ops::gate(&t, &scripts::WATCHED_EXTEND));
            gate.watching(key);
        }
        t.replies
            .lock()
            .unwrap()
            .push_back(Ok(Reply::Bytes(b"OK".to_vec())));
        for _ in 0..2 {
            t.txs
                .lock()
                .unwrap()
                .push_back(Ok(vec![Reply::Nil, Reply::Int(-2)]));
            assert_eq!(block_on(inspect_native(&t, key)).unwrap(), None);
        }
        assert_eq!(
            std::mem::take(&mut *t.sent.lock().unwrap()),
            ["UNWATCH", "MULTI GET PTTL", "MULTI GET PTTL"]
        );
    }
}
