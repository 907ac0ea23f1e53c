"""The demo's workers: real Celery worker processes that are the instances of the Cloud Run stand-in's service.

:meth:`DemoFleet.launch` is the stand-in's launcher: it starts one worker per instance, with what Cloud Run sets in
a service's instances (``K_SERVICE``, ``K_REVISION``, ``K_CONFIGURATION``) and the image's tag as
``CELERYOPS_VERSION``, alternating between the fenced app and the plain app (the fence plugin on some workers, not
all), and returns once it answers ping. The stand-in decides how many run and when: a deploy starts the new
revision's workers first and takes the old ones away once it is ready (SIGTERM, warm shutdown; SIGKILL 10 s later).
:meth:`DemoFleet.scale_out` is the autoscaler's way in (the service's autoscaling, capped). Each worker runs in its
own process group, registered with the :class:`~celeryops.demo.reaper.Reaper`.
"""

from __future__ import annotations

import contextlib
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
from celeryops.demo.standins import metadata
from celeryops.demo.standins.cloudrun import CloudRunStandIn, InstanceSpec
from celeryops.demo.standins.workers import LaunchedWorkers, WorkerProcess
from celeryops.demo.tasks import QUEUES

FENCED_APP = "celeryops.demo.worker_fenced"
PLAIN_APP = "celeryops.demo.worker_plain"
READY_TIMEOUT = 90.0
EXIT_TIMEOUT = 120.0  # a taken-away worker's warm shutdown (the stand-in SIGKILLs it after 10 s anyway)


class DemoInstance:
    """A worker as the stand-in's instance handle: once it was sent SIGTERM (taken away), it is waited for and
    forgotten by the reaper when it exits."""

    def __init__(self, fleet: DemoFleet, worker: WorkerProcess) -> None:
        self.fleet, self.worker = fleet, worker

    def signal(self, sig: int) -> None:
        self.worker.signal(sig)
        if sig == signal.SIGTERM:
            self.fleet.retire(self.worker)

    def alive(self) -> bool:
        return self.worker.alive()


class DemoFleet(LaunchedWorkers):
    """The running workers. Thread-safe: the autoscaler and the stand-in both change it (``_roster`` guards the
    lists; nothing starts after stop())."""

    def __init__(self, broker: str, *, log_dir: Path, env: Mapping[str, str], reaper: Reaper, cap: int = 3,
                 concurrency: int = 2, all_fenced: bool = False) -> None:
        super().__init__()
        self.broker = broker
        self.all_fenced = all_fenced  # every worker runs the fence plugin (what an overlap deploy requires)
        self.log_dir = log_dir
        self.env = dict(env)
        self.reaper = reaper
        self.cap = cap
        self.concurrency = concurrency
        self.retired: list[WorkerProcess] = []
        self._lock = threading.Lock()  # one scale-out at a time
        self._standin: CloudRunStandIn | None = None
        self._service = ""
        self._control = Celery("celeryops-demo-control", broker=broker, set_as_current=False)

    def attach(self, standin: CloudRunStandIn, service: str) -> DemoFleet:
        """The stand-in service whose instances these workers are (for :meth:`scale_out`)."""
        self._standin, self._service = standin, service
        return self

    # -- the stand-in's launcher ----------------------------------------------------------------------------------

    def launch(self, spec: InstanceSpec) -> DemoInstance:
        """Start the instance ``spec`` as one worker (odd instances fenced, even ones plain; every one fenced with
        ``all_fenced``) and wait until it answers ping; a worker that dies first raises (one line): the stand-in fails
        the revision."""
        fenced = self.all_fenced or spec.number % 2 == 1
        short = spec.revision.split("-")[1] if spec.revision.count("-") >= 2 else spec.revision
        tag = spec.image.rsplit("/", 1)[-1]
        env = {**self.env, "CELERYOPS_DEMO_BROKER": self.broker, **spec.env,
               "CELERYOPS_VERSION": tag.rsplit(":", 1)[-1] if ":" in tag else spec.image}
        meta, default_name = metadata.instance_env(spec.revision)  # each instance's own id, as Cloud Run gives it
        env.update(meta)
        # Fenced: Celery's default node name, the same on every instance as on Cloud Run; the plugin renames it.
        # Plain workers have no plugin to do that: their command names them (-n), as it must on Cloud Run.
        name = None if fenced else f"plain-{spec.number}.rev{short}"
        worker = WorkerProcess(self.broker, app=FENCED_APP if fenced else PLAIN_APP, pool="threads",
                               concurrency=self.concurrency, queues=QUEUES, env=env, log_dir=self.log_dir,
                               name=name, default_name=default_name if fenced else None)
        self._start(worker, spec.revision, "the demo is shutting down")
        self.reaper.track(worker.pid)
        try:
            worker.wait_ready(self._control, timeout=READY_TIMEOUT)
        except RuntimeError as exc:  # it died: say why, in one line
            raise RuntimeError(mask_text(str(exc).splitlines()[0])) from None
        return DemoInstance(self, worker)

    def retire(self, worker: WorkerProcess) -> None:
        """The stand-in took ``worker`` away (SIGTERM sent): wait for its exit on a thread, then forget it."""
        with self._roster:
            if worker in self.retired:
                return
            self.retired.append(worker)

        def wait_exit() -> None:
            assert worker.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(EXIT_TIMEOUT)
            if worker.proc.poll() is not None:
                self.reaper.forget(worker.pid)

        threading.Thread(target=wait_exit, name=f"demo-retire-{worker.pid}", daemon=True).start()

    # -- the fleet now ---------------------------------------------------------------------------------------------

    def live(self) -> list[WorkerProcess]:
        """Workers that run and were not taken away."""
        with self._roster:
            return [w for w in self.workers if w.alive() and w not in self.retired]

    def names(self) -> list[str]:
        return [w.nodename for w in self.live()]

    def scale_out(self) -> WorkerProcess | None:
        """One more instance of the serving revision (the service's autoscaler), unless the cap is reached."""
        with self._lock:
            if self._stopped or self._standin is None or len(self.live()) >= self.cap:
                return None
            started = self._standin.scale_out(self._service)
        handle = started[0].handle if started else None
        return handle.worker if isinstance(handle, DemoInstance) else None

    # -- stopping ----------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill every worker's process group (the demo is over: nothing needs to finish) and wait for them."""
        everyone = self._stop_launching()
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
