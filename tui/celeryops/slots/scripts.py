"""The Lua scripts behind slot leases (run atomically inside Redis).

Every script touches only the six keys of one pool, passed in KEYS in this order (release, which never touches
the last two, gets the first four):

  1 pool    HASH  total:<type>  slots this pool has: hostinfo's fixed:<type> if set, else the sum of the live
                                hosts' contributions (counted by the scripts that change them; acquire reads it)
                  used:<type>   slots held by leases (never below 0)
                  token         the fencing-token counter (monotonic)
                  lease:<id>    "needs|token|started ms|ttl ms|adopted|worker|host|task name"
                  wait:<id>     "needs|since ms|exp ms|worker|task name": a refused request (starvation guard)
                  waiters       present while waitq/waitx may hold entries
                  next_expiry   no lease and no contribution expires before this (ms): at or below the lowest
                                score in leases and in hosts
                  (needs = "cpu=4,gpu=1"; the task name comes last and may contain anything)
  2 leases  ZSET  lease id -> expiry (ms, Redis TIME)
  3 waitq   ZSET  waiting id -> since (ms): first refusal; only entries older than the guard are read
  4 waitx   ZSET  waiting id -> exp (ms): a waiter that does not come back before exp is forgotten
  5 hosts   ZSET  "<host>|<worker>" -> expiry (ms, Redis TIME) of that worker's contribution
  6 hostinfo HASH fixed:<type>  an explicit total (set_totals): wins over the hosts' sum
                  ctypes        the types the contributions gave a total at the last count ("cpu,gpu")
                  host:<host>|<worker>  "needs|since ms|ttl ms": one worker's contribution of its host's slots
                  (kept out of the pool hash: a small hash is a listpack, every field there slows the hot path's
                  HMGET/HSET/HINCRBY down)

A global pool's capacity adds up: each worker contributes its host's totals under "<host>|<worker>" with a TTL and
renews it from its heartbeat. Workers that share a host name count once (the largest of their numbers per type); the
pool's total of a type is the sum over hosts. A contribution that is not renewed before its expiry (the worker was
killed, or lost Redis) is reaped like a lease and the totals are counted again. A smaller total never touches live
leases: ``used`` may exceed ``total`` until they end, and acquires are refused meanwhile.

Expiry is decided by Redis ``TIME`` only. Expired leases and contributions are reaped (``ZRANGEBYSCORE leases -inf
now``, O(expired), no scan) before acquire, renew, adopt, set_totals, contribute and reap do their work, so ``used``
equals the sum of the lease records after every call. Acquire runs that reap only once ``now`` has reached
``next_expiry``: before then no lease can have expired. Every script that adds an expiry keeps ``next_expiry`` at or
below it; a missing field means "reap now" (a pool written before the field existed, or Redis lost the hash). With a
hash tag in the key names (``resource:{pool}:...``) all six keys live in one Redis Cluster slot.

The hot paths are what bench/bench_slots.py measures. A ``redis.call`` costs Redis' single thread about 2 µs on top
of its command and every number Lua turns into a string about 0.7 µs (bench/README.md), so they do only this:
acquire = TIME, HMGET (lease, waiters flag, token, next_expiry, total and used of each requested type), HSET (used,
token, lease record), ZADD; release = HMGET, HINCRBY (HMGET + HSET for several types), HDEL, ZREM. The rarer paths'
helpers are built by ``lib()`` only when one of them runs. A granted acquire answers with the bare token (an integer
reply, the cheapest for the client to parse). Host contributions add nothing to these paths: ``total:<type>`` is
counted when contributions change (contribute, reap), and their expiries are folded into ``next_expiry``, so acquire
reaps (and counts again) only when a lease or a contribution may really have expired.
"""

from __future__ import annotations

_HEAD = """
local P, L, Q, X, C, I = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local call = redis.call
"""

