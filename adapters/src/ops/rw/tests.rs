//! The plan and the watched transaction of read/write and fair locks without Lua, against a scripted
//! transport.

use super::*;
use crate::ops::permit::permit;
use crate::ops::testing::{Scripted, block_on, members, native, scored, time};

/// A plan's commands as `&str`s, for comparing.
fn cmds(plan: &RwPlan) -> Vec<Vec<&str>> {
    plan.writes
        .iter()
        .map(|c| c.iter().map(String::as_str).collect())
        .collect()
}

const NOW: u64 = 1_000_000;
const ORDER: u64 = ARRIVAL_ORDER;

/// Readers, as `RW_PERMIT`'s `shared`: a live writer or claim (a waiting writer's or a fair waiter's)
/// blocks, answered with the earliest one's time left and nothing written; expired ones count for
/// nothing and are purged in the grant's transaction.
#[test]
fn a_reader_without_lua_is_blocked_by_a_live_writer_or_claim_and_writes_nothing_then() {
    let plan = |list: &[(&str, u64)]| {
        rw_plan("k", "t", RwKind::Shared, 1000, 300, 1, NOW, &members(list)).unwrap()
    };
    let blocked = plan(&[("s:a", NOW + 900), ("c:w", NOW + 200), ("x:v", NOW + 500)]);
    assert_eq!(blocked.outcome, RwOutcome::Blocked(200));
    assert!(blocked.writes.is_empty());
    assert_eq!(plan(&[("x:v", NOW + 500)]).outcome, RwOutcome::Blocked(500));
    // Expired (a score not later than now): purged, and the reader gets in beside the live reader.
    let granted = plan(&[("x:v", NOW), ("c:w", NOW - 5), ("s:a", NOW + 1500)]);
    assert_eq!(granted.outcome, RwOutcome::Granted("s:t".into()));
    assert_eq!(
        cmds(&granted),
        [
            vec!["ZREMRANGEBYSCORE", "k", "-inf", "1000000"],
            vec!["ZADD", "k", "1001000", "s:t"],
            vec![
                "ZRANGEBYSCORE",
                "k",
                "(1000000",
                "(1000000000000000",
                "WITHSCORES"
            ],
            vec!["PEXPIREAT", "k", "1001500", "NX"],
            vec!["PEXPIREAT", "k", "1001500", "GT"],
        ]
    );
    assert_eq!(granted.check, Some(2));
    // A reader that holds its share refreshes it (never earlier), even beside a claim.
    let refresh = plan(&[("s:t", NOW + 2000), ("c:w", NOW + 200)]);
    assert_eq!(refresh.outcome, RwOutcome::Refreshed("s:t".into()));
    assert_eq!(
        cmds(&refresh)[0],
        ["ZADD", "k", "XX", "GT", "1001000", "s:t"]
    );
    assert_eq!(cmds(&refresh)[2], ["PEXPIREAT", "k", "1002000", "NX"]);
}

