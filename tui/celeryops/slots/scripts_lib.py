"""The Lua shared by every slot script: the keys' local names, ``give_back`` and the rare paths' ``lib()``.

Each script in ``scripts_leases`` and ``scripts_totals`` is one of these preludes followed by its own body; Redis
runs it atomically (``EVALSHA``). ``HEAD`` names the six keys of a pool (the layout is in ``scripts.py``).
``give_back`` returns slots to ``used:<type>`` and a lease's devices to ``free:<type>``, cheaply enough for the hot
paths. ``lib()`` builds the helpers
of the rarer paths (reaping, counting the totals again, registering a lease without a capacity check) as a table of
closures, so a hot path that does not need them pays only for defining the function, not for building them.
"""

from __future__ import annotations

HEAD = """
local P, L, Q, X, C, I, WL = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local WB = string.sub(P, 1, -5)
local call = redis.call
"""

# give_back(list of needs strings, list of device lists ("gpu=2,3;npu=0") or nil): return their slots, clamped at 0
# (the seed's counters may have been reset by hand), and their devices to the end of free:<type> (the device freed
# longest ago is handed out first), those the host still lists (devs:<type>) and that are not free already. One type
# without devices is one HINCRBY; anything else one HMGET and one HSET.
GIVE_BACK = """
local function give_back(list, ldevs)
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
  local add, dtyps = {}, {}
  for _, ld in ipairs(ldevs or {}) do
    for typ, ids in string.gmatch(ld, '([^;=]+)=([^;]*)') do
      if not add[typ] then add[typ] = {}; dtyps[#dtyps + 1] = typ end
      for d in string.gmatch(ids, '[^,]+') do add[typ][#add[typ] + 1] = d end
    end
  end
  if #typs == 1 and #dtyps == 0 then
    local f = 'used:' .. typs[1]
    if call('HINCRBY', P, f, -sum[typs[1]]) < 0 then call('HSET', P, f, 0) end
    return
  end
  if #typs == 0 and #dtyps == 0 then return end
  local fields, nt = {}, #typs
  for i, typ in ipairs(typs) do fields[i] = 'used:' .. typ end
  for j, typ in ipairs(dtyps) do fields[nt + 2 * j - 1], fields[nt + 2 * j] = 'free:' .. typ, 'devs:' .. typ end
  local cur = call('HMGET', P, unpack(fields))
  local args = {}
  for i, typ in ipairs(typs) do
    local u = (cur[i] or 0) - sum[typ]
    if u < 0 then u = 0 end
    args[#args + 1], args[#args + 2] = fields[i], u
  end
  for j, typ in ipairs(dtyps) do
    local devs = cur[nt + 2 * j]
    if devs then
      local free = cur[nt + 2 * j - 1] or ''
      local member, have = ',' .. devs .. ',', ',' .. free .. ','
      for _, d in ipairs(add[typ]) do
        local k = ',' .. d .. ','
        if string.find(member, k, 1, true) and not string.find(have, k, 1, true) then
          if free == '' then free = d else free = free .. ',' .. d end
          have = have .. d .. ','
        end
      end
      args[#args + 1], args[#args + 2] = fields[nt + 2 * j - 1], free
    end
  end
  if #args > 0 then call('HSET', P, unpack(args)) end
end
"""

