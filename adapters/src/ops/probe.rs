//! The capability check: what a connection offers and permits (the probe script, or the native
//! probes where scripts cannot run), remembered per connection in [`Probe`], and the start-up readiness.

use std::sync::{Arc, Mutex};

use redlease::{CommandPaths, NodeError, NodeErrorKind, Path, Readiness, RunId, Token};

use crate::scripts::{self, Reply, Script};
use crate::{Capabilities, Commands};

use super::ledger::{CheckTurn, TxGate, Writes};
use super::replication::run_id;
use super::{Transport, Verb, note, probe_tx, tx};

/// The capability state of one connection, shared by the clones of a node: the configured mode and, once
/// checked, what the connection offers.
#[derive(Debug, Default, Clone)]
pub(crate) struct Probe(Arc<Mutex<ProbeState>>);

#[derive(Default)]
pub(super) struct ProbeState {
    pub(super) mode: Commands,
    pub(super) caps: Option<Capabilities>,
    /// Fenced acquisitions without Lua that wrote their lock: `(key, token, fence)`, the fence `None` while
    /// its number is not confirmed. Newest last, at most [`FENCES_KEPT`].
    pub(super) fences: std::collections::VecDeque<(String, String, Option<u64>)>,
    /// The server's run id, learned with `INFO server` on the connection the transport names
    /// ([`Transport::connection_id`]) — only on a connection the transport can name, and only when the
    /// `INFO` went out and came back on it (see [`run_id`]); also forgotten with the capabilities.
    pub(super) run_id: Option<(u64, RunId)>,
    /// When the server behind [`seen_run_id`](Self::seen_run_id) started, as far as the node knows: set when
    /// a run id replaced another one (from the new server's uptime), so that its reports carry how long ago
    /// the restart happened ([`RunId::with_restarted_ago`]).
    pub(super) restarted_at: Option<std::time::Instant>,
    /// When a server first answered this node (any reply, on any connection; never forgotten): a run id
    /// read later from a server whose uptime is clearly shorter than that is a restart the node did not see
    /// (see [`run_id`]).
    pub(super) first_contact: Option<std::time::Instant>,
    /// Whether the server lacks `WAITAOF` (an unknown command), once seen.
    pub(super) no_waitaof: bool,
    /// The last run id learned on any connection (kept when the probe is forgotten): a new one means another
    /// server process, whose capabilities are checked again.
    pub(super) seen_run_id: Option<RunId>,
    /// Counts the connection changes the node noticed ([`Probe::forget`], [`Probe::opened`]).
    pub(super) generation: u64,
    /// The generation in which the node last opened a connection ([`Probe::opened`]).
    pub(super) opened_in: Option<u64>,
    /// Which keys were last written over a connection the node has since seen replaced.
    pub(super) writes: Writes,
    /// Whether a call is running the capability check, and the calls waiting for its answer.
    pub(super) checking: bool,
    pub(super) check_waiters: Vec<std::task::Waker>,
    /// Fence keys this connection's user was found allowed to write (Lua-less fenced acquisition), forgotten
    /// with the capabilities; at most [`WRITES_KEPT`](super::ledger::WRITES_KEPT).
    pub(super) writable_fences: std::collections::HashSet<String>,
    /// Whether a call holds the transaction gate ([`Probe::tx_gate`]), and the calls waiting for it.
    pub(super) tx_busy: bool,
    /// A key whose connection may still carry the `WATCH` of a call cut before its `EXEC` (see
    /// [`TxGate`]): the gate's next holder sends `UNWATCH` there first.
    pub(super) stale_watch: Option<String>,
    pub(super) tx_waiters: Vec<std::task::Waker>,
}

/// How many native fenced acquisitions a node remembers for their retries (a retry follows its first attempt
/// within one acquisition; the oldest confirmed entries are dropped first, unconfirmed ones never: a node
/// with this many unconfirmed in flight refuses the next, before writing).
pub(super) const FENCES_KEPT: usize = 256;

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
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, ProbeState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self) -> Option<Capabilities> {
        self.lock().caps
    }

    pub(super) fn set(&self, caps: Capabilities) {
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
    /// watched extension ([`extend_watched`](super::lock::extend_watched)) from its `WATCH` to its `EXEC`, so that no other `EXEC` of the
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
        TxGate {
            probe: self,
            watching: None,
        }
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
        // A new connection carries no WATCH.
        state.stale_watch = None;
    }

    /// The key whose connection may still carry a cut call's `WATCH` (see [`TxGate`]), if any.
    pub(crate) fn stale_watch(&self) -> Option<String> {
        self.lock().stale_watch.clone()
    }

    /// That `WATCH` was ended (an `UNWATCH` for `key` answered).
    pub(crate) fn unwatched(&self, key: &str) {
        let mut state = self.lock();
        if state.stale_watch.as_deref() == Some(key) {
            state.stale_watch = None;
        }
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
    pub(super) fn forget_checks(&self) {
        let mut state = self.lock();
        state.caps = None;
        state.writable_fences.clear();
        state.run_id = None;
        state.no_waitaof = false;
    }

    pub(super) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// A server answered: the node's first contact, if it is.
    pub(super) fn answered(&self) {
        let mut state = self.lock();
        if state.first_contact.is_none() {
            state.first_contact = Some(std::time::Instant::now());
        }
    }

    /// Records a write of `key` sent in connection generation `generation`.
    pub(super) fn wrote(&self, key: &str, generation: u64) {
        self.wrote_all([key], generation);
    }

    /// Records writes of `keys` sent in connection generation `generation` (one lock for all of them).
    pub(super) fn wrote_all<'k>(&self, keys: impl IntoIterator<Item = &'k str>, generation: u64) {
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
    pub(super) fn fence(&self, key: &str, token: &Token) -> Option<Option<u64>> {
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
    pub(super) fn record_fence(&self, key: &str, token: &Token, fence: Option<u64>) -> bool {
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

    pub(super) fn forget_fence(&self, key: &str, token: &Token) {
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
pub(super) fn scripts_denied(err: &NodeError) -> bool {
    let message = err.message();
    err.kind() == NodeErrorKind::Auth
        && !err.is_ambiguous()
        && (message.contains("NOPERM")
            || message.contains("The user executing the script can't")
            || message.contains("no permissions"))
}

/// Whether a refusal of `EVAL` says that the server runs no Lua (Valkey without its Lua module, a server
/// built without scripting).
pub(super) fn lua_absent(err: &NodeError) -> bool {
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
pub(super) fn denied(err: &NodeError) -> bool {
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
pub(super) async fn transactions_refused(
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
    let mut gate = super::gate(t, watch).await;
    gate.watching(key);
    match note(t, t.command(watch, key, &["WATCH", key]).await) {
        Ok(_) => {
            note(t, t.command(watch, key, &["UNWATCH"]).await)?;
            gate.unwatched();
            Ok(None)
        }
        Err(e) if denied(&e) => {
            // Refused: no WATCH was armed.
            gate.unwatched();
            Ok(Some(e))
        }
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
pub(super) fn from_script(found: [bool; 3], mode: Commands) -> Capabilities {
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
pub(super) async fn script_probe_failed(
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
pub(super) fn login_refused(err: &NodeError) -> bool {
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
/// [`path`](super::path) and in the fresh acquisition), so that the operations' futures, nested whole into the node's,
/// carry a pointer to it rather than its many states.
pub(super) async fn checked(
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
