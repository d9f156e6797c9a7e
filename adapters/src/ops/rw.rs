//! Read/write and fair locks without Lua: the plan of one watched attempt ([`rw_plan`]) and the watched
//! transaction that carries it out ([`rw_watched`]); with Lua, the `RW_PERMIT` script.

use redlease::{NodeError, NodeErrorKind, PermitOp, PermitReply, Token, Ttl, notify};

use crate::scripts::{self, Reply, Script};
use crate::slot;

use super::fence::{check_fence, fence_error, incr_refused};
use super::lock::publish_args;
use super::permit::{PERMIT_ATTEMPTS, parse_scored, replaced, server_millis};
use super::wait::mark_watched;
use super::{Transport, eval, note, path, refused_command};

/// A read/write or fair lock's acquisition as [`RW_PERMIT`](scripts::RW_PERMIT) takes it: the operation's name,
/// the claim's life (ms) and the queue limit (a fenced writer's fence key: [`PermitOp::fence_key`]); `None`
/// for the semaphore's operations.
pub(super) fn rw_permit_args(op: PermitOp<'_>) -> Option<(&'static str, u64, u32)> {
    match op {
        PermitOp::AcquireShared => Some(("shared", 1, 1)),
        PermitOp::AcquireExclusive { claim, .. } => Some(("exclusive", claim.as_millis(), 1)),
        PermitOp::AcquireFair { claim, queue } => Some(("fair", claim.as_millis(), queue.max(1))),
        _ => None,
    }
}

/// A read/write or fair lock's acquisition: the [`RW_PERMIT`](scripts::RW_PERMIT) script, or where scripts
/// cannot run (or the node is pinned to native commands) [`rw_watched`].
pub(super) async fn rw_permit(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    (name, claim, queue): (&'static str, u64, u32),
    fence_key: Option<&str>,
) -> Result<PermitReply, NodeError> {
    if let Some(fence_key) = fence_key
        && t.clustered()
    {
        slot::check_same_slot(key, fence_key)?;
    }
    let args = (name, claim.max(1), queue);
    if path(t, key).await?.is_some_and(|c| c.native_acquire()) {
        return rw_watched(t, key, token, ttl, args, fence_key).await;
    }
    let (millis, claim, queue) = (
        ttl.as_millis().to_string(),
        claim.max(1).to_string(),
        queue.to_string(),
    );
    // A blocked acquisition marks the waiter marker in the same step (see `RW_PERMIT`).
    let marker = notify::waiting_key(key);
    let mut script_args = vec![token.as_str(), &millis, name, &claim, &queue];
    script_args.extend(marker.as_deref());
    let reply = match fence_key {
        Some(fence_key) => eval(t, &scripts::RW_PERMIT, &[key, fence_key], &script_args).await,
        None => eval(t, &scripts::RW_PERMIT, &[key], &script_args).await,
    };
    match reply {
        // The server lost Lua behind the connection (the check is forgotten): nothing ran, so the acquisition
        // goes again by the path a new check finds.
        Err(e) if refused_command(&e) => {
            if path(t, key).await?.is_some_and(|c| c.native_acquire()) {
                rw_watched(t, key, token, ttl, args, fence_key).await
            } else {
                Err(e)
            }
        }
        Err(e) => Err(e),
        Ok(reply) => scripts::parse_rw_permit(reply),
    }
}

/// Scores at and above this are a fair lock's arrival markers, not expiries (`order` in
/// [`RW_PERMIT`](scripts::RW_PERMIT)).
const ARRIVAL_ORDER: u64 = 1_000_000_000_000_000;

/// Which acquisition of [`RW_PERMIT`](scripts::RW_PERMIT) a Lua-less one makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RwKind<'a> {
    Shared,
    /// A writer; with the fence counter's key and whether the counter exists (its `GET` was not nil).
    Exclusive(Option<(&'a str, bool)>),
    Fair,
}

/// What a Lua-less read/write or fair acquisition found, decided by [`rw_plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum RwOutcome {
    /// Granted now: the token's entry (`s:` or `x:` and the token) was added.
    Granted(String),
    /// The token held this entry already: refreshed (never moved earlier).
    Refreshed(String),
    /// Blocked: the time in ms until the earliest blocking entry expires (capped at the claim's life where
    /// the script caps it).
    Blocked(u64),
}

/// The decision of [`rw_plan`]: the commands of the `MULTI … EXEC` (none: nothing is written) and the
/// outcome they make.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RwPlan {
    writes: Vec<Vec<String>>,
    outcome: RwOutcome,
    /// Index in `writes` of a fenced writer's `INCR` (its reply is the fence).
    incr: Option<usize>,
    /// Index in `writes` of the closing read of the live entries (`ZRANGEBYSCORE`), checked after the `EXEC`
    /// in case the `WATCH` was lost (see [`rw_conflict`]).
    check: Option<usize>,
}

