//! redis-rs commands and pipelines for scripts, plain commands and transactions, each sent once.

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};
use redlease::NodeError;

use crate::ops::Verb;
use crate::scripts::{self, Reply, Script};

use super::error::{classify, classify_aborted, to_reply};

pub(super) fn script_cmd(verb: Verb, script: &Script, keys: &[&str], args: &[&str]) -> Cmd {
    let mut cmd = redis::cmd(verb.as_str());
    cmd.arg(match verb {
        Verb::Eval => script.source,
        Verb::EvalSha => script.sha1,
    })
    .arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

pub(super) fn transaction_pipe(cmds: &[&[&str]]) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    // Per-command results, so that an error inside EXEC is reported as that command's server error.
    pipe.atomic().ignore_errors();
    for args in cmds {
        pipe.add_command(plain_cmd(args));
    }
    pipe
}

/// `MULTI`, `GET key`, `PTTL key`, `EXEC` as a plain pipeline: one reply per command, whatever the server refuses (see
/// [`Transport::probe_transaction`](crate::ops::Transport::probe_transaction)).
pub(super) fn probe_pipe(key: &str) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("MULTI")
        .cmd("GET")
        .arg(key)
        .cmd("PTTL")
        .arg(key)
        .cmd("EXEC");
    pipe
}

pub(super) fn plain_cmd(args: &[&str]) -> Cmd {
    let mut cmd = redis::cmd(args.first().copied().unwrap_or(""));
    for arg in args.iter().skip(1) {
        cmd.arg(*arg);
    }
    cmd
}

/// Sends the atomic pipeline `pipe` (`MULTI … EXEC`) once on `conn`: the replies, or the first error.
pub(super) async fn send_transaction(
    conn: &mut (impl ConnectionLike + Send),
    pipe: &redis::Pipeline,
    what: &Script,
) -> Result<Vec<Reply>, NodeError> {
    let results = pipe
        .query_async::<Vec<redis::RedisResult<Value>>>(conn)
        .await
        .map_err(|e| classify_aborted(what, &e))?;
    // The first command error (a server reply inside EXEC's array: definite, classified by its code).
    results
        .into_iter()
        .map(|r| r.map(to_reply).map_err(|e| classify(Some(what), &e)))
        .collect()
}

/// Sends `cmd` and, pipelined behind it, `publish` once on `conn`: the reply of `cmd` (that of `publish` is
/// ignored).
pub(super) async fn send_publishing(
    conn: &mut (impl ConnectionLike + Send),
    cmd: Cmd,
    publish: Cmd,
    what: &Script,
) -> Result<(Reply, Option<Reply>), NodeError> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.add_command(cmd);
    pipe.add_command(publish);
    let results = pipe
        .query_async::<Vec<redis::RedisResult<Value>>>(conn)
        .await
        .map_err(|e| classify(Some(what), &e))?;
    let mut results = results.into_iter();
    let Some(first) = results.next() else {
        return Err(scripts::unexpected_reply(what, &Reply::Array(Vec::new())));
    };
    let second = results.next().and_then(Result::ok).map(to_reply);
    first
        .map(|r| (to_reply(r), second))
        .map_err(|e| classify(Some(what), &e))
}

/// Sends `cmd` once on `conn`, classifying its error.
pub(super) async fn send(
    conn: &mut (impl ConnectionLike + Send),
    cmd: &Cmd,
    what: &Script,
) -> Result<Reply, NodeError> {
    cmd.query_async::<Value>(conn)
        .await
        .map(to_reply)
        .map_err(|e| classify(Some(what), &e))
}
