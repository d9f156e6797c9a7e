//! Fenced acquisition (the script, or three native steps without Lua), the fence checks, and
//! [`raise_fence`].

use redlease::{NodeError, NodeErrorKind, Token, Ttl, notify};

use crate::scripts::{self, Reply};
use crate::slot;

use super::ledger::{WRITES_KEPT, recorded};
use super::lock::{inspect, lock_wrong_type, own_token_extend, release_native, set_if};
use super::probe::{FENCES_KEPT, checked, denied};
use super::wait::waiting;
use super::{Transport, eval, note, tx};

async fn acquire_fenced_unrecorded(
    t: &impl Transport,
    key: &str,
    fence_key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<Option<u64>, NodeError> {
    if t.clustered() {
        slot::check_same_slot(key, fence_key)?;
    }
    let caps = checked(t, key, Some(fence_key)).await?;
    let waiting_ttl = ttl;
    let ttl = ttl.as_millis().to_string();
    if caps.native_acquire() {
        return fenced_native(t, key, fence_key, token, &ttl, waiting_ttl).await;
    }
    let marker = notify::waiting_key(key);
    let args: &[&str] = match &marker {
        Some(marker) => &[token.as_str(), &ttl, marker],
        None => &[token.as_str(), &ttl],
    };
    let reply = eval(t, &scripts::ACQUIRE_FENCED, &[key, fence_key], args).await?;
    scripts::parse_fence(reply)
}

pub(super) fn fence_error(message: String) -> NodeError {
    NodeError::not_applied(NodeErrorKind::Fence, message)
}

/// Checks a fence counter's `GET` and `PTTL` replies as the fenced script does: a non-negative decimal
/// integer below 2^63-1 (or absent) without a TTL.
pub(super) fn check_fence(fence_key: &str, value: &Reply, pttl: &Reply) -> Result<(), NodeError> {
    let what = &scripts::TRANSACTION;
    match value {
        Reply::Nil => {}
        Reply::Bytes(b) => {
            let text = std::str::from_utf8(b).unwrap_or("");
            let decimal = text == "0"
                || (!text.is_empty()
                    && !text.starts_with('0')
                    && text.bytes().all(|c| c.is_ascii_digit()));
            if !decimal {
                return Err(fence_error(format!(
                    "FENCE the fence key {fence_key} does not hold a non-negative integer"
                )));
            }
            if text.parse::<i64>().map_or(true, |n| n == i64::MAX) {
                return Err(fence_error(format!(
                    "FENCE the fence counter {fence_key} is exhausted"
                )));
            }
        }
        other => return Err(scripts::unexpected_reply(what, other)),
    }
    match scripts::parse_integer(what, pttl)? {
        -1 | -2 => Ok(()),
        _ => Err(fence_error(format!(
            "FENCE the fence key {fence_key} has a TTL; fencing numbers would restart when it expires"
        ))),
    }
}

/// An `INCR` refusal, worded as the fenced script words the same condition.
pub(super) fn incr_refused(fence_key: &str, e: NodeError) -> NodeError {
    let message = e.message().to_owned();
    let reworded = if e.kind() == NodeErrorKind::WrongType {
        Some(format!(
            "FENCE the fence key {fence_key} holds a value of another type"
        ))
    } else if message.contains("overflow") {
        Some(format!("FENCE the fence counter {fence_key} is exhausted"))
    } else if message.contains("not an integer") {
        Some(format!(
            "FENCE the fence key {fence_key} does not hold a non-negative integer"
        ))
    } else {
        None
    };
    match reworded {
        Some(m) => fence_error(m).with_source(e),
        None => e,
    }
}

/// Removes the lock this call wrote before `err` ended it; if that fails too, the lock may remain, so the
/// error becomes ambiguous (the core then cleans up).
async fn undo(t: &impl Transport, key: &str, token: &Token, err: NodeError) -> NodeError {
    match release_native(t, key, token).await {
        Ok(_) => err,
        Err(cleanup) => NodeError::ambiguous(
            err.kind(),
            format!(
                "{}; removing the lock key written before it failed too ({}), so the lock may remain until \
                 its TTL",
                err.message(),
                cleanup.message()
            ),
        )
        .with_source(err),
    }
}

/// Whether the user may write `fence_key` (an ACL may let it read the counter but not write it), proved once
/// per connection and fence key, before the lock is written: `MULTI`, `INCR fence_key` and a malformed `INCR`,
/// whose refusal aborts the transaction, so nothing runs; a refusal of `INCR fence_key` itself (`NOPERM`, at
/// queueing) is the ACL's. Without it the lock would be written, the `INCR` of step 3 refused, and the lock
/// removed again.
pub(super) async fn fence_writable(
    t: &impl Transport,
    key: &str,
    fence_key: &str,
) -> Result<(), NodeError> {
    if t.probe().lock().writable_fences.contains(fence_key) {
        return Ok(());
    }
    let what = &scripts::TRANSACTION;
    match note(t, tx(t, what, key, &[&["INCR", fence_key], &["INCR"]]).await) {
        Err(e) if !e.is_ambiguous() && e.message().contains("wrong number of arguments") => {
            let mut state = t.probe().lock();
            if state.writable_fences.len() >= WRITES_KEPT {
                state.writable_fences.clear();
            }
            state.writable_fences.insert(fence_key.to_owned());
            Ok(())
        }
        Err(e) if denied(&e) => Err(NodeError::not_applied(
            NodeErrorKind::Auth,
            format!(
                "the user may not write the fence key {fence_key} (INCR refused: {}); refused before the lock \
                 {key} was written",
                e.message()
            ),
        )
        .with_source(e)),
        Err(e) => Err(e),
        Ok(replies) => Err(scripts::unexpected_reply(what, &Reply::Array(replies))),
    }
}

/// Fenced acquisition without Lua, in three steps on one connection:
///
/// 1. `MULTI GET fence PTTL fence EXEC`: the counter must be absent or a non-negative integer below
///    2^63-1 without a TTL, else a `Fence` error (nothing written).
/// 2. `SET lock token NX PX ttl`; if the key exists, it is held by another (`None`), unless it holds our
///    token (see retries below).
/// 3. `MULTI INCR fence GET lock PTTL fence EXEC`: the number is issued in the same atomic step that shows
///    the lock still holds our token, so the numbers of successive holders increase strictly (their holding
///    times do not overlap). If the `INCR` is refused (the counter changed type or overflowed meanwhile) or
///    the counter gained a TTL meanwhile, the lock is removed again (`DELIFEQ`) before the error returns.
///
/// Contention changes nothing (no `INCR` without the lock). Retries of one acquisition (same token): the node
/// remembers what it wrote. A number it issued is returned again after the watched extension extends the TTL
/// (never shortening it, as the script does); a lock it wrote whose number is unconfirmed (the reply of step 3 was lost, or the call was
/// dropped between steps) gets a new number through step 3, since the old `INCR` may never have run; a lock
/// holding our token that this node never wrote is a definite `Fence` error, nothing written (as the script
/// answers a lock without counter).
///
/// Gaps in the sequence (numbers issued to no holder): an `INCR` whose lock had already expired (step 3
/// finds another or no value: `None`), one followed by a refusal, one whose reply was lost (its retry takes a
/// new number). (A fred node sends its transactions as plain pipelines, written once: fred's transaction API
/// re-sent a whole `MULTI … EXEC` after reconnecting, which issued a second number.) Every number handed out
/// is larger than every earlier one
/// (the lost-reply cases of the fault tier's `matrix` check it on both clients). An ambiguous error after step 2
/// may leave the lock key (with its TTL) for the core's clean-up, as an ambiguous script reply does.
async fn fenced_native(
    t: &impl Transport,
    key: &str,
    fence_key: &str,
    token: &Token,
    ttl: &str,
    waiting_ttl: Ttl,
) -> Result<Option<u64>, NodeError> {
    let what = &scripts::TRANSACTION;
    let before = note(
        t,
        tx(t, what, key, &[&["GET", fence_key], &["PTTL", fence_key]]).await,
    )
    .map_err(|e| match e.kind() {
        NodeErrorKind::WrongType => fence_error(format!(
            "FENCE the fence key {fence_key} holds a value of another type"
        ))
        .with_source(e),
        _ => e,
    })?;
    let [value, pttl] = <[Reply; 2]>::try_from(before)
        .map_err(|items| scripts::unexpected_reply(what, &Reply::Array(items)))?;
    check_fence(fence_key, &value, &pttl)?;
    fence_writable(t, key, fence_key).await?;
    let recorded = t.probe().fence(key, token);
    if let Some(Some(issued)) = recorded {
        if value == Reply::Nil {
            return Err(fence_error(format!(
                "FENCE the fence key {fence_key} is missing while the lock holds this token"
            )));
        }
        if own_token_extend(t, key, token, ttl).await? {
            return Ok(Some(issued));
        }
    }
    // Recorded before the SET is sent: a SET NX applied whose reply is lost is ours on the retry.
    if recorded.is_none() && !t.probe().record_fence(key, token, None) {
        return Err(NodeError::not_applied(
            NodeErrorKind::Busy,
            format!(
                "FENCE the node has {FENCES_KEPT} fenced acquisitions without Lua in flight whose numbers are \
                 not confirmed yet; this one is refused before its lock is written (not sent)"
            ),
        ));
    }
    let written = match set_if(t, &scripts::SET_NX_PLAIN, key, token, &["NX"], ttl).await {
        Ok(written) => written,
        Err(e) => {
            if !e.is_ambiguous() && recorded.is_none() {
                t.probe().forget_fence(key, token);
            }
            return Err(e);
        }
    };
    if written {
        // Ours now; its number follows.
    } else if recorded == Some(None) {
        // Our lock from an earlier attempt whose number is unconfirmed: keep it (extending its TTL, never
        // shortening it) and issue a new number below.
        if !own_token_extend(t, key, token, ttl).await? {
            return Ok(None);
        }
    } else {
        if recorded.is_none() {
            t.probe().forget_fence(key, token);
        }
        let holder = note(t, t.command(&scripts::COMMAND, key, &["GET", key]).await);
        return match holder {
            Ok(Reply::Bytes(v)) if v == token.as_str().as_bytes() => Err(fence_error(format!(
                "FENCE the lock {key} holds this token but this node issued it no fencing number; the \
                 number can no longer be confirmed"
            ))),
            Ok(_) => {
                // Held by another: its release is to publish for a waiter (marked after the attempt here,
                // so a release in between goes unannounced and a waiter waits its usual bound).
                let _ = waiting(t, key, waiting_ttl).await;
                Ok(None)
            }
            Err(e) if e.kind() == NodeErrorKind::WrongType => {
                Err(lock_wrong_type(&scripts::SET_NX_PLAIN, key, e))
            }
            Err(e) => Err(e),
        };
    }
    let issued = note(
        t,
        tx(
            t,
            what,
            key,
            &[&["INCR", fence_key], &["GET", key], &["PTTL", fence_key]],
        )
        .await,
    );
    let replies = match issued {
        Ok(replies) => replies,
        Err(e) if e.is_ambiguous() => return Err(e),
        Err(e) => {
            t.probe().forget_fence(key, token);
            return Err(undo(t, key, token, incr_refused(fence_key, e)).await);
        }
    };
    let [fence, holder, pttl] = <[Reply; 3]>::try_from(replies)
        .map_err(|items| scripts::unexpected_reply(what, &Reply::Array(items)))?;
    if holder != Reply::Bytes(token.as_str().as_bytes().to_vec()) {
        // The lock expired (or was deleted) before the number was issued: a gap, and not ours.
        t.probe().forget_fence(key, token);
        return Ok(None);
    }
    let refused = if scripts::parse_integer(what, &pttl)? != -1 {
        format!(
            "FENCE the fence key {fence_key} has a TTL; fencing numbers would restart when it expires"
        )
    } else {
        match scripts::parse_integer(what, &fence)? {
            n if n >= 1 => {
                let n = n.unsigned_abs();
                // Replaces this acquisition's own unconfirmed record: never refused.
                t.probe().record_fence(key, token, Some(n));
                return Ok(Some(n));
            }
            _ => format!("FENCE the fence key {fence_key} does not hold a non-negative integer"),
        }
    };
    t.probe().forget_fence(key, token);
    Err(undo(t, key, token, fence_error(refused)).await)
}

/// Raises the fence counter to at least `at_least`: reads it (`inspect`), and if it is smaller adds the
/// difference with one `INCRBY`. `INCRBY` only ever adds a positive amount, so the counter never goes down:
/// a fenced acquisition that increments it in between makes the result larger than `at_least`, never
/// smaller. Plain commands, no script: the same path on every server, exact for every 64-bit value (Lua
/// numbers are doubles). Retries the read when the counter was set lower in between (by someone else).
pub(crate) async fn raise_fence(
    t: &impl Transport,
    fence_key: &str,
    at_least: u64,
) -> Result<u64, NodeError> {
    const ATTEMPTS: usize = 3;
    for _ in 0..ATTEMPTS {
        let current = match inspect(t, fence_key).await? {
            None => 0,
            Some(state) if state.ttl.is_some() => {
                return Err(NodeError::not_applied(
                    NodeErrorKind::Fence,
                    "the fence key has a TTL: its numbers would start again when it expires",
                ));
            }
            Some(state) => std::str::from_utf8(&state.value)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    NodeError::not_applied(
                        NodeErrorKind::Fence,
                        "the fence key does not hold a non-negative integer",
                    )
                })?,
        };
        if current >= at_least {
            return Ok(current);
        }
        let delta = (at_least - current).to_string();
        let reply = note(
            t,
            t.command(
                &scripts::RAISE_FENCE,
                fence_key,
                &["INCRBY", fence_key, &delta],
            )
            .await,
        )?;
        let raised = scripts::parse_integer(&scripts::RAISE_FENCE, &reply)?;
        if let Ok(raised) = u64::try_from(raised)
            && raised >= at_least
        {
            return Ok(raised);
        }
    }
    Err(NodeError::not_applied(
        NodeErrorKind::Other,
        "the fence counter kept being lowered while it was raised",
    ))
}

