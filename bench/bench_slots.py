"""Slot leases: acquire+release pairs per second and pair latency (p50/p99), 1 client and 32 clients (separate
processes), against one private redis-server in the same run:

  slots 1 type    SlotStore.acquire({"cpu": 1}) + release           (2 round trips: EVALSHA, EVALSHA)
  slots 2 types   SlotStore.acquire({"cpu": 1, "gpu": 1}) + release (2 round trips)
  redis-py Lock   Lock.acquire() + release()                       (2 round trips: SET NX PX, EVALSHA)
  round trip      redis-benchmark EVALSHA of a trivial script, halved (the limit for a 2-round-trip pair)

Usage: .venv/bin/python bench/bench_slots.py [--seconds 3] [--clients 1,32]
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
    while True:
        t0 = time.perf_counter()
        if time.time() >= end:
            break
        pair(n)
        lat.append(time.perf_counter() - t0)
        n += 1
    out.put(lat)


def run_case(kind: str, url: str, clients: int, seconds: float) -> tuple[float, float, float, float]:
    """pairs/s, p50 ms, p99 ms, and Redis CPU per pair in µs (INFO cpu of Redis' main thread)."""
    admin = redis.Redis.from_url(url)
    cpu0 = redis_cpu(admin)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    start_at = time.time() + 1.0 + clients * 0.05
    procs = [ctx.Process(target=_pairs, args=(kind, url, i, seconds, start_at, q)) for i in range(clients)]
    for p in procs:
        p.start()
    lat: list[float] = []
    for _ in procs:
        lat.extend(q.get(timeout=seconds + 120))
    for p in procs:
        p.join(30)
    lat.sort()
    p50 = lat[len(lat) // 2] * 1000
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    server_us = (redis_cpu(admin) - cpu0) * 1e6
    admin.close()
    return len(lat) / seconds, p50, p99, server_us / max(1, len(lat) + clients)


def redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def redis_benchmark(port: int, clients: int, requests: int) -> tuple[float, float, float, float]:
    r = redis.Redis(port=port)
    sha = r.script_load("return 1")
    cpu0 = redis_cpu(r)
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-c", str(clients), "-n", str(requests), "--csv",
                          "evalsha", sha, "0"], capture_output=True, text=True, check=True).stdout
    row = [line for line in out.splitlines() if line.startswith('"evalsha')][-1]
    nums = [float(x) for x in re.findall(r'"([\d.]+)"', row)]
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max"
    usec = (redis_cpu(r) - cpu0) * 1e6 / requests
    r.close()
    return nums[0], nums[3], nums[5], usec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=1.5, help="length of one round of one case")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; the cases alternate inside each round")
    ap.add_argument("--clients", default="1,32")
    args = ap.parse_args()
    kinds = (("slots1", "slots, 1 type"), ("slots2", "slots, 2 types"), ("lock", "redis-py Lock"))
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url, decode_responses=True)
        for kind in ("slots1", "slots2"):
            SlotStore(admin, f"bench-{kind}").set_totals({"cpu": 1_000_000, "gpu": 1_000_000})
        print(f"{'case':<30}{'clients':>8}{'pairs/s':>12}{'p50 ms':>10}{'p99 ms':>10}{'redis µs/pair':>15}")
        summary: list[str] = []
        for clients in (int(c) for c in args.clients.split(",")):
            runs: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k, _ in kinds}
            runs["limit"] = []
            for _ in range(args.rounds):  # interleaved, so that load from elsewhere hits every case alike
                for kind, _label in kinds:
                    runs[kind].append(run_case(kind, server.url, clients, args.seconds))
                n = max(20000, int(runs["lock"][-1][0] * 2 * args.seconds))
                rps, p50, p99, us = redis_benchmark(server.port, clients, n)
                runs["limit"].append((rps / 2, 2 * p50, 2 * p99, 2 * us))
            med = {k: tuple(statistics.median(x[i] for x in v) for i in range(4)) for k, v in runs.items()}
            for kind, label in (*kinds, ("limit", "redis-benchmark EVALSHA / 2")):
                pps, p50, p99, us = med[kind]
                print(f"{label:<30}{clients:>8}{pps:>12,.0f}{p50:>10.3f}{p99:>10.3f}{us:>15.1f}")
            lock, limit = med["lock"][0], med["limit"][0]
            summary.append(
                f"{clients:>3} client(s): slots 1 type = {med['slots1'][0] / lock:.2f}x Lock (target >= 1.0), "
                f"2 types = {med['slots2'][0] / lock:.2f}x Lock (target >= 0.9); of the round-trip limit: "
                f"{med['slots1'][0] / limit:.0%} / {med['slots2'][0] / limit:.0%}, Lock {lock / limit:.0%}")
        print()
        print(f"medians of {args.rounds} interleaved rounds of {args.seconds}s per case; the redis-benchmark row is "
              "requests/s halved and latencies doubled (a pair is 2 round trips)")
        print("\n".join(summary))
        print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
              "(numbers from a shared machine under load are only orientation)")


if __name__ == "__main__":
    main()
