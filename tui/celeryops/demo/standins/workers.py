"""Real Celery worker processes for tests, benchmarks and the demo.

A worker is started as ``python -m celery -A <app> worker`` in its own session (so its pool children die with it),
readiness is a condition (it answers ping), never a fixed sleep. :class:`CeleryInstances` makes them the instances
of the Cloud Run stand-in (a launcher: one worker per instance, with what Cloud Run sets for its revision).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from celery import Celery

from celeryops.core.instance import ENV_CACHE
from celeryops.demo.standins import metadata
from celeryops.demo.standins.cloudrun_instances import InstanceSpec


def control_app(broker: str) -> Celery:
    """A Celery app for sending control commands to a test fleet (no tasks of its own)."""
    app = Celery("celeryops_test_control", broker=broker)
    app.conf.broker_connection_retry_on_startup = True
    app.conf.broker_connection_timeout = 2
    return app


def wait_for(cond: Callable[[], object], timeout: float, what: str, step: float = 0.05) -> object:
    """Poll ``cond`` until it returns something truthy; raise TimeoutError naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


class WorkerProcess:
    def __init__(
        self,
        broker: str,
        *,
        app: str,
        pool: str = "threads",
        concurrency: int = 2,
        queues: Sequence[str] = ("celery",),
        name: str | None = None,
        env: dict[str, str] | None = None,
        prefetch: int = 1,
        extra_args: Sequence[str] = (),
        log_dir: Path | None = None,
        default_name: str | None = None,
    ) -> None:
        """``default_name``: start the worker with Celery's default node name (no ``-n``, ``celery@%h`` as on a Cloud
        Run instance) and expect it to answer as ``default_name`` (the name its fence plugin gives it)."""
        self.broker = broker
        self.default_name = default_name is not None
        self.app = app
        self.pool = pool
        self.concurrency = concurrency
        self.queues = list(queues)
        self.nodename = default_name or f"celery@{name or 'w-' + uuid.uuid4().hex[:8]}"
        self.env = dict(env or {})
        self.prefetch = prefetch
        self.extra_args = list(extra_args)
        self.log_path = Path(log_dir or tempfile.gettempdir()) / f"{self.nodename.replace('@', '_')}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", self.app, "worker",
            "-P", self.pool, "-c", str(self.concurrency), *(() if self.default_name else ("-n", self.nodename)),
            "-Q", ",".join(self.queues), "-l", "INFO",
            "--without-heartbeat", "--without-gossip", "--without-mingle",
            *self.extra_args,
        ]

    def start(self) -> WorkerProcess:
        env = {**os.environ, **self.env, "CELERYOPS_TEST_BROKER": self.broker,
               "CELERYOPS_TEST_PREFETCH": str(self.prefetch), "PYTHONUNBUFFERED": "1"}
        env.pop(ENV_CACHE, None)  # a new container: it makes (or reads) its own instance id
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            log.close()
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, control_app: Celery, timeout: float = 30.0) -> WorkerProcess:
        """Wait until the worker answers ping (the consumer is up and the pidbox listens)."""

        def answered() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.nodename} exited with {self.proc.returncode}:\n{self.log()[-2000:]}")
            try:
                replies = control_app.control.ping(destination=[self.nodename], timeout=0.3, limit=1)
            except Exception:  # the broker is (re)starting: not yet
                return False
            return any(self.nodename in r for r in replies or [])

        wait_for(answered, timeout, f"worker {self.nodename} to answer ping")
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 3.0) -> None:
        """Cold shutdown, then SIGKILL of the whole process group. Used at teardown: never waits for tasks."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGQUIT)
                self.proc.wait(timeout=timeout)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)


def kill_all(workers: Sequence[WorkerProcess]) -> None:
    """SIGKILL every worker's process group at once, then reap each (teardown: nothing needs to finish; one at a
    time, a cold shutdown took ~1.5 s a worker)."""
    for worker in workers:
        worker.signal(signal.SIGKILL)
    for worker in workers:
        worker.stop(timeout=5)


class LaunchedWorkers:
    """What a launcher of real workers keeps: the workers it started and the revision each runs (``revision_of``, by
    node name). Thread-safe: ``_roster`` guards both and ``_stopped``, and nothing starts once stopping began."""

    def __init__(self) -> None:
        self.workers: list[WorkerProcess] = []
        self.revision_of: dict[str, str] = {}  # nodename -> revision
        self._roster = threading.Lock()
        self._stopped = False

    def _start(self, worker: WorkerProcess, revision: str, refusal: str) -> None:
        """Start ``worker`` (of ``revision``) and list it; raises RuntimeError(``refusal``) once stopping began."""
        with self._roster:
            if self._stopped:
                raise RuntimeError(refusal)
            worker.start()
            self.workers.append(worker)
            self.revision_of[worker.nodename] = revision

    def _stop_launching(self) -> list[WorkerProcess]:
        """From now on nothing starts; every worker started so far."""
        with self._roster:
            self._stopped = True
            return list(self.workers)


class CeleryInstances(LaunchedWorkers):
    """A Cloud Run stand-in's launcher whose instances are real Celery workers (see
    :mod:`celeryops.demo.standins.cloudrun_instances`): each is started with the environment Cloud Run sets for the
    instance's kind and revision, on top of ``env`` (``options(spec)`` may add WorkerProcess arguments, e.g. another
    app), named ``<revision>.i<number>``, and returned once it answers ping. ``stop()`` kills every one it started.
    ``default_names``: the workers run the fence plugin and keep Celery's default node name (the same on every
    instance, as on Cloud Run); each gets a metadata server stand-in of its own and the name the plugin gives it."""

    def __init__(self, broker: str, *, app: str, queues: Sequence[str] = ("celery",), env: dict[str, str] | None = None,
                 log_dir: Path | None = None, ready_timeout: float = 60.0,
                 options: Callable[[InstanceSpec], dict[str, object]] | None = None,
                 on_start: Callable[[WorkerProcess, InstanceSpec], None] | None = None,
                 default_names: bool = False) -> None:
        super().__init__()
        self.broker = broker
        self.default_names = default_names
        self.app = app
        self.queues = list(queues)
        self.env = dict(env or {})
        self.log_dir = log_dir
        self.ready_timeout = ready_timeout
        self.options = options
        self.on_start = on_start
        self._control = control_app(broker)

    def __call__(self, spec: InstanceSpec) -> WorkerProcess:
        kwargs: dict[str, Any] = {"app": self.app, "queues": self.queues, "log_dir": self.log_dir,
                                  "name": f"{spec.revision}.i{spec.number}"}
        extra = self.options(spec) if self.options is not None else {}
        kwargs.update(extra)
        kwargs["env"] = {**self.env, **dict(kwargs.get("env") or {}), **spec.env}
        if self.default_names and "name" not in extra:
            meta, kwargs["default_name"] = metadata.instance_env(spec.revision)
            kwargs["env"].update(meta)
        worker = WorkerProcess(self.broker, **kwargs)
        self._start(worker, spec.revision, "the instances are being stopped")
        if self.on_start is not None:
            self.on_start(worker, spec)
        worker.wait_ready(self._control, timeout=self.ready_timeout)
        return worker

    def alive(self, revision: str | None = None) -> list[WorkerProcess]:
        """The workers still running (of ``revision`` only, when given)."""
        with self._roster:
            return [w for w in self.workers if w.alive() and revision in (None, self.revision_of[w.nodename])]

    def stop(self) -> None:
        """SIGKILL every worker's process group (teardown: nothing needs to finish) and wait for them."""
        kill_all(self._stop_launching())
        self._control.close()
