//! The classification of fred errors ([`node_error`]) and the conversion of its replies.

use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind};
use fred::types::Value;
use redlease::{NodeError, NodeErrorKind};

use crate::scripts::{self, Reply, Script};

const FAIL_FAST_DETAILS: &str = "Connection closed unexpectedly.";

/// Classifies a fred error into a [`NodeError`] for redlease (assuming the command was sent with
/// `max_attempts: Some(1)`, as [`FredNode`](super::FredNode) does).
///
/// - a Redis error reply (fred keeps the reply line, `CODE detail…`, as the details) → definite, kind from its
///   code (`NOSCRIPT`, `OOM`, `READONLY`, `NOPERM` → `Auth`, `MOVED`/`ASK`/`TRYAGAIN`/`CLUSTERDOWN` →
///   `Cluster`, `BUSY`/`LOADING`/`MASTERDOWN` → `Busy`, `WRONGTYPE`, `FENCE` → `Fence`, …);
/// - a refused authentication of the connection (`WRONGPASS`, `NOAUTH`) → definite `Auth`;
/// - fail-fast refusal (client not connected) and refused connections → definite `Connection`;
/// - "too many redirections" (the server answered `MOVED`/`ASK`, a refusal) → definite `Cluster`;
/// - routing failures and backpressure (nothing written) → definite `Cluster` / `Busy`;
/// - client-side argument or configuration errors → definite `Other`;
/// - timeouts → ambiguous `Timeout`; I/O errors, closed connections and cancellations → ambiguous;
/// - "too many failed write attempts" → ambiguous `Connection`: fred raises it when a command already written
///   once is queued again, which happens to commands in flight when fred reconnects (a [`FredNode`](super::FredNode) on a
///   cluster reports it as a definite `Cluster` redirection when no reconnection happened meanwhile);
/// - malformed replies → ambiguous `Protocol`; anything else → ambiguous `Other`.
pub fn node_error(err: &FredError) -> NodeError {
    classify(None, err)
}

const TOO_MANY_REDIRECTIONS: &str = "Too many redirections.";
/// How long a node that saw its connection fail waits, with fred reporting itself connected and silent,
/// before it sends again without a reconnection notice (at least the connection timeout).
pub(super) const PROBATION: Duration = Duration::from_secs(1);
const SECOND_WRITE: &str = "Too many failed write attempts";

/// Whether fred refused to write a command a second time (see [`node_error`]).
pub(super) fn is_second_write(err: &NodeError) -> bool {
    use std::error::Error as _;
    err.source()
        .and_then(|s| s.downcast_ref::<FredError>())
        .is_some_and(|e| e.details().starts_with(SECOND_WRITE))
}
/// fred's answer when it has no connection to write a command on (checked before writing).
const NO_ROUTE: &str = "Failed to route command.";

pub(super) fn classify(script: Option<&Script>, err: &FredError) -> NodeError {
    let what = script.map_or("the command", |s| s.name);
    let details = err.details();
    let first = details.split_whitespace().next().unwrap_or("");
    let connection_auth = *err.kind() == ErrorKind::Auth
        && (matches!(first, "WRONGPASS" | "NOAUTH") || !scripts::looks_like_error_code(first));
    let server_reply = matches!(
        err.kind(),
        ErrorKind::Unknown
            | ErrorKind::InvalidArgument
            | ErrorKind::InvalidCommand
            | ErrorKind::Auth
            | ErrorKind::Cluster
            | ErrorKind::Config
    ) && scripts::looks_like_error_code(first);
    let node_err = if connection_auth {
        NodeError::not_applied(
            NodeErrorKind::Auth,
            format!("{what}: the connection's authentication was refused ({details})"),
        )
    } else if server_reply {
        scripts::server_error(script.unwrap_or(&scripts::COMMAND), details)
    } else {
        match err.kind() {
            ErrorKind::Canceled if details == FAIL_FAST_DETAILS => NodeError::not_applied(
                NodeErrorKind::Connection,
                format!("{what}: the client is not connected (fail-fast, not sent)"),
            ),
            ErrorKind::IO if details.contains("ConnectionRefused") => NodeError::not_applied(
                NodeErrorKind::Connection,
                format!("{what}: connection refused"),
            ),
            ErrorKind::IO | ErrorKind::Canceled => NodeError::ambiguous(
                NodeErrorKind::Connection,
                format!(
                    "{what}: connection closed or I/O error; the request may have been sent ({details})"
                ),
            ),
            ErrorKind::Timeout => NodeError::ambiguous(
                NodeErrorKind::Timeout,
                format!("{what}: no reply before fred's command timeout"),
            ),
            ErrorKind::Routing if details == TOO_MANY_REDIRECTIONS => NodeError::not_applied(
                NodeErrorKind::Cluster,
                format!(
                    "{what}: the server redirected the command (MOVED/ASK), which redlease does not follow; \
                     fred refreshed its slot map, so the next call is routed anew"
                ),
            ),
            ErrorKind::Routing => NodeError::not_applied(
                NodeErrorKind::Cluster,
                format!("{what}: no route to the key's server ({details})"),
            ),
            ErrorKind::Backpressure => NodeError::not_applied(
                NodeErrorKind::Busy,
                format!("{what}: client backpressure ({details})"),
            ),
            ErrorKind::Cluster => {
                NodeError::not_applied(NodeErrorKind::Cluster, format!("{what}: {details}"))
            }
            ErrorKind::Config
            | ErrorKind::Url
            | ErrorKind::InvalidArgument
            | ErrorKind::InvalidCommand => NodeError::not_applied(
                NodeErrorKind::Other,
                format!("{what}: refused by the client before sending ({details})"),
            ),
            ErrorKind::Unknown if details == NO_ROUTE => NodeError::not_applied(
                NodeErrorKind::Connection,
                format!("{what}: no connection to the server (not sent)"),
            ),
            ErrorKind::Unknown if details.starts_with(SECOND_WRITE) => NodeError::ambiguous(
                NodeErrorKind::Connection,
                format!(
                    "{what}: fred queued the command again after writing it once (a reconnection with the \
                         command in flight); it may have been applied"
                ),
            ),
            ErrorKind::Protocol | ErrorKind::Parse | ErrorKind::NotFound => NodeError::ambiguous(
                NodeErrorKind::Protocol,
                format!("{what}: malformed reply ({})", err.kind().to_str()),
            ),
            _ => NodeError::ambiguous(NodeErrorKind::Other, format!("{what}: {err}")),
        }
    };
    node_err.with_source(err.clone())
}

