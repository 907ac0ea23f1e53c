"""Real Celery worker processes for tests and benchmarks: the demo's ``WorkerProcess`` with the harness's task app
(``celeryops_harness.taskapp``) as the default app."""

from __future__ import annotations

from typing import Any

from celeryops.demo.standins.workers import WorkerProcess as _WorkerProcess
from celeryops.demo.standins.workers import control_app, wait_for

TASK_APP = "celeryops_harness.taskapp"

__all__ = ["TASK_APP", "WorkerProcess", "control_app", "wait_for"]


class WorkerProcess(_WorkerProcess):
    def __init__(self, broker: str, *, app: str = TASK_APP, **kw: Any) -> None:
        super().__init__(broker, app=app, **kw)
