"""Real Celery worker processes for tests, benchmarks and the demo.

A worker is started as ``python -m celery -A <app> worker`` in its own session (so its pool children die with it),
readiness is a condition (it answers ping), never a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from celery import Celery


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
    ) -> None:
        self.broker = broker
        self.app = app
        self.pool = pool
        self.concurrency = concurrency
        self.queues = list(queues)
        self.nodename = f"celery@{name or 'w-' + uuid.uuid4().hex[:8]}"
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
            "-P", self.pool, "-c", str(self.concurrency), "-n", self.nodename,
            "-Q", ",".join(self.queues), "-l", "INFO",
            "--without-heartbeat", "--without-gossip", "--without-mingle",
            *self.extra_args,
        ]

    def start(self) -> WorkerProcess:
        env = {**os.environ, **self.env, "CELERYOPS_TEST_BROKER": self.broker,
               "CELERYOPS_TEST_PREFETCH": str(self.prefetch), "PYTHONUNBUFFERED": "1"}
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
