"""The processes of a chaos trial: the CLI as a subprocess (``CliRun``) and the trial's workers (``TrialFleet``).

``TrialFleet.on_update`` is the Cloud Run stand-in's update hook: it replaces the workers of the revision that
serves with a worker of the new one (SIGTERM = warm shutdown, as Cloud Run does; or, with ``late_sigterm``, only
after the new one is up). The faults that hit workers (scale-out, SIGKILL) go through it too. ``aof_redis_server``
makes the trial's broker a *persistent* redis-server, so a broker crash keeps its queues as a real broker would.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery

from celeryops_harness.workers import WorkerProcess

#: What the trial's workers run: the worker plugin ``celeryops.fence`` (the setup the README recommends for fleets
#: that autoscale), plain Celery workers (``celeryops_harness.taskapp``), or both, alternating.
FLEET_KINDS = ("fenced", "plain", "mixed")
FENCED_APP, PLAIN_APP = "celeryops_harness.fenceapp", "celeryops_harness.taskapp"
CLI = [sys.executable, "-m", "celeryops"]


class CliRun:
    """``celeryops ... --json`` as a subprocess; each parsed line is handed to ``on_event`` as it arrives."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path,
                 on_event: Callable[[dict[str, Any]], None] = lambda e: None, kill_after: str | None = None) -> None:
        cmd = [sys.executable, "-m", "celeryops_harness.killcli", kill_after] if kill_after else CLI
        self.proc = subprocess.Popen([*cmd, *args], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True)
        self.events: list[dict[str, Any]] = []
        self._on_event = on_event
        self._stderr: list[str] = []
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = {"event": "text", "line": line.rstrip()}
            if isinstance(event, dict):
                self.events.append(event)
                self._on_event(event)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self._stderr.extend(self.proc.stderr)

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(10)
        for t in self._threads:
            t.join(10)
        return rc

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)


def aof_redis_server(directory: Path) -> str:
    """A redis-server launcher that turns persistence on (the options after the caller's ones win)."""
    binary = shutil.which("redis-server") or "redis-server"
    path = directory / "redis-server-aof"
    path.write_text(f'#!/bin/sh\nexec {binary} "$@" --appendonly yes --appendfsync always\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


class TrialFleet:
    """The workers of one trial. ``on_update`` is the Cloud Run stand-in's hook: it replaces the current revision's
    workers with one worker of the new revision (SIGTERM first, or, with ``late_sigterm``, after the new one is up)."""

    def __init__(self, broker: str, record: str, queue: str, log_dir: Path, late_sigterm: float | None, *,
                 kind: str = "fenced", fleet: str = "", coord: str = "") -> None:
        self.broker, self.record, self.queue, self.log_dir = broker, record, queue, log_dir
        self.late_sigterm = late_sigterm
        self.kind, self.fleet = kind, fleet
        self.coord = coord  # where the fence lives when the broker is not Redis
        self._serial = itertools.count()
        self.workers: list[WorkerProcess] = []
        self.revision: dict[str, str] = {}
        self.current: list[WorkerProcess] = []  # the workers of the revision that serves
        self.terminated: list[WorkerProcess] = []  # sent SIGTERM: on their way out, not "stranded"
        self.killed: list[WorkerProcess] = []  # SIGKILLed by a worker_kill fault
        self.app = Celery("celeryops_chaos_control", broker=broker, set_as_current=False)
        self.app.conf.broker_connection_retry_on_startup = True
        self.app.conf.broker_connection_timeout = 2
        self.errors: list[str] = []
        self._timers: list[threading.Timer] = []
        self._lock = threading.Lock()

    def start(self, n: int, revision: str, wait: bool = True) -> list[WorkerProcess]:
        batch = [self._worker(revision).start() for _ in range(n)]
        with self._lock:
            self.workers.extend(batch)
            self.current.extend(batch)
            self.revision.update({w.nodename: revision for w in batch})
        if wait:
            for w in batch:
                w.wait_ready(self.app, timeout=60)
        return batch

    def _worker(self, revision: str) -> WorkerProcess:
        fenced = self.kind == "fenced" or (self.kind == "mixed" and next(self._serial) % 2 == 0)
        env = {"CELERYOPS_TEST_RECORD": self.record, "K_REVISION": revision}
        if fenced:  # the plugin: the fence lives in the broker Redis; a stopped worker leaves the registry soon
            env.update({"CELERYOPS_FLEET": self.fleet, "CELERYOPS_FENCE_INTERVAL": "0.5",
                        "CELERYOPS_FENCE_REGISTRY_TTL": "4"})
            if self.coord:
                env["CELERYOPS_FENCE_REDIS_URL"] = self.coord
        return WorkerProcess(self.broker, app=FENCED_APP if fenced else PLAIN_APP, queues=[self.queue],
                             log_dir=self.log_dir, env=env)

    def scale_out(self) -> None:
        """One more worker of the revision that serves now (an autoscaler does not know about the drain)."""
        with self._lock:
            revision = self.revision[self.current[0].nodename] if self.current else "unknown"
        try:
            self.start(1, revision, wait=False)
        except Exception as exc:  # report, never crash the trial thread
            self.errors.append(f"scale-out failed: {exc}")

    def kill_one(self) -> str:
        """SIGKILL one live worker of the revision that serves (its pidbox binding stays behind in Redis)."""
        with self._lock:
            victims = [w for w in self.current if w.alive()]
            if not victims:
                return ""
            victim = victims[0]
            self.killed.append(victim)
        victim.kill()
        return victim.nodename

    def on_update(self, resource: str, revision: str, image: str) -> None:
        revision = revision.rsplit("/", 1)[-1]  # K_REVISION is the short name on Cloud Run
        with self._lock:
            old, self.current = list(self.current), []
        if self.late_sigterm is None:
            self._terminate(old)
            for w in old:
                with contextlib.suppress(subprocess.TimeoutExpired, AssertionError):
                    assert w.proc is not None
                    w.proc.wait(60)
            self.start(1, revision)
            return
        self.start(1, revision)  # the new revision is up; the old instances get SIGTERM a little later
        timer = threading.Timer(self.late_sigterm, self._terminate, (old,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _terminate(self, workers: list[WorkerProcess]) -> None:
        with self._lock:
            self.terminated.extend(workers)
        for w in workers:
            w.signal(signal.SIGTERM)

    def leaving(self) -> list[WorkerProcess]:
        """Workers sent SIGTERM (their revision was replaced) that are still in their warm shutdown."""
        with self._lock:
            return [w for w in self.terminated if w.alive()]

    def settle_timers(self) -> None:
        for t in self._timers:
            t.join(30)

    def alive(self) -> list[WorkerProcess]:
        with self._lock:
            return [w for w in self.workers if w.alive()]

    def stop(self) -> None:
        """The verdict is in: no need for a graceful stop (SIGKILL every process group at once)."""
        for t in self._timers:
            t.cancel()
        for w in self.workers:
            w.signal(signal.SIGKILL)
        for w in self.workers:
            w.stop(timeout=5)
        self.app.close()

