//! The server replies that choose a path, pinned per server and per client: each is provoked on a real
//! server of every flavor, converted to a [`NodeError`] by each client's `node_error` exactly as the nodes do,
//! and given to the classifier the operations decide by. A server or client release that words a reply
//! differently fails here, by name, instead of silently sending an operation down the wrong path.

// Needs both clients, a runtime for them, and real servers (the testkit starts them).
#![cfg(all(feature = "redis", feature = "fred", feature = "tokio"))]

use redlease::{NodeError, NodeErrorKind};
use redlease_testkit::server::{Flavor, RedisServer};

use super::probe::{denied, login_refused, lua_absent, scripts_denied};
use super::replication::unknown_command;
use super::{evalsha_refused, refused_command, script_unavailable};

/// The clients whose conversion of a server's reply is checked.
#[derive(Debug, Clone, Copy)]
enum Client {
    RedisRs,
    Fred,
}

const CLIENTS: [Client; 2] = [Client::RedisRs, Client::Fred];

/// `args` sent to `url` by `client`: the error it answered, converted as the nodes convert it, or `None` if
/// the command succeeded. A connection that cannot be made (a refused login) is that error.
async fn send(client: Client, url: &str, args: &[&str]) -> Option<NodeError> {
    match client {
        Client::RedisRs => {
            let conn = redis::Client::open(url)
                .expect("a valid URL")
                .get_multiplexed_async_connection()
                .await;
            let mut conn = match conn {
                Ok(c) => c,
                Err(e) => return Some(crate::redis::node_error(&e)),
            };
            let mut cmd = redis::cmd(args[0]);
            for a in &args[1..] {
                cmd.arg(*a);
            }
            cmd.query_async::<redis::Value>(&mut conn)
                .await
                .err()
                .map(|e| crate::redis::node_error(&e))
        }
        Client::Fred => {
            use fred::prelude::{ClientLike, Config};
            use fred::types::{ClusterHash, CustomCommand, Value};
            let config = Config::from_url(url).expect("a valid URL");
            let client = fred::prelude::Builder::from_config(config)
                .build()
                .expect("a fred client");
            if let Err(e) = client.init().await {
                return Some(crate::fred::node_error(&e));
            }
            let cmd = CustomCommand::new(args[0].to_owned(), ClusterHash::FirstKey, false);
            let values: Vec<Value> = args[1..].iter().map(|a| Value::from(*a)).collect();
            let reply = client.custom::<Value, Value>(cmd, values).await;
            let _ = client.quit().await;
            reply.err().map(|e| crate::fred::node_error(&e))
        }
    }
}

/// The error `args` must get on `url` from every client, each checked by `check` (named `what`).
async fn refused(url: &str, args: &[&str], what: &str, check: impl Fn(&NodeError) -> bool) {
    for client in CLIENTS {
        let err = send(client, url, args)
            .await
            .unwrap_or_else(|| panic!("{what}: {args:?} succeeded on {client:?}"));
        assert!(
            check(&err),
            "{what}: {client:?}'s error for {args:?} is not recognised: {:?} {err}",
            err.kind()
        );
    }
}

/// `args` must succeed on `url` with every client.
async fn accepted(url: &str, args: &[&str], what: &str) {
    for client in CLIENTS {
        if let Some(err) = send(client, url, args).await {
            panic!("{what}: {args:?} failed on {client:?}: {err}");
        }
    }
}

const NO_SHA: &str = "0000000000000000000000000000000000000000";

