"""The Lua scripts of a lease's life: acquire, release, renew, adopt and reap (the key layout is in ``scripts.py``).

The hot paths are what bench/bench_slots.py measures. A ``redis.call`` costs Redis' single thread about 2 µs on top
of its command and every number Lua turns into a string about 0.7 µs (bench/README.md), so they do only this:
acquire = TIME, HMGET (lease, waiters flag, token, next_expiry, total, used and free devices of each requested
type), HSET (used, token, lease record; for a device-bound type the devices left free and the lease's devices),
ZADD; release = HMGET (record, waiters flag), HINCRBY (HMGET + HSET for several types, or for a lease holding
devices, whose counts and devices go back together), HDEL, ZREM. The rarer paths' helpers are built by ``lib()``
(``scripts_lib``) only when one of them runs. A granted acquire answers with the bare token (an integer reply, the
cheapest for the client to parse), or ``"token devices"`` (``"7 gpu=3"``, one bulk string) when it bound devices.

Devices: a type whose pool has ``free:<type>`` (a host pool whose workers listed their devices) is bound as well as
counted: a granted acquire takes its k devices from the front of that list in the same script, so no two live
leases ever hold one device; release, reap and a lost lease's expiry put them back at the end. A request the
counts would grant but that finds fewer free devices than it needs waits like a busy one. Host contributions add
nothing to these paths: ``total:<type>`` is counted when contributions change (contribute, reap), and their expiries
are folded into ``next_expiry``, so acquire reaps (and counts again) only when a lease or a contribution may really
have expired.

A request refused for longer than the starvation guard reserves what it needs (first come, first served), so a
large request is not starved by a stream of small ones.
"""

from __future__ import annotations

from celeryops.slots.scripts_lib import PRELUDE

