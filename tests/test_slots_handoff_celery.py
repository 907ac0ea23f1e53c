"""The handoff on real Celery worker processes (celeryops_harness.slotapp) with a real redis-server: a 1-GPU host
and a backlog of GPU tasks whose fallback retry is an hour away, so only the handoff can start them: each starts
when the one before releases the device, on every pool (prefork, threads, solo), with acks_late on and off and for a
task with its own countdown; each runs exactly once and never two on the device at once."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from celeryops.slots import SlotStore
from celeryops_harness.slotapp import send, slot_gpu
from celeryops_harness.workers import WorkerProcess, wait_for

pytestmark = pytest.mark.slow

ENV = {"CELERYOPS_SLOTS_GPU": "1", "CELERYOPS_SLOTS_CPU": "8", "CELERYOPS_SLOTS_DETECT": "0",
       "CELERYOPS_SLOTS_LEASE_TTL": "30", "CELERYOPS_TEST_SLOT_COUNTDOWN": "3600"}


@pytest.mark.parametrize(("pool", "acks_late"), [("prefork", "0"), ("threads", "1"), ("solo", "1")])
def test_a_freed_gpu_starts_the_next_waiting_task_on_every_pool(
        redis_url: str, redis_client: redis.Redis, start_workers: Callable[..., list[WorkerProcess]],
        queue_name: str, pool: str, acks_late: str) -> None:
    host = f"handoff-{pool}"
    env = {**ENV, "CELERYOPS_SLOTS_HOST": host, "CELERYOPS_TEST_ACKS_LATE": acks_late}
    # solo runs one task at a time: two solo workers, so a refused task and a running one can coexist
    n, concurrency = (2, 1) if pool == "solo" else (1, 3)
    workers = start_workers(redis_url, n=n, app="celeryops_harness.slotapp", pool=pool, concurrency=concurrency,
                            queues=[queue_name], env=env)
    ids = [send(slot_gpu, redis_url, queue_name, 0.2, f"t{i}") for i in range(5)]
    # a task with its own countdown: it waits for its ETA, then for the GPU like the others
    with slot_gpu.app.connection_for_write(redis_url) as conn:
        ids.append(str(slot_gpu.apply_async(args=(0.2, "eta"), queue=queue_name, countdown=1, connection=conn).id))
    wait_for(lambda: redis_client.llen("ct:finishes") >= len(ids), 120,
             "every task to run (their retries are an hour away: only the handoff starts them)")
    assert sorted(redis_client.lrange("ct:finishes", 0, -1)) == sorted(ids)
    assert all(redis_client.get(f"ct:runs:{i}") == "1" for i in ids)
    assert int(redis_client.get("ct:gpu:overlap") or 0) == 1  # never two tasks on the device
    store = SlotStore(redis_client, f"host:{host}")
    wait_for(lambda: store.snapshot().usage("gpu").used == 0, 30, "the GPU to be free")
    logs = "".join(w.log() for w in workers)
    assert "retry" in logs.lower()  # tasks were refused and parked, not held in a worker process
