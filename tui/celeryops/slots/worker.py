"""A worker process's side of the slot leases: ``SlotRuntime`` (its store, the leases it holds, the heartbeat thread).

Celery-free (``celery.py`` wires it to a worker's signals and tasks). Acquire fails open (the task runs ungated,
registered once Redis is back) or closed (it waits), as the settings say. The heartbeat renews this host's
contribution to a global pool and every lease every third of the shorter TTL; a lease found gone (expired and
reaped, or taken) is logged and, with ``on_lost="raise"``, ``LeaseLost`` is raised inside the task's thread.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import redis

from celeryops.slots.settings import SlotSettings
from celeryops.slots.store import SlotStore, connect

log = logging.getLogger("celeryops.slots")


class LeaseLost(Exception):
    """Raised in a task whose slot lease expired and was reaped (or taken) while it ran."""



@dataclass
class Holding:
    task_id: str
    needs: dict[str, int]
    token: int
    name: str
    worker: str
    thread_id: int
    ungated: bool = False
    lost: bool = False


class SlotRuntime:
    """Per-process state of a worker: the store, the leases this process holds, and the heartbeat thread."""

    def __init__(self, settings: SlotSettings, redis_url: str) -> None:
        self.settings = settings
        self.store = SlotStore(connect(redis_url), settings.pool, prefix=settings.prefix, hash_tag=settings.hash_tag)
        self.holdings: dict[str, Holding] = {}
        self.worker_name = ""
        self.totals: dict[str, int] | None = None  # what this process registers (main process of a worker)
        self._totals_written = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.pid = os.getpid()

    # -- worker lifecycle ---------------------------------------------------------------------------------------
    def on_worker_start(self, nodename: str) -> None:
        """Write this worker's totals (per-host pool) or its host's contribution (global pool), and reap what is
        really dead (expired leases and contributions, leases of this node name)."""
        self.worker_name = nodename
        self.totals = self.settings.worker_totals()
        try:
            if self.settings.scope == "global":
                reaped = self.store.contribute(self.settings.host, self.totals, ttl=self.settings.contribution_ttl,
                                               worker=nodename, starting=True).reaped
                log.info("slots: host %s adds %s to pool %s (for %ss, renewed by the heartbeat); reaped %d dead "
                         "lease(s)", self.settings.host, self.totals, self.store.pool,
                         self.settings.contribution_ttl, reaped)
            else:
                reaped = self.store.set_totals(self.totals, reap_worker=nodename)
                log.info("slots: pool %s totals %s; reaped %d dead lease(s)", self.store.pool, self.totals, reaped)
            self._totals_written = True
        except redis.RedisError as exc:
            log.warning("slots: Redis unreachable at worker start (%s); totals will be written when it is back", exc)
        self.start_heartbeat()

    def on_worker_stop(self) -> None:
        """Stop the heartbeat; a worker that registered totals in a global pool takes its contribution out (its
        running leases, if any, are not touched: they end or expire as usual)."""
        self.stop_heartbeat()
        if self.totals is None or self.settings.scope != "global":
            return
        try:
            self.store.withdraw(self.settings.host, self.worker_name)
            log.info("slots: host %s's contribution from %s withdrawn from pool %s", self.settings.host,
                     self.worker_name, self.store.pool)
        except redis.RedisError as exc:
            log.warning("slots: could not withdraw the contribution of host %s (%s); it expires within %ss",
                        self.settings.host, exc, self.settings.contribution_ttl)

    def start_heartbeat(self) -> None:
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
        """Renew this host's contribution (global pool) and every lease; register ungated holdings (fail-open
        outage) and missing totals once Redis is back."""
        try:
            if self.totals is not None and self.settings.scope == "global":
                c = self.store.contribute(self.settings.host, self.totals, ttl=self.settings.contribution_ttl,
                                          worker=self.worker_name)
                if c.status == "new" and self._totals_written:
                    log.warning("slots: the contribution of host %s to pool %s had expired or was lost; added again",
                                self.settings.host, self.store.pool)
                self._totals_written = True
            elif self.totals is not None:
                self.store.set_totals(self.totals, only_missing=self._totals_written)
                self._totals_written = True
            for h in list(self.holdings.values()):
                if h.lost:
                    continue
                if h.ungated:
                    h.token = self.store.adopt(h.task_id, h.needs, ttl=self.settings.lease_ttl, name=h.name,
                                               worker=h.worker, host=self.settings.host)
                    h.ungated = False
                    log.warning("slots: task %s ran ungated during a Redis outage; registered as lease %d",
                                h.task_id, h.token)
                    continue
                r = self.store.renew(h.task_id, h.token, self.settings.lease_ttl, h.needs, name=h.name,
                                     worker=h.worker, host=self.settings.host)
                if r.status == "restored":
                    log.warning("slots: Redis had lost lease of task %s; registered again", h.task_id)
                elif not r.alive:
                    self._lost(h, r.status)
        except redis.RedisError as exc:
            log.warning("slots: heartbeat could not reach Redis (%s); leases expire if this lasts a TTL", exc)

    def _lost(self, h: Holding, status: str) -> None:
        h.lost = True
        log.error("slots: LEASE LOST for task %s (%s, %s): its slots may now be used by another task",
                  h.task_id, h.needs, status)
        if self.settings.on_lost == "raise" and self.holdings.get(h.task_id) is h:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(h.thread_id), ctypes.py_object(LeaseLost))

    # -- per task -----------------------------------------------------------------------------------------------
    def acquire(self, task_id: str, needs: Mapping[str, int], *, name: str = "", worker: str = "") -> Holding | None:
        """The holding, or None when the task must wait (busy, impossible, or Redis down with fail-closed)."""
        worker = worker or self.worker_name
        try:
            res = self.store.acquire(task_id, needs, ttl=self.settings.lease_ttl, name=name, worker=worker,
                                     host=self.settings.host, starvation_after=self.settings.starvation_after,
                                     wait_ttl=max(3 * self.settings.lease_ttl, 3 * self.settings.retry_countdown + 5))
        except redis.RedisError as exc:
            if not self.settings.fail_open:
                log.warning("slots: Redis unreachable (%s); task %s waits (fail-closed)", exc, task_id)
                return None
            log.warning("slots: Redis unreachable (%s); task %s runs ungated (fail-open), registered later",
                        exc, task_id)
            holding = Holding(task_id, dict(needs), 0, name, worker, threading.get_ident(), ungated=True)
        else:
            if not res.ok:
                if res.status == "impossible":
                    log.warning("slots: task %s needs %s but pool %s has fewer %s slots in total; it keeps waiting",
                                task_id, dict(needs), self.store.pool, res.blocked_type)
                return None
            holding = Holding(task_id, dict(needs), res.token, name, worker, threading.get_ident())
        self.holdings[task_id] = holding
        self.start_heartbeat()
        return holding

    def release(self, task_id: str) -> None:
        holding = self.holdings.pop(task_id, None)
        if holding is None or holding.ungated:
            return
        try:
            self.store.release(task_id, holding.token)
        except redis.RedisError as exc:
            log.warning("slots: could not release task %s (%s); its lease expires within %ss",
                        task_id, exc, self.settings.lease_ttl)

    def check(self, task_id: str) -> None:
        """Cooperative check for long tasks: raise LeaseLost if the heartbeat found the lease gone."""
        h = self.holdings.get(task_id)
        if h is not None and h.lost:
            raise LeaseLost(f"slot lease of task {task_id} was lost")