/// Writers, as `RW_PERMIT`'s `exclusive`: readers or a writer block it, and it records (or refreshes)
/// its claim, answered with the earliest blocking entry's time left capped at the claim's life; free, it
/// takes the lock, dropping its claim and arrival marker, and a fenced one `INCR`s the counter in the same
/// transaction.
#[test]
fn a_writer_without_lua_claims_while_blocked_and_takes_the_lock_with_its_fence_in_one_exec() {
    let list = members(&[("s:a", NOW + 700), ("s:b", NOW + 400), ("c:u", NOW + 900)]);
    let blocked = rw_plan("k", "t", RwKind::Exclusive(None), 1000, 300, 1, NOW, &list).unwrap();
    assert_eq!(blocked.outcome, RwOutcome::Blocked(300));
    assert_eq!(
        cmds(&blocked),
        [
            vec!["ZADD", "k", "1000300", "c:t"],
            vec!["PEXPIREAT", "k", "1000900", "NX"],
            vec!["PEXPIREAT", "k", "1000900", "GT"],
        ]
    );
    assert_eq!(blocked.check, None);
    // A claim's life is capped at the TTL; a short wait is reported as it is.
    let list = members(&[("s:a", NOW + 100)]);
    let blocked = rw_plan("k", "t", RwKind::Exclusive(None), 250, 300, 1, NOW, &list).unwrap();
    assert_eq!(blocked.outcome, RwOutcome::Blocked(100));
    assert_eq!(cmds(&blocked)[0], ["ZADD", "k", "1000250", "c:t"]);
    // Free (its own claim and another writer's claim do not block a writer): taken, fenced.
    let list = members(&[("c:t", NOW + 300), ("c:u", NOW + 2500), ("s:old", NOW - 1)]);
    let fence = RwKind::Exclusive(Some(("f", true)));
    let granted = rw_plan("k", "t", fence, 1000, 300, 1, NOW, &list).unwrap();
    assert_eq!(granted.outcome, RwOutcome::Granted("x:t".into()));
    assert_eq!(
        cmds(&granted),
        [
            vec!["ZREMRANGEBYSCORE", "k", "-inf", "1000000"],
            vec!["ZREM", "k", "c:t", "o:t"],
            vec!["ZADD", "k", "1001000", "x:t"],
            vec!["INCR", "f"],
            vec![
                "ZRANGEBYSCORE",
                "k",
                "(1000000",
                "(1000000000000000",
                "WITHSCORES"
            ],
            vec!["PEXPIREAT", "k", "1002500", "NX"],
            vec!["PEXPIREAT", "k", "1002500", "GT"],
        ]
    );
    assert_eq!((granted.incr, granted.check), (Some(3), Some(4)));
    // The holder's retry refreshes (no INCR); with its counter gone, a Fence error and nothing written.
    let list = members(&[("x:t", NOW + 800)]);
    let refresh = rw_plan("k", "t", fence, 1000, 300, 1, NOW, &list).unwrap();
    assert_eq!(refresh.outcome, RwOutcome::Refreshed("x:t".into()));
    assert_eq!(refresh.incr, None);
    let missing = RwKind::Exclusive(Some(("f", false)));
    let err = rw_plan("k", "t", missing, 1000, 300, 1, NOW, &list).unwrap_err();
    assert_eq!(err.kind(), NodeErrorKind::Fence, "{err}");
    assert!(!err.is_ambiguous());
    // Another writer holds it: blocked, the claim recorded.
    let list = members(&[("x:u", NOW + 50)]);
    let blocked = rw_plan("k", "t", fence, 1000, 300, 1, NOW, &list).unwrap();
    assert_eq!(blocked.outcome, RwOutcome::Blocked(50));
    assert_eq!(blocked.incr, None);
}

/// Fair locks, as `RW_PERMIT`'s `fair`: only the head of the queue (arrival markers scored 10^15 + arrival,
/// whose place is live) takes a free lock; a newcomer joins at the end (one past the last marker when that
/// is not earlier); markers whose place expired are removed and count for nothing; a full queue refuses
/// a new waiter (`Busy`, nothing written) but not one already in it.
#[test]
fn a_fair_lock_without_lua_serves_the_head_of_the_queue_and_refuses_a_full_queue() {
    let fair = |token: &str, limit: u32, list: &[(&str, u64)]| {
        rw_plan(
            "k",
            token,
            RwKind::Fair,
            10_000,
            2_000,
            limit,
            NOW,
            &members(list),
        )
    };
    let queue = [
        ("o:a", ORDER + NOW - 20),
        ("o:b", ORDER + NOW - 10),
        ("o:z", ORDER + NOW - 30),
        ("c:a", NOW + 1500),
        ("c:b", NOW + 1800),
    ];
    // `z`'s place expired: its marker goes, and `a` is the head.
    let second = fair("b", 10, &queue).unwrap();
    assert_eq!(second.outcome, RwOutcome::Blocked(1500));
    assert_eq!(
        cmds(&second),
        [
            vec!["ZREM", "k", "o:z"],
            vec!["ZADD", "k", "1002000", "c:b"],
            vec!["PEXPIREAT", "k", "1002000", "NX"],
            vec!["PEXPIREAT", "k", "1002000", "GT"],
        ]
    );
    let head = fair("a", 10, &queue).unwrap();
    assert_eq!(head.outcome, RwOutcome::Granted("x:a".into()));
    assert_eq!(cmds(&head)[1], ["ZREM", "k", "c:a", "o:a"]);
    assert_eq!(cmds(&head)[2], ["ZADD", "k", "1010000", "x:a"]);
    // A holder blocks even the head; a newcomer joins after the last marker (here later than its own
    // arrival: one past it).
    let mut held = queue.to_vec();
    held.push(("x:h", NOW + 700));
    held.push(("o:c", ORDER + NOW + 5));
    held.push(("c:c", NOW + 1900));
    assert_eq!(
        fair("a", 10, &held).unwrap().outcome,
        RwOutcome::Blocked(700)
    );
    let newcomer = fair("n", 10, &held).unwrap();
    assert_eq!(newcomer.outcome, RwOutcome::Blocked(700));
    assert!(cmds(&newcomer).contains(&vec!["ZADD", "k", "1000000001000006", "o:n"]));
    // Three waiters queue (z's marker does not count): a fourth is refused with a limit of 3, nothing
    // written; a waiter already in the queue refreshes its place.
    let err = fair("n", 3, &held).unwrap_err();
    assert_eq!(err.kind(), NodeErrorKind::Busy, "{err}");
    assert!(!err.is_ambiguous());
    assert!(err.message().contains("queue is full (3 waiters)"), "{err}");
    assert!(fair("n", 4, &held).is_ok());
    assert_eq!(
        fair("b", 3, &held).unwrap().outcome,
        RwOutcome::Blocked(700)
    );
    // An empty queue: the newcomer takes the free lock at once.
    assert_eq!(
        fair("n", 1, &[]).unwrap().outcome,
        RwOutcome::Granted("x:n".into())
    );
}

