"""Drain observation benchmark (printed table, not a test).

One full observation, ``Fleet.observe`` (active + reserved + scheduled + active_queues of every known worker), at
N = 1, 4, 8 real workers (threads pool, each running two sleep tasks with one more prefetched and one ETA task
held, so the replies are not empty), side by side in the same run with:

  (a) ``celery -A celeryops_harness.taskapp inspect active``: what an operator runs today (a new process,
      default 1 s timeout: it waits the whole timeout because a broadcast cannot know how many workers exist);
  (b) one in-process ``app.control.inspect(destination=known, limit=N).active()`` round trip: the floor.

Two fleets in one: the bench workers run ``-A bench_observe:worker_app`` (the test task app plus the plugin's
``celeryops_observe`` command, registered as celeryops.fence registers it), so the same workers serve

  ours, plugin   ``Fleet.observe``: one ``celeryops_observe`` per worker;
  ours, plain    ``Fleet.observe`` with every worker known as plain (no plugin): the four standard inspect
                 commands, which is exactly what a worker without the plugin is sent;
  before, plain  the plain path before issue 16: four ``app.control.broadcast`` calls in parallel threads (each
                 its own reply queue and collection, replies routed through the reply exchange).

Targets: plugin <= 0.05x (a) and <= 1.5x (b); plain <= 2.0x (b).

Usage: .venv/bin/python bench/bench_observe.py [--repeats 20] [--cli-repeats 3] [--sizes 1,4,8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery

from celeryops.adapters.fleet import Fleet
from celeryops_harness.workers import wait_for
from common import BenchFleet, Timing, bench_fleet, control_app, measure, measure_interleaved, ms, ratio, table

COMMANDS = ("active", "reserved", "scheduled", "active_queues")
TIMEOUT = 1.0  # Celery's default inspect timeout, also Fleet's default reply window
TARGET_A = 0.05
TARGET_B = 1.5
TARGET_PLAIN = 2.0


# -- worker side (imported by the bench workers only) ----------------------------------------------------------------


def __getattr__(name: str) -> Any:
    """``worker_app``: the test task app with the plugin's ``celeryops_observe`` command registered (lazy: the bench
    process itself never imports the task app, whose broker comes from the worker's environment)."""
    if name != "worker_app":
        raise AttributeError(name)
    from celeryops.fence.control import register_command
    from celeryops_harness.taskapp import app as worker_app

    register_command()
    return worker_app


# -- load -----------------------------------------------------------------------------------------------------------


def load(app: Celery, fleet: BenchFleet, names: list[str]) -> None:
    """Give each new worker two running sleep tasks, one prefetched and one ETA task; wait until they run."""
    for name in names:
        queue = name.split("@", 1)[1]
        for i in range(3):
            app.send_task("celeryops.testing.sleep", args=(600.0, f"{queue}-{i}"), queue=queue)
        app.send_task("celeryops.testing.sleep", args=(1.0, f"{queue}-eta"), queue=queue, countdown=3600)

    def busy() -> bool:
        replies = app.control.inspect(destination=names, limit=len(names), timeout=TIMEOUT).active() or {}
        return all(len(replies.get(n) or []) >= 2 for n in names)

    wait_for(busy, 60, f"{len(names)} workers to run two tasks each")


# -- contenders -----------------------------------------------------------------------------------------------------


def celery_cli() -> list[str]:
    script = Path(sys.executable).parent / "celery"
    return [str(script)] if script.exists() else [sys.executable, "-m", "celery"]


def cli_inspect(broker: str, known: list[str]) -> Callable[[], None]:
    env = {**os.environ, "CELERYOPS_TEST_BROKER": broker}
    cmd = [*celery_cli(), "-A", "celeryops_harness.taskapp", "inspect", "active"]

    def call() -> None:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        missing = [n for n in known if n not in out.stdout]
        if out.returncode != 0 or missing:
            raise RuntimeError(f"`celery inspect active` failed ({out.returncode}, missing {missing}): "
                               f"{out.stderr[-500:]}")

    return call


def floor_inspect(app: Celery, known: list[str]) -> Callable[[], None]:
    def call() -> None:
        replies = app.control.inspect(destination=known, limit=len(known), timeout=TIMEOUT).active() or {}
        if set(replies) != set(known):
            raise RuntimeError(f"inspect active: replies from {sorted(replies)}, expected {known}")

    return call


