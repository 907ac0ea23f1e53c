"""Slot-gated tasks on real Celery worker processes (celeryops_harness.slotapp) with a real redis-server: a host's
pool shared by its workers, and a shared type's global pool whose total is the sum of the worker hosts that are
alive."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery

from celeryops.slots import SlotStore, read_all
from celeryops_harness.slotapp import send, slot_hold, slot_kw, slot_sleep
from celeryops_harness.taskapp import release
from celeryops_harness.workers import WorkerProcess, wait_for

pytestmark = pytest.mark.slow

BASE_ENV = {"CELERYOPS_SLOTS_CPU": "4", "CELERYOPS_SLOTS_DETECT": "0", "CELERYOPS_TEST_SLOT_COUNTDOWN": "0.3"}
THIS_HOST = f"host:{socket.gethostname()}"  # the pool of workers started here without CELERYOPS_SLOTS_HOST


def test_four_slots_run_two_tasks_of_two_at_a_time(
        redis_url: str, redis_client: redis.Redis, start_workers: Callable[..., list[WorkerProcess]],
        queue_name: str) -> None:
    env = {**BASE_ENV, "CELERYOPS_SLOTS_LEASE_TTL": "3", "CELERYOPS_SLOTS_SCOPE": "host",
           "CELERYOPS_SLOTS_HOST": "host-a"}
    (worker,) = start_workers(redis_url, app="celeryops_harness.slotapp", concurrency=4, queues=[queue_name],
                              env=env)
    # Two tasks hold all 4 slots until the test has seen a refused task tried again (not left to how fast a loaded
    # machine picks the tasks up), then the other ten run, two at a time.
    ids = [send(slot_hold, redis_url, queue_name, queue_name, f"t{i}") for i in range(2)]
    wait_for(lambda: redis_client.get("ct:slots:running") == "2", 60, "two tasks to hold all 4 slots")
    ids += [send(slot_sleep, redis_url, queue_name, 0.4, f"t{i}") for i in range(2, 12)]
    wait_for(lambda: "retry" in worker.log().lower(), 60,  # refused and tried again: none blocked the worker
             "a task refused for lack of slots to be tried again")
    release(redis_client, queue_name)
    wait_for(lambda: redis_client.llen("ct:finishes") >= 12, 120, "all 12 tasks to finish")
    assert sorted(redis_client.lrange("ct:finishes", 0, -1)) == sorted(ids)
    assert all(redis_client.get(f"ct:runs:{i}") == "1" for i in ids)  # each ran once, inside its slots
    assert 1 <= int(redis_client.get("ct:slots:max") or 0) <= 2
    store = SlotStore(redis_client, "host:host-a")
    wait_for(lambda: store.snapshot().usage("cpu").used == 0, 30, "used to come back to 0")
    snap = read_all(redis_client)
    assert [p.pool for p in snap.pools] == ["host:host-a"]  # a per-host pool, no global one was written
    assert snap.pools[0].usage("cpu").total == 4 and snap.pools[0].holders == []


def test_slots_of_a_killed_worker_go_to_another_worker_after_the_ttl(
        redis_url: str, redis_client: redis.Redis, start_workers: Callable[..., list[WorkerProcess]],
        queue_name: str) -> None:
    env = {**BASE_ENV, "CELERYOPS_SLOTS_LEASE_TTL": "2"}
    q_a, q_b = f"{queue_name}-a", f"{queue_name}-b"
    (worker_a,) = start_workers(redis_url, app="celeryops_harness.slotapp", concurrency=2, queues=[q_a], env=env,
                                wait=False)
    (worker_b,) = start_workers(redis_url, app="celeryops_harness.slotapp", concurrency=2, queues=[q_b], env=env,
                                wait=False)
    control = Celery("slots_test_control", broker=redis_url)
    try:
        worker_a.wait_ready(control, timeout=60)
        worker_b.wait_ready(control, timeout=60)
    finally:
        control.close()
    store = SlotStore(redis_client, THIS_HOST)  # two workers of one machine share its pool
    for i in range(2):
        send(slot_hold, redis_url, q_a, q_a, f"long{i}")  # never released: worker A is killed holding them
    wait_for(lambda: store.snapshot().usage("cpu").used == 4 and redis_client.get("ct:slots:running") == "2", 60,
             "worker A to hold all 4 slots")
    t = send(slot_sleep, redis_url, q_b, 0.2, "after-kill")
    # B is refused again and again (more often than Celery's default max_retries=3) and never gives up
    wait_for(lambda: worker_b.log().count(f"[{t}] retry") >= 4, 60, "worker B to retry the task 4 times")
    assert not redis_client.hget(f"ct:run:{t}", "started")
    worker_a.kill()
    wait_for(lambda: redis_client.hget(f"ct:run:{t}", "finished"), 60, "worker B to run the task after the TTL")
    assert redis_client.hget(f"ct:run:{t}", "worker") == worker_b.nodename
    wait_for(lambda: store.reap() >= 0 and store.snapshot().usage("cpu").used == 0, 30, "all slots to be free")
    assert store.snapshot().holders == []

    # the seed's way: needs from the kwargs resource_type / resource_slots
    k = send(slot_kw, redis_url, q_b, 0, "kw", resource_type="cpu", resource_slots=3, gate=q_b)
    wait_for(lambda: any(h.task_id == k for h in store.snapshot().holders), 60, "the kwargs task to hold slots")
    (holder,) = store.snapshot().holders
    assert holder.slots == {"cpu": 3} and holder.worker == worker_b.nodename
    assert holder.task_name == "celeryops.testing.slot_kw" and holder.token is not None
    release(redis_client, q_b)
    wait_for(lambda: redis_client.hget(f"ct:run:{k}", "finished"), 60, "the kwargs task to finish")
    wait_for(lambda: store.snapshot().usage("cpu").used == 0, 30, "its slots to be released")


def test_an_eight_slot_task_among_a_stream_of_one_slot_tasks_gets_to_run(
        redis_url: str, redis_client: redis.Redis, start_workers: Callable[..., list[WorkerProcess]],
        queue_name: str) -> None:
    env = {**BASE_ENV, "CELERYOPS_SLOTS_CPU": "8", "CELERYOPS_SLOTS_LEASE_TTL": "5",
           "CELERYOPS_SLOTS_STARVATION_AFTER": "1"}
    start_workers(redis_url, app="celeryops_harness.slotapp", concurrency=6, queues=[queue_name], env=env)
    smalls = [send(slot_kw, redis_url, queue_name, 0.3, f"s{i}", resource_type="cpu", resource_slots=1)
              for i in range(20)]
    wait_for(lambda: redis_client.llen("ct:slots:order") >= 3, 60, "the stream to be running")
    big = send(slot_kw, redis_url, queue_name, 0.1, "big", resource_type="cpu", resource_slots=8)
    smalls += [send(slot_kw, redis_url, queue_name, 0.3, f"s{i}", resource_type="cpu", resource_slots=1)
               for i in range(20, 80)]
    wait_for(lambda: redis_client.hget(f"ct:run:{big}", "finished"), 120, "the 8-slot task to run")
    wait_for(lambda: redis_client.llen("ct:finishes") >= 81, 120, "the stream to finish")
    order = redis_client.lrange("ct:slots:order", 0, -1)
    assert sorted(order) == sorted(["big", *[f"s{i}" for i in range(80)]])
    # it ran in the middle of the stream (the guard reserved the 8 slots), not after the stream had dried up
    # (with CELERYOPS_SLOTS_STARVATION_AFTER=3600 it starts last)
    assert order.index("big") < len(order) - 20, order
    assert all(redis_client.get(f"ct:runs:{i}") == "1" for i in [big, *smalls])
    store = SlotStore(redis_client, THIS_HOST)
    wait_for(lambda: store.snapshot().usage("cpu").used == 0, 30, "all slots to be free")


def _start(start_workers: Callable[..., list[WorkerProcess]], redis_url: str, host: str, cpu: int, queue: str,
           **kw: Any) -> WorkerProcess:
    env = {**BASE_ENV, "CELERYOPS_SLOTS_LEASE_TTL": "2", "CELERYOPS_SLOTS_HOST": host, "CELERYOPS_SLOTS_CPU": str(cpu),
           "CELERYOPS_SLOTS_SHARED": "cpu", **kw.pop("env", {})}
    (worker,) = start_workers(redis_url, app="celeryops_harness.slotapp", queues=[queue], env=env, **kw)
    return worker


def _hosts(store: SlotStore) -> dict[str, tuple[dict[str, int], list[str]]]:
    return {hc.host: (hc.totals, hc.workers) for hc in store.snapshot().hosts if not hc.expired}


def test_a_global_pool_adds_up_the_live_hosts_of_different_sizes(
        redis_url: str, redis_client: redis.Redis, start_workers: Callable[..., list[WorkerProcess]],
        queue_name: str) -> None:
    """Two worker processes on hosts of 32 and 4 cpu share the global pool (cpu declared shared): 36, whichever
    starts last. A stopped worker withdraws its host, a killed one stops renewing and its contribution expires (Redis
    TIME); restarted, each adds its host again."""
    store = SlotStore(redis_client)
    big = _start(start_workers, redis_url, "host-big", 32, f"{queue_name}-big")
    small = _start(start_workers, redis_url, "host-small", 4, f"{queue_name}-small")  # starts last, adds 4
    wait_for(lambda: store.snapshot().usage("cpu").total == 36, 60, "the pool to hold 32 + 4 cpu")
    assert _hosts(store) == {"host-big": ({"cpu": 32}, [big.nodename]), "host-small": ({"cpu": 4}, [small.nodename])}

    small.signal(signal.SIGTERM)  # warm shutdown: the worker takes its contribution out
    wait_for(lambda: not small.alive(), 60, "the small worker to stop")
    assert "withdrawn from pool global" in small.log()
    wait_for(lambda: store.snapshot().usage("cpu").total == 32, 30, "the pool to shrink to 32")
    small = _start(start_workers, redis_url, "host-small", 4, f"{queue_name}-small")
    wait_for(lambda: store.snapshot().usage("cpu").total == 36, 60, "the pool to grow back to 36")

    big.kill()  # SIGKILL: nothing is withdrawn, the contribution expires after its TTL
    assert "withdrawn" not in big.log()
    wait_for(lambda: store.snapshot().usage("cpu").total == 4, 30, "the killed host's contribution to expire")
    # the survivor's heartbeat reaps it: the total the next acquire reads is 4 as well
    wait_for(lambda: redis_client.hget(store.keys[0], "total:cpu") == "4", 30, "the live worker to reap it")
    assert _hosts(store) == {"host-small": ({"cpu": 4}, [small.nodename])}
    big = _start(start_workers, redis_url, "host-big", 32, f"{queue_name}-big")
    wait_for(lambda: store.snapshot().usage("cpu").total == 36, 60, "the restarted host to be added again")
    assert set(_hosts(store)) == {"host-big", "host-small"}


def test_tasks_above_the_total_left_by_a_killed_host_keep_running(
        redis_url: str, redis_client: redis.Redis, start_workers: Callable[..., list[WorkerProcess]],
        queue_name: str) -> None:
    """6 cpu (4 + 2) all held by three tasks on the 4-cpu host; the 2-cpu host is killed: the total drops to 4
    under 6 used, no lease is revoked (the tasks renew, finish, run once), and new acquires are refused until the
    running leases have ended. The workers keep the fleet-wide pool of before per-host pools
    (CELERYOPS_SLOTS_SCOPE=global), where this overload of host-a is possible."""
    store = SlotStore(redis_client)
    q_a = f"{queue_name}-a"
    old = {"CELERYOPS_SLOTS_SCOPE": "global", "CELERYOPS_SLOTS_SHARED": ""}
    a = _start(start_workers, redis_url, "host-a", 4, q_a, concurrency=3, env=old)
    b = _start(start_workers, redis_url, "host-b", 2, f"{queue_name}-b", env=old)
    wait_for(lambda: store.snapshot().usage("cpu").total == 6, 60, "the pool to hold 4 + 2 cpu")
    ids = [send(slot_hold, redis_url, q_a, q_a, f"long{i}") for i in range(3)]  # until the holders were read
    wait_for(lambda: redis_client.get("ct:slots:running") == "3", 60, "the three tasks to hold all 6 cpu")
    b.kill()

    def over() -> bool:
        cpu = store.snapshot().usage("cpu")
        return cpu.total == 4 and cpu.used == 6

    wait_for(over, 30, "the total to drop to 4 while the 6 cpu stay held")
    assert not store.acquire("probe", {"cpu": 1}, ttl=30, starvation_after=3600).ok
    assert {h.task_id for h in store.snapshot().holders} == set(ids)
    release(redis_client, q_a)
    wait_for(lambda: all(redis_client.hget(f"ct:run:{i}", "finished") for i in ids), 60, "the tasks to finish")
    assert all(redis_client.get(f"ct:runs:{i}") == "1" for i in ids)
    assert "LEASE LOST" not in a.log()
    wait_for(lambda: store.snapshot().usage("cpu").used == 0, 30, "the slots to come back")
    assert store.acquire("probe", {"cpu": 4}, ttl=30).ok
