"""Celery integration: ``SlotTask`` (a task base that holds slot leases while it runs) and ``install(app)``.

Use::

    app = Celery(...)
    celeryops.slots.install(app)                      # worker signals: totals at start, reap, heartbeat thread

    @app.task(base=SlotTask, slots={"cpu": 4, "gpu": 1})
    def infer(...): ...

    @app.task(base=SlotTask)                          # or the seed's way, from kwargs
    def process(..., resource_type="cpu", resource_slots=4): ...

A task that cannot get its slots is sent again with a countdown (default 10 s) and the worker moves on; the wait
does not count against ``max_retries`` (the message is re-sent with the same retries), so it never gives up.
Slots are released in ``finally``; ``after_return`` is the safety net (skipping RETRY). A heartbeat thread renews
every lease every TTL/3; a lease found gone (expired and reaped, or taken) is logged and, with ``on_lost="raise"``,
``LeaseLost`` is raised inside the task's thread.

In the global scope a worker does not write the pool's totals: it contributes its host's totals (detected, or
``CELERYOPS_SLOTS_<TYPE>``) for ``CELERYOPS_SLOTS_HOST_TTL`` seconds, renewed by the same heartbeat thread, and the
pool's total is the sum over the live hosts (workers sharing a host name count once). A worker that stops takes its
contribution out; one that is killed stops renewing and its contribution expires. Leases are never revoked when the
total shrinks: running tasks keep their slots, new acquires see the smaller total.

Worker-side settings (``install`` arguments win over the environment, a contract container images rely on):
  CELERYOPS_SLOTS_<TYPE>=N             total of TYPE on this worker (CELERYOPS_SLOTS_CPU=48, CELERYOPS_SLOTS_GPU=2)
  CELERYOPS_SLOTS_LEASE_TTL            lease TTL, seconds (60)
  CELERYOPS_SLOTS_REDIS_URL            Redis holding the pools (default: the broker URL)
  CELERYOPS_SLOTS_SCOPE                global (one pool for the fleet, default) | host (a pool per worker host)
  CELERYOPS_SLOTS_HOST                 this worker's host: the per-host pool, or whose contribution to the global
                                       pool it renews (default: socket.gethostname())
  CELERYOPS_SLOTS_HOST_TTL             seconds a host's contribution to a global pool lasts without renewal
                                       (default: the lease TTL; renewed every third of the shorter of the two)
  CELERYOPS_SLOTS_FAIL                 open (run ungated when Redis is down, default) | closed (wait)
  CELERYOPS_SLOTS_ON_LOST              raise (default) | log
  CELERYOPS_SLOTS_RETRY_COUNTDOWN      seconds before a refused task is tried again (10)
  CELERYOPS_SLOTS_STARVATION_AFTER     seconds a refused request waits before it reserves its slots (60)
  CELERYOPS_SLOTS_DETECT               1 (detect CPU/GPU counts, default) | 0 (only explicit totals)
These names are reserved and cannot be resource types.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import redis
from celery import Celery, Task, signals, states
from celery.exceptions import Retry

from celeryops.slots.detect import detect_totals
from celeryops.slots.store import DEFAULT_PREFIX, GLOBAL_POOL, Scope, SlotStore, connect, host_pool

log = logging.getLogger("celeryops.slots")

ENV_PREFIX = "CELERYOPS_SLOTS_"
RESERVED = frozenset({"LEASE_TTL", "REDIS_URL", "SCOPE", "HOST", "HOST_TTL", "FAIL", "ON_LOST", "RETRY_COUNTDOWN",
                      "STARVATION_AFTER", "DETECT", "HASH_TAG", "PREFIX"})


class LeaseLost(Exception):
    """Raised in a task whose slot lease expired and was reaped (or taken) while it ran."""


class SlotsBusy(Exception):
    """A slot task called directly or eagerly could not get its slots."""


@dataclass(frozen=True)
class SlotSettings:
    redis_url: str | None = None
    lease_ttl: float = 60.0
    totals: dict[str, int] = field(default_factory=dict)
    detect: bool = True
    scope: Scope = "global"
    host: str = field(default_factory=socket.gethostname)
    fail_open: bool = True
    on_lost: Literal["raise", "log"] = "raise"
    retry_countdown: float = 10.0
    starvation_after: float = 60.0
    hash_tag: bool = True
    prefix: str = DEFAULT_PREFIX
    host_ttl: float | None = None  # a host's contribution to a global pool; None: the lease TTL

    @property
    def pool(self) -> str:
        return host_pool(self.host) if self.scope == "host" else GLOBAL_POOL

    @property
    def contribution_ttl(self) -> float:
        return self.host_ttl if self.host_ttl is not None else self.lease_ttl

    @property
    def heartbeat_interval(self) -> float:
        ttl = min(self.lease_ttl, self.contribution_ttl) if self.scope == "global" else self.lease_ttl
        return max(0.05, ttl / 3)

    def worker_totals(self) -> dict[str, int]:
        return detect_totals(self.totals) if self.detect else dict(self.totals)


def settings_from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> SlotSettings:
    """Settings from ``CELERYOPS_SLOTS_*``; keyword overrides (not None) win. ``totals`` overrides merge per type."""
    env = os.environ if env is None else env
    kw: dict[str, Any] = {}
    totals: dict[str, int] = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX):]
        if name in RESERVED or not name:
            continue
        try:
            totals[name.lower()] = int(value)
        except ValueError:
            raise ValueError(f"{key}={value!r}: a slot total must be a whole number") from None
    if "CELERYOPS_SLOTS_LEASE_TTL" in env:
        kw["lease_ttl"] = float(env["CELERYOPS_SLOTS_LEASE_TTL"])
    if env.get("CELERYOPS_SLOTS_HOST_TTL"):
        kw["host_ttl"] = float(env["CELERYOPS_SLOTS_HOST_TTL"])
    if env.get("CELERYOPS_SLOTS_REDIS_URL"):
        kw["redis_url"] = env["CELERYOPS_SLOTS_REDIS_URL"]
    if env.get("CELERYOPS_SLOTS_SCOPE"):
        kw["scope"] = _choice(env["CELERYOPS_SLOTS_SCOPE"], ("global", "host"), "CELERYOPS_SLOTS_SCOPE")
    if env.get("CELERYOPS_SLOTS_HOST"):
        kw["host"] = env["CELERYOPS_SLOTS_HOST"]
    if env.get("CELERYOPS_SLOTS_FAIL"):
        kw["fail_open"] = _choice(env["CELERYOPS_SLOTS_FAIL"], ("open", "closed"), "CELERYOPS_SLOTS_FAIL") == "open"
    if env.get("CELERYOPS_SLOTS_ON_LOST"):
        kw["on_lost"] = _choice(env["CELERYOPS_SLOTS_ON_LOST"], ("raise", "log"), "CELERYOPS_SLOTS_ON_LOST")
    if env.get("CELERYOPS_SLOTS_RETRY_COUNTDOWN"):
        kw["retry_countdown"] = float(env["CELERYOPS_SLOTS_RETRY_COUNTDOWN"])
    if env.get("CELERYOPS_SLOTS_STARVATION_AFTER"):
        kw["starvation_after"] = float(env["CELERYOPS_SLOTS_STARVATION_AFTER"])
    if env.get("CELERYOPS_SLOTS_DETECT"):
        kw["detect"] = env["CELERYOPS_SLOTS_DETECT"] not in ("0", "false", "no")
    extra_totals = overrides.pop("totals", None) or {}
    kw.update({k: v for k, v in overrides.items() if v is not None})
    totals.update({k.lower(): int(v) for k, v in extra_totals.items()})
    return SlotSettings(totals=totals, **kw)


def _choice(value: str, allowed: tuple[str, ...], name: str) -> str:
    v = value.strip().lower()
    if v not in allowed:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(allowed)}")
    return v


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


_settings: SlotSettings | None = None
_runtime: SlotRuntime | None = None
_runtime_lock = threading.Lock()


def runtime(app: Celery) -> SlotRuntime:
    """This process's runtime (a new one after fork: prefork children get their own connection and heartbeat)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None or _runtime.pid != os.getpid():
            settings = _settings or settings_from_env()
            url = settings.redis_url or str(app.connection_for_write().as_uri(include_password=True))
            _runtime = SlotRuntime(settings, url)
        return _runtime


