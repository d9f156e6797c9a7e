//! The waiting acquisition ([`acquire_with_ttl`], a [`RedisNode::claim`](redlease::RedisNode::claim) that
//! [wants the holder's TTL](redlease::ClaimRequest::wants_ttl)): the lock or the holder's TTL in one step, with the
//! waiter marker of release notifications on the native path.

use redlease::{Claim, NodeError, NodeErrorKind, RunIdSlot, Token, Ttl, notify};

use crate::scripts::{self, Reply, Script};

use super::ledger::recorded;
use super::lock::{acquire_native, fresh_acquire_reporting};
use super::probe::checked;
use super::{Transport, eval, note, path, tx};

/// Whether `err` is the server refusing to write a waiter marker — the ACL (`NOPERM` on the marker key),
/// `maxmemory` (`OOM`, or `EXECABORT` after a refused queued command) — rather than a failure to reach it
/// (not connected, a broken connection, no answer): definite, and no retry would write it.
pub(super) fn marker_refused(err: &NodeError) -> bool {
    !err.is_ambiguous()
        && !matches!(
            err.kind(),
            NodeErrorKind::Connection | NodeErrorKind::Io | NodeErrorKind::Timeout
        )
}

/// An acquisition that reports the holder's TTL on contention, and marks the lock's waiter marker
/// ([`notify::waiting_key`]) before it reads that TTL, so that the holder's release publishes. A fresh one is
/// the usual fresh acquisition (`SET … NX GET`, one command when it wins) followed, only when the lock is
/// held, by [`waiting`] (a waiter pays one more command and round trip before it waits; a winner pays
/// nothing). A retry is the [`ACQUIRE_TTL`](scripts::ACQUIRE_TTL) script with the marker (one command
/// either way, marking in the same atomic step), or without Lua the native acquisition followed, on
/// contention, by [`waiting`].
async fn acquire_with_ttl_unrecorded(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    fresh: bool,
    report: Option<&RunIdSlot>,
) -> Result<Claim, NodeError> {
    let taken = if fresh {
        fresh_acquire_reporting(t, key, token, ttl, report).await?
    } else {
        let caps = checked(t, key, None).await?;
        if !caps.native_acquire() {
            let millis = ttl.as_millis().to_string();
            let marker = notify::waiting_key(key);
            let args: &[&str] = match &marker {
                Some(marker) => &[token.as_str(), &millis, marker],
                None => &[token.as_str(), &millis],
            };
            let reply = eval(t, &scripts::ACQUIRE_TTL, &[key], args).await?;
            return scripts::parse_claim(reply);
        }
        acquire_native(t, key, token, &ttl.as_millis().to_string()).await?
    };
    if taken {
        return Ok(Claim::Taken);
    }
    let (what, pttl) = waiting(t, key, ttl).await?;
    let remaining = match scripts::parse_integer(what, &pttl)? {
        // No expiry.
        -1 => None,
        // Gone since the attempt: free now.
        ms if ms < 0 => Some(std::time::Duration::ZERO),
        ms => Some(std::time::Duration::from_millis(ms.unsigned_abs())),
    };
    Ok(Claim::Held { remaining })
}

