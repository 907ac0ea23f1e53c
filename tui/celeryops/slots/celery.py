"""Celery integration: ``SlotTask`` (a task base that holds slot leases while it runs) and ``install(app)``.

Use::

    app = Celery(...)
    celeryops.slots.install(app)                      # worker signals: totals at start, reap, heartbeat thread

    @app.task(base=SlotTask, slots={"cpu": 4, "gpu": 1})
    def infer(...): ...

    @app.task(bind=True, base=SlotTask, slots={"gpu": 2})
    def infer(self, ...):
        gpus = self.slot_devices["gpu"]               # [2, 3]: this host's devices, this request's alone

    @app.task(base=SlotTask)                          # or the seed's way, from kwargs
    def process(..., resource_type="cpu", resource_slots=4): ...

A task that cannot get its slots is sent again with a countdown (default 10 s) and the worker moves on; the wait
does not count against ``max_retries`` (the message is re-sent with the same retries), so it never gives up.
Slots are released in ``finally``; ``after_return`` is the safety net (skipping RETRY): it releases whatever the
task's id still holds in this process, such as slots a task body acquired itself through ``runtime(app)`` (the
seed's way) and never gave back. A heartbeat thread renews every lease every TTL/3; a lease found gone (expired and
reaped, or taken) is logged and, with ``on_lost="raise"``, ``LeaseLost`` is raised inside the task's thread.

``self.slot_devices`` is kept on the request (``self.request.slot_devices``), not on the task object: under the
threads pool one task object runs several requests at once, each with its own devices.

Pools: a worker's CPU and GPU slots (every type not declared shared) are its host's: it contributes its host's
totals (detected, or ``CELERYOPS_SLOTS_<TYPE>``) and GPU devices to the pool ``host:<host>`` for
``CELERYOPS_SLOTS_HOST_TTL`` seconds, renewed by the same heartbeat thread (workers sharing a host name count once,
with their largest numbers). Shared types (``CELERYOPS_SLOTS_SHARED``) go to the global pool, whose total is the sum
over the live hosts. A worker that stops takes its contributions out; one that is killed stops renewing and they
expire. Leases are never revoked when a total shrinks: running tasks keep their slots, new acquires see the smaller
total.

Worker-side settings (``CELERYOPS_SLOTS_*``) are described in ``settings.py``; the per-process state (leases held,
heartbeat thread) is ``worker.SlotRuntime``. This module is the Celery glue: the task base, ``install`` and the
process's runtime.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, NoReturn

from celery import Celery, Task, signals, states
from celery.exceptions import Retry

from celeryops.core.instance import connect_rename
from celeryops.slots.detect import DeviceId
from celeryops.slots.settings import ENV_PREFIX, RESERVED, SlotSettings, settings_from_env
from celeryops.slots.store import Scope
from celeryops.slots.worker import Holding, LeaseLost, SlotRuntime

__all__ = ["ENV_PREFIX", "RESERVED", "Holding", "LeaseLost", "SlotRuntime", "SlotSettings", "SlotTask", "SlotsBusy",
           "install", "runtime", "settings_from_env", "slot_task", "static_needs"]


class SlotsBusy(Exception):
    """A slot task called directly or eagerly could not get its slots."""



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
            redis_url: str | None = None, scope: Scope | None = None, shared: Iterable[str] | None = None,
            **options: Any) -> SlotSettings:
    """Configure slots for ``app``'s workers (arguments win over ``CELERYOPS_SLOTS_*``) and connect the signals:
    the host's contributions + reap at worker start (and a warning for task types that need what this host lacks),
    heartbeat thread lifecycle, contributions withdrawn at shutdown. Returns the effective settings."""
    global _settings, _runtime
    settings = settings_from_env(totals=dict(totals or {}), lease_ttl=lease_ttl, redis_url=redis_url, scope=scope,
                                 shared=None if shared is None else list(shared))
    if options:
        settings = replace(settings, **options)
    _settings = settings
    _runtime = None

    def on_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is app:
            rt = runtime(app)
            rt.on_worker_start(str(getattr(sender, "hostname", "") or ""))
            rt.warn_missing(static_needs(app))

    def on_stop(**_: Any) -> None:
        if _runtime is not None and _runtime.pid == os.getpid():
            _runtime.on_worker_stop()

    connect_rename()  # on Cloud Run, celery@localhost becomes celery@<revision>.<instance> (as the fence does)
    uid = f"celeryops.slots.{id(app)}"
    signals.worker_init.connect(on_init, weak=False, dispatch_uid=uid + ".init")
    signals.worker_shutdown.connect(on_stop, weak=False, dispatch_uid=uid + ".shutdown")
    signals.worker_process_shutdown.connect(on_stop, weak=False, dispatch_uid=uid + ".pshutdown")
    return settings


def static_needs(app: Celery) -> dict[str, list[str]]:
    """Resource type -> names of the app's slot tasks that declare it in ``slots=`` (kwargs needs are not known
    before a task runs)."""
    out: dict[str, list[str]] = {}
    for name, task in sorted(app.tasks.items()):
        if isinstance(task, SlotTask):
            for typ, n in (task.slots or {}).items():
                if int(n) > 0:
                    out.setdefault(str(typ).lower(), []).append(name)
    return out


class SlotTask(Task):  # type: ignore[misc]
    """A task that runs only while it holds slot leases (``slots={"cpu": 4}`` or the seed's kwargs);
    ``self.slot_devices`` tells it which devices of its host it was given."""

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
        holding = rt.acquire(lease_id, needs, name=self.name, worker=req.hostname or "")
        if holding is None:
            self._wait_for_slots(rt, needs)
        try:
            # on a request of this call alone (the stack is per thread): Task.__call__ pushes the next one from it
            self.push_request(slot_devices={t: list(d) for t, d in holding.devices.items()})
            try:
                return super().__call__(*args, **kwargs)
            finally:
                self.pop_request()
        finally:
            rt.release(lease_id)

    @property
    def slot_devices(self) -> dict[str, list[DeviceId]]:
        """The devices of this host that the current request holds, per type: ``{"gpu": [2, 3]}`` (a GPU by
        index, a MIG device by UUID); ``{}`` for types without devices, outside a slot task's run, or when the task
        runs ungated (Redis unreachable, fail-open)."""
        devices = getattr(self.request, "slot_devices", None) or {}
        return {t: list(d) for t, d in devices.items()}

    def _wait_for_slots(self, rt: SlotRuntime, needs: Mapping[str, int]) -> NoReturn:
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