# give_back(list of needs strings): return their slots, clamped at 0 (the seed's counters may have been reset by hand)
_GIVE_BACK = """
local function give_back(list)
  local typs, sum = {}, {}
  for _, ns in ipairs(list) do
    for typ, n in string.gmatch(ns, '([^,=]+)=(%d+)') do
      if not sum[typ] then
        typs[#typs + 1] = typ
        sum[typ] = 0
      end
      sum[typ] = sum[typ] + n
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
      local u = (cur[i] or 0) - sum[typ]
      if u < 0 then u = 0 end
      args[2 * i - 1], args[2 * i] = fields[i], u
    end
    call('HSET', P, unpack(args))
  end
end
"""

# lib(): helpers of the rarer paths (a table of closures, built only when needed)
#   now_ms()                 Redis TIME in ms
#   drop(ids)                delete these leases (records, expiry entries), giving their recorded slots back
#   reap(now)                drop every lease and every contribution whose expiry has passed (in batches: unpack
#                            has a stack limit), count the totals again if a contribution went, and set next_expiry
#                            to the lowest expiry left
#   recount(extra)           total:<type> = fixed:<type> or the sum over hosts of their largest contribution, for
#                            every contributed type, every type of the last count and the types in `extra`
#   drop_worker(worker)      drop the leases of a worker node name (a worker starting under it holds none yet)
#   expires_at(exp)          after a ZADD to leases outside acquire: keep next_expiry at or below exp
#   unwait(id)               forget a waiting request
#   register(id, needs, ttl, token, now, "worker|host|name")
#                            store a lease without a capacity check (adopt; restore after Redis lost its data)
_LIB = """
local function lib()
  local M = {}
  function M.now_ms()
    local t = call('TIME')
    return t[1] * 1000 + math.floor(t[2] / 1000)
  end
  function M.drop(ids)
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
  function M.recount(extra)
    local members = call('ZRANGE', C, 0, -1)
    local best, sum, typs = {}, {}, {}
    for i = 1, #members, 500 do
      local fields, chunk = {}, {}
      for j = i, math.min(i + 499, #members) do
        chunk[#chunk + 1] = members[j]
        fields[#fields + 1] = 'host:' .. members[j]
      end
      local recs = call('HMGET', I, unpack(fields))
      for j, m in ipairs(chunk) do
        if recs[j] then
          local host = string.match(m, '^([^|]*)')
          local b = best[host]
          if not b then b = {}; best[host] = b end
          for typ, n in string.gmatch(string.match(recs[j], '^[^|]*'), '([^,=]+)=(%d+)') do
            n = tonumber(n)
            if not b[typ] or n > b[typ] then b[typ] = n end
          end
        end
      end
    end
    for _, b in pairs(best) do
      for typ, n in pairs(b) do
        if not sum[typ] then typs[#typs + 1] = typ; sum[typ] = 0 end
        sum[typ] = sum[typ] + n
      end
    end
    table.sort(typs)
    local all, seen = {}, {}
    local function add(typ) if typ ~= '' and not seen[typ] then seen[typ] = true; all[#all + 1] = typ end end
    for _, typ in ipairs(typs) do add(typ) end
    for typ in string.gmatch(call('HGET', I, 'ctypes') or '', '[^,]+') do add(typ) end
    for _, typ in ipairs(extra or {}) do add(typ) end
    call('HSET', I, 'ctypes', table.concat(typs, ','))
    if #all > 0 then
      local ff, args = {}, {}
      for i, typ in ipairs(all) do ff[i] = 'fixed:' .. typ end
      local fixed = call('HMGET', I, unpack(ff))
      for i, typ in ipairs(all) do
        args[2 * i - 1], args[2 * i] = 'total:' .. typ, fixed[i] or sum[typ] or 0
      end
      call('HSET', P, unpack(args))
    end
  end
  function M.reap(now)
    local count = 0
    repeat
      local ids = call('ZRANGEBYSCORE', L, '-inf', now, 'LIMIT', 0, 500)
      if #ids > 0 then M.drop(ids) end
      count = count + #ids
    until #ids < 500
    local gone = call('ZRANGEBYSCORE', C, '-inf', now)
    if #gone > 0 then
      for i = 1, #gone, 500 do
        local chunk, fields = {}, {}
        for j = i, math.min(i + 499, #gone) do
          chunk[#chunk + 1] = gone[j]
          fields[#fields + 1] = 'host:' .. gone[j]
        end
        call('HDEL', I, unpack(fields))
        call('ZREM', C, unpack(chunk))
      end
      M.recount()
    end
    local nxt = call('ZRANGE', L, 0, 0, 'WITHSCORES')[2] or 9e15
    local host1 = call('ZRANGE', C, 0, 0, 'WITHSCORES')[2]
    if host1 and tonumber(host1) < tonumber(nxt) then nxt = host1 end
    call('HSET', P, 'next_expiry', nxt)
    return count
  end
  function M.drop_worker(worker)
    local all, ids = call('HGETALL', P), {}
    for i = 1, #all, 2 do
      if string.sub(all[i], 1, 6) == 'lease:' then
        local w = string.match(all[i + 1], '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)|')
        if w == worker then ids[#ids + 1] = string.sub(all[i], 7) end
      end
    end
    for i = 1, #ids, 500 do
      M.drop({unpack(ids, i, math.min(i + 499, #ids))})
    end
    return #ids
  end
  function M.expires_at(exp)
    local nxt = call('HGET', P, 'next_expiry')
    if nxt and exp < tonumber(nxt) then call('HSET', P, 'next_expiry', exp) end
  end
  function M.unwait(id)
    if call('ZREM', X, id) == 1 then
      call('ZREM', Q, id)
      call('HDEL', P, 'wait:' .. id)
    end
  end
  function M.register(id, ns, ttl, token, now, tail)
    for typ, n in string.gmatch(ns, '([^,=]+)=(%d+)') do call('HINCRBY', P, 'used:' .. typ, n) end
    call('HSET', P, 'lease:' .. id, ns .. '|' .. token .. '|' .. now .. '|' .. ttl .. '|1|' .. tail)
    call('ZADD', L, now + ttl, id)
    M.expires_at(now + ttl)
    M.unwait(id)
  end
  return M
end
"""

