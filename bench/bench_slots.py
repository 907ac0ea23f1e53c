"""Slot leases: acquire+release pairs per second and pair latency (p50/p99), 1 client and 32 clients (separate
processes), against one private redis-server in the same run:

  slots 1 type    SlotStore.acquire({"gpu": 1}) + release           (2 round trips: EVALSHA, EVALSHA), in a host
                  pool whose 64 GPU devices are listed: device binding on (the grant names its device)
  slots 2 types   SlotStore.acquire({"cpu": 1, "gpu": 1}) + release (2 round trips), the same pool
  redis-py Lock   Lock.acquire() + release()                       (2 round trips: SET NX PX, EVALSHA)
  Lock, 1 conn    the same Lock on a single-connection client (``client.client()``): SlotStore runs its hot path
                  on one held connection, so this shows how much of the difference is the pool's per-command cost
  round trip      redis-benchmark EVALSHA of a trivial script, halved (the limit for a 2-round-trip pair)

Every case gets the same ``redis.Redis.from_url(url)`` client; the targets are against ``redis-py Lock``.

How: the client processes live for the whole run and hold a SlotStore and a Lock each. The parent hands out short
slices (``--slice`` seconds) of one case at a time, every case once per cycle in a rotating order, so load from
other work on the machine hits every case alike; redis-benchmark runs between cycles while the clients idle.
Ratios to Lock are the median over cycles of the per-cycle ratio.

Columns: pairs/s, pair latency p50/p99, and where the time goes, per pair: Redis main-thread CPU (INFO cpu:
commands, network I/O, event loop), Redis command time (INFO commandstats, the commands clients send: for a script
the whole script including its redis.call()s), and the clients' own CPU (process time: redis-py and the kernel's
socket work on their side).

Handoff case (``--case handoff``, issue 29): a 1-GPU host (CELERYOPS_SLOTS_GPU=1), one prefork worker with 3
processes, a backlog of 20 GPU tasks of 0.5 s sent at once; run twice in the same run, ``before`` (the handoff off:
a refused task waits for its countdown retry, as before issue 29) and ``after`` (the handoff on). Columns: wall time
from the first start to the last end, the GPU's busy share over that time (target >= 95 %), the gaps between one
task's end and the next one's start (p50 / p95 / max; target p95 <= 0.25 s, max <= 0.5 s), and the slot Lua calls
per task (EVALSHA in INFO commandstats from the first send to the last end, heartbeats and wakers included; target
<= 8). Times are the tasks' own records (Redis TIME at the start and the end of each body, inside its slots).

Usage: .venv/bin/python bench/bench_slots.py [--case all|hotpath|handoff] [--slice 0.3] [--cycles 20]
       [--clients 1,32] [--backlog 20] [--countdown 3]
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from celeryops.demo.standins.redis_server import RedisServer
from celeryops.slots import SlotStore
from celeryops_harness.workers import WorkerProcess, control_app, wait_for

DEVICES = 64  # more than clients: every pair is granted
KINDS = (("slots1", "slots, 1 type"), ("slots2", "slots, 2 types"), ("lock", "redis-py Lock"),
         ("lock1", "redis-py Lock, 1 connection"))
IDLE, STOP = -1.0, -2.0
# the parent's control block in shared memory: slice number, case index (or IDLE / STOP), slice end (time.time())
NO, KIND, END = 0, 1, 2


def _slots_pair(store: SlotStore, needs: dict[str, int], client_no: int) -> Callable[[int], None]:
    def pair(n: int) -> None:
        lease_id = f"c{client_no}-{n}"
        res = store.acquire(lease_id, needs, ttl=60)
        assert res.ok and len(res.devices["gpu"]) == 1  # granted, and given a device
        store.release(lease_id, res.token)
    return pair


def _lock_pair(lock: Any) -> Callable[[int], None]:
    def pair(n: int) -> None:
        assert lock.acquire(blocking=False)
        lock.release()
    return pair


def _client(url: str, client_no: int, control: Any, out: Any) -> None:
    r = redis.Redis.from_url(url, decode_responses=True)
    pairs: list[Callable[[int], None]] = []
    for kind, _label in KINDS:
        if kind.startswith("slots"):
            needs = {"gpu": 1} if kind == "slots1" else {"cpu": 1, "gpu": 1}
            pair = _slots_pair(SlotStore(r, f"host:bench-{kind}"), needs, client_no)
        else:
            lock_client = r if kind == "lock" else r.client()  # type: ignore[no-untyped-call]
            pair = _lock_pair(lock_client.lock(f"bench-{kind}-{client_no}", timeout=60))
        pair(-1)  # scripts loaded, connection open
        pairs.append(pair)
    results: dict[int, tuple[int, float, list[float]]] = {}  # slice -> (case, client CPU s, latencies s)
    seen, n = -1, 0
    while True:
        no, kind = int(control[NO]), control[KIND]
        if kind == STOP:
            break
        if kind == IDLE or no == seen:
            time.sleep(0.0005)
            continue
        seen, end, pair = no, control[END], pairs[int(kind)]
        lat: list[float] = []
        cpu0 = time.process_time()
        while time.time() < end:
            t0 = time.perf_counter()
            pair(n)
            lat.append(time.perf_counter() - t0)
            n += 1
        results[no] = (int(kind), time.process_time() - cpu0, lat)
    out.put(results)
    r.close()


@dataclass
class Case:
    rates: list[float] = field(default_factory=list)  # pairs/s of every slice, in cycle order
    latencies: list[float] = field(default_factory=list)
    pairs: int = 0
    redis_cpu: float = 0.0  # s
    redis_cmd: float = 0.0  # µs
    client_cpu: float = 0.0  # s


def redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def command_usec(r: redis.Redis) -> float:
    """µs spent in the commands clients sent (EVALSHA includes the script's redis.call()s; SET is Lock's acquire)."""
    stats = r.info("commandstats")
    return sum(float(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "set"))


def redis_benchmark(port: int, clients: int, requests: int) -> tuple[float, float, float, float, float]:
    """requests/s, p50 ms, p99 ms, Redis CPU µs and command µs per request."""
    r = redis.Redis(port=port)
    sha = r.script_load("return 1")
    cpu0, cmd0 = redis_cpu(r), command_usec(r)
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-c", str(clients), "-n", str(requests), "--csv",
                          "evalsha", sha, "0"], capture_output=True, text=True, check=True).stdout
    row = [line for line in out.splitlines() if line.startswith('"evalsha')][-1]
    nums = [float(x) for x in re.findall(r'"([\d.]+)"', row)]
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max"
    usec = (redis_cpu(r) - cpu0) * 1e6 / requests
    cmd = (command_usec(r) - cmd0) / requests
    r.close()
    return nums[0], nums[3], nums[5], usec, cmd


def run_clients(server: RedisServer, clients: int, slice_s: float, cycles: int,
                limit_runs: int) -> tuple[dict[str, Case], list[tuple[float, float, float, float, float]]]:
    ctx = multiprocessing.get_context("fork")
    control = ctx.Array("d", [0.0, IDLE, 0.0], lock=False)
    q = ctx.Queue()
    procs = [ctx.Process(target=_client, args=(server.url, i, control, q)) for i in range(clients)]
    for p in procs:
        p.start()
    admin = redis.Redis.from_url(server.url)
    cases = {kind: Case() for kind, _ in KINDS}
    slice_kind: dict[int, str] = {}
    limits: list[tuple[float, float, float, float, float]] = []
    grace = 0.05  # in-flight pairs finish before Redis is sampled
    try:
        time.sleep(1.0 + clients * 0.05)  # every client connected and warmed up
        no = 0
        for cycle in range(cycles):
            order = [KINDS[(cycle + i) % len(KINDS)][0] for i in range(len(KINDS))]
            for kind in order:
                no += 1
                cpu0, cmd0 = redis_cpu(admin), command_usec(admin)
                control[END] = time.time() + slice_s
                control[KIND] = float([k for k, _ in KINDS].index(kind))
                control[NO] = float(no)
                time.sleep(slice_s)
                control[KIND] = IDLE
                time.sleep(grace)
                cases[kind].redis_cpu += redis_cpu(admin) - cpu0
                cases[kind].redis_cmd += command_usec(admin) - cmd0
                slice_kind[no] = kind
            if limit_runs and cycle % max(1, cycles // limit_runs) == max(1, cycles // limit_runs) - 1:
                lock_rate = cases["lock"].rates[-1] if cases["lock"].rates else 0.0
                limits.append(redis_benchmark(server.port, clients, max(20000, int(lock_rate * 4 * slice_s))))
        control[KIND] = STOP
        per_slice: dict[int, list[tuple[float, list[float]]]] = {}
        for _ in procs:
            for sno, (_k, cpu, lat) in q.get(timeout=120).items():
                per_slice.setdefault(sno, []).append((cpu, lat))
        for p in procs:
            p.join(30)
    finally:
        control[KIND] = STOP
        for p in procs:
            if p.is_alive():
                p.kill()
        admin.close()
    for sno in sorted(slice_kind):
        case = cases[slice_kind[sno]]
        got = per_slice.get(sno, [])
        count = sum(len(lat) for _cpu, lat in got)
        case.rates.append(count / slice_s)
        case.pairs += count
        case.client_cpu += sum(cpu for cpu, _lat in got)
        for _cpu, lat in got:
            case.latencies.extend(lat)
    return cases, limits


def vs_lock(cases: dict[str, Case], kind: str, target: float, anchor: str = "lock") -> str:
    """Median over cycles of the per-cycle ratio to a Lock case (the cases of one cycle run back to back)."""
    per_cycle = sorted(a / b for a, b in zip(cases[kind].rates, cases[anchor].rates, strict=True) if b)
    mid = statistics.median(per_cycle)
    q1, q3 = per_cycle[len(per_cycle) // 4], per_cycle[(3 * len(per_cycle)) // 4]
    if anchor != "lock":
        return f"{mid:.2f}x ({q1:.2f}-{q3:.2f})"
    return f"{mid:.2f}x Lock (middle half of the cycles {q1:.2f}-{q3:.2f}; target >= {target}: " + (
        "met)" if mid >= target else "NOT met)")


def handoff_run(server: RedisServer, handoff: bool, backlog: int, seconds: float,
                countdown: float) -> tuple[float, float, list[float], float, int]:
    """One backlog on a fresh worker: (wall s, busy share, gaps s, Lua calls per task, runs seen)."""
    from celeryops_harness.slotapp import send, slot_gpu  # the broker comes from the environment: set it first

    admin = redis.Redis.from_url(server.url, decode_responses=True)
    admin.flushall()
    env = {"CELERYOPS_SLOTS_GPU": "1", "CELERYOPS_SLOTS_CPU": "8", "CELERYOPS_SLOTS_DETECT": "0",
           "CELERYOPS_SLOTS_HOST": "bench-handoff", "CELERYOPS_SLOTS_HANDOFF": "1" if handoff else "0",
           "CELERYOPS_TEST_SLOT_COUNTDOWN": str(countdown), "CELERYOPS_TEST_RECORD": server.url}
    queue = f"bench-handoff-{int(handoff)}"
    worker = WorkerProcess(server.url, app="celeryops_harness.slotapp", pool="prefork", concurrency=3,
                           queues=[queue], env=env).start()
    control = control_app(server.url)
    try:
        worker.wait_ready(control, timeout=60)
        admin.config_resetstat()
        ids = [send(slot_gpu, server.url, queue, seconds, f"t{i}") for i in range(backlog)]
        wait_for(lambda: admin.llen("ct:finishes") >= backlog, 30 + backlog * (countdown + seconds) * 2,
                 "the backlog to finish")
        calls = int(admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
        runs = [(float(admin.hget(f"ct:run:{i}", "started") or 0), float(admin.hget(f"ct:run:{i}", "finished") or 0))
                for i in ids]
        seen = sum(int(admin.get(f"ct:runs:{i}") or 0) for i in ids)
    finally:
        control.close()
        worker.stop()
        admin.close()
    runs.sort()
    wall = runs[-1][1] - runs[0][0]
    busy = sum(end - start for start, end in runs) / wall
    gaps = [max(0.0, b[0] - a[1]) for a, b in itertools.pairwise(runs)]
    if os.environ.get("BENCH_GAPS"):
        print("  gaps (s after the first start, gap):",
              " ".join(f"{b[0] - runs[0][0]:.1f}:{g:.3f}" for (a, b), g in zip(itertools.pairwise(runs), gaps,
                                                                                  strict=True)))
    return wall, busy, gaps, calls / backlog, seen


def handoff_case(backlog: int, seconds: float, countdown: float) -> None:
    print(f"\nhandoff: 1 GPU, one prefork worker (3 processes), {backlog} tasks of {seconds} s sent at once, "
          f"retry countdown {countdown} s")
    print(f"{'case':<34}{'wall s':>8}{'busy':>7}{'gap p50':>9}{'gap p95':>9}{'gap max':>9}{'Lua/task':>10}{'runs':>6}")
    with RedisServer() as server:
        os.environ["CELERYOPS_TEST_BROKER"] = server.url
        for handoff, label in ((False, "before (countdown retry only)"), (True, "after (handoff)")):
            wall, busy, gaps, calls, seen = handoff_run(server, handoff, backlog, seconds, countdown)
            q = sorted(gaps)
            p95 = q[min(len(q) - 1, int(len(q) * 0.95))]
            print(f"{label:<34}{wall:>8.1f}{busy:>7.1%}{statistics.median(q):>9.3f}{p95:>9.3f}{q[-1]:>9.3f}"
                  f"{calls:>10.1f}{seen:>4}/{backlog}")
    print("targets: busy >= 95 %, gap p95 <= 0.25 s and max <= 0.5 s, <= 8 Lua calls per task; runs = runs "
          f"recorded (exactly once: {backlog}/{backlog}); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
          "CPUs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--case", choices=("all", "hotpath", "handoff"), default="all")
    ap.add_argument("--slice", type=float, default=0.3, help="seconds of one case at a time")
    ap.add_argument("--cycles", type=int, default=20, help="cycles; every case runs one slice per cycle")
    ap.add_argument("--limit-runs", type=int, default=4, help="redis-benchmark runs per client count")
    ap.add_argument("--clients", default="1,32")
    ap.add_argument("--backlog", type=int, default=20, help="handoff: tasks sent at once")
    ap.add_argument("--seconds", type=float, default=0.5, help="handoff: each task's run time")
    ap.add_argument("--countdown", type=float, default=3.0, help="handoff: the retry countdown (default 10 s in "
                    "production; 3 s keeps the 'before' run near a minute)")
    args = ap.parse_args()
    if args.case in ("all", "hotpath"):
        hot_path(args)
    if args.case in ("all", "handoff"):
        handoff_case(args.backlog, args.seconds, args.countdown)


def hot_path(args: argparse.Namespace) -> None:
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url, decode_responses=True)
        for kind in ("slots1", "slots2"):  # a host with 64 GPUs, listed: every grant is bound to a device
            SlotStore(admin, f"host:bench-{kind}").contribute(f"bench-{kind}", {"cpu": 1_000_000, "gpu": DEVICES},
                                                              ttl=24 * 3600, devices={"gpu": list(range(DEVICES))})
        print(f"{'case':<30}{'clients':>8}{'pairs/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
              f"{'redis CPU':>11}{'redis cmd':>11}{'client CPU':>12}   (µs per pair)")
        summary: list[str] = []
        for clients in (int(c) for c in args.clients.split(",")):
            cases, limits = run_clients(server, clients, args.slice, args.cycles, args.limit_runs)
            for kind, label in KINDS:
                c = cases[kind]
                lat = sorted(c.latencies)
                p50 = lat[len(lat) // 2] * 1000
                p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
                print(f"{label:<30}{clients:>8}{statistics.median(c.rates):>10,.0f}{p50:>9.3f}{p99:>9.3f}"
                      f"{c.redis_cpu * 1e6 / c.pairs:>11.1f}{c.redis_cmd / c.pairs:>11.1f}"
                      f"{c.client_cpu * 1e6 / c.pairs:>12.1f}")
            rps, p50, p99, us, cmd = (statistics.median(x[i] for x in limits) for i in range(5))
            print(f"{'redis-benchmark EVALSHA / 2':<30}{clients:>8}{rps / 2:>10,.0f}{2 * p50:>9.3f}{2 * p99:>9.3f}"
                  f"{2 * us:>11.1f}{2 * cmd:>11.1f}{'-':>12}")
            limit = rps / 2
            lock = statistics.median(cases["lock"].rates)
            summary.append(
                f"{clients:>3} client(s): slots 1 type = {vs_lock(cases, 'slots1', 1.0)}, "
                f"2 types = {vs_lock(cases, 'slots2', 0.9)}; against Lock on one connection: "
                f"{vs_lock(cases, 'slots1', 1.0, 'lock1')} / {vs_lock(cases, 'slots2', 0.9, 'lock1')}; "
                "of the round-trip limit: "
                f"{statistics.median(cases['slots1'].rates) / limit:.0%} / "
                f"{statistics.median(cases['slots2'].rates) / limit:.0%}, Lock {lock / limit:.0%}")
        print()
        print(f"{args.cycles} cycles of {args.slice}s slices per case, interleaved; pairs/s = median over the slices; "
              f"redis-benchmark: median of {args.limit_runs} runs between cycles, requests/s halved and latencies "
              "doubled (a pair is 2 round trips)")
        print("\n".join(summary))
        print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (a shared machine: "
              "read the ratios, not the absolute numbers)")


if __name__ == "__main__":
    main()
