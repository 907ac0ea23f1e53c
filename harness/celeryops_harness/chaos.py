"""Randomized chaos trials of ``celeryops deploy`` against real workers (issue 9): the reusable trial runner.

One :class:`ChaosLab` holds what a series of trials shares (a record Redis, a git remote, the registry stand-in, the
Cloud Run stand-in); :meth:`ChaosLab.run` plays one trial, fully determined by its seed (:meth:`TrialPlan.draw`):

1. a private broker ``redis-server`` (with an append-only file, ``appendfsync always``: a real broker keeps its
   queues across a restart, so the "Redis restarts" fault is a crash of a *persistent* broker, not a wipe);
2. two real workers of the old revision (threads pool, ``acks_late=False``, prefetch 1) and recorded tasks with
   known ids, short and medium; more tasks are enqueued while the deploy runs (producers do not stop for a deploy);
3. ``celeryops deploy RELEASE --yes --accept-warnings --json`` as a subprocess, through the Cloud Run stand-in whose
   update hook replaces the workers with workers of the new revision (SIGTERM = warm shutdown, as Cloud Run does);
4. faults at random moments, tied to what the deploy reports (preflight, first poll, drained, deploy stage) plus a
   random delay: a worker scales out; the deploy gets SIGKILL right after a random journal record, or SIGINT; the
   broker crashes and comes back; an old worker is SIGTERMed only after the new revision is up; the rollout fails;
5. the operator's recovery, as a person would do it: when a run is left open (``celeryops status``, read here
   in-process from the journal): wait for the dead owner's lease to expire, ``resume`` (after a SIGKILL before the
   drain finished, half of the time), else ``abort``; when abort answers "leave"/"ask" and the new revision serves,
   ``resume`` as advised, else ``abort --restore``;
6. the fleet is left to finish, then the verdict: every task ran exactly once or is still in the broker's queue
   (``lost`` = ran zero times and is nowhere; ``duplicated`` = ran twice), and every live worker consumes its queue
   (``stranded`` = a live worker that does not).

Used by ``tests/test_chaos.py`` (10 fixed seeds) and ``tools/chaos.py`` (``make chaos``: N trials and the table).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from celeryops.demo.standins.cloudrun import CloudRunStandIn, standin_config
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops.ops.fleetjournal import FleetStore, merge_open
from celeryops.ops.journal import Journal, Run, journal_path
from celeryops.ops.recovery import plan as plan_recovery
from celeryops.ops.runlease import read_lease
from celeryops_harness.chaos_amqp import create_vhost, delete_vhost, queued_ids
from celeryops_harness.workers import WorkerProcess, wait_for

RELEASE = "release-chaos"
PROJECT, REGION = "proj", "europe-west1"
FAULT_KINDS = ("scale_out", "kill", "sigint", "redis_restart", "late_sigterm", "fail_rollout")
#: Drawn apart from FAULT_KINDS (its own random stream, so the seeds above replay the same trials plus this):
#: a worker SIGKILLed before the deploy starts, or while it drains (OOM; Cloud Run's SIGKILL 10 s after SIGTERM).
#: Its pidbox binding stays in Redis: the drain must see it gone by evidence, not time out on it.
WORKER_KILL = "worker_kill"
WORKER_KILL_MOMENTS = ("before", "draining")
#: Journal records the deploy can be SIGKILLed right after (celeryops_harness.killcli).
KILL_POINTS = ("created", "phase:stopping", "intent:cancel_consumers", "phase:draining", "phase:drained",
               "phase:deploying", "intent:deploy_start", "settle:deploy_start", "phase:deployed")
#: Moments a timed fault waits for, as seen in the deploy's --json events.
MOMENTS = ("preflight", "draining", "drained", "deploying")
RESUMABLE = ("preflight", "stopping", "draining")
#: What the trial's workers run: the worker plugin ``celeryops.fence`` (the setup the README recommends for fleets
#: that autoscale), plain Celery workers (``celeryops_harness.taskapp``), or both, alternating.
FLEET_KINDS = ("fenced", "plain", "mixed")
BROKERS = ("redis", "amqp")  # amqp: RabbitMQ (a vhost per trial); the trial's redis-server holds lease and fence
FENCED_APP, PLAIN_APP = "celeryops_harness.fenceapp", "celeryops_harness.taskapp"
CLI = [sys.executable, "-m", "celeryops"]


# -- the plan -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fault:
    """One fault of a trial. ``at``/``delay``: fire ``delay`` s after the deploy reported ``at`` (timed faults);
    ``point``: the journal record a kill follows; ``then``: the operator's first recovery command after a kill."""

    kind: str
    at: str = ""
    delay: float = 0.0
    point: str = ""
    then: str = ""
    downtime: float = 0.0
    lost: bool = False  # a kill that also loses the operator's machine: its state dir is deleted before recovery

    def describe(self) -> str:
        if self.kind == "kill":
            return f"{'lost_machine' if self.lost else 'kill'}@{self.point}->{self.then}"
        if self.kind in ("sigint", "scale_out", "redis_restart"):
            extra = f",down {self.downtime:.1f}s" if self.kind == "redis_restart" else ""
            return f"{self.kind}@{self.at}+{self.delay:.1f}s{extra}"
        if self.kind == "late_sigterm":
            return f"late_sigterm+{self.delay:.1f}s"
        if self.kind == WORKER_KILL:
            return f"{WORKER_KILL}@{self.at}" + (f"+{self.delay:.1f}s" if self.at != "before" else "")
        return self.kind