pub(crate) async fn acquire_fenced(
    t: &impl Transport,
    key: &str,
    fence_key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<Option<u64>, NodeError> {
    let op = || acquire_fenced_unrecorded(t, key, fence_key, token, ttl);
    recorded(t, key, op, Option::is_some).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::probe::Probe;
    use crate::ops::testing::{block_on, native};

    #[test]
    fn a_refused_incr_after_the_lock_was_written_removes_the_lock_before_the_error_returns() {
        let t = native();
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        // Step 1 finds a usable counter; step 2 writes the lock; step 3's INCR is refused (the counter was
        // replaced meanwhile); the lock is then deleted.
        t.txs.lock().unwrap().extend([
            Ok(vec![Reply::Bytes(b"4".to_vec()), Reply::Int(-1)]),
            Err(NodeError::not_applied(
                NodeErrorKind::WrongType,
                "WRONGTYPE Operation against a key holding the wrong kind of value",
            )),
        ]);
        t.replies
            .lock()
            .unwrap()
            .extend([Ok(Reply::Bytes(b"OK".to_vec())), Ok(Reply::Int(1))]);
        let err = block_on(acquire_fenced(&t, "l", "f", &token, ttl)).unwrap_err();
        assert_eq!(err.kind(), NodeErrorKind::Fence, "{err}");
        assert!(!err.is_ambiguous(), "{err}");
        assert_eq!(
            *t.sent.lock().unwrap(),
            [
                "MULTI GET PTTL",
                "SET",
                "MULTI INCR GET PTTL",
                "DELIFEQ+EXISTS"
            ]
        );
        // Nothing remembered: a later call starts afresh.
        assert_eq!(t.probe.fence("l", &token), None);
    }

    #[test]
    fn a_failed_clean_up_after_a_refused_incr_is_ambiguous_so_the_core_cleans_up() {
        let t = native();
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        t.txs.lock().unwrap().extend([
            Ok(vec![Reply::Nil, Reply::Int(-2)]),
            Err(NodeError::not_applied(
                NodeErrorKind::Other,
                "ERR increment or decrement would overflow",
            )),
        ]);
        t.replies.lock().unwrap().extend([
            Ok(Reply::Bytes(b"OK".to_vec())),
            Err(NodeError::ambiguous(
                NodeErrorKind::Connection,
                "connection reset",
            )),
        ]);
        let err = block_on(acquire_fenced(&t, "l", "f", &token, ttl)).unwrap_err();
        assert!(
            err.is_ambiguous(),
            "the lock may remain, so the outcome is unknown: {err}"
        );
        assert!(err.message().contains("exhausted"), "{err}");
    }

    #[test]
    fn a_counter_that_gained_a_ttl_meanwhile_removes_the_lock_and_is_refused() {
        let t = native();
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        t.txs.lock().unwrap().extend([
            Ok(vec![Reply::Bytes(b"1".to_vec()), Reply::Int(-1)]),
            Ok(vec![
                Reply::Int(2),
                Reply::Bytes(token.as_str().as_bytes().to_vec()),
                Reply::Int(5000),
            ]),
        ]);
        t.replies
            .lock()
            .unwrap()
            .extend([Ok(Reply::Bytes(b"OK".to_vec())), Ok(Reply::Int(1))]);
        let err = block_on(acquire_fenced(&t, "l", "f", &token, ttl)).unwrap_err();
        assert_eq!(err.kind(), NodeErrorKind::Fence, "{err}");
        assert!(err.message().contains("TTL"), "{err}");
        assert_eq!(t.sent.lock().unwrap().last().unwrap(), "DELIFEQ+EXISTS");
    }

    /// The record of native fenced acquisitions never drops an unconfirmed entry: confirmed ones make room,
    /// and with every entry unconfirmed a new acquisition is refused before it writes.
    #[test]
    fn the_fence_record_keeps_every_unconfirmed_acquisition() {
        let probe = Probe::default();
        let tokens: Vec<Token> = (0..=FENCES_KEPT)
            .map(|_| Token::random().unwrap())
            .collect();
        assert!(probe.record_fence("confirmed", &tokens[0], Some(7)));
        for (i, token) in tokens[1..FENCES_KEPT].iter().enumerate() {
            assert!(probe.record_fence(&format!("k{i}"), token, None));
        }
        // Full: the confirmed entry makes room, and every unconfirmed one is still known.
        let last = &tokens[FENCES_KEPT];
        assert!(probe.record_fence("last", last, None));
        assert_eq!(probe.fence("confirmed", &tokens[0]), None);
        assert_eq!(probe.fence("k0", &tokens[1]), Some(None));
        // Full of unconfirmed entries: refused, nothing dropped; confirming one's own entry still works.
        let more = Token::random().unwrap();
        assert!(!probe.record_fence("more", &more, None));
        assert_eq!(probe.fence("k0", &tokens[1]), Some(None));
        assert!(probe.record_fence("last", last, Some(9)));
        assert_eq!(probe.fence("last", last), Some(Some(9)));
        // A native fenced acquisition at the limit is refused before its lock is written.
        let t = native();
        for (i, token) in tokens[..FENCES_KEPT].iter().enumerate() {
            assert!(t.probe.record_fence(&format!("k{i}"), token, None));
        }
        t.txs
            .lock()
            .unwrap()
            .push_back(Ok(vec![Reply::Nil, Reply::Int(-2)]));
        let ttl = Ttl::from_millis(1000).unwrap();
        let err = block_on(acquire_fenced(&t, "l", "f", &more, ttl)).unwrap_err();
        assert_eq!(err.kind(), NodeErrorKind::Busy, "{err}");
        assert!(!err.is_ambiguous(), "{err}");
        assert_eq!(*t.sent.lock().unwrap(), ["MULTI GET PTTL"], "no SET");
    }
}
