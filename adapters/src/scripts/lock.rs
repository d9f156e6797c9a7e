//! The scripts of one lock key: acquisition (plain, fresh, fenced, or with the holder's TTL), the waiter
//! marker, release, extension and inspection.

use super::Script;

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
/// that wait ([`RedisNode::claim`](redlease::RedisNode::claim) with
/// [`wants_ttl`](redlease::ClaimRequest::wants_ttl)). `KEYS[1]` lock, `ARGV[1]`
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
