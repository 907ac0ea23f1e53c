"""The Lua scripts behind slot leases (run atomically inside Redis).

Every script touches only the eight keys of one pool, all passed in KEYS in this order:

  1 total    HASH  type -> slots this pool has
  2 used     HASH  type -> slots held by leases (never below 0)
  3 leases   ZSET  lease id -> expiry (ms, Redis TIME)
  4 lease    HASH  lease id -> "needs|token|started ms|ttl ms|adopted|worker|host|task name"
                   (needs = "cpu=4,gpu=1"; the name comes last and may contain anything)
  5 token    STRING the fencing-token counter (INCR, monotonic)
  6 waiting  HASH  lease id -> JSON {id, ns (needs), since, exp, name, w}: refused requests (starvation guard)
  7 waitq    ZSET  lease id -> since (ms): first refusal; only entries older than the guard are read
  8 waitx    ZSET  lease id -> exp (ms): a waiter that does not come back before exp is forgotten

Expiry is decided by Redis ``TIME`` only. Expired leases are reaped before acquire, renew, adopt, set_totals and
reap do their work, so ``used`` equals the sum of the leases in ``lease`` after every call. With a hash tag in the
key names (``resource:{pool}:...``) all eight keys live in one Redis Cluster slot.

The hot paths (acquire, release) avoid cjson and define only the helpers they use: both cost measurable time in
Redis' single thread (see bench/bench_slots.py).
"""

from __future__ import annotations

_KEYS = """
local K_TOTAL, K_USED, K_LEASES, K_LEASE, K_TOKEN = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_WAIT, K_WAITQ, K_WAITX = KEYS[6], KEYS[7], KEYS[8]
"""

_NOW = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# drop(id[, needs string]): return the lease's slots (as recorded) and delete it; reap(now): drop expired leases
_DROP = """
local function give_back(ns)
  local typs, counts, args = {}, {}, {}
  for typ, n in string.gmatch(ns, '([^,=]+)=(%d+)') do
    typs[#typs + 1] = typ
    counts[#counts + 1] = tonumber(n)
  end
  if #typs == 0 then return end
  local cur = redis.call('HMGET', K_USED, unpack(typs))
  for i, typ in ipairs(typs) do
    local u = tonumber(cur[i] or '0') - counts[i]
    if u < 0 then u = 0 end
    args[#args + 1] = typ
    args[#args + 1] = u
  end
  redis.call('HSET', K_USED, unpack(args))
end

local function drop(id, ns)
  if ns == nil then
    local raw = redis.call('HGET', K_LEASE, id)
    if raw then ns = string.match(raw, '^([^|]*)|') end
  end
  if ns then
    give_back(ns)
    redis.call('HDEL', K_LEASE, id)
  end
  redis.call('ZREM', K_LEASES, id)
end

local function reap(now)
  local ids = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', now)
  for _, id in ipairs(ids) do drop(id) end
  return #ids
end
"""

_UNWAIT = """
local function unwait(id)
  if not redis.call('ZSCORE', K_WAITX, id) then return end
  redis.call('HDEL', K_WAIT, id)
  redis.call('ZREM', K_WAITQ, id)
  redis.call('ZREM', K_WAITX, id)
end
"""

# register(...): store the lease; new_used = {type, value, ...} when the caller computed it, else HINCRBY per type
_REGISTER = """
local function register(id, ns, ttl, token, now, adopted, worker, host, name, waited, new_used)
  if new_used then
    if #new_used > 0 then redis.call('HSET', K_USED, unpack(new_used)) end
  else
    for typ, n in string.gmatch(ns, '([^,=]+)=(%d+)') do redis.call('HINCRBY', K_USED, typ, n) end
  end
  redis.call('HSET', K_LEASE, id, table.concat({ns, token, now, ttl, adopted, worker, host, name}, '|'))
  redis.call('ZADD', K_LEASES, now + ttl, id)
  if waited ~= false then unwait(id) end
end
"""

