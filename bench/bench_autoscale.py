"""Autoscaling long tasks (issue 36): ``celeryops autoscale`` vs a KEDA/CREMA-like scaler vs a fixed pool at max.

One bursty trace (``celeryops_harness.trace.BurstTrace``: bursts of 30-120 s tasks with idle gaps longer than the
cool-down), played in one run against each scaler in turn, each on a fresh Cloud Run worker pool of the stand-in
whose instances are real fence-plugin Celery workers (threads pool, concurrency 1: one task per instance, as a GPU
pool runs them; prefetch 1, acks_late off, Celery's defaults otherwise) on a private redis-server:

- ``celeryops``: ``celeryops autoscale --json`` (``[autoscale]`` min, max, interval, idle_after), stopped with SIGINT
  at the end of the window;
- ``keda``: ``bench/keda_like.py``: LLEN of the queue, ``ceil(LLEN / 1)`` instances within min and max, scale out
  at once, scale in to the highest count desired over the last ``idle_after`` s, set as the pool's
  ``manual_instance_count`` through the real Cloud Run client, polled at the same interval;
- ``keda-requeue``: the same scaler on workers set up to lose nothing, as Celery's documentation advises for
  containers: late acks with ``task_reject_on_worker_lost``, and ``REMAP_SIGTERM=SIGQUIT`` (Cloud Run's SIGTERM
  starts a cold shutdown, which gives the running and prefetched tasks back to the queue before the SIGKILL): the
  only way a scaler that picks no victim can complete the trace's work;
- ``fixed``: the pool at max instances throughout (no scaler).

The stand-in takes away instances of its choice when a count drops (drawn at random, seeded; SIGTERM, SIGKILL
``grace`` later), as Cloud Run does.

**Every duration is scaled** by ``--scale`` (default 0.2): the tasks (30-120 s become 6-24 s), the gaps, the poll
interval (5 s), the cool-down (60 s), Cloud Run's SIGTERM-to-SIGKILL grace (10 s), the drain poll ([drain] interval,
15 s); a worker's start-up (a few seconds here) is not. The window, the same for every scaler: from the trace's
start to its end (its last task run at once) plus the cool-down and 5 intervals, time to scale back in.

Measured from the tasks' own records (``ct:run:<id>``: sent, started, finished, Redis TIME) and the instances' lives
(from the launcher's start of an instance to its process's exit):

- **killed**: tasks started and never finished (their instance taken away under them: SIGKILL after the grace), or
  started twice; **task-s lost**: the seconds they had run when their instance died;
- **not run**: tasks never started by the end (prefetched by an instance that was SIGKILLed: kombu gives them back
  only after the visibility timeout, 1 h);
- **instance-min**: instance-minutes inside the window (what Cloud Run bills, measured, not scaled back);
- **p95 wait**: send to start, nearest rank, over every task (one never started counts as infinite); and over the
  tasks that started only;
- **completed**: tasks finished inside the window; **inst-s per task-s done**: instance-seconds paid per second of
  task run to completion (1.0 would be an instance busy all its life with work that was kept).

Targets (issue 36): celeryops 0 killed; instance-minutes <= 1.15x the KEDA-like scaler's; p95 wait <= the KEDA-like
scaler's. Same settings for both scalers.

Usage: .venv/bin/python bench/bench_autoscale.py [--scale 0.2] [--seed 1] [--min 0] [--max 4] [--only keda]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from celeryops.demo.standins.cloudrun import CloudRunStandIn, InstanceSpec, standin_config
from celeryops.demo.standins.cloudrun_instances import GRACE_SECONDS
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.demo.standins.workers import CeleryInstances, WorkerProcess
from celeryops_harness.chaos_procs import CliRun
from celeryops_harness.taskapp import records, sleep
from celeryops_harness.trace import BurstTrace, TraceProducer
from celeryops_harness.workers import wait_for
from common import table
from keda_like import KedaLikeScaler

SCALERS = ("celeryops", "keda", "keda-requeue", "fixed")
INTERVAL, IDLE_AFTER, DRAIN_INTERVAL = 5.0, 60.0, 15.0  # seconds before scaling: the autoscaler's defaults
POOL, PROJECT, REGION = "worker", "proj", "europe-west1"
TARGET_MINUTES = 1.15  # celeryops' instance-minutes at most this times the KEDA-like scaler's
# keda-requeue: the KEDA-like scaler on workers set up to lose nothing, as Celery's docs advise for containers: late
# acks (a task cut short is delivered again), and SIGTERM taken as a cold shutdown (REMAP_SIGTERM=SIGQUIT), which
# hands the running and prefetched tasks back to the queue before Cloud Run's SIGKILL.
WORKER_ENV = {"keda-requeue": {"CELERYOPS_TEST_ACKS_LATE": "1", "REMAP_SIGTERM": "SIGQUIT"}}


@dataclass
class Life:
    """One instance: its worker, when the stand-in's launcher started it, when its process was first seen gone."""

    worker: WorkerProcess
    revision: str
    started: float
    ended: float | None = None


