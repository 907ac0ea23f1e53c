"""A worker process's side of the slot leases: ``SlotRuntime`` (its stores, the leases it holds, the heartbeat thread).

Celery-free (``celery.py`` wires it to a worker's signals and tasks). A worker's types live in its host's pool (the
machine's CPUs and GPUs; the host's GPU devices are listed there, and a granted GPU slot is a device) unless they
are shared (``CELERYOPS_SLOTS_SHARED``, or every type with ``CELERYOPS_SLOTS_SCOPE=global``): those live in the global
pool. A request that needs both is acquired pool by pool, the host's first, all or nothing (a refusal in the global
pool gives the host's slots and devices back at once). Acquire fails open (the task runs ungated and without
devices, registered once Redis is back) or closed (it waits), as the settings say. The heartbeat renews the
worker's contributions (its host's totals and devices) and every lease every third of the shorter TTL; a lease
found gone (expired and reaped, or taken) is logged and, with ``on_lost="raise"``, ``LeaseLost`` is raised inside
the task's thread. The heartbeat and the wakers are threads of the process, except in the main process of a worker
whose pool forks, where the worker's event loop runs them (``run_on_loop``, :mod:`celeryops.slots.loop`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import redis

from celeryops.slots.detect import Detected, DeviceId
from celeryops.slots.settings import ENV_PREFIX, SlotSettings
from celeryops.slots.store import GLOBAL_POOL, Park, SlotStore, connect

WAKE_BLOCK = 5.0  # s a waker blocks on its wake list at most before it looks at the pool's next expiry again


def wake_queue(settings: SlotSettings, pool: str) -> str:
    """The queue a pool's woken tasks are sent to: consumed by the workers of that pool (a host's), so the task
    starts where its slots were handed to it."""
    return f"celeryops.slots.{settings.prefix}.{pool}"


def claim_window(settings: SlotSettings) -> float:
    """Seconds a lease handed to a parked task stays unclaimed at most: long enough for the task's fallback retry
    to claim it if the wake-up was lost, never longer than a lease."""
    return min(settings.lease_ttl, settings.retry_countdown + 5.0)


@dataclass(frozen=True)
class Dropped:
    """This copy of a task must not run: another copy of its ticket runs or ran (``why``: running, done, stale)."""

    why: str

log = logging.getLogger("celeryops.slots")


class LeaseLost(Exception):
    """Raised in a task whose slot lease expired and was reaped (or taken) while it ran."""


@dataclass
class Holding:
    """The leases one task holds: per pool its needs and fencing token, and the devices it was given."""

    task_id: str
    needs: dict[str, int]
    name: str
    worker: str
    thread_id: int
    parts: dict[str, tuple[dict[str, int], int]] = field(default_factory=dict)  # pool -> (needs there, token)
    devices: dict[str, list[DeviceId]] = field(default_factory=dict)
    ungated: bool = False
    lost: bool = False

    @property
    def token(self) -> int:
        """The token of the first pool's lease (0 while ungated)."""
        return next(iter(self.parts.values()))[1] if self.parts else 0