@dataclass(frozen=True)
class TrialPlan:
    """Everything random about a trial, drawn from its seed alone (the same seed replays the same trial)."""

    seed: int
    early: tuple[float, ...]  # durations of the tasks enqueued before the deploy
    late: tuple[tuple[float, float], ...]  # (seconds after the deploy started, duration) of the others
    faults: tuple[Fault, ...]

    @classmethod
    def draw(cls, seed: int) -> TrialPlan:
        rng = random.Random(seed)

        def duration() -> float:
            return round(rng.uniform(0.1, 0.5) if rng.random() < 0.6 else rng.uniform(1.0, 2.5), 2)

        early = tuple(duration() for _ in range(rng.randint(4, 8)))
        late = tuple((round(rng.uniform(0.0, 6.0), 2), duration()) for _ in range(rng.randint(0, 4)))
        kinds = rng.sample(FAULT_KINDS, rng.choice((1, 1, 2, 2, 3)))
        if "kill" in kinds and "sigint" in kinds:  # one interruption of the deploy process per trial
            kinds.remove(rng.choice(("kill", "sigint")))
        faults = []
        for kind in kinds:
            if kind == "kill":
                faults.append(Fault(kind, point=rng.choice(KILL_POINTS), then=rng.choice(("abort", "resume")),
                                    lost=machine_lost(seed)))
            elif kind in ("sigint", "scale_out", "redis_restart"):
                faults.append(Fault(kind, at=rng.choice(MOMENTS), delay=round(rng.uniform(0.0, 1.5), 2),
                                    downtime=round(rng.uniform(0.2, 1.5), 2) if kind == "redis_restart" else 0.0))
            elif kind == "late_sigterm":
                faults.append(Fault(kind, delay=round(rng.uniform(0.0, 1.5), 2)))
            else:
                faults.append(Fault(kind))
        extra = random.Random(f"{WORKER_KILL}:{seed}")
        if extra.random() < 0.4:
            faults.append(Fault(WORKER_KILL, at=extra.choice(WORKER_KILL_MOMENTS), delay=round(extra.uniform(0, 1), 2)))
        return cls(seed, early, late, tuple(faults))

    def has(self, kind: str) -> Fault | None:
        return next((f for f in self.faults if f.kind == kind), None)


