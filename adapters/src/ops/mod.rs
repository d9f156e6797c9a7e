//! The lock operations, written once on top of the primitives each client adapter supplies, and the
//! per-connection capability check that runs before a connection's first write.
//!
//! # The capability check
//!
//! Every operation but a fresh acquisition is a script, so a user who may not run `EVAL` (or a command inside
//! the scripts, such as `DEL`) could take a lock with a plain `SET` and then neither extend nor release it.
//! So the first acquisition on a connection, and the first after the connection failed (a reconnecting client
//! may then be talking to another server, or under a changed ACL), and the first after any sign that the
//! server behind the connection changed without a failed call (the client reconnected in the background, the
//! server's `run_id` differs from the one seen before, or it refused a command the check had found as unknown
//! or a syntax error — then that release or extension goes again by the new check's path), checks first: a
//! fresh acquisition runs
//! [`PROBE_ACQUIRE`](crate::scripts::PROBE_ACQUIRE) as `EVAL` (the check and the acquisition in one command, so the
//! first acquisition costs no extra round trip), a script acquisition runs [`PROBE`](crate::scripts::PROBE) before
//! its script. The check reports the commands the scripts need that the ACL denies (on servers with
//! `redis.acl_check_cmd`, Redis 7.0+) and whether the server accepts `SET … NX GET` (Redis 7.0+). A refusal is
//! a definite [`NodeErrorKind::Auth`] error before anything is written; nothing is cached after a refusal, so
//! a corrected ACL takes effect at the next call. `EVAL` is what the check proves: every script goes out as
//! `EVALSHA` first and as `EVAL` after a `NOSCRIPT` reply, or after a refusal of `EVALSHA` itself.
//!
//! Later fresh acquisitions are `SET key token NX GET PX ttl` where the server accepts it (a key of another
//! type is a `WRONGTYPE` error there, exactly as in the acquire script, so one attempt or three give the same
//! answer), and the [`ACQUIRE_FRESH`](crate::scripts::ACQUIRE_FRESH) script otherwise. None of them touches an
//! existing key, so a late copy of a fresh acquisition cannot reset a lease's TTL.
//!
//! The same check learns which native conditional commands the connection offers and permits (`SET … IFEQ`,
//! `DELIFEQ`: inside the probe script with `redis.pcall`, or, where scripts cannot run, with plain probe
//! commands that write nothing), and each operation picks its path from the answer and the node's
//! [`Commands`] mode (see there for the table). Where the lease would run without Lua, the check also
//! proves `MULTI`/`EXEC` (with `GET`, `PTTL`), `INCR`, `PEXPIRE` and `WATCH` permitted, with commands and
//! transactions that write nothing ([`transactions_refused`](probe::transactions_refused)).

use std::future::Future;

use redlease::{NodeError, NodeErrorKind};

use crate::scripts::{Reply, Script};
use crate::{Capabilities, Commands};

mod batch;
mod fence;
mod ledger;
mod lock;
mod permit;
#[cfg(test)]
mod pinned;
mod probe;
mod replication;
mod rw;
#[cfg(test)]
mod testing;
mod wait;

pub(crate) use batch::{EXTEND_MANY_LIMIT, extend_many, multi_key};
pub(crate) use fence::{acquire_fenced, raise_fence};
use ledger::TxGate;
#[cfg(all(test, feature = "fred"))]
pub(crate) use lock::fresh_acquire_reporting;
pub(crate) use lock::{acquire, claim, extend, inspect, release};
pub(crate) use permit::permit;
pub(crate) use probe::{Probe, check, readiness};
use probe::{checked, lua_absent};
#[cfg(feature = "fred")]
pub(crate) use replication::info_field;
pub(crate) use replication::{run_id, wait_replicas};

/// Which script command to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    /// `EVAL source …`
    Eval,
    /// `EVALSHA sha1 …`
    EvalSha,
}

impl Verb {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verb::Eval => "EVAL",
            Verb::EvalSha => "EVALSHA",
        }
    }
}