# ARGV: id, needs, ttl ms, starvation ms, waiting ttl ms, "worker|host|name"
# -> token (granted) | {token, 'held'} | {0, blocking type} | {-1, type larger than its total}
ACQUIRE = _HEAD + _GIVE_BACK + _LIB + """
local id, ns, ttl = ARGV[1], ARGV[2], ARGV[3]
local t = call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local exp = now + ttl
local typs, need, fields = {}, {}, {'lease:' .. id, 'waiters', 'token', 'next_expiry'}
local typ, n = string.match(ns, '^([^,=]+)=(%d+)$')
if typ then
  typs[1], need[1], fields[5], fields[6] = typ, tonumber(n), 'total:' .. typ, 'used:' .. typ
else
  for typ, n in string.gmatch(ns, '([^,=]+)=(%d+)') do
    local k = #typs + 1
    typs[k], need[k] = typ, tonumber(n)
    fields[2 * k + 3], fields[2 * k + 4] = 'total:' .. typ, 'used:' .. typ
  end
end
local r = call('HMGET', P, unpack(fields))
local H
if now >= tonumber(r[4] or 0) then
  H = lib()
  H.reap(now)
  r = call('HMGET', P, unpack(fields))
end
local nxt = tonumber(r[4])
if r[1] then
  call('ZADD', L, exp, id)
  if exp < nxt then call('HSET', P, 'next_expiry', exp) end
  return {tonumber(string.match(r[1], '^[^|]*|(%d+)')), 'held'}
end
local total, used = {}, {}
for k = 1, #typs do
  total[k], used[k] = tonumber(r[2 * k + 3] or 0), tonumber(r[2 * k + 4] or 0)
  if need[k] > total[k] then
    if r[2] then (H or lib()).unwait(id) end
    return {-1, typs[k]}
  end
end
-- reservations: a request refused for longer than `starve` ms holds back what it needs, first come first served
local mine, reserved = nil, nil
if r[2] then
  reserved = {}
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
              for wt, wn in string.gmatch(wns, '([^,=]+)=(%d+)') do reserved[wt] = (reserved[wt] or 0) + wn end
            end
          end
        end
      end
    end
  end
end
for k = 1, #typs do
  if used[k] + need[k] + (reserved and reserved[typs[k]] or 0) > total[k] then
    local until_ = now + ARGV[5]
    if not mine then call('ZADD', Q, now, id) end
    call('ZADD', X, until_, id)
    local w, name = string.match(ARGV[6], '^([^|]*)|[^|]*|(.*)$')
    call('HSET', P, 'wait:' .. id, ns .. '|' .. (mine or now) .. '|' .. until_ .. '|' .. w .. '|' .. name,
         'waiters', 1)
    return {0, typs[k]}
  end
end
local token = (r[3] or 0) + 1
local tk = tostring(token)
local args = {'token', tk, fields[1], ns .. '|' .. tk .. '|' .. now .. '|' .. ttl .. '|0|' .. ARGV[6]}
for k = 1, #typs do
  args[2 * k + 3], args[2 * k + 4] = fields[2 * k + 4], used[k] + need[k]
end
if exp < nxt then
  args[#args + 1], args[#args + 2] = 'next_expiry', exp
end
call('HSET', P, unpack(args))
call('ZADD', L, exp, id)
if mine then (H or lib()).unwait(id) end
return token
"""

