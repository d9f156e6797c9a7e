//! Leased semaphore permits: the `PERMIT` script, or without Lua `TIME` and a watched sorted-set
//! transaction.

use redlease::{NodeError, NodeErrorKind, PermitOp, PermitReply, Token, Ttl, notify};

use crate::scripts::{self, Reply, Script};

use super::ledger::recorded;
use super::lock::publish_args;
use super::rw::{rw_permit, rw_permit_args};
use super::wait::mark_watched;
use super::{Transport, eval, note, path, refused_command, tx};

/// The name of a semaphore operation as the [`PERMIT`](scripts::PERMIT) script takes it.
fn permit_op_name(op: PermitOp<'_>) -> Result<&'static str, NodeError> {
    match op {
        PermitOp::Acquire { .. } => Ok("acquire"),
        PermitOp::Extend => Ok("extend"),
        PermitOp::Release => Ok("release"),
        _ => Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            "a semaphore operation this adapter does not know (not sent)",
        )),
    }
}

/// One operation on the leased semaphore at `key` ([`redlease::RedisNode::permit`]): the
/// [`PERMIT`](scripts::PERMIT) script, or where scripts cannot run (or the node is pinned to native
/// commands) [`permit_watched`].
async fn permit_unrecorded(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    op: PermitOp<'_>,
) -> Result<PermitReply, NodeError> {
    if let Some((name, claim, queue)) = rw_permit_args(op) {
        return rw_permit(t, key, token, ttl, (name, claim, queue), op.fence_key()).await;
    }
    let name = permit_op_name(op)?;
    if path(t, key).await?.is_some_and(|c| c.native_acquire()) {
        return permit_watched(t, key, token, ttl, op).await;
    }
    let millis = ttl.as_millis().to_string();
    let permits = match op {
        PermitOp::Acquire { permits } => permits.to_string(),
        _ => String::new(),
    };
    let (channel, command) = match op {
        PermitOp::Release => publish_args(t, key),
        _ => (String::new(), "PUBLISH"),
    };
    // The waiter marker: an acquisition that finds the semaphore full marks it, a release publishes only
    // while it exists (see `PERMIT`); an extension neither.
    let marker = match op {
        PermitOp::Acquire { .. } | PermitOp::Release => notify::waiting_key(key),
        _ => None,
    };
    let mut args = vec![token.as_str(), &millis, name, &permits, &channel, command];
    args.extend(marker.as_deref());
    match eval(t, &scripts::PERMIT, &[key], &args).await {
        // The server lost Lua behind the connection (the check is forgotten): nothing ran, so the operation
        // goes again by the path a new check finds.
        Err(e) if refused_command(&e) => {
            if path(t, key).await?.is_some_and(|c| c.native_acquire()) {
                permit_watched(t, key, token, ttl, op).await
            } else {
                Err(e)
            }
        }
        Err(e) => Err(e),
        Ok(reply) => scripts::parse_permit(op, reply),
    }
}

/// How many times a Lua-less acquisition or extension of a permit reads and tries again after its `EXEC`
/// was aborted by its `WATCH` (the semaphore changed in between).
pub(super) const PERMIT_ATTEMPTS: usize = 5;

