"""The demo's workers: real Celery worker processes of one "revision", replaced by the Cloud Run stand-in's update.

Workers alternate between the fenced app and the plain app (the fence plugin on some workers, not all). Each runs in
its own process group, registered with the :class:`~celeryops.demo.reaper.Reaper`. :meth:`DemoFleet.on_update` is
the stand-in's hook: it warm-shuts-down the old workers (SIGTERM, as Cloud Run does) and starts the same number of
workers as the new revision (``K_REVISION``), before the revision reports ready.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from celery import Celery

from celeryops.core.masking import mask_text
from celeryops.demo.reaper import Reaper
from celeryops.demo.standins.workers import WorkerProcess
from celeryops.demo.tasks import QUEUES

FENCED_APP = "celeryops.demo.worker_fenced"
PLAIN_APP = "celeryops.demo.worker_plain"
READY_TIMEOUT = 90.0
WARM_SHUTDOWN_TIMEOUT = 120.0


class DemoFleet:
    """The running workers. Thread-safe: the autoscaler and the stand-in's hook both change it."""

    def __init__(self, broker: str, *, log_dir: Path, env: Mapping[str, str], reaper: Reaper, initial: int = 2,
                 cap: int = 3, revision: str = "worker-00001-old", concurrency: int = 2) -> None:
        self.broker = broker
        self.log_dir = log_dir
        self.env = dict(env)
        self.reaper = reaper
        self.initial = initial
        self.cap = max(cap, initial)
        self.revision = revision
        self.version = "old"
        self.concurrency = concurrency
        self.workers: list[WorkerProcess] = []
        self.retired: list[WorkerProcess] = []
        self.replacements = 0
        self._lock = threading.RLock()  # one change of the fleet at a time (scale-out, replacement)
        self._spawn = threading.Lock()  # guards _stopped and the lists: nothing starts after stop()
        self._serial = itertools.count(1)
        self._stopped = False
        self._control = Celery("celeryops-demo-control", broker=broker, set_as_current=False)

    # -- starting ---------------------------------------------------------------------------------------------

    def _new(self, fenced: bool) -> WorkerProcess:
        """Start one worker process (registered at once, so stop() always sees it)."""
        n = next(self._serial)
        short = self.revision.split("-")[1] if self.revision.count("-") >= 2 else self.revision
        name = f"{'fenced' if fenced else 'plain'}-{n}.rev{short}"
        env = {**self.env, "CELERYOPS_DEMO_BROKER": self.broker, "K_REVISION": self.revision,
               "CELERYOPS_VERSION": self.version}
        worker = WorkerProcess(self.broker, app=FENCED_APP if fenced else PLAIN_APP, pool="threads",
                               concurrency=self.concurrency, queues=QUEUES, name=name, env=env,
                               log_dir=self.log_dir)
        with self._spawn:
            if self._stopped:
                raise RuntimeError("the demo is shutting down")
            worker.start()
            self.workers.append(worker)
        self.reaper.track(worker.pid)
        return worker

    def _start(self, count: int) -> list[WorkerProcess]:
        """Start ``count`` workers (fenced first, then alternating) and wait until each answers ping."""
        batch = [self._new(fenced=len(self.live()) % 2 == 0) for _ in range(count)]
        for worker in batch:
            try:
                worker.wait_ready(self._control, timeout=READY_TIMEOUT)
            except RuntimeError as exc:  # it died: say why, in one line
                raise RuntimeError(mask_text(str(exc).splitlines()[0])) from None
        return batch

    def start(self) -> DemoFleet:
        with self._lock:
            self._start(self.initial)
        return self

    def live(self) -> list[WorkerProcess]:
        with self._lock:
            return [w for w in self.workers if w.alive()]

    def names(self) -> list[str]:
        return [w.nodename for w in self.live()]

    def scale_out(self) -> WorkerProcess | None:
        """One more worker of the current revision, unless the cap is reached (or the fleet is being replaced)."""
        with self._lock:
            if self._stopped or len(self.live()) >= self.cap:
                return None
            return self._start(1)[0]

    # -- the Cloud Run stand-in's hook ---------------------------------------------------------------------------

    def on_update(self, resource: str, revision: str, image: str) -> None:
        """Cloud Run replaces the instances: SIGTERM (warm shutdown) to the old ones, then the new revision."""
        with self._lock:
            if self._stopped:
                raise RuntimeError("the demo is shutting down")
            old = self.live()
            for worker in old:
                worker.signal(signal.SIGTERM)
            for worker in old:
                self._wait_exit(worker, WARM_SHUTDOWN_TIMEOUT)
            with self._spawn:
                self.retired.extend(old)
                self.workers = [w for w in self.workers if w not in old]
            self.revision = revision.rsplit("/", 1)[-1]
            self.version = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else image
            self._start(self.initial)
            self.replacements += 1

    def _wait_exit(self, worker: WorkerProcess, timeout: float) -> None:
        assert worker.proc is not None
        try:
            worker.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            worker.kill()
        self.reaper.forget(worker.pid)

    # -- stopping ----------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill every worker's process group (the demo is over: nothing needs to finish) and wait for them."""
        with self._spawn:
            self._stopped = True
            everyone = self.workers + self.retired
        for worker in everyone:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if worker.proc is not None and worker.proc.poll() is None:  # not reaped: the group id is still ours
                    os.killpg(worker.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        for worker in everyone:
            if worker.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.proc.wait(max(0.1, deadline - time.monotonic()))
        self._control.close()
