"""Canary vs overlap on a bad release (issue 28): how many tasks the bad release fails before it is stopped, how long
the verdict takes, and whether processing ever pauses.

Per strategy, in one run, the same workload on a fresh Cloud Run worker pool of the stand-in (``--instances``
instances, each a real fence-plugin Celery worker, threads pool, concurrency 2, prefetch 1, acks_late off) on a
private redis-server. The release deployed is bad: the new revision's instances fail ``--fail-rate`` of their
tasks (``CELERYOPS_TEST_FAIL_RATE`` on them only; ``celeryops.testing.work`` raises ``BadReleaseError``), the old
revision fails none. A steady stream of ``work`` tasks (``--seconds`` s each, one every ``--every`` s) flows from
``--preroll`` s before the deploy until the end of the window. Then the real ``celeryops deploy --strategy S
--json``:

- ``overlap``: the new revision comes up beside the old one, the old drains, the pool cuts over: from then on every
  task runs on the bad release;
- ``canary``: one canary instance beside the old ones; the judge looks every ``--look`` s (``[canary]``: min_tasks
  ``--min-tasks``, max_duration ``--max-duration``, the other settings the defaults: margin 5 %, alpha 1 %) and
  rolls it back; the pool goes back to 100 % old.

The window: the same fixed length for both, ``--window`` s from the deploy's start (its process start, Redis TIME
on the same machine), long enough that the canary's verdict falls inside it. The producer runs until it ends, and
longer if the deploy has not exited by then (the window still ends there). Measured from the tasks' own records:

- **failed on the bad release**: tasks that finished inside the window and failed (every failure ran on the new
  revision: the old one fails none; checked);
- **to verdict / cutover**: seconds from the deploy's start to the ``canary_look`` whose verdict is ``rollback``
  (canary), or to the overlap's ``cut_over`` step (overlap: there is no verdict, this is when the bad release took
  all of the work); and the deploy's length (process start to exit);
- **longest gap**: the longest interval inside the window with no task completing anywhere (a failed task counts as
  completed: it was processed), the window's bounds counting as completions. The producer sends a task every
  ``--every`` s, so any gap longer than that had tasks waiting in the queue;
- then, once every task finished: lost (never ran) and duplicated (ran twice), which must be 0.

Targets: canary's failed tasks <= 10 % of overlap's; canary's longest gap <= 2 s.

Usage: .venv/bin/python bench/bench_canary.py [--window 120] [--repeat 1] [--fail-rate 0.2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis

from celeryops.demo.standins.cloudrun import CloudRunStandIn, InstanceSpec, standin_config
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops.demo.standins.workers import CeleryInstances
from celeryops_harness.stream import TaskStream as Producer
from celeryops_harness.taskapp import records, redis_now, work
from celeryops_harness.workers import wait_for
from common import table

RELEASE = "bench-2"
TARGET_SHARE = 0.10  # canary's failed tasks at most this share of overlap's (issue 28)
TARGET_GAP = 2.0  # canary's longest gap without a completion, seconds
EXPECTED_EXIT = {"overlap": 0, "canary": 7}


@dataclass
class CaseResult:
    strategy: str
    exit_code: int
    outcome: str
    length: float  # seconds, deploy process start to exit
    decided: float | None  # seconds from the deploy's start to the verdict (canary) / cut_over (overlap)
    failed: int  # tasks that finished inside the window and failed
    failed_after: int  # of those, finished after the verdict / cutover
    completed: int  # tasks that finished inside the window
    on_new: int  # of those, run on the new revision
    gap: float
    gap_at: float  # seconds after the deploy's start when the longest gap began
    tasks: int
    lost: int
    duplicated: int
    failed_elsewhere: int  # failures on the old revision (must be 0: it fails none)
    looks: int = 0
    rule: str = ""
    notes: list[str] = field(default_factory=list)


class Deploy:
    """``celeryops deploy ... --json`` as a subprocess; each event gets ``_at`` (time.time() at arrival)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "celeryops", *args], env=env, cwd=cwd, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.events: list[dict[str, Any]] = []
        self.stderr = ""
        self._threads = [threading.Thread(target=self._out, daemon=True),
                         threading.Thread(target=self._err, daemon=True)]
        for t in self._threads:
            t.start()

    def _out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                event = json.loads(line)
                event["_at"] = time.time()
                self.events.append(event)

    def _err(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        for t in self._threads:
            t.join(10)
        return rc


def longest_gap(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest gap between consecutive completion times in [start, end], the bounds included; and where it
    began (seconds after ``start``)."""
    points = [start, *sorted(t for t in times if start <= t <= end), end]
    return max((b - a, a - start) for a, b in itertools.pairwise(points))


def canary_table(args: argparse.Namespace) -> str:
    return (f"\n[canary]\nlook_interval = {args.look:g}\nmin_tasks = {args.min_tasks}\n"
            f"max_duration = {args.max_duration:g}\n")


def run_case(strategy: str, args: argparse.Namespace, root: Path) -> CaseResult:
    work_dir = root / strategy
    work_dir.mkdir(parents=True)
    server = RedisServer().start()
    registry = RegistryStandIn().start()
    queue = f"bench-canary-{strategy}"
    first: list[str] = []

    def options(spec: InstanceSpec) -> dict[str, object]:  # the new revision's instances: the bad release
        first.append(first[0] if first else spec.revision)
        return {} if spec.revision == first[0] else {"env": {"CELERYOPS_TEST_FAIL_RATE": f"{args.fail_rate:g}"}}

    workers = CeleryInstances(server.url, app="celeryops_harness.fenceapp", queues=[queue], log_dir=work_dir,
                              env={"CELERYOPS_TEST_RECORD": server.url, "CELERYOPS_FENCE_INTERVAL": "0.3",
                                   "CELERYOPS_TEST_EVENTS": "1"},  # as under -E: the canary counts them
                              options=options)
    standin = CloudRunStandIn(rollout_seconds=0.3, launcher=workers)
    producer: Producer | None = None
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        git = GitFixture(work_dir / "git", branch=RELEASE).create(commits=2, age=timedelta(days=1))
        endpoint = standin.start()
        registry.seed("proj/worker", git.tip(git.remote))
        standin.add_worker_pool("proj", "europe-west1", "worker", f"{registry.host}/proj/worker:old",
                                instances=args.instances)
        (work_dir / "celeryops.toml").write_text(standin_config(
            broker=server.url, endpoint=endpoint, image=f"{registry.host}/proj/worker:{{sha}}",
            kind="cloudrun-worker-pool", interval=1.0, max_wait=300) + canary_table(args))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERYOPS_") and k != "CELERY_BROKER_URL"}
        env.update(CELERYOPS_STATE_DIR=str(work_dir / "state"), PYTHONUNBUFFERED="1")
        producer = Producer(server.url, queue, work, (args.seconds, "w"), args.every).start()
        time.sleep(args.preroll)  # the stream flows before the deploy (part of the workload, not a wait)
        start = redis_now(client)
        deploy = Deploy(["deploy", RELEASE, "--strategy", strategy, "--yes", "--accept-warnings", "--json",
                         "--repo", str(git.work)], env, work_dir)
        rc = deploy.wait(args.window + 600)
        ended = redis_now(client)
        window_end = start + args.window
        if window_end > ended:  # the stream flows until the window's end (a workload, not a wait)
            time.sleep(window_end - ended)
        producer.stop()
        final = deploy.events[-1] if deploy.events else {}
        if rc != EXPECTED_EXIT[strategy]:
            raise RuntimeError(f"the {strategy} deploy exited {rc} (expected {EXPECTED_EXIT[strategy]}): {final} "
                               f"{deploy.stderr[-2000:]}")
        ids = producer.ids
        wait_for(lambda: all(r.get("finished") for r in records(client, ids).values()), 120,
                 "every task to finish after the deploy", step=0.5)
        recs = records(client, ids)
        looks = [e for e in deploy.events if e.get("event") == "canary_look"]
        if strategy == "canary":
            verdict = next((e for e in looks if e.get("verdict") == "rollback"), None)
            if verdict is None:
                raise RuntimeError(f"the canary ended without a rollback verdict: {looks[-1:]}")
            decided_at: float | None = verdict["_at"]
            new = str(verdict["canary"])
            rule = str(verdict.get("rule", ""))
        else:
            cut = next((e for e in deploy.events if e.get("event") == "overlap" and e.get("step") == "cut_over"), None)
            decided_at = cut["_at"] if cut is not None else None
            new = next((str(e["new_revision"]) for e in deploy.events if e.get("event") == "overlap"
                        and e.get("step") == "planned"), "")
            rule = ""
        revision_of = dict(workers.revision_of)
        inside = {t: r for t, r in recs.items() if start <= float(r["finished"]) <= window_end}
        failed = [r for r in inside.values() if r.get("failed")]
        gap, gap_at = longest_gap([float(r["finished"]) for r in inside.values()], start, window_end)
        return CaseResult(
            strategy=strategy, exit_code=rc, outcome=str(final.get("event", "")), length=ended - start,
            decided=None if decided_at is None else decided_at - start, failed=len(failed),
            failed_after=sum(1 for r in failed if decided_at is not None and float(r["finished"]) > decided_at),
            completed=len(inside), on_new=sum(1 for r in inside.values() if revision_of.get(r.get("worker")) == new),
            gap=gap, gap_at=gap_at, tasks=len(ids), lost=sum(1 for r in recs.values() if r["runs"] == 0),
            duplicated=sum(1 for r in recs.values() if r["runs"] > 1),
            failed_elsewhere=sum(1 for r in recs.values() if r.get("failed") and revision_of.get(r.get("worker"))
                                 != new),
            looks=len(looks), rule=rule,
            notes=[f"window shorter than the deploy ({ended - start:.0f} s)"] if ended > window_end else [])
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
    ap.add_argument("--window", type=float, default=120.0, help="seconds from the deploy's start (default 120)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of (overlap, canary), in turns (default 1)")
    ap.add_argument("--fail-rate", type=float, default=0.2, help="the bad release's failure rate (default 0.2)")
    ap.add_argument("--instances", type=int, default=2, help="the pool's instances (default 2)")
    ap.add_argument("--seconds", type=float, default=0.05, help="each task's length (default 0.05)")
    ap.add_argument("--every", type=float, default=0.1, help="seconds between tasks sent (default 0.1)")
    ap.add_argument("--preroll", type=float, default=2.0, help="seconds the stream flows before the deploy")
    ap.add_argument("--look", type=float, default=2.0, help="[canary] look_interval (default 2)")
    ap.add_argument("--min-tasks", type=int, default=50, help="[canary] min_tasks (default 50)")
    ap.add_argument("--max-duration", type=float, default=300.0, help="[canary] max_duration (default 300)")
    ap.add_argument("--only", choices=("overlap", "canary"), default=None, help="one strategy (no comparison)")
    args = ap.parse_args()
    strategies = (args.only,) if args.only else ("overlap", "canary")
    # SIGTERM unwinds like Ctrl-C, so every worker and redis-server of the run is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    results: list[CaseResult] = []
    with tempfile.TemporaryDirectory(prefix="celeryops-bench-canary-") as tmp:
        for round_ in range(args.repeat):
            for strategy in strategies:
                result = run_case(strategy, args, Path(tmp) / f"r{round_}")
                results.append(result)
                print(f"  {strategy}: done ({result.length:.0f} s deploy)", file=sys.stderr, flush=True)
    per = len(strategies)
    anchor = {i // per: r for i, r in enumerate(results) if r.strategy == "overlap"}
    rows = []
    for i, r in enumerate(results):
        overlap = anchor.get(i // per)
        share = f"{r.failed / overlap.failed:.3f}x" if overlap is not None and overlap.failed else "-"
        decided = "-" if r.decided is None else f"{r.decided:.1f}"
        rows.append([r.strategy + (f" ({r.rule}, {r.looks} looks)" if r.rule else ""), f"{r.exit_code} {r.outcome}",
                     decided, f"{r.length:.1f}", f"{r.failed} ({r.failed_after} after)", share,
                     f"{r.completed} ({r.on_new} on new)", f"{r.gap:.2f} (at +{r.gap_at:.1f} s)",
                     r.tasks, r.lost, r.duplicated])
    print(table(["strategy", "exit", "to verdict / cut_over (s)", "deploy (s)", "failed on bad release",
                 "vs overlap", "completed in window", "longest gap (s)", "tasks", "lost", "dup"], rows,
                title=f"worker pool of {args.instances} instances (2 threads each); a {args.seconds:g} s task every "
                      f"{args.every:g} s; the new revision fails {args.fail_rate:.0%} of its tasks; window "
                      f"{args.window:g} s from the deploy's start; canary: look {args.look:g} s, min_tasks "
                      f"{args.min_tasks}, max_duration {args.max_duration:g} s, alpha 1 %, margin 5 %"))
    for r in results:
        for note in r.notes:
            print(f"note ({r.strategy}): {note}")
    canary = [r for r in results if r.strategy == "canary"]
    if canary and anchor:
        worst = max(r.failed / max(1, anchor[i // per].failed) for i, r in enumerate(results)
                    if r.strategy == "canary")
        print(f"\ncanary's failed tasks at most {worst:.3f}x overlap's (target <= {TARGET_SHARE:g}x): "
              + ("met" if worst <= TARGET_SHARE else "MISSED"))
    if canary:
        gap = max(r.gap for r in canary)
        print(f"canary's longest gap {gap:.2f} s (target <= {TARGET_GAP:g} s): "
              + ("met" if gap <= TARGET_GAP else "MISSED"))
    bad = [r for r in results if r.lost or r.duplicated or r.failed_elsewhere]
    print(f"lost or duplicated tasks, failures on the old revision: "
          f"{sum(r.lost + r.duplicated + r.failed_elsewhere for r in results)} (must be 0): "
          + ("OK" if not bad else "FAIL"))
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
