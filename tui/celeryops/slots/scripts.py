"""The slot pools' Lua scripts (run atomically inside Redis): the key layout they share, and each script by name.

Every script touches only the keys of one pool: the seven below, passed in KEYS in this order, and the tickets
``<prefix>:{<pool>}:w:<id>`` (same hash tag, so the same Redis Cluster slot):

  1 pool    HASH  total:<type>  slots this pool has: hostinfo's fixed:<type> if set, else the sum of the live
                                hosts' contributions (counted by the scripts that change them; acquire reads it)
                  used:<type>   slots held by leases (never below 0)
                  token         the fencing-token counter (monotonic)
                  lease:<id>    "needs|token|started ms|ttl ms|adopted|worker|host|task name", where adopted
                                ("0"/"1") is followed by the devices the lease holds, if any: "1 gpu=2,3"
                  devs:<type>   "0,1,2,3": the devices of a device-bound type (a host pool whose workers list them)
                  free:<type>   "2,0": those no lease holds, the one freed longest ago first (present iff devs is)
                  wait:<id>     "needs|since ms|exp ms|worker|task name": a refused request (starvation guard;
                                a request for more than a total is listed too but is not in waitq: it reserves
                                nothing)
                  waiters       present while waitq/waitx may hold entries
                  next_expiry   no lease and no contribution expires before this (ms): at or below the lowest
                                score in leases and in hosts
                  (needs = "cpu=4,gpu=1"; the task name comes last and may contain anything; a device id is
                  a GPU index or a MIG UUID: never ',', ';', '=', '|' or a space)
  2 leases  ZSET  lease id -> expiry (ms, Redis TIME)
  3 waitq   ZSET  waiting id -> since (ms): first refusal; only entries older than the guard are read
  4 waitx   ZSET  waiting id -> exp (ms): a waiter that does not come back before exp is forgotten
  5 hosts   ZSET  "<host>|<worker>" -> expiry (ms, Redis TIME) of that worker's contribution
  6 hostinfo HASH fixed:<type>  an explicit total (set_totals): wins over the hosts' sum
                  ctypes        the types the contributions gave a total at the last count ("cpu,gpu")
                  host:<host>|<worker>  "needs|since ms|ttl ms": one worker's contribution of its host's slots
                  hdev:<host>|<worker>  "gpu=0,1,2,3": the devices that contribution lists (the pool's devs:<type>
                                are their union)
                  dtypes        the types with a device list at the last count
                  (kept out of the pool hash: a small hash is a listpack, every field there slows the hot path's
                  HMGET/HSET/HINCRBY down)
  7 wake    LIST  messages of parked requests the handoff granted slots to: a worker's waker thread pops each and
                  sends it to the pool's wake queue (``celeryops.slots.wake``)
  w:<id>    STRING  the ticket of a task that waited (expires: PX): "p|ticket|starvation ms|claim ms|message"
                  parked, "g|ticket" handed a lease (flag 2: granted, not claimed yet, for the claim window only),
                  "c|ticket" claimed by the first copy that came (its lease has flag 3), "d|ticket" that run is done,
                  "x|ticket" a copy went to another pool's worker and took the task out of this pool (unpark).
                  A copy of the task carries its ticket (a message header): a copy whose ticket is not the current
                  one, or whose ticket was claimed by a copy that runs or ran, drops itself (exactly once).

Expiry is decided by Redis ``TIME`` only. Expired leases and contributions are reaped (``ZRANGEBYSCORE leases -inf
now``, O(expired), no scan) before acquire, renew, adopt, set_totals, contribute and reap do their work, so ``used``
equals the sum of the lease records after every call. Acquire runs that reap only once ``now`` has reached
``next_expiry``: before then no lease can have expired. Every script that adds an expiry keeps ``next_expiry`` at or
below it; a missing field means "reap now" (a pool written before the field existed, or Redis lost the hash). With a
hash tag in the key names (``resource:{pool}:...``) all six keys live in one Redis Cluster slot.

The scripts: ``scripts_leases`` (acquire, release, renew, adopt, reap: the hot paths and what they cost) and
``scripts_totals`` (explicit totals and host contributions: how a global pool's capacity adds up), both built on the
shared Lua of ``scripts_lib``; ``SNAPSHOT`` (below) reads a pool. ``ALL`` maps each script's name to its text
(``SlotStore`` registers them).
"""

from __future__ import annotations

from celeryops.slots.scripts_leases import ACQUIRE, ADOPT, REAP, RELEASE, RENEW, TICK, UNPARK
from celeryops.slots.scripts_lib import HEAD
from celeryops.slots.scripts_totals import CONTRIBUTE, SET_TOTALS

__all__ = ["ACQUIRE", "ADOPT", "ALL", "CONTRIBUTE", "REAP", "RELEASE", "RENEW", "SET_TOTALS", "SNAPSHOT", "TICK",
           "UNPARK"]

# Read-only: everything a snapshot needs in one round trip (a script, so it also works on Redis Cluster, where
# redis-py refuses TIME in a pipeline).
# -> {TIME, HGETALL pool, ZRANGE leases WITHSCORES, ZRANGE hosts WITHSCORES, HGETALL hostinfo}
SNAPSHOT = HEAD + """
return {call('TIME'), call('HGETALL', P), call('ZRANGE', L, 0, -1, 'WITHSCORES'),
        call('ZRANGE', C, 0, -1, 'WITHSCORES'), call('HGETALL', I)}
"""

ALL = {"acquire": ACQUIRE, "renew": RENEW, "adopt": ADOPT, "release": RELEASE, "set_totals": SET_TOTALS,
       "contribute": CONTRIBUTE, "reap": REAP, "snapshot": SNAPSHOT, "tick": TICK,
       "unpark": UNPARK}