# ARGV: id, needs, ttl ms, starvation ms, waiting ttl ms, worker, host, name
# -> {1, token, 'ok'|'held'} | {0, 0, blocking type} | {-1, 0, type larger than its total}
ACQUIRE = _KEYS + _NOW + _DROP + _UNWAIT + _REGISTER + """
local id, ns, ttl, starve, wait_ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
reap(now)
local existing = redis.call('HGET', K_LEASE, id)
if existing then
  redis.call('ZADD', K_LEASES, now + ttl, id)
  return {1, tonumber(string.match(existing, '^[^|]*|([^|]*)|')), 'held'}
end
local typs, need, total, used = {}, {}, {}, {}
for typ, n in string.gmatch(ns, '([^,=]+)=(%d+)') do
  typs[#typs + 1] = typ
  need[typ] = tonumber(n)
end
if #typs > 0 then
  local t, u = redis.call('HMGET', K_TOTAL, unpack(typs)), redis.call('HMGET', K_USED, unpack(typs))
  for i, typ in ipairs(typs) do
    total[typ], used[typ] = tonumber(t[i] or '0'), tonumber(u[i] or '0')
    if need[typ] > total[typ] then
      unwait(id)
      return {-1, 0, typ}
    end
  end
end
-- reservations: a request refused for longer than `starve` ms holds back what it needs, first come first served
local mine_since, reserved, granted = -1, {}, {}
if redis.call('ZCARD', K_WAITX) > 0 then
  for _, wid in ipairs(redis.call('ZRANGEBYSCORE', K_WAITX, '-inf', now)) do
    redis.call('HDEL', K_WAIT, wid)
    redis.call('ZREM', K_WAITQ, wid)
    redis.call('ZREM', K_WAITX, wid)
  end
  mine_since = tonumber(redis.call('ZSCORE', K_WAITQ, id) or '-1')
  granted = redis.call('ZRANGEBYSCORE', K_WAITQ, '-inf', now - starve)
end
local mine_granted = mine_since >= 0 and now - mine_since >= starve
for _, wid in ipairs(granted) do
  if wid ~= id then
    local raw = redis.call('HGET', K_WAIT, wid)
    if raw then
      local w = cjson.decode(raw)
      if not mine_granted or w.since < mine_since or (w.since == mine_since and wid < id) then
        for typ, n in string.gmatch(w.ns, '([^,=]+)=(%d+)') do reserved[typ] = (reserved[typ] or 0) + tonumber(n) end
      end
    end
  end
end
for _, typ in ipairs(typs) do
  if used[typ] + need[typ] + (reserved[typ] or 0) > total[typ] then
    local since = now
    if mine_since >= 0 then since = mine_since else redis.call('ZADD', K_WAITQ, now, id) end
    redis.call('ZADD', K_WAITX, now + wait_ttl, id)
    redis.call('HSET', K_WAIT, id, cjson.encode({id = id, ns = ns, since = since, exp = now + wait_ttl,
                                                 w = ARGV[6], name = ARGV[8]}))
    return {0, 0, typ}
  end
end
local new_used = {}
for _, typ in ipairs(typs) do
  new_used[#new_used + 1] = typ
  new_used[#new_used + 1] = used[typ] + need[typ]
end
local token = redis.call('INCR', K_TOKEN)
register(id, ns, ttl, token, now, 0, ARGV[6], ARGV[7], ARGV[8], mine_since >= 0, new_used)
return {1, token, 'ok'}
"""

