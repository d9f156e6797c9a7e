//! The lock operations, written once on top of the primitives each client adapter supplies, and the
//! per-connection capability check that runs before a connection's first write.
//!
//! # The capability check
//!
//! Every operation but a fresh acquisition is a script, so a user who may not run `EVAL` (or a command inside
//! the scripts, such as `DEL`) could take a lock with a plain `SET` and then neither extend nor release it.
//! So the first acquisition on a connection, and the first after the connection failed (a reconnecting client
//! may then be talking to another server, or under a changed ACL), checks first: a fresh acquisition runs
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
//! existing key, so a late copy of a fresh acquisition cannot reset a lease's TTL. Later capabilities (native
//! compare-and-delete, …) extend the same probe and [`Caps`].

use std::sync::{Arc, Mutex};

use redlease::{KeyState, NodeError, NodeErrorKind, Token, Ttl, async_trait};

use crate::scripts::{self, Reply, Script};
use crate::slot;

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

/// What a connection was found to permit and support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    /// `SET key value NX GET …` is accepted (Redis 7.0+).
    pub(crate) set_nx_get: bool,
}

/// The capability state of one connection, shared by the clones of a node.
#[derive(Debug, Default, Clone)]
pub(crate) struct Probe(Arc<Mutex<Option<Caps>>>);

impl Probe {
    fn get(&self) -> Option<Caps> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, caps: Caps) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(caps);
    }

    pub(crate) fn forget(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// What a client adapter provides: one script command and one plain command, each sent exactly once, with its
/// errors classified.
#[async_trait]
pub(crate) trait Transport: Send + Sync {
    /// Sends `verb` (`EVAL` with the source, or `EVALSHA` with the digest) of `script` once.
    async fn script_once(
        &self,
        verb: Verb,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Reply, NodeError>;

    /// Sends the plain command `args` (its name first) once, routed by `key`; `what` names it in messages.
    async fn command(&self, what: &Script, key: &str, args: &[&str]) -> Result<Reply, NodeError>;

    /// Whether the keys of one call must share a Redis Cluster slot (checked before anything is sent).
    fn clustered(&self) -> bool;

    /// The capability state of the connection(s) this transport sends on.
    fn probe(&self) -> &Probe;
}

/// After a failed connection the next acquisition checks again: the client may reconnect to another server.
fn note<T>(t: &impl Transport, result: Result<T, NodeError>) -> Result<T, NodeError> {
    if let Err(e) = &result {
        if matches!(e.kind(), NodeErrorKind::Connection | NodeErrorKind::Io) {
            t.probe().forget();
        }
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
    note(t, result)
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

/// Runs the capability probe now with `key` (and `fence_key`) as the example keys, and remembers the answer.
pub(crate) async fn check(
    t: &impl Transport,
    key: &str,
    fence_key: Option<&str>,
) -> Result<Caps, NodeError> {
    let keys: Vec<&str> = std::iter::once(key).chain(fence_key).collect();
    let script = &scripts::PROBE;
    let reply = note(t, t.script_once(Verb::Eval, script, &keys, &[]).await)
        .map_err(|e| probe_refused(Verb::Eval, e))?;
    let caps = Caps {
        set_nx_get: scripts::parse_flag(script, reply)?,
    };
    t.probe().set(caps);
    Ok(caps)
}

async fn checked(
    t: &impl Transport,
    key: &str,
    fence_key: Option<&str>,
) -> Result<Caps, NodeError> {
    match t.probe().get() {
        Some(caps) => Ok(caps),
        None => check(t, key, fence_key).await,
    }
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

pub(crate) async fn acquire(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    checked(t, key, None).await?;
    acquire_script(t, key, token, ttl).await
}

/// A fresh acquisition: on an unchecked connection the check and the acquisition in one script; then
/// `SET key token NX GET PX ttl` where the server accepts it, else the fresh-acquire script.
pub(crate) async fn acquire_fresh(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    let ttl = ttl.as_millis().to_string();
    let Some(caps) = t.probe().get() else {
        let script = &scripts::PROBE_ACQUIRE;
        let reply = note(
            t,
            t.script_once(Verb::Eval, script, &[key], &[token.as_str(), &ttl])
                .await,
        )
        .map_err(|e| probe_refused(Verb::Eval, e))?;
        let (acquired, set_nx_get) = scripts::parse_probe_acquire(reply)?;
        t.probe().set(Caps { set_nx_get });
        return Ok(acquired);
    };
    if !caps.set_nx_get {
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
    match note(t, reply) {
        Ok(reply) => scripts::parse_set_nx_get(reply),
        // Word it as the acquire script does: the lock key is the problem.
        Err(e) if e.kind() == NodeErrorKind::WrongType => Err(NodeError::not_applied(
            NodeErrorKind::WrongType,
            format!(
                "the SET NX command was refused: WRONGTYPE the lock key {key} holds a value of another type"
            ),
        )
        .with_source(e)),
        Err(e) => Err(e),
    }
}

pub(crate) async fn acquire_fenced(
    t: &impl Transport,
    key: &str,
    fence_key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<Option<u64>, NodeError> {
    if t.clustered() {
        slot::check_same_slot(key, fence_key)?;
    }
    checked(t, key, Some(fence_key)).await?;
    let ttl = ttl.as_millis().to_string();
    let reply = eval(
        t,
        &scripts::ACQUIRE_FENCED,
        &[key, fence_key],
        &[token.as_str(), &ttl],
    )
    .await?;
    scripts::parse_fence(reply)
}

pub(crate) async fn release(
    t: &impl Transport,
    key: &str,
    token: &Token,
) -> Result<bool, NodeError> {
    let reply = eval(t, &scripts::RELEASE, &[key], &[token.as_str()]).await?;
    scripts::parse_flag(&scripts::RELEASE, reply)
}

pub(crate) async fn extend(
    t: &impl Transport,
    key: &str,
    token: &Token,
    ttl: Ttl,
) -> Result<bool, NodeError> {
    let ttl = ttl.as_millis().to_string();
    let reply = eval(t, &scripts::EXTEND, &[key], &[token.as_str(), &ttl]).await?;
    scripts::parse_flag(&scripts::EXTEND, reply)
}

pub(crate) async fn inspect(t: &impl Transport, key: &str) -> Result<Option<KeyState>, NodeError> {
    let reply = eval(t, &scripts::INSPECT, &[key], &[]).await?;
    scripts::parse_inspect(reply)
}