def machine_lost(seed: int) -> bool:
    """Whether a trial's kill also loses the operator's machine with its state dir (the recovery then runs from a
    fresh state dir: a teammate with only the broker). Its own random stream: the seeds' other draws stay as they
    were."""
    return random.Random(f"lost_machine:{seed}").random() < 0.5


# -- the result -----------------------------------------------------------------------------------------------------

@dataclass
class TrialResult:
    seed: int
    faults: list[str]  # the faults that were injected (fired)
    skipped: list[str]  # planned but not reached (the deploy ended first)
    tasks: int = 0
    once: int = 0
    queued: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    stranded: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)  # started on a worker the trial SIGKILLed: cut with it, not lost
    commands: list[tuple[str, int]] = field(default_factory=list)  # (command, exit code) in order
    anomalies: list[str] = field(default_factory=list)  # unexpected exit codes, recovery that needed a retry
    elapsed: float = 0.0
    log_dir: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # seconds spent per step (setup, deploy, ...)
    fleet: str = "fenced"  # what the workers ran (FLEET_KINDS)
    broker: str = "redis"  # BROKERS

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.stranded)

    def line(self) -> str:
        cmds = " ".join(f"{c}={rc}" for c, rc in self.commands)
        verdict = "FAIL" if not self.ok else "ANOM" if self.anomalies else "ok"
        return (f"seed {self.seed:>5}  {verdict:<4}  tasks {self.tasks:>2} once {self.once:>2} queued {self.queued} "
                f"lost {len(self.lost)} dup {len(self.duplicated)} stranded {len(self.stranded)}"
                + (f" cut {len(self.cut)}" if self.cut else "") + "  "
                f"{self.elapsed:5.1f}s  faults [{', '.join(self.faults)}]  {cmds}"
                + (f"  anomalies: {'; '.join(self.anomalies)}" if self.anomalies else ""))


def summary(results: Iterable[TrialResult]) -> str:
    """The table ``make chaos`` prints: one line per trial, then the totals."""
    results = list(results)
    faults: dict[str, int] = {}
    for r in results:
        for f in r.faults:
            kind = f.split("@")[0].split("+")[0]
            faults[kind] = faults.get(kind, 0) + 1
    lines = [r.line() for r in results]
    lines.append("")
    kinds = sorted({r.fleet + ("/amqp" if r.broker == "amqp" else "") for r in results})
    lines.append(f"trials {len(results)}  workers {'/'.join(kinds) or '-'}  faults injected {sum(faults.values())} "
                 f"({', '.join(f'{k} {v}' for k, v in sorted(faults.items()))})")
    lines.append(f"tasks {sum(r.tasks for r in results)}  ran once {sum(r.once for r in results)}  "
                 f"still queued {sum(r.queued for r in results)}  lost {sum(len(r.lost) for r in results)}  "
                 f"duplicated {sum(len(r.duplicated) for r in results)}  "
                 f"stranded workers {sum(len(r.stranded) for r in results)}  "
                 f"anomalies {sum(len(r.anomalies) for r in results)}")
    failing = [str(r.seed) for r in results if not r.ok]
    odd = [str(r.seed) for r in results if r.ok and r.anomalies]
    lines.append(f"failing seeds (lost/duplicated/stranded): {', '.join(failing) if failing else 'none'}")
    lines.append(f"seeds with anomalies (exit codes, recovery dead ends): {', '.join(odd) if odd else 'none'}")
    return "\n".join(lines)


# -- processes ------------------------------------------------------------------------------------------------------

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


def _redis_wrapper(directory: Path) -> str:
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


# -- the lab and the trial ------------------------------------------------------------------------------------------

