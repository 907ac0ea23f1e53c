"""Slot leases: acquire+release pairs per second and pair latency (p50/p99), 1 client and 32 clients (separate
processes), against one private redis-server in the same run:

  slots 1 type    SlotStore.acquire({"cpu": 1}) + release           (2 round trips: EVALSHA, EVALSHA)
  slots 2 types   SlotStore.acquire({"cpu": 1, "gpu": 1}) + release (2 round trips)
  redis-py Lock   Lock.acquire() + release()                       (2 round trips: SET NX PX, EVALSHA)
  round trip      redis-benchmark EVALSHA of a trivial script, halved (the limit for a 2-round-trip pair)

Columns: pairs/s, pair latency p50/p99, and where the time goes: Redis main-thread CPU per pair (INFO cpu: commands,
network I/O, event loop), Redis command time per pair (INFO commandstats, top-level commands: for a script that is
the whole script including its redis.call()s), and the clients' own CPU per pair (process time of the client
processes: redis-py and the kernel's socket work on their side).

Usage: .venv/bin/python bench/bench_slots.py [--seconds 1.5] [--rounds 5] [--clients 1,32]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import redis

from celeryops.slots import SlotStore
from celeryops.testing.redis_server import RedisServer


def _pairs(kind: str, url: str, client_no: int, seconds: float, start_at: float,
           out: Any) -> None:
    r = redis.Redis.from_url(url, decode_responses=True)
    pair: Callable[[int], None]
    if kind.startswith("slots"):
        store = SlotStore(r, f"bench-{kind}")
        needs = {"cpu": 1} if kind == "slots1" else {"cpu": 1, "gpu": 1}

        def pair(n: int) -> None:
            lease_id = f"c{client_no}-{n}"
            res = store.acquire(lease_id, needs, ttl=60)
            assert res.ok
            store.release(lease_id, res.token)
    else:
        lock = r.lock(f"bench-lock-{client_no}", timeout=60)

        def pair(n: int) -> None:
            assert lock.acquire(blocking=False)
            lock.release()

    pair(-1)  # scripts loaded, connection open
    while time.time() < start_at:
        time.sleep(0.001)
    lat: list[float] = []
    n = 0
    end = start_at + seconds
    cpu0 = time.process_time()
    while True:
        t0 = time.perf_counter()
        if time.time() >= end:
            break
        pair(n)
        lat.append(time.perf_counter() - t0)
        n += 1
    out.put((lat, time.process_time() - cpu0))


Row = tuple[float, float, float, float, float, float]  # pairs/s, p50 ms, p99 ms, µs per pair: redis CPU, cmd, client


def run_case(kind: str, url: str, clients: int, seconds: float) -> Row:
    admin = redis.Redis.from_url(url)
    admin.config_resetstat()
    cpu0 = redis_cpu(admin)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    start_at = time.time() + 1.0 + clients * 0.05
    procs = [ctx.Process(target=_pairs, args=(kind, url, i, seconds, start_at, q)) for i in range(clients)]
    for p in procs:
        p.start()
    lat: list[float] = []
    client_cpu = 0.0
    for _ in procs:
        got, cpu = q.get(timeout=seconds + 120)
        lat.extend(got)
        client_cpu += cpu
    for p in procs:
        p.join(30)
    lat.sort()
    p50 = lat[len(lat) // 2] * 1000
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    server_us = (redis_cpu(admin) - cpu0) * 1e6
    cmd_us = command_usec(admin)
    admin.close()
    pairs = max(1, len(lat) + clients)  # + the warm-up pair of every client
    return len(lat) / seconds, p50, p99, server_us / pairs, cmd_us / pairs, client_cpu * 1e6 / max(1, len(lat))


def redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def command_usec(r: redis.Redis) -> float:
    """µs spent in the commands clients sent (EVALSHA includes the script's redis.call()s; SET is Lock's acquire)."""
    stats = r.info("commandstats")
    return sum(float(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "set"))


def redis_benchmark(port: int, clients: int, requests: int) -> Row:
    r = redis.Redis(port=port)
    sha = r.script_load("return 1")
    r.config_resetstat()
    cpu0 = redis_cpu(r)
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-c", str(clients), "-n", str(requests), "--csv",
                          "evalsha", sha, "0"], capture_output=True, text=True, check=True).stdout
    row = [line for line in out.splitlines() if line.startswith('"evalsha')][-1]
    nums = [float(x) for x in re.findall(r'"([\d.]+)"', row)]
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max"
    usec = (redis_cpu(r) - cpu0) * 1e6 / requests
    cmd = command_usec(r) / requests
    r.close()
    return nums[0], nums[3], nums[5], usec, cmd, float("nan")


def vs_lock(runs: dict[str, list[Row]], kind: str, target: float) -> str:
    """Median of the per-round ratios to Lock (each round runs the cases back to back, under the same load)."""
    per_round = sorted(a[0] / b[0] for a, b in zip(runs[kind], runs["lock"], strict=True))
    mid = statistics.median(per_round)
    return (f"{mid:.2f}x Lock (rounds {per_round[0]:.2f}-{per_round[-1]:.2f}; target >= {target}: "
            f"{'met' if mid >= target else 'NOT met'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=1.5, help="length of one round of one case")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; the cases alternate inside each round")
    ap.add_argument("--clients", default="1,32")
    args = ap.parse_args()
    kinds = (("slots1", "slots, 1 type"), ("slots2", "slots, 2 types"), ("lock", "redis-py Lock"))
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url, decode_responses=True)
        for kind in ("slots1", "slots2"):
            SlotStore(admin, f"bench-{kind}").set_totals({"cpu": 1_000_000, "gpu": 1_000_000})
        print(f"{'case':<30}{'clients':>8}{'pairs/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
              f"{'redis CPU':>11}{'redis cmd':>11}{'client CPU':>12}   (µs per pair)")
        summary: list[str] = []
        for clients in (int(c) for c in args.clients.split(",")):
            runs: dict[str, list[Row]] = {k: [] for k, _ in kinds}
            runs["limit"] = []
            for _ in range(args.rounds):  # interleaved, so that load from elsewhere hits every case alike
                for kind, _label in kinds:
                    runs[kind].append(run_case(kind, server.url, clients, args.seconds))
                n = max(20000, int(runs["lock"][-1][0] * 2 * args.seconds))
                rps, p50, p99, us, cmd, _ = redis_benchmark(server.port, clients, n)
                runs["limit"].append((rps / 2, 2 * p50, 2 * p99, 2 * us, 2 * cmd, float("nan")))
            med = {k: tuple(statistics.median(x[i] for x in v) for i in range(6)) for k, v in runs.items()}
            for kind, label in (*kinds, ("limit", "redis-benchmark EVALSHA / 2")):
                pps, p50, p99, us, cmd, client = med[kind]
                client_text = "-" if client != client else f"{client:.1f}"
                print(f"{label:<30}{clients:>8}{pps:>10,.0f}{p50:>9.3f}{p99:>9.3f}{us:>11.1f}{cmd:>11.1f}"
                      f"{client_text:>12}")
            lock, limit = med["lock"][0], med["limit"][0]
            summary.append(
                f"{clients:>3} client(s): slots 1 type = {vs_lock(runs, 'slots1', 1.0)}, "
                f"2 types = {vs_lock(runs, 'slots2', 0.9)}; "
                f"of the round-trip limit: {med['slots1'][0] / limit:.0%} / {med['slots2'][0] / limit:.0%}, "
                f"Lock {lock / limit:.0%}")
        print()
        print(f"medians of {args.rounds} interleaved rounds of {args.seconds}s per case; the redis-benchmark row is "
              "requests/s halved and latencies doubled (a pair is 2 round trips); ratios to Lock are the median of "
              "the per-round ratios (each round runs the cases back to back, under the same load)")
        print("\n".join(summary))
        print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
              "(numbers from a shared machine under load are only orientation)")


if __name__ == "__main__":
    main()