/// What a client adapter provides: one script command and one plain command, each sent exactly once, with its
/// errors classified.
///
/// Not an `async_trait`: every operation takes its transport as `&impl Transport` (static dispatch), so the
/// futures of these methods are nested into the operation's own future instead of being boxed one by one (two
/// heap allocations per acquire + release pair, each of a future several hundred bytes large). Implementors
/// write them as `async fn`; the declarations promise `Send` futures, as the node traits need.
pub(crate) trait Transport: Send + Sync {
    /// Sends `verb` (`EVAL` with the source, or `EVALSHA` with the digest) of `script` once.
    fn script_once(
        &self,
        verb: Verb,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> impl Future<Output = Result<Reply, NodeError>> + Send;

    /// Sends the plain command `args` (its name first) once, routed by `key`; `what` names it in messages.
    fn command(
        &self,
        what: &Script,
        key: &str,
        args: &[&str],
    ) -> impl Future<Output = Result<Reply, NodeError>> + Send;

    /// Sends `MULTI`, the commands `cmds` and `EXEC` once, on one connection and without other commands in
    /// between, routed by `key`. The replies of the commands, or the first error among them (the commands
    /// before and after it ran; an error queueing them, such as `NOPERM`, aborts the whole transaction).
    fn transaction(
        &self,
        what: &Script,
        key: &str,
        cmds: &[&[&str]],
    ) -> impl Future<Output = Result<Vec<Reply>, NodeError>> + Send;

    /// Sends `MULTI`, `GET key`, `PTTL key`, `EXEC` once, writing nothing, such that a refusal of `MULTI` or
    /// `EXEC` themselves (by the ACL) comes back as the first error, classified, and leaves the connection as
    /// it was. (redis-rs's transaction pipelines miscount the replies when `MULTI` itself is refused, and its
    /// driver panics in debug builds, so its adapter sends these four as a plain pipeline; where `MULTI` is
    /// refused, the reads run on their own.)
    fn probe_transaction(
        &self,
        what: &Script,
        key: &str,
    ) -> impl Future<Output = Result<(), NodeError>> + Send {
        async move {
            self.transaction(what, key, &[&["GET", key], &["PTTL", key]])
                .await
                .map(|_| ())
        }
    }

    /// Sends the plain command `args` and, pipelined right behind it on the same connection (one write, one
    /// round trip, not a transaction), `publish` (a `PUBLISH`, or any second command such as the `EXISTS` of
    /// a waiter marker); routed by `key` (the channel shares its slot). The reply of `args`, and that of
    /// `publish` when it answered without an error (`None` otherwise: an error of `publish`, refused by a
    /// channel ACL say, never fails the call). Neither is re-sent.
    fn command_and_publish(
        &self,
        what: &Script,
        key: &str,
        args: &[&str],
        publish: &[&str],
    ) -> impl Future<Output = Result<(Reply, Option<Reply>), NodeError>> + Send;

    /// Whether the keys of one call must share a Redis Cluster slot (checked before anything is sent).
    fn clustered(&self) -> bool;

    /// The capability state of the connection(s) this transport sends on.
    fn probe(&self) -> &Probe;

    /// Acts on reconnections the client announced since the last call (forgets the probe), before a write's
    /// connection generation is taken (see [`wait_replicas`]). A transport that learns of reconnections only
    /// when it sends, or forgets at once when they happen, keeps the default (nothing).
    fn notice_reconnections(&self) {}

    /// The identity of the open connection the next command routed by `key` would go on, when the transport
    /// knows it for certain: a connection it opened itself and numbers (each new one a new number, never
    /// reused), or one that never reconnects. `None` (the default) when it is not open, or when the client
    /// may replace it without the transport knowing (a reconnecting client): [`run_id`] then asks the
    /// server every time, since a remembered answer could be the old server's.
    fn connection_id(&self, key: &str) -> Option<u64> {
        let _ = key;
        None
    }

    /// Sends `WAIT` / `WAITAOF` (`args`) once for `key`'s write: by default on the connection the writes go
    /// on ([`command`](Self::command)); a transport with a connection of its own for it (so that the wait does
    /// not hold up other commands) sends it there, behind a write that brings that connection's replication
    /// offset up to the server's.
    fn wait_command(
        &self,
        what: &Script,
        key: &str,
        args: &[&str],
    ) -> impl Future<Output = Result<Reply, NodeError>> + Send {
        self.command(what, key, args)
    }
}

/// After a failed connection the next acquisition checks again: the client may reconnect to another server.
/// A reply is a server's answer: the first one is remembered ([`ProbeState::first_contact`](probe::ProbeState::first_contact)).
fn note<T>(t: &impl Transport, result: Result<T, NodeError>) -> Result<T, NodeError> {
    match &result {
        Err(e) if matches!(e.kind(), NodeErrorKind::Connection | NodeErrorKind::Io) => {
            t.probe().forget();
        }
        Err(_) => {}
        Ok(_) => t.probe().answered(),
    }
    result
}

/// [`Transport::transaction`] behind the node's transaction gate ([`Probe::tx_gate`]).
async fn tx(
    t: &impl Transport,
    what: &Script,
    key: &str,
    cmds: &[&[&str]],
) -> Result<Vec<Reply>, NodeError> {
    let _gate = gate(t, what).await;
    t.transaction(what, key, cmds).await
}

/// [`Transport::probe_transaction`] behind the node's transaction gate ([`Probe::tx_gate`]).
async fn probe_tx(t: &impl Transport, what: &Script, key: &str) -> Result<(), NodeError> {
    let _gate = gate(t, what).await;
    t.probe_transaction(what, key).await
}

/// The node's transaction gate ([`Probe::tx_gate`]), after ending the `WATCH` a call cut between its `WATCH`
/// and its `EXEC` may have left on a connection (see [`TxGate`]): `UNWATCH`, routed by the watched key. Left
/// in place it would abort this holder's `EXEC` (an `EXEC` ends every `WATCH` of its connection, and fails
/// if a watched key changed). Should the `UNWATCH` fail, the next holder tries again.
pub(super) async fn gate<'a>(t: &'a impl Transport, what: &Script) -> TxGate<'a> {
    let gate = t.probe().tx_gate().await;
    if let Some(key) = t.probe().stale_watch()
        && t.command(what, &key, &["UNWATCH"]).await.is_ok()
    {
        t.probe().unwatched(&key);
    }
    gate
}

