"""One run at a time per fleet: a Redis lease with a heartbeat, an orphan you can see, and an explicit take-over.

Two keys (same Cluster hash tag):

- ``fleet_key(fleet, "lease")``: a hash, the record: token, run_id, owner, host, pid, acquired_at, heartbeat_at
  (Redis TIME, seconds), and where the holder runs: ``pid_start`` (its process's start time, so a reused pid is not
  taken for it) and ``scope`` (boot id and pid namespace: which processes this host can see). It has a long TTL
  (``record_ttl``, default 7 days) so that a crashed run stays visible.
- ``fleet_key(fleet, "lease", "alive")``: the holder's token with a short TTL (``ttl``, default 30 s), renewed
  every ``ttl/3`` by the heartbeat task.

A record without its alive key is **orphaned**: its holder stopped heart-beating (killed, frozen, lost Redis). So is
one whose holder is known dead now: it ran on this host, in this boot and pid namespace, and its process is gone (or
its pid now belongs to a process that started later). ``acquire()`` refuses any existing record;
``take_over(expected_run_id)`` atomically replaces an orphaned record of that very run and refuses a live one.
``release()`` deletes only our own lease (compare-and-delete in Lua).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

import humanize
import redis

from celeryops.core.aio import cancel_and_wait
from celeryops.core.errors import EXIT_PREFLIGHT, UserError
from celeryops.core.identity import current_user
from celeryops.core.namespace import fleet_key
from celeryops.core.untrusted import MalformedRecord

log = logging.getLogger(__name__)

DEFAULT_TTL: Final = 30.0
DEFAULT_RECORD_TTL: Final = 7 * 24 * 3600.0

# KEYS: record, alive. ARGV: token, run_id, owner, host, pid, ttl_ms, record_ttl_ms, expected_run_id ("" = acquire),
# pid_start, scope, dead_token (the token of a holder seen dead on this host: taken over although its alive key
# has not expired yet). Returns {1, now} when taken, {0, now, alive_pttl, field, value, ...} when refused.
_ACQUIRE: Final = """
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
local holder = redis.call('HGET', KEYS[1], 'run_id')
local previous = ''
if holder then
  local alive = redis.call('PTTL', KEYS[2])
  local dead = ARGV[11] ~= '' and redis.call('HGET', KEYS[1], 'token') == ARGV[11]
  if ARGV[8] == '' or holder ~= ARGV[8] or (alive ~= -2 and not dead) then
    local out = {0, now, alive}
    for _, v in ipairs(redis.call('HGETALL', KEYS[1])) do table.insert(out, v) end
    return out
  end
  previous = holder
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'run_id', ARGV[2], 'owner', ARGV[3], 'host', ARGV[4],
           'pid', ARGV[5], 'acquired_at', now, 'heartbeat_at', now, 'ttl_ms', ARGV[6], 'taken_from', previous,
           'pid_start', ARGV[9], 'scope', ARGV[10])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[6])