class ClockedInstances:
    """The stand-in's launcher (real workers through ``CeleryInstances``) that records every instance's life."""

    def __init__(self, inner: CeleryInstances) -> None:
        self.inner = inner
        self.lives: list[Life] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="instance-clock")
        self._thread.start()

    def __call__(self, spec: InstanceSpec) -> WorkerProcess:
        started = time.time()
        worker = self.inner(spec)
        with self._lock:
            self.lives.append(Life(worker, spec.revision, started))
        return worker

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            self.sweep()

    def sweep(self) -> None:
        now = time.time()
        with self._lock:
            for life in self.lives:
                if life.ended is None and not life.worker.alive():
                    life.ended = now

    def seconds(self, start: float, end: float) -> float:
        """Instance-seconds inside [start, end]."""
        self.sweep()
        with self._lock:
            return sum(max(0.0, min(end, life.ended or end) - max(start, life.started)) for life in self.lives)

    def peak(self) -> int:
        """The most instances alive at once."""
        with self._lock:
            edges = sorted([(life.started, 1) for life in self.lives]
                           + [(life.ended, -1) for life in self.lives if life.ended is not None])
        level = best = 0
        for _, step in edges:
            level += step
            best = max(best, level)
        return best

    def death(self, nodename: str) -> float | None:
        with self._lock:
            return next((life.ended for life in self.lives if life.worker.nodename == nodename), None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.inner.stop()


@dataclass
class CaseResult:
    scaler: str
    tasks: int
    completed: int
    done_seconds: float  # task-seconds of the tasks completed inside the window
    killed: list[str]
    lost_seconds: float
    not_run: int
    instance_seconds: float
    waits: list[float]  # send -> start of every task (inf: never started)
    instances: int  # instances started over the run
    peak: int
    notes: list[str] = field(default_factory=list)

    @property
    def p95(self) -> float:
        ordered = sorted(self.waits)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0

    @property
    def p95_started(self) -> float:
        ordered = sorted(w for w in self.waits if not math.isinf(w))
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else math.inf

    @property
    def median(self) -> float:
        ordered = sorted(self.waits)
        return ordered[len(ordered) // 2] if ordered else 0.0

    @property
    def paid_per_done(self) -> float:
        return self.instance_seconds / self.done_seconds if self.done_seconds else math.inf


def autoscale_table(args: argparse.Namespace, queue: str) -> str:
    return (f"\n[autoscale]\nmin_instances = {args.min}\nmax_instances = {args.max}\n"
            f"interval = {INTERVAL * args.scale:g}\nidle_after = {IDLE_AFTER * args.scale:g}\nqueues = [\"{queue}\"]\n")


class CeleryopsScaler:
    """``celeryops autoscale --json`` as a subprocess in ``work`` (its config written there); SIGINT to stop."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.run = CliRun(["autoscale", "--json"], env, work)
        self.rc: int | None = None

    def stop(self) -> None:
        if self.run.proc.poll() is None:
            self.run.proc.send_signal(signal.SIGINT)
        self.rc = self.run.wait(120)

    @property
    def stderr(self) -> str:
        return self.run.stderr


def run_case(scaler: str, trace: BurstTrace, args: argparse.Namespace, root: Path) -> CaseResult:
    work = root / scaler
    work.mkdir(parents=True)
    server = RedisServer().start()
    queue = f"bench-autoscale-{scaler}"
    clock = ClockedInstances(CeleryInstances(
        server.url, app="celeryops_harness.fenceapp", queues=[queue], log_dir=work,
        env={"CELERYOPS_TEST_RECORD": server.url, "CELERYOPS_FENCE_INTERVAL": "0.3", **WORKER_ENV.get(scaler, {})},
        options=lambda spec: {"concurrency": 1}))
    standin = CloudRunStandIn(rollout_seconds=0.3, launcher=clock, grace=GRACE_SECONDS * args.scale,
                              rng=random.Random(args.seed))
    client = redis.Redis.from_url(server.url, decode_responses=True)
    producer: TraceProducer | None = None
    keda: KedaLikeScaler | None = None
    ours: CeleryopsScaler | None = None
    notes: list[str] = []
    try:
        endpoint = standin.start()
        name = standin.add_worker_pool(PROJECT, REGION, POOL, "img:1",
                                       instances=args.max if scaler == "fixed" else args.min)
        (work / "celeryops.toml").write_text(standin_config(
            broker=server.url, endpoint=endpoint, image="img:{sha}", kind="cloudrun-worker-pool", project=PROJECT,
            region=REGION, resource=POOL, name=POOL, interval=DRAIN_INTERVAL * args.scale, max_wait=600)
            + autoscale_table(args, queue))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERYOPS_") and k != "CELERY_BROKER_URL"}
        env.update(CELERYOPS_STATE_DIR=str(work / "state"), PYTHONUNBUFFERED="1")
        if scaler in ("keda", "keda-requeue"):
            keda = KedaLikeScaler(endpoint, name, server.url, queue, min_instances=args.min,
                                  max_instances=args.max, interval=INTERVAL * args.scale,
                                  cooldown=IDLE_AFTER * args.scale).start()
        elif scaler == "celeryops":
            ours = CeleryopsScaler(work, env)
        producer = TraceProducer(server.url, server.url, queue, sleep, trace).start()
        start = producer.started_at
        window_end = start + trace.length + (IDLE_AFTER + 5 * INTERVAL) * args.scale
        time.sleep(max(0.0, window_end - time.time()))  # the trace plays out (a workload, not a wait for a condition)
        if keda is not None:
            keda.stop()
            notes.append(f"keda: {len(keda.decisions)} looks, {keda.refused} updates refused during a rollout")
        if ours is not None:
            ours.stop()
            if ours.rc != 0:
                raise RuntimeError(f"celeryops autoscale exited {ours.rc}: {ours.stderr.strip()[-1000:]}")
            steps = [e for e in ours.run.events if e.get("event") == "autoscale_step"]
            notes.append(f"celeryops: {sum(1 for e in ours.run.events if e.get('event') == 'autoscale')} looks, "
                         f"cohorts added {sum(1 for e in steps if e.get('step') == 'added')}, removed "
                         f"{sum(1 for e in steps if e.get('step') == 'removed')}, given up "
                         f"{sum(1 for e in steps if e.get('step') == 'given_up')}")
        instance_seconds = clock.seconds(start, window_end)
        ids = list(producer.ids)

        def settled() -> bool:  # every started task finished, or its instance is gone
            return all(r.get("finished") or not r.get("started") or clock.death(r.get("worker", "")) is not None
                       for r in records(client, ids).values())

        try:
            wait_for(settled, 300, "every started task to finish or lose its instance", step=0.5)
        except TimeoutError:
            notes.append("some started tasks neither finished nor lost their instance within 300 s")
        recs = records(client, ids)
        killed = [t for t, r in recs.items() if (r.get("started") and not r.get("finished")) or r["runs"] > 1]
        lost = 0.0
        for tid in killed:
            r = recs[tid]
            died = clock.death(r.get("worker", ""))
            if r.get("started") and not r.get("finished") and died is not None:
                lost += max(0.0, died - float(r["started"]))
        waits = [float(r["started"]) - float(r["sent"]) if r.get("started") else math.inf for r in recs.values()]
        done = [r for r in recs.values() if r.get("finished") and float(r["finished"]) <= window_end]
        return CaseResult(
            scaler=scaler, tasks=len(ids), completed=len(done),
            done_seconds=sum(float(r["finished"]) - float(r["started"]) for r in done),
            killed=killed, lost_seconds=lost, not_run=sum(1 for r in recs.values() if not r.get("started")),
            instance_seconds=instance_seconds, waits=waits, instances=len(clock.lives), peak=clock.peak(),
            notes=notes)
    finally:
        if producer is not None:
            producer.stop()
        if keda is not None:
            keda.stop()
        if ours is not None and ours.rc is None:
            ours.stop()
        client.close()
        standin.stop()
        clock.close()
        server.close()


def wait_text(seconds: float) -> str:
    return "never" if math.isinf(seconds) else f"{seconds:.1f}"


def report(results: list[CaseResult], trace: BurstTrace, args: argparse.Namespace) -> bool:
    """Print the table and the targets; True when celeryops killed nothing (the hard promise)."""
    rows = [[r.scaler, r.tasks, r.completed, len(r.killed), f"{r.lost_seconds:.1f}", r.not_run,
             f"{r.instance_seconds / 60:.2f}", f"{r.paid_per_done:.2f}", wait_text(r.p95), wait_text(r.p95_started),
             wait_text(r.median), r.instances, r.peak]
            for r in results]
    s = args.scale
    print(table(["scaler", "tasks", "completed", "killed", "task-s lost", "not run", "instance-min",
                 "inst-s per task-s done", "p95 wait (s)", "p95 of started", "median wait (s)", "instances started",
                 "peak"], rows,
                title=f"{trace.describe()}, played at scale {s:g}: EVERY DURATION x{s:g} (tasks "
                      f"{30 * s:g}-{120 * s:g} s, grace {GRACE_SECONDS * s:g} s, interval {INTERVAL * s:g} s, "
                      f"idle_after/cooldown {IDLE_AFTER * s:g} s, drain poll {DRAIN_INTERVAL * s:g} s; worker start-up "
                      f"not scaled); worker pool min {args.min} max {args.max}, 1 task per instance"))
    for r in results:
        for note in r.notes:
            print(f"note ({r.scaler}): {note}")
    by = {r.scaler: r for r in results}
    ours = by.get("celeryops")
    if ours is not None:
        print(f"\nceleryops killed {len(ours.killed)} (target 0): " + ("met" if not ours.killed else "MISSED"))
    for name in ("keda", "keda-requeue"):
        keda = by.get(name)
        if ours is None or keda is None or keda.instance_seconds <= 0:
            continue
        share = ours.instance_seconds / keda.instance_seconds
        print(f"celeryops instance-minutes {share:.3f}x {name}'s (target <= {TARGET_MINUTES:g}x): "
              + ("met" if share <= TARGET_MINUTES else "MISSED"))
        # What no scaler that kills nothing can go under: an instance for every second of the work it completes.
        floor = ours.done_seconds / keda.instance_seconds
        if floor > TARGET_MINUTES:
            print(f"  the work alone: celeryops ran {ours.done_seconds / 60:.2f} task-minutes to completion, "
                  f"{floor:.2f}x {name}'s instance-minutes ({name} completed {keda.completed} of {keda.tasks} "
                  f"tasks): no scaler that runs that work can meet {TARGET_MINUTES:g}x")
        print(f"celeryops p95 wait {wait_text(ours.p95)} s vs {name} {wait_text(keda.p95)} s (target <=): "
              + ("met" if ours.p95 <= keda.p95 else "MISSED"))
    return ours is None or not ours.killed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=0.2, help="every duration times this (default 0.2)")
    ap.add_argument("--seed", type=int, default=1, help="the trace's and the stand-in's seed (default 1)")
    ap.add_argument("--min", type=int, default=0, help="min instances (default 0)")
    ap.add_argument("--max", type=int, default=4, help="max instances (default 4)")
    ap.add_argument("--bursts", type=int, default=3, help="bursts in the trace (default 3)")
    ap.add_argument("--only", choices=SCALERS, action="append", default=None, help="run only these scalers")
    args = ap.parse_args()
    trace = BurstTrace.draw(args.seed, args.scale, bursts=args.bursts)
    # SIGTERM unwinds like Ctrl-C, so every worker and redis-server of the run is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    results: list[CaseResult] = []
    with tempfile.TemporaryDirectory(prefix="celeryops-bench-autoscale-") as tmp:
        for scaler in args.only or SCALERS:
            results.append(run_case(scaler, trace, args, Path(tmp)))
            print(f"  {scaler}: done", file=sys.stderr, flush=True)
    if not report(results, trace, args):
        sys.exit(1)


if __name__ == "__main__":
    main()
