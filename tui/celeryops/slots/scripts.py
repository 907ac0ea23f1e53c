"""The Lua scripts behind slot leases (run atomically inside Redis).

Every script touches only the four keys of one pool, all passed in KEYS in this order:

  1 pool    HASH  total:<type>  slots this pool has
                  used:<type>   slots held by leases (never below 0)
                  token         the fencing-token counter (monotonic)
                  lease:<id>    "needs|token|started ms|ttl ms|adopted|worker|host|task name"
                  wait:<id>     "needs|since ms|exp ms|worker|task name": a refused request (starvation guard)
                  waiters       present while waitq/waitx may hold entries (so acquire needs no call to know)
                  (needs = "cpu=4,gpu=1"; the task name comes last and may contain anything)
  2 leases  ZSET  lease id -> expiry (ms, Redis TIME)
  3 waitq   ZSET  waiting id -> since (ms): first refusal; only entries older than the guard are read
  4 waitx   ZSET  waiting id -> exp (ms): a waiter that does not come back before exp is forgotten

Expiry is decided by Redis ``TIME`` only. Expired leases are reaped (``ZRANGEBYSCORE leases -inf now``: the work is
O(expired), no scan) before acquire, renew, adopt, set_totals and reap do their work, so ``used`` equals the sum of
the leases in the pool hash after every call. With a hash tag in the key names (``resource:{pool}:...``) all four
keys live in one Redis Cluster slot.

The hot paths cost Redis' single thread about 2 µs per ``redis.call`` (see bench/bench_slots.py), so they make as
few as they can: acquire = TIME, ZRANGEBYSCORE (reap), HMGET (lease, waiters flag, token, totals and used of the
requested types, in one call), HSET (used, token, lease record), ZADD; release = HMGET, HINCRBY (or HMGET + HSET for
several types), HDEL, ZREM. A granted acquire answers with the bare token (an integer reply, the cheapest to parse).
"""

from __future__ import annotations

_HEAD = """
local P, L, Q, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local call = redis.call
"""

