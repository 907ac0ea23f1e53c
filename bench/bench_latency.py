"""Drain detection latency (printed table, not a test).

Time from the last in-flight task finishing to the drained verdict, with interval I and streak S:

  seed loop   today's ``Drain.run``: poll, sleep I, poll ... (the seed's loop): up to S x I;
  task events the same loop plus ``TaskWatch`` (``celeryops.adapters.taskevents``): it listens
              to Celery task events on the broker and sets ``Drain.wake`` as soon as every task the last poll saw
              in flight (active or reserved) has finished, so the first empty observation comes at once; the
              S-in-a-row rule is untouched (the next S-1 polls still come I apart). Target: <= (S-1) x I + 1 s.

TaskWatch also nudges the workers holding the awaited tasks every 0.2 s (a ``ping`` cast): a threads-pool worker
holds a task's end event until its event loop wakes (up to 1 s). The real-worker rows show the loop without and
with the nudge, 20 drains each (``--real-trials``): the target is on the worst drain, not the median.

Fleets: simulated workers (``celeryops_harness.simfleet``, ``events=True``: they send ``task-succeeded`` at each
task's end) with tasks ending at random times, and one real Celery worker started with task events
(``CELERYOPS_TEST_EVENTS=1`` -> ``worker_send_task_events``) running a sleep task, whose finish time is read from
the task's own record (ct:run:<id>, Redis TIME).

Usage: .venv/bin/python bench/bench_latency.py [--trials 3] [--real-trials 20] [--interval 1.5] [--streaks 2,3]
       [--no-real]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from typing import Any

import redis
from celery import Celery

from celeryops.adapters.fleet import Fleet
from celeryops.adapters.taskevents import NUDGE, TaskWatch
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.ops.drain.engine import Drain, DrainSettings
from celeryops_harness.simfleet import SimSpec, SimTask, sim_fleet
from common import bench_fleet, control_app, table

QUEUE = "celery"
END_EVENTS = ("task-succeeded", "task-failed", "task-revoked", "task-rejected", "task-retried")


# The early re-poll is celeryops.adapters.taskevents.TaskWatch + the Drain loop itself (both in the package now).
ProposedDrain = Drain


# -- one trial --------------------------------------------------------------------------------------------------


async def drain_once(app: Celery, settings: DrainSettings, events: bool,
                     nudge: float | None = NUDGE) -> tuple[float, int, int]:
    """Run one drain to its verdict; returns (epoch time of the verdict, polls, early wakes). With ``events`` the
    loop with TaskWatch (nudging the busy workers every ``nudge`` s; None: no nudge, as before issue 16), else the
    seed's loop."""
    fleet = Fleet(app, timeout=1.0)
    drain = (ProposedDrain if events else Drain)(fleet, settings, queues=(QUEUE,))
    watch: TaskWatch | None = None
    if events:
        watch = TaskWatch(app, drain.wake, asyncio.get_running_loop(), nudge=nudge)
        await asyncio.to_thread(watch.start)
        drain.on_event = watch.on_event
    try:
        result = await drain.run()
        verdict = time.time()
        await drain.restore()
    finally:
        if watch is not None:
            await asyncio.to_thread(watch.stop)
        fleet.close()
    if result.outcome != "drained":
        raise RuntimeError(f"drain ended {result.outcome}")
    return verdict, result.polls, watch.wakes if watch else 0


def sim_trial(broker: str, sim: Any, settings: DrainSettings, events: bool, rng_seed: int) -> tuple[float, int, int]:
    """Every sim worker gets one task ending 1..1+I s from now; latency = verdict - the last end."""
    import random

    rng = random.Random(rng_seed)
    now = time.time()
    plan = {n: [SimTask(id=str(uuid.uuid4()), start=now - 5, end=now + 1 + rng.uniform(0, settings.interval))]
            for n in sim.names}
    sim.set_tasks(plan)
    app = control_app(broker)
    try:
        verdict, polls, wakes = asyncio.run(drain_once(app, settings, events))
    finally:
        app.close()
    return verdict - float(sim.last_finish()), polls, wakes


