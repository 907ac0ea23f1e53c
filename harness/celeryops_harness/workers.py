"""Real Celery worker processes for tests and benchmarks: the demo's ``WorkerProcess`` with the harness's task app
(``celeryops_harness.taskapp``) as the default app, and :class:`RevisionFleet`: the Cloud Run stand-in's instances
as such workers."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from celeryops.demo.standins.cloudrun import CloudRunStandIn, InstanceSpec
from celeryops.demo.standins.workers import CeleryInstances, control_app, kill_all, wait_for
from celeryops.demo.standins.workers import WorkerProcess as _WorkerProcess

TASK_APP = "celeryops_harness.taskapp"

__all__ = ["TASK_APP", "RevisionFleet", "WorkerProcess", "control_app", "kill_all", "wait_for"]


class WorkerProcess(_WorkerProcess):
    def __init__(self, broker: str, *, app: str = TASK_APP, **kw: Any) -> None:
        super().__init__(broker, app=app, **kw)


class RevisionFleet:
    """The instances of one Cloud Run stand-in service as real workers (the stand-in's launcher: pass the fleet as
    ``launcher``, then :meth:`attach`). Each gets what Cloud Run sets for its revision; ``start(n)`` is the
    service's autoscaler running ``n`` of the serving revision; ``replaced`` is set once a worker of a later
    revision than the first one started."""

    def __init__(self, broker: str, queue: str, log_dir: Path, *, app: str = TASK_APP, record: str = "",
                 env: dict[str, str] | None = None) -> None:
        self.queue = queue
        self.instances = CeleryInstances(broker, app=app, queues=[queue], log_dir=log_dir,
                                         env={"CELERYOPS_TEST_RECORD": record or broker, **(env or {})})
        self.replaced = threading.Event()
        self.first = ""
        self._standin: CloudRunStandIn | None = None
        self._resource = ""

    def attach(self, standin: CloudRunStandIn, resource: str) -> RevisionFleet:
        self._standin, self._resource = standin, resource
        return self

    def __call__(self, spec: InstanceSpec) -> WorkerProcess:
        self.first = self.first or spec.revision
        worker = self.instances(spec)
        if spec.revision != self.first:
            self.replaced.set()
        return worker  # type: ignore[return-value]  # a demo WorkerProcess: the same class without the default app

    @property
    def workers(self) -> list[WorkerProcess]:
        """Every worker started, oldest first."""
        return list(self.instances.workers)  # type: ignore[arg-type]

    def start(self, n: int) -> list[WorkerProcess]:
        """Run ``n`` instances of the serving revision (started ones answer ping); returns those started."""
        assert self._standin is not None, "attach() the fleet to the stand-in first"
        return [i.handle for i in self._standin.scale(self._resource, n)]  # type: ignore[misc]

    def stop(self) -> None:
        self.instances.stop()