class SlotRuntime:
    """Per-process state of a worker: the stores, the leases this process holds, and the heartbeat thread."""

    def __init__(self, settings: SlotSettings, redis_url: str) -> None:
        self.settings = settings
        self.redis_url = redis_url
        self.client = connect(redis_url)
        self.stores: dict[str, SlotStore] = {}
        self.store = self.store_for(settings.pool)  # this worker's own pool: its host's (global: the global pool)
        self.holdings: dict[str, Holding] = {}
        self.worker_name = ""
        self.detected: Detected | None = None  # what this process contributes (main process of a worker)
        self._written: set[str] = set()  # pools whose contribution was written at least once
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wakers: list[threading.Thread] = []
        self._waker_stop = threading.Event()
        self.pid = os.getpid()
        self.on_loop = False  # the worker's event loop drives the heartbeat and the wakers (``run_on_loop``)

    def run_on_loop(self) -> None:
        """This process forks the worker's pool (the main process of a prefork worker), so no thread of ours may run
        in it (:mod:`celeryops.core.forking`): the worker's event loop drives the heartbeat and the wakers
        (:mod:`celeryops.slots.loop`) and this runtime starts no thread; its Redis calls are bounded for the loop."""
        if self.on_loop:
            return
        old, self.on_loop = self.client, True
        self.client = connect(self.redis_url, on_loop=True)
        self.stores.clear()
        self.store = self.store_for(self.settings.pool)
        old.close()

    def store_for(self, pool: str) -> SlotStore:
        store = self.stores.get(pool)
        if store is None:
            store = self.stores[pool] = SlotStore(self.client, pool, prefix=self.settings.prefix,
                                                  hash_tag=self.settings.hash_tag)
        return store

    @property
    def totals(self) -> dict[str, int] | None:
        return None if self.detected is None else self.detected.totals

    def contributions(self) -> dict[str, tuple[dict[str, int], dict[str, list[DeviceId]]]]:
        """What this worker adds to each pool: its host's pool gets the machine's types and devices (always, even
        empty: the host shows as live), the global pool the shared types it has a total for."""
        det = self.detected
        if det is None:
            return {}
        out: dict[str, tuple[dict[str, int], dict[str, list[DeviceId]]]] = {}
        if self.settings.scope == "host":
            out[self.settings.pool] = ({}, {})
        for typ, n in det.totals.items():
            pool = self.settings.pool_of(typ)
            totals, devices = out.setdefault(pool, ({}, {}))
            totals[typ] = n
            if pool != GLOBAL_POOL and det.devices.get(typ):
                devices[typ] = list(det.devices[typ])
        return out

    # -- worker lifecycle ---------------------------------------------------------------------------------------
    def on_worker_start(self, nodename: str) -> None:
        """Detect this host's resources, contribute them (the machine's to its host's pool, shared ones to the
        global pool) and reap what is really dead (expired leases and contributions, leases of this node name)."""
        self.worker_name = nodename
        self.detected = self.settings.detected()
        log.info("slots: host %s: %s", self.settings.host, "; ".join(self.detected.notes.values()) or "no totals")
        try:
            for pool, (totals, devices) in self.contributions().items():
                store = self.store_for(pool)
                if store.scope == "host" and totals:
                    # a host's totals are what its workers say: forget a total fixed by hand or by an earlier
                    # version (which wrote per-host totals as fixed ones), or it would hide what they detect
                    store.clear_totals(list(totals))
                reaped = store.contribute(self.settings.host, totals, ttl=self.settings.contribution_ttl,
                                          worker=nodename, starting=True, devices=devices).reaped
                self._written.add(pool)
                log.info("slots: host %s adds %s%s to pool %s (for %ss, renewed by the heartbeat); reaped %d dead "
                         "lease(s)", self.settings.host, totals or "nothing",
                         "".join(f", {t} devices {d}" for t, d in devices.items()), pool,
                         self.settings.contribution_ttl, reaped)
        except redis.RedisError as exc:
            log.warning("slots: Redis unreachable at worker start (%s); totals will be written when it is back", exc)
        self.start_heartbeat()

    def warn_missing(self, needs_by_type: Mapping[str, list[str]]) -> None:
        """Say once, at start, which task types need a machine resource this host does not have (a GPU task on a
        worker that detected no GPU): they wait for a host that has it."""
        det = self.detected
        if det is None:
            return
        for typ, names in sorted(needs_by_type.items()):
            if self.settings.pool_of(typ) == GLOBAL_POOL or det.totals.get(typ, 0) > 0:
                continue
            how = det.notes.get(typ, f"no {ENV_PREFIX}{typ.upper()} set")
            log.warning("slots: %d task type(s) need %s (%s) but host %s has none [%s]: they wait until a host "
                        "with %s takes them; if this host has some, set %s%s=N", len(names), typ,
                        ", ".join(sorted(names)), self.settings.host, how, typ, ENV_PREFIX, typ.upper())

    def wake_pools(self) -> list[str]:
        """The pools whose woken tasks this worker takes: its host's, and the global one if it has shared types."""
        out = [self.settings.pool]
        if self.settings.scope == "host" and self.settings.shared:
            out.append(GLOBAL_POOL)
        return out

    def start_wakers(self, publish: Callable[[str, str], None]) -> None:
        """One daemon thread per pool of this worker (its main process): it pops the messages the handoff put on the
        pool's wake list and ``publish(pool, message)`` sends each, and it reaps the pool when a lease may have
        expired while requests wait (a killed holder's slots go to the next waiting task within moments of the
        expiry). Any worker of the pool may send any woken task; one that dies with a message popped leaves it to
        the task's fallback retry."""
        if self._wakers or not self.settings.handoff or self.on_loop:
            return
        self._waker_stop.clear()
        for pool in self.wake_pools():
            t = threading.Thread(target=self._wake_loop, args=(pool, publish), name=f"celeryops-slots-waker-{pool}",
                                 daemon=True)
            self._wakers.append(t)
            t.start()

    def stop_wakers(self) -> None:
        """Ask the wakers to stop; a waker blocked on its list ends within WAKE_BLOCK seconds by itself (a daemon
        thread: a stopping worker does not wait for it; a message it pops meanwhile is left to the task's retry)."""
        self._waker_stop.set()
        for t in self._wakers:
            if t is not threading.current_thread():
                t.join(timeout=0.2)
        self._wakers = []

    def _wake_loop(self, pool: str, publish: Callable[[str, str], None]) -> None:
        store = SlotStore(connect(self.redis_url, timeout=WAKE_BLOCK + 3), pool, prefix=self.settings.prefix,
                          hash_tag=self.settings.hash_tag)
        next_tick = 0.0
        while not self._waker_stop.is_set():
            try:
                now = time.monotonic()
                if now >= next_tick:
                    t = store.tick()
                    next_tick = now + (min(WAKE_BLOCK, t.next_expiry_in + 0.002) if t.waiting else WAKE_BLOCK)
                message = store.pop_wake(max(0.01, min(WAKE_BLOCK, next_tick - time.monotonic())))
                if message is not None:
                    try:
                        publish(pool, message)
                    except Exception:  # a lost wake-up: the task's fallback retry still comes
                        log.exception("slots: could not send a woken task of pool %s; its retry will run it", pool)
            except redis.RedisError as exc:
                log.warning("slots: waker of pool %s cannot reach Redis (%s); waiting tasks run at their retry", pool,
                            exc)
                self._waker_stop.wait(1.0)
            except Exception:
                log.exception("slots: waker of pool %s failed", pool)
                self._waker_stop.wait(1.0)
        store.client.close()

    def on_worker_stop(self) -> None:
        """Stop the heartbeat and the wakers and take this worker's contributions out (its running leases, if any,
        are not touched: they end or expire as usual)."""
        self.stop_heartbeat()
        self.stop_wakers()
        if self.detected is None:
            return
        for pool in self.contributions():
            try:
                self.store_for(pool).withdraw(self.settings.host, self.worker_name)
                log.info("slots: host %s's contribution from %s withdrawn from pool %s", self.settings.host,
                         self.worker_name, pool)
            except redis.RedisError as exc:
                log.warning("slots: could not withdraw the contribution of host %s from pool %s (%s); it expires "
                            "within %ss", self.settings.host, pool, exc, self.settings.contribution_ttl)

    def start_heartbeat(self) -> None:
        if self.on_loop:  # the loop beats (slots.loop)
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat, name="celeryops-slots-heartbeat", daemon=True)
            self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _beat(self) -> None:
        interval = self.settings.heartbeat_interval
        while not self._stop.wait(interval):
            try:
                self.heartbeat_once()
            except Exception:  # the heartbeat must survive anything; the next tick tries again
                log.exception("slots: heartbeat failed")

    def heartbeat_once(self) -> None:
        """Renew this worker's contributions and every lease; register ungated holdings (fail-open outage) and
        lost contributions once Redis is back."""
        try:
            for pool, (totals, devices) in self.contributions().items():
                c = self.store_for(pool).contribute(self.settings.host, totals, ttl=self.settings.contribution_ttl,
                                                    worker=self.worker_name, devices=devices)
                if c.status == "new" and pool in self._written:
                    log.warning("slots: the contribution of host %s to pool %s had expired or was lost; added again",
                                self.settings.host, pool)
                self._written.add(pool)
            for h in list(self.holdings.values()):
                if not h.lost:
                    self._renew(h)
        except redis.RedisError as exc:
            log.warning("slots: heartbeat could not reach Redis (%s); leases expire if this lasts a TTL", exc)

    def _renew(self, h: Holding) -> None:
        if h.ungated:
            for pool, part in self.settings.split(h.needs):
                token = self.store_for(pool).adopt(h.task_id, part, ttl=self.settings.lease_ttl, name=h.name,
                                                   worker=h.worker, host=self.settings.host)
                h.parts[pool] = (part, token)
            h.ungated = False
            log.warning("slots: task %s ran ungated during a Redis outage; registered as lease %d", h.task_id, h.token)
            return
        for pool, (part, token) in list(h.parts.items()):
            mine = {t: d for t, d in h.devices.items() if t in part}
            r = self.store_for(pool).renew(h.task_id, token, self.settings.lease_ttl, part, name=h.name,
                                           worker=h.worker, host=self.settings.host, devices=mine)
            if r.status == "restored":
                gone = {t: [d for d in ds if d not in r.devices.get(t, [])] for t, ds in mine.items()}
                gone = {t: ds for t, ds in gone.items() if ds}
                log.warning("slots: Redis had lost lease of task %s in pool %s; registered again%s", h.task_id, pool,
                            f" (devices {gone} were taken by another task meanwhile)" if gone else "")
            elif not r.alive:
                self._lost(h, f"{r.status} in pool {pool}")
                return

    def _lost(self, h: Holding, status: str) -> None:
        h.lost = True
        log.error("slots: LEASE LOST for task %s (%s, %s): its slots may now be used by another task",
                  h.task_id, h.needs, status)
        if self.settings.on_lost == "raise" and self.holdings.get(h.task_id) is h:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(h.thread_id), ctypes.py_object(LeaseLost))

    # -- per task -----------------------------------------------------------------------------------------------
    def acquire(self, task_id: str, needs: Mapping[str, int], *, name: str = "", worker: str = "",
                ticket: str = "", ticket_pool: str = "", park: Callable[[str], Park] | None = None
                ) -> Holding | Dropped | None:
        """The holding (with the devices it was given), or None when the task must wait (busy, impossible, or Redis
        down with fail-closed). All or nothing across pools: a refusal gives back what was taken on the way.
        ``ticket``: this copy's ticket (the handoff), from a wait in ``ticket_pool``; ``park(pool)``: how to wake the
        task when the pool that refuses it frees what it needs. ``Dropped``: another copy of the ticket runs or
        ran: do not run this one."""
        worker = worker or self.worker_name
        holding = Holding(task_id, dict(needs), name, worker, threading.get_ident())
        parts = self.settings.split(needs)
        try:
            if ticket and ticket_pool and ticket_pool not in {pool for pool, _ in parts}:
                # it waited in another host's pool (its retry came here): take it out there, or drop this copy
                why = self.store_for(ticket_pool).unpark(task_id, ticket)
                if why not in ("moved", "gone"):
                    return Dropped(why)
                ticket = ""
            for pool, part in parts:
                store = self.store_for(pool)
                res = store.acquire(task_id, part, ttl=self.settings.lease_ttl, name=name, worker=worker,
                                    host=self.settings.host, starvation_after=self.settings.starvation_after,
                                    wait_ttl=max(3 * self.settings.lease_ttl, 3 * self.settings.retry_countdown + 5),
                                    ticket=ticket if pool == ticket_pool or not ticket_pool else "",
                                    park=park(pool) if park is not None else None)
                if not res.ok:
                    self._give_back(holding)
                    if res.status == "duplicate":
                        return Dropped(res.blocked_type or "")
                    if res.status == "impossible":
                        log.warning("slots: task %s needs %s but pool %s has fewer %s slots in total; it keeps "
                                    "waiting", task_id, dict(needs), pool, res.blocked_type)
                    return None
                holding.parts[pool] = (part, res.token)
                holding.devices.update(res.devices)
        except redis.RedisError as exc:
            self._give_back(holding)
            if not self.settings.fail_open:
                log.warning("slots: Redis unreachable (%s); task %s waits (fail-closed)", exc, task_id)
                return None
            log.warning("slots: Redis unreachable (%s); task %s runs ungated (fail-open, no devices bound), "
                        "registered later", exc, task_id)
            holding = Holding(task_id, dict(needs), name, worker, threading.get_ident(), ungated=True)
        self.holdings[task_id] = holding
        self.start_heartbeat()
        return holding

    def _give_back(self, holding: Holding) -> None:
        """Release the parts of a request taken before one pool refused (best effort: they expire otherwise)."""
        for pool, (_part, token) in holding.parts.items():
            try:
                self.store_for(pool).release(holding.task_id, token, unused=True)
            except redis.RedisError:
                pass
        holding.parts.clear()
        holding.devices.clear()

    def release(self, task_id: str) -> None:
        holding = self.holdings.pop(task_id, None)
        if holding is None or holding.ungated:
            return
        for pool, (_part, token) in holding.parts.items():
            try:
                self.store_for(pool).release(task_id, token)
            except redis.RedisError as exc:
                log.warning("slots: could not release task %s in pool %s (%s); its lease expires within %ss",
                            task_id, pool, exc, self.settings.lease_ttl)

    def check(self, task_id: str) -> None:
        """Cooperative check for long tasks: raise LeaseLost if the heartbeat found the lease gone."""
        h = self.holdings.get(task_id)
        if h is not None and h.lost:
            raise LeaseLost(f"slot lease of task {task_id} was lost")
