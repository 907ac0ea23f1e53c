"""Celery integration: ``SlotTask`` (a task base that holds slot leases while it runs) and ``install(app)``.

Use::

    app = Celery(...)
    celeryops.slots.install(app)                      # a consumer bootstep: totals at start, reap, heartbeat

    @app.task(base=SlotTask, slots={"cpu": 4, "gpu": 1})
    def infer(...): ...

    @app.task(bind=True, base=SlotTask, slots={"gpu": 2})
    def infer(self, ...):
        gpus = self.slot_devices["gpu"]               # [2, 3]: this host's devices, this request's alone

    @app.task(base=SlotTask)                          # or the seed's way, from kwargs
    def process(..., resource_type="cpu", resource_slots=4): ...

A task that cannot get its slots never holds a worker process while it waits: it is parked in the pool (its
waiting entry carries the message that wakes it) and sent again with a countdown (default 10 s), and the worker moves
on; the wait does not count against ``max_retries`` (the message is re-sent with the same retries), so it never
gives up. Slots are work-conserving (the handoff): a release, or the reaping of an expired lease, hands the freed
slots to the oldest parked task that now fits, in the same Lua script, and the waker of any worker of the pool
sends that task to the pool's wake queue (``celeryops.slots.<prefix>.<pool>``, which every worker of the pool
consumes) at once. The countdown retry stays as the fallback for a lost wake-up (a worker killed with it, Redis
restarted), spread by +-20 % and doubled at each new wait of the same task, up to 6x. Both copies carry the wait's
ticket (the ``celeryops_slot_ticket`` header): the first to claim the slots runs, the other acknowledges and drops
itself (``Ignore``), so a task runs once. ``CELERYOPS_SLOTS_HANDOFF=0``
turns the handoff off (retries only).
Slots are released in ``finally``; ``after_return`` is the safety net (skipping RETRY): it releases whatever the
task's id still holds in this process, such as slots a task body acquired itself through ``runtime(app)`` (the
seed's way) and never gave back. A heartbeat renews every lease every TTL/3; a lease found gone (expired and
reaped, or taken) is logged and, with ``on_lost="raise"``, ``LeaseLost`` is raised inside the task's thread.

``self.slot_devices`` is kept on the request (``self.request.slot_devices``), not on the task object: under the
threads pool one task object runs several requests at once, each with its own devices.

Pools: a worker's CPU and GPU slots (every type not declared shared) are its host's: it contributes its host's
totals (detected, or ``CELERYOPS_SLOTS_<TYPE>``) and GPU devices to the pool ``host:<host>`` for
``CELERYOPS_SLOTS_HOST_TTL`` seconds, renewed by the same heartbeat (workers sharing a host name count once,
with their largest numbers). Shared types (``CELERYOPS_SLOTS_SHARED``) go to the global pool, whose total is the sum
over the live hosts. A worker that stops takes its contributions out; one that is killed stops renewing and they
expire. Leases are never revoked when a total shrinks: running tasks keep their slots, new acquires see the smaller
total.

The heartbeat and the wakers are threads where no fork follows (a prefork child, where its tasks run, renews their
leases from a thread of its own; a solo or threads worker's process); in the main process of a worker whose pool
forks, the worker's event loop runs them (``loop.py``), so that no thread of ours is alive when the pool forks a
child (``celeryops.core.forking``).

Worker-side settings (``CELERYOPS_SLOTS_*``) are described in ``settings.py``; the per-process state (leases held,
heartbeat) is ``worker.SlotRuntime``. This module is the Celery glue: the task base, ``install`` and the
process's runtime.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from celery import Celery, Task, bootsteps, signals, states
from celery.exceptions import Ignore, Retry
from kombu import serialization

from celeryops.core.forking import pool_forks
from celeryops.core.instance import connect_rename
from celeryops.slots.detect import DeviceId
from celeryops.slots.loop import LoopDriver
from celeryops.slots.settings import ENV_PREFIX, RESERVED, SlotSettings, settings_from_env
from celeryops.slots.store import Park, Scope
from celeryops.slots.worker import Dropped, Holding, LeaseLost, SlotRuntime, claim_window, wake_queue

log = logging.getLogger("celeryops.slots")
TICKET_HEADER = "celeryops_slot_ticket"
POOL_HEADER = "celeryops_slot_pool"
WAITS_HEADER = "celeryops_slot_waits"  # how many times the task was parked: its fallback retry backs off
FALLBACK_BACKOFF_MAX = 6

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
    """Configure slots for ``app``'s workers (arguments win over ``CELERYOPS_SLOTS_*``): a consumer bootstep
    (:class:`WorkerSlots`: the host's contributions + reap at worker start, logged, with a warning for task types
    that need what this host lacks; the heartbeat and the wakers) and the signals that withdraw the contributions
    at shutdown. Returns the effective settings."""
    global _settings, _runtime
    settings = settings_from_env(totals=dict(totals or {}), lease_ttl=lease_ttl, redis_url=redis_url, scope=scope,
                                 shared=None if shared is None else list(shared))
    if options:
        settings = replace(settings, **options)
    _settings = settings
    _runtime = None

    def on_stop(**_: Any) -> None:
        if _runtime is not None and _runtime.pid == os.getpid():
            _runtime.on_worker_stop()

    connect_rename()  # on Cloud Run, celery@localhost becomes celery@<revision>.<instance> (as the fence does)
    uid = f"celeryops.slots.{id(app)}"
    signals.worker_shutdown.connect(on_stop, weak=False, dispatch_uid=uid + ".shutdown")
    signals.worker_process_shutdown.connect(on_stop, weak=False, dispatch_uid=uid + ".pshutdown")
    if not any(isinstance(s, type) and issubclass(s, WorkerSlots) for s in app.steps["consumer"]):
        app.steps["consumer"].add(WorkerSlots)
    return settings


class WorkerSlots(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer bootstep: the slots in the worker's main process. At the first start (logging is set up by then, and
    no task has been fetched yet) the host's contributions and the reap, with what was detected logged; then the
    heartbeat and the wakers: threads where the pool runs tasks in this process (solo, threads), the worker's event
    loop where the pool forks (:mod:`celeryops.slots.loop`: no thread of ours is alive when it forks a child). At
    every start, the worker also consumes the wake queues of its pools (its host's, the global one with shared
    types), where the wakers send the tasks the handoff woke."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.driver: LoopDriver | None = None
        self.began = False

    def start(self, c: Any) -> None:
        app = c.app
        rt = runtime(app)
        if not self.began:
            self.began = True
            if pool_forks(c.pool):
                rt.run_on_loop()
                self.driver = LoopDriver(rt, c.timer, c.hub, lambda pool, message: send_woken(app, message))
            rt.on_worker_start(str(c.hostname or ""))
            rt.warn_missing(static_needs(app))
            rt.start_wakers(lambda pool, message: send_woken(app, message))  # threads: not when the loop runs them
        if self.driver is not None:
            self.driver.start()
        if not rt.settings.handoff:
            return
        for pool in rt.wake_pools():
            name = wake_queue(rt.settings, pool)
            if c.task_consumer is not None and not c.task_consumer.consuming_from(name):
                c.add_task_queue(name)

    def stop(self, c: Any) -> None:
        if self.driver is not None:
            self.driver.stop()

    shutdown = stop


def encode_message(sig: Any, serializer: str) -> str:
    """A signature as the text a parked request keeps (the task's own serializer; binary ones in base64)."""
    ctype, enc, data = serialization.dumps(dict(sig), serializer=serializer)  # type: ignore[no-untyped-call]
    if isinstance(data, bytes):
        return json.dumps([ctype, enc, "b64", base64.b64encode(data).decode()])
    return json.dumps([ctype, enc, "", data])


def send_woken(app: Celery, message: str) -> None:
    """Send a task the handoff woke (its signature names the pool's wake queue, its task id and its ticket)."""
    ctype, enc, how, data = json.loads(message)
    raw: Any = base64.b64decode(data) if how == "b64" else data
    body = serialization.loads(raw, ctype, enc, accept=[ctype])  # type: ignore[no-untyped-call]
    app.signature(body).apply_async()


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
        ticket, ticket_pool = _take_ticket(req)
        waits = _int(_take(req, WAITS_HEADER))
        holding: Holding | Dropped | None = None
        if not ticket or not rt.settings.handoff:  # a woken or retried copy goes straight to the parking acquire
            holding = rt.acquire(lease_id, needs, name=self.name, worker=req.hostname or "", ticket=ticket,
                                 ticket_pool=ticket_pool)
        if holding is None:
            holding = self._wait_for_slots(rt, lease_id, needs, ticket, ticket_pool, waits)
        if isinstance(holding, Dropped):
            log.info("slots: task %s[%s] dropped: another copy of it %s", self.name, lease_id,
                     {"running": "runs", "done": "ran", "stale": "waits under a newer ticket"}.get(holding.why,
                                                                                                    holding.why))
            raise Ignore()
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

    def _wait_for_slots(self, rt: SlotRuntime, lease_id: str, needs: Mapping[str, int],
                        ticket: str, ticket_pool: str, waits: int) -> Holding | Dropped:
        """Park the request (the pool that refuses it keeps the message that wakes it) and send the fallback retry;
        the holding if the parking acquire got the slots after all."""
        req = self.request
        if req.called_directly or req.is_eager:
            raise SlotsBusy(f"no free slots for {dict(needs)} in pool {rt.store.pool}")
        countdown = self.slot_retry_countdown if self.slot_retry_countdown is not None else rt.settings.retry_countdown
        opts: dict[str, Any] = {"retries": req.retries}
        if rt.settings.handoff:
            # the retry is only the fallback of a parked task: spread (so the retries of a backlog do not come all
            # at once and hold the worker's processes just when a woken task needs one) and backed off, up to 6x
            window = min(claim_window(rt.settings), countdown + 5.0)
            countdown *= min(2 ** waits, FALLBACK_BACKOFF_MAX) * random.uniform(0.8, 1.2)
            waits += 1
            new_ticket = uuid.uuid4().hex
            parked_in: list[str] = []

            def park(pool: str) -> Park:
                parked_in[:] = [pool]  # the pool that refuses it keeps it (acquire stops at the first refusal)
                headers = {**(req.headers or {}), TICKET_HEADER: new_ticket, POOL_HEADER: pool,
                           WAITS_HEADER: waits}
                woken = self.signature_from_request(req, queue=wake_queue(rt.settings, pool), headers=headers,
                                                    **opts)
                return Park(new_ticket, encode_message(woken, self.serializer), window)

            holding = rt.acquire(lease_id, needs, name=self.name, worker=req.hostname or "", ticket=ticket,
                                 ticket_pool=ticket_pool, park=park)
            if holding is not None:
                return holding
            if parked_in:
                opts["headers"] = {**(req.headers or {}), TICKET_HEADER: new_ticket, POOL_HEADER: parked_in[0],
                                   WAITS_HEADER: waits}
        sig = self.signature_from_request(req, countdown=countdown, **opts)
        sig.apply_async()
        raise Retry(f"waiting for slots {dict(needs)}", when=countdown, sig=sig)

    def check_lease(self) -> None:
        """Call from long-running task code to stop promptly when the lease was lost."""
        runtime(self.app).check(self.request.id)

    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        if status != states.RETRY:
            runtime(self.app).release(task_id)
        super().after_return(status, retval, task_id, args, kwargs, einfo)


def _take(req: Any, name: str) -> Any:
    """A handoff header, taken off the request: a retry the task body asks for is a new run, not a copy."""
    headers = req.headers if isinstance(req.headers, dict) else {}
    value = headers.pop(name, None) or req.__dict__.get(name)
    req.__dict__.pop(name, None)
    return value


def _take_ticket(req: Any) -> tuple[str, str]:
    """This copy's handoff ticket and the pool it waited in."""
    return str(_take(req, TICKET_HEADER) or ""), str(_take(req, POOL_HEADER) or "")


def _int(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def slot_task(app: Celery, slots: Mapping[str, int] | None = None, **options: Any) -> Any:
    """``@slot_task(app, {"cpu": 4})``: the same as ``@app.task(base=SlotTask, slots={"cpu": 4})``."""
    return app.task(base=SlotTask, slots=dict(slots or {}), **options)
