//! Pseudo-scripts (no source) that name plain commands and transactions in messages.

use super::Script;

/// Not a script: names the fresh acquisition's `SET … NX GET PX` in messages.
pub(crate) const SET_NX: Script = Script {
    name: "SET NX",
    source: "",
    sha1: "",
};

/// Not a script: names `SET … NX PX` (a fresh or retried acquisition without `GET`) in messages.
pub(crate) const SET_NX_PLAIN: Script = Script {
    name: "SET NX",
    source: "",
    sha1: "",
};

/// Not a script: names the `SET key probe IFEQ …` capability probe (extensions never use `SET … IFEQ … PX`,
/// which could shorten a key).
pub(crate) const SET_IFEQ: Script = Script {
    name: "SET IFEQ",
    source: "",
    sha1: "",
};

/// Not a script: names `DELIFEQ key token` (native release).
pub(crate) const DELIFEQ: Script = Script {
    name: "DELIFEQ",
    source: "",
    sha1: "",
};

/// Not a script: names a `MULTI … EXEC` transaction (native inspect and fenced acquisition).
pub(crate) const TRANSACTION: Script = Script {
    name: "MULTI/EXEC",
    source: "",
    sha1: "",
};

/// Not a script: names the watched extension without Lua (`WATCH`, `GET`, `MULTI PEXPIRE … GT EXEC`).
pub(crate) const WATCHED_EXTEND: Script = Script {
    name: "WATCH/GET/MULTI PEXPIRE GT EXEC (extend without Lua)",
    source: "",
    sha1: "",
};

/// Not a script: names the leased-semaphore operation without Lua (`TIME`, `ZRANGE … WITHSCORES` under
/// `WATCH`, `MULTI … EXEC`).
pub(crate) const WATCHED_PERMIT: Script = Script {
    name: "WATCH/TIME/ZRANGE/MULTI … EXEC (semaphore without Lua)",
    source: "",
    sha1: "",
};

/// Not a script: names a read/write or fair lock's acquisition without Lua (`WATCH` of the lock key and a
/// fenced writer's counter, `TIME`, `ZRANGE … WITHSCORES`, `MULTI … EXEC`), which does what [`RW_PERMIT`](super::RW_PERMIT)
/// does.
pub(crate) const WATCHED_RW_PERMIT: Script = Script {
    name: "WATCH/TIME/ZRANGE/MULTI … EXEC (read/write or fair lock without Lua)",
    source: "",
    sha1: "",
};

/// Not a script: names the `INCRBY` that raises a fence counter in messages.
pub(crate) const RAISE_FENCE: Script = Script {
    name: "raise-fence INCRBY",
    source: "",
    sha1: "",
};

/// Not a script: names a plain command in messages.
pub(crate) const COMMAND: Script = Script {
    name: "requested",
    source: "",
    sha1: "",
};
