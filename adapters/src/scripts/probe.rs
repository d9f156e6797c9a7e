//! The capability check's scripts and the interpretation of their replies.

use redlease::NodeError;

use super::Script;
use super::reply::{Reply, parse_flag, unexpected};

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

/// The first fresh acquisition on a connection: the capability check of [`PROBE`] and the fresh acquisition of
/// [`ACQUIRE_FRESH`](super::ACQUIRE_FRESH) in one command. `KEYS[1]` lock, `ARGV[1]` a token never written before, `ARGV[2]` TTL in
/// ms. Returns `[acquired, set_nx_get, set_ifeq, delifeq]`: `acquired` 1 when the key was absent (now set), 0
/// when it exists (never touched); the other three as [`PROBE`] answers them. Error replies, all before any write: those of
/// [`PROBE`] and of [`ACQUIRE_FRESH`](super::ACQUIRE_FRESH).
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