# ARGV: id, token ('' = any) -> 1 released | 0 nothing held under that id and token (a waiting entry is dropped)
RELEASE = _HEAD + _GIVE_BACK + _LIB + """
local id, token = ARGV[1], ARGV[2]
local lf = 'lease:' .. id
local r = call('HMGET', P, lf, 'waiters')
if r[1] then
  local typ, n, held = string.match(r[1], '^([^,=|]+)=(%d+)|(%d+)|')  -- one type: the common case
  local ns
  if not typ then ns, held = string.match(r[1], '^([^|]*)|(%d+)|') end
  if token == '' or held == token then
    if typ then
      local f = 'used:' .. typ
      if call('HINCRBY', P, f, '-' .. n) < 0 then call('HSET', P, f, 0) end
    else
      give_back({ns})
    end
    call('HDEL', P, lf)
    call('ZREM', L, id)
    return 1
  end
end
if r[2] then lib().unwait(id) end
return 0
"""

# ARGV: id, token, ttl ms, needs, "worker|host|name"
# -> {1, token} renewed | {2, token} registered again after Redis lost its data | {0, 0} expired and reaped
#    | {-1, other token} the id is now held under another token
RENEW = _HEAD + _GIVE_BACK + _LIB + """
local H = lib()
local id, token, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = H.now_ms()
local raw = call('HGET', P, 'lease:' .. id)
if raw then
  local held = tonumber(string.match(raw, '^[^|]*|(%d+)|'))
  if held ~= token then
    H.reap(now)
    return {-1, held}
  end
  local exp = tonumber(call('ZSCORE', L, id) or 0)
  if exp > now then
    call('ZADD', L, now + ttl, id)
    H.reap(now)
    return {1, token}
  end
end
H.reap(now)
if tonumber(call('HGET', P, 'token') or 0) < token then
  -- the counter went backwards: Redis lost its data (restart without persistence, FLUSHALL); the holder is alive
  call('HSET', P, 'token', token)
  H.register(id, ARGV[4], ttl, token, now, ARGV[5])
  return {2, token}
end
return {0, 0}
"""

# Register a holding that ran ungated while Redis was unreachable (fail-open), even beyond the total.
# ARGV: id, needs, ttl ms, "worker|host|name" -> {token, 1 new | 0 already held}
ADOPT = _HEAD + _GIVE_BACK + _LIB + """
local H = lib()
local id, ttl = ARGV[1], tonumber(ARGV[3])
local now = H.now_ms()
H.reap(now)
local raw = call('HGET', P, 'lease:' .. id)
if raw then return {tonumber(string.match(raw, '^[^|]*|(%d+)|')), 0} end
local token = call('HINCRBY', P, 'token', 1)
H.register(id, ARGV[2], ttl, token, now, ARGV[4])
return {token, 1}
"""