return {1, now}
"""

# KEYS: record, alive. ARGV: token, ttl_ms, record_ttl_ms. 1 = renewed, 0 = not ours any more.
_RENEW: Final = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'heartbeat_at', t[1] .. '.' .. string.format('%06d', tonumber(t[2])))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS: record, alive. ARGV: token. 1 = released, 0 = not ours (left alone).
_RELEASE: Final = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
return 1
"""


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def process_start(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds, from ``/proc/<pid>/stat`` field 22 and the boot time), or None
    when it does not exist, is a zombie (dead, not yet reaped) or /proc cannot tell."""
    stat = _read(f"/proc/{pid}/stat")
    boot = _read("/proc/stat")
    if stat is None or boot is None or ")" not in stat:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command may hold spaces and parentheses: cut after it
    btime = next((line.split()[1] for line in boot.splitlines() if line.startswith("btime ")), None)
    if len(fields) < 20 or fields[0] in ("Z", "X") or btime is None:
        return None
    return round(int(btime) + int(fields[19]) / os.sysconf("SC_CLK_TCK"), 2)


def process_scope() -> str:
    """Which processes this one can see: the boot id and the pid namespace ("" when /proc cannot tell). Two
    containers with one hostname (host networking) or a host after a reboot differ here."""
    boot = (_read("/proc/sys/kernel/random/boot_id") or "").strip()
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}/{namespace}" if boot else ""


def process_gone(host: str, pid: int, pid_start: float | None = None, scope: str = "") -> bool:
    """Process ``pid`` of ``host`` is known dead: it ran here (this hostname and, when recorded, this boot and pid
    namespace) and it is gone, a zombie, or its pid now belongs to a process started at another time (pid reuse).
    False whenever this host cannot tell (another host, another container, no /proc)."""
    if host != socket.gethostname() or pid <= 0 or (scope and scope != process_scope()):
        return False
    if os.path.isdir("/proc/self"):
        started = process_start(pid)
        return started is None or (pid_start is not None and abs(started - pid_start) > 0.05)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@dataclass(frozen=True)
class LeaseInfo:
    """A lease as stored, with the Redis server's clock at the time it was read (``now``)."""

    run_id: str
    owner: str
    host: str
    pid: int
    acquired_at: float
    heartbeat_at: float
    alive_ms: int  # PTTL of the alive key: -2 = gone (expired), -1 = no expiry
    now: float
    taken_from: str | None = None
    pid_start: float | None = None  # the holder's process start time (epoch seconds), when recorded
    scope: str = ""  # the holder's boot id and pid namespace (``process_scope``), when recorded
    token: str = ""

    @cached_property
    def dead_here(self) -> bool:
        """The holder ran on this host and its process is gone (it cannot be heart-beating any more), also when its
        alive key has not expired yet."""
        return process_gone(self.host, self.pid, self.pid_start, self.scope)

    @property
    def expired(self) -> bool:
        """Its alive key expired: the holder stopped heart-beating."""
        return self.alive_ms == -2

    @property
    def orphaned(self) -> bool:
        """Nobody holds the run any more: the heartbeat stopped, or the holder is known dead on this host."""
        return self.expired or self.dead_here

    @property
    def age(self) -> float:
        return max(0.0, self.now - self.acquired_at)

    @property
    def silent_for(self) -> float:
        """Seconds since the last heartbeat."""
        return max(0.0, self.now - self.heartbeat_at)

    def describe(self) -> str:
        who = f"run {self.run_id} of {self.owner}@{self.host} (pid {self.pid}), started {ago(self.age)}"
        if self.dead_here:
            return (f"{who}, orphaned: its process is gone from this host (last heartbeat "
                    f"{ago(self.silent_for)})")
        if self.orphaned:
            return f"{who}, orphaned: its heartbeat stopped {ago(self.silent_for)}"
        return f"{who}, alive (last heartbeat {ago(self.silent_for)})"

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "owner": self.owner, "host": self.host, "pid": self.pid,
                "acquired_at": self.acquired_at, "heartbeat_at": self.heartbeat_at, "age": self.age,
                "silent_for": self.silent_for, "orphaned": self.orphaned, "owner_gone": self.dead_here,
                "taken_from": self.taken_from}


def ago(seconds: float) -> str:
    """'just now' under a second, else humanize's '3 minutes ago'."""
    return "just now" if seconds < 1 else f"{humanize.naturaldelta(seconds)} ago"


class LeaseHeld(UserError):
    """Another run holds the fleet. ``holder`` says who, since when, and whether it is orphaned."""

    def __init__(self, fleet: str, holder: LeaseInfo, *, taking_over: str | None = None) -> None:
        if taking_over is not None and holder.run_id != taking_over:
            todo = (f"it is not run {taking_over}, so it was not taken over; check `celeryops status` "
                    "and take over the run that holds it")
        elif holder.orphaned:
            todo = (f"if that run is really gone, recover it and take its lease over explicitly "
                    f"(take-over of run {holder.run_id})")
        else:
            todo = "wait for that run to finish or stop it on its host"
        super().__init__(f"Fleet {fleet} is held by {holder.describe()}: nothing was done; {todo}.", EXIT_PREFLIGHT)
        self.fleet = fleet
        self.holder = holder


class LeaseLost(UserError):
    """Our lease was released or taken over by someone else while we held it."""