/// The operation of [`RW_PERMIT`](scripts::RW_PERMIT) decided in Rust, from what a Lua-less acquisition read
/// under `WATCH`: the server's time `now` (ms) and every member of the lock's sorted set with its score, in
/// the order `ZRANGE … WITHSCORES` gives (by score, ties by member). `ttl`, `claim` and `queue` are the
/// script's `ARGV[2]`, `ARGV[4]` and `ARGV[5]`. Same answers as the script, same errors (written as the
/// adapter classifies the script's: `Busy` for a full queue, `Fence` for a held fenced writer whose counter
/// is missing), and the same writes except that:
///
/// - a blocked reader writes nothing (the script purges expired entries and sets the key's expiry: nothing a
///   later reader or writer could tell apart, since expired entries count for nothing);
/// - the key's expiry is only raised (`PEXPIREAT … NX`, then `… GT`) to the latest entry's, as in
///   [`permit_watched`](super::permit::permit_watched) (the script sets it exactly; an exact value computed from a read could cut another
///   holder's entry short if the `WATCH` were lost);
/// - a grant or refresh reads `ZRANGEBYSCORE key (now (order WITHSCORES`, the live entries after the write,
///   for [`rw_conflict`], before the key's expiry is raised.
#[allow(clippy::too_many_arguments)]
fn rw_plan(
    key: &str,
    token: &str,
    kind: RwKind<'_>,
    ttl: u64,
    claim: u64,
    queue_limit: u32,
    now: u64,
    members: &[(Vec<u8>, u64)],
) -> Result<RwPlan, NodeError> {
    let life = claim.min(ttl);
    let (mut shared, mut excl) = (Vec::new(), Vec::new());
    // Live claims by token, in score order.
    let mut claims: Vec<(&[u8], u64)> = Vec::new();
    let mut held: Option<String> = None;
    let mut purged = false;
    for (member, score) in members {
        let score = *score;
        if score >= ARRIVAL_ORDER {
            continue;
        }
        if score <= now {
            purged = true;
            continue;
        }
        let (prefix, t) = member.split_at(member.len().min(2));
        match prefix {
            b"s:" => shared.push(score),
            b"x:" => excl.push(score),
            b"c:" => claims.push((t, score)),
            _ => {}
        }
        if t == token.as_bytes() && matches!(prefix, b"s:" | b"x:") {
            held = Some(String::from_utf8_lossy(member).into_owned());
        }
    }
    let claim_of = |t: &[u8]| claims.iter().find(|(c, _)| *c == t).map(|(_, s)| *s);
    // The queue: arrival markers whose claim is live, in arrival order; the others are removed.
    let mut queue: Vec<(&[u8], u64)> = Vec::new();
    let mut orphans: Vec<String> = Vec::new();
    for (member, score) in members {
        if *score < ARRIVAL_ORDER {
            continue;
        }
        let t = member.get(2..).unwrap_or_default();
        if claim_of(t).is_some() {
            queue.push((t, *score));
        } else {
            orphans.push(String::from_utf8_lossy(member).into_owned());
        }
    }
    let earliest = |lists: &[&[u64]]| lists.iter().flat_map(|l| l.iter()).min().copied();
    let (k, tok) = (key.to_owned(), token.to_owned());
    let num = |n: u64| n.to_string();
    let mut writes: Vec<Vec<String>> = Vec::new();
    if purged {
        writes.push(vec![
            "ZREMRANGEBYSCORE".into(),
            k.clone(),
            "-inf".into(),
            num(now),
        ]);
    }
    if !orphans.is_empty() {
        let mut zrem = vec!["ZREM".to_owned(), k.clone()];
        zrem.extend(orphans);
        writes.push(zrem);
    }
    // The latest live entry's expiry but `skip`'s (arrival markers aside): for the key's expiry.
    let live_max = |skip: &str| {
        members
            .iter()
            .filter(|(m, s)| *s > now && *s < ARRIVAL_ORDER && m.as_slice() != skip.as_bytes())
            .map(|(_, s)| *s)
            .max()
            .unwrap_or(0)
    };
    let take = |writes: &mut Vec<Vec<String>>, member: String| {
        writes.push(vec![
            "ZREM".into(),
            k.clone(),
            format!("c:{tok}"),
            format!("o:{tok}"),
        ]);
        writes.push(vec!["ZADD".into(), k.clone(), num(now + ttl), member]);
    };
    let mut incr = None;
    let outcome = if let Some(member) = held {
        if let RwKind::Exclusive(Some((fence_key, false))) = kind {
            return Err(fence_error(format!(
                "FENCE the fence key {fence_key} is missing while the writer holds this token"
            )));
        }
        writes.push(vec![
            "ZADD".into(),
            k.clone(),
            "XX".into(),
            "GT".into(),
            num(now + ttl),
            member.clone(),
        ]);
        RwOutcome::Refreshed(member)
    } else {
        match kind {
            RwKind::Shared => {
                match earliest(&[&excl, &claims.iter().map(|c| c.1).collect::<Vec<_>>()]) {
                    Some(next) => {
                        return Ok(RwPlan {
                            writes: Vec::new(),
                            outcome: RwOutcome::Blocked(next - now),
                            incr: None,
                            check: None,
                        });
                    }
                    None => {
                        let member = format!("s:{tok}");
                        writes.push(vec![
                            "ZADD".into(),
                            k.clone(),
                            num(now + ttl),
                            member.clone(),
                        ]);
                        RwOutcome::Granted(member)
                    }
                }
            }
            RwKind::Exclusive(fence) => match earliest(&[&shared, &excl]) {
                Some(next) => {
                    writes.push(vec![
                        "ZADD".into(),
                        k.clone(),
                        num(now + life),
                        format!("c:{tok}"),
                    ]);
                    RwOutcome::Blocked((next - now).min(life))
                }
                None => {
                    let member = format!("x:{tok}");
                    take(&mut writes, member.clone());
                    if let Some((fence_key, _)) = fence {
                        incr = Some(writes.len());
                        writes.push(vec!["INCR".into(), fence_key.to_owned()]);
                    }
                    RwOutcome::Granted(member)
                }
            },
            RwKind::Fair => {
                if excl.is_empty() && queue.first().is_none_or(|(t, _)| *t == token.as_bytes()) {
                    let member = format!("x:{tok}");
                    take(&mut writes, member.clone());
                    RwOutcome::Granted(member)
                } else {
                    let mine = claim_of(token.as_bytes());
                    if mine.is_none() && queue.len() >= queue_limit as usize {
                        return Err(NodeError::not_applied(
                            NodeErrorKind::Busy,
                            format!(
                                "BUSY redlease: the fair lock's queue is full ({} waiters)",
                                queue.len()
                            ),
                        ));
                    }
                    let mut next = life;
                    if let Some(first) = excl.first() {
                        next = next.min(first - now);
                    }
                    if let Some((head, _)) = queue.first() {
                        next = next.min(claim_of(head).unwrap_or(now + life) - now);
                    }
                    if mine.is_none() {
                        let mut mark = ARRIVAL_ORDER + now;
                        if let Some(&(_, last)) = queue.iter().max_by_key(|(_, s)| *s)
                            && last >= mark
                        {
                            mark = last + 1;
                        }
                        writes.push(vec![
                            "ZADD".into(),
                            k.clone(),
                            num(mark),
                            format!("o:{tok}"),
                        ]);
                    }
                    writes.push(vec![
                        "ZADD".into(),
                        k.clone(),
                        num(now + life),
                        format!("c:{tok}"),
                    ]);
                    RwOutcome::Blocked(next)
                }
            }
        }
    };
    // The key lives as long as its latest entry after the write (arrival markers aside): a refreshed entry
    // never moves earlier, a grant removes the token's claim, a blocked writer's or waiter's claim is set
    // to its life.
    let latest = match &outcome {
        RwOutcome::Refreshed(_) => live_max("").max(now + ttl),
        RwOutcome::Granted(_) => live_max(&format!("c:{tok}")).max(now + ttl),
        RwOutcome::Blocked(_) => live_max(&format!("c:{tok}")).max(now + life),
    };
    let check = match outcome {
        RwOutcome::Blocked(_) => None,
        _ => {
            writes.push(vec![
                "ZRANGEBYSCORE".into(),
                k.clone(),
                format!("({now}"),
                format!("({ARRIVAL_ORDER}"),
                "WITHSCORES".into(),
            ]);
            Some(writes.len() - 1)
        }
    };
    // After the check: an expiry computed from the read's `now` may already have passed when the EXEC runs
    // (entries of a TTL shorter than the round trip), and the key is then deleted at once, which the check
    // must not mistake for a lost entry.
    for cond in ["NX", "GT"] {
        writes.push(vec![
            "PEXPIREAT".into(),
            k.clone(),
            num(latest),
            cond.into(),
        ]);
    }
    Ok(RwPlan {
        writes,
        outcome,
        incr,
        check,
    })
}