async fn pinned(flavor: Flavor, test: &str) {
    let Some(server) = RedisServer::start_flavor_or_skip(test, flavor, &[]) else {
        return;
    };
    let url = server.url();
    let lua = !matches!(flavor, Flavor::Valkey91NoLua);
    let native_delete = matches!(flavor, Flavor::Valkey91 | Flavor::Valkey91NoLua);
    let set_ifeq = !matches!(flavor, Flavor::Redis);

    // Scripts: a script the server does not know (one `EVAL` follows: Valkey without Lua answers `NOSCRIPT`
    // too), then, without Lua, that `EVAL` refused for want of a scripting engine (the native path).
    let no_script = |e: &NodeError| e.kind() == NodeErrorKind::NoScript;
    refused(&url, &["EVALSHA", NO_SHA, "0"], "NOSCRIPT", no_script).await;
    if lua {
        accepted(&url, &["EVAL", "return 1", "0"], "EVAL").await;
    } else {
        let absent = |e: &NodeError| lua_absent(e) && script_unavailable(e);
        refused(&url, &["EVAL", "return 1", "0"], "no Lua", absent).await;
    }
    // Native commands a server lacks: unknown, or a syntax error (`SET … IFEQ` on Redis 7.0).
    let args = ["DELIFEQ", "pinned:k", "v"];
    if native_delete {
        accepted(&url, &args, "DELIFEQ").await;
    } else {
        refused(&url, &args, "unknown DELIFEQ", refused_command).await;
    }
    let args = ["SET", "pinned:k", "v", "IFEQ", "x"];
    if set_ifeq {
        accepted(&url, &args, "SET IFEQ").await;
    } else {
        refused(&url, &args, "SET IFEQ syntax", refused_command).await;
    }
    let args = ["WAITAOF", "0", "0", "0"];
    if flavor == Flavor::Redis {
        refused(&url, &args, "unknown WAITAOF", unknown_command).await;
    } else {
        accepted(&url, &args, "WAITAOF").await;
    }
    // A lock key of another type.
    server.cmd(&["DEL", "pinned:list"]);
    server.cmd(&["RPUSH", "pinned:list", "x"]);
    let wrong_type = |e: &NodeError| e.kind() == NodeErrorKind::WrongType;
    refused(&url, &["GET", "pinned:list"], "WRONGTYPE", wrong_type).await;

    // ACL: a refused command (not a refused login), and a refused login.
    server.cmd(&[
        "ACL", "SETUSER", "pinned", "reset", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval",
    ]);
    let user = format!("redis://pinned:pw@127.0.0.1:{}/0", server.port());
    let refused_evalsha = |e: &NodeError| {
        e.kind() == NodeErrorKind::Auth
            && denied(e)
            && scripts_denied(e)
            && evalsha_refused(e)
            && script_unavailable(e)
            && !login_refused(e)
    };
    refused(
        &user,
        &["EVALSHA", NO_SHA, "0"],
        "NOPERM EVALSHA",
        refused_evalsha,
    )
    .await;
    let wrong = format!("redis://pinned:nope@127.0.0.1:{}/0", server.port());
    let login = |e: &NodeError| e.kind() == NodeErrorKind::Auth && login_refused(e);
    refused(&wrong, &["PING"], "wrong password", login).await;

    // `maxmemory`: a write refused for memory (the release and extension paths go on by their mode).
    server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let oom = |e: &NodeError| e.kind() == NodeErrorKind::OutOfMemory && !e.is_ambiguous();
    refused(&url, &["SET", "pinned:oom", "v"], "OOM", oom).await;
    server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_that_choose_a_path_are_recognised_on_redis_7_0() {
    pinned(
        Flavor::Redis,
        "replies_that_choose_a_path_are_recognised_on_redis_7_0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_that_choose_a_path_are_recognised_on_valkey_8_1() {
    pinned(
        Flavor::Valkey81,
        "replies_that_choose_a_path_are_recognised_on_valkey_8_1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_that_choose_a_path_are_recognised_on_valkey_9_1() {
    pinned(
        Flavor::Valkey91,
        "replies_that_choose_a_path_are_recognised_on_valkey_9_1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_that_choose_a_path_are_recognised_on_valkey_9_1_without_lua() {
    pinned(
        Flavor::Valkey91NoLua,
        "replies_that_choose_a_path_are_recognised_on_valkey_9_1_without_lua",
    )
    .await;
}