/// The closing read of a grant's transaction: a reader beside a writer, or a writer beside anyone, is a
/// conflict (only possible if the `WATCH` was lost); a refreshed entry that is gone reads again.
#[test]
fn a_lost_watch_is_caught_by_the_grants_closing_read() {
    let after = |list: &[(&str, u64)]| members(list);
    let rw = |member, list: &[(&str, u64)]| rw_conflict(member, false, &after(list));
    assert_eq!(rw("s:t", &[("s:t", 1), ("s:u", 1), ("c:w", 1)]), None);
    assert_eq!(rw("s:t", &[("s:t", 1), ("x:w", 1)]), Some(true));
    assert_eq!(rw("x:t", &[("x:t", 1), ("s:r", 1)]), Some(true));
    assert_eq!(rw("x:t", &[("x:t", 1), ("x:u", 1)]), Some(true));
    assert_eq!(rw("x:t", &[("x:t", 1), ("c:u", 1)]), None);
    assert_eq!(rw("x:t", &[("x:u", 1)]), Some(false));
    // A fair lock's holder: another holder only (the script grants it beside readers' entries).
    let fair = |list: &[(&str, u64)]| rw_conflict("x:t", true, &after(list));
    assert_eq!(fair(&[("x:t", 1), ("s:r", 1)]), None);
    assert_eq!(fair(&[("x:t", 1), ("x:u", 1)]), Some(true));
}

