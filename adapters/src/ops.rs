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
//! [`PROBE_ACQUIRE`](scripts::PROBE_ACQUIRE) as `EVAL` (the check and the acquisition in one command, so the
//! first acquisition costs no extra round trip), a script acquisition runs [`PROBE`](scripts::PROBE) before
//! its script. The check reports the commands the scripts need that the ACL denies (on servers with
//! `redis.acl_check_cmd`, Redis 7.0+) and whether the server accepts `SET … NX GET` (Redis 7.0+). A refusal is
//! a definite [`NodeErrorKind::Auth`] error before anything is written; nothing is cached after a refusal, so
//! a corrected ACL takes effect at the next call. `EVAL` is what the check proves: every script goes out as
//! `EVALSHA` first and as `EVAL` after a `NOSCRIPT` reply, or after a refusal of `EVALSHA` itself.
//!
//! Later fresh acquisitions are `SET key token NX GET PX ttl` where the server accepts it (a key of another
//! type is a `WRONGTYPE` error there, exactly as in the acquire script, so one attempt or three give the same
//! answer), and the [`ACQUIRE_FRESH`](scripts::ACQUIRE_FRESH) script otherwise. None of them touches an
//! existing key, so a late copy of a fresh acquisition cannot reset a lease's TTL.
//!
//! The same check learns which native conditional commands the connection offers and permits (`SET … IFEQ`,
//! `DELIFEQ`: inside the probe script with `redis.pcall`, or, where scripts cannot run, with plain probe
//! commands that write nothing), and each operation picks its path from the answer and the node's
//! [`Commands`] mode (see there for the table). Where the lease would run without Lua, the check also
//! proves `MULTI`/`EXEC` (with `GET`, `PTTL`), `INCR`, `PEXPIRE` and `WATCH` permitted, with commands and
//! transactions that write nothing ([`transactions_refused`]).

use std::future::Future;
use std::sync::{Arc, Mutex};

use redlease::{
    Claim, CommandPaths, KeyState, NodeError, NodeErrorKind, Path, PermitOp, PermitReply,
    Readiness, ReplicaWait, RunId, Token, Ttl, notify,
};

use crate::scripts::{self, Reply, Script};
use crate::slot;
use crate::{Capabilities, Commands};

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

/// The capability state of one connection, shared by the clones of a node: the configured mode and, once
/// checked, what the connection offers.
#[derive(Debug, Default, Clone)]
pub(crate) struct Probe(Arc<Mutex<ProbeState>>);

#[derive(Default)]
struct ProbeState {
    mode: Commands,
    caps: Option<Capabilities>,
    /// Fenced acquisitions without Lua that wrote their lock: `(key, token, fence)`, the fence `None` while
    /// its number is not confirmed. Newest last, at most [`FENCES_KEPT`].
    fences: std::collections::VecDeque<(String, String, Option<u64>)>,
    /// The server's run id, learned with `INFO server` on the connection the transport names
    /// ([`Transport::connection_id`]) — only on a connection the transport can name, and only when the
    /// `INFO` went out and came back on it (see [`run_id`]); also forgotten with the capabilities.
    run_id: Option<(u64, RunId)>,
    /// When the server behind [`seen_run_id`](Self::seen_run_id) started, as far as the node knows: set when
    /// a run id replaced another one (from the new server's uptime), so that its reports carry how long ago
    /// the restart happened ([`RunId::with_restarted_ago`]).
    restarted_at: Option<std::time::Instant>,
    /// When a server first answered this node (any reply, on any connection; never forgotten): a run id
    /// read later from a server whose uptime is clearly shorter than that is a restart the node did not see
    /// (see [`run_id`]).
    first_contact: Option<std::time::Instant>,
    /// Whether the server lacks `WAITAOF` (an unknown command), once seen.
    no_waitaof: bool,
    /// The last run id learned on any connection (kept when the probe is forgotten): a new one means another
    /// server process, whose capabilities are checked again.
    seen_run_id: Option<RunId>,
    /// Counts the connection changes the node noticed ([`Probe::forget`], [`Probe::opened`]).
    generation: u64,
    /// The generation in which the node last opened a connection ([`Probe::opened`]).
    opened_in: Option<u64>,
    /// Which keys were last written over a connection the node has since seen replaced.
    writes: Writes,
    /// Whether a call is running the capability check, and the calls waiting for its answer.
    checking: bool,
    check_waiters: Vec<std::task::Waker>,
    /// Fence keys this connection's user was found allowed to write (Lua-less fenced acquisition), forgotten
    /// with the capabilities; at most [`WRITES_KEPT`].
    writable_fences: std::collections::HashSet<String>,
    /// Whether a call holds the transaction gate ([`Probe::tx_gate`]), and the calls waiting for it.
    tx_busy: bool,
    tx_waiters: Vec<std::task::Waker>,
}

/// The node's transaction gate, held by one call at a time (see [`Probe::tx_gate`]); given back when dropped.
pub(crate) struct TxGate<'a>(&'a Probe);

impl Drop for TxGate<'_> {
    fn drop(&mut self) {
        let waiters = {
            let mut state = self.0.lock();
            state.tx_busy = false;
            std::mem::take(&mut state.tx_waiters)
        };
        for waker in waiters {
            waker.wake();
        }
    }
}

/// The turn of the one call that runs a connection's capability check while the others wait for its answer
/// (so that N calls made at once on an unchecked connection send one check, not N). Given back when dropped,
/// also when the call is cut: a waiter then runs the check itself if no answer was remembered.
pub(crate) struct CheckTurn<'a>(&'a Probe);

impl Drop for CheckTurn<'_> {
    fn drop(&mut self) {
        let waiters = {
            let mut state = self.0.lock();
            state.checking = false;
            std::mem::take(&mut state.check_waiters)
        };
        for waker in waiters {
            waker.wake();
        }
    }
}

/// How many keys each set of [`Writes`] holds before it is replaced by a fresh one.
const WRITES_KEPT: usize = 1024;

/// The keys written in the current connection generation (`fresh`) and in an earlier one (`stale`), for
/// [`wait_replicas`]: a `WAIT` for a stale key would not count its write. O(1) per write (no allocation for a
/// key written again); each kind is two sets, the newer replaced by a fresh one once it holds
/// [`WRITES_KEPT`] keys, so the last `WRITES_KEPT` writes of each kind are always known (a `WAIT` follows its
/// write at once; an older key forgotten is waited for as before).
#[derive(Default)]
struct Writes {
    fresh: [std::collections::HashSet<String>; 2],
    stale: [std::collections::HashSet<String>; 2],
}