/// Whether the live entries of a read/write or fair lock after a Lua-less grant or refresh (`after`, the
/// closing `ZRANGEBYSCORE` of [`rw_plan`]'s transaction) show that the `WATCH` was lost and the write made
/// the wrong decision: `Some(true)` when the token's `member` shares the lock with an entry it excludes (a
/// reader beside a writer, a writer beside a reader or another writer), `Some(false)` when `member` is not
/// there (a refresh of an entry purged meanwhile: `ZADD XX` added nothing), `None` when all is well. A fair
/// lock's holder (`fair`) is excluded by another holder only, as the script grants it (readers are no part
/// of a fair lock).
fn rw_conflict(member: &str, fair: bool, after: &[(Vec<u8>, u64)]) -> Option<bool> {
    if !after.iter().any(|(m, _)| m.as_slice() == member.as_bytes()) {
        return Some(false);
    }
    let writer = member.starts_with("x:") && !fair;
    let excluded = after.iter().any(|(m, _)| {
        m.as_slice() != member.as_bytes()
            && (m.starts_with(b"x:") || (writer && m.starts_with(b"s:")))
    });
    excluded.then_some(true)
}

/// A read/write or fair lock's acquisition without Lua: what [`RW_PERMIT`](scripts::RW_PERMIT) does, as a
/// read under `WATCH` and a conditional write, as [`permit_watched`](super::permit::permit_watched) does for the semaphore.
///
/// `WATCH key` (and a fenced writer's counter: `WATCH key fence`); for a fenced writer `GET fence` and
/// `PTTL fence`, checked as the script checks them (a `Fence` error, nothing written); `TIME`; `ZRANGE key 0
/// -1 WITHSCORES` (every entry, arrival markers included). [`rw_plan`] decides in Rust what the script would,
/// and its writes go in one `MULTI … EXEC`: the purge of expired entries, the removal of arrival markers whose
/// place expired, the reader's or writer's entry (`ZADD`, `XX GT` for a refresh), a blocked writer's claim
/// or a waiter's place and arrival marker, the key's expiry raised (`PEXPIREAT … NX`, `… GT`), and for a
/// fenced writer's grant `INCR fence`, whose reply is the fence (a refresh answers the counter read under the
/// `WATCH`). The server runs the `EXEC` only if neither key was touched since the `WATCH`; an aborted one
/// reads again, up to [`PERMIT_ATTEMPTS`] times, then a definite `Busy` error (nothing written). A blocked
/// attempt first marks the waiter marker ([`mark_watched`], under the armed `WATCH`, before the `EXEC`), so
/// that the `EXEC` confirms the lock did not change between the read and the marking; a blocked reader,
/// which writes nothing, sends `MULTI PTTL key EXEC` for that (an aborted one reads again). A full fair queue is a definite `Busy` error, a key of another type
/// `WrongType`, both before any write. From the `WATCH` to the `EXEC` the call holds the node's transaction
/// gate ([`Probe::tx_gate`](super::Probe::tx_gate)), and a reconnect noticed in between fails it before the transaction is sent.
///
/// Should the `WATCH` still be lost (a shared connection's own `EXEC`, fred's replay of a transaction on a new
/// connection), a grant's transaction ends with a read of the live entries ([`rw_conflict`]): a reader found
/// beside a writer, or a writer beside anyone (a fair lock's holder: beside another holder), removes its
/// entry again (with a release notification) and answers "blocked", so readers and writers never hold
/// together (a fenced writer's number then stays unused: a gap); a refresh whose entry had expired meanwhile
/// reads again.
///
/// Refused on a cluster node (`TIME` there is not routed by key, and the key's server's clock is the one that
/// counts).
pub(super) async fn rw_watched(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    args: (&'static str, u64, u32),
    fence_key: Option<&str>,
) -> Result<PermitReply, NodeError> {
    let what = &scripts::WATCHED_RW_PERMIT;
    if t.clustered() {
        return Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            "read/write and fair locks on a cluster node need Lua: without it the key's server clock cannot \
             be read in the same step (not sent)",
        ));
    }
    for _ in 0..PERMIT_ATTEMPTS {
        if let Some(reply) = rw_watched_once(t, key, token, ttl, args, fence_key).await? {
            return Ok(reply);
        }
    }
    Err(NodeError::not_applied(
        NodeErrorKind::Busy,
        format!(
            "{}: the lock changed between the read and the write {PERMIT_ATTEMPTS} times in a row (each \
             EXEC aborted by its WATCH; nothing was written)",
            what.name
        ),
    ))
}

