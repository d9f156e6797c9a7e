//! Server error replies: their kind, and the [`NodeError`] an adapter reports for them.

use redlease::{NodeError, NodeErrorKind};

use super::Script;

/// The kind of a Redis error reply `line` (`CODE detail…`), from its first token (`NOSCRIPT No matching
/// script…` → `NoScript`), and for `ERR` from the text Redis 7.0 gives a command refused by the ACL inside a
/// script (`ERR The user executing the script can't run this command…`), which is `Auth`.
pub fn server_error_kind(line: &str) -> NodeErrorKind {
    let code = line.split_whitespace().next().unwrap_or("");
    match code {
        "NOSCRIPT" => NodeErrorKind::NoScript,
        "OOM" => NodeErrorKind::OutOfMemory,
        "READONLY" => NodeErrorKind::ReadOnly,
        "NOPERM" | "NOAUTH" | "WRONGPASS" => NodeErrorKind::Auth,
        "CROSSSLOT" => NodeErrorKind::CrossSlot,
        "TRYAGAIN" | "CLUSTERDOWN" | "MOVED" | "ASK" => NodeErrorKind::Cluster,
        "BUSY" | "LOADING" | "MASTERDOWN" => NodeErrorKind::Busy,
        "WRONGTYPE" => NodeErrorKind::WrongType,
        "FENCE" => NodeErrorKind::Fence,
        "ERR" if is_acl_refusal(line) => NodeErrorKind::Auth,
        // `EXEC` refused itself (e.g. `… because of: NOPERM …`): the cause it names.
        "EXECABORT" => line
            .split_once("because of: ")
            .map_or(NodeErrorKind::Other, |(_, cause)| server_error_kind(cause)),
        _ => NodeErrorKind::Other,
    }
}

/// Whether an `ERR` line is an ACL refusal: Redis 7.0 reports a command a script may not run as
/// `ERR The user executing the script can't run this command or subcommand` (and a key it may not touch as
/// `… can't access at least one of the keys …`); later versions say `NOPERM … no permissions …`, which some
/// proxies wrap in `ERR`.
fn is_acl_refusal(line: &str) -> bool {
    line.contains("The user executing the script can't") || line.contains("no permissions")
}

/// Whether `token` looks like a Redis error code: an uppercase ASCII word (`ERR`, `NOSCRIPT`, `WRONGPASS`).
#[cfg_attr(not(feature = "fred"), allow(dead_code))]
pub(crate) fn looks_like_error_code(token: &str) -> bool {
    token.len() >= 2 && token.bytes().all(|b| b.is_ascii_uppercase())
}

/// A definite (not applied) error for a Redis error reply `line` (`CODE detail…`) to `script`.
///
/// Error replies never echo arguments, so the line carries no token; it is bounded in length anyway.
pub(crate) fn server_error(script: &Script, line: &str) -> NodeError {
    let mut shown: String = line.chars().take(200).collect();
    if shown.len() < line.len() {
        shown.push('…');
    }
    NodeError::not_applied(
        server_error_kind(line),
        format!("the {} {} was refused: {shown}", script.name, script.noun()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts::{ACQUIRE, RELEASE};

    #[test]
    fn server_errors_are_classified_by_their_first_token() {
        let cases = [
            ("NOSCRIPT No matching script", NodeErrorKind::NoScript),
            ("OOM command not allowed", NodeErrorKind::OutOfMemory),
            ("READONLY You can't write", NodeErrorKind::ReadOnly),
            ("NOPERM this user has no permissions", NodeErrorKind::Auth),
            ("NOAUTH Authentication required.", NodeErrorKind::Auth),
            (
                "WRONGPASS invalid username-password pair",
                NodeErrorKind::Auth,
            ),
            ("CROSSSLOT Keys in request", NodeErrorKind::CrossSlot),
            ("TRYAGAIN Multiple keys", NodeErrorKind::Cluster),
            ("CLUSTERDOWN The cluster is down", NodeErrorKind::Cluster),
            ("MOVED 3999 127.0.0.1:6381", NodeErrorKind::Cluster),
            ("ASK 3999 127.0.0.1:6381", NodeErrorKind::Cluster),
            ("BUSY Redis is busy running a script", NodeErrorKind::Busy),
            ("LOADING Redis is loading", NodeErrorKind::Busy),
            ("MASTERDOWN Link with MASTER is down", NodeErrorKind::Busy),
            (
                "WRONGTYPE Operation against a key",
                NodeErrorKind::WrongType,
            ),
            ("ERR unknown command", NodeErrorKind::Other),
            ("FENCE the fence key f has a TTL", NodeErrorKind::Fence),
            (
                "ERR The user executing the script can't run this command or subcommand script: ab, on \
                 @user_script:1.",
                NodeErrorKind::Auth,
            ),
            (
                "NOPERM User u has no permissions to run the 'get' command script: ab",
                NodeErrorKind::Auth,
            ),
            (
                "EXECABORT Transaction discarded because of: NOPERM User u has no permissions to run the \
                 'exec' command",
                NodeErrorKind::Auth,
            ),
            (
                "EXECABORT Transaction discarded because of previous errors.",
                NodeErrorKind::Other,
            ),
        ];
        for (line, kind) in cases {
            let err = server_error(&ACQUIRE, line);
            assert_eq!(err.kind(), kind, "{line}");
            assert!(!err.is_ambiguous(), "{line}");
        }
    }

    #[test]
    fn long_error_lines_are_truncated() {
        let line = format!("ERR {}", "x".repeat(1000));
        let err = server_error(&RELEASE, &line);
        assert!(err.message().len() < 300);
    }

    #[test]
    fn error_codes_are_uppercase_words() {
        assert!(looks_like_error_code("NOSCRIPT"));
        assert!(looks_like_error_code("ERR"));
        assert!(!looks_like_error_code("Connection"));
        assert!(!looks_like_error_code("E"));
        assert!(!looks_like_error_code("Too"));
    }
}
