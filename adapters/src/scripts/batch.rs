//! The scripts of several keys at once: batched extension of locks and permits, and the multi-key
//! acquisition and release.

use super::Script;

/// Compare-and-extend for many leases at once (batched renewal), never shortening a key. `KEYS[1..n]` locks, `ARGV[1..n]` their
/// tokens, `ARGV[n+1..2n]` their TTLs in ms. Returns an array of n flags, each exactly what [`EXTEND`](super::EXTEND) would
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
/// ms. Returns n flags, each exactly what [`PERMIT`](super::PERMIT)'s `extend` returns for that item, in order: the expired
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
/// Reads everything first: every fence counter (checked as in [`ACQUIRE_FENCED`](super::ACQUIRE_FENCED)) and every lock key. If a
/// lock key holds another value, nothing is written and the reply is `{0, i, pttl}`: `i` the key's 0-based
/// position, `pttl` its remaining TTL (negative: none). Otherwise each absent key is set with its token and
/// `PX ttl` (its counter `INCR`ed first), each key already holding its token keeps the longer of its
/// remaining TTL and the TTL (never shortened, as in [`ACQUIRE`](super::ACQUIRE)), and the reply is `{1, f1, …, fn}`: each
/// key's fence as a string (exact above 2^53; the counter's current value for a key that already held its
/// token), `''` for an unfenced key. Every fence of the call is issued in this one step.
///
/// Error replies, all before any write: invalid arguments; `FENCE …` and `WRONGTYPE` as for
/// [`ACQUIRE_FENCED`](super::ACQUIRE_FENCED); the error of a command the server refuses inside the script. Under `maxmemory` the
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
/// with `Release`), each announced as [`RELEASE`](super::RELEASE) announces it. `KEYS[1..n]` the lock keys, `ARGV[1..n]` their
/// tokens, `ARGV[n+1]` `PUBLISH`, `SPUBLISH` or `''` (no notification), `ARGV[n+2..2n+1]` each key's
/// notification channel, `ARGV[2n+2..3n+1]` each key's waiter marker ([`redlease::notify::waiting_key`]; `''`
/// for a key without one). Returns n flags: 1 deleted, 0 not (absent, another value, or a key of another type:
/// never touched). Every key is read before the first deletion, so an error reply (a refused read) changes
/// nothing.
///
/// A deletion publishes (with `redis.pcall`, after its `DEL`) only when its key's marker exists, or cannot be
/// read (say for a missing ACL permission), or the key has none: a release nobody waits for publishes
/// nothing, key by key, as with [`RELEASE`](super::RELEASE). The markers are arguments, not declared keys, for
/// the reason given there; each lies in its lock key's Redis Cluster slot, which all keys of the call share.
pub const RELEASE_MANY: Script = Script {
    name: "release-many",
    source: r#"local n = #KEYS
if #ARGV ~= 3 * n + 1 then
  return redis.error_reply('ERR redlease: release_many wants a token, a channel and a waiter marker per key, and the publish command')
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
    local marker = ARGV[2 * n + 1 + i]
    if (publish == 'SPUBLISH' or publish == 'PUBLISH') and (marker == '' or redis.pcall('EXISTS', marker) ~= 0) then
      redis.pcall(publish, ARGV[n + 1 + i], string.sub(ARGV[i], 1, 8))
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"#,
    sha1: "c8c49a67f7842c867a35397ebbad90b4c792415c",
};