def install(app: Celery, *, totals: Mapping[str, int] | None = None, lease_ttl: float | None = None,
            redis_url: str | None = None, scope: Scope | None = None, **options: Any) -> SlotSettings:
    """Configure slots for ``app``'s workers (arguments win over ``CELERYOPS_SLOTS_*``) and connect the signals:
    totals (or the host's contribution) + reap at worker start, heartbeat thread lifecycle, contribution withdrawn
    at shutdown. Returns the effective settings."""
    global _settings, _runtime
    settings = settings_from_env(totals=dict(totals or {}), lease_ttl=lease_ttl, redis_url=redis_url, scope=scope)
    if options:
        settings = replace(settings, **options)
    _settings = settings
    _runtime = None

    def on_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is app:
            runtime(app).on_worker_start(str(getattr(sender, "hostname", "") or ""))

    def on_stop(**_: Any) -> None:
        if _runtime is not None and _runtime.pid == os.getpid():
            _runtime.on_worker_stop()

    uid = f"celeryops.slots.{id(app)}"
    signals.worker_init.connect(on_init, weak=False, dispatch_uid=uid + ".init")
    signals.worker_shutdown.connect(on_stop, weak=False, dispatch_uid=uid + ".shutdown")
    signals.worker_process_shutdown.connect(on_stop, weak=False, dispatch_uid=uid + ".pshutdown")
    return settings


