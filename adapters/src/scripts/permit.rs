//! The scripts of leased semaphores and of read/write and fair locks.

use super::Script;

/// One operation on a leased semaphore ([`RedisNode::permit`](redlease::RedisNode::permit)): a sorted set at
/// `KEYS[1]` whose members are the holders' tokens, each scored by its permit's expiry in the **server's**
/// milliseconds (`TIME`). `ARGV[1]` token, `ARGV[2]` TTL in ms, `ARGV[3]` the operation (`acquire`, `extend`
/// or `release`), `ARGV[4]` the number of permits (read by `acquire`), `ARGV[5]` the release notification
/// channel ([`redlease::notify::channel`] of the key; empty: no notification), `ARGV[6]` `PUBLISH` or
/// `SPUBLISH`, and optionally `ARGV[7]` the key's waiter marker ([`redlease::notify::waiting_key`]; an
/// argument, not a declared key, as in [`RELEASE`](super::RELEASE)).
///
/// A permit whose score is not later than now is expired: it counts for nothing, and the script removes
/// every expired permit (`ZREMRANGEBYSCORE key -inf now`) in the same step. Then:
///
/// - `acquire`: our token holds a live permit → its score set to now + TTL; else fewer than `permits` live
///   → ours added; both answer 1. Otherwise nothing changes but the purge (and the marker), and it answers
///   `-1 - ms`, `ms` the time until the earliest live permit expires (so -1 means 0 ms left, -1001 means
///   1000 ms). With `ARGV[7]`, that blocked answer also marks the waiter marker, **in the same atomic step
///   as the read**, to live at least `ms` plus [`WAITING_MARGIN_MS`](redlease::notify::WAITING_MARGIN_MS),
///   never shortening it, as [`ACQUIRE_TTL`](super::ACQUIRE_TTL) marks a held lock (with `redis.pcall`: a
///   marker refused by the ACL or under `maxmemory` leaves the answer unchanged, and the waiter its usual
///   bound).
/// - `extend`: our token holds a live permit → its score set to now + TTL, 1; else 0.
/// - `release`: our token holds a live permit → removed, 1, and [`redlease::notify::payload`] of the token
///   published on the channel (with `redis.pcall`, after the removal, as [`RELEASE`](super::RELEASE) does)
///   — with `ARGV[7]` only when the marker exists (or cannot be read), checked after the removal in the same
///   step: a release nobody waits for publishes nothing; else 0. A waiting writer's claim or a fair
///   waiter's place of the token ([`RW_PERMIT`]) is removed either way.
///
/// Why no waiter is missed: a waiter's blocked attempt reads the permits and writes the marker in one
/// atomic step, and its next attempt comes at the latest when the earliest blocking permit expires (or its
/// [`max_retry_delay`](redlease::Config::max_retry_delay), if sooner), well inside the marker's life, and
/// marks again if still blocked. So a release either ran before that step (the attempt saw the permit gone
/// and took it, or tries again at once) or runs after it, while the marker lives, and publishes. Nothing
/// deletes the marker: it expires by itself (other waiters of the key may rely on it), so a release within
/// its life after the waiters are gone publishes once more, unheard. Every blocked acquisition marks, also
/// a single [`try_acquire`](redlease::Semaphore::try_acquire) (the node cannot tell it from a waiting
/// attempt: both are [`RedisNode::permit`](redlease::RedisNode::permit)).
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
    if ARGV[5] and ARGV[5] ~= '' and (not ARGV[7] or redis.pcall('EXISTS', ARGV[7]) ~= 0) then
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
  local left = tonumber(first[2]) - now
  if ARGV[7] then
    local hold = left + 1000
    local marked = redis.pcall('PTTL', ARGV[7])
    if type(marked) ~= 'number' or marked < hold then
      redis.pcall('SET', ARGV[7], '1', 'PX', string.format('%.0f', hold))
    end
  end
  return -1 - left
end
local last = redis.call('ZREVRANGEBYSCORE', KEYS[1], '(1000000000000000', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
if last[2] then
  redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', tonumber(last[2])))
end
return 1
"#,
    sha1: "29e0b57ac26701bd5fc717c5df7a8850919adfb2",
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
/// expires, capped at the claim's life so that a waiter refreshes it in time). With `ARGV[6]`, the key's
/// waiter marker ([`redlease::notify::waiting_key`]), a blocked answer also marks it in the same atomic step,
/// to live at least `ms` plus [`WAITING_MARGIN_MS`](redlease::notify::WAITING_MARGIN_MS), never shortening
/// it, exactly as [`PERMIT`] does for a full semaphore (and [`PERMIT`]'s release then publishes only while it
/// exists). A full queue is a `BUSY` error; a key of another type `WRONGTYPE`. Extension and release go through [`PERMIT`], which finds
/// these members. The key's own expiry follows its latest expiry (arrival markers excluded). Where no script
/// runs (except on a cluster) the adapters make the same decision in Rust from a read under `WATCH` and write
/// it in one `MULTI … EXEC` (`WATCHED_RW_PERMIT` in messages).
///
/// A **fenced writer** (`exclusive` with `KEYS[2]`, the fence counter, in the lock key's slot): the counter is
/// checked first, before any write, as [`ACQUIRE_FENCED`](super::ACQUIRE_FENCED) checks it (`FENCE` errors for another type, a value
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
local result, blocked
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
    blocked = next - now
  else
    redis.call('ZADD', key, num(now + ttl), 's:' .. tok)
    result = 1
  end
elseif op == 'exclusive' then
  local next = earliest({shared, excl})
  if next then
    redis.call('ZADD', key, num(now + life), 'c:' .. tok)
    blocked = math.min(next - now, life)
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
    blocked = next
  end
end
if blocked then
  result = -1 - blocked
  if ARGV[6] then
    local hold = blocked + 1000
    local marked = redis.pcall('PTTL', ARGV[6])
    if type(marked) ~= 'number' or marked < hold then
      redis.pcall('SET', ARGV[6], '1', 'PX', num(hold))
    end
  end
end
local last = redis.call('ZREVRANGEBYSCORE', key, '(' .. num(order), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
if last[2] then
  redis.call('PEXPIREAT', key, num(tonumber(last[2])))
end
return result
"#,
    sha1: "093185b7ff7495c84982f79a416d7e26e4d275ba",
};