/// The server's time in milliseconds from a `TIME` reply (`[seconds, microseconds]`).
fn parse_time(what: &Script, reply: Reply) -> Result<u64, NodeError> {
    let Reply::Array(items) = reply else {
        return Err(scripts::unexpected_reply(what, &reply));
    };
    let number = |r: &Reply| -> Option<u64> {
        match r {
            Reply::Bytes(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            Reply::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        }
    };
    match items.as_slice() {
        [secs, micros] => match (number(secs), number(micros)) {
            (Some(secs), Some(micros)) => Ok(secs.saturating_mul(1000) + micros / 1000),
            _ => Err(scripts::unexpected_reply(what, &Reply::Array(items))),
        },
        _ => Err(scripts::unexpected_reply(what, &Reply::Array(items))),
    }
}

/// The members and scores of a `ZRANGE key 0 -1 WITHSCORES` reply: flat `[member, score, …]` (RESP2) or
/// pairs `[[member, score], …]` (RESP3), each score an integer number of milliseconds.
pub(super) fn parse_scored(what: &Script, reply: Reply) -> Result<Vec<(Vec<u8>, u64)>, NodeError> {
    let score = |r: &Reply| -> Option<u64> {
        match r {
            Reply::Bytes(b) => {
                let text = std::str::from_utf8(b).ok()?;
                text.parse::<u64>()
                    .ok()
                    .or_else(|| text.parse::<f64>().ok().map(|f| f.max(0.0) as u64))
            }
            Reply::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        }
    };
    let Reply::Array(items) = reply else {
        return Err(scripts::unexpected_reply(what, &reply));
    };
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut iter = items.iter();
    while let Some(item) = iter.next() {
        let pair = match item {
            Reply::Array(pair) => match pair.as_slice() {
                [Reply::Bytes(member), s] => score(s).map(|s| (member.clone(), s)),
                _ => None,
            },
            Reply::Bytes(member) => iter.next().and_then(score).map(|s| (member.clone(), s)),
            _ => None,
        };
        match pair {
            Some(pair) => out.push(pair),
            // A read only (nothing was written): definite.
            None => {
                return Err(NodeError::not_applied(
                    NodeErrorKind::Protocol,
                    format!(
                        "{}: a ZRANGE WITHSCORES reply of the wrong shape",
                        what.name
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// The semaphore key holds another type: worded as the permit script words it.
fn semaphore_wrong_type(what: &Script, e: NodeError) -> NodeError {
    NodeError::not_applied(
        NodeErrorKind::WrongType,
        format!(
            "the {} command was refused: WRONGTYPE the semaphore key holds a value of another type",
            what.name
        ),
    )
    .with_source(e)
}

/// The server's time (`TIME`, on the connection that carries `key`), in milliseconds.
pub(super) async fn server_millis(
    t: &impl Transport,
    what: &Script,
    key: &str,
) -> Result<u64, NodeError> {
    let reply = note(t, t.command(what, key, &["TIME"]).await)?;
    parse_time(what, reply)
}

/// The leased semaphore without Lua. Scores are the server's milliseconds, read with `TIME` before the
/// write: an earlier "now" than the write's purges fewer permits and counts more as held, so it errs on the
/// safe side, and a permit's expiry (that "now" plus its TTL) is still later than its call's start plus the
/// TTL, from which the core measures validity.
///
/// - **Acquire** and **extend** read under `WATCH key`: `TIME`, then `ZRANGE key 0 -1 WITHSCORES` (acquire)
///   or `ZMSCORE` (extend; see below). If the token holds a live permit, or (acquire) fewer than `permits`
///   are live: `MULTI`, `ZREMRANGEBYSCORE key -inf now`, `ZADD key [XX] expiry token`, `ZCARD key` (acquire)
///   or `ZSCORE key token` (extend), the key's expiry raised (`PEXPIREAT key expiry NX`, then `… GT`),
///   `EXEC`, which the server runs only if nothing touched the key since the `WATCH`. An aborted `EXEC`
///   reads again, up to [`PERMIT_ATTEMPTS`] times, then a definite [`NodeErrorKind::Busy`] error (nothing
///   written). Otherwise "not held" (`UNWATCH`, nothing written), or "full" with the time until the
///   earliest live permit expires: the waiter marker ([`notify::waiting_key`]) is marked to outlive that
///   time ([`mark_watched`]: plain `SET … NX PX` / `PEXPIRE … GT` under the armed `WATCH`), then `MULTI PTTL
///   key EXEC` confirms that the semaphore did not change since the read (an aborted `EXEC` reads again),
///   so the marker was in place before any release the read did not see. From the `WATCH` to the `EXEC`
///   the call holds the node's transaction gate ([`Probe::tx_gate`](super::Probe::tx_gate)), and a
///   reconnect noticed in between fails the call before the transaction is sent, as in
///   [`extend_watched`](super::lock::extend_watched).
/// - **Release** needs no read: `MULTI ZREMRANGEBYSCORE key -inf now ZREM key c:token o:token ZREM key token
///   s:token x:token EXEC` (an expired permit is purged first, so removing it answers "not held"; a waiting
///   writer's claim or a fair waiter's place and arrival marker go either way, as in the script); one that
///   removed a permit then reads the waiter marker (`EXISTS`, after the removal) and, only when it exists
///   or cannot be read, publishes the release notification (a separate command, whose refusal by a channel
///   ACL leaves the release done), as the script publishes. The `EXISTS` is not queued in the `MULTI`: a
///   user whose ACL excludes the markers would have the whole release refused (`EXECABORT`). Reading it
///   after the removal is what the wake-up needs: a marker written before the removal is seen, one written
///   after belongs to an attempt whose read sees the permit gone.
/// - **Extension** finds the member as the script does: `ZMSCORE key token s:token x:token`, the first that
///   exists (a read/write or fair lock's holder is stored as `s:` or `x:` and its token).
///
/// Should a `WATCH` still be lost (a shared connection's own `EXEC`, fred's replay of a transaction on a new
/// connection), the transaction stays safe: `XX` never adds, an expired permit is purged before it could be
/// refreshed, and the acquisition's `ZCARD` shows a permit added beyond the count, which is then removed
/// again (`ZREM`, with a release notification) and answered as "full", so the set never admits more than
/// `permits` holders.
///
/// The key's own expiry is only ever raised here (`NX`, `GT`: a transaction cannot compute the set's latest
/// expiry, and a stale exact value could cut another holder's permit short), so after a release or a
/// shortened permit the key may outlive its permits by the difference, holding only expired ones, which
/// count for nothing; a set left empty is deleted by the server. A key of another type is
/// [`NodeErrorKind::WrongType`] for an acquisition and "not held" for the others, and never touched.
/// Refused on a cluster node (`TIME` there is not routed by key, and the key's server's clock is the one
/// that counts).
pub(super) async fn permit_watched(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    op: PermitOp<'_>,
) -> Result<PermitReply, NodeError> {
    let what = &scripts::WATCHED_PERMIT;
    // Read/write and fair locks' acquisitions go through `rw_watched`.
    permit_op_name(op)?;
    if t.clustered() {
        return Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            "a leased semaphore on a cluster node needs Lua: without it the key's server clock cannot be \
             read in the same step (not sent)",
        ));
    }
    if op == PermitOp::Release {
        return release_permit_native(t, key, token).await;
    }
    for _ in 0..PERMIT_ATTEMPTS {
        if let Some(reply) = permit_watched_once(t, key, token, ttl, op).await? {
            return Ok(reply);
        }
    }
    Err(NodeError::not_applied(
        NodeErrorKind::Busy,
        format!(
            "{}: the semaphore changed between the read and the write {PERMIT_ATTEMPTS} times in a row (each \
             EXEC aborted by its WATCH; nothing was written)",
            what.name
        ),
    ))
}

/// Release without Lua (see [`permit_watched`]).
async fn release_permit_native(
    t: &impl Transport,
    key: &str,
    token: &Token,
) -> Result<PermitReply, NodeError> {
    let what = &scripts::WATCHED_PERMIT;
    let now = server_millis(t, what, key).await?.to_string();
    let tok = token.as_str();
    let (claim, marker) = (format!("c:{tok}"), format!("o:{tok}"));
    let (shared, exclusive) = (format!("s:{tok}"), format!("x:{tok}"));
    let result = tx(
        t,
        what,
        key,
        &[
            &["ZREMRANGEBYSCORE", key, "-inf", &now],
            &["ZREM", key, &claim, &marker],
            &["ZREM", key, token.as_str(), &shared, &exclusive],
        ],
    )
    .await;
    let replies = match note(t, result) {
        Ok(replies) => replies,
        // A key of another type holds no permit (no command touched it).
        Err(e) if e.kind() == NodeErrorKind::WrongType => return Ok(PermitReply::NotHeld),
        Err(e) => return Err(e),
    };
    match replies.as_slice() {
        [_, _, Reply::Int(n)] if *n >= 1 => {}
        [_, _, Reply::Int(0)] => return Ok(PermitReply::NotHeld),
        _ => return Err(scripts::unexpected_reply(what, &Reply::Array(replies))),
    }
    // After the removal, as the script publishes: only while the waiter marker exists (or cannot be read).
    // The `EXISTS` follows the removal, so a marker written later belongs to an attempt that read the
    // permit gone; one written earlier (with the read that found the semaphore full) is seen here.
    if let Some(marker) = notify::waiting_key(key) {
        let waiting = note(t, t.command(what, key, &["EXISTS", &marker]).await);
        if matches!(waiting, Ok(Reply::Int(0))) {
            return Ok(PermitReply::Done);
        }
    }
    let (channel, command) = publish_args(t, key);
    let _ = note(
        t,
        t.command(what, key, &[command, &channel, notify::payload(token)])
            .await,
    );
    Ok(PermitReply::Done)
}

/// The connection was replaced between a `WATCH` and its `EXEC`: the `EXEC` is not sent.
pub(super) fn replaced(what: &Script) -> NodeError {
    NodeError::not_applied(
        NodeErrorKind::Connection,
        format!(
            "{}: the connection was replaced between WATCH and EXEC, so the write could not be made \
             conditional (not sent)",
            what.name
        ),
    )
}

/// One read and conditional write of a Lua-less acquisition or extension (see [`permit_watched`]): `None`
/// when the `EXEC` was aborted by the `WATCH`.
async fn permit_watched_once(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    op: PermitOp<'_>,
) -> Result<Option<PermitReply>, NodeError> {
    let what = &scripts::WATCHED_PERMIT;
    let permits = match op {
        PermitOp::Acquire { permits } => Some(permits),
        _ => None,
    };
    let tok = token.as_str();
    let names = [tok.to_owned(), format!("s:{tok}"), format!("x:{tok}")];
    let mut gate = super::gate(t, what).await;
    t.notice_reconnections();
    let generation = t.probe().generation();
    gate.watching(key);
    note(t, t.command(what, key, &["WATCH", key]).await)?;
    let read = async {
        let now = server_millis(t, what, key).await?;
        let members = if permits.is_some() {
            let args = ["ZRANGE", key, "0", "-1", "WITHSCORES"];
            parse_scored(what, note(t, t.command(what, key, &args).await)?)?
        } else {
            // The script's member: the token, else a read/write or fair lock's `s:` or `x:` entry of it (the
            // first that exists, expired or not).
            let args = ["ZMSCORE", key, &names[0], &names[1], &names[2]];
            let Reply::Array(scores) = note(t, t.command(what, key, &args).await)? else {
                return Err(NodeError::not_applied(
                    NodeErrorKind::Protocol,
                    format!("{}: a ZMSCORE reply of the wrong shape", what.name),
                ));
            };
            match names.iter().zip(scores).find(|(_, s)| *s != Reply::Nil) {
                None => Vec::new(),
                Some((member, score)) => {
                    let pair = Reply::Array(vec![Reply::Bytes(member.as_bytes().to_vec()), score]);
                    parse_scored(what, pair)?
                }
            }
        };
        Ok::<_, NodeError>((now, members))
    }
    .await;
    let unwatch = || async {
        let _ = note(t, t.command(what, key, &["UNWATCH"]).await);
    };
    let (now, members) = match read {
        Ok(read) => read,
        Err(e) => {
            unwatch().await;
            gate.unwatched();
            return match (e.kind(), permits) {
                (NodeErrorKind::WrongType, Some(_)) => Err(semaphore_wrong_type(what, e)),
                (NodeErrorKind::WrongType, None) => Ok(Some(PermitReply::NotHeld)),
                _ => Err(e),
            };
        }
    };
    let live: Vec<u64> = members
        .iter()
        .map(|(_, at)| *at)
        .filter(|at| *at > now)
        .collect();
    // The member to add or refresh: the token, or (extension) the entry of it that was found.
    let member = match (permits, members.first()) {
        (None, Some((m, _))) => String::from_utf8_lossy(m).into_owned(),
        _ => tok.to_owned(),
    };
    let mine = members
        .iter()
        .any(|(m, at)| *at > now && m.as_slice() == member.as_bytes());
    match permits {
        Some(permits) if !mine && live.len() >= permits as usize => {
            let next = live.iter().map(|at| at - now).min();
            let full = PermitReply::Full {
                next_expiry: next.map(std::time::Duration::from_millis),
            };
            let Some(marker) = notify::waiting_key(key) else {
                unwatch().await;
                gate.unwatched();
                return Ok(Some(full));
            };
            // The waiter marker, then an EXEC that runs only if the semaphore is unchanged since the read
            // (see `mark_watched`).
            let blocked = next.unwrap_or(ttl.as_millis());
            if let Err(e) = mark_watched(t, what, key, &marker, blocked).await {
                unwatch().await;
                gate.unwatched();
                return Err(e);
            }
            t.notice_reconnections();
            if t.probe().generation() != generation {
                return Err(replaced(what));
            }
            let checked = note(t, t.transaction(what, key, &[&["PTTL", key]]).await);
            gate.unwatched();
            return Ok(Some(match checked?.is_empty() {
                // The semaphore changed since the read (a permit may be free now, and its release may have
                // missed the marker): full, with nothing to wait for, so that a waiting acquisition tries
                // again at once and a single try reports contention. Reading again here instead turned a
                // contended try into a `Busy` error after a few aborts under churn.
                true => PermitReply::Full {
                    next_expiry: Some(std::time::Duration::ZERO),
                },
                false => full,
            }));
        }
        None if !mine => {
            unwatch().await;
            gate.unwatched();
            return Ok(Some(PermitReply::NotHeld));
        }
        _ => {}
    }
    t.notice_reconnections();
    if t.probe().generation() != generation {
        return Err(replaced(what));
    }
    let now_text = now.to_string();
    let expiry = now.saturating_add(ttl.as_millis()).to_string();
    let (add, check): (&[&str], &[&str]) = if permits.is_some() {
        (
            &["ZADD", key, "GT", &expiry, token.as_str()],
            &["ZCARD", key],
        )
    } else {
        (
            &["ZADD", key, "XX", "GT", &expiry, &member],
            &["ZSCORE", key, &member],
        )
    };
    let replies = note(
        t,
        t.transaction(
            what,
            key,
            &[
                &["ZREMRANGEBYSCORE", key, "-inf", &now_text],
                add,
                check,
                &["PEXPIREAT", key, &expiry, "NX"],
                &["PEXPIREAT", key, &expiry, "GT"],
            ],
        )
        .await,
    )?;
    // The EXEC was sent: it ended the WATCH (or the connection did).
    gate.unwatched();
    drop(gate);
    if replies.is_empty() {
        // Aborted by the WATCH: nothing ran.
        return Ok(None);
    }
    let Some(permits) = permits else {
        // Extension: done iff the permit is there now (XX never adds one).
        return match replies.get(2) {
            Some(Reply::Nil) => Ok(Some(PermitReply::NotHeld)),
            Some(Reply::Bytes(_) | Reply::Int(_)) => Ok(Some(PermitReply::Done)),
            _ => Err(scripts::unexpected_reply(what, &Reply::Array(replies))),
        };
    };
    let (added, count) = match replies.as_slice() {
        [_, Reply::Int(added), Reply::Int(count), _, _] => (*added, *count),
        _ => return Err(scripts::unexpected_reply(what, &Reply::Array(replies))),
    };
    if added == 1 && count > i64::from(permits) {
        // Only if the WATCH was lost: one too many. Ours is removed again, with a notification for those
        // who counted it.
        let (channel, command) = publish_args(t, key);
        let undone = note(
            t,
            t.command_and_publish(
                what,
                key,
                &["ZREM", key, token.as_str()],
                &[command, &channel, notify::payload(token)],
            )
            .await,
        );
        return match undone {
            Ok(_) => Ok(Some(PermitReply::Full { next_expiry: None })),
            Err(cleanup) => Err(NodeError::ambiguous(
                NodeErrorKind::Other,
                format!(
                    "{}: a permit beyond the count was added (the WATCH was lost) and removing it failed ({}); \
                     it may remain until its TTL",
                    what.name,
                    cleanup.message()
                ),
            )
            .with_source(cleanup)),
        };
    }
    Ok(Some(PermitReply::Done))
}

pub(crate) async fn permit(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    op: PermitOp<'_>,
) -> Result<PermitReply, NodeError> {
    let op_writes = op != PermitOp::Release;
    // A grant wrote the key, fenced or not (a fenced writer's grant is `Fenced`).
    let done = move |r: &PermitReply| {
        op_writes && matches!(r, PermitReply::Done | PermitReply::Fenced { .. })
    };
    recorded(t, key, || permit_unrecorded(t, key, token, ttl, op), done).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{block_on, native, scored, time};

    const TWO: PermitOp<'static> = PermitOp::Acquire { permits: 2 };

    /// Without Lua: a full semaphore (expired permits not counted) writes no permit and reports the time
    /// until the earliest live permit expires, by the server's clock; it marks the waiter marker to outlive
    /// that time (plus the margin) under the armed `WATCH`, and an `EXEC` confirms the semaphore unchanged.
    #[test]
    fn a_full_semaphore_without_lua_marks_the_waiter_marker_and_reports_the_earliest_expiry() {
        let t = native();
        let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
        let members = [("a", 1_000_900), ("old", 1_000_100), ("b", 1_000_700)];
        t.replies
            .lock()
            .unwrap()
            .extend([ok(), time(1_000_500), scored(&members), ok()]);
        t.txs.lock().unwrap().push_back(Ok(vec![Reply::Int(400)]));
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        let reply = block_on(permit(&t, "s", &token, ttl, TWO)).unwrap();
        assert_eq!(
            reply,
            PermitReply::Full {
                next_expiry: Some(std::time::Duration::from_millis(200))
            }
        );
        assert_eq!(
            *t.sent.lock().unwrap(),
            ["WATCH", "TIME", "ZRANGE", "SET", "MULTI PTTL"]
        );
        assert_eq!(t.tx_args.lock().unwrap()[0], [vec!["PTTL", "s"]]);
        // A marker there already (`SET NX` answers nil) is lengthened, never shortened (`GT`); a semaphore
        // changed since the read (the EXEC aborted) is reported full with nothing to wait for (a waiter tries
        // again at once, a single try reports contention), not read again.
        let t = native();
        t.replies.lock().unwrap().extend([
            ok(),
            time(1_000_500),
            scored(&members),
            Ok(Reply::Nil),
            Ok(Reply::Int(0)),
        ]);
        t.txs.lock().unwrap().extend([Ok(vec![])]);
        let reply = block_on(permit(&t, "s", &token, ttl, TWO)).unwrap();
        assert_eq!(
            reply,
            PermitReply::Full {
                next_expiry: Some(std::time::Duration::ZERO)
            }
        );
        assert_eq!(
            *t.sent.lock().unwrap(),
            ["WATCH", "TIME", "ZRANGE", "SET", "PEXPIRE", "MULTI PTTL"]
        );
    }

    /// Without Lua, a marker the server refuses (the ACL, `maxmemory`) leaves the answer "full" (the waiter
    /// waits its usual bound); one that could not be sent fails the attempt rather than wait unmarked.
    #[test]
    fn a_full_semaphore_without_lua_whose_marker_fails() {
        let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
        let members = [("a", 1_000_900), ("b", 1_000_700)];
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        let t = native();
        t.replies.lock().unwrap().extend([
            ok(),
            time(1_000_500),
            scored(&members),
            Err(NodeError::not_applied(NodeErrorKind::Auth, "NOPERM")),
        ]);
        t.txs.lock().unwrap().push_back(Ok(vec![Reply::Int(400)]));
        let reply = block_on(permit(&t, "s", &token, ttl, TWO)).unwrap();
        assert!(matches!(reply, PermitReply::Full { .. }), "{reply:?}");
        let t = native();
        t.replies.lock().unwrap().extend([
            ok(),
            time(1_000_500),
            scored(&members),
            Err(NodeError::ambiguous(NodeErrorKind::Io, "connection reset")),
            ok(),
        ]);
        let err = block_on(permit(&t, "s", &token, ttl, TWO)).unwrap_err();
        assert_eq!(err.kind(), NodeErrorKind::Io, "{err}");
        assert_eq!(
            *t.sent.lock().unwrap(),
            ["WATCH", "TIME", "ZRANGE", "SET", "UNWATCH"]
        );
    }

    /// Without Lua, a release publishes only when the waiter marker exists (or cannot be read), read after
    /// the removal.
    #[test]
    fn a_release_without_lua_publishes_only_while_a_waiter_marker_exists() {
        let removed = || Ok(vec![Reply::Int(0), Reply::Int(0), Reply::Int(1)]);
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        for (exists, published) in [
            (Ok(Reply::Int(0)), false),
            (Ok(Reply::Int(1)), true),
            (
                Err(NodeError::not_applied(NodeErrorKind::Auth, "NOPERM")),
                true,
            ),
        ] {
            let t = native();
            t.replies
                .lock()
                .unwrap()
                .extend([time(1_000_500), exists, Ok(Reply::Int(0))]);
            t.txs.lock().unwrap().push_back(removed());
            let r = block_on(permit(&t, "s", &token, ttl, PermitOp::Release)).unwrap();
            assert_eq!(r, PermitReply::Done);
            let mut expected = vec!["TIME", "MULTI ZREMRANGEBYSCORE ZREM ZREM", "EXISTS"];
            if published {
                expected.push("PUBLISH");
            }
            assert_eq!(*t.sent.lock().unwrap(), expected);
        }
        // Nothing removed: nothing read, nothing published.
        let t = native();
        t.replies.lock().unwrap().push_back(time(1_000_500));
        t.txs
            .lock()
            .unwrap()
            .push_back(Ok(vec![Reply::Int(0), Reply::Int(0), Reply::Int(0)]));
        let r = block_on(permit(&t, "s", &token, ttl, PermitOp::Release)).unwrap();
        assert_eq!(r, PermitReply::NotHeld);
        assert_eq!(
            *t.sent.lock().unwrap(),
            ["TIME", "MULTI ZREMRANGEBYSCORE ZREM ZREM"]
        );
    }

    /// Without Lua, with one of two permits live: the permit is added in a transaction whose purge and
    /// expiry use the server's time.
    #[test]
    fn a_free_permit_without_lua_is_added_with_the_servers_time() {
        let t = native();
        let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
        t.replies.lock().unwrap().extend([
            ok(),
            time(1_000_500),
            scored(&[("old", 1_000_500), ("a", 1_000_900)]),
        ]);
        t.txs.lock().unwrap().push_back(Ok(vec![
            Reply::Int(1),
            Reply::Int(1),
            Reply::Int(2),
            Reply::Int(0),
            Reply::Int(1),
        ]));
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        let reply = block_on(permit(&t, "s", &token, ttl, TWO)).unwrap();
        assert_eq!(reply, PermitReply::Done);
        let tx = t.tx_args.lock().unwrap()[0].clone();
        let tok = token.as_str().to_owned();
        assert_eq!(
            tx,
            [
                vec![
                    "ZREMRANGEBYSCORE".to_owned(),
                    "s".into(),
                    "-inf".into(),
                    "1000500".into()
                ],
                vec![
                    "ZADD".to_owned(),
                    "s".into(),
                    "GT".into(),
                    "1001500".into(),
                    tok
                ],
                vec!["ZCARD".to_owned(), "s".into()],
                vec![
                    "PEXPIREAT".to_owned(),
                    "s".into(),
                    "1001500".into(),
                    "NX".into()
                ],
                vec![
                    "PEXPIREAT".to_owned(),
                    "s".into(),
                    "1001500".into(),
                    "GT".into()
                ],
            ]
        );
    }

    /// Should the `WATCH` be lost (a replayed or interleaved transaction), the `ZCARD` in the transaction
    /// shows a permit added beyond the count: it is removed again at once and the answer is "full".
    #[test]
    fn a_permit_added_beyond_the_count_is_removed_again_and_answered_full() {
        let t = native();
        let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
        t.replies
            .lock()
            .unwrap()
            .extend([ok(), time(1_000_500), scored(&[]), Ok(Reply::Int(1))]);
        t.txs.lock().unwrap().push_back(Ok(vec![
            Reply::Int(0),
            Reply::Int(1),
            Reply::Int(3),
            Reply::Int(0),
            Reply::Int(1),
        ]));
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        let reply = block_on(permit(&t, "s", &token, ttl, TWO)).unwrap();
        assert_eq!(reply, PermitReply::Full { next_expiry: None });
        assert_eq!(
            t.sent.lock().unwrap().last().map(String::as_str),
            Some("ZREM+PUBLISH")
        );
    }

    /// An `EXEC` aborted by its `WATCH` reads again; after the last attempt a definite `Busy` error.
    #[test]
    fn an_aborted_exec_reads_again_and_then_fails_definitely() {
        let t = native();
        let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
        for _ in 0..PERMIT_ATTEMPTS {
            t.replies
                .lock()
                .unwrap()
                .extend([ok(), time(1_000_500), scored(&[])]);
            t.txs.lock().unwrap().push_back(Ok(vec![]));
        }
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        let err = block_on(permit(&t, "s", &token, ttl, TWO)).unwrap_err();
        assert_eq!(err.kind(), NodeErrorKind::Busy, "{err}");
        assert!(!err.is_ambiguous(), "{err}");
        assert_eq!(t.txs.lock().unwrap().len(), 0, "every attempt sent");
    }

    /// A semaphore key of another type: a typed refusal for an acquisition, "not held" for an extension
    /// and a release, and nothing written.
    #[test]
    fn a_semaphore_key_of_another_type_is_refused_without_lua() {
        let wrong_type = || {
            NodeError::not_applied(
                NodeErrorKind::WrongType,
                "WRONGTYPE Operation against a key holding the wrong kind of value",
            )
        };
        let wrong = || Err(wrong_type());
        let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        let t = native();
        t.replies
            .lock()
            .unwrap()
            .extend([ok(), time(1_000_500), wrong(), ok()]);
        let err = block_on(permit(&t, "s", &token, ttl, TWO)).unwrap_err();
        assert_eq!(err.kind(), NodeErrorKind::WrongType, "{err}");
        assert!(err.message().contains("semaphore key"), "{err}");
        let t = native();
        t.replies
            .lock()
            .unwrap()
            .extend([ok(), time(1_000_500), wrong(), ok()]);
        let r = block_on(permit(&t, "s", &token, ttl, PermitOp::Extend)).unwrap();
        assert_eq!(r, PermitReply::NotHeld);
        let t = native();
        t.replies.lock().unwrap().push_back(time(1_000_500));
        t.txs.lock().unwrap().push_back(Err(wrong_type()));
        let r = block_on(permit(&t, "s", &token, ttl, PermitOp::Release)).unwrap();
        assert_eq!(r, PermitReply::NotHeld);
        assert!(t.txs.lock().unwrap().is_empty());
        assert_eq!(
            *t.sent.lock().unwrap(),
            ["TIME", "MULTI ZREMRANGEBYSCORE ZREM ZREM"]
        );
    }
}