impl Writes {
    fn add(sets: &mut [std::collections::HashSet<String>; 2], key: &str) {
        if sets[0].contains(key) {
            return;
        }
        if sets[0].len() >= WRITES_KEPT {
            sets[1] = std::mem::take(&mut sets[0]);
        }
        sets[0].insert(key.to_owned());
    }

    /// `key` was written in the current generation (`current`) or in an earlier one.
    fn wrote(&mut self, key: &str, current: bool) {
        let (add, remove) = if current {
            (&mut self.fresh, &mut self.stale)
        } else {
            (&mut self.stale, &mut self.fresh)
        };
        // Not hashed for empty sets (the stale ones nearly always are): a write is recorded on every
        // acquisition and extension.
        for set in remove.iter_mut().filter(|set| !set.is_empty()) {
            set.remove(key);
        }
        Self::add(add, key);
    }

    /// The connection was replaced: every key written so far is stale.
    fn replaced(&mut self) {
        let fresh = std::mem::take(&mut self.fresh);
        for key in fresh.iter().flatten() {
            Self::add(&mut self.stale, key);
        }
    }

    fn is_stale(&self, key: &str) -> bool {
        self.stale.iter().any(|set| set.contains(key))
    }
}

/// How many native fenced acquisitions a node remembers for their retries (a retry follows its first attempt
/// within one acquisition; the oldest confirmed entries are dropped first, unconfirmed ones never: a node
/// with this many unconfirmed in flight refuses the next, before writing).
const FENCES_KEPT: usize = 256;

impl std::fmt::Debug for ProbeState {
    // Tokens stay out of Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeState")
            .field("mode", &self.mode)
            .field("caps", &self.caps)
            .field("fences", &self.fences.len())
            .finish()
    }
}

impl Probe {
    fn lock(&self) -> std::sync::MutexGuard<'_, ProbeState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self) -> Option<Capabilities> {
        self.lock().caps
    }

    fn set(&self, caps: Capabilities) {
        self.lock().caps = Some(caps);
    }

    /// Waits until the capability check may run: `None` once an answer is remembered (another call's check
    /// gave it), else the turn to run the check.
    pub(crate) async fn check_turn(&self) -> Option<CheckTurn<'_>> {
        std::future::poll_fn(|cx| {
            let mut state = self.lock();
            if state.caps.is_some() {
                return std::task::Poll::Ready(false);
            }
            if !state.checking {
                state.checking = true;
                return std::task::Poll::Ready(true);
            }
            if !state.check_waiters.iter().any(|w| w.will_wake(cx.waker())) {
                state.check_waiters.push(cx.waker().clone());
            }
            std::task::Poll::Pending
        })
        .await
        .then_some(CheckTurn(self))
    }

    /// Waits for the node's transaction gate: every `MULTI … EXEC` this node sends holds it, and so does the
    /// watched extension ([`extend_watched`]) from its `WATCH` to its `EXEC`, so that no other `EXEC` of the
    /// node (which ends every `WATCH` of its connection) comes in between.
    pub(crate) async fn tx_gate(&self) -> TxGate<'_> {
        std::future::poll_fn(|cx| {
            let mut state = self.lock();
            if !state.tx_busy {
                state.tx_busy = true;
                return std::task::Poll::Ready(());
            }
            if !state.tx_waiters.iter().any(|w| w.will_wake(cx.waker())) {
                state.tx_waiters.push(cx.waker().clone());
            }
            std::task::Poll::Pending
        })
        .await;
        TxGate(self)
    }

    /// Forgets what was learned about the connection, which failed or was replaced: the next call checks
    /// again, and a `WAIT` for a key written before fails.
    pub(crate) fn forget(&self) {
        let mut state = self.lock();
        state.caps = None;
        state.writable_fences.clear();
        state.run_id = None;
        state.no_waitaof = false;
        state.generation += 1;
        state.writes.replaced();
    }

    /// The node opened a new connection (a lazy node's first, or its next after one was lost): what was learned
    /// is forgotten, as by [`forget`](Self::forget). The generation moves on only if a connection was opened
    /// before in this generation (one replaced with no loss noticed: the writes on it no longer count for
    /// `WAIT`); otherwise the connection lost before already moved it on, or there was none, and a write whose
    /// generation was taken before this connection was opened (the call that opened it) went on this one, so
    /// its `WAIT` counts it.
    pub(crate) fn opened(&self) {
        let mut state = self.lock();
        state.caps = None;
        state.run_id = None;
        state.no_waitaof = false;
        state.writable_fences.clear();
        if state.opened_in == Some(state.generation) {
            state.generation += 1;
            state.writes.replaced();
        }
        state.opened_in = Some(state.generation);
    }

    /// Forgets the capabilities only (the connection is the same: a command it refused showed that they
    /// were about another server), so the next call checks again.
    fn forget_checks(&self) {
        let mut state = self.lock();
        state.caps = None;
        state.writable_fences.clear();
        state.run_id = None;
        state.no_waitaof = false;
    }

    fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// A server answered: the node's first contact, if it is.
    fn answered(&self) {
        let mut state = self.lock();
        if state.first_contact.is_none() {
            state.first_contact = Some(std::time::Instant::now());
        }
    }

    /// Records a write of `key` sent in connection generation `generation`.
    fn wrote(&self, key: &str, generation: u64) {
        self.wrote_all([key], generation);
    }

    /// Records writes of `keys` sent in connection generation `generation` (one lock for all of them).
    fn wrote_all<'k>(&self, keys: impl IntoIterator<Item = &'k str>, generation: u64) {
        let mut state = self.lock();
        let current = generation == state.generation;
        for key in keys {
            state.writes.wrote(key, current);
        }
    }

    /// Whether `key`'s last recorded write went over a connection the node has since seen replaced.
    pub(crate) fn written_before_a_reconnect(&self, key: &str) -> bool {
        self.lock().writes.is_stale(key)
    }

    pub(crate) fn mode(&self) -> Commands {
        self.lock().mode
    }

    /// What this node recorded for a native fenced acquisition of `key` with `token`: `None` nothing (this
    /// node never wrote that lock), `Some(None)` written but its number unconfirmed, `Some(Some(n))` issued.
    fn fence(&self, key: &str, token: &Token) -> Option<Option<u64>> {
        self.lock()
            .fences
            .iter()
            .rev()
            .find(|(k, t, _)| k == key && t == token.as_str())
            .map(|(_, _, n)| *n)
    }

    /// Records a native fenced acquisition. Room is made by dropping the oldest confirmed record (a number
    /// issued: its retry would need it only if the whole acquisition failed after it); an unconfirmed one is
    /// never dropped, since its retry could then not recognise the lock as its own. `false` (nothing
    /// recorded) when all [`FENCES_KEPT`] records are unconfirmed: the acquisition must not write its lock.
    fn record_fence(&self, key: &str, token: &Token, fence: Option<u64>) -> bool {
        let mut state = self.lock();
        state
            .fences
            .retain(|(k, t, _)| !(k == key && t == token.as_str()));
        if state.fences.len() >= FENCES_KEPT {
            match state.fences.iter().position(|(_, _, n)| n.is_some()) {
                Some(confirmed) => {
                    state.fences.remove(confirmed);
                }
                None => return false,
            }
        }
        state
            .fences
            .push_back((key.to_owned(), token.as_str().to_owned(), fence));
        true
    }

    fn forget_fence(&self, key: &str, token: &Token) {
        self.lock()
            .fences
            .retain(|(k, t, _)| !(k == key && t == token.as_str()));
    }

    /// Sets the mode (and forgets what was learned under the old one).
    pub(crate) fn set_mode(&self, mode: Commands) {
        let mut state = self.lock();
        state.mode = mode;
        state.caps = None;
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
/// A reply is a server's answer: the first one is remembered ([`ProbeState::first_contact`]).
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
    let _gate = t.probe().tx_gate().await;
    t.transaction(what, key, cmds).await
}

