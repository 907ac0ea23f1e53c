"""Deploy pause: how long processing stops during a deploy, ``--strategy drain`` (the anchor) vs ``overlap`` (issue 19).

Per strategy, in one run, the same workload on a fresh Cloud Run worker pool of the stand-in (2 instances, each a
real fence-plugin Celery worker, threads pool, concurrency 2, prefetch 1, acks_late off) on a private redis-server:
``--long`` tasks of ``--long-seconds`` s are running on the old revision when the deploy starts, and a steady stream
of short tasks (0.05 s, one every 0.1 s) flows before, during and after it. Then the real ``celeryops deploy
--strategy S --json`` moves the pool to a new revision (drain settings: interval 1 s, streak 2). Measured from the
tasks' own finish records (Redis TIME, same machine): the longest gap between task completions during the deploy
(its start and end count as completions, so a deploy that never completes a task has its whole length as the gap),
the deploy's length (process start to exit), the tasks completed meanwhile; once every task finished: tasks lost
(never ran) and duplicated (ran twice), which must be 0.

Usage: .venv/bin/python bench/bench_deploy_pause.py [--long 2] [--long-seconds 12] [--repeat 1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import redis

from celeryops.demo.standins.cloudrun import CloudRunStandIn, standin_config
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops.demo.standins.workers import CeleryInstances
from celeryops_harness.stream import TaskStream as Producer
from celeryops_harness.taskapp import sleep
from celeryops_harness.workers import wait_for
from common import table

RELEASE = "bench-2"
SHORT_SECONDS, SHORT_EVERY = 0.05, 0.1
TARGET_GAP = 2.0  # overlap's longest gap between completions during the deploy (issue 19)


@dataclass(frozen=True)
class CaseResult:
    strategy: str
    exit_code: int
    length: float  # seconds, deploy process start to exit
    gap: float  # longest gap between completions during the deploy (bounds included)
    gap_at: float  # seconds after the deploy started when that gap began
    completed: int  # tasks that finished during the deploy
    tasks: int
    lost: int
    duplicated: int


def finishes(client: redis.Redis, ids: list[str]) -> dict[str, tuple[int, float | None]]:
    """id -> (runs, finished at) from the task records."""
    pipe = client.pipeline()
    for tid in ids:
        pipe.get(f"ct:runs:{tid}")
        pipe.hget(f"ct:run:{tid}", "finished")
    raw = pipe.execute()
    return {tid: (int(raw[2 * i] or 0), float(raw[2 * i + 1]) if raw[2 * i + 1] else None)
            for i, tid in enumerate(ids)}


def longest_gap(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest gap between consecutive completion times in [start, end], the bounds included; and where it
    began (seconds after ``start``)."""
    points = [start, *sorted(t for t in times if start <= t <= end), end]
    gaps = [(b - a, a - start) for a, b in itertools.pairwise(points)]
    return max(gaps)


