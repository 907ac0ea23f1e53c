"""The handoff on real Celery worker processes (celeryops_harness.slotapp) with a real redis-server: a 1-GPU host
and a backlog of GPU tasks whose fallback retry is an hour away, so only the handoff can start them: each starts
when the one before releases the device, on every pool (prefork, threads, solo), with acks_late on and off and for a
task with its own countdown; each runs exactly once and never two on the device at once."""

from __future__ import annotations

import signal
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


def test_a_killed_holder_and_a_lost_wake_up_leave_no_task_lost_or_doubled(
        redis_url: str, redis_client: redis.Redis, start_workers: Callable[..., list[WorkerProcess]],
        queue_name: str) -> None:
    """Worker A holds the host's GPU and is killed (SIGKILL); worker B, frozen meanwhile, has four tasks parked.
    A's lease expires and is handed to the first of them, whose wake-up is then lost (popped by a waker that dies:
    here the test, the only one blocked on the wake list). B thaws: the fallback retries run every task, each
    exactly once, never two on the device."""
    env = {**ENV, "CELERYOPS_SLOTS_HOST": "handoff-kill", "CELERYOPS_SLOTS_LEASE_TTL": "3",
           "CELERYOPS_SLOTS_HOST_TTL": "120",  # the host's contribution outlives B's freeze
           "CELERYOPS_TEST_SLOT_COUNTDOWN": "2"}
    q_a, q_b = f"{queue_name}-a", f"{queue_name}-b"
    (a,) = start_workers(redis_url, app="celeryops_harness.slotapp", concurrency=1, queues=[q_a], env=env)
    (b,) = start_workers(redis_url, app="celeryops_harness.slotapp", concurrency=3, queues=[q_b], env=env)
    store = SlotStore(redis_client, "host:handoff-kill")
    send(slot_gpu, redis_url, q_a, 0, "long", gate=q_a)  # never released: A is killed holding the GPU
    wait_for(lambda: redis_client.get("ct:gpu:overlap") == "1", 60, "worker A to hold the GPU")
    ids = [send(slot_gpu, redis_url, q_b, 0.2, f"b{i}") for i in range(4)]
    wait_for(lambda: len(store.snapshot().waiting) == 4, 60, "the four tasks to be parked")
    b.signal(signal.SIGSTOP)
    try:
        a.kill()
        redis_client.set("ct:gpu:0", 0)  # the killed task never counts itself out: B runs nothing while frozen
        redis_client.set("ct:gpu:overlap", 0)
        # B's waker sent its BLPOP before the freeze: Redis would hand it the message (a wake-up B sends when it
        # thaws). Cut that connection, so the test pops the message instead, like a waker that dies with it.
        for c in redis_client.client_list():
            if c.get("cmd") == "blpop":
                redis_client.client_kill_filter(_id=c["id"])
        wait_for(lambda: store.tick().reaped >= 1, 30, "A's lease to expire and be handed off")
        lost = redis_client.lpop(store.wake_key)
        assert lost is not None and redis_client.llen(store.wake_key) == 0
    finally:
        b.signal(signal.SIGCONT)
    wait_for(lambda: all(redis_client.hget(f"ct:run:{i}", "finished") for i in ids), 120,
             "every parked task to run by its fallback retry")
    assert all(redis_client.get(f"ct:runs:{i}") == "1" for i in ids)
    assert int(redis_client.get("ct:gpu:overlap") or 0) == 1
    wait_for(lambda: store.snapshot().usage("gpu").used == 0, 30, "no slot left held")
