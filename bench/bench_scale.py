"""Drain poll at fleet scale (printed table, not a test).

One drain poll, exactly as ``Drain.poll`` does it (membership from the pidbox bindings, ``Fleet.observe``: one
round with every command published at once and every reply collected from one list, the bindings again, the
verdict, then the re-broadcast of ``cancel_consumer``), at N = 10, 100, 1,000, 5,000 simulated workers
(``celeryops_harness.simfleet``: real kombu pidbox protocol on a private redis-server; each worker runs two tasks,
holds one prefetched and one ETA task, so the replies are not empty and the verdict is "continue", which
re-broadcasts), plain (four standard inspect commands per worker) and with the plugin (``celeryops_observe``).

Measured per N, in a fresh poll process (so its memory is the poll's alone):
  wall time of one poll (median / p95 / worst), Redis commands per poll (INFO commandstats delta on the server,
  so the simulated workers' replies count too), the poll process's CPU time per poll and its RSS (after the
  imports, and peak), and, in the same run against the same fleet, the anchor: ``celery inspect active``
  (a new process, default 1 s timeout). Then the growth per 1,000 workers (peak RSS and poll time) between
  consecutive sizes.

Targets: poll at N=1,000 plain <= 1.2 s; poll at N=5,000 with the plugin < 3 s; RSS < 300 MB at every N.

Usage: .venv/bin/python bench/bench_scale.py [--sizes 10,100,1000,5000] [--repeats 5] [--processes 4]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from celeryops.demo.standins.redis_server import RedisServer
from celeryops_harness.simfleet import SimSpec, sim_fleet
from common import Timing, control_app, ms, table

QUEUE = "celery"
TARGET_WALL = 3.0  # with the plugin, at any N up to 5,000
TARGET_WALL_PLAIN_1000 = 1.2  # plain workers, up to N = 1,000
TARGET_RSS_MB = 300.0


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def commandstats(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    out = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    out["info"] = out.get("info", 0) - 1  # our own INFO call
    return {k: v for k, v in out.items() if v > 0}


# -- the poll process -------------------------------------------------------------------------------------------


def poll_child(broker: str, expect: int, repeats: int) -> dict[str, Any]:
    """Runs in its own process: start a drain (once), then time ``repeats`` polls (after one warm-up)."""
    from celeryops.adapters.fleet import Fleet
    from celeryops.ops.drain.engine import Drain, DrainSettings

    client = redis.Redis.from_url(broker)
    rss_base = rss_mb()
    app = control_app(broker)
    fleet = Fleet(app, timeout=1.0)
    drain = Drain(fleet, DrainSettings(interval=15.0, streak=2, max_wait=3600.0), queues=(QUEUE,))
    walls: list[float] = []
    cpus: list[float] = []
    cmds: list[dict[str, int]] = []
    unknown: list[int] = []

    async def run() -> None:
        await drain.start()
        progress = await drain.poll()  # warm-up
        for _ in range(repeats):
            before = commandstats(client)
            c0, t0 = cpu_seconds(), time.perf_counter()
            progress = await drain.poll()
            walls.append(time.perf_counter() - t0)
            cpus.append(cpu_seconds() - c0)
            cmds.append(delta(before, commandstats(client)))
            unknown.append(len(progress.unknown))
            if not progress.unknown and (len(progress.workers) != expect or progress.active != 2 * expect):
                raise RuntimeError(f"poll saw {len(progress.workers)}/{expect} workers, {progress.active} active")

    asyncio.run(run())
    fleet.close()
    app.close()
    total: dict[str, int] = {}
    for c in cmds:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return {"walls": walls, "cpu": sorted(cpus)[len(cpus) // 2], "rss_base": rss_base, "rss_after": rss_mb(),
            "rss_peak": peak_rss_mb(), "unknown": max(unknown),
            "commands": {k: v / len(cmds) for k, v in total.items()}}


def run_poll_child(broker: str, expect: int, repeats: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--poll-child", broker, str(expect), str(repeats)],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"poll process failed ({out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# -- the anchor -------------------------------------------------------------------------------------------------


def celery_cli() -> list[str]:
    script = Path(sys.executable).parent / "celery"
    return [str(script)] if script.exists() else [sys.executable, "-m", "celery"]


def cli_inspect(broker: str, names: list[str], client: redis.Redis) -> tuple[float, int]:
    env = {**os.environ, "CELERYOPS_TEST_BROKER": broker}
    before = commandstats(client)
    t0 = time.perf_counter()
    out = subprocess.run([*celery_cli(), "-A", "celeryops_harness.taskapp", "inspect", "active"], env=env,
                         capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    cmds = sum(delta(before, commandstats(client)).values())
    missing = [n for n in names if n not in out.stdout]
    if out.returncode != 0 or missing:
        raise RuntimeError(f"`celery inspect active` failed ({out.returncode}, {len(missing)} workers missing): "
                           f"{out.stderr[-500:]}")
    return wall, cmds


def wait_answering(broker: str, names: list[str], timeout: float = 120.0) -> None:
    app = control_app(broker)
    deadline = time.monotonic() + timeout
    try:
        while True:
            replies = app.control.ping(destination=names, timeout=5.0) or []
            got = {k for r in replies for k in r}
            if got >= set(names):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(set(names) - got)} simulated workers did not answer ping")
    finally:
        app.close()


# -- run --------------------------------------------------------------------------------------------------------


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--poll-child":
        print(json.dumps(poll_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,5000")
    parser.add_argument("--repeats", type=int, default=5, help="measured polls per N (after one warm-up)")
    parser.add_argument("--processes", type=int, default=4, help="simulation processes")
    parser.add_argument("--cli-repeats", type=int, default=2)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    t_start = time.monotonic()
    rows: list[list[object]] = []
    cmd_rows: list[list[object]] = []
    by_variant: dict[bool, list[tuple[int, float, float]]] = {False: [], True: []}  # plugin -> (N, RSS peak, poll s)
    server = RedisServer().start()
    client = redis.Redis.from_url(server.url)
    try:
        for n, plugin in [(n, p) for n in sizes for p in (False, True)]:
            spec = SimSpec(n=n, processes=min(args.processes, max(1, n // 25)), queues=(QUEUE,),
                           tasks_per_worker=2, reserved_per_worker=1, scheduled_per_worker=1,
                           task_duration=(3600.0, 7200.0), prefix=f"scale{n}{'p' if plugin else ''}", seed=n,
                           plugin=plugin)
            client.flushall()
            with sim_fleet(server.url, spec, timeout=120.0) as sim:
                wait_answering(server.url, sim.answering)
                cli = [cli_inspect(server.url, sim.answering, client) for _ in range(args.cli_repeats)]
                result = run_poll_child(server.url, n, args.repeats)
            t = Timing(tuple(result["walls"]))
            t_cli = Timing(tuple(w for w, _ in cli))
            cmds = result["commands"]
            top = ", ".join(f"{k} {v:.0f}" for k, v in sorted(cmds.items(), key=lambda kv: -kv[1])[:4])
            growth = result["rss_after"] - result["rss_base"]
            by_variant[plugin].append((n, result["rss_peak"], t.median))
            wall_target = TARGET_WALL if plugin or n > 1000 else TARGET_WALL_PLAIN_1000
            ok = t.median <= wall_target and result["rss_peak"] < TARGET_RSS_MB and not result["unknown"]
            label = f"{n} {'plugin' if plugin else 'plain'}"
            rows.append([label, f"{ms(t.median)} / {ms(t.p95)}", ms(t_cli.median), f"{t.median / t_cli.median:.2f}x",
                         f"{sum(cmds.values()):.0f}", f"{cli[0][1]}", f"{result['cpu'] * 1000:.0f}",
                         result["unknown"], f"{result['rss_base']:.0f}", f"{result['rss_peak']:.0f}", f"{growth:+.1f}",
                         "met" if ok else "MISSED"])
            cmd_rows.append([f"{n} {'plugin' if plugin else 'plain'}", top])
            print(f"  N={n}: done ({time.monotonic() - t_start:.0f} s)", flush=True)
    finally:
        client.close()
        server.close()

    print()
    print(table(["N", "poll ms med/p95", "anchor ms", "poll/anchor", "redis cmds/poll", "anchor cmds",
                 "poll CPU ms", "unknown (max)", "RSS base MB", "RSS peak MB", "RSS growth MB", "targets"], rows,
                title=f"One drain poll (Drain.poll: observe + re-broadcast) vs `celery inspect active`, simulated "
                      f"workers on Redis; {args.repeats} polls, {args.cli_repeats} anchor runs per N"))
    print()
    print(table(["N", "top Redis commands per poll (server-wide)"], cmd_rows))
    steps: list[list[object]] = []
    for plugin, points in by_variant.items():
        for (n0, r0, w0), (n1, r1, w1) in itertools.pairwise(points):
            per = 1000 / (n1 - n0)
            steps.append([f"{n0} -> {n1} {'plugin' if plugin else 'plain'}", f"{(r1 - r0) * per:+.1f}",
                          f"{(w1 - w0) * per * 1000:+.0f}"])
    if steps:
        print()
        print(table(["N", "RSS peak MB per 1,000 workers", "poll ms per 1,000 workers"], steps,
                    title="Growth per 1,000 workers between consecutive sizes"))
    print(f"total {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
