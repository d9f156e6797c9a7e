//! redis-rs commands and pipelines for scripts, plain commands and transactions, each sent once.

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};
use redlease::NodeError;

use crate::ops::Verb;
use crate::scripts::{self, Reply, Script};

use super::error::{classify, classify_aborted, to_reply};

/// `verb` of `script` with `keys` and `args`, its buffers sized up front (see [`plain_cmd`]).
pub(super) fn script_cmd(verb: Verb, script: &Script, keys: &[&str], args: &[&str]) -> Cmd {
    let body = match verb {
        Verb::Eval => script.source,
        Verb::EvalSha => script.sha1,
    };
    // The key count is written as decimal text: at most 20 digits.
    let data = verb.as_str().len()
        + body.len()
        + 20
        + keys.iter().chain(args).map(|a| a.len()).sum::<usize>();
    let mut cmd = Cmd::with_capacity(3 + keys.len() + args.len(), data);
    cmd.arg(verb.as_str()).arg(body).arg(keys.len());
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

/// `args` (the command's name first) as one command (an empty name when `args` is empty). Its buffers are
/// sized up front, as [`script_cmd`]'s are: grown argument by argument (`redis::cmd`, then `arg`), they
/// reallocate several times per command on the hot path.
pub(super) fn plain_cmd(args: &[&str]) -> Cmd {
    let mut cmd = Cmd::with_capacity(args.len().max(1), args.iter().map(|a| a.len()).sum());
    if args.is_empty() {
        cmd.arg("");
    }
    for arg in args {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizing the buffers up front changes nothing on the wire: the same bytes as the command built argument
    /// by argument.
    #[test]
    fn presized_commands_are_written_as_grown_ones() {
        let grown = |args: &[&str]| {
            let mut cmd = redis::cmd(args.first().copied().unwrap_or(""));
            for arg in args.iter().skip(1) {
                cmd.arg(*arg);
            }
            cmd.get_packed_command()
        };
        for args in [
            &["SET", "k", "token", "NX", "GET", "PX", "30000"][..],
            &["PING"],
            &[],
        ] {
            assert_eq!(
                plain_cmd(args).get_packed_command(),
                grown(args),
                "{args:?}"
            );
        }
        for (verb, body) in [
            (Verb::EvalSha, scripts::RELEASE.sha1),
            (Verb::Eval, scripts::RELEASE.source),
        ] {
            let mut cmd = redis::cmd(verb.as_str());
            cmd.arg(body).arg(2).arg("k").arg("m").arg("t").arg("c");
            let sized = script_cmd(verb, &scripts::RELEASE, &["k", "m"], &["t", "c"]);
            assert_eq!(sized.get_packed_command(), cmd.get_packed_command());
        }
    }
}