_NOW = """
local function now_ms()
  local t = call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# give_back(list of needs strings): return their slots, clamped at 0 (the seed's counters may have been reset by hand)
# drop(ids): delete these leases (records, expiry entries) and give their recorded slots back
# reap(now): drop every lease whose expiry has passed, in batches (unpack has a stack limit)
_DROP = """
local function give_back(list)
  local typs, sum = {}, {}
  for _, ns in ipairs(list) do
    for typ, n in string.gmatch(ns, '([^,=]+)=(%d+)') do
      if not sum[typ] then
        typs[#typs + 1] = typ
        sum[typ] = 0
      end
      sum[typ] = sum[typ] + tonumber(n)
    end
  end
  if #typs == 1 then
    local f = 'used:' .. typs[1]
    if call('HINCRBY', P, f, -sum[typs[1]]) < 0 then call('HSET', P, f, 0) end
  elseif #typs > 1 then
    local fields, args = {}, {}
    for i, typ in ipairs(typs) do fields[i] = 'used:' .. typ end
    local cur = call('HMGET', P, unpack(fields))
    for i, typ in ipairs(typs) do
      local u = tonumber(cur[i] or 0) - sum[typ]
      if u < 0 then u = 0 end
      args[2 * i - 1] = fields[i]
      args[2 * i] = u
    end
    call('HSET', P, unpack(args))
  end
end

local function drop(ids)
  local fields, list = {}, {}
  for i, id in ipairs(ids) do fields[i] = 'lease:' .. id end
  local recs = call('HMGET', P, unpack(fields))
  for i = 1, #ids do
    if recs[i] then list[#list + 1] = string.match(recs[i], '^[^|]*') end
  end
  give_back(list)
  call('HDEL', P, unpack(fields))
  call('ZREM', L, unpack(ids))
end

local function reap(now)
  local count = 0
  repeat
    local ids = call('ZRANGEBYSCORE', L, '-inf', now, 'LIMIT', 0, 500)
    if #ids > 0 then drop(ids) end
    count = count + #ids
  until #ids < 500
  return count
end
"""

# unwait(id): forget a waiting request
_UNWAIT = """
local function unwait(id)
  if call('ZREM', X, id) == 1 then
    call('ZREM', Q, id)
    call('HDEL', P, 'wait:' .. id)
  end
end
"""

# register(...): store a lease outside acquire (adopt, or restore after Redis lost its data): no capacity check
_REGISTER = """
local function register(id, ns, ttl, token, now, tail)
  for typ, n in string.gmatch(ns, '([^,=]+)=(%d+)') do call('HINCRBY', P, 'used:' .. typ, n) end
  call('HSET', P, 'lease:' .. id, ns .. '|' .. token .. '|' .. now .. '|' .. ttl .. '|1|' .. tail)
  call('ZADD', L, now + ttl, id)
  unwait(id)
end
"""

# ARGV: id, needs, ttl ms, starvation ms, waiting ttl ms, "worker|host|name"
# -> token (granted) | {token, 'held'} | {0, blocking type} | {-1, type larger than its total}
ACQUIRE = _HEAD + _NOW + _DROP + _UNWAIT + """
local id, ns, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
reap(now)
local typs, need, fields = {}, {}, {'lease:' .. id, 'waiters', 'token'}
for typ, n in string.gmatch(ns, '([^,=]+)=(%d+)') do
  local k = #typs + 1
  typs[k], need[k] = typ, tonumber(n)
  fields[2 * k + 2], fields[2 * k + 3] = 'total:' .. typ, 'used:' .. typ
end
local r = call('HMGET', P, unpack(fields))
if r[1] then
  call('ZADD', L, now + ttl, id)
  return {tonumber(string.match(r[1], '^[^|]*|(%d+)')), 'held'}
end
local total, used = {}, {}
for k = 1, #typs do
  total[k], used[k] = tonumber(r[2 * k + 2] or 0), tonumber(r[2 * k + 3] or 0)
  if need[k] > total[k] then
    if r[2] then unwait(id) end
    return {-1, typs[k]}
  end
end
-- reservations: a request refused for longer than `starve` ms holds back what it needs, first come first served
local mine, reserved = nil, {}
if r[2] then
  local starve = tonumber(ARGV[4])
  repeat
    local gone = call('ZRANGEBYSCORE', X, '-inf', now, 'LIMIT', 0, 500)
    if #gone > 0 then
      local wf = {}
      for i, wid in ipairs(gone) do wf[i] = 'wait:' .. wid end
      call('HDEL', P, unpack(wf))
      call('ZREM', Q, unpack(gone))
      call('ZREM', X, unpack(gone))
    end
  until #gone < 500
  if call('ZCARD', X) == 0 then
    call('HDEL', P, 'waiters')
  else
    local s = call('ZSCORE', Q, id)
    if s then mine = tonumber(s) end
    local mine_granted = mine ~= nil and now - mine >= starve
    local granted = call('ZRANGEBYSCORE', Q, '-inf', now - starve)
    for i = 1, #granted, 500 do
      local ids, wf = {}, {}
      for j = i, math.min(i + 499, #granted) do
        if granted[j] ~= id then
          ids[#ids + 1] = granted[j]
          wf[#wf + 1] = 'wait:' .. granted[j]
        end
      end
      if #wf > 0 then
        local recs = call('HMGET', P, unpack(wf))
        for j, wid in ipairs(ids) do
          if recs[j] then
            local wns, since = string.match(recs[j], '^([^|]*)|(%d+)|')
            since = tonumber(since)
            if not mine_granted or since < mine or (since == mine and wid < id) then
              for typ, n in string.gmatch(wns, '([^,=]+)=(%d+)') do reserved[typ] = (reserved[typ] or 0) + n end
            end
          end
        end
      end
    end
  end
end
for k = 1, #typs do
  if used[k] + need[k] + (reserved[typs[k]] or 0) > total[k] then
    local exp = now + tonumber(ARGV[5])
    if not mine then call('ZADD', Q, now, id) end
    call('ZADD', X, exp, id)
    local w, name = string.match(ARGV[6], '^([^|]*)|[^|]*|(.*)$')
    call('HSET', P, 'wait:' .. id, ns .. '|' .. (mine or now) .. '|' .. exp .. '|' .. w .. '|' .. name, 'waiters', 1)
    return {0, typs[k]}
  end
end
local token = tonumber(r[3] or 0) + 1
local args = {'token', token, 'lease:' .. id, ns .. '|' .. token .. '|' .. now .. '|' .. ttl .. '|0|' .. ARGV[6]}
for k = 1, #typs do
  args[2 * k + 3], args[2 * k + 4] = fields[2 * k + 3], used[k] + need[k]
end
call('HSET', P, unpack(args))
call('ZADD', L, now + ttl, id)
if mine then unwait(id) end
return token
"""

# ARGV: id, token ('' = any) -> 1 released | 0 nothing held under that id and token (a waiting entry is dropped)
RELEASE = _HEAD + _DROP + _UNWAIT + """
local id, token = ARGV[1], ARGV[2]
local r = call('HMGET', P, 'lease:' .. id, 'waiters')
if r[1] then
  local ns, held = string.match(r[1], '^([^|]*)|(%d+)|')
  if token == '' or held == token then
    give_back({ns})
    call('HDEL', P, 'lease:' .. id)
    call('ZREM', L, id)
    return 1
  end
end
if r[2] then unwait(id) end
return 0
"""

# ARGV: id, token, ttl ms, needs, "worker|host|name"
# -> {1, token} renewed | {2, token} registered again after Redis lost its data | {0, 0} expired and reaped
#    | {-1, other token} the id is now held under another token
RENEW = _HEAD + _NOW + _DROP + _UNWAIT + _REGISTER + """
local id, token, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local raw = call('HGET', P, 'lease:' .. id)
if raw then
  local held = tonumber(string.match(raw, '^[^|]*|(%d+)|'))
  if held ~= token then
    reap(now)
    return {-1, held}
  end
  local exp = tonumber(call('ZSCORE', L, id) or 0)
  if exp > now then
    call('ZADD', L, now + ttl, id)
    reap(now)
    return {1, token}
  end
end
reap(now)
if tonumber(call('HGET', P, 'token') or 0) < token then
  -- the counter went backwards: Redis lost its data (restart without persistence, FLUSHALL); the holder is alive
  call('HSET', P, 'token', token)
  register(id, ARGV[4], ttl, token, now, ARGV[5])
  return {2, token}
end
return {0, 0}
"""

# Register a holding that ran ungated while Redis was unreachable (fail-open), even beyond the total.
# ARGV: id, needs, ttl ms, "worker|host|name" -> {token, 1 new | 0 already held}
ADOPT = _HEAD + _NOW + _DROP + _UNWAIT + _REGISTER + """
local id, ttl = ARGV[1], tonumber(ARGV[3])
local now = now_ms()
reap(now)
local raw = call('HGET', P, 'lease:' .. id)
if raw then return {tonumber(string.match(raw, '^[^|]*|(%d+)|')), 0} end
local token = call('HINCRBY', P, 'token', 1)
register(id, ARGV[2], ttl, token, now, ARGV[4])
return {token, 1}
"""

# ARGV: mode 'set'|'nx', worker ('' = none), type, total, type, total, ...
# Writes totals without touching live leases; reaps expired leases and the leases of `worker`
# (a worker that starts under a node name owns no lease yet: leases under that name are from a dead incarnation).
# -> number of leases reaped
SET_TOTALS = _HEAD + _NOW + _DROP + """
local mode, worker = ARGV[1], ARGV[2]
for i = 3, #ARGV, 2 do
  if mode == 'nx' then call('HSETNX', P, 'total:' .. ARGV[i], ARGV[i + 1])
  else call('HSET', P, 'total:' .. ARGV[i], ARGV[i + 1]) end
end
local count = reap(now_ms())
if worker ~= '' then
  local all, ids = call('HGETALL', P), {}
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 6) == 'lease:' then
      local w = string.match(all[i + 1], '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)|')
      if w == worker then ids[#ids + 1] = string.sub(all[i], 7) end
    end
  end
  for i = 1, #ids, 500 do
    drop({unpack(ids, i, math.min(i + 499, #ids))})
  end
  count = count + #ids
end
return count
"""

# -> number of expired leases reaped
REAP = _HEAD + _NOW + _DROP + """
return reap(now_ms())
"""

# Read-only: everything a snapshot needs in one round trip (a script, so it also works on Redis Cluster, where
# redis-py refuses TIME in a pipeline). -> {TIME, HGETALL pool, ZRANGE leases WITHSCORES}
SNAPSHOT = _HEAD + """
return {call('TIME'), call('HGETALL', P), call('ZRANGE', L, 0, -1, 'WITHSCORES')}
"""

ALL = {"acquire": ACQUIRE, "renew": RENEW, "adopt": ADOPT, "release": RELEASE, "set_totals": SET_TOTALS,
       "reap": REAP, "snapshot": SNAPSHOT}
