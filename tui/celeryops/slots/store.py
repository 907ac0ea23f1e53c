"""SlotStore: the Redis side of slot leases (acquire, renew, adopt, release, reap, totals, host contributions,
snapshot).

One store = one pool. Pool keys are ``<prefix>:{<pool>}:pool|leases|waitq|waitx|hosts|hostinfo|wake`` and the
tickets ``<prefix>:{<pool>}:w:<id>`` of tasks that waited (hash tag on by default, so one pool lives in one Redis
Cluster slot; the layout and the handoff are described in ``scripts.py``); the set
``<prefix>:pools`` lists the pools for readers. A pool's total of a type is either explicit (``set_totals``) or the
sum of what the live hosts contribute (``contribute``, renewed by each worker's heartbeat; a contribution that is
not renewed expires by Redis TIME).
Scripts are redis-py ``Script`` objects: after a Redis restart or ``SCRIPT FLUSH`` the NOSCRIPT error is healed by
reloading the script. A pool written by the seed's schema (``resource:<type>:total|used`` strings and
``resource:task:<id>`` hashes) is read by ``read_all`` as a ``legacy`` pool. How records are written is in
:mod:`celeryops.slots.codec`; how a pool's keys become a snapshot, in :mod:`celeryops.slots.reading`.

The hot path (acquire, release) runs on one connection of the client's pool that the store holds (redis-py's
single-connection client, ``client.client()``, per process, taken at the first acquire or release): a pooled
command checks a connection out, polls it for stale data and puts it back, which costs the client more than the
command itself. It sends pre-encoded keys and arguments and gets an integer back (a short string when it bound
devices: see bench/bench_slots.py).
Everything else (snapshots, totals, renewals) uses the client as given.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from celeryops.core.forking import LOOP_CONNECT_TIMEOUT, LOOP_REPLY_TIMEOUT
from celeryops.core.untrusted import MalformedRecord
from celeryops.slots import scripts
from celeryops.slots.codec import (
    as_text,
    devices_text,
    host_member,
    needs_text,
    pairs,
    parse_devices,
    record_tail,
    safe_field,
    scores,
    to_ms,
    type_name,
)
from celeryops.slots.reading import DEFAULT_PREFIX, Client, Scope, build_pool_snapshot, read_legacy
from celeryops.slots.snapshot import DeviceId, PoolSnapshot, Snapshot

__all__ = ["DEFAULT_PREFIX", "GLOBAL_POOL", "AcquireResult", "Client", "ContributeResult", "Park", "RenewResult",
           "Scope", "SlotStore", "Tick", "connect", "devices_text", "host_pool", "needs_text", "parse_devices",
           "pools", "read_all", "read_legacy", "type_name"]

GLOBAL_POOL = "global"


def host_pool(host: str) -> str:
    return f"host:{host}"


@dataclass(frozen=True)
class AcquireResult:
    """``ok``: the lease is held under ``token``, with ``devices`` of the device-bound types (``{"gpu": [2, 3]}``).
    ``impossible``: a type asks more than its total (or has none)."""

    ok: bool
    token: int
    status: str  # "ok" | "held" | "claimed" | "busy" | "impossible" | "duplicate"
    blocked_type: str | None = None
    devices: dict[str, list[DeviceId]] = field(default_factory=dict)


@dataclass(frozen=True)
class Park:
    """How a refused request waits to be woken: the ``ticket`` its copies carry, the ``message`` that wakes it
    (opaque here: the Celery side writes and sends it), and the ``claim_window`` (s) a lease handed to it stays
    unclaimed at most before it expires (a lost wake-up never holds slots longer)."""

    ticket: str
    message: str
    claim_window: float


@dataclass(frozen=True)
class Tick:
    reaped: int
    next_expiry_in: float  # s until a lease or a contribution may expire
    waiting: bool


@dataclass(frozen=True)
class ContributeResult:
    """``new``: the contribution was not there (first start, it had expired, or Redis lost it); ``changed``: other
    numbers than before; ``renewed``: only its expiry moved. ``reaped``: leases reaped on the way."""

    status: Literal["new", "changed", "renewed"]
    reaped: int


@dataclass(frozen=True)
class RenewResult:
    """``devices``: after ``restored``, the devices bound again (one another task took meanwhile is not among them)."""

    status: Literal["renewed", "restored", "lost", "taken"]
    token: int
    devices: dict[str, list[DeviceId]] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.status in ("renewed", "restored")


def connect(url: str, *, timeout: float = 2.0, on_loop: bool = False) -> redis.Redis:
    """A client that fails fast when Redis is unreachable (the fail-open/closed policy decides what happens).
    ``on_loop``: for calls made on a worker's event loop, bounded as :mod:`celeryops.core.forking` says (a connection
    in LOOP_CONNECT_TIMEOUT, a reply in LOOP_REPLY_TIMEOUT, no retry after a timeout)."""
    if on_loop:
        return redis.Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=LOOP_CONNECT_TIMEOUT,
            socket_timeout=LOOP_REPLY_TIMEOUT, retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        )
    return redis.Redis.from_url(
        url, decode_responses=True, socket_connect_timeout=timeout, socket_timeout=timeout,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 2), health_check_interval=10,
    )


class SlotStore:
    def __init__(self, client: Client, pool: str = GLOBAL_POOL, *, prefix: str = DEFAULT_PREFIX,
                 hash_tag: bool = True) -> None:
        self.client = client
        self.pool = pool
        self.prefix = prefix
        base = f"{prefix}:{{{pool}}}" if hash_tag else f"{prefix}:{pool}"
        self.keys = [f"{base}:{part}" for part in ("pool", "leases", "waitq", "waitx", "hosts", "hostinfo")]
        self.wake_key = f"{base}:wake"  # the handoff's wake list (scripts.py)
        self._keys = tuple(k.encode() for k in (*self.keys, self.wake_key))  # encoded once: redis-py passes bytes
        self._release_keys = self._keys  # a release may hand its slots off to a parked request: every key
        self.registry_key = f"{prefix}:pools"
        self._scripts = {name: client.register_script(src) for name, src in scripts.ALL.items()}
        self._acquire = self._scripts["acquire"]
        self._release = self._scripts["release"]
        self._hot: tuple[int, Client] | None = None  # (pid, the hot path's client): see the module's docstring

    def _hot_client(self) -> Client:
        """A single-connection client on this client's pool, for this process (after a fork the parent's connection
        belongs to the parent). Two threads racing here each make one; the loser's connection goes back to the pool.
        A cluster client is used as it is: it keeps a connection per node anyway."""
        hot = self._hot
        if hot is None or hot[0] != os.getpid():
            client = self.client
            if isinstance(client, redis.Redis):
                client = client.client()  # type: ignore[no-untyped-call]
            hot = self._hot = (os.getpid(), client)
        return hot[1]

    @classmethod
    def from_url(cls, url: str, pool: str = GLOBAL_POOL, **kw: Any) -> SlotStore:
        return cls(connect(url), pool, **kw)

    @property
    def scope(self) -> Scope:
        return "host" if self.pool.startswith("host:") else "global"

    def _run(self, name: str, *args: Any) -> Any:
        return self._scripts[name](keys=self._keys, args=args)

    # -- writes -----------------------------------------------------------------------------------------------
    def set_totals(self, totals: Mapping[str, int], *, only_missing: bool = False, reap_worker: str = "") -> int:
        """Write explicit totals (a per-host pool's, or a fixed total that wins over the hosts' contributions in a
        global pool; ``only_missing``: only for types without a total yet), never touching live leases, and register
        the pool; returns how many leases were reaped (expired ones, plus those of ``reap_worker``, a node name that
        is starting and so holds nothing yet)."""
        flat: list[str | int] = []
        for typ, n in sorted(totals.items()):
            flat += [type_name(typ), int(n)]
        reaped = int(self._run("set_totals", "nx" if only_missing else "set", safe_field(reap_worker), *flat))
        self.client.sadd(self.registry_key, self.pool)
        return reaped

    def clear_totals(self, types: list[str]) -> None:
        """Forget explicit totals: these types go back to the sum of the hosts' contributions (0 without any)."""
        flat: list[str] = []
        for typ in sorted(types):
            flat += [type_name(typ), ""]
        self._run("set_totals", "del", "", *flat)

    def contribute(self, host: str, totals: Mapping[str, int], *, ttl: float, worker: str = "",
                   starting: bool = False, devices: Mapping[str, Sequence[DeviceId]] | None = None
                   ) -> ContributeResult:
        """Add (or renew) ``worker``'s contribution of ``host``'s totals to this pool for ``ttl`` seconds; the pool's
        totals become the sum over hosts (workers with the same host count once, with their largest numbers).
        ``devices``: the host's devices of device-bound types (``{"gpu": [0, 1]}``), bound to leases by acquire (a
        host pool's; devices of different hosts must never share a pool). ``starting``: the worker is starting under
        this node name, so leases recorded under it are dead and reaped."""
        reaped, status = self._run("contribute", "start" if starting else "beat", host_member(host, worker),
                                   needs_text(totals, keep_zero=True), to_ms(ttl), devices_text(devices or {}))
        result = ContributeResult({1: "new", 2: "changed", 0: "renewed"}[int(status)], int(reaped))  # type: ignore[arg-type]
        if result.status != "renewed":
            self.client.sadd(self.registry_key, self.pool)
        return result

    def withdraw(self, host: str, worker: str = "") -> bool:
        """Take ``worker``'s contribution of ``host`` out now (a worker that stops); False if there was none.
        Leases are never touched: above a smaller total, running tasks keep their slots and acquires wait."""
        _reaped, had = self._run("contribute", "leave", host_member(host, worker), "", 1)
        return bool(had)

    def acquire(self, lease_id: str, needs: Mapping[str, int], *, ttl: float, name: str = "", worker: str = "",
                host: str = "", starvation_after: float = 60.0, wait_ttl: float | None = None, ticket: str = "",
                park: Park | None = None) -> AcquireResult:
        """All-or-nothing acquire of every type in ``needs``. A refused request is remembered as waiting for
        ``wait_ttl`` seconds (default: 3 x ttl); after ``starvation_after`` seconds of waiting it reserves its needs.

        The handoff (work-conserving slots): ``park`` makes a refused request wakeable: a release (or an expiry)
        that frees what it needs grants it the slots at once and puts ``park.message`` on the wake list. A copy of
        the task that carries a ticket (``ticket``) claims the slots handed to that ticket (status ``claimed``), or
        is told to drop itself (status ``duplicate``, ``blocked_type`` says why: ``stale``, ``done``, ``running``)
        when another copy of the ticket ran or runs, or a newer ticket waits."""
        args: tuple[Any, ...] = _acquire_args(tuple(needs.items()), ttl, starvation_after, wait_ttl, worker, host, name)
        if ticket or park is not None:
            keep = max(3 * (wait_ttl if wait_ttl is not None else 3 * ttl), 600.0)
            args = (*args, ticket, park.ticket if park else "", park.message if park else "", to_ms(keep),
                    to_ms(park.claim_window if park else ttl))
        res = self._acquire(keys=self._keys, args=(lease_id, *args), client=self._hot_client())
        if type(res) is int:
            return AcquireResult(True, res, "ok")
        if type(res) is bytes:  # a client without decode_responses
            res = res.decode()
        if type(res) is str:  # granted with devices: "7 gpu=3"
            tk, _, bound = res.partition(" ")
            return AcquireResult(True, int(tk), "ok", devices=parse_devices(bound))
        code, info = int(res[0]), as_text(res[1])
        if code > 0:
            return AcquireResult(True, code, info, devices=parse_devices(as_text(res[2])) if len(res) > 2 else {})
        if code == -1:
            return AcquireResult(False, 0, "impossible", info)
        if code == -2:
            return AcquireResult(False, 0, "duplicate", info)
        return AcquireResult(False, 0, "busy", info)

    def renew(self, lease_id: str, token: int, ttl: float, needs: Mapping[str, int], *, name: str = "",
              worker: str = "", host: str = "", devices: Mapping[str, Sequence[DeviceId]] | None = None
              ) -> RenewResult:
        """Extend the lease. ``lost``: it expired and was reaped; ``taken``: the id is held under another token;
        ``restored``: Redis had lost its data, the lease was registered again under the same token, with those of
        its ``devices`` that are still free."""
        res = self._run("renew", lease_id, int(token), to_ms(ttl), needs_text(needs), record_tail(worker, host, name),
                        devices_text(devices or {}))
        status = {1: "renewed", 2: "restored", 0: "lost", -1: "taken"}[int(res[0])]
        return RenewResult(status, int(res[1]), parse_devices(as_text(res[2])) if len(res) > 2 else {})  # type: ignore[arg-type]

    def adopt(self, lease_id: str, needs: Mapping[str, int], *, ttl: float, name: str = "", worker: str = "",
              host: str = "") -> int:
        """Register a holding that ran ungated during an outage (may exceed the total: the counters tell the truth)."""
        token, _new = self._run("adopt", lease_id, needs_text(needs), to_ms(ttl), record_tail(worker, host, name))
        return int(token)

    def release(self, lease_id: str, token: int | None = None, *, unused: bool = False) -> bool:
        """Return the lease's slots and devices (as recorded, never the caller's numbers) and hand them off to the
        parked requests that now fit; False if nothing was held. ``unused``: given back before the task ran (another
        pool refused it), so its ticket is forgotten rather than marked done."""
        args: tuple[Any, ...] = (lease_id, b"" if token is None else int(token))
        return bool(self._release(keys=self._release_keys, args=(*args, b"1") if unused else args,
                                  client=self._hot_client()))

    def reap(self) -> int:
        return int(self._run("reap"))

    def unpark(self, lease_id: str, ticket: str) -> str:
        """A copy of a task parked in this pool under ``ticket`` runs in another pool: take the task out of this
        one. ``moved`` or ``gone`` (go on elsewhere), or ``running``, ``done``, ``stale`` (drop the copy)."""
        return as_text(self._run("unpark", lease_id, ticket))

    def tick(self) -> Tick:
        """Reap (and hand the freed slots off) only if a lease or a contribution may have expired; says when the
        next one may expire and whether requests wait (the waker thread sleeps until then)."""
        reaped, until_ms, waiting = self._run("tick")
        return Tick(int(reaped), max(0.0, int(until_ms) / 1000), bool(int(waiting)))

    def pop_wake(self, timeout: float) -> str | None:
        """The next message the handoff put on the wake list, waiting up to ``timeout`` seconds (BLPOP)."""
        got = self.client.blpop([self.wake_key], timeout=timeout)
        return None if got is None else as_text(got[1])  # type: ignore[index]

    def take_wake(self) -> str | None:
        """The next message on the wake list, if there is one now (LPOP: never waits)."""
        got = self.client.lpop(self.wake_key)
        return None if got is None else as_text(got)

    # -- reads ------------------------------------------------------------------------------------------------
    def snapshot(self, *, starvation_after: float | None = None) -> PoolSnapshot:
        """One round trip: a read-only script returning Redis TIME and the pool's keys, consistent with each other."""
        now_raw, pool, expiries, host_expiries, hostinfo = self._run("snapshot")
        try:
            return build_pool_snapshot(self.pool, self.scope, now_raw, pairs(pool), scores(expiries),
                                       scores(host_expiries), pairs(hostinfo), starvation_after)
        except (ValueError, TypeError, IndexError, KeyError) as exc:  # a lease or total some client malformed
            raise MalformedRecord(self.keys[0], f"{type(exc).__name__}: {exc}", what="slot pool") from None