class ChaosLab:
    """What every trial shares. ``with ChaosLab(root) as lab: lab.run(seed)``."""

    def __init__(self, root: Path, *, keep_logs: bool = False, fleet: str = "fenced", broker: str = "redis") -> None:
        if fleet not in FLEET_KINDS:
            raise ValueError(f"fleet must be one of {', '.join(FLEET_KINDS)}, not {fleet!r}")
        if broker not in BROKERS:
            raise ValueError(f"broker must be one of {', '.join(BROKERS)}, not {broker!r}")
        self.broker = broker
        self.root = Path(root)
        self.keep_logs = keep_logs
        self.fleet = fleet
        self.record = RedisServer()
        self.registry = RegistryStandIn()
        self.standin = CloudRunStandIn(rollout_seconds=0.3, on_update=self._on_update)
        self.git = GitFixture(self.root / "git", branch=RELEASE)
        self.endpoint = ""
        self._hooks: dict[str, Callable[[str, str, str], None]] = {}
        self.results: list[TrialResult] = []

    def __enter__(self) -> ChaosLab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> ChaosLab:
        self.root.mkdir(parents=True, exist_ok=True)
        self.record.start()
        self.git.create(commits=2, age=timedelta(days=1))
        self.registry.start()
        self.registry.seed("proj/worker", self.git.tip(self.git.remote))
        self.endpoint = self.standin.start()
        return self

    def close(self) -> None:
        self.standin.stop()
        self.registry.stop()
        self.record.close()

    def _on_update(self, resource: str, revision: str, image: str) -> None:
        hook = self._hooks.get(resource.rsplit("/", 1)[-1])
        if hook is not None:
            hook(resource, revision, image)

    def run(self, seed: int) -> TrialResult:
        result = Trial(self, TrialPlan.draw(seed)).run()
        self.results.append(result)
        return result


