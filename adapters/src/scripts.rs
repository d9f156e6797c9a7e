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

// The reply interpretation below serves the client modules; without a client feature only the scripts are used.
#![cfg_attr(not(any(feature = "redis", feature = "fred")), allow(dead_code))]
use std::time::Duration;

use redlease::{KeyState, NodeError, NodeErrorKind};

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

/// `KEYS[1]` lock, `ARGV[1]` token, `ARGV[2]` TTL in ms. Returns 1 when the lock is (now) ours, 0 when held by
/// another value. An absent key is set with exactly `ARGV[2]`; a key already holding our token keeps the longer
/// of its remaining TTL and `ARGV[2]` (`PEXPIRE` only when `PTTL` is shorter: what `PEXPIRE … GT` does on
/// Redis 7.0+, compared in the script so that it runs on any server): no late or duplicated copy of a request
/// ever shortens a key ([`RedisNode`](redlease::RedisNode#extensions-never-shorten-a-key)).
///
/// Error replies, all before any write: `ERR redlease: invalid …` for an empty token or a TTL that is not a
/// decimal integer in `1..=999999999999999` ms; `WRONGTYPE` when the lock key holds another type; the error of
/// a command the server refuses inside the script (for example a missing ACL permission).
pub const ACQUIRE: Script = Script {
    name: "acquire",
    source: r#"if type(ARGV[1]) ~= 'string' or ARGV[1] == '' then
  return redis.error_reply('ERR redlease: invalid token argument (empty)')
end
if type(ARGV[2]) ~= 'string' or #ARGV[2] > 15 or not string.find(ARGV[2], '^[1-9][0-9]*$') then
  return redis.error_reply('ERR redlease: invalid TTL argument (want 1 to 999999999999999 ms)')
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then
  if cur.err and string.sub(cur.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('WRONGTYPE the lock key ' .. KEYS[1] .. ' holds a value of another type')
  end
  return cur
end
if cur == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
return 0
"#,
    sha1: "45d040e8c02f987fe6c6bb54ec28e541ee40a148",
};

/// The fresh acquisition where the server does not accept `SET … NX GET` (before Redis 7.0). `KEYS[1]` lock,
/// `ARGV[1]` a token never written before, `ARGV[2]` TTL in ms. Returns 1 when the key was absent (now set),
/// 0 when it exists: like `SET key token NX PX ttl`, it never touches an existing key (so a late copy cannot
/// reset a lease's TTL), but a lock key of another type is `WRONGTYPE`, as in [`ACQUIRE`]. Argument and
/// refusal errors as for [`ACQUIRE`], all before any write.
pub const ACQUIRE_FRESH: Script = Script {
    name: "acquire_fresh",
    source: r#"if type(ARGV[1]) ~= 'string' or ARGV[1] == '' then
  return redis.error_reply('ERR redlease: invalid token argument (empty)')
end
if type(ARGV[2]) ~= 'string' or #ARGV[2] > 15 or not string.find(ARGV[2], '^[1-9][0-9]*$') then
  return redis.error_reply('ERR redlease: invalid TTL argument (want 1 to 999999999999999 ms)')
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then
  if cur.err and string.sub(cur.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('WRONGTYPE the lock key ' .. KEYS[1] .. ' holds a value of another type')
  end
  return cur
end
if cur == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"#,
    sha1: "d8a6ba5efe7649ac82963dc070f28879c1e033d3",
};

/// `KEYS[1]` lock, `KEYS[2]` fence counter, `ARGV[1]` token, `ARGV[2]` TTL in ms.
///
/// Returns the fence (a bulk string holding a decimal integer) when the lock is (now) ours, nil when it is held
/// by another value. A lock already holding our token keeps the longer of its remaining TTL and `ARGV[2]`, as
/// in [`ACQUIRE`]. Error replies, all before any write: invalid arguments as for [`ACQUIRE`]; `FENCE …`
/// (naming the fence key) when the fence key holds another type, does not hold a non-negative decimal
/// integer, has a TTL (its numbers would start again after it expired), is exhausted (2^63-1), or is missing
/// while the lock holds our token (the issued number can no longer be confirmed); `WRONGTYPE` when the lock
/// key holds another type; the error of a command the server refuses inside the script. With `ARGV[3]`, the
/// lock's waiter marker, a lock held by another value marks it as [`ACQUIRE_TTL`] does.
pub const ACQUIRE_FENCED: Script = Script {
    name: "acquire_fenced",
    source: r#"if type(ARGV[1]) ~= 'string' or ARGV[1] == '' then
  return redis.error_reply('ERR redlease: invalid token argument (empty)')
end
if type(ARGV[2]) ~= 'string' or #ARGV[2] > 15 or not string.find(ARGV[2], '^[1-9][0-9]*$') then
  return redis.error_reply('ERR redlease: invalid TTL argument (want 1 to 999999999999999 ms)')
end
local fence = redis.pcall('GET', KEYS[2])
if type(fence) == 'table' then
  if fence.err and string.sub(fence.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('FENCE the fence key ' .. KEYS[2] .. ' holds a value of another type')
  end
  return fence
end
if fence ~= false then
  if fence ~= '0' and not string.find(fence, '^[1-9][0-9]*$') then
    return redis.error_reply('FENCE the fence key ' .. KEYS[2] .. ' does not hold a non-negative integer')
  end
  if #fence > 19 or (#fence == 19 and fence >= '9223372036854775807') then
    return redis.error_reply('FENCE the fence counter ' .. KEYS[2] .. ' is exhausted')
  end
  if redis.call('PTTL', KEYS[2]) ~= -1 then
    return redis.error_reply('FENCE the fence key ' .. KEYS[2] .. ' has a TTL; fencing numbers would restart when it expires')
  end
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then
  if cur.err and string.sub(cur.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('WRONGTYPE the lock key ' .. KEYS[1] .. ' holds a value of another type')
  end
  return cur
end
if cur == false then
  redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return redis.call('GET', KEYS[2])
end
if cur == ARGV[1] then
  if fence == false then
    return redis.error_reply('FENCE the fence key ' .. KEYS[2] .. ' is missing while the lock holds this token')
  end
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return fence
end
if ARGV[3] then
  local hold = redis.call('PTTL', KEYS[1])
  if hold < 0 then
    hold = tonumber(ARGV[2])
  end
  hold = hold + 1000
  local marked = redis.pcall('PTTL', ARGV[3])
  if type(marked) ~= 'number' or marked < hold then
    redis.pcall('SET', ARGV[3], '1', 'PX', hold)
  end
end
return false
"#,
    sha1: "3942ab1f383c936b110addb79aa3212adc03a26f",
};

/// Compare-and-delete that announces the release. `KEYS[1]` lock, `ARGV[1]` token, optionally `ARGV[2]` the
/// notification channel ([`redlease::notify::channel`] of the key) and `ARGV[3]` `PUBLISH` or `SPUBLISH` (on
/// Redis Cluster, a sharded channel in the key's slot). Returns 1 if deleted, 0 otherwise (absent, another
/// value, or a key of another type: never touched). Any other error of the read (for example a missing ACL
/// permission for `GET`) is returned as the script's error, never as "not held".
///
/// Only a deletion publishes, and the message is [`redlease::notify::payload`] of the token (its first 8
/// characters). The publish runs with `redis.pcall`, after the `DEL`: a user without permission for the
/// channel still releases (its waiters then wait for the TTL bound instead of a notification). Without
/// `ARGV[2]` nothing is published (what releases did before notifications). With `ARGV[4]`, the lock's
/// waiter marker ([`redlease::notify::waiting_key`]), it publishes only when the marker exists (or cannot be
/// read, say for a missing ACL permission): a release nobody waits for publishes nothing.
///
/// The marker is an argument, not a declared key, here and in the other scripts that take one: a user whose
/// ACL key patterns cover the lock keys but not the markers would otherwise be refused the whole script
/// (`NOPERM` for a declared key); undeclared, only the marker's own commands are refused (`redis.pcall`), and
/// the script goes on. The marker always lies in `KEYS[1]`'s Redis Cluster slot.
pub const RELEASE: Script = Script {
    name: "release",
    source: r#"local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then
  if cur.err and string.sub(cur.err, 1, 9) == 'WRONGTYPE' then
    return 0
  end
  return cur
end
if cur == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] and (not ARGV[4] or redis.pcall('EXISTS', ARGV[4]) ~= 0) then
    if ARGV[3] == 'SPUBLISH' then
      redis.pcall('SPUBLISH', ARGV[2], string.sub(ARGV[1], 1, 8))
    else
      redis.pcall('PUBLISH', ARGV[2], string.sub(ARGV[1], 1, 8))
    end
  end
  return 1
end
return 0
"#,
    sha1: "df37e218b969f4fc8b520fceed85c31804085a82",
};

/// The release script before release notifications (it publishes nothing), kept to test that waiters
/// still notice a release by a client of that version (within the holder's TTL).
pub const RELEASE_SILENT: Script = Script {
    name: "release",
    source: r#"local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then
  if cur.err and string.sub(cur.err, 1, 9) == 'WRONGTYPE' then
    return 0
  end
  return cur
end
if cur == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#,
    sha1: "cfafde34fd9088f63a89b56880844671e40972c5",
};

/// [`ACQUIRE`] that also reports the holder's remaining TTL when the lock is held, for retried acquisitions
/// that wait ([`RedisNode::acquire_or_ttl`](redlease::RedisNode::acquire_or_ttl)). `KEYS[1]` lock, `ARGV[1]`
/// token, `ARGV[2]` TTL in ms.
///
/// Returns 1 when the lock is (now) ours (absent, or holding our token: its TTL extended to at least `ARGV[2]`,
/// never shortened, as in [`ACQUIRE`]); when held by
/// another value 0 if the key has no expiry, else `-1 - pttl` (so -1 means 0 ms left, -1001 means 1000 ms).
/// Argument and refusal errors as for [`ACQUIRE`], all before any write. With `ARGV[3]`, the lock's waiter
/// marker ([`redlease::notify::waiting_key`]; an argument, see [`RELEASE`]), a held lock also marks it, in the same atomic step, to live
/// at least the holder's remaining TTL (or `ARGV[2]` when the lock has no expiry) plus
/// [`WAITING_MARGIN_MS`](redlease::notify::WAITING_MARGIN_MS), never shortening it; the marker write runs
/// with `redis.pcall` (refused under `maxmemory` or by the ACL, the reply is the same and releases of the
/// lock may not publish: the waiter then waits its usual bound).
pub const ACQUIRE_TTL: Script = Script {
    name: "acquire_ttl",
    source: r#"if type(ARGV[1]) ~= 'string' or ARGV[1] == '' then
  return redis.error_reply('ERR redlease: invalid token argument (empty)')
end
if type(ARGV[2]) ~= 'string' or #ARGV[2] > 15 or not string.find(ARGV[2], '^[1-9][0-9]*$') then
  return redis.error_reply('ERR redlease: invalid TTL argument (want 1 to 999999999999999 ms)')
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then
  if cur.err and string.sub(cur.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('WRONGTYPE the lock key ' .. KEYS[1] .. ' holds a value of another type')
  end
  return cur
end
if cur == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
local left = redis.call('PTTL', KEYS[1])
if ARGV[3] then
  local hold = left
  if hold < 0 then
    hold = tonumber(ARGV[2])
  end
  hold = hold + 1000
  local marked = redis.pcall('PTTL', ARGV[3])
  if type(marked) ~= 'number' or marked < hold then
    redis.pcall('SET', ARGV[3], '1', 'PX', hold)
  end
end
if left < 0 then
  return 0
end
return -1 - left
"#,
    sha1: "1ab7b8dbdc81ce5b056420e4584d37b3e983abbe",
};

/// The waiter marker step of a waiting acquisition that found the lock held by a plain command (`SET … NX
/// GET`): `KEYS[1]` lock, `ARGV[1]` the acquisition's TTL in ms, `ARGV[2]` the lock's waiter marker
/// ([`redlease::notify::waiting_key`]; an argument, see [`RELEASE`]). Returns the lock's `PTTL` (-2 gone
/// since the attempt, -1 no expiry); while the lock exists, marks `ARGV[2]` in the same atomic step as [`ACQUIRE_TTL`] does (with `ARGV[1]` for a lock
/// without expiry). An invalid `ARGV[1]` is an error reply, before any write.
pub const WAITING: Script = Script {
    name: "waiting",
    source: r#"if type(ARGV[1]) ~= 'string' or #ARGV[1] > 15 or not string.find(ARGV[1], '^[1-9][0-9]*$') then
  return redis.error_reply('ERR redlease: invalid TTL argument (want 1 to 999999999999999 ms)')
end
local left = redis.call('PTTL', KEYS[1])
if left == -2 then
  return left
end
local hold = left
if hold < 0 then
  hold = tonumber(ARGV[1])
end
hold = hold + 1000
local marked = redis.pcall('PTTL', ARGV[2])
if type(marked) ~= 'number' or marked < hold then
  redis.pcall('SET', ARGV[2], '1', 'PX', hold)
end
return left
"#,
    sha1: "c11b4003375c45e4f1bf2ecbd33d4364366cfa1d",
};

/// Compare-and-extend. `KEYS[1]` lock, `ARGV[1]` token, `ARGV[2]` TTL in ms. Returns 1 if the key holds the
/// token, its TTL now the longer of what it had left and `ARGV[2]` (`PEXPIRE` only when `PTTL` is shorter,
/// as `PEXPIRE … GT`: an extension never shortens a key, so a late or duplicated shorter extension landing
/// after a longer one changes nothing), 0 otherwise. Never creates a key; a key without a TTL keeps none. An invalid TTL (as for [`ACQUIRE`]: `PEXPIRE 0` would delete the key) and
/// any error of the read other than `WRONGTYPE` are error replies, before any write.
pub const EXTEND: Script = Script {
    name: "extend",
    source: r#"if type(ARGV[2]) ~= 'string' or #ARGV[2] > 15 or not string.find(ARGV[2], '^[1-9][0-9]*$') then
  return redis.error_reply('ERR redlease: invalid TTL argument (want 1 to 999999999999999 ms)')
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then
  if cur.err and string.sub(cur.err, 1, 9) == 'WRONGTYPE' then
    return 0
  end
  return cur
end
if cur == ARGV[1] then
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
return 0
"#,
    sha1: "a0bdb025687b2385389f488c576d1a144d3ae2e6",
};

/// Compare-and-extend for many leases at once (batched renewal), never shortening a key. `KEYS[1..n]` locks, `ARGV[1..n]` their
/// tokens, `ARGV[n+1..2n]` their TTLs in ms. Returns an array of n flags, each exactly what [`EXTEND`] would
/// return for that key. All TTLs are validated and all keys (and the `PTTL` of ours) read before the first
/// write, so an error reply
/// (an invalid TTL, a refused read) changes nothing; a key of another type answers 0. On a cluster all keys
/// must share a slot: the adapters send one call per slot.
pub const EXTEND_MANY: Script = Script {
    name: "extend-many",
    source: r#"local n = #KEYS
if #ARGV ~= 2 * n then
  return redis.error_reply('ERR redlease: extend_many wants a token and a TTL per key')
end
for i = 1, n do
  local ttl = ARGV[n + i]
  if #ttl > 15 or not string.find(ttl, '^[1-9][0-9]*$') then
    return redis.error_reply('ERR redlease: invalid TTL argument (want 1 to 999999999999999 ms)')
  end
end
local held = {}
local left = {}
for i = 1, n do
  local cur = redis.pcall('GET', KEYS[i])
  if type(cur) == 'table' then
    if not (cur.err and string.sub(cur.err, 1, 9) == 'WRONGTYPE') then
      return cur
    end
    held[i] = false
  else
    held[i] = (cur == ARGV[i])
    if held[i] then
      left[i] = redis.call('PTTL', KEYS[i])
    end
  end
end
local out = {}
for i = 1, n do
  if held[i] then
    if left[i] >= 0 and left[i] < tonumber(ARGV[n + i]) then
      redis.call('PEXPIRE', KEYS[i], ARGV[n + i])
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"#,
    sha1: "e7ab0046419b378cba55677b233415cecd2957bd",
};

/// Extends many permits at once (batched renewal of semaphore permits, read/write shares and fair locks).
/// `KEYS[1..n]` the semaphores' keys (a key may repeat), `ARGV[1..n]` the tokens, `ARGV[n+1..2n]` the TTLs in
/// ms. Returns n flags, each exactly what [`PERMIT`]'s `extend` returns for that item, in order: the expired
/// entries of the key purged, the token's live permit (`<token>`, `s:<token>` or `x:<token>`) refreshed to
/// now + TTL by the server's clock, never earlier (`ZADD XX GT`), and the key's expiry set to its latest
/// permit's; 0 when it holds none or the key is of another type (never touched). TTLs and types are checked
/// before the first write. On a cluster all keys must share a slot: the adapters send one call per slot.
pub const EXTEND_PERMITS: Script = Script {
    name: "extend-permits",
    source: r#"local n = #KEYS
if #ARGV ~= 2 * n then
  return redis.error_reply('ERR redlease: extend_permits wants a token and a TTL per key')
end
for i = 1, n do
  local ttl = ARGV[n + i]
  if #ttl > 15 or not string.find(ttl, '^[1-9][0-9]*$') then
    return redis.error_reply('ERR redlease: invalid TTL argument (want 1 to 999999999999999 ms)')
  end
end
local zset = {}
for i = 1, n do
  local kind = redis.call('TYPE', KEYS[i])
  if type(kind) == 'table' then
    kind = kind.ok
  end
  zset[i] = kind == 'zset'
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local nowtext = string.format('%.0f', now)
local out = {}
for i = 1, n do
  out[i] = 0
  if zset[i] then
    local key = KEYS[i]
    redis.call('ZREMRANGEBYSCORE', key, '-inf', nowtext)
    local member = false
    for _, m in ipairs({ARGV[i], 's:' .. ARGV[i], 'x:' .. ARGV[i]}) do
      if redis.call('ZSCORE', key, m) then
        member = m
        break
      end
    end
    if member then
      redis.call('ZADD', key, 'XX', 'GT', string.format('%.0f', now + tonumber(ARGV[n + i])), member)
      local last = redis.call('ZREVRANGEBYSCORE', key, '(1000000000000000', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
      if last[2] then
        redis.call('PEXPIREAT', key, string.format('%.0f', tonumber(last[2])))
      end
      out[i] = 1
    end
  end
end
return out
"#,
    sha1: "9bb9e856fbbcba5998845bfd394842385b1bb4a6",
};

/// Several lock keys taken in one atomic step, all or nothing ([`RedisNode::multi_key`](redlease::RedisNode::multi_key)
/// with `Acquire`). `KEYS[1..n]` the lock keys, then the fence counters of the fenced ones; `ARGV[1]` the TTL
/// in ms, `ARGV[2..n+1]` the keys' tokens, `ARGV[n+2..2n+1]` per key the index in `KEYS` of its fence counter
/// (`0`: unfenced).
///
/// Reads everything first: every fence counter (checked as in [`ACQUIRE_FENCED`]) and every lock key. If a
/// lock key holds another value, nothing is written and the reply is `{0, i, pttl}`: `i` the key's 0-based
/// position, `pttl` its remaining TTL (negative: none). Otherwise each absent key is set with its token and
/// `PX ttl` (its counter `INCR`ed first), each key already holding its token keeps the longer of its
/// remaining TTL and the TTL (never shortened, as in [`ACQUIRE`]), and the reply is `{1, f1, …, fn}`: each
/// key's fence as a string (exact above 2^53; the counter's current value for a key that already held its
/// token), `''` for an unfenced key. Every fence of the call is issued in this one step.
///
/// Error replies, all before any write: invalid arguments; `FENCE …` and `WRONGTYPE` as for
/// [`ACQUIRE_FENCED`]; the error of a command the server refuses inside the script. Under `maxmemory` the
/// first `INCR` or `SET` is refused with `OOM` before anything is written (no shebang, see the module
/// docs). Fence counters are distinct and none is a lock key (redlease never sends otherwise: two items on
/// one counter would be incremented twice). On a cluster all keys share one slot: the adapters answer
/// `Unsupported` otherwise, and the core takes the keys one at a time.
pub const ACQUIRE_MANY: Script = Script {
    name: "acquire-many",
    source: r#"local n = (#ARGV - 1) / 2
if n < 1 or n ~= math.floor(n) or #KEYS < n then
  return redis.error_reply('ERR redlease: acquire_many wants a TTL, then a token and a fence index per key')
end
local ttl = ARGV[1]
if #ttl > 15 or not string.find(ttl, '^[1-9][0-9]*$') then
  return redis.error_reply('ERR redlease: invalid TTL argument (want 1 to 999999999999999 ms)')
end
local fidx = {}
local fences = {}
for i = 1, n do
  if ARGV[1 + i] == '' then
    return redis.error_reply('ERR redlease: invalid token argument (empty)')
  end
  local f = tonumber(ARGV[1 + n + i])
  if f == nil or f ~= math.floor(f) or (f ~= 0 and (f <= n or f > #KEYS)) then
    return redis.error_reply('ERR redlease: invalid fence index argument')
  end
  fidx[i] = f
  fences[i] = false
  if f > 0 then
    local fk = KEYS[f]
    local fence = redis.pcall('GET', fk)
    if type(fence) == 'table' then
      if fence.err and string.sub(fence.err, 1, 9) == 'WRONGTYPE' then
        return redis.error_reply('FENCE the fence key ' .. fk .. ' holds a value of another type')
      end
      return fence
    end
    if fence ~= false then
      if fence ~= '0' and not string.find(fence, '^[1-9][0-9]*$') then
        return redis.error_reply('FENCE the fence key ' .. fk .. ' does not hold a non-negative integer')
      end
      if #fence > 19 or (#fence == 19 and fence >= '9223372036854775807') then
        return redis.error_reply('FENCE the fence counter ' .. fk .. ' is exhausted')
      end
      if redis.call('PTTL', fk) ~= -1 then
        return redis.error_reply('FENCE the fence key ' .. fk .. ' has a TTL; fencing numbers would restart when it expires')
      end
    end
    fences[i] = fence
  end
end
local ours = {}
for i = 1, n do
  local cur = redis.pcall('GET', KEYS[i])
  if type(cur) == 'table' then
    if cur.err and string.sub(cur.err, 1, 9) == 'WRONGTYPE' then
      return redis.error_reply('WRONGTYPE the lock key ' .. KEYS[i] .. ' holds a value of another type')
    end
    return cur
  end
  if cur ~= false and cur ~= ARGV[1 + i] then
    return {0, i - 1, redis.call('PTTL', KEYS[i])}
  end
  if cur ~= false and fidx[i] > 0 and fences[i] == false then
    return redis.error_reply('FENCE the fence key ' .. KEYS[fidx[i]] .. ' is missing while the lock holds this token')
  end
  ours[i] = (cur ~= false)
end
local out = {1}
for i = 1, n do
  if ours[i] then
    local left = redis.call('PTTL', KEYS[i])
    if left >= 0 and left < tonumber(ttl) then
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  else
    if fidx[i] > 0 then
      redis.call('INCR', KEYS[fidx[i]])
    end
    redis.call('SET', KEYS[i], ARGV[1 + i], 'PX', ttl)
  end
  if fidx[i] > 0 then
    out[i + 1] = redis.call('GET', KEYS[fidx[i]])
  else
    out[i + 1] = ''
  end
end
return out
"#,
    sha1: "ee79ed70466a046c74d83b570988d962527e0b75",
};

/// Several compare-and-deletes in one atomic step ([`RedisNode::multi_key`](redlease::RedisNode::multi_key)
/// with `Release`), each announced as [`RELEASE`] announces it. `KEYS[1..n]` the lock keys, `ARGV[1..n]` their
/// tokens, `ARGV[n+1]` `PUBLISH`, `SPUBLISH` or `''` (no notification), `ARGV[n+2..2n+1]` each key's
/// notification channel. Returns n flags: 1 deleted, 0 not (absent, another value, or a key of another type:
/// never touched). Every key is read before the first deletion, so an error reply (a refused read) changes
/// nothing.
pub const RELEASE_MANY: Script = Script {
    name: "release-many",
    source: r#"local n = #KEYS
if #ARGV ~= 2 * n + 1 then
  return redis.error_reply('ERR redlease: release_many wants a token and a channel per key, and the publish command')
end
local held = {}
for i = 1, n do
  local cur = redis.pcall('GET', KEYS[i])
  if type(cur) == 'table' then
    if not (cur.err and string.sub(cur.err, 1, 9) == 'WRONGTYPE') then
      return cur
    end
    held[i] = false
  else
    held[i] = (cur == ARGV[i])
  end
end
local publish = ARGV[n + 1]
local out = {}
for i = 1, n do
  if held[i] then
    redis.call('DEL', KEYS[i])
    if publish == 'SPUBLISH' or publish == 'PUBLISH' then
      redis.pcall(publish, ARGV[n + 1 + i], string.sub(ARGV[i], 1, 8))
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"#,
    sha1: "d0fd6873e9756b0b6b43ec925143062dc23792cf",
};

/// One operation on a leased semaphore ([`RedisNode::permit`](redlease::RedisNode::permit)): a sorted set at
/// `KEYS[1]` whose members are the holders' tokens, each scored by its permit's expiry in the **server's**
/// milliseconds (`TIME`). `ARGV[1]` token, `ARGV[2]` TTL in ms, `ARGV[3]` the operation (`acquire`, `extend`
/// or `release`), `ARGV[4]` the number of permits (read by `acquire`), `ARGV[5]` the release notification
/// channel ([`redlease::notify::channel`] of the key; empty: no notification) and `ARGV[6]` `PUBLISH` or
/// `SPUBLISH`.
///
/// A permit whose score is not later than now is expired: it counts for nothing, and the script removes
/// every expired permit (`ZREMRANGEBYSCORE key -inf now`) in the same step. Then:
///
/// - `acquire`: our token holds a live permit → its score set to now + TTL; else fewer than `permits` live
///   → ours added; both answer 1. Otherwise nothing changes but the purge, and it answers `-1 - ms`, `ms`
///   the time until the earliest live permit expires (so -1 means 0 ms left, -1001 means 1000 ms).
/// - `extend`: our token holds a live permit → its score set to now + TTL, 1; else 0.
/// - `release`: our token holds a live permit → removed, 1, and [`redlease::notify::payload`] of the token
///   published on the channel (with `redis.pcall`, after the removal, as [`RELEASE`] does); else 0.
///   A waiting writer's claim or a fair waiter's place of the token ([`RW_PERMIT`]) is removed either way.
///
/// `extend` and `release` also find a read/write or fair lock's holder, stored as `s:<token>` or
/// `x:<token>` by [`RW_PERMIT`]. Members scored 10^15 and above are [`RW_PERMIT`]'s arrival markers, not
/// expiries: the key's own expiry ignores them.
///
/// After a change the key's own expiry is set to the latest permit's (`PEXPIREAT`), so the key never outlives
/// its permits; a set left empty is deleted by the server. A key of another type is a `WRONGTYPE` error for
/// `acquire` and 0 (not held, never touched) for `extend` and `release`, as for a lock key. Argument errors
/// (`ERR redlease: invalid …`) and the type check come before any write.
///
/// Under `maxmemory`: a new permit's `ZADD` is the script's first write, so the server refuses it with `OOM`
/// (nothing written), as it refuses a lock's acquisition. A refresh, an extension and a release purge first
/// (`ZREMRANGEBYSCORE`, which never grows memory and is admitted), and a script that has written is let
/// finish, so they keep working, as a lock's extension and release do.
pub const PERMIT: Script = Script {
    name: "permit",
    source: r#"if type(ARGV[1]) ~= 'string' or ARGV[1] == '' then
  return redis.error_reply('ERR redlease: invalid token argument (empty)')
end
local op = ARGV[3]
if op ~= 'acquire' and op ~= 'extend' and op ~= 'release' then
  return redis.error_reply('ERR redlease: invalid permit operation (want acquire, extend or release)')
end
if op ~= 'release' and (type(ARGV[2]) ~= 'string' or #ARGV[2] > 15 or not string.find(ARGV[2], '^[1-9][0-9]*$')) then
  return redis.error_reply('ERR redlease: invalid TTL argument (want 1 to 999999999999999 ms)')
end
local permits = 0
if op == 'acquire' then
  if type(ARGV[4]) ~= 'string' or #ARGV[4] > 10 or not string.find(ARGV[4], '^[1-9][0-9]*$') then
    return redis.error_reply('ERR redlease: invalid permits argument (want 1 to 4294967295)')
  end
  permits = tonumber(ARGV[4])
end
local kind = redis.call('TYPE', KEYS[1])
if type(kind) == 'table' then
  kind = kind.ok
end
if kind ~= 'zset' and kind ~= 'none' then
  if op == 'acquire' then
    return redis.error_reply('WRONGTYPE the semaphore key ' .. KEYS[1] .. ' holds a value of another type')
  end
  return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local nowtext = string.format('%.0f', now)
local member = ARGV[1]
local mine = redis.call('ZSCORE', KEYS[1], member)
if not mine and op ~= 'acquire' then
  for _, prefix in ipairs({'s:', 'x:'}) do
    local score = redis.call('ZSCORE', KEYS[1], prefix .. ARGV[1])
    if score then
      member = prefix .. ARGV[1]
      mine = score
      break
    end
  end
end
if mine and tonumber(mine) <= now then
  mine = false
end
if mine or op ~= 'acquire' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', nowtext)
  if op == 'release' then
    redis.call('ZREM', KEYS[1], 'c:' .. ARGV[1], 'o:' .. ARGV[1])
  end
  if not mine then
    return 0
  elseif op == 'release' then
    redis.call('ZREM', KEYS[1], member)
    if ARGV[5] and ARGV[5] ~= '' then
      if ARGV[6] == 'SPUBLISH' then
        redis.pcall('SPUBLISH', ARGV[5], string.sub(ARGV[1], 1, 8))
      else
        redis.pcall('PUBLISH', ARGV[5], string.sub(ARGV[1], 1, 8))
      end
    end
  else
    redis.call('ZADD', KEYS[1], 'XX', 'GT', string.format('%.0f', now + tonumber(ARGV[2])), member)
  end
elseif redis.call('ZCOUNT', KEYS[1], '(' .. nowtext, '+inf') < permits then
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[2])), ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', nowtext)
else
  local first = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. nowtext, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', nowtext)
  return -1 - (tonumber(first[2]) - now)
end
local last = redis.call('ZREVRANGEBYSCORE', KEYS[1], '(1000000000000000', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
if last[2] then
  redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', tonumber(last[2])))
end
return 1
"#,
    sha1: "96694493963f5e31cc741779e553c7d4f008ce45",
};

/// Acquisitions of a read/write lock and of a fair lock ([`redlease::PermitOp::AcquireShared`],
/// [`AcquireExclusive`](redlease::PermitOp::AcquireExclusive), [`AcquireFair`](redlease::PermitOp::AcquireFair)),
/// on the sorted set at `KEYS[1]` scored by expiries in the server's milliseconds (`TIME`), expired entries
/// purged first: readers `s:<token>`, the writer or fair holder `x:<token>`, a waiting writer's claim or a
/// fair waiter's place `c:<token>`, and a fair waiter's arrival marker `o:<token>` scored 10^15 + its arrival
/// (arrival order; removed with its place; one past the last marker when that is not earlier, so that
/// waiters arriving within one millisecond keep their order). `ARGV[1]` token, `ARGV[2]` TTL in ms, `ARGV[3]` `shared`,
/// `exclusive` or `fair`, `ARGV[4]` the claim's life in ms, `ARGV[5]` the queue limit. Answers 1 (taken, or
/// refreshed when the token already holds it) or `-1 - ms` (blocked; `ms` until the earliest blocking entry
/// expires, capped at the claim's life so that a waiter refreshes it in time). A full queue is a `BUSY`
/// error; a key of another type `WRONGTYPE`. Extension and release go through [`PERMIT`], which finds
/// these members. The key's own expiry follows its latest expiry (arrival markers excluded). Where no script
/// runs (except on a cluster) the adapters make the same decision in Rust from a read under `WATCH` and write
/// it in one `MULTI … EXEC` (`WATCHED_RW_PERMIT` in messages).
///
/// A **fenced writer** (`exclusive` with `KEYS[2]`, the fence counter, in the lock key's slot): the counter is
/// checked first, before any write, as [`ACQUIRE_FENCED`] checks it (`FENCE` errors for another type, a value
/// that is not a non-negative integer, a TTL, an exhausted counter); a grant then `INCR`s it and answers its new
/// value as a string (exact above 2^53), and a refresh by the holder answers its current value (a `FENCE`
/// error if it is missing). A blocked attempt never touches it.
pub const RW_PERMIT: Script = Script {
    name: "rw-permit",
    source: r#"if type(ARGV[1]) ~= 'string' or ARGV[1] == '' then
  return redis.error_reply('ERR redlease: invalid token argument (empty)')
end
local op = ARGV[3]
if op ~= 'shared' and op ~= 'exclusive' and op ~= 'fair' then
  return redis.error_reply('ERR redlease: invalid permit operation (want shared, exclusive or fair)')
end
for i = 4, 5 do
  if type(ARGV[i]) ~= 'string' or #ARGV[i] > 15 or not string.find(ARGV[i], '^[1-9][0-9]*$') then
    return redis.error_reply('ERR redlease: invalid claim or queue argument')
  end
end
if type(ARGV[2]) ~= 'string' or #ARGV[2] > 15 or not string.find(ARGV[2], '^[1-9][0-9]*$') then
  return redis.error_reply('ERR redlease: invalid TTL argument (want 1 to 999999999999999 ms)')
end
local key = KEYS[1]
local fenced = op == 'exclusive' and KEYS[2] ~= nil
local fence = false
if fenced then
  fence = redis.pcall('GET', KEYS[2])
  if type(fence) == 'table' then
    if fence.err and string.sub(fence.err, 1, 9) == 'WRONGTYPE' then
      return redis.error_reply('FENCE the fence key ' .. KEYS[2] .. ' holds a value of another type')
    end
    return fence
  end
  if fence ~= false then
    if fence ~= '0' and not string.find(fence, '^[1-9][0-9]*$') then
      return redis.error_reply('FENCE the fence key ' .. KEYS[2] .. ' does not hold a non-negative integer')
    end
    if #fence > 19 or (#fence == 19 and fence >= '9223372036854775807') then
      return redis.error_reply('FENCE the fence counter ' .. KEYS[2] .. ' is exhausted')
    end
    if redis.call('PTTL', KEYS[2]) ~= -1 then
      return redis.error_reply('FENCE the fence key ' .. KEYS[2] .. ' has a TTL; fencing numbers would restart when it expires')
    end
  end
end
local kind = redis.call('TYPE', key)
if type(kind) == 'table' then
  kind = kind.ok
end
if kind ~= 'zset' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE the lock key ' .. key .. ' holds a value of another type')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local order = 1000000000000000
local function num(n)
  return string.format('%.0f', n)
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', num(now))
local tok = ARGV[1]
local ttl = tonumber(ARGV[2])
local life = math.min(tonumber(ARGV[4]), ttl)
local shared, excl, claims = {}, {}, {}
local held = nil
local entries = redis.call('ZRANGEBYSCORE', key, '(' .. num(now), '(' .. num(order), 'WITHSCORES')
for i = 1, #entries, 2 do
  local m, score = entries[i], tonumber(entries[i + 1])
  local prefix, t = string.sub(m, 1, 2), string.sub(m, 3)
  if prefix == 's:' then
    shared[#shared + 1] = score
  elseif prefix == 'x:' then
    excl[#excl + 1] = score
  elseif prefix == 'c:' then
    claims[t] = score
  end
  if t == tok and (prefix == 's:' or prefix == 'x:') then
    held = m
  end
end
local queue = {}
local marks = redis.call('ZRANGEBYSCORE', key, num(order), '+inf')
for i = 1, #marks do
  local t = string.sub(marks[i], 3)
  if claims[t] then
    queue[#queue + 1] = t
  else
    redis.call('ZREM', key, marks[i])
  end
end
local function earliest(lists)
  local e = nil
  for _, list in ipairs(lists) do
    for _, score in pairs(list) do
      if not e or score < e then
        e = score
      end
    end
  end
  return e
end
local result
if held then
  if fenced and fence == false then
    return redis.error_reply('FENCE the fence key ' .. KEYS[2] .. ' is missing while the writer holds this token')
  end
  redis.call('ZADD', key, 'XX', 'GT', num(now + ttl), held)
  result = 1
  if fenced then
    result = fence
  end
elseif op == 'shared' then
  local next = earliest({excl, claims})
  if next then
    result = -1 - (next - now)
  else
    redis.call('ZADD', key, num(now + ttl), 's:' .. tok)
    result = 1
  end
elseif op == 'exclusive' then
  local next = earliest({shared, excl})
  if next then
    redis.call('ZADD', key, num(now + life), 'c:' .. tok)
    result = -1 - math.min(next - now, life)
  else
    redis.call('ZREM', key, 'c:' .. tok, 'o:' .. tok)
    redis.call('ZADD', key, num(now + ttl), 'x:' .. tok)
    result = 1
    if fenced then
      redis.call('INCR', KEYS[2])
      result = redis.call('GET', KEYS[2])
    end
  end
else
  if #excl == 0 and (#queue == 0 or queue[1] == tok) then
    redis.call('ZREM', key, 'c:' .. tok, 'o:' .. tok)
    redis.call('ZADD', key, num(now + ttl), 'x:' .. tok)
    result = 1
  else
    if not claims[tok] and #queue >= tonumber(ARGV[5]) then
      return redis.error_reply('BUSY redlease: the fair lock\'s queue is full (' .. #queue .. ' waiters)')
    end
    local next = life
    if excl[1] then
      next = math.min(next, excl[1] - now)
    end
    if queue[1] then
      next = math.min(next, claims[queue[1]] - now)
    end
    if not claims[tok] then
      local mark = order + now
      local last = redis.call('ZREVRANGEBYSCORE', key, '+inf', num(order), 'WITHSCORES', 'LIMIT', 0, 1)
      if last[2] and tonumber(last[2]) >= mark then
        mark = tonumber(last[2]) + 1
      end
      redis.call('ZADD', key, num(mark), 'o:' .. tok)
    end
    redis.call('ZADD', key, num(now + life), 'c:' .. tok)
    result = -1 - next
  end
end
local last = redis.call('ZREVRANGEBYSCORE', key, '(' .. num(order), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
if last[2] then
  redis.call('PEXPIREAT', key, num(tonumber(last[2])))
end
return result
"#,
    sha1: "9fe249d6c91065a03c9b1e8f55593fe76d1eff0a",
};

/// Reads value and TTL in one step. `KEYS[1]` key. Returns nil when absent, else `[value, pttl_ms]` (`pttl` is
/// -1 for a key without expiry).
pub const INSPECT: Script = Script {
    name: "inspect",
    source: r#"local cur = redis.call('GET', KEYS[1])
if cur == false then
  return false
end
return {cur, redis.call('PTTL', KEYS[1])}
"#,
    sha1: "0ac8a5fb3e6b7ce51bb8fdd38f52ff2920045c78",
};

/// The capability probe an adapter runs once per connection before its first script write (the first fresh
/// acquisition runs [`PROBE_ACQUIRE`] instead). `KEYS[1]` an example lock key (the first one the connection
/// acquires), optionally `KEYS[2]` its fence key. Writes nothing.
///
/// Returns `[set_nx_get, set_ifeq, delifeq]`, each 1 or 0: whether the server accepts `SET key value NX GET`
/// (Redis 7.0 and later), `SET key value IFEQ value` (Valkey 8.1 and later) and `DELIFEQ key value` (Valkey
/// 9.0 and later), and the user may run them here (a command the ACL refuses inside the script counts as
/// absent). Error replies:
/// `NOPERM redlease: …` listing the commands the lease scripts need that the user may not run on these keys
/// (checked with `redis.acl_check_cmd` where the server has it, Redis 7.0 and later), and any error of the
/// `SET` probe other than the two it expects (`READONLY` on a replica, a missing permission, …).
///
/// The `SET` probes send `SET key probe NX GET PX 0` and `SET key redlease:probe IFEQ redlease:probe PX 0`: a
/// server that accepts the option rejects the expiry (`invalid expire time`), one that does not rejects the
/// syntax, and neither writes anything. `DELIFEQ` is not run at all: `redis.acl_check_cmd('DELIFEQ', key, v)`
/// raises an error for a command the server does not have, and answers whether the user may run it on the
/// key otherwise (`DELIFEQ` came with Valkey 9.0, which has `acl_check_cmd`; a server without it has no
/// `DELIFEQ` either). So no key is ever deleted by the check, whatever it holds.
pub const PROBE: Script = Script {
    name: "capability check",
    source: r#"local denied = {}
if redis.acl_check_cmd then
  local checks = {
    {'GET', KEYS[1]}, {'SET', KEYS[1], 'v', 'PX', '1'}, {'PEXPIRE', KEYS[1], '1'}, {'DEL', KEYS[1]},
    {'PTTL', KEYS[1]}
  }
  if KEYS[2] then
    checks[#checks + 1] = {'GET', KEYS[2]}
    checks[#checks + 1] = {'INCR', KEYS[2]}
    checks[#checks + 1] = {'PTTL', KEYS[2]}
  end
  for _, c in ipairs(checks) do
    if not redis.acl_check_cmd(unpack(c)) then
      denied[#denied + 1] = c[1] .. ' ' .. c[2]
    end
  end
end
if #denied > 0 then
  return redis.error_reply('NOPERM redlease: this user may not run ' .. table.concat(denied, ', '))
end
local nxget
local r = redis.pcall('SET', KEYS[1], 'probe', 'NX', 'GET', 'PX', '0')
if type(r) == 'table' and r.err then
  if string.find(r.err, 'invalid expire') then
    nxget = 1
  elseif string.find(r.err, 'syntax error') then
    nxget = 0
  else
    return r
  end
else
  return redis.error_reply('ERR redlease: the SET probe was not refused')
end
local ifeq = 0
local q = redis.pcall('SET', KEYS[1], 'redlease:probe', 'IFEQ', 'redlease:probe', 'PX', '0')
if type(q) == 'table' and q.err and string.find(q.err, 'invalid expire') then
  ifeq = 1
end
local delifeq = 0
if redis.acl_check_cmd then
  local known, allowed = pcall(redis.acl_check_cmd, 'DELIFEQ', KEYS[1], 'v')
  if known and allowed then
    delifeq = 1
  end
end
return {nxget, ifeq, delifeq}
"#,
    sha1: "1b90bd1d12afc315c02fcefaaf1040fec3487135",
};

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

/// The first fresh acquisition on a connection: the capability check of [`PROBE`] and the fresh acquisition of
/// [`ACQUIRE_FRESH`] in one command. `KEYS[1]` lock, `ARGV[1]` a token never written before, `ARGV[2]` TTL in
/// ms. Returns `[acquired, set_nx_get, set_ifeq, delifeq]`: `acquired` 1 when the key was absent (now set), 0
/// when it exists (never touched); the other three as [`PROBE`] answers them. Error replies, all before any write: those of
/// [`PROBE`] and of [`ACQUIRE_FRESH`].
pub const PROBE_ACQUIRE: Script = Script {
    name: "first acquisition",
    source: r#"if type(ARGV[1]) ~= 'string' or ARGV[1] == '' then
  return redis.error_reply('ERR redlease: invalid token argument (empty)')
end
if type(ARGV[2]) ~= 'string' or #ARGV[2] > 15 or not string.find(ARGV[2], '^[1-9][0-9]*$') then
  return redis.error_reply('ERR redlease: invalid TTL argument (want 1 to 999999999999999 ms)')
end
local denied = {}
if redis.acl_check_cmd then
  local checks = {
    {'GET', KEYS[1]}, {'SET', KEYS[1], 'v', 'PX', '1'}, {'PEXPIRE', KEYS[1], '1'}, {'DEL', KEYS[1]},
    {'PTTL', KEYS[1]}
  }
  for _, c in ipairs(checks) do
    if not redis.acl_check_cmd(unpack(c)) then
      denied[#denied + 1] = c[1] .. ' ' .. c[2]
    end
  end
end
if #denied > 0 then
  return redis.error_reply('NOPERM redlease: this user may not run ' .. table.concat(denied, ', '))
end
local nxget = 0
local r = redis.pcall('SET', KEYS[1], 'probe', 'NX', 'GET', 'PX', '0')
if type(r) == 'table' and r.err then
  if string.find(r.err, 'invalid expire') then
    nxget = 1
  elseif not string.find(r.err, 'syntax error') then
    return r
  end
else
  return redis.error_reply('ERR redlease: the SET probe was not refused')
end
local ifeq = 0
local q = redis.pcall('SET', KEYS[1], 'redlease:probe', 'IFEQ', 'redlease:probe', 'PX', '0')
if type(q) == 'table' and q.err and string.find(q.err, 'invalid expire') then
  ifeq = 1
end
local delifeq = 0
if redis.acl_check_cmd then
  local known, allowed = pcall(redis.acl_check_cmd, 'DELIFEQ', KEYS[1], 'v')
  if known and allowed then
    delifeq = 1
  end
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then
  if cur.err and string.sub(cur.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('WRONGTYPE the lock key ' .. KEYS[1] .. ' holds a value of another type')
  end
  return cur
end
if cur == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, nxget, ifeq, delifeq}
end
return {0, nxget, ifeq, delifeq}
"#,
    sha1: "42f612f689ac90c8b9fb3d4cb2f73ae8f7861278",
};

/// What [`PROBE`] and [`PROBE_ACQUIRE`] found: `[set_nx_get, set_ifeq, delifeq]`.
pub(crate) fn parse_probe(script: &Script, items: Vec<Reply>) -> Result<[bool; 3], NodeError> {
    match <[Reply; 3]>::try_from(items) {
        Ok([a, b, c]) => Ok([
            parse_flag(script, a)?,
            parse_flag(script, b)?,
            parse_flag(script, c)?,
        ]),
        Err(items) => Err(unexpected(script, &Reply::Array(items))),
    }
}

/// `acquired` and `[set_nx_get, set_ifeq, delifeq]` of [`PROBE_ACQUIRE`].
pub(crate) fn parse_probe_acquire(reply: Reply) -> Result<(bool, [bool; 3]), NodeError> {
    let script = &PROBE_ACQUIRE;
    match reply {
        Reply::Array(mut items) if items.len() == 4 => {
            let acquired = parse_flag(script, items.remove(0))?;
            Ok((acquired, parse_probe(script, items)?))
        }
        other => Err(unexpected(script, &other)),
    }
}

/// `[set_nx_get, set_ifeq, delifeq]` of [`PROBE`].
pub(crate) fn parse_probe_reply(reply: Reply) -> Result<[bool; 3], NodeError> {
    match reply {
        Reply::Array(items) => parse_probe(&PROBE, items),
        other => Err(unexpected(&PROBE, &other)),
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

/// A client-neutral view of a script reply, built by each adapter from its client's value type — and by a
/// node of your own from its client's, to interpret replies with the `parse_*` functions of this module.
/// (An error reply is not a `Reply`: classify its line with [`server_error_kind`].)
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply {
    /// A nil bulk string or nil array (RESP3 null).
    Nil,
    /// An integer.
    Int(i64),
    /// A bulk or simple string.
    Bytes(Vec<u8>),
    /// An array.
    Array(Vec<Reply>),
    /// Any other RESP type, by name (it is never a valid answer of a script).
    Other(&'static str),
}

fn unexpected(script: &Script, reply: &Reply) -> NodeError {
    let noun = script.noun();
    // The reply of a script that ran: the command may have taken effect.
    let shape = match reply {
        Reply::Nil => "nil",
        Reply::Int(_) => "an integer",
        Reply::Bytes(_) => "a string",
        Reply::Array(_) => "an array",
        Reply::Other(name) => name,
    };
    NodeError::ambiguous(
        NodeErrorKind::Protocol,
        format!("unexpected reply to the {} {noun}: {shape}", script.name),
    )
}

fn parse_int(script: &Script, reply: &Reply) -> Result<i64, NodeError> {
    match reply {
        Reply::Int(n) => Ok(*n),
        Reply::Bytes(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| unexpected(script, reply)),
        _ => Err(unexpected(script, reply)),
    }
}

/// Replies 1 / 0 of [`ACQUIRE`], [`ACQUIRE_FRESH`], [`RELEASE`] and [`EXTEND`]: `true` for 1. Any other reply
/// is an ambiguous [`NodeErrorKind::Protocol`] error (the script ran).
pub fn parse_flag(script: &Script, reply: Reply) -> Result<bool, NodeError> {
    match parse_int(script, &reply)? {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(unexpected(script, &reply)),
    }
}

/// The reply of [`EXTEND_MANY`] for `n` keys: an array of n flags, each 1 or 0.
pub fn parse_flags(script: &Script, reply: Reply, n: usize) -> Result<Vec<bool>, NodeError> {
    match reply {
        Reply::Array(items) if items.len() == n => items
            .into_iter()
            .map(|item| parse_flag(script, item))
            .collect(),
        other => Err(unexpected(script, &other)),
    }
}

/// The reply of `SET key token NX GET PX ttl`: nil when the key was absent (now set), the old value when it
/// exists (nothing changed).
pub fn parse_set_nx_get(reply: Reply) -> Result<bool, NodeError> {
    match &reply {
        Reply::Nil => Ok(true),
        Reply::Bytes(_) => Ok(false),
        _ => Err(unexpected(&SET_NX, &reply)),
    }
}

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
/// fenced writer's counter, `TIME`, `ZRANGE … WITHSCORES`, `MULTI … EXEC`), which does what [`RW_PERMIT`]
/// does.
pub(crate) const WATCHED_RW_PERMIT: Script = Script {
    name: "WATCH/TIME/ZRANGE/MULTI … EXEC (read/write or fair lock without Lua)",
    source: "",
    sha1: "",
};

/// The reply of a conditional `SET` (`NX` or `IFEQ`, without `GET`): `OK` when it was set, nil when not.
pub(crate) fn parse_set_ok(script: &Script, reply: Reply) -> Result<bool, NodeError> {
    match &reply {
        Reply::Nil => Ok(false),
        Reply::Bytes(b) if b.as_slice() == b"OK" => Ok(true),
        _ => Err(unexpected(script, &reply)),
    }
}

/// The `[value or nil, pttl]` of `MULTI GET PTTL EXEC`, read like [`parse_inspect`].
pub(crate) fn parse_inspect_tx(reply: Vec<Reply>) -> Result<Option<KeyState>, NodeError> {
    match <[Reply; 2]>::try_from(reply) {
        Ok([Reply::Nil, _]) => Ok(None),
        Ok([value, pttl]) => parse_inspect(Reply::Array(vec![value, pttl])).map_err(|_| {
            unexpected(
                &TRANSACTION,
                &Reply::Other("a GET/PTTL pair of the wrong shape"),
            )
        }),
        Err(items) => Err(unexpected(&TRANSACTION, &Reply::Array(items))),
    }
}

/// An integer reply (or a decimal string) of a plain command.
pub(crate) fn parse_integer(script: &Script, reply: &Reply) -> Result<i64, NodeError> {
    parse_int(script, reply)
}

/// A reply of the wrong shape to `script` (ambiguous: the command ran).
pub(crate) fn unexpected_reply(script: &Script, reply: &Reply) -> NodeError {
    unexpected(script, reply)
}

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

/// The reply of [`ACQUIRE_TTL`]: taken, or held with the holder's remaining TTL (`None`: no expiry).
pub fn parse_claim(reply: Reply) -> Result<redlease::Claim, NodeError> {
    let script = &ACQUIRE_TTL;
    match parse_int(script, &reply)? {
        1 => Ok(redlease::Claim::Taken),
        0 => Ok(redlease::Claim::Held { remaining: None }),
        n if n < 0 => Ok(redlease::Claim::Held {
            remaining: Some(Duration::from_millis((-1 - n).unsigned_abs())),
        }),
        _ => Err(unexpected(script, &reply)),
    }
}

/// The reply of [`PERMIT`] to operation `op`: 1 done; 0 not held (`extend`, `release`); `-1 - ms` full
/// (`acquire`), the earliest permit expiring in `ms`. Any other reply is an ambiguous
/// [`NodeErrorKind::Protocol`] error (the script ran).
pub fn parse_permit(
    op: redlease::PermitOp<'_>,
    reply: Reply,
) -> Result<redlease::PermitReply, NodeError> {
    use redlease::{PermitOp, PermitReply};
    let script = &PERMIT;
    let acquire = matches!(op, PermitOp::Acquire { .. });
    match parse_int(script, &reply)? {
        1 => Ok(PermitReply::Done),
        0 if !acquire => Ok(PermitReply::NotHeld),
        n if n < 0 && acquire => Ok(PermitReply::Full {
            next_expiry: Some(Duration::from_millis((-1 - n).unsigned_abs())),
        }),
        _ => Err(unexpected(script, &reply)),
    }
}

/// The reply of [`RW_PERMIT`]: 1 taken; `-1 - ms` blocked, the earliest blocking entry expiring in `ms`; a
/// fenced writer's grant, the fence as a string ([`PermitReply::Fenced`](redlease::PermitReply::Fenced)). Any
/// other reply is an ambiguous [`NodeErrorKind::Protocol`] error (the script ran).
pub fn parse_rw_permit(reply: Reply) -> Result<redlease::PermitReply, NodeError> {
    let script = &RW_PERMIT;
    if let Reply::Bytes(b) = &reply {
        return std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|n| *n >= 1)
            .map(|fence| redlease::PermitReply::Fenced { fence })
            .ok_or_else(|| unexpected(script, &reply));
    }
    match parse_int(script, &reply)? {
        1 => Ok(redlease::PermitReply::Done),
        n if n < 0 => Ok(redlease::PermitReply::Full {
            next_expiry: Some(Duration::from_millis((-1 - n).unsigned_abs())),
        }),
        _ => Err(unexpected(script, &reply)),
    }
}

/// The reply of [`ACQUIRE_FENCED`]: the fence as a string (exact above 2^53) or nil when contended.
pub fn parse_fence(reply: Reply) -> Result<Option<u64>, NodeError> {
    let script = &ACQUIRE_FENCED;
    match &reply {
        Reply::Nil => Ok(None),
        Reply::Bytes(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|n| *n >= 1)
            .map(Some)
            .ok_or_else(|| unexpected(script, &reply)),
        Reply::Int(n) if *n >= 1 => Ok(Some(n.unsigned_abs())),
        _ => Err(unexpected(script, &reply)),
    }
}

/// The reply of [`ACQUIRE_MANY`] for `n` keys: `{1, fences…}` (`''` for an unfenced key) or `{0, i, pttl}`.
pub fn parse_acquire_many(reply: Reply, n: usize) -> Result<redlease::MultiKeyReply, NodeError> {
    let script = &ACQUIRE_MANY;
    let Reply::Array(items) = &reply else {
        return Err(unexpected(script, &reply));
    };
    match items.first() {
        Some(Reply::Int(1)) if items.len() == n + 1 => items[1..]
            .iter()
            .map(|item| match item {
                Reply::Bytes(b) if b.is_empty() => Ok(None),
                other => parse_fence(other.clone())
                    .ok()
                    .flatten()
                    .map(Some)
                    .ok_or_else(|| unexpected(script, &reply)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|fences| redlease::MultiKeyReply::Taken { fences }),
        Some(Reply::Int(0)) if items.len() == 3 => {
            let index = parse_int(script, &items[1])?;
            let pttl = parse_int(script, &items[2])?;
            match usize::try_from(index) {
                Ok(index) if index < n => Ok(redlease::MultiKeyReply::Held {
                    index,
                    remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
                }),
                _ => Err(unexpected(script, &reply)),
            }
        }
        _ => Err(unexpected(script, &reply)),
    }
}

/// The reply of [`INSPECT`]: nil for a missing key, else `[value, pttl]`.
pub fn parse_inspect(reply: Reply) -> Result<Option<KeyState>, NodeError> {
    let script = &INSPECT;
    match reply {
        Reply::Nil => Ok(None),
        Reply::Array(items) => match <[Reply; 2]>::try_from(items) {
            Ok([Reply::Bytes(value), pttl]) => {
                let ms = parse_int(script, &pttl)?;
                let ttl = match ms {
                    // -1: no expiry. (-2, key absent, cannot happen after GET found it.)
                    -1 => None,
                    ms if ms >= 0 => Some(Duration::from_millis(ms.unsigned_abs())),
                    _ => return Err(unexpected(script, &pttl)),
                };
                Ok(Some(KeyState::new(value, ttl)))
            }
            Ok(other) => Err(unexpected(script, &Reply::Array(other.into()))),
            Err(items) => Err(unexpected(script, &Reply::Array(items))),
        },
        other => Err(unexpected(script, &other)),
    }
}

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
    fn flags_parse_integers_and_reject_other_shapes() {
        assert!(parse_flag(&ACQUIRE, Reply::Int(1)).unwrap());
        assert!(!parse_flag(&ACQUIRE, Reply::Int(0)).unwrap());
        let err = parse_flag(&ACQUIRE, Reply::Int(2)).unwrap_err();
        assert!(err.is_ambiguous());
        assert_eq!(err.kind(), NodeErrorKind::Protocol);
        assert!(parse_flag(&ACQUIRE, Reply::Nil).is_err());
    }

    #[test]
    fn fences_parse_exactly_above_two_to_the_53() {
        let big = (1u64 << 62) + 1;
        assert_eq!(
            parse_fence(Reply::Bytes(big.to_string().into_bytes())).unwrap(),
            Some(big)
        );
        assert_eq!(parse_fence(Reply::Nil).unwrap(), None);
        assert_eq!(parse_fence(Reply::Int(7)).unwrap(), Some(7));
        assert!(parse_fence(Reply::Bytes(b"0".to_vec())).is_err());
        assert!(parse_fence(Reply::Bytes(b"-3".to_vec())).is_err());
        assert!(parse_fence(Reply::Int(0)).is_err());
    }

    #[test]
    fn inspect_parses_value_and_ttl() {
        let state = parse_inspect(Reply::Array(vec![
            Reply::Bytes(b"abc".to_vec()),
            Reply::Int(1500),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(state.value, b"abc");
        assert_eq!(state.ttl, Some(Duration::from_millis(1500)));
        let persistent = parse_inspect(Reply::Array(vec![
            Reply::Bytes(b"v".to_vec()),
            Reply::Int(-1),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(persistent.ttl, None);
        assert_eq!(parse_inspect(Reply::Nil).unwrap(), None);
        assert!(parse_inspect(Reply::Array(vec![Reply::Int(1)])).is_err());
        assert!(parse_inspect(Reply::Int(1)).is_err());
    }

    #[test]
    fn permit_replies_parse_by_operation() {
        use redlease::{PermitOp, PermitReply};
        let acquire = PermitOp::Acquire { permits: 2 };
        assert_eq!(
            parse_permit(acquire, Reply::Int(1)).unwrap(),
            PermitReply::Done
        );
        assert_eq!(
            parse_permit(acquire, Reply::Int(-1001)).unwrap(),
            PermitReply::Full {
                next_expiry: Some(Duration::from_millis(1000))
            }
        );
        assert_eq!(
            parse_permit(acquire, Reply::Int(-1)).unwrap(),
            PermitReply::Full {
                next_expiry: Some(Duration::ZERO)
            }
        );
        for op in [PermitOp::Extend, PermitOp::Release] {
            assert_eq!(parse_permit(op, Reply::Int(1)).unwrap(), PermitReply::Done);
            assert_eq!(
                parse_permit(op, Reply::Int(0)).unwrap(),
                PermitReply::NotHeld
            );
            let err = parse_permit(op, Reply::Int(-5)).unwrap_err();
            assert!(err.is_ambiguous(), "{err}");
        }
        // An acquisition never answers "not held".
        assert!(parse_permit(acquire, Reply::Int(0)).is_err());
        assert!(parse_permit(acquire, Reply::Nil).is_err());
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