def ours(fleet: Fleet, loop: asyncio.AbstractEventLoop, known: list[str]) -> Callable[[], None]:
    def call() -> None:
        obs = loop.run_until_complete(fleet.observe(known))
        if not all(w.replied for w in obs.workers.values()) or set(obs.workers) != set(known):
            raise RuntimeError(f"observe: not every worker replied: {obs.workers}")
        if len(obs.tasks) < 4 * len(known):
            raise RuntimeError(f"observe: expected >= {4 * len(known)} tasks, saw {len(obs.tasks)}")

    return call


def ours_plain(app: Celery, loop: asyncio.AbstractEventLoop, known: list[str]) -> Callable[[], None]:
    """Fleet.observe on workers known as plain: the four standard commands in one round."""
    fleet = Fleet(app, timeout=TIMEOUT)
    fleet._plain.update(known)
    return ours(fleet, loop, known)


def before_plain(app: Celery, loop: asyncio.AbstractEventLoop, known: list[str]) -> Callable[[], None]:
    """The plain path before issue 16: four broadcasts in parallel threads (app.control.broadcast each)."""

    def broadcast(command: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for item in app.control.broadcast(command, destination=known, limit=len(known), reply=True,
                                          timeout=TIMEOUT) or []:
            merged.update(item)
        return merged

    async def four() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(asyncio.to_thread(broadcast, c) for c in COMMANDS)))

    def call() -> None:
        replies = loop.run_until_complete(four())
        if any(set(r) != set(known) for r in replies) or any(len(replies[0][n]) < 2 for n in known):
            raise RuntimeError(f"before, plain: replies from {[sorted(r) for r in replies]}, expected {known}")

    return call


# -- run ------------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=20, help="repeats of each in-process call")
    parser.add_argument("--cli-repeats", type=int, default=3, help="repeats of `celery inspect active`")
    parser.add_argument("--sizes", default="1,4,8", help="fleet sizes, ascending")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if shutil.which("redis-server") is None:
        print("bench_observe: redis-server is not on PATH; install it (tools/ensure-test-services.sh).")
        return 1

    t_start = time.monotonic()
    here = str(Path(__file__).resolve().parent)
    pythonpath = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    rows: list[list[object]] = []
    with bench_fleet() as bench:
        app = control_app(bench.broker)
        fleet = Fleet(app, timeout=TIMEOUT)
        loop = asyncio.new_event_loop()
        try:
            for n in sizes:
                new = bench.add(n - len(bench.workers), own_queue=True, pool="threads", concurrency=2,
                                app="bench_observe:worker_app", env={"PYTHONPATH": pythonpath})
                load(app, bench, [w.nodename for w in new])
                known = sorted(w.nodename for w in bench.workers)
                t_a = measure(cli_inspect(bench.broker, known), args.cli_repeats, warmup=0)
                t = measure_interleaved({
                    "b": floor_inspect(app, known),
                    "plugin": ours(fleet, loop, known),
                    "plain": ours_plain(app, loop, known),
                    "before": before_plain(app, loop, known),
                }, args.repeats, warmup=3)
                rows.append(result_row(n, t_a, t["b"], t["plugin"], t["plain"], t["before"]))
                print(f"  N={n}: done ({time.monotonic() - t_start:.0f} s)", flush=True)
        finally:
            fleet.close()
            loop.close()
            app.close()

    print()
    print(table(["N", "(a) cli ms", "(b) floor ms", "plugin ms", "plain ms", "before plain ms", "plugin/(a)",
                 "plugin/(b)", "plain/(b)", "before/(b)", "targets"], rows,
                title=f"One full observation (Fleet.observe), Redis broker, threads workers; ms median / p95; "
                      f"repeats: (a) {args.cli_repeats}, others {args.repeats} (taken in turns)"))
    print(f"\ntotal {time.monotonic() - t_start:.0f} s")
    return 0


def pair(t: Timing) -> str:
    return f"{ms(t.median)} / {ms(t.p95)}"


def result_row(n: int, t_a: Timing, t_b: Timing, t_plugin: Timing, t_plain: Timing,
               t_before: Timing) -> list[object]:
    ok_a = t_plugin.median <= TARGET_A * t_a.median
    ok_b = t_plugin.median <= TARGET_B * t_b.median
    ok_plain = t_plain.median <= TARGET_PLAIN * t_b.median
    verdict = (f"plugin (a) {'met' if ok_a else 'MISSED'}, (b) {'met' if ok_b else 'MISSED'}; "
               f"plain {'met' if ok_plain else 'MISSED'}")
    return [n, pair(t_a), pair(t_b), pair(t_plugin), pair(t_plain), pair(t_before),
            ratio(t_plugin.median, t_a.median), ratio(t_plugin.median, t_b.median),
            ratio(t_plain.median, t_b.median), ratio(t_before.median, t_b.median), verdict]


if __name__ == "__main__":
    sys.exit(main())