/// For a waiting acquisition that found `key` held: marks the lock's waiter marker
/// ([`notify::waiting_key`]) to live at least the holder's remaining TTL (or `ttl`) plus
/// [`notify::WAITING_MARGIN_MS`], never shortening it, **before** reading that TTL, and returns the `PTTL`
/// reply (with the script or command it came from). Where scripts run, the [`WAITING`](scripts::WAITING)
/// script does both in one atomic step; without Lua, one transaction `SET marker 1 NX PX m`,
/// `PEXPIRE marker m GT`, `PTTL key` (m = `ttl` plus the margin; idempotent, so a replayed transaction does
/// no harm) and, only when the holder has longer left, `PEXPIRE marker … GT`. A release landing before the
/// marker is written is seen by the read (the key is gone: the waiter tries again at once); every later one
/// publishes. Where the marker cannot be written (refused by the ACL or under `maxmemory`), the plain
/// `PTTL`: a release then publishes only if it cannot read the marker either, and the waiter otherwise
/// waits its usual bound.
pub(super) async fn waiting(
    t: &impl Transport,
    key: &str,
    ttl: Ttl,
) -> Result<(&'static Script, Reply), NodeError> {
    let millis = ttl.as_millis();
    let plain = &scripts::COMMAND;
    let Some(marker) = notify::waiting_key(key) else {
        return Ok((plain, note(t, t.command(plain, key, &["PTTL", key]).await)?));
    };
    let caps = path(t, key).await?;
    if caps.is_none_or(|c| !c.native_acquire()) {
        let script = &scripts::WAITING;
        let reply = eval(t, script, &[key], &[&millis.to_string(), &marker]).await?;
        return Ok((script, reply));
    }
    let what = &scripts::TRANSACTION;
    let hold = millis.saturating_add(notify::WAITING_MARGIN_MS);
    let hold = hold.to_string();
    let marked = note(
        t,
        tx(
            t,
            what,
            key,
            &[
                &["SET", &marker, "1", "NX", "PX", &hold],
                &["PEXPIRE", &marker, &hold, "GT"],
                &["PTTL", key],
            ],
        )
        .await,
    );
    let pttl = match marked {
        Ok(mut replies) if replies.len() == 3 => replies.swap_remove(2),
        Ok(replies) => return Err(scripts::unexpected_reply(what, &Reply::Array(replies))),
        // Refused (an ACL on the marker, `maxmemory`): the holder's TTL alone.
        Err(e) if marker_refused(&e) => {
            return Ok((plain, note(t, t.command(plain, key, &["PTTL", key]).await)?));
        }
        // Not sent, cut, or of unknown fate (a dropped connection): the attempt fails, as any attempt whose
        // command failed does. Reading the TTL alone on a connection that may have come back would report
        // contention with no marker behind it, so the holder's release would publish nothing.
        Err(e) => return Err(e),
    };
    if let Reply::Int(left) = pttl
        && let Ok(left) = u64::try_from(left)
        && left > millis
    {
        let longer = left.saturating_add(notify::WAITING_MARGIN_MS).to_string();
        // Best effort: the waiter tries again (and marks again) when the holder's TTL runs out anyway.
        let _ = note(
            t,
            t.command(plain, key, &["PEXPIRE", &marker, &longer, "GT"])
                .await,
        );
    }
    Ok((what, pttl))
}

