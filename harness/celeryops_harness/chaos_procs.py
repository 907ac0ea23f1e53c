"""The processes of a chaos trial: the CLI as a subprocess (``CliRun``) and the trial's workers (``TrialFleet``).

``TrialFleet`` is what an instance of the trial's Cloud Run stand-in service is (the stand-in's launcher): a real
worker with what Cloud Run sets for its revision. The stand-in starts the new revision's instances first and takes
the old ones away once it is ready (SIGTERM = warm shutdown, SIGKILL 10 s later; ``late_sigterm``: later still).
The faults that hit workers (scale-out through the stand-in's autoscaler, SIGKILL) go through it too.
``aof_redis_server`` makes the trial's broker a *persistent* redis-server, so a broker crash keeps its queues as a
real broker would.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from celeryops.demo.standins import metadata
from celeryops.demo.standins.cloudrun import CloudRunStandIn, InstanceSpec
from celeryops_harness.workers import WorkerProcess

#: What the trial's workers run: the worker plugin ``celeryops.fence`` (the setup the README recommends for fleets
#: that autoscale), plain Celery workers (``celeryops_harness.taskapp``), or both, alternating.
FLEET_KINDS = ("fenced", "plain", "mixed")
FENCED_APP, PLAIN_APP = "celeryops_harness.fenceapp", "celeryops_harness.taskapp"
CLI = [sys.executable, "-m", "celeryops"]
_RECEIVED = re.compile(r"Task [\w.]+\[([0-9a-f-]+)\] received")  # a worker's log: it holds the task


class CliRun:
    """``celeryops ... --json`` as a subprocess; each parsed line is handed to ``on_event`` as it arrives."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path,
                 on_event: Callable[[dict[str, Any]], None] = lambda e: None, kill_after: str | None = None) -> None:
        cmd = [sys.executable, "-m", "celeryops_harness.killcli", kill_after] if kill_after else CLI
        # A command that outlives its wait gets SIGABRT first: the fault handler then writes every thread's stack to
        # its stderr, which the trial reports (where it hung), before the SIGKILL.
        self.proc = subprocess.Popen([*cmd, *args], env={**env, "PYTHONFAULTHANDLER": "1"}, cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True)
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
            self.proc.send_signal(signal.SIGABRT)
            try:
                rc = self.proc.wait(5)
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


class TrialInstance:
    """A worker as the stand-in's instance handle: a SIGTERM from the stand-in (it took the instance away) is
    recorded, so the verdict knows the worker is on its way out, not stranded. A SIGTERM or SIGKILL from the
    stand-in while the worker runs a task of the trial (started there, not finished, in the record Redis) or holds
    one (its log says it received it, and it never started) is recorded in ``fleet.taken_busy``: an instance taken
    away while busy."""

    def __init__(self, fleet: TrialFleet, worker: WorkerProcess) -> None:
        self.fleet, self.worker = fleet, worker

    def signal(self, sig: int) -> None:
        if self.worker.alive():
            running, held = self.fleet.busy_on(self.worker)
            if running or held:
                what = [f"{', '.join(t[:8] for t in ids)} {verb} on it"
                        for ids, verb in ((running, "ran"), (held, "waited")) if ids]
                with self.fleet._lock:
                    self.fleet.taken_busy.append(f"{signal.Signals(sig).name} to {self.worker.nodename} while "
                                                 f"{' and '.join(what)}")
        if sig == signal.SIGTERM:
            with self.fleet._lock:
                self.fleet.terminated.append(self.worker)
        self.worker.signal(sig)

    def alive(self) -> bool:
        return self.worker.alive()