class SlotTask(Task):  # type: ignore[misc]
    """A task that runs only while it holds slot leases (``slots={"cpu": 4}`` or the seed's kwargs)."""

    slots: Mapping[str, int] | None = None
    slot_retry_countdown: float | None = None

    def slot_needs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, int]:
        rtype, rslots = kwargs.get("resource_type"), kwargs.get("resource_slots")
        if isinstance(rslots, Mapping):
            return {str(k): int(v) for k, v in rslots.items()}
        if rtype:
            return {str(rtype): int(rslots if rslots is not None else 1)}
        return {str(k): int(v) for k, v in (self.slots or {}).items()}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        needs = self.slot_needs(args, kwargs)
        if not needs:
            return super().__call__(*args, **kwargs)
        rt = runtime(self.app)
        req = self.request
        lease_id = req.id or f"direct-{uuid.uuid4()}"  # a task called as a function has no id
        if rt.acquire(lease_id, needs, name=self.name, worker=req.hostname or "") is None:
            self._wait_for_slots(rt, needs)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            rt.release(lease_id)

    def _wait_for_slots(self, rt: SlotRuntime, needs: Mapping[str, int]) -> None:
        req = self.request
        if req.called_directly or req.is_eager:
            raise SlotsBusy(f"no free slots for {dict(needs)} in pool {rt.store.pool}")
        countdown = self.slot_retry_countdown if self.slot_retry_countdown is not None else rt.settings.retry_countdown
        sig = self.signature_from_request(req, countdown=countdown, retries=req.retries)
        sig.apply_async()
        raise Retry(f"waiting for slots {dict(needs)}", when=countdown, sig=sig)

    def check_lease(self) -> None:
        """Call from long-running task code to stop promptly when the lease was lost."""
        runtime(self.app).check(self.request.id)

    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        if status != states.RETRY:
            runtime(self.app).release(task_id)
        super().after_return(status, retval, task_id, args, kwargs, einfo)


def slot_task(app: Celery, slots: Mapping[str, int] | None = None, **options: Any) -> Any:
    """``@slot_task(app, {"cpu": 4})``: the same as ``@app.task(base=SlotTask, slots={"cpu": 4})``."""
    return app.task(base=SlotTask, slots=dict(slots or {}), **options)
