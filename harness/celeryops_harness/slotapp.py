"""A Celery app with slot-gated test tasks, for real worker processes in tests, benchmarks and the demo.

Configured from the environment like ``taskapp`` (CELERYOPS_TEST_BROKER, CELERYOPS_TEST_RECORD,
CELERYOPS_TEST_PREFETCH) plus the slots contract (CELERYOPS_SLOTS_*, read by ``install``).
CELERYOPS_TEST_SLOT_COUNTDOWN sets the retry countdown of a task refused for lack of slots; CELERYOPS_TEST_ACKS_LATE=1
turns task_acks_late on.

Every slot task run records, in the record Redis, besides taskapp's ct:run:<id>/ct:starts/ct:finishes:
  ct:slots:running   tasks currently inside their slots (INCR at start, DECR at the end)
  ct:slots:max       the highest ct:slots:running ever seen (set atomically)
  ct:slots:running:<worker> / ct:slots:max:<worker>   the same per worker node name
  ct:slots:order     list of tags in start order
A GPU task (slot_gpu) also records the devices it was given:
  ct:dev:<id>        "<self.slot_devices at start>|<self.slot_devices at the end>" (JSON each)
  ct:gpu:<device>    tasks running on that device now (INCR/DECR); ct:gpu:overlap: the highest ever seen (set
                     atomically: above 1 means two tasks shared a device)
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery, Task

from celeryops import slots
from celeryops_harness.taskapp import HOLD_LIMIT, gate_key, mark_finish, mark_start, record

BROKER = os.environ.get("CELERYOPS_TEST_BROKER", "redis://127.0.0.1:6379/0")

app = Celery("celeryops_slots_testing", broker=BROKER)
app.conf.update(
    task_acks_late=os.environ.get("CELERYOPS_TEST_ACKS_LATE") == "1",
    worker_prefetch_multiplier=int(os.environ.get("CELERYOPS_TEST_PREFETCH", "1")),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_ignore_result=True,
    result_backend=None,
    broker_transport_options={"visibility_timeout": 3600},
)
slots.install(app, retry_countdown=float(os.environ.get("CELERYOPS_TEST_SLOT_COUNTDOWN", "10")))

_MAX = "local r = redis.call('INCR', KEYS[1]) if r > tonumber(redis.call('GET', KEYS[2]) or '0') then " \
       "redis.call('SET', KEYS[2], r) end return r"


def send(task: Any, broker: str, queue: str, *args: Any, **kwargs: Any) -> str:
    """Send one of these tasks to ``queue`` through ``broker``; its id."""
    with task.app.connection_for_write(broker) as conn:
        return str(task.apply_async(args=args, kwargs=kwargs, queue=queue, connection=conn).id)


def _run(task: Task[Any, Any], seconds: float, tag: str, together: int = 0, gate: str | None = None) -> str:
    """Record the run, wait until ``together`` slot tasks run at once (bounded: 60 s), then stay inside the task's
    slots for ``seconds``, or until ``gate`` is released (``taskapp.release``)."""
    r = record()
    mark_start(task)
    me = task.request.hostname or ""
    r.eval(_MAX, 2, "ct:slots:running", "ct:slots:max")
    r.eval(_MAX, 2, f"ct:slots:running:{me}", f"ct:slots:max:{me}")
    r.rpush("ct:slots:order", tag)
    try:
        until = time.monotonic() + 60
        while together and int(r.get("ct:slots:running") or 0) < together and time.monotonic() < until:
            time.sleep(0.02)
        deadline = time.monotonic() + (HOLD_LIMIT if gate else float(seconds))
        while time.monotonic() < deadline and not (gate and r.exists(gate_key(gate))):
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    finally:
        r.decr("ct:slots:running")
        r.decr(f"ct:slots:running:{me}")
    mark_finish(task)
    return tag


@app.task(bind=True, base=slots.SlotTask, slots={"cpu": 2}, name="celeryops.testing.slot_sleep")
def slot_sleep(self: Task[Any, Any], seconds: float = 1.0, tag: str = "") -> str:
    """Holds 2 cpu slots while sleeping."""
    return _run(self, seconds, tag)


@app.task(bind=True, base=slots.SlotTask, slots={"cpu": 2}, name="celeryops.testing.slot_hold")
def slot_hold(self: Task[Any, Any], gate: str, tag: str = "") -> str:
    """Holds 2 cpu slots until the test releases ``gate``."""
    return _run(self, 0.0, tag, gate=gate)


@app.task(bind=True, base=slots.SlotTask, name="celeryops.testing.slot_kw")
def slot_kw(self: Task[Any, Any], seconds: float = 1.0, tag: str = "", resource_type: str = "cpu",
            resource_slots: int = 1, gate: str | None = None) -> str:
    """The seed's way: the needs come from the kwargs resource_type / resource_slots (held until ``gate`` is
    released, if given)."""
    return _run(self, seconds, tag, gate=gate)


@app.task(bind=True, base=slots.SlotTask, slots={"gpu": 1, "cpu": 1}, name="celeryops.testing.slot_gpu")
def slot_gpu(self: slots.SlotTask, seconds: float = 0.3, tag: str = "", together: int = 0,
             gate: str | None = None) -> str:
    """Holds a GPU device (and a cpu slot) while it sleeps; records its devices at the start and at the end (under the
    threads pool other requests of this task object run meanwhile: each must keep its own). ``together``: wait
    until that many slot tasks run at once before sleeping; ``gate``: hold until the test releases it."""
    r = record()
    first = self.slot_devices
    devs = first.get("gpu", [])
    for d in devs:
        r.eval(_MAX, 2, f"ct:gpu:{d}", "ct:gpu:overlap")
    try:
        out = _run(self, seconds, tag, together, gate=gate)
    finally:
        for d in devs:
            r.decr(f"ct:gpu:{d}")
    r.set(f"ct:dev:{self.request.id}", f"{json.dumps(first)}|{json.dumps(self.slot_devices)}")
    return out


@app.task(bind=True, base=slots.SlotTask, name="celeryops.testing.slot_manual")
def slot_manual(self: slots.SlotTask, seconds: float = 0.3, tag: str = "") -> str:
    """The seed's way: the body takes its slot itself (1 cpu) and, like a body whose ``finally`` never ran, never
    gives it back: only ``SlotTask.after_return`` (the safety net) releases it."""
    if slots.runtime(self.app).acquire(self.request.id, {"cpu": 1}, name=self.name,
                                       worker=self.request.hostname or "") is None:
        raise self.retry(countdown=0.3, max_retries=None)
    return _run(self, seconds, tag)