/// The whole Lua-less fenced writer through a transport: `WATCH` of both keys, the counter checked, the
/// set read with the server's time, one `EXEC` whose `INCR` reply is the fence; an aborted `EXEC` reads
/// again.
#[test]
fn a_fenced_writer_without_lua_watches_both_keys_and_takes_its_fence_from_the_exec() {
    let t = native();
    let token = Token::random().unwrap();
    let tok = token.as_str().to_owned();
    let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
    let read = |t: &Scripted| {
        t.replies.lock().unwrap().extend([
            ok(),
            Ok(Reply::Bytes(b"41".to_vec())),
            Ok(Reply::Int(-1)),
            time(NOW),
            scored(&[("s:gone", NOW - 1)]),
        ]);
    };
    read(&t);
    t.txs.lock().unwrap().push_back(Ok(vec![]));
    read(&t);
    let x = format!("x:{tok}");
    t.txs.lock().unwrap().push_back(Ok(vec![
        Reply::Int(1),
        Reply::Int(0),
        Reply::Int(1),
        Reply::Int(42),
        scored(&[(&x, NOW + 1000)]).unwrap(),
        Reply::Int(1),
        Reply::Int(0),
    ]));
    let ttl = Ttl::from_millis(1000).unwrap();
    let write = PermitOp::AcquireExclusive {
        claim: Ttl::from_millis(300).unwrap(),
        fence: Some("f"),
    };
    let reply = block_on(permit(&t, "k", &token, ttl, write)).unwrap();
    assert_eq!(reply, PermitReply::Fenced { fence: 42 });
    let round = ["WATCH", "GET", "PTTL", "TIME", "ZRANGE"];
    let exec = "MULTI ZREMRANGEBYSCORE ZREM ZADD INCR ZRANGEBYSCORE PEXPIREAT PEXPIREAT";
    let mut want: Vec<&str> = round.to_vec();
    want.push(exec);
    want.extend(round);
    want.push(exec);
    assert_eq!(*t.sent.lock().unwrap(), want);
    assert_eq!(t.tx_args.lock().unwrap()[1][3], ["INCR", "f"]);
    // The grant is a write of "k" on this connection: after the connection is replaced, a durability
    // `WAIT` for it must be refused rather than counted on the new one.
    assert!(!t.probe().written_before_a_reconnect("k"));
    t.probe().forget();
    assert!(
        t.probe().written_before_a_reconnect("k"),
        "a fenced grant was not recorded as a write"
    );
    // A counter with a TTL: refused before any write, the WATCH ended.
    let t = native();
    t.replies.lock().unwrap().extend([
        ok(),
        Ok(Reply::Bytes(b"41".to_vec())),
        Ok(Reply::Int(5000)),
        ok(),
    ]);
    let err = block_on(permit(&t, "k", &token, ttl, write)).unwrap_err();
    assert_eq!(err.kind(), NodeErrorKind::Fence, "{err}");
    assert_eq!(*t.sent.lock().unwrap(), ["WATCH", "GET", "PTTL", "UNWATCH"]);
    // A blocked reader: no entry written; the waiter marker marked to outlive the wait, then an EXEC
    // (a bare read) confirms the lock unchanged since the read.
    let t = native();
    t.replies
        .lock()
        .unwrap()
        .extend([ok(), time(NOW), scored(&[("x:w", NOW + 250)]), ok()]);
    t.txs.lock().unwrap().push_back(Ok(vec![Reply::Int(250)]));
    let reply = block_on(permit(&t, "k", &token, ttl, PermitOp::AcquireShared)).unwrap();
    assert_eq!(
        reply,
        PermitReply::Full {
            next_expiry: Some(std::time::Duration::from_millis(250))
        }
    );
    assert_eq!(
        *t.sent.lock().unwrap(),
        ["WATCH", "TIME", "ZRANGE", "SET", "MULTI PTTL"]
    );
}

/// Without Lua a blocked writer marks the waiter marker before the `EXEC` that records its claim (plain
/// commands: a marker the ACL refuses must not abort the claim's transaction).
#[test]
fn a_blocked_writer_without_lua_marks_the_waiter_marker_before_its_claim() {
    let t = native();
    let token = Token::random().unwrap();
    let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
    let ttl = Ttl::from_millis(1000).unwrap();
    let write = PermitOp::AcquireExclusive {
        claim: Ttl::from_millis(2000).unwrap(),
        fence: None,
    };
    t.replies.lock().unwrap().extend([
        ok(),
        time(NOW),
        scored(&[("s:r", NOW + 300)]),
        Ok(Reply::Nil),
        Ok(Reply::Int(1)),
    ]);
    t.txs
        .lock()
        .unwrap()
        .push_back(Ok(vec![Reply::Int(1), Reply::Int(0), Reply::Int(1)]));
    let reply = block_on(permit(&t, "k", &token, ttl, write)).unwrap();
    assert_eq!(
        reply,
        PermitReply::Full {
            next_expiry: Some(std::time::Duration::from_millis(300))
        }
    );
    assert_eq!(
        *t.sent.lock().unwrap(),
        [
            "WATCH",
            "TIME",
            "ZRANGE",
            "SET",
            "PEXPIRE",
            "MULTI ZADD PEXPIREAT PEXPIREAT"
        ]
    );
}