@functools.lru_cache(maxsize=1024)
def _acquire_args(needs: tuple[tuple[str, int], ...], ttl: float, starvation_after: float, wait_ttl: float | None,
                  worker: str, host: str, name: str) -> tuple[bytes, ...]:
    """ARGV[2:] of the acquire script, encoded once per distinct call shape (a worker repeats a handful)."""
    return (needs_text(dict(needs)).encode(), b"%d" % to_ms(ttl), b"%d" % max(0, round(starvation_after * 1000)),
            b"%d" % to_ms(wait_ttl if wait_ttl is not None else 3 * ttl), record_tail(worker, host, name).encode())


def pools(client: Client, prefix: str = DEFAULT_PREFIX) -> list[str]:
    return sorted(str(p) for p in client.smembers(f"{prefix}:pools"))  # type: ignore[union-attr]


def read_all(client: Client, prefix: str = DEFAULT_PREFIX, *, hash_tag: bool = True,
             starvation_after: float | None = None) -> Snapshot:
    """Every registered pool (one round trip each) plus a seed-schema pool if present."""
    sec, usec = client.time()  # type: ignore[misc]
    out = [SlotStore(client, p, prefix=prefix, hash_tag=hash_tag).snapshot(starvation_after=starvation_after)
           for p in pools(client, prefix)]
    legacy = read_legacy(client, prefix)
    if legacy is not None:
        out.append(legacy)
    snap = Snapshot(taken_at=float(sec) + float(usec) / 1e6, pools=out)
    return Snapshot(snap.taken_at, [replace(p, waiting=[
        replace(w, no_capacity=not any(c.can_hold(w.slots) for c in snap.candidates(p))) for w in p.waiting])
        for p in out])
