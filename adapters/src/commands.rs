//! Which commands a node sends: Lua scripts, the servers' native conditional commands, or each where it works.

/// Which commands a node uses for the lease operations; set with the nodes' `with_commands`.
///
/// | operation | [`Automatic`](Self::Automatic) (default) | [`Scripts`](Self::Scripts) | [`Native`](Self::Native) |
/// |---|---|---|---|
/// | first acquisition | `SET NX GET PX` (the first on a connection: the probe script) | same | `SET NX GET PX` (`SET NX PX` without `GET`) |
/// | retried acquisition (own token) | script; without Lua `SET NX PX`, then the watched extension | script | `SET NX PX`, then the watched extension |
/// | fenced acquisition | script; without Lua the native sequence | script | the native sequence (see the crate docs) |
/// | release | `DELIFEQ` where offered, else script | script | `DELIFEQ` |
/// | extend | script; without Lua the watched extension (`WATCH`, `GET`, and if ours `MULTI PEXPIRE … GT EXEC`) | script | the watched extension |
/// | inspect | script; without Lua `MULTI GET PTTL EXEC` | script | `MULTI GET PTTL EXEC` |
/// | semaphore permit | script; without Lua `WATCH`, `TIME`, `ZRANGE`/`ZMSCORE`, `MULTI … EXEC` (not on a cluster) | script | `WATCH`, `TIME`, `ZRANGE`/`ZMSCORE`, `MULTI … EXEC` (not on a cluster) |
/// | read/write or fair lock | script (`RW_PERMIT`); without Lua `WATCH` (lock key and fence counter), `GET`/`PTTL` of a fenced writer's counter, `TIME`, `ZRANGE`, `MULTI … EXEC` with the fence's `INCR` (not on a cluster) | script | the `WATCH` … `EXEC` form (not on a cluster) |
///
/// An extension never shortens a key ([`RedisNode`](redlease::RedisNode#extensions-never-shorten-a-key)), so
/// the native `SET key token IFEQ token PX ttl`, which sets exactly `ttl`, extends nothing: a late or
/// duplicated copy of a shorter one would shorten a key a longer extension set. The script compares the TTL
/// (`PTTL`, then `PEXPIRE` only if longer); without Lua the watched extension uses `PEXPIRE … GT` after
/// comparing the token under `WATCH`.
///
/// Without Lua (or without permission to run scripts) the capability check also makes sure that the user may
/// run `MULTI`/`EXEC` with `GET`, `PTTL`, `INCR` and `PEXPIRE`, and `WATCH` (probed with commands and
/// transactions that write nothing); a refusal
/// is a definite [`NodeErrorKind::Auth`](redlease::NodeErrorKind::Auth) error naming the refused command,
/// before anything is written.
///
/// A node pinned to one set fails with a definite
/// [`NodeErrorKind::Unsupported`](redlease::NodeErrorKind::Unsupported) error before anything is written when
/// the server does not offer it (or [`Auth`](redlease::NodeErrorKind::Auth) when the ACL refuses it). Redis
/// 8.4's `DELEX … IFEQ` is not used: no server of the test matrix has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Commands {
    /// Native commands where the server offers and permits them, scripts for the rest (and everything on
    /// servers without the native commands, such as Redis 7).
    #[default]
    Automatic,
    /// Lua scripts only (what every release before native support did).
    Scripts,
    /// Native commands only: needs `SET … IFEQ` and `DELIFEQ` (Valkey 9.0+), `MULTI`/`EXEC` and `INCR`; works
    /// without Lua.
    Native,
}

/// What a node learned about its current connection (see the nodes' `capabilities()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Capabilities {
    /// Lua scripts run and the user may run the commands inside them.
    pub lua: bool,
    /// `SET key value NX GET` is accepted (Redis 7.0+, Valkey).
    pub set_nx_get: bool,
    /// `SET key value IFEQ value` is offered and permitted (Valkey 8.1+).
    pub set_ifeq: bool,
    /// `DELIFEQ key value` is offered and permitted (Valkey 9.0+).
    pub delifeq: bool,
    /// The mode the node runs in.
    pub commands: Commands,
}

impl Capabilities {
    /// Whether release is `DELIFEQ` (else the compare-and-delete script).
    pub fn native_release(&self) -> bool {
        self.delifeq && self.commands != Commands::Scripts
    }

    /// Whether extension (and the own-token branch of a retried acquisition) is the watched `PEXPIRE … GT`
    /// transaction, without Lua (else the compare-and-extend script): where scripts cannot run, or the node
    /// is pinned to native commands. Never `SET … IFEQ … PX`, which could shorten a key.
    pub fn native_extend(&self) -> bool {
        self.native_acquire()
    }

    /// Whether retried and fenced acquisitions and inspection use native commands and transactions (no Lua).
    pub fn native_acquire(&self) -> bool {
        self.commands == Commands::Native || !self.lua
    }
}
