"""A Celery app with slot-gated test tasks, for real worker processes in tests, benchmarks and the demo.

Configured from the environment like ``taskapp`` (CELERYOPS_TEST_BROKER, CELERYOPS_TEST_RECORD,
CELERYOPS_TEST_PREFETCH) plus the slots contract (CELERYOPS_SLOTS_*, read by ``install``).
CELERYOPS_TEST_SLOT_COUNTDOWN sets the retry countdown of a task refused for lack of slots.

Every slot task run records, in the record Redis, besides taskapp's ct:run:<id>/ct:starts/ct:finishes:
  ct:slots:running   tasks currently inside their slots (INCR at start, DECR at the end)
  ct:slots:max       the highest ct:slots:running ever seen (set atomically)
  ct:slots:order     list of tags in start order
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery, Task

from celeryops import slots
from celeryops_harness.taskapp import HOLD_LIMIT, gate_key, mark_finish, mark_start, record

BROKER = os.environ.get("CELERYOPS_TEST_BROKER", "redis://127.0.0.1:6379/0")

app = Celery("celeryops_slots_testing", broker=BROKER)
app.conf.update(
    task_acks_late=False,
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


def _run(task: Task[Any, Any], seconds: float, tag: str, gate: str | None = None) -> str:
    """Inside the task's slots for ``seconds``, or until ``gate`` is released (``taskapp.release``)."""
    r = record()
    mark_start(task)
    r.eval(_MAX, 2, "ct:slots:running", "ct:slots:max")
    r.rpush("ct:slots:order", tag)
    try:
        deadline = time.monotonic() + (HOLD_LIMIT if gate else float(seconds))
        while time.monotonic() < deadline and not (gate and r.exists(gate_key(gate))):
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    finally:
        r.decr("ct:slots:running")
    mark_finish(task)
    return tag


@app.task(bind=True, base=slots.SlotTask, slots={"cpu": 2}, name="celeryops.testing.slot_sleep")
def slot_sleep(self: Task[Any, Any], seconds: float = 1.0, tag: str = "") -> str:
    """Holds 2 cpu slots while sleeping."""
    return _run(self, seconds, tag)


@app.task(bind=True, base=slots.SlotTask, slots={"cpu": 2}, name="celeryops.testing.slot_hold")
def slot_hold(self: Task[Any, Any], gate: str, tag: str = "") -> str:
    """Holds 2 cpu slots until the test releases ``gate``."""
    return _run(self, 0.0, tag, gate)


@app.task(bind=True, base=slots.SlotTask, name="celeryops.testing.slot_kw")
def slot_kw(self: Task[Any, Any], seconds: float = 1.0, tag: str = "", resource_type: str = "cpu",
            resource_slots: int = 1, gate: str | None = None) -> str:
    """The seed's way: the needs come from the kwargs resource_type / resource_slots (held until ``gate`` is
    released, if given)."""
    return _run(self, seconds, tag, gate)