/// [`Transport::probe_transaction`] behind the node's transaction gate ([`Probe::tx_gate`]).
async fn probe_tx(t: &impl Transport, what: &Script, key: &str) -> Result<(), NodeError> {
    let _gate = t.probe().tx_gate().await;
    t.probe_transaction(what, key).await
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

/// Whether `err` is the server refusing to write a waiter marker — the ACL (`NOPERM` on the marker key),
/// `maxmemory` (`OOM`, or `EXECABORT` after a refused queued command) — rather than a failure to reach it
/// (not connected, a broken connection, no answer): definite, and no retry would write it.
fn marker_refused(err: &NodeError) -> bool {
    !err.is_ambiguous()
        && !matches!(
            err.kind(),
            NodeErrorKind::Connection | NodeErrorKind::Io | NodeErrorKind::Timeout
        )
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

/// A refusal of the probe, reworded so that its message says why a lease cannot be taken.
fn probe_refused(verb: Verb, err: NodeError) -> NodeError {
    let message = err.message();
    let acl = message.contains("NOPERM")
        || message.contains("The user executing the script can't")
        || message.contains("no permissions");
    if err.kind() != NodeErrorKind::Auth || !acl {
        // A failed login, a replica, a dropped connection: reported as they are.
        return err;
    }
    let message = format!(
        "capability check before the first write ({}): a lease needs EVAL and the commands inside redlease's \
         scripts; {}",
        verb.as_str(),
        err.message()
    );
    NodeError::not_applied(NodeErrorKind::Auth, message).with_source(err)
}

/// Whether a refusal of a script says that this user may not run scripts, or a command inside them, here.
fn scripts_denied(err: &NodeError) -> bool {
    let message = err.message();
    err.kind() == NodeErrorKind::Auth
        && !err.is_ambiguous()
        && (message.contains("NOPERM")
            || message.contains("The user executing the script can't")
            || message.contains("no permissions"))
}

/// Whether a refusal of `EVAL` says that the server runs no Lua (Valkey without its Lua module, a server
/// built without scripting).
fn lua_absent(err: &NodeError) -> bool {
    let message = err.message().to_ascii_lowercase();
    !err.is_ambiguous()
        && (message.contains("scripting engine")
            || (message.contains("unknown command") && message.contains("eval")))
}

/// What a plain-command probe of one native command found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    Present,
    Absent,
    Denied,
}

/// Whether an error is the ACL refusing a command (outside a script).
fn denied(err: &NodeError) -> bool {
    err.kind() == NodeErrorKind::Auth && err.message().contains("NOPERM")
}

/// Probes one `SET` option with `SET key probe <option…> PX 0`: a server that accepts the option rejects the
/// expiry, one that does not rejects the syntax; neither writes anything.
async fn probe_set_option(
    t: &impl Transport,
    what: &Script,
    key: &str,
    option: &[&str],
) -> Result<Found, NodeError> {
    let mut args = vec!["SET", key, "redlease:probe"];
    args.extend_from_slice(option);
    args.extend_from_slice(&["PX", "0"]);
    match note(t, t.command(what, key, &args).await) {
        Err(e) if !e.is_ambiguous() && e.message().contains("invalid expire") => Ok(Found::Present),
        Err(e) if !e.is_ambiguous() && e.message().contains("syntax error") => Ok(Found::Absent),
        Err(e) if denied(&e) => Ok(Found::Denied),
        Err(e) => Err(e),
        Ok(reply) => Err(scripts::unexpected_reply(what, &reply)),
    }
}

/// The native commands a connection offers, probed with plain commands (no Lua needed): `DELIFEQ` first
/// (it is not a `SET`), and only where it is offered the two `SET` options. The `DELIFEQ` probe compares
/// with a value drawn at random for it (160 bits, as a token), which no key holds: it deletes nothing.
async fn probe_natives(t: &impl Transport, key: &str) -> Result<[Option<Found>; 3], NodeError> {
    let never = Token::random().map_err(|e| {
        NodeError::not_applied(
            NodeErrorKind::Other,
            format!("capability check: no random value for the DELIFEQ probe (not sent): {e}"),
        )
    })?;
    let delifeq = match note(
        t,
        t.command(&scripts::DELIFEQ, key, &["DELIFEQ", key, never.as_str()])
            .await,
    ) {
        Ok(Reply::Int(_)) => Found::Present,
        Err(e) if e.kind() == NodeErrorKind::WrongType => Found::Present,
        Err(e)
            if !e.is_ambiguous()
                && e.message().to_ascii_lowercase().contains("unknown command") =>
        {
            Found::Absent
        }
        Err(e) if denied(&e) => Found::Denied,
        Err(e) => return Err(e),
        Ok(reply) => return Err(scripts::unexpected_reply(&scripts::DELIFEQ, &reply)),
    };
    if delifeq != Found::Present {
        return Ok([None, None, Some(delifeq)]);
    }
    let ifeq = probe_set_option(t, &scripts::SET_IFEQ, key, &["IFEQ", "redlease:probe"]).await?;
    let nx_get = probe_set_option(t, &scripts::SET_NX, key, &["NX", "GET"]).await?;
    Ok([Some(nx_get), Some(ifeq), Some(delifeq)])
}

/// The ACL's refusal of what the Lua-less operations need besides `DELIFEQ` and `SET … IFEQ`, if any:
/// `MULTI`/`EXEC` with `GET` and `PTTL` (inspection, fenced acquisition), `INCR` (fenced acquisition), and
/// `WATCH` and `PEXPIRE` (the watched extension). The probes write nothing: the first is a read-only
/// transaction sent so that a refused `MULTI` is harmless ([`Transport::probe_transaction`]); the second
/// queues `INCR key`, `PEXPIRE key 1 GT` and then a malformed `INCR`, whose refusal aborts the transaction,
/// so that neither runs and only their own refusal names them; the third is `WATCH key`, then `UNWATCH`.
async fn transactions_refused(
    t: &impl Transport,
    key: &str,
) -> Result<Option<NodeError>, NodeError> {
    let what = &scripts::TRANSACTION;
    match note(t, probe_tx(t, what, key).await) {
        Ok(()) => {}
        Err(e) if denied(&e) => return Ok(Some(e)),
        Err(e) => return Err(e),
    }
    let queued: &[&[&str]] = &[&["INCR", key], &["PEXPIRE", key, "1", "GT"], &["INCR"]];
    match note(t, tx(t, what, key, queued).await) {
        Err(e) if denied(&e) => return Ok(Some(e)),
        // The malformed INCR's refusal (arity): the transaction was discarded, the others are permitted.
        Err(e) if !e.is_ambiguous() && e.message().contains("wrong number of arguments") => {}
        Err(e) => return Err(e),
        Ok(replies) => return Err(scripts::unexpected_reply(what, &Reply::Array(replies))),
    }
    let watch = &scripts::WATCHED_EXTEND;
    let _gate = t.probe().tx_gate().await;
    match note(t, t.command(watch, key, &["WATCH", key]).await) {
        Ok(_) => {
            note(t, t.command(watch, key, &["UNWATCH"]).await)?;
            Ok(None)
        }
        Err(e) if denied(&e) => Ok(Some(e)),
        Err(e) => Err(e),
    }
}

fn describe(found: [Option<Found>; 3]) -> String {
    let names = ["SET NX GET", "SET IFEQ", "DELIFEQ"];
    names
        .iter()
        .zip(found)
        .filter_map(|(name, f)| f.map(|f| (name, f)))
        .map(|(name, f)| {
            let state = match f {
                Found::Present => "offered",
                Found::Absent => "not offered",
                Found::Denied => "refused by the ACL",
            };
            format!("{name} {state}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The capabilities of a connection on which scripts cannot run (`why`), from the native commands; an error
/// when they do not cover a lease.
async fn without_lua(
    t: &impl Transport,
    key: &str,
    mode: Commands,
    why: Option<NodeError>,
) -> Result<Capabilities, NodeError> {
    let found = probe_natives(t, key).await?;
    let [nx_get, ifeq, delifeq] = found;
    if ifeq == Some(Found::Present) && delifeq == Some(Found::Present) {
        if let Some(refused) = transactions_refused(t, key).await? {
            let scripts = match &why {
                Some(e) => format!("scripts cannot run ({}), and ", e.message()),
                None => String::new(),
            };
            return Err(NodeError::not_applied(
                NodeErrorKind::Auth,
                format!(
                    "capability check before the first write: {scripts}a lease without Lua needs MULTI/EXEC \
                     with GET, PTTL, INCR and PEXPIRE, and WATCH, besides DELIFEQ and SET IFEQ; {}",
                    refused.message()
                ),
            )
            .with_source(refused));
        }
        return Ok(Capabilities {
            lua: false,
            set_nx_get: nx_get == Some(Found::Present),
            set_ifeq: true,
            delifeq: true,
            commands: mode,
        });
    }
    let natives = describe(found);
    let acl = ifeq == Some(Found::Denied) || delifeq == Some(Found::Denied);
    let (kind, message) = match &why {
        Some(e) if scripts_denied(e) => (
            NodeErrorKind::Auth,
            format!(
                "capability check before the first write: a lease needs EVAL and the commands inside redlease's \
                 scripts, or the native DELIFEQ and SET IFEQ ({natives}); {}",
                e.message()
            ),
        ),
        Some(e) => (
            if acl {
                NodeErrorKind::Auth
            } else {
                NodeErrorKind::Unsupported
            },
            format!(
                "capability check before the first write: the server runs no Lua ({}) and a lease without Lua \
                 needs the native DELIFEQ and SET IFEQ ({natives})",
                e.message()
            ),
        ),
        None => (
            if acl {
                NodeErrorKind::Auth
            } else {
                NodeErrorKind::Unsupported
            },
            format!(
                "capability check before the first write: the node is pinned to native commands, which need \
                 DELIFEQ and SET IFEQ ({natives})"
            ),
        ),
    };
    let err = NodeError::not_applied(kind, message);
    Err(match why {
        Some(e) => err.with_source(e),
        None => err,
    })
}

/// What the probe script answered, as capabilities.
fn from_script(found: [bool; 3], mode: Commands) -> Capabilities {
    let [set_nx_get, set_ifeq, delifeq] = found;
    Capabilities {
        lua: true,
        set_nx_get,
        set_ifeq,
        delifeq,
        commands: mode,
    }
}

/// The refusal of a probe script under `mode`: a fallback to the native commands (automatic mode), or the
/// error to report.
async fn script_probe_failed(
    t: &impl Transport,
    key: &str,
    mode: Commands,
    err: NodeError,
) -> Result<Capabilities, NodeError> {
    let unusable = lua_absent(&err) || scripts_denied(&err);
    match mode {
        Commands::Automatic if unusable => without_lua(t, key, mode, Some(err)).await,
        _ if lua_absent(&err) => Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            format!(
                "capability check before the first write: the node is pinned to scripts and the server runs no \
                 Lua: {}",
                err.message()
            ),
        )
        .with_source(err)),
        _ => Err(probe_refused(Verb::Eval, err)),
    }
}

/// Runs the capability check now with `key` (and `fence_key`) as the example keys, and remembers the answer.
pub(crate) async fn check(
    t: &impl Transport,
    key: &str,
    fence_key: Option<&str>,
) -> Result<Capabilities, NodeError> {
    let mode = t.probe().mode();
    let caps = if mode == Commands::Native {
        without_lua(t, key, mode, None).await?
    } else {
        let keys: Vec<&str> = std::iter::once(key).chain(fence_key).collect();
        let script = &scripts::PROBE;
        match note(t, t.script_once(Verb::Eval, script, &keys, &[]).await) {
            Ok(reply) => from_script(scripts::parse_probe_reply(reply)?, mode),
            Err(e) => script_probe_failed(t, key, mode, e).await?,
        }
    };
    t.probe().set(caps);
    Ok(caps)
}

/// The start-up check ([`redlease::RedisNode::readiness`]): the capability check, run now (connecting
/// first if needed), and what it found. A refused login is told from a refused command by the server's
/// words (`WRONGPASS`, `NOAUTH`) or the client's ("authentication failed"); every other `Auth` refusal comes
/// from the ACL.
pub(crate) async fn readiness(t: &impl Transport, key: &str) -> Readiness {
    match check(t, key, None).await {
        Ok(caps) => {
            // The server's run id, read now (after the check, which names any problem first), so that a
            // restart before the first acquisition is told by the run id rather than only by the uptime
            // ([`run_id`]). Not needed for the answer: a user who may not run `INFO` is ready all the same.
            if !t.clustered() {
                let _ = run_id(t, key).await;
            }
            Readiness::Ready(paths(caps))
        }
        Err(e) if e.kind() == NodeErrorKind::Auth && login_refused(&e) => {
            Readiness::LoginRefused(e)
        }
        Err(e) if e.kind() == NodeErrorKind::Auth => Readiness::NotPermitted(e),
        Err(e) => Readiness::from_error(e),
    }
}

/// The paths each operation takes with these capabilities (see [`Commands`]).
fn paths(caps: Capabilities) -> CommandPaths {
    let native = |yes: bool| if yes { Path::Native } else { Path::Script };
    CommandPaths::scripts()
        .with_acquire(native(caps.set_nx_get || caps.native_acquire()))
        .with_retry_and_fence(native(caps.native_acquire()))
        .with_release(native(caps.native_release()))
        .with_extend(native(caps.native_extend()))
}

/// Whether an `Auth` error is a refused login rather than a refused command: its message or a source's
/// names the login.
fn login_refused(err: &NodeError) -> bool {
    let mut texts = vec![err.message().to_owned()];
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        texts.push(s.to_string());
        source = s.source();
    }
    texts.iter().any(|t| {
        let t = t.to_ascii_uppercase();
        [
            "WRONGPASS",
            "NOAUTH",
            "AUTHENTICATION FAILED",
            "INVALID USERNAME-PASSWORD",
        ]
        .iter()
        .any(|w| t.contains(w))
    })
}

/// The capability check runs once per connection: it is boxed where an operation may run it (here, in
/// [`path`] and in the fresh acquisition), so that the operations' futures, nested whole into the node's,
/// carry a pointer to it rather than its many states.
async fn checked(
    t: &impl Transport,
    key: &str,
    fence_key: Option<&str>,
) -> Result<Capabilities, NodeError> {
    loop {
        if let Some(caps) = t.probe().get() {
            return Ok(caps);
        }
        if let Some(_turn) = t.probe().check_turn().await {
            return Box::pin(check(t, key, fence_key)).await;
        }
    }
}

/// The lock key holds another type: worded as the scripts word it.
fn lock_wrong_type(what: &Script, _key: &str, e: NodeError) -> NodeError {
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
async fn set_if(
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
async fn own_token_extend(
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
async fn acquire_native(
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
async fn acquire_fresh_unrecorded(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
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
    let reply = t
        .command(
            &scripts::SET_NX,
            key,
            &["SET", key, token.as_str(), "NX", "GET", "PX", &ttl],
        )
        .await;
    match note_refused(t, note(t, reply)) {
        Ok(reply) => scripts::parse_set_nx_get(reply),
        // Word it as the acquire script does: the lock key is the problem.
        Err(e) if e.kind() == NodeErrorKind::WrongType => {
            Err(lock_wrong_type(&scripts::SET_NX, key, e))
        }
        Err(e) => Err(e),
    }
}

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

fn fence_error(message: String) -> NodeError {
    NodeError::not_applied(NodeErrorKind::Fence, message)
}

/// Checks a fence counter's `GET` and `PTTL` replies as the fenced script does: a non-negative decimal
/// integer below 2^63-1 (or absent) without a TTL.
fn check_fence(fence_key: &str, value: &Reply, pttl: &Reply) -> Result<(), NodeError> {
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
fn incr_refused(fence_key: &str, e: NodeError) -> NodeError {
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
async fn fence_writable(t: &impl Transport, key: &str, fence_key: &str) -> Result<(), NodeError> {
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

/// The capabilities to choose a release or extension path by: a scripts-only node needs no check (the
/// scripts are the path), the others check an unchecked connection first.
async fn path(t: &impl Transport, key: &str) -> Result<Option<Capabilities>, NodeError> {
    match t.probe().get() {
        Some(caps) => Ok(Some(caps)),
        None if t.probe().mode() == Commands::Scripts => Ok(None),
        None => checked(t, key, None).await.map(Some),
    }
}

/// The notification channel of `key` and the command that publishes on it: `SPUBLISH` (a sharded channel in
/// the key's slot) on a cluster, `PUBLISH` otherwise.
fn publish_args(t: &impl Transport, key: &str) -> (String, &'static str) {
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
async fn release_native(t: &impl Transport, key: &str, token: &Token) -> Result<bool, NodeError> {
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

/// An acquisition that reports the holder's TTL on contention, and marks the lock's waiter marker
/// ([`notify::waiting_key`]) before it reads that TTL, so that the holder's release publishes. A fresh one is
/// the usual fresh acquisition (`SET … NX GET`, one command when it wins) followed, only when the lock is
/// held, by [`waiting`] (a waiter pays one more command and round trip before it waits; a winner pays
/// nothing). A retry is the [`ACQUIRE_TTL`](scripts::ACQUIRE_TTL) script with the marker (one command
/// either way, marking in the same atomic step), or without Lua the native acquisition followed, on
/// contention, by [`waiting`].
async fn acquire_or_ttl_unrecorded(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    fresh: bool,
) -> Result<Claim, NodeError> {
    let taken = if fresh {
        acquire_fresh(t, key, token, ttl).await?
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
async fn waiting(
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

/// [`extend_watched`] for many keys of one slot at once, in three round trips whatever their number (one by
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
        let _gate = t.probe().tx_gate().await;
        t.notice_reconnections();
        let generation = t.probe().generation();
        let watch: Vec<&str> = std::iter::once("WATCH")
            .chain(keys.iter().copied())
            .collect();
        note(t, t.command(what, first.key, &watch).await)?;
        let mget: Vec<&str> = std::iter::once("MGET")
            .chain(keys.iter().copied())
            .collect();
        let values = match note(t, t.command(what, first.key, &mget).await) {
            Ok(Reply::Array(values)) if values.len() == items.len() => values,
            other => {
                let _ = t.command(what, first.key, &["UNWATCH"]).await;
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
            let _ = note(t, t.command(what, first.key, &["UNWATCH"]).await);
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
        let replies = note(t, t.transaction(what, first.key, &cmds).await)?;
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

/// How many times the watched extension starts again after its `EXEC` was aborted by a change of the key
/// between `WATCH` and `EXEC` (another request of the same holder, or the key's expiry).
const WATCHED_ATTEMPTS: usize = 3;

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
async fn extend_watched(
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
    let _gate = t.probe().tx_gate().await;
    t.notice_reconnections();
    let generation = t.probe().generation();
    note(t, t.command(what, key, &["WATCH", key]).await)?;
    let ours = match note(t, t.command(what, key, &["GET", key]).await) {
        Ok(Reply::Bytes(value)) => value == token.as_str().as_bytes(),
        Ok(Reply::Nil) => false,
        other => {
            // Nothing to extend with: the WATCH is ended (also by the connection's end, if it failed).
            let _ = t.command(what, key, &["UNWATCH"]).await;
            return match other {
                Ok(reply) => Err(scripts::unexpected_reply(what, &reply)),
                Err(e) => Err(e),
            };
        }
    };
    if !ours {
        let _ = note(t, t.command(what, key, &["UNWATCH"]).await);
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
    )?;
    match replies.as_slice() {
        // EXEC aborted: the key was touched since the WATCH.
        [] => Ok(None),
        // 1: extended; 0: the TTL it had was longer (kept). Ours either way.
        [Reply::Int(0 | 1)] => Ok(Some(true)),
        _ => Err(scripts::unexpected_reply(what, &Reply::Array(replies))),
    }
}

/// A read/write or fair lock's acquisition as [`RW_PERMIT`](scripts::RW_PERMIT) takes it: the operation's name,
/// the claim's life (ms) and the queue limit (a fenced writer's fence key: [`PermitOp::fence_key`]); `None`
/// for the semaphore's operations.
fn rw_permit_args(op: PermitOp<'_>) -> Option<(&'static str, u64, u32)> {
    match op {
        PermitOp::AcquireShared => Some(("shared", 1, 1)),
        PermitOp::AcquireExclusive { claim, .. } => Some(("exclusive", claim.as_millis(), 1)),
        PermitOp::AcquireFair { claim, queue } => Some(("fair", claim.as_millis(), queue.max(1))),
        _ => None,
    }
}

/// A read/write or fair lock's acquisition: the [`RW_PERMIT`](scripts::RW_PERMIT) script, or where scripts
/// cannot run (or the node is pinned to native commands) [`rw_watched`].
async fn rw_permit(
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
    let script_args = [token.as_str(), &millis, name, &claim, &queue];
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
///   [`permit_watched`] (the script sets it exactly; an exact value computed from a read could cut another
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
/// read under `WATCH` and a conditional write, as [`permit_watched`] does for the semaphore.
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
/// reader writes nothing (`UNWATCH`). A full fair queue is a definite `Busy` error, a key of another type
/// `WrongType`, both before any write. From the `WATCH` to the `EXEC` the call holds the node's transaction
/// gate ([`Probe::tx_gate`]), and a reconnect noticed in between fails it before the transaction is sent.
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
async fn rw_watched(
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
    let gate = t.probe().tx_gate().await;
    t.notice_reconnections();
    let generation = t.probe().generation();
    let watch: &[&str] = match fence_key {
        Some(fence_key) => &["WATCH", key, fence_key],
        None => &["WATCH", key],
    };
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
    let plan = match plan {
        Ok(plan) if !plan.writes.is_empty() => plan,
        other => {
            unwatch().await;
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
        return Err(NodeError::not_applied(
            NodeErrorKind::Connection,
            format!(
                "{}: the connection was replaced between WATCH and EXEC, so the write could not be made \
                 conditional (not sent)",
                what.name
            ),
        ));
    }
    let cmds: Vec<Vec<&str>> = plan
        .writes
        .iter()
        .map(|c| c.iter().map(String::as_str).collect())
        .collect();
    let cmds: Vec<&[&str]> = cmds.iter().map(Vec::as_slice).collect();
    let result = note(t, t.transaction(what, key, &cmds).await);
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
        // Aborted by the WATCH: nothing ran.
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
    let args = [token.as_str(), &millis, name, &permits, &channel, command];
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
const PERMIT_ATTEMPTS: usize = 5;

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
fn parse_scored(what: &Script, reply: Reply) -> Result<Vec<(Vec<u8>, u64)>, NodeError> {
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
async fn server_millis(t: &impl Transport, what: &Script, key: &str) -> Result<u64, NodeError> {
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
///   written). Otherwise `UNWATCH` and "full" (with the time until the earliest live permit expires) or
///   "not held", nothing written. From the `WATCH` to the `EXEC` the call holds the node's transaction gate
///   ([`Probe::tx_gate`]), and a reconnect noticed in between fails the call before the transaction is
///   sent, as in [`extend_watched`].
/// - **Release** needs no read: `MULTI ZREMRANGEBYSCORE key -inf now ZREM key c:token o:token ZREM key token
///   s:token x:token EXEC` (an expired permit is purged first, so removing it answers "not held"; a waiting
///   writer's claim or a fair waiter's place and arrival marker go either way, as in the script); one that
///   removed a permit then publishes the release notification (a separate command, whose refusal by a
///   channel ACL leaves the release done), as the script publishes.
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
async fn permit_watched(
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
    // After the removal, as the script publishes.
    let (channel, command) = publish_args(t, key);
    let _ = note(
        t,
        t.command(what, key, &[command, &channel, notify::payload(token)])
            .await,
    );
    Ok(PermitReply::Done)
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
    let gate = t.probe().tx_gate().await;
    t.notice_reconnections();
    let generation = t.probe().generation();
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
            unwatch().await;
            let next = live.iter().map(|at| at - now).min();
            return Ok(Some(PermitReply::Full {
                next_expiry: next.map(std::time::Duration::from_millis),
            }));
        }
        None if !mine => {
            unwatch().await;
            return Ok(Some(PermitReply::NotHeld));
        }
        _ => {}
    }
    t.notice_reconnections();
    if t.probe().generation() != generation {
        return Err(NodeError::not_applied(
            NodeErrorKind::Connection,
            format!(
                "{}: the connection was replaced between WATCH and EXEC, so the write could not be made \
                 conditional (not sent)",
                what.name
            ),
        ));
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
/// own ([`permit_watched`]).
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

/// Names `INFO server` in messages.
const INFO: Script = Script {
    name: "INFO server (run_id)",
    source: "",
    sha1: "",
};

/// Names `WAIT`/`WAITAOF` in messages.
const WAIT: Script = Script {
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
    {
        let state = t.probe().lock();
        if let (Some(conn), Some((on, id))) = (before, &state.run_id)
            && conn == *on
        {
            return Ok(reported(&state, id.clone()));
        }
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
    let Reply::Bytes(text) = reply else {
        return Err(NodeError::not_applied(
            NodeErrorKind::Protocol,
            "INFO server did not answer with text",
        ));
    };
    let text = String::from_utf8_lossy(&text);
    let field = |name: &str| info_field(&text, name);
    let id = info_field(&text, "run_id").ok_or_else(|| {
        NodeError::not_applied(NodeErrorKind::Protocol, "INFO server has no run_id line")
    })?;
    let id = RunId::new(id);
    let uptime = field("uptime_in_seconds")
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

/// The value of `name` in an `INFO` reply (`name:value` lines), if present and not empty.
pub(crate) fn info_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// How much longer than its `uptime_in_seconds` a server may have run (see [`run_id`]): a second for the
/// rounding, and half a second for the server's cached clock.
const UPTIME_MARGIN: std::time::Duration = std::time::Duration::from_millis(1500);

/// `id` as reported: with how long ago this node saw it replace another run id, if it did.
fn reported(state: &ProbeState, id: RunId) -> RunId {
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

fn unknown_command(e: &NodeError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("unknown command") || text.contains("unknown subcommand")
}

// The write operations, recording the connection generation each key was written in (for `wait_replicas`).
// The generation is taken before the write is sent, after acting on reconnections the client announced: a
// reconnect noticed while it is on its way makes the `WAIT` after it fail rather than count another
// connection's writes.

/// Runs the write `op` makes on `key` and records it when `wrote` says the key now holds our token. `op` is
/// called after the generation is read, so nothing is sent before.
///
/// `op` makes the future here rather than being one: a future passed in is kept twice in the future that
/// awaits it (as captured, and as moved into the place it is polled from), and it is the whole operation, a
/// client's command future included (fred's alone is about 5 KB), so the node's boxed future would be twice
/// as large, allocated and copied on every call. (Not an `async fn` either, which keeps its arguments twice
/// too.)
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its future; an async block, once"
)]
fn recorded<T, F>(
    t: &impl Transport,
    key: &str,
    op: impl FnOnce() -> F,
    wrote: impl FnOnce(&T) -> bool,
) -> impl Future<Output = Result<T, NodeError>>
where
    F: Future<Output = Result<T, NodeError>>,
{
    async move {
        t.notice_reconnections();
        let generation = t.probe().generation();
        let r = op().await;
        if r.as_ref().is_ok_and(wrote) {
            t.probe().wrote(key, generation);
        }
        r
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

pub(crate) async fn acquire_fresh(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    recorded(
        t,
        key,
        || acquire_fresh_unrecorded(t, key, token, ttl),
        |ok| *ok,
    )
    .await
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

pub(crate) async fn acquire_or_ttl(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
    fresh: bool,
) -> Result<Claim, NodeError> {
    let op = || acquire_or_ttl_unrecorded(t, key, token, ttl, fresh);
    recorded(t, key, op, |c| matches!(c, Claim::Taken)).await
}

pub(crate) async fn extend(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    recorded(t, key, || extend_unrecorded(t, key, token, ttl), |ok| *ok).await
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
            let mut args: Vec<&str> = tokens.collect();
            args.push(command);
            args.extend(channels.iter().map(String::as_str));
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
    use std::collections::VecDeque;

    /// A transport that answers from a script of replies and records what was sent.
    #[derive(Default)]
    struct Scripted {
        probe: Probe,
        replies: Mutex<VecDeque<Result<Reply, NodeError>>>,
        txs: Mutex<VecDeque<Result<Vec<Reply>, NodeError>>>,
        sent: Mutex<Vec<String>>,
        tx_args: Mutex<Vec<Vec<Vec<String>>>>,
        /// The replies of the second command of `command_and_publish` (`Int(0)`, "no waiter", when empty).
        seconds: Mutex<VecDeque<Option<Reply>>>,
        /// What [`Transport::connection_id`] names (`None`: a connection the client may replace unnoticed).
        conn: Mutex<Option<u64>>,
    }

    impl Transport for Scripted {
        async fn script_once(
            &self,
            _: Verb,
            script: &Script,
            _: &[&str],
            _: &[&str],
        ) -> Result<Reply, NodeError> {
            panic!("no script may run here: {}", script.name)
        }
        async fn command(&self, _: &Script, _: &str, args: &[&str]) -> Result<Reply, NodeError> {
            self.sent.lock().unwrap().push(args[0].to_owned());
            self.replies.lock().unwrap().pop_front().expect("a reply")
        }
        async fn transaction(
            &self,
            _: &Script,
            _: &str,
            cmds: &[&[&str]],
        ) -> Result<Vec<Reply>, NodeError> {
            let names: Vec<&str> = cmds.iter().map(|c| c[0]).collect();
            self.tx_args.lock().unwrap().push(
                cmds.iter()
                    .map(|c| c.iter().map(|a| (*a).to_owned()).collect())
                    .collect(),
            );
            self.sent
                .lock()
                .unwrap()
                .push(format!("MULTI {}", names.join(" ")));
            self.txs
                .lock()
                .unwrap()
                .pop_front()
                .expect("a transaction reply")
        }
        async fn command_and_publish(
            &self,
            _: &Script,
            _: &str,
            args: &[&str],
            publish: &[&str],
        ) -> Result<(Reply, Option<Reply>), NodeError> {
            self.sent
                .lock()
                .unwrap()
                .push(format!("{}+{}", args[0], publish[0]));
            self.tx_args.lock().unwrap().push(vec![
                args.iter().map(|a| (*a).to_owned()).collect(),
                publish.iter().map(|a| (*a).to_owned()).collect(),
            ]);
            let second = self
                .seconds
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Some(Reply::Int(0)));
            self.replies
                .lock()
                .unwrap()
                .pop_front()
                .expect("a reply")
                .map(|r| (r, second))
        }
        fn clustered(&self) -> bool {
            false
        }
        fn probe(&self) -> &Probe {
            &self.probe
        }
        fn connection_id(&self, _: &str) -> Option<u64> {
            *self.conn.lock().unwrap()
        }
    }

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

    fn native() -> Scripted {
        let t = Scripted::default();
        t.probe.set_mode(Commands::Native);
        // The fence key "f" known writable (its check is `fence_writable`'s own transaction).
        t.probe.lock().writable_fences.insert("f".to_owned());
        t.probe.set(Capabilities {
            lua: false,
            set_nx_get: true,
            set_ifeq: true,
            delifeq: true,
            commands: Commands::Native,
        });
        t
    }

    /// A minimal executor for futures that never wait (the scripted transport answers at once).
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        use std::task::{Context, Poll, Wake, Waker};
        struct Noop;
        impl Wake for Noop {
            fn wake(self: Arc<Self>) {}
        }
        let waker = Waker::from(Arc::new(Noop));
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }

    #[test]
    fn writes_before_a_noticed_reconnect_are_stale_until_written_again() {
        let probe = Probe::default();
        let before = probe.generation();
        probe.wrote("a", before);
        assert!(!probe.written_before_a_reconnect("a"));
        probe.forget();
        assert!(
            probe.written_before_a_reconnect("a"),
            "written on the replaced connection"
        );
        // A write whose generation was taken before the reconnect counts as on the old connection.
        probe.wrote("b", before);
        assert!(probe.written_before_a_reconnect("b"));
        probe.wrote("a", probe.generation());
        assert!(
            !probe.written_before_a_reconnect("a"),
            "written again on the new one"
        );
        assert!(!probe.written_before_a_reconnect("never written"));
        // A refused command forgets the checks, not the connection.
        probe.wrote("c", probe.generation());
        probe.forget_checks();
        assert!(!probe.written_before_a_reconnect("c"));
        // Bounded: the most recent writes are always known, however many keys were written.
        for i in 0..3 * WRITES_KEPT {
            probe.wrote(&format!("k{i}"), probe.generation());
        }
        probe.forget();
        assert!(probe.written_before_a_reconnect(&format!("k{}", 3 * WRITES_KEPT - 1)));
        assert!(probe.written_before_a_reconnect(&format!("k{}", 2 * WRITES_KEPT)));
        let state = probe.lock();
        assert!(
            state
                .writes
                .stale
                .iter()
                .all(|set| set.len() <= WRITES_KEPT)
        );
    }

    /// A write whose generation was taken before the call opened the node's first connection went on that
    /// connection: it counts for `WAIT`. A connection lost (noticed) or replaced unnoticed does not.
    #[test]
    fn the_first_write_on_a_newly_opened_connection_counts_for_wait() {
        let probe = Probe::default();
        let before = probe.generation();
        probe.opened();
        probe.wrote("first", before);
        assert!(!probe.written_before_a_reconnect("first"));
        // Lost, then opened again: the write on the lost one is stale, one made after the loss is not.
        probe.forget();
        let after_loss = probe.generation();
        probe.opened();
        probe.wrote("second", after_loss);
        assert!(probe.written_before_a_reconnect("first"));
        assert!(!probe.written_before_a_reconnect("second"));
        // Opened again with no loss noticed (replaced): the writes before are stale.
        probe.opened();
        assert!(probe.written_before_a_reconnect("second"));
    }

    fn info(run_id: &str) -> Result<Reply, NodeError> {
        Ok(Reply::Bytes(
            format!("# Server\r\nredis_version:7.0.15\r\nrun_id:{run_id}\r\n").into_bytes(),
        ))
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

    fn time(millis: u64) -> Result<Reply, NodeError> {
        Ok(Reply::Array(vec![
            Reply::Bytes((millis / 1000).to_string().into_bytes()),
            Reply::Bytes(((millis % 1000) * 1000).to_string().into_bytes()),
        ]))
    }

    fn scored(members: &[(&str, u64)]) -> Result<Reply, NodeError> {
        Ok(Reply::Array(
            members
                .iter()
                .flat_map(|(m, s)| {
                    [
                        Reply::Bytes(m.as_bytes().to_vec()),
                        Reply::Bytes(s.to_string().into_bytes()),
                    ]
                })
                .collect(),
        ))
    }

    const TWO: PermitOp<'static> = PermitOp::Acquire { permits: 2 };

    /// Without Lua: a full semaphore (expired permits not counted) writes nothing and reports the time until
    /// the earliest live permit expires, by the server's clock.
    #[test]
    fn a_full_semaphore_without_lua_writes_nothing_and_reports_the_earliest_expiry() {
        let t = native();
        let ok = || Ok(Reply::Bytes(b"OK".to_vec()));
        let members = [("a", 1_000_900), ("old", 1_000_100), ("b", 1_000_700)];
        t.replies
            .lock()
            .unwrap()
            .extend([ok(), time(1_000_500), scored(&members), ok()]);
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
            ["WATCH", "TIME", "ZRANGE", "UNWATCH"]
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
        let err = block_on(acquire_or_ttl(&t, "l", &token, ttl, true)).unwrap_err();
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
            let claim = block_on(acquire_or_ttl(&t, "l", &token, ttl, true)).unwrap();
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
        let claim = block_on(acquire_or_ttl(&t, "l", &token, ttl, true)).unwrap();
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

    /// A plan's commands as `&str`s, for comparing.
    fn cmds(plan: &RwPlan) -> Vec<Vec<&str>> {
        plan.writes
            .iter()
            .map(|c| c.iter().map(String::as_str).collect())
            .collect()
    }

    fn members(list: &[(&str, u64)]) -> Vec<(Vec<u8>, u64)> {
        list.iter()
            .map(|(m, s)| (m.as_bytes().to_vec(), *s))
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
        // A blocked reader: nothing written.
        let t = native();
        t.replies
            .lock()
            .unwrap()
            .extend([ok(), time(NOW), scored(&[("x:w", NOW + 250)]), ok()]);
        let reply = block_on(permit(&t, "k", &token, ttl, PermitOp::AcquireShared)).unwrap();
        assert_eq!(
            reply,
            PermitReply::Full {
                next_expiry: Some(std::time::Duration::from_millis(250))
            }
        );
        assert_eq!(
            *t.sent.lock().unwrap(),
            ["WATCH", "TIME", "ZRANGE", "UNWATCH"]
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
        // Release of a writer: its entry, claim and marker go; published once.
        let t = native();
        t.replies
            .lock()
            .unwrap()
            .extend([time(NOW), Ok(Reply::Int(1))]);
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
            ["TIME", "MULTI ZREMRANGEBYSCORE ZREM ZREM", "PUBLISH"]
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
}
