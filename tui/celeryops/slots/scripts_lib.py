"""The Lua shared by every slot script: the keys' local names, ``give_back`` and the rare paths' ``lib()``.

Each script in ``scripts_leases`` and ``scripts_totals`` is one of these preludes followed by its own body; Redis
runs it atomically (``EVALSHA``). ``HEAD`` names the six keys of a pool (the layout is in ``scripts.py``).
``give_back`` returns slots to ``used:<type>`` and is cheap enough for the hot paths. ``lib()`` builds the helpers
of the rarer paths (reaping, counting the totals again, registering a lease without a capacity check) as a table of
closures, so a hot path that does not need them pays only for defining the function, not for building them.
"""

from __future__ import annotations

HEAD = """
local P, L, Q, X, C, I = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local call = redis.call
"""

# give_back(list of needs strings): return their slots, clamped at 0 (the seed's counters may have been reset by hand)
GIVE_BACK = """
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
LIB = """
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

#: What every script but SNAPSHOT starts with: the keys, give_back and lib().
PRELUDE = HEAD + GIVE_BACK + LIB