def run_case(strategy: str, long_tasks: int, long_seconds: float, root: Path) -> CaseResult:
    work = root / strategy
    work.mkdir(parents=True)
    server = RedisServer().start()
    registry = RegistryStandIn().start()
    queue = f"bench-pause-{strategy}"
    workers = CeleryInstances(server.url, app="celeryops_harness.fenceapp", queues=[queue], log_dir=work,
                              env={"CELERYOPS_TEST_RECORD": server.url, "CELERYOPS_FENCE_INTERVAL": "0.3"})
    standin = CloudRunStandIn(rollout_seconds=0.3, launcher=workers)
    producer: Producer | None = None
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        git = GitFixture(work / "git", branch=RELEASE).create(commits=2, age=timedelta(days=1))
        endpoint = standin.start()
        registry.seed("proj/worker", git.tip(git.remote))
        standin.add_worker_pool("proj", "europe-west1", "worker", f"{registry.host}/proj/worker:old", instances=2)
        (work / "celeryops.toml").write_text(standin_config(
            broker=server.url, endpoint=endpoint, image=f"{registry.host}/proj/worker:{{sha}}",
            kind="cloudrun-worker-pool", interval=1.0, max_wait=300))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERYOPS_") and k != "CELERY_BROKER_URL"}
        env.update(CELERYOPS_STATE_DIR=str(work / "state"), PYTHONUNBUFFERED="1")
        with sleep.app.connection_for_write(server.url) as conn:
            long_ids = [sleep.apply_async(args=(long_seconds, "long"), queue=queue, connection=conn).id
                        for _ in range(long_tasks)]
        wait_for(lambda: all(client.exists(f"ct:run:{t}") for t in long_ids), 60, "the long tasks to start")
        producer = Producer(server.url, queue, sleep, (SHORT_SECONDS, "short"), SHORT_EVERY).start()
        time.sleep(2.0)  # the stream flows before the deploy (part of the workload, not a wait for a condition)
        started = float(client.time()[0]) + client.time()[1] / 1e6
        proc = subprocess.run([sys.executable, "-m", "celeryops", "deploy", RELEASE, "--strategy", strategy, "--yes",
                               "--accept-warnings", "--json", "--repo", str(git.work)], env=env, cwd=work,
                              capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
        ended = float(client.time()[0]) + client.time()[1] / 1e6
        time.sleep(2.0)  # and after it
        producer.stop()
        if proc.returncode != 0:
            last = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")][-1:]
            raise RuntimeError(f"the {strategy} deploy exited {proc.returncode}: {last} {proc.stderr[-2000:]}")
        ids = [*long_ids, *producer.ids]
        wait_for(lambda: all(f is not None for _, f in finishes(client, ids).values()), 120,
                 "every task to finish after the deploy", step=0.5)
        records = finishes(client, ids)
        times = [f for _, f in records.values() if f is not None]
        gap, gap_at = longest_gap(times, started, ended)
        return CaseResult(strategy=strategy, exit_code=proc.returncode, length=ended - started, gap=gap, gap_at=gap_at,
                          completed=sum(1 for t in times if started <= t <= ended), tasks=len(ids),
                          lost=sum(1 for runs, _ in records.values() if runs == 0),
                          duplicated=sum(1 for runs, _ in records.values() if runs > 1))
    finally:
        if producer is not None:
            producer.stop()
        client.close()
        standin.stop()
        workers.stop()
        registry.stop()
        server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--long", type=int, default=2, help="long tasks running when the deploy starts (default 2)")
    ap.add_argument("--long-seconds", type=float, default=12.0, help="their length in seconds (default 12)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of (drain, overlap), in turns (default 1)")
    args = ap.parse_args()
    results: list[CaseResult] = []
    with tempfile.TemporaryDirectory(prefix="celeryops-bench-pause-") as tmp:
        for round_ in range(args.repeat):
            for strategy in ("drain", "overlap"):
                results.append(run_case(strategy, args.long, args.long_seconds, Path(tmp) / f"r{round_}"))
    anchor = {i // 2: r for i, r in enumerate(results) if r.strategy == "drain"}
    rows = []
    for i, r in enumerate(results):
        drain = anchor[i // 2]
        rows.append([f"{r.strategy}" + (" (anchor)" if r.strategy == "drain" else ""), f"{r.length:.1f}",
                     f"{r.gap:.2f} (at +{r.gap_at:.1f} s)", f"{r.gap / drain.gap:.3f}x", r.completed,
                     f"{r.completed / r.length:.1f}", r.tasks, r.lost, r.duplicated])
    print(table(["strategy", "deploy (s)", "longest gap (s)", "gap vs drain", "completed during deploy",
                 "per s", "tasks", "lost", "dup"], rows,
                title=f"worker pool of 2 instances (2 threads each); {args.long} long task(s) of "
                      f"{args.long_seconds:g} s running at the deploy's start, a short task every "
                      f"{SHORT_EVERY:g} s throughout; drain interval 1 s, streak 2"))
    overlap = max(r.gap for r in results if r.strategy == "overlap")
    print(f"\noverlap's longest gap {overlap:.2f} s (target <= {TARGET_GAP:g} s): "
          + ("met" if overlap <= TARGET_GAP else "MISSED"))
    bad = [r for r in results if r.lost or r.duplicated]
    print(f"lost or duplicated tasks: {sum(r.lost + r.duplicated for r in results)} (must be 0): "
          + ("OK" if not bad else "FAIL"))
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