# ARGV: id, needs, ttl ms, starvation ms, waiting ttl ms, "worker|host|name"
#       [, ticket of this copy ('' none), ticket to park under ('' do not park), message to wake it with,
#        ticket ttl ms, claim window ms]  (the handoff: see scripts.py)
# -> token (granted) | "token devices" (granted with devices: "7 gpu=2,3") | {token, 'held', devices}
#    | {token, 'claimed', devices} (a handed-off lease claimed by this copy)
#    | {0, blocking type} | {-1, type larger than its total} (remembered as waiting, never reserving)
#    | {-2, 'stale' | 'done' | 'running'} (another copy of this ticket ran or runs, or a newer one waits: drop it)
ACQUIRE = PRELUDE + """
local id, ns, ttl = ARGV[1], ARGV[2], ARGV[3]
local t = call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local exp = now + ttl
local ticket, flag = ARGV[7], '|0'
if ticket and ticket ~= '' then
  flag = '|3'
  local wk = WB .. 'w:' .. id
  local w = call('GET', wk)
  if w then
    local s, tn = string.match(w, '^(%a)|([^|]*)')
    if tn ~= ticket then return {-2, 'stale'} end
    if s == 'd' then return {-2, 'done'} end
    if s == 'x' then return {-2, 'stale'} end
    if s == 'g' or s == 'c' then
      local rec = call('HGET', P, 'lease:' .. id)
      local lns, tk, lf, ldv
      if rec then lns, tk, lf, ldv = string.match(rec, '^([^|]*)|(%d+)|[^|]*|[^|]*|(%d) ?([^|]*)|') end
      if s == 'c' and lf == '3' then return {-2, 'running'} end
      if s == 'g' and lf == '2' then  -- claim the lease a release handed to this ticket
        call('HSET', P, 'lease:' .. id, lns .. '|' .. tk .. '|' .. now .. '|' .. ttl .. '|3' ..
             (ldv ~= '' and ' ' .. ldv or '') .. '|' .. ARGV[6])
        call('ZADD', L, exp, id)
        call('SET', wk, 'c|' .. ticket, 'KEEPTTL')
        return {tonumber(tk), 'claimed', ldv}
      end
    end
  end
end
local typs, need, fields = {}, {}, {'lease:' .. id, 'waiters', 'token', 'next_expiry'}
local typ, n = string.match(ns, '^([^,=]+)=(%d+)$')
if typ then
  typs[1], need[1], fields[5], fields[6], fields[7] = typ, tonumber(n), 'total:' .. typ, 'used:' .. typ, 'free:' .. typ
else
  for typ, n in string.gmatch(ns, '([^,=]+)=(%d+)') do
    local k = #typs + 1
    typs[k], need[k] = typ, tonumber(n)
    fields[3 * k + 2], fields[3 * k + 3], fields[3 * k + 4] = 'total:' .. typ, 'used:' .. typ, 'free:' .. typ
  end
end
local r = call('HMGET', P, unpack(fields))
local H
if now >= tonumber(r[4] or 0) then
  H = lib()
  H.reap(now, false, id)
  r = call('HMGET', P, unpack(fields))
end
local nxt = tonumber(r[4])
if r[1] then
  call('ZADD', L, exp, id)
  if exp < nxt then call('HSET', P, 'next_expiry', exp) end
  local tok, dv = string.match(r[1], '^[^|]*|(%d+)|[^|]*|[^|]*|%d ?([^|]*)|')
  return {tonumber(tok), 'held', dv or ''}
end
local total, used = {}, {}
for k = 1, #typs do
  total[k], used[k] = tonumber(r[3 * k + 2] or 0), tonumber(r[3 * k + 3] or 0)
  if need[k] > total[k] then
    (H or lib()).impossible(id, ns, now, ARGV[5], ARGV[6])
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
-- take(list, n): the first n ids of a comma list and the rest; nil when it holds fewer
local function take(s, n)
  local got, pos = {}, 1
  for i = 1, n do
    if pos > #s then return nil end
    local a = string.find(s, ',', pos, true)
    got[i] = string.sub(s, pos, (a or #s + 1) - 1)
    pos = (a or #s) + 1
  end
  return got, string.sub(s, pos)
end
local ld, fargs
for k = 1, #typs do
  local ok = used[k] + need[k] + (reserved and reserved[typs[k]] or 0) <= total[k]
  local free = r[3 * k + 4]
  if ok and free then
    local got, rest
    if need[k] == 1 then  -- the usual: one device, no table
      if free ~= '' then
        local a = string.find(free, ',', 1, true)
        if a then got, rest = string.sub(free, 1, a - 1), string.sub(free, a + 1) else got, rest = free, '' end
      end
    else
      local list
      list, rest = take(free, need[k])
      if list then got = table.concat(list, ',') end
    end
    if got then
      ld = (ld and ld .. ';' or '') .. typs[k] .. '=' .. got
      fargs = fargs or {}
      fargs[#fargs + 1], fargs[#fargs + 2] = fields[3 * k + 4], rest
    else
      ok = false
    end
  end
  if not ok then
    local until_ = now + ARGV[5]
    if not mine then call('ZADD', Q, now, id) end
    call('ZADD', X, until_, id)
    local w, name = string.match(ARGV[6], '^([^|]*)|[^|]*|(.*)$')
    call('HSET', P, 'wait:' .. id, ns .. '|' .. (mine or now) .. '|' .. until_ .. '|' .. w .. '|' .. name,
         'waiters', 1)
    if ARGV[8] and ARGV[8] ~= '' then  -- park: a release that frees what it needs hands it the slots
      call('SET', WB .. 'w:' .. id, 'p|' .. ARGV[8] .. '|' .. ARGV[4] .. '|' .. ARGV[11] .. '|' .. ARGV[9],
           'PX', ARGV[10])
    end
    return {0, typs[k]}
  end
end
local token = (r[3] or 0) + 1
local tk = tostring(token)
local adopted = ld and flag .. ' ' .. ld .. '|' or flag .. '|'  -- devices follow the flag: "0 gpu=3"
if flag == '|3' then call('SET', WB .. 'w:' .. id, 'c|' .. ticket, 'PX', ARGV[10]) end
local args = {'token', tk, fields[1], ns .. '|' .. tk .. '|' .. now .. '|' .. ttl .. adopted .. ARGV[6]}
for k = 1, #typs do
  args[2 * k + 3], args[2 * k + 4] = fields[3 * k + 3], used[k] + need[k]
end
if exp < nxt then
  args[#args + 1], args[#args + 2] = 'next_expiry', exp
end
if ld then
  for i = 1, #fargs do args[#args + 1] = fargs[i] end
end
call('HSET', P, unpack(args))
call('ZADD', L, exp, id)
if mine then (H or lib()).unwait(id) end
if ld then return tk .. ' ' .. ld end
return token
"""

