//! The classification of redis-rs errors ([`node_error`]) and the conversion of its replies.

use redis::{ErrorKind, RedisError, Value};
use redlease::{NodeError, NodeErrorKind};

use crate::scripts::{self, Reply, Script};

/// Classifies a redis-rs error into a [`NodeError`] for redlease.
///
/// - a Redis error reply (any server error code) → definite, kind from its code (`NOSCRIPT` → `NoScript`,
///   `OOM` → `OutOfMemory`, `NOPERM`/`NOAUTH`/`WRONGPASS` → `Auth`, `MOVED`/`ASK`/`TRYAGAIN`/`CLUSTERDOWN` →
///   `Cluster`, `BUSY`/`LOADING`/`MASTERDOWN` → `Busy`, …);
/// - failed authentication while connecting → definite `Auth`;
/// - connection refused → definite `Connection` (nothing could have been sent);
/// - errors raised by the client before sending (invalid arguments or configuration) → definite `Other`;
/// - timeouts → ambiguous `Timeout`; other I/O errors and dropped connections → ambiguous `Io`/`Connection`;
/// - unparseable replies → ambiguous `Protocol`; anything else → ambiguous `Other`.
///
/// The message names the operation and the error category, never a token or password.
pub fn node_error(err: &RedisError) -> NodeError {
    classify(None, err)
}

pub(super) fn classify(script: Option<&Script>, err: &RedisError) -> NodeError {
    let what = script.map_or("the command", |s| s.name);
    let server_code = match err.kind() {
        ErrorKind::Server(_) | ErrorKind::Extension => err.code(),
        _ => None,
    };
    let node_err = if let Some(code) = server_code {
        let line = match err.detail() {
            Some(detail) => format!("{code} {detail}"),
            None => code.to_owned(),
        };
        scripts::server_error(script.unwrap_or(&scripts::COMMAND), &line)
    } else {
        match err.kind() {
            ErrorKind::AuthenticationFailed => NodeError::not_applied(
                NodeErrorKind::Auth,
                format!("{what}: authentication failed"),
            ),
            ErrorKind::Io if err.is_connection_refusal() => NodeError::not_applied(
                NodeErrorKind::Connection,
                format!("{what}: connection refused"),
            ),
            ErrorKind::Io if err.is_timeout() => NodeError::ambiguous(
                NodeErrorKind::Timeout,
                format!("{what}: no reply before the client's response timeout"),
            ),
            ErrorKind::Io if err.is_connection_dropped() => NodeError::ambiguous(
                NodeErrorKind::Connection,
                format!("{what}: connection closed; the request may have been sent ({err})"),
            ),
            ErrorKind::Io => NodeError::ambiguous(NodeErrorKind::Io, format!("{what}: {err}")),
            ErrorKind::Client | ErrorKind::InvalidClientConfig => NodeError::not_applied(
                NodeErrorKind::Other,
                format!("{what}: refused by the client before sending: {err}"),
            ),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => NodeError::ambiguous(
                NodeErrorKind::Protocol,
                format!("{what}: malformed reply: {}", err.category()),
            ),
            ErrorKind::ClusterConnectionNotFound => NodeError::ambiguous(
                NodeErrorKind::Cluster,
                format!("{what}: no connection to the slot's node ({err})"),
            ),
            _ => NodeError::ambiguous(NodeErrorKind::Other, format!("{what}: {err}")),
        }
    };
    node_err.with_source(err.clone())
}

pub(super) fn to_reply(value: Value) -> Reply {
    match value {
        Value::Nil => Reply::Nil,
        Value::Int(n) => Reply::Int(n),
        Value::BulkString(bytes) => Reply::Bytes(bytes),
        Value::SimpleString(s) => Reply::Bytes(s.into_bytes()),
        Value::Okay => Reply::Bytes(b"OK".to_vec()),
        Value::Array(items) | Value::Set(items) => {
            Reply::Array(items.into_iter().map(to_reply).collect())
        }
        Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::VerbatimString { text, .. } => Reply::Bytes(text.into_bytes()),
        Value::Map(_) => Reply::Other("a map"),
        // A RESP3 double (a sorted set's score): the decimal text RESP2 gives.
        Value::Double(f) => Reply::Bytes(f.to_string().into_bytes()),
        _ => Reply::Other("an unsupported RESP type"),
    }
}