/// Should the `WATCH` be lost, a reader granted beside a writer removes its share again (publishing) and
/// answers "blocked".
#[test]
fn a_reader_granted_beside_a_writer_after_a_lost_watch_removes_its_share_again() {
    let t = native();
    let token = Token::random().unwrap();
    let s = format!("s:{}", token.as_str());
    let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
    t.replies
        .lock()
        .unwrap()
        .extend([ok(), time(NOW), scored(&[]), Ok(Reply::Int(1))]);
    t.txs.lock().unwrap().push_back(Ok(vec![
        Reply::Int(1),
        scored(&[(&s, NOW + 1000), ("x:w", NOW + 900)]).unwrap(),
        Reply::Int(1),
        Reply::Int(0),
    ]));
    let ttl = Ttl::from_millis(1000).unwrap();
    let reply = block_on(permit(&t, "k", &token, ttl, PermitOp::AcquireShared)).unwrap();
    assert_eq!(reply, PermitReply::Full { next_expiry: None });
    assert_eq!(
        t.sent.lock().unwrap().last().map(String::as_str),
        Some("ZREM+PUBLISH")
    );
    assert_eq!(t.tx_args.lock().unwrap()[1][0], ["ZREM", "k", s.as_str()]);
}

/// Without Lua a read/write or fair lock's holder (`s:`/`x:` and its token) is extended and released as
/// the script finds it: the extension refreshes that entry, the release removes it with the token's
/// claim and arrival marker, and publishes only when it removed a held entry.
#[test]
fn a_read_write_holder_without_lua_is_extended_and_released_by_its_entry() {
    let token = Token::random().unwrap();
    let tok = token.as_str().to_owned();
    let ttl = Ttl::from_millis(1000).unwrap();
    let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
    let t = native();
    t.replies.lock().unwrap().extend([
        ok(),
        time(NOW),
        Ok(Reply::Array(vec![
            Reply::Nil,
            Reply::Bytes(b"1000400".to_vec()),
            Reply::Nil,
        ])),
    ]);
    t.txs.lock().unwrap().push_back(Ok(vec![
        Reply::Int(0),
        Reply::Int(0),
        Reply::Bytes(b"1001000".to_vec()),
        Reply::Int(0),
        Reply::Int(1),
    ]));
    let reply = block_on(permit(&t, "k", &token, ttl, PermitOp::Extend)).unwrap();
    assert_eq!(reply, PermitReply::Done);
    assert_eq!(
        *t.sent.lock().unwrap(),
        [
            "WATCH",
            "TIME",
            "ZMSCORE",
            "MULTI ZREMRANGEBYSCORE ZADD ZSCORE PEXPIREAT PEXPIREAT"
        ]
    );
    let s = format!("s:{tok}");
    assert_eq!(
        t.tx_args.lock().unwrap()[0][1],
        ["ZADD", "k", "XX", "GT", "1001000", s.as_str()]
    );
    // Release of a writer: its entry, claim and marker go; published once (a waiter marker exists).
    let t = native();
    t.replies
        .lock()
        .unwrap()
        .extend([time(NOW), Ok(Reply::Int(1)), Ok(Reply::Int(1))]);
    t.txs
        .lock()
        .unwrap()
        .push_back(Ok(vec![Reply::Int(0), Reply::Int(0), Reply::Int(1)]));
    let reply = block_on(permit(&t, "k", &token, ttl, PermitOp::Release)).unwrap();
    assert_eq!(reply, PermitReply::Done);
    let (c, o, x) = (format!("c:{tok}"), format!("o:{tok}"), format!("x:{tok}"));
    assert_eq!(
        t.tx_args.lock().unwrap()[0][1..],
        [
            vec!["ZREM", "k", c.as_str(), o.as_str()],
            vec!["ZREM", "k", tok.as_str(), s.as_str(), x.as_str()],
        ]
    );
    assert_eq!(
        *t.sent.lock().unwrap(),
        [
            "TIME",
            "MULTI ZREMRANGEBYSCORE ZREM ZREM",
            "EXISTS",
            "PUBLISH"
        ]
    );
    // A waiting writer that gives up: its claim goes, nothing was held, nothing published.
    let t = native();
    t.replies.lock().unwrap().push_back(time(NOW));
    t.txs
        .lock()
        .unwrap()
        .push_back(Ok(vec![Reply::Int(0), Reply::Int(2), Reply::Int(0)]));
    let reply = block_on(permit(&t, "k", &token, ttl, PermitOp::Release)).unwrap();
    assert_eq!(reply, PermitReply::NotHeld);
    assert_eq!(
        *t.sent.lock().unwrap(),
        ["TIME", "MULTI ZREMRANGEBYSCORE ZREM ZREM"]
    );
}
