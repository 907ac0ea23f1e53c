"""A Celery app with Celery's own defaults, configured by the environment, for ``celeryops doctor``'s tests: each
finding is caused by real workers started with the settings that cause it.

  CELERYOPS_TEST_BROKER    broker URL;  CELERYOPS_TEST_RECORD  the Redis where ``hold`` waits for its gate
  CELERYOPS_DOCTOR_CONF    JSON object applied to ``app.conf`` (e.g. {"task_acks_late": true}); nothing else is set
  CELERYOPS_DOCTOR_FENCE   "1": install the drain fence plugin (it reports the platform, REMAP_SIGTERM, PID 1, ...),
                           with CELERYOPS_FENCE_REGISTRY_TTL if set
  CELERYOPS_DOCTOR_LATE    "1": also register ``doctor.late_hold``, a task with its own ``acks_late=True``

Tasks: ``doctor.quick`` returns at once; ``doctor.hold`` runs until its gate is released (``gates.release``),
having set ``doctor:started:<task id>`` in the record Redis; ``doctor.late_hold`` (only with
CELERYOPS_DOCTOR_LATE) is ``hold`` with its own ``acks_late=True`` (a task-level option, whatever the app says).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, Task

from celeryops_harness.gates import HOLD_LIMIT, gate_key

BROKER = os.environ.get("CELERYOPS_TEST_BROKER", "redis://127.0.0.1:6379/0")
RECORD = os.environ.get("CELERYOPS_TEST_RECORD") or BROKER

app = Celery("celeryops_doctor_testing", broker=BROKER)
app.conf.update(json.loads(os.environ.get("CELERYOPS_DOCTOR_CONF") or "{}"))

if os.environ.get("CELERYOPS_DOCTOR_FENCE") == "1":
    from celeryops.fence import install

    ttl = os.environ.get("CELERYOPS_FENCE_REGISTRY_TTL")
    install(app, interval=0.5, registry_ttl=float(ttl) if ttl else None)


def started_key(task_id: str) -> str:
    return f"doctor:started:{task_id}"


def _wait(task: Task[Any, Any], gate: str) -> None:
    client = redis.Redis.from_url(RECORD)
    client.set(started_key(str(task.request.id)), 1)
    deadline = time.monotonic() + HOLD_LIMIT
    try:
        while not client.exists(gate_key(gate)) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.close()


@app.task(name="doctor.quick")
def quick() -> str:
    return "ok"


@app.task(bind=True, name="doctor.hold")
def hold(self: Task[Any, Any], gate: str) -> str:
    _wait(self, gate)
    return gate


if os.environ.get("CELERYOPS_DOCTOR_LATE") == "1":

    @app.task(bind=True, name="doctor.late_hold", acks_late=True)
    def late_hold(self: Task[Any, Any], gate: str) -> str:
        _wait(self, gate)
        return gate