/// A transaction's error: one that `EXEC` aborted (a command refused while queueing, e.g. by the ACL or for
/// want of memory) is classified by the first refused command's reply, so that its cause is named.
pub(super) fn classify_aborted(what: &Script, err: &RedisError) -> NodeError {
    let first = err
        .clone()
        .into_server_errors()
        .and_then(|errors| errors.first().map(|(_, e)| e.clone()));
    match first {
        Some(first) if err.kind() == ErrorKind::Server(redis::ServerErrorKind::ExecAbort) => {
            let line = match first.details() {
                Some(detail) => format!("{} {detail}", first.code()),
                None => first.code().to_owned(),
            };
            scripts::server_error(what, &line).with_source(err.clone())
        }
        _ => classify(Some(what), err),
    }
}

/// Whether a classified error says the connection dropped (redis-rs's driver then stops for good).
pub(super) fn is_dropped(err: &NodeError) -> bool {
    use std::error::Error as _;
    err.source()
        .and_then(|s| s.downcast_ref::<RedisError>())
        .is_some_and(|e| e.is_connection_dropped() || e.is_unrecoverable_error())
}

/// A failed connection attempt: nothing of the operation was sent.
pub(super) fn connect_error(what: &Script, err: &RedisError) -> NodeError {
    let classified = classify(Some(what), err);
    if !classified.is_ambiguous() {
        return classified;
    }
    let message = format!(
        "{}: could not connect (not sent): {}",
        what.name,
        if err.is_timeout() {
            "connection timeout".to_owned()
        } else {
            err.category().to_owned()
        }
    );
    NodeError::not_applied(NodeErrorKind::Connection, message).with_source(err.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn refused_connections_are_definite() {
        let err = RedisError::from(io::Error::from(io::ErrorKind::ConnectionRefused));
        let node_err = node_error(&err);
        assert_eq!(node_err.kind(), NodeErrorKind::Connection);
        assert!(!node_err.is_ambiguous());
    }

    #[test]
    fn dropped_connections_and_timeouts_are_ambiguous() {
        for (kind, expected) in [
            (io::ErrorKind::BrokenPipe, NodeErrorKind::Connection),
            (io::ErrorKind::ConnectionReset, NodeErrorKind::Connection),
            (io::ErrorKind::UnexpectedEof, NodeErrorKind::Connection),
            (io::ErrorKind::TimedOut, NodeErrorKind::Timeout),
            (io::ErrorKind::Other, NodeErrorKind::Io),
        ] {
            let err = node_error(&RedisError::from(io::Error::from(kind)));
            assert!(err.is_ambiguous(), "{kind:?}");
            assert_eq!(err.kind(), expected, "{kind:?}");
        }
    }

    #[test]
    fn server_replies_are_definite_and_classified() {
        let err = redis::make_extension_error("OOM".into(), Some("command not allowed".into()));
        let node_err = node_error(&err);
        assert_eq!(node_err.kind(), NodeErrorKind::OutOfMemory);
        assert!(!node_err.is_ambiguous());
        let err = redis::make_extension_error("WRONGPASS".into(), Some("invalid".into()));
        assert_eq!(node_error(&err).kind(), NodeErrorKind::Auth);
    }

    #[test]
    fn client_side_errors_are_definite() {
        let err = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(node_error(&err).kind(), NodeErrorKind::Auth);
        assert!(!node_error(&err).is_ambiguous());
        let err = RedisError::from((ErrorKind::Client, "bad"));
        assert!(!node_error(&err).is_ambiguous());
    }

    #[test]
    fn values_map_to_replies() {
        assert_eq!(to_reply(Value::Nil), Reply::Nil);
        assert_eq!(to_reply(Value::Int(3)), Reply::Int(3));
        assert_eq!(
            to_reply(Value::Array(vec![
                Value::BulkString(b"x".to_vec()),
                Value::Int(5)
            ])),
            Reply::Array(vec![Reply::Bytes(b"x".to_vec()), Reply::Int(5)])
        );
        assert_eq!(to_reply(Value::Boolean(false)), Reply::Nil);
    }
}