/// The lock key of a read/write or fair lock holds another type: worded as the script words it.
fn rw_wrong_type(what: &Script, key: &str, e: NodeError) -> NodeError {
    NodeError::not_applied(
        NodeErrorKind::WrongType,
        format!(
            "the {} command was refused: WRONGTYPE the lock key {key} holds a value of another type",
            what.name
        ),
    )
    .with_source(e)
}

/// One read and conditional write of [`rw_watched`]: `None` when the `EXEC` was aborted by the `WATCH` (or
/// found a refreshed entry gone).
async fn rw_watched_once(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    (name, claim, queue): (&'static str, u64, u32),
    fence_key: Option<&str>,
) -> Result<Option<PermitReply>, NodeError> {
    let what = &scripts::WATCHED_RW_PERMIT;
    let mut gate = super::gate(t, what).await;
    t.notice_reconnections();
    let generation = t.probe().generation();
    let watch: &[&str] = match fence_key {
        Some(fence_key) => &["WATCH", key, fence_key],
        None => &["WATCH", key],
    };
    gate.watching(key);
    note(t, t.command(what, key, watch).await)?;
    let read = async {
        let fence = match fence_key {
            Some(fence_key) => {
                let value = match note(t, t.command(what, key, &["GET", fence_key]).await) {
                    Err(e) if e.kind() == NodeErrorKind::WrongType => {
                        return Err(fence_error(format!(
                            "FENCE the fence key {fence_key} holds a value of another type"
                        ))
                        .with_source(e));
                    }
                    other => other?,
                };
                let pttl = note(t, t.command(what, key, &["PTTL", fence_key]).await)?;
                check_fence(fence_key, &value, &pttl)?;
                Some(value)
            }
            None => None,
        };
        let now = server_millis(t, what, key).await?;
        let args = ["ZRANGE", key, "0", "-1", "WITHSCORES"];
        let members = match note(t, t.command(what, key, &args).await) {
            Err(e) if e.kind() == NodeErrorKind::WrongType => {
                return Err(rw_wrong_type(what, key, e));
            }
            other => parse_scored(what, other?)?,
        };
        Ok::<_, NodeError>((fence, now, members))
    }
    .await;
    let unwatch = || async {
        let _ = note(t, t.command(what, key, &["UNWATCH"]).await);
    };
    let (fence, now, members) = match read {
        Ok(read) => read,
        Err(e) => {
            unwatch().await;
            gate.unwatched();
            return Err(e);
        }
    };
    let kind = match name {
        "shared" => RwKind::Shared,
        "fair" => RwKind::Fair,
        _ => RwKind::Exclusive(fence_key.map(|f| (f, fence != Some(Reply::Nil)))),
    };
    let plan = rw_plan(
        key,
        token.as_str(),
        kind,
        ttl.as_millis(),
        claim,
        queue,
        now,
        &members,
    );
    // A blocked attempt marks the waiter marker before its EXEC, which then runs only if the lock is
    // unchanged since the read (see `mark_watched`); a blocked reader, which writes nothing, sends a bare
    // read in that EXEC.
    let plan = match plan {
        Ok(mut plan) => {
            if let RwOutcome::Blocked(next) = plan.outcome
                && let Some(marker) = notify::waiting_key(key)
            {
                if let Err(e) = mark_watched(t, what, key, &marker, next).await {
                    unwatch().await;
                    gate.unwatched();
                    return Err(e);
                }
                if plan.writes.is_empty() {
                    plan.writes.push(vec!["PTTL".into(), key.to_owned()]);
                }
            }
            Ok(plan)
        }
        Err(e) => Err(e),
    };
    let plan = match plan {
        Ok(plan) if !plan.writes.is_empty() => plan,
        other => {
            unwatch().await;
            gate.unwatched();
            return match other?.outcome {
                RwOutcome::Blocked(next) => Ok(Some(PermitReply::Full {
                    next_expiry: Some(std::time::Duration::from_millis(next)),
                })),
                // Every grant and refresh writes.
                _ => Err(scripts::unexpected_reply(
                    what,
                    &Reply::Other("a grant without a write"),
                )),
            };
        }
    };
    t.notice_reconnections();
    if t.probe().generation() != generation {
        return Err(replaced(what));
    }
    let cmds: Vec<Vec<&str>> = plan
        .writes
        .iter()
        .map(|c| c.iter().map(String::as_str).collect())
        .collect();
    let cmds: Vec<&[&str]> = cmds.iter().map(Vec::as_slice).collect();
    let result = note(t, t.transaction(what, key, &cmds).await);
    // The EXEC was sent: it ended the WATCH (or the connection did).
    gate.unwatched();
    drop(gate);
    let granted = match &plan.outcome {
        RwOutcome::Granted(member) => Some(member.as_str()),
        _ => None,
    };
    let replies = match (result, granted) {
        (Ok(replies), _) => replies,
        // A command inside the EXEC was refused (only if the WATCH was lost: a fenced writer's counter that
        // changed type or overflowed), the others ran: a granted entry is removed again.
        (Err(e), Some(member)) if !e.is_ambiguous() => {
            let e = match fence_key {
                Some(fence_key) => incr_refused(fence_key, e),
                None => e,
            };
            return match note(t, t.command(what, key, &["ZREM", key, member]).await) {
                Ok(_) => Err(e),
                Err(cleanup) => Err(NodeError::ambiguous(
                    e.kind(),
                    format!(
                        "{}; removing the entry written before it failed too ({}), so it may remain until its \
                         TTL",
                        e.message(),
                        cleanup.message()
                    ),
                )
                .with_source(e)),
            };
        }
        (Err(e), _) => return Err(e),
    };
    if replies.is_empty() {
        // Aborted by the WATCH: nothing ran. A blocked attempt (its marker and claim not confirmed) reports
        // the lock held with nothing to wait for: a waiter tries again at once, a single try reports
        // contention (reading again turned contended tries into `Busy` errors under churn). A grant or a
        // refresh reads again.
        if matches!(plan.outcome, RwOutcome::Blocked(_)) {
            return Ok(Some(PermitReply::Full {
                next_expiry: Some(std::time::Duration::ZERO),
            }));
        }
        return Ok(None);
    }
    if replies.len() != plan.writes.len() {
        return Err(scripts::unexpected_reply(what, &Reply::Array(replies)));
    }
    let member = match &plan.outcome {
        RwOutcome::Blocked(next) => {
            return Ok(Some(PermitReply::Full {
                next_expiry: Some(std::time::Duration::from_millis(*next)),
            }));
        }
        RwOutcome::Granted(member) | RwOutcome::Refreshed(member) => member,
    };
    if let Some(check) = plan.check {
        let after = parse_scored(what, replies[check].clone())?;
        let refreshed = matches!(plan.outcome, RwOutcome::Refreshed(_));
        match rw_conflict(member, name == "fair", &after) {
            // A refresh changes nobody's share: the script refreshes whatever else the key holds.
            None | Some(true) if refreshed => {}
            None => {}
            // A refreshed entry that expired meanwhile: the script would have made a new acquisition.
            Some(false) => return Ok(None),
            Some(true) => {
                // Only if the WATCH was lost: removed again, with a notification for those it held off.
                let (channel, command) = publish_args(t, key);
                let undone = note(
                    t,
                    t.command_and_publish(
                        what,
                        key,
                        &["ZREM", key, member],
                        &[command, &channel, notify::payload(token)],
                    )
                    .await,
                );
                return match undone {
                    Ok(_) => Ok(Some(PermitReply::Full { next_expiry: None })),
                    Err(cleanup) => Err(NodeError::ambiguous(
                        NodeErrorKind::Other,
                        format!(
                            "{}: the lock was granted beside another holder (the WATCH was lost) and removing \
                             the entry failed ({}); it may remain until its TTL",
                            what.name,
                            cleanup.message()
                        ),
                    )
                    .with_source(cleanup)),
                };
            }
        }
    }
    let fenced = |n: Option<u64>, reply: &Reply| {
        n.filter(|n| *n >= 1)
            .map(|fence| PermitReply::Fenced { fence })
            .ok_or_else(|| scripts::unexpected_reply(what, reply))
    };
    match (fence_key, &plan.outcome, plan.incr) {
        (Some(_), RwOutcome::Granted(_), Some(i)) => {
            let n = scripts::parse_integer(what, &replies[i])?;
            fenced(u64::try_from(n).ok(), &replies[i]).map(Some)
        }
        // A refresh by the holder (or, as the script does, a writer's attempt by a token holding a read
        // share) answers the counter's current value.
        (Some(_), RwOutcome::Refreshed(_), _) if name == "exclusive" => {
            let value = fence.unwrap_or(Reply::Nil);
            let n = match &value {
                Reply::Bytes(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()),
                _ => None,
            };
            fenced(n, &value).map(Some)
        }
        _ => Ok(Some(PermitReply::Done)),
    }
}

#[cfg(test)]
mod tests;