# ARGV: id, token ('' = any)[, '1': given back before it ran (the ticket is forgotten, not marked done)]
# -> 1 released (the slots go to parked requests that now fit: handoff) | 0 nothing held under that id and token
#    (a waiting entry is dropped)
RELEASE = PRELUDE + """
local id, token = ARGV[1], ARGV[2]
local r = call('HMGET', P, 'lease:' .. id, 'waiters')
if r[1] then
  -- one type and no devices (the common case), else the needs and the devices from the record
  local typ, n, held, lf, dv = string.match(r[1], '^([^,=|]+)=(%d+)|(%d+)|%d+|%d+|(%d) ?([^|]*)|')
  local ns
  if not typ then ns, held, lf, dv = string.match(r[1], '^([^|]*)|(%d+)|%d+|%d+|(%d) ?([^|]*)|') end
  if not typ and not ns then ns, held, dv = string.match(r[1], '^([^|]*)|(%d+)|'), '' end
  if token == '' or held == token then
    local dt, ids
    if typ and dv ~= '' then dt, ids = string.match(dv, '^([^;=]+)=([^;]*)$') end
    if typ and dv == '' then
      local f = 'used:' .. typ
      if call('HINCRBY', P, f, '-' .. n) < 0 then call('HSET', P, f, 0) end
    elseif dt then  -- one type counted, one bound (gpu=1 holding gpu 3): one more read, no tables
      local uf, ff = 'used:' .. typ, 'free:' .. dt
      local c = call('HMGET', P, uf, ff, 'devs:' .. dt)
      local u, free, devs = c[1], c[2], c[3]
      u = (u or 0) - n
      if u < 0 then u = 0 end
      if devs then
        free = free or ''
        local member = ',' .. devs .. ','
        local function back(d)
          local k = ',' .. d .. ','
          if string.find(member, k, 1, true) and not string.find(',' .. free .. ',', k, 1, true) then
            if free == '' then free = d else free = free .. ',' .. d end
          end
        end
        if string.find(ids, ',', 1, true) then
          for d in string.gmatch(ids, '[^,]+') do back(d) end
        else
          back(ids)
        end
        call('HSET', P, uf, u, ff, free)
      else
        call('HSET', P, uf, u)
      end
    else
      give_back({ns or (typ .. '=' .. n)}, dv ~= '' and {dv} or nil)
    end
    call('HDEL', P, 'lease:' .. id)
    call('ZREM', L, id)
    if lf == '3' then  -- a ticketed run is done: a late copy of its ticket is dropped
      local wk = WB .. 'w:' .. id
      local w = call('GET', wk)
      if ARGV[3] == '1' then
        call('DEL', wk)
      elseif w then
        call('SET', wk, 'd|' .. (string.match(w, '^%a|([^|]*)') or ''), 'KEEPTTL')
      end
    end
    if r[2] then
      local H = lib()
      H.handoff(H.now_ms())
    end
    return 1
  end
end
if r[2] then lib().unwait(id) end
return 0
"""

# ARGV: id, token, ttl ms, needs, "worker|host|name", devices the holder was given ("gpu=2,3" or '')
# -> {1, token} renewed | {2, token, devices bound again} registered again after Redis lost its data (only the
#    devices still free: one taken meanwhile stays with its new holder) | {0, 0} expired and reaped
#    | {-1, other token} the id is now held under another token
RENEW = PRELUDE + """
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
  return {2, token, H.register(id, ARGV[4], ttl, token, now, ARGV[5], ARGV[6])}
end
return {0, 0}
"""

# Register a holding that ran ungated while Redis was unreachable (fail-open), even beyond the total.
# ARGV: id, needs, ttl ms, "worker|host|name" -> {token, 1 new | 0 already held}
ADOPT = PRELUDE + """
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

# -> number of expired leases reaped
REAP = PRELUDE + """
local H = lib()
return H.reap(H.now_ms())
"""

# A copy of a parked task came to a worker of another pool (the fallback retry went to another host): take the
# task out of this pool unless a copy of its ticket runs or ran here. ARGV: id, ticket
# -> 'moved' (it no longer waits here; a lease handed to it and not claimed is given back and handed off again)
#    | 'gone' (no ticket: expired, or Redis lost it) | 'running' | 'done' | 'stale' (another ticket, or moved already)
UNPARK = PRELUDE + """
local id, ticket = ARGV[1], ARGV[2]
local wk = WB .. 'w:' .. id
local w = call('GET', wk)
if not w then return 'gone' end
local s, tn = string.match(w, '^(%a)|([^|]*)')
if tn ~= ticket or s == 'x' then return 'stale' end
if s == 'd' then return 'done' end
local H = lib()
local rec = call('HGET', P, 'lease:' .. id)
local lf = rec and string.match(rec, '^[^|]*|[^|]*|[^|]*|[^|]*|(%d)')
if s == 'c' and lf == '3' then return 'running' end
H.unwait(id)
if s == 'g' and lf == '2' then
  H.drop({id})
  H.handoff(H.now_ms(), id)
end
call('SET', wk, 'x|' .. ticket, 'KEEPTTL')
return 'moved'
"""

# The waker's timer: reap (and hand off) only once a lease or a contribution may have expired.
# -> {leases reaped, ms until the next possible expiry, 1 if requests are waiting}
TICK = PRELUDE + """
local t = call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local r = call('HMGET', P, 'next_expiry', 'waiters')
local n, nxt = 0, tonumber(r[1] or 0)
if now >= nxt then
  n = lib().reap(now)
  nxt = tonumber(call('HGET', P, 'next_expiry'))
  r[2] = call('HGET', P, 'waiters')
end
return {n, nxt - now, r[2] and 1 or 0}
"""