class TrialFleet:
    """The workers of one trial: the launcher of the trial's stand-in service (``attach`` it once the service
    exists). ``kind``: the fence plugin on every worker, none, or alternating."""

    def __init__(self, broker: str, record: str, queue: str, log_dir: Path, *, kind: str = "fenced",
                 fleet: str = "", coord: str = "", events: bool = False,
                 new_env: dict[str, str] | None = None) -> None:
        """``events``: the workers send task events (as under ``-E``: a canary credits outcomes from them).
        ``new_env``: more environment for the instances of every revision after the first (a bad release)."""
        self.broker, self.record, self.queue, self.log_dir = broker, record, queue, log_dir
        self.kind, self.fleet = kind, fleet
        self.events, self.new_env = events, dict(new_env or {})
        self.first = ""  # the first revision an instance was started for
        self.coord = coord  # where the fence lives when the broker is not Redis
        self._serial = itertools.count()
        self.workers: list[WorkerProcess] = []
        self.revision: dict[str, str] = {}
        self.terminated: list[WorkerProcess] = []  # sent SIGTERM by the stand-in: on their way out, not "stranded"
        self.killed: list[WorkerProcess] = []  # SIGKILLed by a worker_kill fault
        self.ids: list[str] = []  # the trial's task ids (the trial shares its list)
        self.taken_busy: list[str] = []  # instances the stand-in signalled while a task ran on them
        self.app = Celery("celeryops_chaos_control", broker=broker, set_as_current=False)
        self.app.conf.broker_connection_retry_on_startup = True
        self.app.conf.broker_connection_timeout = 2
        self.errors: list[str] = []
        self._standin: CloudRunStandIn | None = None
        self._service = ""
        self._lock = threading.Lock()

    def attach(self, standin: CloudRunStandIn, service: str) -> TrialFleet:
        self._standin, self._service = standin, service
        return self

    def __call__(self, spec: InstanceSpec) -> TrialInstance:
        """Start the instance ``spec`` (one worker) and return once it answers ping."""
        self.first = self.first or spec.revision
        worker = self._worker(spec.env, spec.revision).start()
        with self._lock:
            self.workers.append(worker)
            self.revision[worker.nodename] = spec.revision
        worker.wait_ready(self.app, timeout=150)  # a loaded CI machine took over 60 s
        return TrialInstance(self, worker)

    def _worker(self, cloud_run: dict[str, str], revision: str = "") -> WorkerProcess:
        fenced = self.kind == "fenced" or (self.kind == "mixed" and next(self._serial) % 2 == 0)
        env = {"CELERYOPS_TEST_RECORD": self.record, **cloud_run}
        if self.events:
            env["CELERYOPS_TEST_EVENTS"] = "1"
        if revision and revision != self.first:
            env.update(self.new_env)
        if fenced:  # the plugin: the fence lives in the broker Redis; a stopped worker leaves the registry soon
            env.update({"CELERYOPS_FLEET": self.fleet, "CELERYOPS_FENCE_INTERVAL": "0.5",
                        "CELERYOPS_FENCE_REGISTRY_TTL": "4"})
            if self.coord:
                env["CELERYOPS_FENCE_REDIS_URL"] = self.coord
        name: dict[str, str] = {}
        if fenced and cloud_run:  # Celery's default node name, the same on every instance (as on Cloud Run): the
            meta, name["default_name"] = metadata.instance_env(revision)  # plugin makes it unique
            env.update(meta)
        return WorkerProcess(self.broker, app=FENCED_APP if fenced else PLAIN_APP, queues=[self.queue],
                             log_dir=self.log_dir, env=env, **name)

    def busy_on(self, worker: WorkerProcess) -> tuple[list[str], list[str]]:
        """Ids of the trial's tasks that ``worker`` runs (started there, not finished: the record Redis) and holds
        (its log says it received them, and they never started anywhere)."""
        ids = list(self.ids)
        if not ids:
            return [], []
        nodename = worker.nodename
        try:
            received = set(_RECEIVED.findall(worker.log_path.read_text(errors="replace")))
        except OSError:
            received = set()
        client = redis.Redis.from_url(self.record, socket_timeout=5, decode_responses=True)
        try:
            pipe = client.pipeline()
            for tid in ids:
                pipe.hmget(f"ct:run:{tid}", "worker", "started", "finished")
            rows = pipe.execute()
        except redis.RedisError as exc:
            self.errors.append(f"could not read the task records: {exc}")
            return [], []
        finally:
            client.close()
        running = [tid for tid, (ran_on, started, finished) in zip(ids, rows, strict=True)
                   if ran_on == nodename and started and not finished]
        held = [tid for tid, (_, started, _) in zip(ids, rows, strict=True) if tid in received and not started]
        return running, held

    def serving(self) -> list[WorkerProcess]:
        """Live workers the stand-in has not taken away, oldest first."""
        with self._lock:
            gone = set(map(id, self.terminated)) | set(map(id, self.killed))
            return [w for w in self.workers if w.alive() and id(w) not in gone]

    def scale_out(self) -> None:
        """One more instance of the revision that serves now (the service's autoscaler does not know about the
        drain): through the stand-in, which starts it."""
        assert self._standin is not None
        try:
            self._standin.scale_out(self._service)
        except Exception as exc:  # report, never crash the trial thread
            self.errors.append(f"scale-out failed: {exc}")

    def victim(self) -> WorkerProcess | None:
        """The worker a ``worker_kill`` fault SIGKILLs: the oldest live one that serves."""
        serving = self.serving()
        return serving[0] if serving else None

    def kill(self, victim: WorkerProcess) -> str:
        """SIGKILL ``victim`` (OOM: its pidbox binding stays behind in Redis)."""
        with self._lock:
            self.killed.append(victim)
        victim.kill()
        return victim.nodename

    def kill_one(self) -> str:
        """SIGKILL one live worker that serves (``victim``), at once."""
        victim = self.victim()
        return self.kill(victim) if victim is not None else ""

    def leaving(self) -> list[WorkerProcess]:
        """Workers sent SIGTERM (their revision was replaced) that are still in their warm shutdown."""
        with self._lock:
            return [w for w in self.terminated if w.alive()]

    def alive(self) -> list[WorkerProcess]:
        with self._lock:
            return [w for w in self.workers if w.alive()]

    def of_revision(self, revision: str) -> list[WorkerProcess]:
        """Every worker started for ``revision`` (alive or not)."""
        with self._lock:
            return [w for w in self.workers if self.revision.get(w.nodename) == revision]

    def stop(self) -> None:
        """The verdict is in: no need for a graceful stop (SIGKILL every process group at once)."""
        for w in self.workers:
            w.signal(signal.SIGKILL)
        for w in self.workers:
            w.stop(timeout=5)
        self.app.close()