/// Whether `err` is a definite "unknown command" or "syntax error" reply: a server that lacks a command or
/// an option (`DELIFEQ`, `SET … IFEQ`, `SET … NX GET`, `EVAL` without Lua).
fn refused_command(err: &NodeError) -> bool {
    if err.is_ambiguous() {
        return false;
    }
    let text = err.to_string().to_ascii_lowercase();
    text.contains("unknown command") || text.contains("syntax error")
}

/// A command the connection's check chose was refused as unknown: the server behind the connection is not
/// the one that was checked (another binary or version behind a proxy or one address, reached without a
/// failed call in between). What was learned is forgotten, so the next call checks again and asks the
/// run_id again.
fn note_refused<T>(t: &impl Transport, result: Result<T, NodeError>) -> Result<T, NodeError> {
    if let Err(e) = &result
        && refused_command(e)
    {
        t.probe().forget_checks();
    }
    result
}

/// Whether `err` refused the `EVALSHA` command itself (the ACL), so that the script did not run.
fn evalsha_refused(err: &NodeError) -> bool {
    err.kind() == NodeErrorKind::Auth && err.message().to_ascii_lowercase().contains("'evalsha'")
}

/// Runs `script`: `EVALSHA`, and exactly one `EVAL` after a `NOSCRIPT` reply or a refusal of `EVALSHA` by the
/// ACL (both refusals: nothing ran).
pub(crate) async fn eval(
    t: &impl Transport,
    script: &Script,
    keys: &[&str],
    args: &[&str],
) -> Result<Reply, NodeError> {
    let result = match t.script_once(Verb::EvalSha, script, keys, args).await {
        Err(e) if e.kind() == NodeErrorKind::NoScript || evalsha_refused(&e) => {
            t.script_once(Verb::Eval, script, keys, args).await
        }
        other => other,
    };
    note_refused(t, note(t, result))
}

/// The capabilities to choose a release or extension path by: a scripts-only node needs no check (the
/// scripts are the path), the others check an unchecked connection first.
async fn path(t: &impl Transport, key: &str) -> Result<Option<Capabilities>, NodeError> {
    match t.probe().get() {
        Some(caps) => Ok(Some(caps)),
        None if t.probe().mode() == Commands::Scripts => Ok(None),
        None => checked(t, key, None).await.map(Some),
    }
}

/// How a release or an extension goes: the native command (or, for an extension, the watched transaction)
/// or the script. Chosen by the capabilities ([`path`]: the check runs first on an unchecked connection),
/// except where the check is refused for being a check: a server at `maxmemory` refuses its `SET … PX 0`
/// probes (`OOM`), not the release or extension, which must then still run. So after an `OOM` refusal of
/// the check the operation goes by the node's mode: the script first in [`Commands::Automatic`], and the
/// native way only if the server runs no Lua or the ACL refuses the script command itself (both: nothing
/// ran).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Native,
    Script,
    ScriptElseNative,
}

async fn way(
    t: &impl Transport,
    key: &str,
    native: impl FnOnce(Capabilities) -> bool,
) -> Result<Way, NodeError> {
    match path(t, key).await {
        Ok(caps) if caps.is_some_and(native) => Ok(Way::Native),
        Ok(_) => Ok(Way::Script),
        Err(e) if e.kind() == NodeErrorKind::OutOfMemory && !e.is_ambiguous() => {
            Ok(match t.probe().mode() {
                Commands::Scripts => Way::Script,
                Commands::Native => Way::Native,
                _ => Way::ScriptElseNative,
            })
        }
        Err(e) => Err(e),
    }
}

/// Whether a script call was refused before anything ran because the server runs no Lua or the ACL refuses
/// `EVAL` itself (not a command inside the script): another way may be tried.
fn script_unavailable(err: &NodeError) -> bool {
    if err.is_ambiguous() {
        return false;
    }
    let message = err.message().to_ascii_lowercase();
    lua_absent(err)
        || (err.kind() == NodeErrorKind::Auth
            && (message.contains("'eval'") || message.contains("'evalsha'")))
}