/// The waiter marker of a Lua-less permit acquisition found blocked (a full semaphore; a read/write or fair
/// lock's blocked reader, writer or waiter) for `blocked` ms, written while the acquisition's `WATCH` on
/// `key` is armed, between its read and its `EXEC`: `SET marker 1 NX PX m` and, when the marker existed
/// already, `PEXPIRE marker m GT` (m = `blocked` plus [`notify::WAITING_MARGIN_MS`]; never shortening it).
/// The caller then sends its `EXEC` (its writes, or a bare read), which the server runs only if the key is
/// unchanged since the read: the marker was in place while the state the acquisition read still held, as
/// if marked in the read's atomic step (the scripts' way). An aborted `EXEC` reads again (and marks again).
///
/// The marker's own commands are plain ones, not queued in the `MULTI`: a marker refused by the ACL would
/// abort a whole transaction (`EXECABORT`), a blocked writer's claim with it. A refusal (ACL, `maxmemory`)
/// is skipped, and the waiter then waits its usual bound; a failure to reach the server fails the attempt,
/// as [`waiting`] does.
pub(super) async fn mark_watched(
    t: &impl Transport,
    what: &Script,
    key: &str,
    marker: &str,
    blocked: u64,
) -> Result<(), NodeError> {
    let hold = blocked
        .saturating_add(notify::WAITING_MARGIN_MS)
        .to_string();
    let set = ["SET", marker, "1", "NX", "PX", &hold];
    let created = match note(t, t.command(what, key, &set).await) {
        Ok(reply) => reply != Reply::Nil,
        Err(e) if marker_refused(&e) => return Ok(()),
        Err(e) => return Err(e),
    };
    if !created {
        match note(
            t,
            t.command(what, key, &["PEXPIRE", marker, &hold, "GT"])
                .await,
        ) {
            Err(e) if !marker_refused(&e) => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// With a `report` slot ([`ClaimRequest::run_id`](redlease::ClaimRequest::run_id)), a fresh attempt's
/// `SET … NX GET` may carry `INFO server` to fill it, as a fresh claim's does (see
/// [`fresh_acquire_reporting`]); a retry leaves it empty.
pub(crate) async fn acquire_with_ttl(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    fresh: bool,
    report: Option<&RunIdSlot>,
) -> Result<Claim, NodeError> {
    let op = || acquire_with_ttl_unrecorded(t, key, token, ttl, fresh, report);
    recorded(t, key, op, |c| matches!(c, Claim::Taken)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{block_on, native};

    #[test]
    fn a_native_wait_whose_marker_was_not_sent_fails_instead_of_waiting_unmarked() {
        let t = native();
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        // SET NX GET finds another holder; the marking transaction is not sent (the connection dropped and
        // came back): a plain PTTL would now answer, but a holder's release would publish nothing.
        t.replies
            .lock()
            .unwrap()
            .extend([Ok(Reply::Bytes(b"someone".to_vec())), Ok(Reply::Int(5000))]);
        t.txs.lock().unwrap().push_back(Err(NodeError::not_applied(
            NodeErrorKind::Connection,
            "not connected (not sent)",
        )));
        let err = block_on(acquire_with_ttl(&t, "l", &token, ttl, true, None)).unwrap_err();
        assert_eq!(err.kind(), NodeErrorKind::Connection, "{err}");
        assert_eq!(*t.sent.lock().unwrap(), ["SET", "MULTI SET PEXPIRE PTTL"]);
    }

    #[test]
    fn a_native_wait_whose_marker_is_refused_reads_the_holders_ttl_alone() {
        for kind in [
            NodeErrorKind::OutOfMemory,
            NodeErrorKind::Auth,
            NodeErrorKind::Other,
        ] {
            let t = native();
            let token = Token::random().unwrap();
            let ttl = Ttl::from_millis(1000).unwrap();
            t.replies
                .lock()
                .unwrap()
                .extend([Ok(Reply::Bytes(b"someone".to_vec())), Ok(Reply::Int(5000))]);
            t.txs
                .lock()
                .unwrap()
                .push_back(Err(NodeError::not_applied(kind, "refused")));
            let claim = block_on(acquire_with_ttl(&t, "l", &token, ttl, true, None)).unwrap();
            assert_eq!(
                claim,
                Claim::Held {
                    remaining: Some(std::time::Duration::from_millis(5000))
                },
                "{kind:?}"
            );
            assert_eq!(
                *t.sent.lock().unwrap(),
                ["SET", "MULTI SET PEXPIRE PTTL", "PTTL"]
            );
        }
    }

    #[test]
    fn a_contended_native_wait_marks_the_waiter_marker_before_reading_the_holders_ttl() {
        let t = native();
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(1000).unwrap();
        // SET NX GET finds another holder; the marking transaction reads 5 s left, so the marker is made
        // to outlive it.
        t.replies
            .lock()
            .unwrap()
            .extend([Ok(Reply::Bytes(b"someone".to_vec())), Ok(Reply::Int(1))]);
        t.txs
            .lock()
            .unwrap()
            .push_back(Ok(vec![Reply::Nil, Reply::Int(0), Reply::Int(5000)]));
        let claim = block_on(acquire_with_ttl(&t, "l", &token, ttl, true, None)).unwrap();
        assert_eq!(
            claim,
            Claim::Held {
                remaining: Some(std::time::Duration::from_millis(5000))
            }
        );
        assert_eq!(
            t.tx_args.lock().unwrap()[0],
            [
                vec!["SET", "redlease:waiting:{l}", "1", "NX", "PX", "2000"],
                vec!["PEXPIRE", "redlease:waiting:{l}", "2000", "GT"],
                vec!["PTTL", "l"],
            ]
        );
        assert_eq!(
            *t.sent.lock().unwrap(),
            ["SET", "MULTI SET PEXPIRE PTTL", "PEXPIRE"]
        );
    }
}