def real_trial(broker: str, settings: DrainSettings, events: bool, seconds: float,
               nudge: float | None = NUDGE) -> tuple[float, int, int]:
    app = control_app(broker)
    record = redis.Redis.from_url(broker, decode_responses=True)
    try:
        task_id = str(uuid.uuid4())
        app.send_task("celeryops.testing.sleep", args=(seconds, "latency"), queue=QUEUE, task_id=task_id)
        deadline = time.monotonic() + 60
        while not record.hget(f"ct:run:{task_id}", "started"):
            if time.monotonic() > deadline:
                raise TimeoutError("the real worker did not start the task")
            time.sleep(0.05)
        verdict, polls, wakes = asyncio.run(drain_once(app, settings, events, nudge))
        finished = float(record.hget(f"ct:run:{task_id}", "finished") or "nan")
    finally:
        record.close()
        app.close()
    return verdict - finished, polls, wakes


# -- run --------------------------------------------------------------------------------------------------------


def summarize(label: str, settings: DrainSettings, results: list[tuple[float, int, int]]) -> list[object]:
    lat = [r[0] for r in results]
    target = (settings.streak - 1) * settings.interval + 1.0
    seed_bound = settings.streak * settings.interval
    return [label, f"I={settings.interval:g} S={settings.streak}", len(lat), f"{statistics.median(lat):.2f}",
            f"{max(lat):.2f}", f"{statistics.mean(r[1] for r in results):.1f}", sum(r[2] for r in results),
            f"{target:.1f}", f"{seed_bound:.1f}", "met" if max(lat) <= target else "MISSED"]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.5)
    parser.add_argument("--streaks", default="2,3")
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--real-trials", type=int, default=20, help="drains per real-worker row with task events")
    parser.add_argument("--no-real", action="store_true", help="skip the real-worker rows")
    args = parser.parse_args()
    t0 = time.monotonic()
    rows: list[list[object]] = []
    server = RedisServer().start()
    try:
        spec = SimSpec(n=args.workers, processes=2, queues=(QUEUE,), events=True, prefix="lat")
        with sim_fleet(server.url, spec) as sim:
            for streak in (int(s) for s in args.streaks.split(",")):
                settings = DrainSettings(interval=args.interval, streak=streak, max_wait=120.0)
                for label, events in (("sim: seed loop", False), ("sim: task events + nudge", True)):
                    results = [sim_trial(server.url, sim, settings, events, seed) for seed in range(args.trials)]
                    rows.append(summarize(label, settings, results))
                    print(f"  {label} S={streak}: done ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        server.close()
    if not args.no_real:
        with bench_fleet() as bench:
            bench.add(1, env={"CELERYOPS_TEST_EVENTS": "1", "CELERYOPS_TEST_RECORD": bench.broker},
                      queues=[QUEUE])
            settings = DrainSettings(interval=args.interval, streak=2, max_wait=120.0)
            # Task lengths spread over the interval and over the worker loop's one-second poll (0.173 s steps).
            real_rows = (("real worker -E: seed loop", False, None, args.trials),
                         ("real worker -E: task events, no nudge (before)", True, None, args.real_trials),
                         (f"real worker -E: task events + nudge {NUDGE:g} s", True, NUDGE, args.real_trials))
            for label, events, nudge, trials in real_rows:
                results = [real_trial(bench.broker, settings, events, 1.0 + (i * 0.173) % settings.interval, nudge)
                           for i in range(trials)]
                rows.append(summarize(label, settings, results))
                print(f"  {label}: done ({time.monotonic() - t0:.0f} s)", flush=True)
    print()
    print(table(["fleet / loop", "settings", "trials", "latency s med", "max", "polls", "early wakes",
                 "target (S-1)I+1", "seed bound S*I", "target"], rows,
                title="Drain detection latency: last in-flight task finished -> drained verdict"))
    print(f"\ntotal {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