pub(super) fn to_reply(value: Value) -> Reply {
    match value {
        Value::Null => Reply::Nil,
        Value::Integer(n) => Reply::Int(n),
        Value::String(s) => Reply::Bytes(s.as_bytes().to_vec()),
        Value::Bytes(b) => Reply::Bytes(b.to_vec()),
        Value::Array(items) => Reply::Array(items.into_iter().map(to_reply).collect()),
        Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        // A RESP3 double (a sorted set's score): the decimal text RESP2 gives.
        Value::Double(f) => Reply::Bytes(f.to_string().into_bytes()),
        Value::Map(_) => Reply::Other("a map"),
        Value::Queued => Reply::Other("QUEUED"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_replies_are_definite_and_classified() {
        for (kind, line, expected) in [
            (
                ErrorKind::Unknown,
                "NOSCRIPT No matching script.",
                NodeErrorKind::NoScript,
            ),
            (
                ErrorKind::Unknown,
                "OOM command not allowed",
                NodeErrorKind::OutOfMemory,
            ),
            (
                ErrorKind::Unknown,
                "READONLY You can't write",
                NodeErrorKind::ReadOnly,
            ),
            (
                ErrorKind::Auth,
                "WRONGPASS invalid username-password pair",
                NodeErrorKind::Auth,
            ),
            (
                ErrorKind::Auth,
                "NOAUTH Authentication required.",
                NodeErrorKind::Auth,
            ),
            (
                ErrorKind::Unknown,
                "NOPERM User has no permissions",
                NodeErrorKind::Auth,
            ),
            (
                ErrorKind::InvalidArgument,
                "WRONGTYPE Operation against a key",
                NodeErrorKind::WrongType,
            ),
            (
                ErrorKind::Cluster,
                "CLUSTERDOWN The cluster is down",
                NodeErrorKind::Cluster,
            ),
            (
                ErrorKind::Unknown,
                "BUSY Redis is busy",
                NodeErrorKind::Busy,
            ),
            (
                ErrorKind::Unknown,
                "FENCE the fence counter f is exhausted",
                NodeErrorKind::Fence,
            ),
            (
                ErrorKind::Unknown,
                "ERR The user executing the script can't run this command or subcommand",
                NodeErrorKind::Auth,
            ),
            (
                ErrorKind::Routing,
                TOO_MANY_REDIRECTIONS,
                NodeErrorKind::Cluster,
            ),
        ] {
            let err = node_error(&FredError::new(kind, line));
            assert_eq!(err.kind(), expected, "{line}");
            assert!(!err.is_ambiguous(), "{line}");
        }
    }

    #[test]
    fn a_refused_connection_authentication_says_so() {
        let err = node_error(&FredError::new(
            ErrorKind::Auth,
            "WRONGPASS invalid username-password pair or user is disabled.",
        ));
        assert_eq!(err.kind(), NodeErrorKind::Auth);
        assert!(!err.is_ambiguous());
        assert!(err.message().contains("authentication"), "{err}");
        assert!(!err.message().contains("script"), "{err}");
    }

    #[test]
    fn fail_fast_and_refused_connections_are_definite() {
        let err = node_error(&FredError::new(ErrorKind::Canceled, FAIL_FAST_DETAILS));
        assert_eq!(err.kind(), NodeErrorKind::Connection);
        assert!(!err.is_ambiguous());
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let err = node_error(&FredError::from(io));
        assert_eq!(err.kind(), NodeErrorKind::Connection);
        assert!(!err.is_ambiguous());
    }

    #[test]
    fn closed_connections_timeouts_and_lost_attempts_are_ambiguous() {
        for (kind, details, expected) in [
            (
                ErrorKind::IO,
                "Connection Closed",
                NodeErrorKind::Connection,
            ),
            (ErrorKind::Canceled, "Canceled.", NodeErrorKind::Connection),
            (
                ErrorKind::Timeout,
                "Request timed out.",
                NodeErrorKind::Timeout,
            ),
            (
                ErrorKind::Unknown,
                "Too many failed write attempts.",
                NodeErrorKind::Connection,
            ),
            (
                ErrorKind::Protocol,
                "Invalid frame",
                NodeErrorKind::Protocol,
            ),
        ] {
            let err = node_error(&FredError::new(kind, details));
            assert!(err.is_ambiguous(), "{details}");
            assert_eq!(err.kind(), expected, "{details}");
        }
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(node_error(&FredError::from(io)).is_ambiguous());
    }

    #[test]
    fn values_map_to_replies() {
        assert_eq!(to_reply(Value::Null), Reply::Nil);
        assert_eq!(to_reply(Value::Integer(1)), Reply::Int(1));
        assert_eq!(
            to_reply(Value::Array(vec![Value::from("abc"), Value::Integer(9)])),
            Reply::Array(vec![Reply::Bytes(b"abc".to_vec()), Reply::Int(9)])
        );
    }
}
