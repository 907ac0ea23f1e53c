"""Slots that protect each machine, on real Celery worker processes (celeryops_harness.slotapp) and a real
redis-server: a host's CPU slots limit what runs on that host whatever the other hosts have free; GPU slots are
devices, each request of the threads pool seeing its own through ``self.slot_devices``; ``after_return`` gives back
slots a task body took itself (the seed's safety net) in a prefork child; a worker without GPU says so once at
start, and its GPU task is listed as waiting with no capacity anywhere."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis

from celeryops.slots import SlotStore, read_all
from celeryops_harness.slotapp import send, slot_gpu, slot_manual, slot_sleep
from celeryops_harness.workers import WorkerProcess, wait_for

pytestmark = pytest.mark.slow

BASE_ENV = {"CELERYOPS_SLOTS_DETECT": "0", "CELERYOPS_TEST_SLOT_COUNTDOWN": "0.3", "CELERYOPS_SLOTS_LEASE_TTL": "5"}


def test_a_host_runs_no_more_than_its_own_cpus_whatever_other_hosts_have_free(
        redis_url: str, redis_client: redis.Redis, start_workers: Callable[..., list[WorkerProcess]],
        queue_name: str) -> None:
    """Two 4-cpu hosts consume one queue with concurrency 6 each; every task needs 2 cpu. Before per-host pools the
    fleet's pool held 8 and one host could run 4 such tasks (8 cpu on a 4-cpu machine); now each host runs 2 at
    most, and together they still run 4 at once."""
    env = {**BASE_ENV, "CELERYOPS_SLOTS_CPU": "4"}
    a, b = (start_workers(redis_url, app="celeryops_harness.slotapp", concurrency=6, queues=[queue_name],
                          env={**env, "CELERYOPS_SLOTS_HOST": host})[0] for host in ("host-a", "host-b"))
    ids = [send(slot_sleep, redis_url, queue_name, 0.3, f"t{i}") for i in range(16)]
    wait_for(lambda: redis_client.llen("ct:finishes") >= 16, 120, "the 16 tasks to finish")
    assert all(redis_client.get(f"ct:runs:{i}") == "1" for i in ids)
    for w in (a, b):
        assert 1 <= int(redis_client.get(f"ct:slots:max:{w.nodename}") or 0) <= 2, w.nodename
    snap = read_all(redis_client)
    assert sorted(p.pool for p in snap.pools) == ["host:host-a", "host:host-b"]  # no global pool: nothing shared
    for p in snap.pools:
        assert p.usage("cpu").total == 4 and [hc.host for hc in p.hosts] == [p.host]


def test_gpu_tasks_get_devices_of_their_own_under_the_threads_pool(
        redis_url: str, redis_client: redis.Redis, start_workers: Callable[..., list[WorkerProcess]],
        queue_name: str) -> None:
    """3 GPUs set by hand (devices 0, 1, 2), a threads-pool worker running 4 requests of one task object at once:
    three run together, each on its own device for its whole run (read at the start and again after the others
    started), never two on one device; the fourth waits for a device."""
    env = {**BASE_ENV, "CELERYOPS_SLOTS_CPU": "8", "CELERYOPS_SLOTS_GPU": "3", "CELERYOPS_SLOTS_HOST": "gpu-host"}
    start_workers(redis_url, app="celeryops_harness.slotapp", pool="threads", concurrency=4, queues=[queue_name],
                  env=env)
    ids = [send(slot_gpu, redis_url, queue_name, 0.5, f"g{i}", together=3) for i in range(6)]
    wait_for(lambda: redis_client.llen("ct:finishes") >= 6, 120, "the 6 GPU tasks to finish")
    assert redis_client.get("ct:slots:max") == "3"  # three ran at once (their barrier), not four: 3 devices
    assert redis_client.get("ct:gpu:overlap") == "1"  # never two tasks on one device
    for i in ids:
        start, end = (json.loads(x) for x in str(redis_client.get(f"ct:dev:{i}")).split("|"))
        assert start == end and len(start["gpu"]) == 1 and start["gpu"][0] in (0, 1, 2), (start, end)
    store = SlotStore(redis_client, "host:gpu-host")
    wait_for(lambda: store.snapshot().usage("gpu").used == 0, 30, "the devices to come back")
    assert [(d.device, d.free) for d in store.snapshot().devices] == [(0, True), (1, True), (2, True)]


def test_after_return_gives_back_slots_the_task_body_took_itself(
        redis_url: str, redis_client: redis.Redis, start_workers: Callable[..., list[WorkerProcess]],
        queue_name: str) -> None:
    """The seed's safety net: a body that acquires its slot and never releases it (its ``finally`` bypassed). The
    lease lives 60 s and the heartbeat renews it, so only ``after_return`` can free it once the task has returned."""
    env = {**BASE_ENV, "CELERYOPS_SLOTS_CPU": "2", "CELERYOPS_SLOTS_LEASE_TTL": "60", "CELERYOPS_SLOTS_HOST": "h"}
    start_workers(redis_url, app="celeryops_harness.slotapp", pool="prefork", concurrency=1, queues=[queue_name],
                  env=env)
    store = SlotStore(redis_client, "host:h")
    t = send(slot_manual, redis_url, queue_name, 1.0, "manual")
    wait_for(lambda: [h.task_id for h in store.snapshot().holders] == [t], 60, "the body to hold its slot")
    assert store.snapshot().usage("cpu").used == 1
    wait_for(lambda: redis_client.hget(f"ct:run:{t}", "finished"), 60, "the task to return")
    wait_for(lambda: store.snapshot().holders == [], 30, "after_return to release the lease")
    assert store.snapshot().usage("cpu").used == 0


def test_a_worker_without_gpu_says_so_at_start_and_its_gpu_task_has_no_capacity_anywhere(
        redis_url: str, redis_client: redis.Redis, start_workers: Callable[..., list[WorkerProcess]],
        queue_name: str) -> None:
    env = {**BASE_ENV, "CELERYOPS_SLOTS_DETECT": "1", "CELERYOPS_SLOTS_CPU": "4", "CUDA_VISIBLE_DEVICES": "",
           "CELERYOPS_SLOTS_HOST": "cpu-only"}
    (worker,) = start_workers(redis_url, app="celeryops_harness.slotapp", queues=[queue_name], env=env)
    log = worker.log()
    warning = ("1 task type(s) need gpu (celeryops.testing.slot_gpu) but host cpu-only has none [gpu 0 (")
    assert log.count(warning) == 1, log
    assert "CUDA_VISIBLE_DEVICES='' hides every GPU)]" in log and "set CELERYOPS_SLOTS_GPU=N" in log
    t = send(slot_gpu, redis_url, queue_name, 0.1, "nowhere")

    def waiting() -> list[Any]:
        pool = read_all(redis_client).pool("host:cpu-only")
        return [w for w in (pool.waiting if pool else []) if w.task_id == t]

    wait_for(waiting, 60, "the GPU task to be listed as waiting")
    (w,) = waiting()
    assert w.no_capacity and w.slots == {"cpu": 1, "gpu": 1} and not w.reserved
    snap = read_all(redis_client)
    pool = snap.pool("host:cpu-only")
    assert pool is not None and snap.capacity(pool, ["gpu"]) == {"cpu-only": {"gpu": 0}}
    assert not redis_client.hget(f"ct:run:{t}", "started")