class Trial:
    """One seeded trial (see the module docstring for the steps)."""

    def __init__(self, lab: ChaosLab, plan: TrialPlan) -> None:
        self.lab, self.plan = lab, plan
        self.tag = f"s{plan.seed}-{uuid.uuid4().hex[:6]}"
        self.dir = lab.root / self.tag
        self.dir.mkdir(parents=True)
        self.service = f"worker-{self.tag}"
        self.queue = f"chaos-{self.tag}"
        self.broker = RedisServer(binary=_redis_wrapper(self.dir))
        self.result = TrialResult(seed=plan.seed, faults=[], skipped=[], log_dir=str(self.dir), fleet=lab.fleet,
                                  broker=lab.broker)
        self.amqp = ""  # the trial's RabbitMQ vhost URL (lab.broker == "amqp")
        self.ids: list[str] = []
        self.state = self.dir / "state"  # the operator's state dir (a teammate's after a lost machine)
        self._broker_lock = threading.Lock()  # producers wait while the broker is down (they retry later)
        self._fired: set[int] = set()
        self._timers: list[threading.Timer] = []
        self._deploy: CliRun | None = None
        self._last = 0.0
        self._first_revision = ""
        self._moment = "start"  # the last moment the deploy reported (where a SIGINT lands)
        late = plan.has("late_sigterm")
        self.fleet: TrialFleet | None = None
        self._late = late.delay if late is not None else None

    # -- setup --------------------------------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERYOPS_") and k != "CELERY_BROKER_URL"}
        env.update({"CELERYOPS_STATE_DIR": str(self.state), "CELERYOPS_FLEET": f"chaos-{self.tag}",
                    "CELERYOPS_LEASE_TTL": "2", "CELERYOPS_FENCE_TTL": "6", "PYTHONUNBUFFERED": "1"}, **extra)
        if self.amqp:
            env["CELERYOPS_REDIS_URL"] = self.broker.url
        return env

    def write_config(self) -> None:
        lab = self.lab
        (self.dir / "celeryops.toml").write_text(standin_config(
            broker=self.broker_url, endpoint=lab.endpoint, image=f"{lab.registry.host}/proj/worker:{{sha}}",
            interval=0.3, project=PROJECT, region=REGION, resource=self.service))

    def enqueue(self, duration: float) -> None:
        from celeryops_harness.taskapp import sleep

        tid = str(uuid.uuid4())
        with self._broker_lock:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with sleep.app.connection_for_write(self.broker_url) as conn:
                        sleep.apply_async(args=(duration, tid[:8]), task_id=tid, queue=self.queue, connection=conn,
                                          retry=False)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        self.result.anomalies.append("a producer could not enqueue for 30 s")
                        return
                    time.sleep(0.2)
            self.ids.append(tid)

    # -- faults -------------------------------------------------------------------------------------------------

    def _fire(self, index: int, fault: Fault) -> None:
        if index in self._fired:
            return
        self._fired.add(index)
        assert self.fleet is not None
        if fault.kind == "scale_out":
            self.fleet.scale_out()
        elif fault.kind == "sigint":
            deploy = self._deploy
            if deploy is None or deploy.proc.poll() is not None:
                self.result.skipped.append(fault.describe())
                return
            deploy.proc.send_signal(signal.SIGINT)
            self.result.faults.append(f"{fault.describe()}(in {self._moment})")
            return
        elif fault.kind == WORKER_KILL:
            if not self.fleet.kill_one():
                self.result.skipped.append(fault.describe())
                return
        elif fault.kind == "redis_restart":
            with self._broker_lock:
                self.broker.stop()  # SIGKILL: a crash; the AOF (fsync always) keeps every acknowledged write
                time.sleep(fault.downtime)  # the broker is down for a while (a fault's duration, not a wait)
                self.broker.start(timeout=30)
        self.result.faults.append(fault.describe())

    def _schedule(self, moment: str) -> None:
        for index, fault in enumerate(self.plan.faults):
            if fault.at == moment and index not in self._fired:
                timer = threading.Timer(fault.delay, self._fire, (index, fault))
                timer.daemon = True
                self._timers.append(timer)
                timer.start()

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "stage":
            self._moment = str(event.get("stage"))
        elif kind in ("poll", "drained"):
            self._moment = "draining" if kind == "poll" else "drained"
        if kind == "stage" and event.get("stage") == "preflight":
            self._schedule("preflight")
        elif kind == "poll":
            self._schedule("draining")
        elif kind == "drained":
            self._schedule("drained")
        elif kind == "stage" and event.get("stage") == "deploy":
            self._schedule("deploying")

    # -- the operator -------------------------------------------------------------------------------------------

    def cli(self, *args: str, timeout: float = 120) -> tuple[int, list[dict[str, Any]], str]:
        started = time.monotonic()
        run = CliRun([*args, "--json"], self.env(), self.dir)
        rc = run.wait(timeout)
        self.result.timings[f"{len(self.result.timings)}:{' '.join(args)}"] = round(time.monotonic() - started, 2)
        self.result.commands.append((args[0] + ("+restore" if "--restore" in args else ""), rc))
        return rc, run.events, run.stderr

    def open_run(self) -> Run | None:
        """What ``celeryops status`` shows as the current run, read in-process (a CLI call costs seconds here): the
        local journal's open runs and the ones the fleet's Redis holds (the only ones after a lost machine)."""
        local: list[Run] = []
        if journal_path(self.state).exists():
            with Journal(state_dir=self.state, read_only=True) as journal:
                local = journal.unfinished_runs(f"chaos-{self.tag}")
        client = redis.Redis.from_url(self.broker.url, socket_timeout=5, decode_responses=True)
        try:
            runs, _ended = merge_open(local, FleetStore(client, f"chaos-{self.tag}"))
        except redis.RedisError:
            runs = local
        finally:
            client.close()
        return runs[-1] if runs else None

    def lose_machine(self) -> None:
        """The operator's machine is gone with its state dir: recovery runs from a teammate's fresh state dir."""
        shutil.rmtree(self.state, ignore_errors=True)
        self.state = self.dir / "state-teammate"

    def recover(self, first: str) -> None:
        """Until no run is left open: wait for a dead owner's lease, then resume (once) or abort."""
        resumed = first != "resume"
        for _ in range(4):
            run = self.open_run()
            if run is None:
                return
            wait_for(self._lease_gone_or_orphaned, 60, "the dead deploy's lease to expire", step=0.2)
            if not resumed and run.phase in RESUMABLE:
                resumed = True
                rc, _, err = self.cli("resume")
                # A deploy run resumes through its deploy: a pending failed rollout then exits 6, as a deploy does.
                if rc not in ({0, 6} if self.plan.has("fail_rollout") else {0}):
                    self.result.anomalies.append(f"resume exited {rc}: {err.strip()[-200:]}")
                continue
            rc, events, err = self.cli("abort")
            action = next((e.get("action") for e in events if e.get("event") == "abort"), None)
            if action == "leave" or (action == "ask" and self.new_revision_serves()):
                # The advice: "run `celeryops resume` once the new revision serves". Follow it.
                rc, _, err = self.cli("resume")
                if rc != 0:
                    self.result.anomalies.append(f"recovery advised `celeryops resume` (the new revision serves) "
                                                 f"but resume exited {rc}: {err.strip()[-200:]}")
                    if action == "leave":
                        break  # nothing the operator can run closes it: reported below
                else:
                    action = "resumed"
            if action == "ask":
                rc, events, err = self.cli("abort", "--restore")
            if rc != 0:
                self.result.anomalies.append(f"abort exited {rc}: {err.strip()[-200:]}")
        left = self.open_run()
        if left is not None:
            self.result.anomalies.append(f"run {left.id} left open in phase {left.phase} after the recovery")

    def new_revision_serves(self) -> bool:
        latest = self.lab.standin.resource(self.service).latest_ready_revision
        return bool(latest) and latest != self._first_revision

    def _lease_gone_or_orphaned(self) -> bool:
        client = redis.Redis.from_url(self.broker.url, socket_timeout=3, decode_responses=True)
        try:
            lease = read_lease(client, f"chaos-{self.tag}")
        except redis.RedisError:
            return False
        finally:
            client.close()
        return lease is None or lease.orphaned

    # -- the verdict --------------------------------------------------------------------------------------------

    def consuming(self, workers: list[WorkerProcess]) -> dict[str, set[str]]:
        assert self.fleet is not None
        names = [w.nodename for w in workers]
        try:
            replies = self.fleet.app.control.inspect(destination=names, timeout=3,
                                                     limit=len(names)).active_queues() or {}
        except Exception:
            return {}
        return {w: {q["name"] for q in (qs or [])} for w, qs in replies.items()}

    def stranded(self) -> list[str]:
        assert self.fleet is not None
        leaving = {w.nodename for w in self.fleet.leaving()}
        live = [w for w in self.fleet.alive() if w.nodename not in leaving]
        if not live:
            return []
        seen = self.consuming(live)
        return sorted(w.nodename for w in live if self.queue not in seen.get(w.nodename, set()))

    @property
    def broker_url(self) -> str:
        return self.amqp or self.broker.url

    def in_broker(self) -> set[str]:
        """Task ids still held by the broker: in the queue lists or delivered-but-unacked."""
        if self.amqp:
            return queued_ids(self.amqp, self.queue)
        client = redis.Redis.from_url(self.broker.url, socket_timeout=5)
        found: set[str] = set()
        try:
            for key in client.scan_iter(match=f"{self.queue}*"):
                if client.type(key) == b"list":
                    for raw in client.lrange(key, 0, -1):
                        found.add(json.loads(raw).get("headers", {}).get("id", ""))
            for raw in client.hvals("unacked"):
                found.add(json.loads(raw)[0].get("headers", {}).get("id", ""))
        finally:
            client.close()
        return found

    def unacked(self) -> set[str]:
        """Redis: ids of delivered-but-unacked messages (back in the queue only after the visibility timeout)."""
        client = redis.Redis.from_url(self.broker.url, socket_timeout=5)
        try:
            return {json.loads(raw)[0].get("headers", {}).get("id", "") for raw in client.hvals("unacked")}
        except redis.RedisError:
            return set()
        finally:
            client.close()

    def verdict(self, record: redis.Redis) -> None:
        res = self.result

        def counts() -> dict[str, int]:
            pipe = record.pipeline()
            for tid in self.ids:
                pipe.get(f"ct:runs:{tid}")
            return {tid: int(v or 0) for tid, v in zip(self.ids, pipe.execute(), strict=True)}

        killed = {w.nodename for w in self.fleet.killed} if self.fleet is not None else set()

        def finished_all() -> bool:
            pipe = record.pipeline()
            for tid in self.ids:
                pipe.hmget(f"ct:run:{tid}", "finished", "worker")
            states = pipe.execute()
            if all(done or worker in killed for done, worker in states):
                return True
            # A killed worker's prefetched messages wait out the visibility timeout (Redis): held, not lost.
            stuck = self.unacked() if killed and not self.amqp else set()
            return all(done or worker in killed or tid in stuck
                       for tid, (done, worker) in zip(self.ids, states, strict=True))

        # A worker whose revision was replaced got SIGTERM: it stops answering during its warm shutdown, and it is
        # on its way out, not stranded. Wait for it to exit (a warm shutdown that never ends is a finding).
        assert self.fleet is not None
        fleet = self.fleet
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not fleet.leaving(), 60, "replaced workers to finish their warm shutdown", step=0.2)
        res.anomalies.extend(f"{w.nodename} still alive 60 s after SIGTERM" for w in fleet.leaving())
        # Every other live worker consumes again (judged on one observation, the last one).
        last: list[str] = []

        def none_stranded() -> bool:
            nonlocal last
            last = self.stranded()
            return not last

        with contextlib.suppress(TimeoutError):
            wait_for(none_stranded, 30, "every live worker to consume", step=0.5)
        res.stranded = last
        if not res.stranded:
            with contextlib.suppress(TimeoutError):
                wait_for(finished_all, 60, "every task to finish", step=0.3)
        held = self.in_broker()
        runs = counts()
        res.tasks = len(self.ids)
        res.once = sum(1 for n in runs.values() if n == 1)
        res.duplicated = sorted(t for t, n in runs.items() if n > 1)
        res.queued = sum(1 for t, n in runs.items() if n == 0 and t in held)
        res.lost = sorted(t for t, n in runs.items() if n == 0 and t not in held)
        res.cut = sorted(t for t, n in runs.items() if n == 1 and not record.hget(f"ct:run:{t}", "finished")
                         and record.hget(f"ct:run:{t}", "worker") in killed)

    # -- the whole trial ----------------------------------------------------------------------------------------

    def _mark(self, step: str) -> None:
        now = time.monotonic()
        self.result.timings[step] = round(now - self._last, 2)
        self._last = now

    def run(self) -> TrialResult:
        t0 = self._last = time.monotonic()
        record = redis.Redis.from_url(self.lab.record.url, decode_responses=True)
        try:
            self._run(record)
            self._mark("verdict")
        except Exception as exc:
            self.result.anomalies.append(f"trial error: {type(exc).__name__}: {exc}")
            self.result.stranded = self.result.stranded or ["<trial error>"]
        finally:
            for t in self._timers:
                t.cancel()
            if self.fleet is not None:
                self.fleet.stop()
            self.broker.close()
            if self.amqp:
                delete_vhost(self.amqp)
            record.close()
            self.lab._hooks.pop(self.service, None)
            self._mark("teardown")
            self.result.elapsed = time.monotonic() - t0
            if self.result.ok and not self.result.anomalies and not self.lab.keep_logs:
                shutil.rmtree(self.dir, ignore_errors=True)
        return self.result

    def _run(self, record: redis.Redis) -> None:
        plan, lab = self.plan, self.lab
        self.broker.start(timeout=30)
        if lab.broker == "amqp":
            self.amqp = create_vhost(self.tag)
        self.fleet = TrialFleet(self.broker_url, lab.record.url, self.queue, self.dir, self._late, kind=lab.fleet,
                                fleet=f"chaos-{self.tag}", coord=self.broker.url if self.amqp else "")
        lab.standin.add_service(PROJECT, REGION, self.service, f"{lab.registry.host}/proj/worker:old")
        self._first_revision = lab.standin.revisions(self.service)[0].name
        lab._hooks[self.service] = self.fleet.on_update
        if plan.has("fail_rollout"):
            lab.standin.fail_next_rollout(self.service, "container failed to start: chaos")
            self.result.faults.append("fail_rollout")
        self.write_config()
        self.fleet.start(2, f"{self.service}-00001-old")
        for seconds in plan.early:
            self.enqueue(seconds)
        self._mark("setup")

        before = next((f for f in plan.faults if f.kind == WORKER_KILL and f.at == "before"), None)
        if before is not None:  # killed before the deploy: OOM, or a scale-in SIGKILL; its binding stays
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: any(record.exists(f"ct:run:{t}") for t in self.ids), 10, "a task to start",
                         step=0.1)
            self._fire(plan.faults.index(before), before)
        kill = plan.has("kill")
        producers = [threading.Timer(at, self.enqueue, (seconds,)) for at, seconds in plan.late]
        for p in producers:
            p.daemon = True
            p.start()
        self._deploy = CliRun(["deploy", RELEASE, "--yes", "--accept-warnings", "--json", "--repo",
                               str(lab.git.work)], self.env(), self.dir, self._on_event,
                               kill_after=kill.point if kill is not None else None)
        rc = self._deploy.wait(180)
        self.result.commands.append(("deploy", rc))
        self._mark("deploy")
        # Timed faults whose moment never came still hit the fleet (during the recovery), except a SIGINT.
        for index, fault in enumerate(plan.faults):
            if fault.at and index not in self._fired and fault.kind != "sigint":
                self._fire(index, fault)
        for t in self._timers:
            t.join(30)
        for p in producers:
            p.join(30)
        if kill is not None and rc == -signal.SIGKILL:
            self.result.faults.append(kill.describe())
            if kill.lost:
                self.lose_machine()
        elif kill is not None:
            self.result.skipped.append(kill.describe())
        for fault in plan.faults:
            if fault.kind == "sigint" and fault.describe() not in self.result.faults:
                self.result.skipped.append(fault.describe())
        self._check_exit(rc)
        self._check_interrupted(rc)
        if rc != 0:
            self.recover(kill.then if kill is not None and rc == -signal.SIGKILL else "abort")
        self._mark("recovery")
        self.fleet.settle_timers()
        if self._late is not None and any(u[0].endswith(self.service) for u in lab.standin.updates):
            self.result.faults.append(f"late_sigterm+{self._late:.1f}s")
        self.result.anomalies.extend(self.fleet.errors)
        self.verdict(record)

    def _check_interrupted(self, rc: int) -> None:
        """A deploy stopped by SIGINT applies the recovery rules itself (its last words say so): a run it leaves
        open with consumers that recovery would restore is a broken promise (workers stay stopped)."""
        if rc != 130:
            return
        run = self.open_run()
        if run is not None and run.stopped_consumers() and plan_recovery(run, None).action == "restore":
            self.result.anomalies.append(f"SIGINT in phase {run.phase}: the deploy exited 130 saying the recovery "
                                         "rules were applied, but it left its consumers stopped")

    def _check_exit(self, rc: int) -> None:
        """Exit codes the deploy owes its caller for the faults that hit it (a broker crash may change them)."""
        fired = " ".join(self.result.faults)
        if "redis_restart" in fired:
            return
        # the deploy's own SIGKILL (not worker_kill), with or without its machine
        if any(f.startswith(("kill@", "lost_machine@")) for f in self.result.faults):
            expected = {-signal.SIGKILL}
        elif "sigint" in fired:
            expected = {130, 0, 6}  # the signal may land after the flow finished
        elif "fail_rollout" in fired:
            expected = {6}
        else:
            expected = {0}
        if rc not in expected:
            tail = self._deploy.stderr.strip()[-300:] if self._deploy is not None else ""
            self.result.anomalies.append(f"deploy exited {rc}, expected {sorted(expected)}: {tail}")
