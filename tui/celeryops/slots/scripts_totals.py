"""The Lua scripts that set a pool's capacity: explicit totals and the hosts' contributions to a global pool.

A global pool's capacity adds up: each worker contributes its host's totals under "<host>|<worker>" with a TTL and
renews it from its heartbeat. Workers that share a host name count once (the largest of their numbers per type); the
pool's total of a type is the sum over hosts. A contribution that is not renewed before its expiry (the worker was
killed, or lost Redis) is reaped like a lease and the totals are counted again. A smaller total never touches live
leases: ``used`` may exceed ``total`` until they end, and acquires are refused meanwhile. An explicit total
(``fixed:<type>``, written by SET_TOTALS) wins over the hosts' sum. The key layout is in ``scripts.py``.

A host pool (one host's machine resources) is built the same way: its workers contribute, and its total is the
largest of their numbers; a contribution may also list the host's devices of a type (``gpu=0,1,2,3``), which the
pool then binds to leases (``scripts_leases``).
"""

from __future__ import annotations

from celeryops.slots.scripts_lib import PRELUDE

# ARGV: mode 'set'|'nx'|'del', worker ('' = none), type, total, type, total, ... ('del': type, '', type, '', ...)
# Writes explicit totals (fixed:<type>, which win over the hosts' sum; 'nx' only where the type has no total yet;
# 'del' forgets them, the type goes back to the hosts' sum) without touching live leases; reaps expired leases and
# the leases of `worker` (a worker that starts under a node name owns no lease yet: leases under that name are from
# a dead incarnation). -> number of leases reaped
SET_TOTALS = PRELUDE + """
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
local count = H.reap(H.now_ms(), true)
if worker ~= '' then count = count + H.drop_worker(worker) end
return count
"""

# A worker's contribution of its host's totals (and devices) to a pool.
# ARGV: mode 'start'|'beat'|'leave', "<host>|<worker>", needs, ttl ms, devices ("gpu=0,1;npu=0" or '')
#   start: drop the leases of <worker> (see SET_TOTALS), then as beat
#   beat:  write the contribution (expiry now + ttl); the totals are counted again if it is new or changed, or if
#          the pool hash lost one of its totals or device lists (evicted, deleted by hand) while it stayed
#   leave: forget the contribution now and count again
# -> {leases reaped, 1 new | 2 changed | 0 renewed (leave: 1 forgotten | 0 there was none)}
CONTRIBUTE = PRELUDE + """
local H = lib()
local mode, member, ns, ttl, dv = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5] or ''
local now = H.now_ms()
local f, df = 'host:' .. member, 'hdev:' .. member
local count = 0
if mode == 'leave' then
  local had = call('ZREM', C, member)
  call('HDEL', I, f, df)
  H.recount()
  H.reap(now)
  return {0, had}
end
local worker = string.match(member, '|(.*)$')
if mode == 'start' and worker ~= '' then count = H.drop_worker(worker) end
local cur = call('HMGET', I, f, df)
local old = cur[1]
local status = 0
if not old then
  status = 1
  call('HSET', I, f, ns .. '|' .. now .. '|' .. ttl)
else
  local ons, since, ottl = string.match(old, '^([^|]*)|(%d+)|(%d+)$')
  if ons ~= ns then status = 2 end
  if ons ~= ns or tonumber(ottl) ~= ttl then call('HSET', I, f, ns .. '|' .. (since or now) .. '|' .. ttl) end
end
if (cur[2] or '') ~= dv then
  if status == 0 then status = 2 end
  if dv == '' then call('HDEL', I, df) else call('HSET', I, df, dv) end
end
call('ZADD', C, now + ttl, member)
if status == 0 and ns ~= '' then
  local tf = {}
  for typ in string.gmatch(ns, '([^,=]+)=%d+') do tf[#tf + 1] = 'total:' .. typ end
  for typ in string.gmatch(dv, '([^;=]+)=') do tf[#tf + 1] = 'free:' .. typ; tf[#tf + 1] = 'devs:' .. typ end
  local have = call('HMGET', P, unpack(tf))
  for i = 1, #tf do
    if not have[i] then status = -1 end
  end
end
if status ~= 0 then H.recount() end
if status == -1 then status = 0 end
count = count + H.reap(now, status ~= 0)
return {count, status}
"""
