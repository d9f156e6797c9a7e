//! Several keys at once: batched extension ([`extend_many`], grouped by Cluster slot) and the multi-key
//! scripts ([`multi_key`]).

use redlease::{NodeError, NodeErrorKind, notify};

use crate::Commands;
use crate::scripts::{self, Reply};
use crate::slot;

use super::lock::WATCHED_ATTEMPTS;
use super::{Transport, Way, eval, note, path, script_unavailable, way};

/// [`extend_watched`](super::lock::extend_watched) for many keys of one slot at once, in three round trips whatever their number (one by
/// one, each extension would hold the transaction gate for three): `WATCH` every key, `MGET` them, and
/// `MULTI`, `PEXPIRE key ttl GT` for each key holding its item's token, `EXEC` (or `UNWATCH` when none
/// does). An `EXEC` aborted by the `WATCH` (one of the keys changed or expired) starts it again, at most
/// [`WATCHED_ATTEMPTS`] times. A key of another type reads as nil (`MGET`): "not extended", as the script
/// answers.
async fn extend_many_watched(
    t: &impl Transport,
    items: &[redlease::ExtendItem<'_>],
) -> Result<Vec<bool>, NodeError> {
    let what = &scripts::WATCHED_EXTEND;
    let Some(first) = items.first() else {
        return Ok(Vec::new());
    };
    let keys: Vec<&str> = items.iter().map(|i| i.key).collect();
    let ttls: Vec<String> = items
        .iter()
        .map(|i| i.ttl.as_millis().to_string())
        .collect();
    for _ in 0..WATCHED_ATTEMPTS {
        let mut gate = super::gate(t, what).await;
        t.notice_reconnections();
        let generation = t.probe().generation();
        let watch: Vec<&str> = std::iter::once("WATCH")
            .chain(keys.iter().copied())
            .collect();
        gate.watching(first.key);
        note(t, t.command(what, first.key, &watch).await)?;
        let mget: Vec<&str> = std::iter::once("MGET")
            .chain(keys.iter().copied())
            .collect();
        let values = match note(t, t.command(what, first.key, &mget).await) {
            Ok(Reply::Array(values)) if values.len() == items.len() => values,
            other => {
                if t.command(what, first.key, &["UNWATCH"]).await.is_ok() {
                    gate.unwatched();
                }
                return match other {
                    Ok(reply) => Err(scripts::unexpected_reply(what, &reply)),
                    Err(e) => Err(e),
                };
            }
        };
        let ours: Vec<bool> = items
            .iter()
            .zip(&values)
            .map(|(item, value)| {
                matches!(value, Reply::Bytes(v) if v.as_slice() == item.token.as_str().as_bytes())
            })
            .collect();
        let cmds: Vec<[&str; 4]> = items
            .iter()
            .zip(&ttls)
            .zip(&ours)
            .filter(|(_, ours)| **ours)
            .map(|((item, ttl), _)| ["PEXPIRE", item.key, ttl.as_str(), "GT"])
            .collect();
        if cmds.is_empty() {
            if note(t, t.command(what, first.key, &["UNWATCH"]).await).is_ok() {
                gate.unwatched();
            }
            return Ok(ours);
        }
        t.notice_reconnections();
        if t.probe().generation() != generation {
            return Err(NodeError::not_applied(
                NodeErrorKind::Connection,
                format!(
                    "{}: the connection was replaced between WATCH and EXEC, so the extension could not be \
                     made conditional (not sent)",
                    what.name
                ),
            ));
        }
        let cmds: Vec<&[&str]> = cmds.iter().map(|c| &c[..]).collect();
        let replies = note(t, t.transaction(what, first.key, &cmds).await);
        // The EXEC was sent: it ended the WATCH (or the connection did).
        gate.unwatched();
        let replies = replies?;
        if replies.is_empty() {
            // EXEC aborted: a key was touched since the WATCH.
            continue;
        }
        if replies.len() != cmds.len() || !replies.iter().all(|r| matches!(r, Reply::Int(0 | 1))) {
            return Err(scripts::unexpected_reply(what, &Reply::Array(replies)));
        }
        return Ok(ours);
    }
    Err(NodeError::not_applied(
        NodeErrorKind::Other,
        format!(
            "{}: a key changed between WATCH and EXEC {WATCHED_ATTEMPTS} times in a row, so nothing was \
             extended",
            what.name
        ),
    ))
}

/// The most leases one batched extension call carries (as Redisson's renewal batches): about 100 µs of
/// server time for the script, short enough not to stall other clients.
pub(crate) const EXTEND_MANY_LIMIT: usize = 100;

/// Polls every future to completion, concurrently, and returns their outputs in order.
async fn join_all<T>(
    mut futures: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + '_>>>,
) -> Vec<T> {
    let mut out: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in futures.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// Batched extension: lock keys by [`extend_locks_many`], permits ([`ExtendItem::permit`](redlease::ExtendItem))
/// by [`extend_permits_many`]; the answers in the items' order.
async fn extend_many_unrecorded(
    t: &impl Transport,
    items: &[redlease::ExtendItem<'_>],
) -> Result<Vec<bool>, NodeError> {
    if !items.iter().any(|i| i.permit) {
        return extend_locks_many(t, items).await;
    }
    let (permits, locks): (Vec<usize>, Vec<usize>) =
        (0..items.len()).partition(|&i| items[i].permit);
    let mut out = vec![false; items.len()];
    if !locks.is_empty() {
        let group: Vec<redlease::ExtendItem<'_>> = locks.iter().map(|&i| items[i]).collect();
        for (&i, flag) in locks.iter().zip(extend_locks_many(t, &group).await?) {
            out[i] = flag;
        }
    }
    let group: Vec<redlease::ExtendItem<'_>> = permits.iter().map(|&i| items[i]).collect();
    for (&i, flag) in permits.iter().zip(extend_permits_many(t, &group).await?) {
        out[i] = flag;
    }
    Ok(out)
}

/// The items grouped by Redis Cluster slot (one group on a single server): each group's item indices.
fn slot_groups(t: &impl Transport, items: &[redlease::ExtendItem<'_>]) -> Vec<(u16, Vec<usize>)> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let slot = if t.clustered() {
            slot::hash_slot(item.key.as_bytes())
        } else {
            0
        };
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, members)) => members.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups
}

/// Batched extension of permits: the [`EXTEND_PERMITS`](scripts::EXTEND_PERMITS) script, one call per slot,
/// concurrently. Without scripts (or on a node pinned to native commands) an
/// [`Unsupported`](NodeErrorKind::Unsupported) error, nothing sent: the core then extends each permit on its
/// own ([`permit_watched`](super::permit::permit_watched)).
async fn extend_permits_many(
    t: &impl Transport,
    items: &[redlease::ExtendItem<'_>],
) -> Result<Vec<bool>, NodeError> {
    let Some(first) = items.first() else {
        return Ok(Vec::new());
    };
    let caps = path(t, first.key).await?;
    if !caps.is_none_or(|c| c.lua && c.commands != Commands::Native) {
        return Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            "permits are extended in a batch by script only (not sent)",
        ));
    }
    let groups = slot_groups(t, items);
    let ttls: Vec<String> = items
        .iter()
        .map(|i| i.ttl.as_millis().to_string())
        .collect();
    let calls = groups
        .iter()
        .map(|(_, members)| {
            let keys: Vec<&str> = members.iter().map(|&i| items[i].key).collect();
            let mut args: Vec<&str> = members.iter().map(|&i| items[i].token.as_str()).collect();
            args.extend(members.iter().map(|&i| ttls[i].as_str()));
            Box::pin(async move {
                let reply = eval(t, &scripts::EXTEND_PERMITS, &keys, &args).await?;
                scripts::parse_flags(&scripts::EXTEND_PERMITS, reply, keys.len())
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send + '_>>
        })
        .collect();
    let results: Vec<Result<Vec<bool>, NodeError>> = join_all(calls).await;
    let mut out = vec![false; items.len()];
    for ((_, members), result) in groups.iter().zip(results) {
        for (&i, flag) in members.iter().zip(result?) {
            out[i] = flag;
        }
    }
    Ok(out)
}

/// Batched extension of lock keys: the [`EXTEND_MANY`](scripts::EXTEND_MANY) script, one call per slot on a
/// cluster; where scripts cannot run (or the node is pinned to native commands), the batched watched
/// extension ([`extend_many_watched`]), one per slot.
async fn extend_locks_many(
    t: &impl Transport,
    items: &[redlease::ExtendItem<'_>],
) -> Result<Vec<bool>, NodeError> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    // As a single extension goes (see [`Way`]).
    let way = way(t, items[0].key, |c| {
        !c.lua || c.commands == Commands::Native
    })
    .await?;
    // Group by slot on a cluster (a script's or a WATCH's keys must share one); one group otherwise.
    let groups = slot_groups(t, items);
    // One watched transaction per slot, one after the other (each holds the node's transaction gate).
    let watched = async || {
        let mut out = vec![false; items.len()];
        for (_, members) in &groups {
            let group: Vec<redlease::ExtendItem<'_>> = members.iter().map(|&i| items[i]).collect();
            for (&i, flag) in members.iter().zip(extend_many_watched(t, &group).await?) {
                out[i] = flag;
            }
        }
        Ok(out)
    };
    if way == Way::Native {
        return watched().await;
    }
    // The leases of a batch usually share one TTL: its text is made once per run of equal TTLs.
    let mut texts: Vec<(u64, String)> = Vec::new();
    let ttls: Vec<usize> = items
        .iter()
        .map(|item| {
            let ms = item.ttl.as_millis();
            if texts.last().is_none_or(|(last, _)| *last != ms) {
                texts.push((ms, ms.to_string()));
            }
            texts.len() - 1
        })
        .collect();
    let calls = groups
        .iter()
        .map(|(_, members)| {
            let keys: Vec<&str> = members.iter().map(|&i| items[i].key).collect();
            let mut args: Vec<&str> = members.iter().map(|&i| items[i].token.as_str()).collect();
            args.extend(members.iter().map(|&i| texts[ttls[i]].1.as_str()));
            Box::pin(async move {
                let reply = eval(t, &scripts::EXTEND_MANY, &keys, &args).await?;
                scripts::parse_flags(&scripts::EXTEND_MANY, reply, keys.len())
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send + '_>>
        })
        .collect();
    let results: Vec<Result<Vec<bool>, NodeError>> = join_all(calls).await;
    if way == Way::ScriptElseNative
        && results
            .iter()
            .any(|r| r.as_ref().is_err_and(script_unavailable))
    {
        // No script ran where it was refused (no Lua, or `EVAL` denied), and an extension never shortens a
        // key: where one ran, the watched `PEXPIRE … GT` only extends it again.
        return watched().await;
    }
    let mut out = vec![false; items.len()];
    for ((_, members), result) in groups.iter().zip(results) {
        // One slot's failure fails the call: the core counts the node as failed for every lease of it.
        for (&i, flag) in members.iter().zip(result?) {
            out[i] = flag;
        }
    }
    Ok(out)
}

pub(crate) async fn extend_many(
    t: &impl Transport,
    items: &[redlease::ExtendItem<'_>],
) -> Result<Vec<bool>, NodeError> {
    t.notice_reconnections();
    let generation = t.probe().generation();
    let r = extend_many_unrecorded(t, items).await;
    if let Ok(flags) = &r {
        let written = items.iter().zip(flags).filter(|(_, ok)| **ok);
        t.probe()
            .wrote_all(written.map(|(item, _)| item.key), generation);
    }
    r
}

/// Several keys in one step ([`RedisNode::multi_key`](redlease::RedisNode::multi_key)): the
/// [`ACQUIRE_MANY`](scripts::ACQUIRE_MANY), [`EXTEND_MANY`](scripts::EXTEND_MANY) or
/// [`RELEASE_MANY`](scripts::RELEASE_MANY) script. `Unsupported`, writing nothing, where one script cannot
/// do it: keys (or fence counters) in different Redis Cluster slots, or a server without Lua (or a node
/// pinned to native commands) — the core then takes the keys one at a time.
pub(crate) async fn multi_key(
    t: &impl Transport,
    items: &[redlease::MultiKeyItem<'_>],
    op: redlease::MultiKeyOp,
) -> Result<redlease::MultiKeyReply, NodeError> {
    use redlease::{MultiKeyOp, MultiKeyReply};
    let unsupported =
        |why: &'static str| Err(NodeError::not_applied(NodeErrorKind::Unsupported, why));
    let Some(first) = items.first() else {
        return Ok(match op {
            MultiKeyOp::Acquire { .. } => MultiKeyReply::Taken { fences: Vec::new() },
            _ => MultiKeyReply::Done(Vec::new()),
        });
    };
    if t.clustered() {
        let slot = slot::hash_slot(first.key.as_bytes());
        let one_slot = items.iter().all(|i| {
            slot::hash_slot(i.key.as_bytes()) == slot
                && i.fence_key
                    .is_none_or(|f| slot::hash_slot(f.as_bytes()) == slot)
        });
        if !one_slot {
            return unsupported(
                "keys in different Redis Cluster slots cannot be taken in one step (one hash tag puts them in one)",
            );
        }
    }
    let caps = path(t, first.key).await?;
    if !caps.is_none_or(|c| c.lua && c.commands != Commands::Native) {
        return unsupported("without scripts, several keys are taken one at a time");
    }
    let keys: Vec<&str> = items.iter().map(|i| i.key).collect();
    let tokens = items.iter().map(|i| i.token.as_str());
    t.notice_reconnections();
    let generation = t.probe().generation();
    match op {
        MultiKeyOp::Acquire { ttl } => {
            let mut all_keys = keys.clone();
            let mut indices = Vec::with_capacity(items.len());
            for item in items {
                match item.fence_key {
                    Some(fence_key) => {
                        all_keys.push(fence_key);
                        indices.push(all_keys.len().to_string());
                    }
                    None => indices.push("0".to_owned()),
                }
            }
            let ttl = ttl.as_millis().to_string();
            let mut args: Vec<&str> = vec![&ttl];
            args.extend(tokens);
            args.extend(indices.iter().map(String::as_str));
            let reply = eval(t, &scripts::ACQUIRE_MANY, &all_keys, &args).await?;
            let reply = scripts::parse_acquire_many(reply, items.len())?;
            if matches!(reply, MultiKeyReply::Taken { .. }) {
                t.probe().wrote_all(keys.iter().copied(), generation);
            }
            Ok(reply)
        }
        MultiKeyOp::Extend { ttl } => {
            let ttl = ttl.as_millis().to_string();
            let mut args: Vec<&str> = tokens.collect();
            args.extend(items.iter().map(|_| ttl.as_str()));
            let reply = eval(t, &scripts::EXTEND_MANY, &keys, &args).await?;
            let flags = scripts::parse_flags(&scripts::EXTEND_MANY, reply, items.len())?;
            let written = keys.iter().zip(&flags).filter(|(_, ok)| **ok);
            t.probe().wrote_all(written.map(|(k, _)| *k), generation);
            Ok(MultiKeyReply::Done(flags))
        }
        MultiKeyOp::Release => {
            let command = if t.clustered() { "SPUBLISH" } else { "PUBLISH" };
            let channels: Vec<String> = keys.iter().map(|k| notify::channel(k)).collect();
            // Each key's waiter marker (`''`: none, so its deletion always publishes).
            let markers: Vec<String> = keys
                .iter()
                .map(|k| notify::waiting_key(k).unwrap_or_default())
                .collect();
            let mut args: Vec<&str> = tokens.collect();
            args.push(command);
            args.extend(channels.iter().map(String::as_str));
            args.extend(markers.iter().map(String::as_str));
            let reply = eval(t, &scripts::RELEASE_MANY, &keys, &args).await?;
            let flags = scripts::parse_flags(&scripts::RELEASE_MANY, reply, items.len())?;
            for item in items {
                t.probe().forget_fence(item.key, item.token);
            }
            Ok(MultiKeyReply::Done(flags))
        }
        _ => unsupported("an operation this adapter does not know"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Verb;
    use crate::ops::probe::Probe;
    use crate::ops::testing::{block_on, native};
    use std::sync::Mutex;

    use redlease::{Token, Ttl};

    use crate::Capabilities;
    use crate::scripts::Script;

    /// A transport with scripts that records each script call's keys and arguments and answers every key
    /// of `EXTEND_MANY` with 1.
    #[derive(Default)]
    struct ScriptCalls {
        probe: Probe,
        calls: Mutex<Vec<(Vec<String>, Vec<String>)>>,
    }

    impl Transport for ScriptCalls {
        async fn script_once(
            &self,
            _: Verb,
            _: &Script,
            keys: &[&str],
            args: &[&str],
        ) -> Result<Reply, NodeError> {
            let owned = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect();
            self.calls.lock().unwrap().push((owned(keys), owned(args)));
            Ok(Reply::Array(keys.iter().map(|_| Reply::Int(1)).collect()))
        }
        async fn command(&self, _: &Script, _: &str, args: &[&str]) -> Result<Reply, NodeError> {
            panic!("no command may be sent here: {}", args[0])
        }
        async fn transaction(
            &self,
            _: &Script,
            _: &str,
            _: &[&[&str]],
        ) -> Result<Vec<Reply>, NodeError> {
            panic!("no transaction may be sent here")
        }
        async fn command_and_publish(
            &self,
            _: &Script,
            _: &str,
            args: &[&str],
            _: &[&str],
        ) -> Result<(Reply, Option<Reply>), NodeError> {
            panic!("no command may be sent here: {}", args[0])
        }
        fn clustered(&self) -> bool {
            false
        }
        fn probe(&self) -> &Probe {
            &self.probe
        }
    }

    #[test]
    fn a_batch_with_mixed_ttls_sends_each_key_its_own_ttl() {
        let t = ScriptCalls::default();
        t.probe.set_mode(Commands::Scripts);
        t.probe.set(Capabilities {
            lua: true,
            set_nx_get: true,
            set_ifeq: false,
            delifeq: false,
            commands: Commands::Scripts,
        });
        let tokens: Vec<Token> = (0..4).map(|_| Token::random().unwrap()).collect();
        let ttls = [1_000, 1_000, 2_500, 1_000];
        let items: Vec<redlease::ExtendItem<'_>> = ["a", "b", "c", "d"]
            .iter()
            .zip(&tokens)
            .zip(ttls)
            .map(|((k, tok), ms)| redlease::ExtendItem::new(k, tok, Ttl::from_millis(ms).unwrap()))
            .collect();
        let flags = block_on(extend_many(&t, &items)).unwrap();
        assert_eq!(flags, [true; 4]);
        let calls = t.calls.lock().unwrap();
        let (keys, args) = &calls[0];
        assert_eq!(keys, &["a", "b", "c", "d"]);
        let sent_ttls: Vec<&str> = args[4..].iter().map(String::as_str).collect();
        assert_eq!(sent_ttls, ["1000", "1000", "2500", "1000"]);
        let sent_tokens: Vec<&str> = args[..4].iter().map(String::as_str).collect();
        let expected: Vec<&str> = tokens.iter().map(Token::as_str).collect();
        assert_eq!(sent_tokens, expected);
    }

    /// A multi-key release sends each key's channel and waiter marker (`''` for a key without one), so
    /// that the script publishes a deletion only while someone may wait for it.
    #[test]
    fn a_multi_key_release_sends_each_keys_waiter_marker() {
        let t = ScriptCalls::default();
        t.probe.set_mode(Commands::Scripts);
        t.probe.set(Capabilities {
            lua: true,
            set_nx_get: true,
            set_ifeq: false,
            delifeq: false,
            commands: Commands::Scripts,
        });
        let (a, b) = (Token::random().unwrap(), Token::random().unwrap());
        let items = [
            redlease::MultiKeyItem::new("jobs:a", &a),
            redlease::MultiKeyItem::new("odd}b", &b),
        ];
        let reply = block_on(multi_key(&t, &items, redlease::MultiKeyOp::Release)).unwrap();
        assert_eq!(reply, redlease::MultiKeyReply::Done(vec![true, true]));
        let calls = t.calls.lock().unwrap();
        let (keys, args) = &calls[0];
        assert_eq!(keys, &["jobs:a", "odd}b"]);
        let expected = [
            a.as_str(),
            b.as_str(),
            "PUBLISH",
            "redlease:released:{jobs:a}",
            "odd}b",
            "redlease:waiting:{jobs:a}",
            "",
        ];
        assert_eq!(args, &expected);
    }

    /// Without Lua a batch is one watched transaction: `WATCH` and `MGET` of every key, and `PEXPIRE … GT`
    /// only for the keys holding their item's token.
    #[test]
    fn a_batch_without_lua_is_one_watched_pexpire_gt_of_our_keys_only() {
        let ttl = Ttl::from_millis(1000).unwrap();
        let (a, b) = (Token::random().unwrap(), Token::random().unwrap());
        let items = [
            redlease::ExtendItem::new("a", &a, ttl),
            redlease::ExtendItem::new("b", &b, ttl),
            redlease::ExtendItem::new("c", &a, ttl),
        ];
        let t = native();
        t.replies.lock().unwrap().extend([
            Ok(Reply::Bytes(b"OK".to_vec())),
            Ok(Reply::Array(vec![
                Reply::Bytes(a.as_str().as_bytes().to_vec()),
                Reply::Bytes(b"theirs".to_vec()),
                Reply::Nil,
            ])),
        ]);
        t.txs.lock().unwrap().push_back(Ok(vec![Reply::Int(1)]));
        assert_eq!(
            block_on(extend_many(&t, &items)).unwrap(),
            [true, false, false]
        );
        assert_eq!(*t.sent.lock().unwrap(), ["WATCH", "MGET", "MULTI PEXPIRE"]);
        assert_eq!(
            t.tx_args.lock().unwrap().last().unwrap(),
            &[vec!["PEXPIRE", "a", "1000", "GT"]]
        );
    }
}
