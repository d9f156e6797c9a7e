//! The Lua scripts behind every adapter, their SHA-1 digests, and the interpretation of their replies.
//!
//! Each script is one atomic server-side operation implementing one method of
//! [`RedisNode`](redlease::RedisNode) exactly. They are public so that a node for another client can reuse them
//! verbatim (send `EVALSHA` with [`Script::sha1`], and on a `NOSCRIPT` reply send `EVAL` with
//! [`Script::source`] once), together with the interpretation of their replies: convert your client's reply
//! to a [`Reply`] and call [`parse_flag`], [`parse_fence`], [`parse_inspect`], [`parse_permit`] or
//! [`parse_set_nx_get`]; map an error reply's line to its kind with [`server_error_kind`]. These are the
//! functions the adapters use.
//!
//! ```
//! use redlease::NodeErrorKind;
//! use redlease_adapters::scripts::{self, Reply};
//!
//! // What your client answered to `EVALSHA <scripts::RELEASE.sha1> 1 <key> <token>`:
//! assert!(scripts::parse_flag(&scripts::RELEASE, Reply::Int(1)).unwrap());
//! // … to ACQUIRE_FENCED: the fence, exact as a string.
//! let fence = scripts::parse_fence(Reply::Bytes(b"9007199254740993".to_vec())).unwrap();
//! assert_eq!(fence, Some(9_007_199_254_740_993));
//! // … or an error reply: its kind decides retry and ambiguity.
//! assert_eq!(scripts::server_error_kind("NOSCRIPT No matching script"), NodeErrorKind::NoScript);
//! assert_eq!(scripts::server_error_kind("OOM command not allowed"), NodeErrorKind::OutOfMemory);
//! ```
//!
//! # Design rules
//!
//! - **No shebang.** A script without `#!lua flags=...` is admitted under `maxmemory` pressure; only its
//!   memory-growing commands (`SET`, `INCR`) are refused with `OOM`. So release (`DEL`) and extend
//!   (`PEXPIRE`) keep working while the server is out of memory, and acquire fails cleanly.
//! - **Validate before the first write.** Every check that can fail (wrong key type, a fence counter that is not
//!   a non-negative integer or is exhausted) runs before any write, so an error reply never leaves a partial
//!   effect. An error reply therefore always means "not applied".
//! - **Keys in `KEYS`.** Both keys of the fenced acquire are declared, so Redis Cluster can route the script and
//!   check that they share a slot.
//! - **Exact fence numbers.** Lua numbers are doubles; the fence is returned as a bulk string read with `GET`,
//!   so values above 2^53 survive.

// The reply interpretation below serves the client modules; without a client feature only the scripts are used
// (and the crate-internal re-exports below go unused).
#![cfg_attr(
    not(any(feature = "redis", feature = "fred")),
    allow(dead_code, unused_imports)
)]

mod batch;
mod error;
mod lock;
mod native;
mod permit;
mod probe;
mod reply;

pub use batch::{ACQUIRE_MANY, EXTEND_MANY, EXTEND_PERMITS, RELEASE_MANY};
#[cfg(feature = "fred")]
pub(crate) use error::looks_like_error_code;
pub(crate) use error::server_error;
pub use error::server_error_kind;
pub use lock::{
    ACQUIRE, ACQUIRE_FENCED, ACQUIRE_FRESH, ACQUIRE_TTL, EXTEND, INSPECT, RELEASE, RELEASE_SILENT,
    WAITING,
};
pub(crate) use native::{
    COMMAND, DELIFEQ, RAISE_FENCE, SET_IFEQ, SET_NX, SET_NX_PLAIN, TRANSACTION, WATCHED_EXTEND,
    WATCHED_PERMIT, WATCHED_RW_PERMIT,
};
pub use permit::{PERMIT, RW_PERMIT};
pub use probe::{PROBE, PROBE_ACQUIRE};
pub(crate) use probe::{parse_probe_acquire, parse_probe_reply};
pub use reply::{
    Reply, parse_acquire_many, parse_claim, parse_fence, parse_flag, parse_flags, parse_inspect,
    parse_permit, parse_rw_permit, parse_set_nx_get,
};
pub(crate) use reply::{parse_inspect_tx, parse_integer, parse_set_ok, unexpected_reply};

/// One of redlease's Lua scripts: its name (for messages), body and SHA-1 digest (as `SCRIPT LOAD` answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script {
    /// A short name used in error messages (`"acquire"`, `"release"`, …).
    pub name: &'static str,
    /// The Lua source, sent with `EVAL` after a `NOSCRIPT` reply.
    pub source: &'static str,
    /// The lowercase hex SHA-1 of [`source`](Self::source), sent with `EVALSHA`.
    pub sha1: &'static str,
}

impl Script {
    /// "script", or "command" for the pseudo-scripts that name plain commands in messages.
    fn noun(&self) -> &'static str {
        if self.source.is_empty() {
            "command"
        } else {
            "script"
        }
    }
}

/// All scripts, for loading or checking digests.
pub const ALL: [Script; 17] = [
    ACQUIRE,
    ACQUIRE_FRESH,
    ACQUIRE_TTL,
    WAITING,
    ACQUIRE_FENCED,
    RELEASE,
    RELEASE_SILENT,
    EXTEND,
    EXTEND_MANY,
    ACQUIRE_MANY,
    RELEASE_MANY,
    EXTEND_PERMITS,
    INSPECT,
    PROBE,
    PROBE_ACQUIRE,
    PERMIT,
    RW_PERMIT,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_match_the_script_bodies() {
        for script in ALL {
            assert_eq!(
                sha1_smol::Sha1::from(script.source).digest().to_string(),
                script.sha1,
                "SHA-1 constant of the {} script",
                script.name
            );
        }
    }

    #[test]
    fn scripts_have_no_shebang() {
        for script in ALL {
            assert!(!script.source.starts_with("#!"), "{}", script.name);
        }
    }
}