# ARGV: mode 'set'|'nx'|'del', worker ('' = none), type, total, type, total, ... ('del': type, '', type, '', ...)
# Writes explicit totals (fixed:<type>, which win over the hosts' sum; 'nx' only where the type has no total yet;
# 'del' forgets them, the type goes back to the hosts' sum) without touching live leases; reaps expired leases and
# the leases of `worker` (a worker that starts under a node name owns no lease yet: leases under that name are from
# a dead incarnation). -> number of leases reaped
SET_TOTALS = _HEAD + _GIVE_BACK + _LIB + """
local H = lib()
local mode, worker = ARGV[1], ARGV[2]
local typs = {}
for i = 3, #ARGV, 2 do
  local typ = ARGV[i]
  if mode == 'del' then
    call('HDEL', I, 'fixed:' .. typ)
    typs[#typs + 1] = typ
  elseif mode ~= 'nx' or call('HEXISTS', P, 'total:' .. typ) == 0 then
    call('HSET', I, 'fixed:' .. typ, ARGV[i + 1])
    call('HSET', P, 'total:' .. typ, ARGV[i + 1])
  end
end
if #typs > 0 then H.recount(typs) end
local count = H.reap(H.now_ms())
if worker ~= '' then count = count + H.drop_worker(worker) end
return count
"""

# A worker's contribution of its host's totals to a global pool.
# ARGV: mode 'start'|'beat'|'leave', "<host>|<worker>", needs, ttl ms
#   start: drop the leases of <worker> (see SET_TOTALS), then as beat
#   beat:  write the contribution (expiry now + ttl); the totals are counted again if it is new or changed, or if
#          the pool hash lost one of its totals (evicted, deleted by hand) while the contribution stayed
#   leave: forget the contribution now and count again
# -> {leases reaped, 1 new | 2 changed | 0 renewed (leave: 1 forgotten | 0 there was none)}
CONTRIBUTE = _HEAD + _GIVE_BACK + _LIB + """
local H = lib()
local mode, member, ns, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local now = H.now_ms()
local f = 'host:' .. member
local count = 0
if mode == 'leave' then
  local had = call('ZREM', C, member)
  call('HDEL', I, f)
  H.recount()
  H.reap(now)
  return {0, had}
end
local worker = string.match(member, '|(.*)$')
if mode == 'start' and worker ~= '' then count = H.drop_worker(worker) end
local old = call('HGET', I, f)
local status = 0
if not old then
  status = 1
  call('HSET', I, f, ns .. '|' .. now .. '|' .. ttl)
else
  local ons, since, ottl = string.match(old, '^([^|]*)|(%d+)|(%d+)$')
  if ons ~= ns then status = 2 end
  if ons ~= ns or tonumber(ottl) ~= ttl then call('HSET', I, f, ns .. '|' .. (since or now) .. '|' .. ttl) end
end
call('ZADD', C, now + ttl, member)
if status == 0 and ns ~= '' then
  local tf = {}
  for typ in string.gmatch(ns, '([^,=]+)=%d+') do tf[#tf + 1] = 'total:' .. typ end
  local have = call('HMGET', P, unpack(tf))
  for i = 1, #tf do
    if not have[i] then status = -1 end
  end
end
if status ~= 0 then H.recount() end
if status == -1 then status = 0 end
count = count + H.reap(now)
return {count, status}
"""

# -> number of expired leases reaped
REAP = _HEAD + _GIVE_BACK + _LIB + """
local H = lib()
return H.reap(H.now_ms())
"""

# Read-only: everything a snapshot needs in one round trip (a script, so it also works on Redis Cluster, where
# redis-py refuses TIME in a pipeline).
# -> {TIME, HGETALL pool, ZRANGE leases WITHSCORES, ZRANGE hosts WITHSCORES, HGETALL hostinfo}
SNAPSHOT = _HEAD + """
return {call('TIME'), call('HGETALL', P), call('ZRANGE', L, 0, -1, 'WITHSCORES'),
        call('ZRANGE', C, 0, -1, 'WITHSCORES'), call('HGETALL', I)}
"""

ALL = {"acquire": ACQUIRE, "renew": RENEW, "adopt": ADOPT, "release": RELEASE, "set_totals": SET_TOTALS,
       "contribute": CONTRIBUTE, "reap": REAP, "snapshot": SNAPSHOT}