# ARGV: id, token, ttl ms, needs, worker, host, name
# -> {1, token} renewed | {2, token} registered again after Redis lost its data | {0, 0} expired and reaped
#    | {-1, other token} the id is now held under another token
RENEW = _KEYS + _NOW + _DROP + _UNWAIT + _REGISTER + """
local id, token, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local raw = redis.call('HGET', K_LEASE, id)
if raw then
  local held = tonumber(string.match(raw, '^[^|]*|([^|]*)|'))
  if held ~= token then
    reap(now)
    return {-1, held}
  end
  local exp = tonumber(redis.call('ZSCORE', K_LEASES, id) or '0')
  if exp > now then
    redis.call('ZADD', K_LEASES, now + ttl, id)
    reap(now)
    return {1, token}
  end
end
reap(now)
local counter = tonumber(redis.call('GET', K_TOKEN) or '0')
if counter < token then
  -- the counter went backwards: Redis lost its data (restart without persistence, FLUSHALL); the holder is alive
  redis.call('SET', K_TOKEN, token)
  register(id, ARGV[4], ttl, token, now, 1, ARGV[5], ARGV[6], ARGV[7], nil, nil)
  return {2, token}
end
return {0, 0}
"""

# Register a holding that ran ungated while Redis was unreachable (fail-open), even beyond the total.
# ARGV: id, needs, ttl ms, worker, host, name -> {token, 1 new | 0 already held}
ADOPT = _KEYS + _NOW + _DROP + _UNWAIT + _REGISTER + """
local id, ttl = ARGV[1], tonumber(ARGV[3])
local now = now_ms()
reap(now)
local raw = redis.call('HGET', K_LEASE, id)
if raw then return {tonumber(string.match(raw, '^[^|]*|([^|]*)|')), 0} end
local token = redis.call('INCR', K_TOKEN)
register(id, ARGV[2], ttl, token, now, 1, ARGV[4], ARGV[5], ARGV[6], nil, nil)
return {token, 1}
"""

# ARGV: id, token ('' = any) -> 1 released | 0 nothing held under that id and token (a waiting entry is dropped)
RELEASE = _KEYS + _DROP + _UNWAIT + """
local id, token = ARGV[1], ARGV[2]
local raw = redis.call('HGET', K_LEASE, id)
if raw then
  local ns, held = string.match(raw, '^([^|]*)|([^|]*)|')
  if token == '' or tonumber(held) == tonumber(token) then
    drop(id, ns)
    return 1
  end
end
unwait(id)
return 0
"""

# ARGV: mode 'set'|'nx', worker ('' = none), type, total, type, total, ...
# Writes totals without touching live leases; reaps expired leases and the leases of `worker`
# (a worker that starts under a node name owns no lease yet: leases under that name are from a dead incarnation).
# -> number of leases reaped
SET_TOTALS = _KEYS + _NOW + _DROP + """
local mode, worker = ARGV[1], ARGV[2]
for i = 3, #ARGV, 2 do
  if mode == 'nx' then redis.call('HSETNX', K_TOTAL, ARGV[i], ARGV[i + 1])
  else redis.call('HSET', K_TOTAL, ARGV[i], ARGV[i + 1]) end
end
local count = reap(now_ms())
if worker ~= '' then
  local all = redis.call('HGETALL', K_LEASE)
  for i = 1, #all, 2 do
    local ns, w = string.match(all[i + 1], '^([^|]*)|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)|')
    if w == worker then
      drop(all[i], ns)
      count = count + 1
    end
  end
end
return count
"""

# -> number of expired leases reaped
REAP = _KEYS + _NOW + _DROP + """
return reap(now_ms())
"""

# Read-only: everything a snapshot needs in one round trip (a script, so it also works on Redis Cluster, where
# redis-py refuses TIME in a pipeline). -> {TIME, HGETALL total, HGETALL used, HGETALL lease,
#    ZRANGE leases WITHSCORES, HGETALL waiting}
SNAPSHOT = _KEYS + """
return {redis.call('TIME'), redis.call('HGETALL', K_TOTAL), redis.call('HGETALL', K_USED),
        redis.call('HGETALL', K_LEASE), redis.call('ZRANGE', K_LEASES, 0, -1, 'WITHSCORES'),
        redis.call('HGETALL', K_WAIT)}
"""

ALL = {"acquire": ACQUIRE, "renew": RENEW, "adopt": ADOPT, "release": RELEASE, "set_totals": SET_TOTALS,
       "reap": REAP, "snapshot": SNAPSHOT}