# lib(): helpers of the rarer paths (a table of closures, built only when needed)
#   now_ms()                 Redis TIME in ms
#   drop(ids)                delete these leases (records, expiry entries), giving their recorded slots and
#                            devices back
#   devices_of(record)       the devices a lease record holds ("gpu=2,3", '' for none)
#   reap(now, force, skip)   drop every lease and every contribution whose expiry has passed (in batches: unpack
#                            has a stack limit), count the totals again if a contribution went, and set next_expiry
#                            to the lowest expiry left; then, if a lease went (or `force`: capacity may have grown),
#                            hand the freed slots off to parked waiters (handoff, never to `skip`)
#   handoff(now, skip)       grant freed slots to the parked waiters that now fit, oldest first (the work-conserving
#                            handoff: the layout of w:<id> and the wake list is in scripts.py)
#   recount(extra)           total:<type> = fixed:<type> or the sum over hosts of their largest contribution, for
#                            every contributed type, every type of the last count and the types in `extra`; and
#                            devs:<type> = the devices the contributions list (free:<type> follows: the devices
#                            that came are free unless a lease holds them, those that went are no longer handed out)
#   drop_worker(worker)      drop the leases of a worker node name (a worker starting under it holds none yet)
#   expires_at(exp)          after a ZADD to leases outside acquire: keep next_expiry at or below exp
#   unwait(id)               forget a waiting request
#   impossible(id, needs, now, wait ttl, "worker|host|name")
#                            remember a request for more than a type's total as waiting (shown, never reserving)
#   register(id, needs, ttl, token, now, "worker|host|name", devices)
#                            store a lease without a capacity check (adopt; restore after Redis lost its data), binding
#                            those of `devices` ("gpu=2,3") that are free; returns the devices it bound
LIB = """
local function lib()
  local M = {}
  -- contributions first .. first + 499 of a list (unpack has a stack limit) and their two fields in I
  local function batch(members, first)
    local chunk, fields = {}, {}
    for j = first, math.min(first + 499, #members) do
      chunk[#chunk + 1] = members[j]
      fields[#fields + 1] = 'host:' .. members[j]
      fields[#fields + 1] = 'hdev:' .. members[j]
    end
    return chunk, fields
  end
  function M.now_ms()
    local t = call('TIME')
    return t[1] * 1000 + math.floor(t[2] / 1000)
  end
  function M.devices_of(rec)
    return string.match(rec, '^[^|]*|[^|]*|[^|]*|[^|]*|%d ?([^|]*)|') or ''
  end
  function M.drop(ids)
    local fields, list, lds = {}, {}, {}
    for i, id in ipairs(ids) do fields[i] = 'lease:' .. id end
    local recs = call('HMGET', P, unpack(fields))
    for i = 1, #ids do
      if recs[i] then
        list[#list + 1] = string.match(recs[i], '^[^|]*')
        local dv = M.devices_of(recs[i])
        if dv ~= '' then lds[#lds + 1] = dv end
      end
    end
    give_back(list, lds)
    call('HDEL', P, unpack(fields))
    call('ZREM', L, unpack(ids))
  end
  function M.recount(extra)
    local members = call('ZRANGE', C, 0, -1)
    local best, sum, typs = {}, {}, {}
    local dset, dlist, dtyps = {}, {}, {}
    for i = 1, #members, 500 do
      local chunk, fields = batch(members, i)
      local both = call('HMGET', I, unpack(fields))
      local recs = {}
      for j = 1, #chunk do
        recs[j] = both[2 * j - 1]
        for typ, ids in string.gmatch(both[2 * j] or '', '([^;=]+)=([^;]*)') do
          if not dset[typ] then dset[typ], dlist[typ] = {}, {}; dtyps[#dtyps + 1] = typ end
          for d in string.gmatch(ids, '[^,]+') do
            if not dset[typ][d] then dset[typ][d] = true; dlist[typ][#dlist[typ] + 1] = d end
          end
        end
      end
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
    M.devices(dtyps, dlist, dset)
  end
  -- devs:<type> and free:<type> from the contributions' device lists (ids: numbers in order, then names)
  function M.devices(dtyps, dlist, dset)
    local function order(a, b)
      local x, y = tonumber(a), tonumber(b)
      if x and y then return x < y end
      if x or y then return x ~= nil end
      return a < b
    end
    local held
    for _, typ in ipairs(dtyps) do
      table.sort(dlist[typ], order)
      local devs = table.concat(dlist[typ], ',')
      local cur = call('HMGET', P, 'devs:' .. typ, 'free:' .. typ)
      if cur[1] ~= devs or not cur[2] then
        if not held then
          held = {}
          local all = call('HGETALL', P)
          for i = 1, #all, 2 do
            if string.sub(all[i], 1, 6) == 'lease:' then
              for t2, ids in string.gmatch(M.devices_of(all[i + 1]), '([^;=]+)=([^;]*)') do
                for d in string.gmatch(ids, '[^,]+') do held[t2 .. '=' .. d] = true end
              end
            end
          end
        end
        local free, seen = {}, {}
        for d in string.gmatch(cur[2] or '', '[^,]+') do
          if dset[typ][d] and not held[typ .. '=' .. d] and not seen[d] then free[#free + 1] = d; seen[d] = true end
        end
        for _, d in ipairs(dlist[typ]) do
          if not held[typ .. '=' .. d] and not seen[d] then free[#free + 1] = d; seen[d] = true end
        end
        call('HSET', P, 'devs:' .. typ, devs, 'free:' .. typ, table.concat(free, ','))
      end
    end
    local now_typs = {}
    for _, typ in ipairs(dtyps) do now_typs[typ] = true end
    for typ in string.gmatch(call('HGET', I, 'dtypes') or '', '[^,]+') do
      if not now_typs[typ] then call('HDEL', P, 'devs:' .. typ, 'free:' .. typ) end
    end
    call('HSET', I, 'dtypes', table.concat(dtyps, ','))
  end
  function M.reap(now, force, skip)
    local count = 0
    repeat
      local ids = call('ZRANGEBYSCORE', L, '-inf', now, 'LIMIT', 0, 500)
      if #ids > 0 then M.drop(ids) end
      count = count + #ids
    until #ids < 500
    local gone = call('ZRANGEBYSCORE', C, '-inf', now)
    if #gone > 0 then
      for i = 1, #gone, 500 do
        local chunk, fields = batch(gone, i)
        call('HDEL', I, unpack(fields))
        call('ZREM', C, unpack(chunk))
      end
      M.recount()
    end
    local nxt = call('ZRANGE', L, 0, 0, 'WITHSCORES')[2] or 9e15
    local host1 = call('ZRANGE', C, 0, 0, 'WITHSCORES')[2]
    if host1 and tonumber(host1) < tonumber(nxt) then nxt = host1 end
    call('HSET', P, 'next_expiry', nxt)
    if count > 0 or force then M.handoff(now, skip) end
    return count
  end
  -- handoff(now, skip): freed slots go to the parked waiters (wait:<id> in waitq and a 'p' ticket under
  -- w:<id>) that now fit, oldest first; a starved one that does not fit holds back what it needs. Each is granted
  -- an unclaimed lease (flag 2, for its claim window), its ticket becomes 'g' and its message goes to the wake list.
  function M.handoff(now, skip)
    if not call('HGET', P, 'waiters') then return 0 end
    local ids = call('ZRANGE', Q, 0, 99)
    if #ids == 0 and call('ZCARD', X) == 0 then  -- nobody waits any more: the wakers stop looking at expiries
      call('HDEL', P, 'waiters')
      return 0
    end
    local st, granted = {}, 0
    local function state(typ)
      local s = st[typ]
      if not s then
        local r = call('HMGET', P, 'total:' .. typ, 'used:' .. typ, 'free:' .. typ)
        s = {used = tonumber(r[2] or 0), free = r[3]}
        s.avail = tonumber(r[1] or 0) - s.used
        st[typ] = s
      end
      return s
    end
    for _, id in ipairs(ids) do
      local wrec = id ~= skip and call('HGET', P, 'wait:' .. id)
      local wns, since, wexp, wworker, wname
      if wrec then wns, since, wexp, wworker, wname = string.match(wrec, '^([^|]*)|(%d+)|(%d+)|([^|]*)|(.*)$') end
      if wns and tonumber(wexp) > now then
        local wk = WB .. 'w:' .. id
        local w = call('GET', wk)
        local tk, starve, cttl, payload
        if w then tk, starve, cttl, payload = string.match(w, '^p|([^|]*)|(%d+)|(%d+)|(.*)$') end
        local needs, fits = {}, true
        for typ, n in string.gmatch(wns, '([^,=]+)=(%d+)') do
          n = tonumber(n)
          needs[#needs + 1] = {typ, n}
          local s = state(typ)
          if s.avail < n then
            fits = false
          elseif s.free then
            local c = 0
            for _ in string.gmatch(s.free, '[^,]+') do c = c + 1 end
            if c < n then fits = false end
          end
        end
        if fits and tk then
          local args, got = {}, {}
          for _, tn in ipairs(needs) do
            local typ, n = tn[1], tn[2]
            local s = st[typ]
            s.used, s.avail = s.used + n, s.avail - n
            args[#args + 1], args[#args + 2] = 'used:' .. typ, s.used
            if s.free then
              local mine, rest = {}, {}
              for d in string.gmatch(s.free, '[^,]+') do
                if #mine < n then mine[#mine + 1] = d else rest[#rest + 1] = d end
              end
              s.free = table.concat(rest, ',')
              args[#args + 1], args[#args + 2] = 'free:' .. typ, s.free
              got[#got + 1] = typ .. '=' .. table.concat(mine, ',')
            end
          end
          local token = call('HINCRBY', P, 'token', 1)
          local bound = table.concat(got, ';')
          args[#args + 1] = 'lease:' .. id
          args[#args + 1] = wns .. '|' .. token .. '|' .. now .. '|' .. cttl .. '|2' ..
                            (bound ~= '' and ' ' .. bound or '') .. '|' .. wworker .. '||' .. wname
          call('HSET', P, unpack(args))
          call('ZADD', L, now + cttl, id)
          M.expires_at(now + cttl)
          M.unwait(id)
          call('SET', wk, 'g|' .. tk, 'KEEPTTL')
          call('RPUSH', WL, payload)
          granted = granted + 1
        elseif tk and not fits and now - tonumber(since) >= tonumber(starve) then
          for _, tn in ipairs(needs) do st[tn[1]].avail = st[tn[1]].avail - tn[2] end
        end
      end
    end
    return granted
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
  function M.impossible(id, ns, now, wttl, tail)
    local old = call('HGET', P, 'wait:' .. id)
    local since = old and string.match(old, '^[^|]*|(%d+)|') or now
    local until_ = now + wttl
    local w, name = string.match(tail, '^([^|]*)|[^|]*|(.*)$')
    call('ZREM', Q, id)
    call('ZADD', X, until_, id)
    call('HSET', P, 'wait:' .. id, ns .. '|' .. since .. '|' .. until_ .. '|' .. w .. '|' .. name, 'waiters', 1)
  end
  function M.register(id, ns, ttl, token, now, tail, devices)
    local got = {}
    for typ, ids in string.gmatch(devices or '', '([^;=]+)=([^;]*)') do
      local free = call('HGET', P, 'free:' .. typ)
      if free then
        local have, mine, taken, kept = ',' .. free .. ',', {}, {}, {}
        for d in string.gmatch(ids, '[^,]+') do
          if string.find(have, ',' .. d .. ',', 1, true) then mine[#mine + 1] = d; taken[d] = true end
        end
        for d in string.gmatch(free, '[^,]+') do
          if not taken[d] then kept[#kept + 1] = d end
        end
        call('HSET', P, 'free:' .. typ, table.concat(kept, ','))
        if #mine > 0 then got[#got + 1] = typ .. '=' .. table.concat(mine, ',') end
      end
    end
    local bound = table.concat(got, ';')
    for typ, n in string.gmatch(ns, '([^,=]+)=(%d+)') do call('HINCRBY', P, 'used:' .. typ, n) end
    call('HSET', P, 'lease:' .. id, ns .. '|' .. token .. '|' .. now .. '|' .. ttl .. '|1' ..
         (bound ~= '' and ' ' .. bound or '') .. '|' .. tail)
    call('ZADD', L, now + ttl, id)
    M.expires_at(now + ttl)
    M.unwait(id)
    return bound
  end
  return M
end
"""

#: What every script but SNAPSHOT starts with: the keys, give_back and lib().
PRELUDE = HEAD + GIVE_BACK + LIB