def _parse(fields: dict[str, str], alive_ms: int, now: float) -> LeaseInfo:
    return LeaseInfo(run_id=fields.get("run_id", "?"), owner=fields.get("owner", "?"), host=fields.get("host", "?"),
                     pid=int(fields.get("pid") or 0), acquired_at=float(fields.get("acquired_at") or now),
                     heartbeat_at=float(fields.get("heartbeat_at") or now), alive_ms=alive_ms, now=now,
                     taken_from=fields.get("taken_from") or None,
                     pid_start=float(fields["pid_start"]) if fields.get("pid_start") else None,
                     scope=fields.get("scope", ""), token=fields.get("token", ""))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_lease(client: redis.Redis, fleet: str) -> LeaseInfo | None:
    """The fleet's lease, or None. Reads only (HGETALL, PTTL, TIME): safe for read-only watchers.
    Ages are measured on the Redis server's clock (TIME), so hosts with skewed clocks agree."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(fleet_key(fleet, "lease"))
    pipe.pttl(fleet_key(fleet, "lease", "alive"))
    pipe.time()
    raw, alive, server_time = pipe.execute(raise_on_error=False)
    for reply in (raw, alive):
        if isinstance(reply, Exception):
            raise reply
    if not raw:
        return None
    # A watcher's Redis user may lack TIME (not in @read): then ages use the local clock.
    now = time.time() if isinstance(server_time, Exception) else server_time[0] + server_time[1] / 1e6
    fields = {_text(k): _text(v) for k, v in raw.items()}
    key = fleet_key(fleet, "lease")
    if not fields.get("run_id") or not fields.get("token"):
        raise MalformedRecord(key, "it names no run or no token", what="run lease")
    try:
        return _parse(fields, int(alive), now)
    except (ValueError, TypeError) as exc:
        raise MalformedRecord(key, f"{type(exc).__name__}: {exc}", what="run lease") from None


class RunLease:
    """The lease of one run on one fleet. Sync calls for setup/teardown, an asyncio heartbeat while running."""

    def __init__(
        self,
        client: redis.Redis,
        fleet: str,
        run_id: str,
        *,
        owner: str | None = None,
        host: str | None = None,
        pid: int | None = None,
        ttl: float = DEFAULT_TTL,
        record_ttl: float = DEFAULT_RECORD_TTL,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        if ttl <= 0 or record_ttl < ttl:
            raise ValueError("ttl must be positive and record_ttl at least ttl")
        self.client = client
        self.fleet = fleet
        self.run_id = run_id
        self.owner = owner or current_user()
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self.pid_start = process_start(self.pid) if self.pid > 0 else None
        self.scope = process_scope()
        self.ttl = ttl
        self.record_ttl = record_ttl
        self.on_lost = on_lost
        self.token = secrets.token_hex(16)
        self.lost = False
        self._keys = [fleet_key(fleet, "lease"), fleet_key(fleet, "lease", "alive")]
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._task: asyncio.Task[None] | None = None

    def _claim(self, expected: str) -> None:
        dead = ""
        if expected:  # a holder known dead on this host is taken over now, not once its alive key expired
            holder = read_lease(self.client, self.fleet)
            if holder is not None and holder.run_id == expected and holder.dead_here:
                dead = holder.token
        start = "" if self.pid_start is None else repr(self.pid_start)
        args: list[str | int] = [self.token, self.run_id, self.owner, self.host, self.pid, int(self.ttl * 1000),
                                 int(self.record_ttl * 1000), expected, start, self.scope, dead]
        reply = self._acquire(keys=self._keys, args=args)
        if int(reply[0]) == 1:
            self.lost = False
            return
        now = float(_text(reply[1]))
        flat = [_text(v) for v in reply[3:]]
        holder = _parse(dict(zip(flat[::2], flat[1::2], strict=True)), int(reply[2]), now)
        raise LeaseHeld(self.fleet, holder, taking_over=expected or None)

    def acquire(self) -> None:
        """Take the free lease atomically; raises ``LeaseHeld`` (live or orphaned holder) otherwise."""
        self._claim("")

    def take_over(self, expected_run_id: str) -> None:
        """Atomically replace the orphaned lease of run ``expected_run_id`` (or take a free one); raises
        ``LeaseHeld`` if the lease is alive or belongs to another run."""
        if not expected_run_id:
            raise ValueError("expected_run_id is required")
        self._claim(expected_run_id)

    def renew(self) -> bool:
        """Refresh the heartbeat; False when the lease is not ours any more."""
        ok = int(self._renew(keys=self._keys, args=[self.token, int(self.ttl * 1000), int(self.record_ttl * 1000)]))
        return ok == 1

    def release(self) -> bool:
        """Delete the lease if (and only if) we still own it."""
        self.stop_heartbeat_now()
        return int(self._release(keys=self._keys, args=[self.token])) == 1

    def read(self) -> LeaseInfo | None:
        return read_lease(self.client, self.fleet)

    # -- heartbeat ---------------------------------------------------------------------------------------------
    async def _beat(self) -> None:
        interval = self.ttl / 3
        while True:
            await asyncio.sleep(interval)
            try:
                ok = await asyncio.to_thread(self.renew)
            except redis.RedisError as exc:
                log.warning("lease heartbeat for fleet %s failed (%s); retrying", self.fleet, exc)
                continue
            if not ok:
                self.lost = True
                log.error("lease of fleet %s for run %s was lost", self.fleet, self.run_id)
                if self.on_lost is not None:
                    self.on_lost()
                return

    def start_heartbeat(self) -> asyncio.Task[None]:
        """Renew every ``ttl/3`` in an asyncio task (call from the running loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._beat(), name=f"lease-heartbeat-{self.fleet}")
        return self._task

    async def stop_heartbeat(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def stop_heartbeat_now(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    @contextlib.asynccontextmanager
    async def held(self, take_over: str | None = None) -> AsyncIterator[RunLease]:
        """``async with lease.held():`` acquire (or take over), heartbeat, release on the way out."""
        if take_over:
            await asyncio.to_thread(self.take_over, take_over)
        else:
            await asyncio.to_thread(self.acquire)
        self.start_heartbeat()
        try:
            yield self
        finally:
            await self.stop_heartbeat()
            try:
                await asyncio.to_thread(self.release)
            except redis.RedisError as exc:
                log.warning("could not release the lease of fleet %s (%s); it expires by itself", self.fleet, exc)


# KEYS: wanted. ARGV: who. 1 = dropped, 0 = someone else's (left alone).
_DROP_WANT: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def want_fleet(client: redis.Redis, fleet: str, who: str, ttl: float = DEFAULT_TTL) -> None:
    """Say that a run (``who``) waits for the fleet's lease, for ``ttl`` seconds unless said again: the autoscaler
    starts no step of its own meanwhile, so the waiting run gets the lease when the step in progress ends."""
    client.set(fleet_key(fleet, "lease", "wanted"), who, px=max(1, int(ttl * 1000)))


def fleet_wanted(client: redis.Redis, fleet: str) -> str | None:
    """Who waits for the fleet's lease (:func:`want_fleet`), or None. Reads only."""
    value = client.get(fleet_key(fleet, "lease", "wanted"))
    return None if value is None else _text(value)


def drop_want(client: redis.Redis, fleet: str, who: str) -> None:
    """No longer waiting (only ``who``'s own word is dropped)."""
    client.eval(_DROP_WANT, 1, fleet_key(fleet, "lease", "wanted"), who)


def drop_dead_lease(client: redis.Redis, fleet: str, run_id: str) -> bool:
    """Remove the lease of run ``run_id`` if its holder is gone (heartbeat expired, or its process is dead on this
    host). Atomic against a concurrent take-over (WATCH). Returns True when removed; a live holder keeps it."""
    keys = [fleet_key(fleet, "lease"), fleet_key(fleet, "lease", "alive")]
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(*keys)  # type: ignore[no-untyped-call]
            info = read_lease(client, fleet)
            if info is None or info.run_id != run_id or not info.orphaned:
                pipe.unwatch()
                return False
            pipe.multi()
            pipe.delete(*keys)
            pipe.execute()
            return True
        except redis.WatchError:
            return False
