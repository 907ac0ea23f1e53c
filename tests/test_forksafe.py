"""No celeryops thread is alive in a prefork worker's main process when its pool forks a child (issue 34), with the
fence and the slots installed as the README installs them and every task run in a fresh child
(``worker_max_tasks_per_child = 1``): a lock such a thread held at the fork (logging's, a Redis client's) would stay
held forever in the child. The harness app (``celeryops_harness.forkapp``) records the names of the threads alive at
each fork; meanwhile the fence still stops consumption and the slots still gate and wake, from the worker's event
loop. Real redis-servers, real Celery workers."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from celeryops.demo.standins.redis_server import RedisServer
from celeryops.fence import FenceStore, PluginWorkerInfo, plugin_workers
from celeryops.slots import SlotStore
from celeryops_harness.forkapp import FORK_LOG, forks, touch
from celeryops_harness.slotapp import send, slot_gpu
from celeryops_harness.workers import WorkerProcess, wait_for

pytestmark = pytest.mark.slow

WAIT = 120.0  # generous: the machine is shared
ENV = {"CELERYOPS_SLOTS_GPU": "1", "CELERYOPS_SLOTS_CPU": "8", "CELERYOPS_SLOTS_DETECT": "0",
       "CELERYOPS_SLOTS_LEASE_TTL": "3",  # the main process renews the host's contribution every second
       "CELERYOPS_SLOTS_HOST_TTL": "3",
       "CELERYOPS_TEST_SLOT_COUNTDOWN": "3600",  # a parked task's retry is an hour away: only the handoff starts it
       "CELERYOPS_FENCE_INTERVAL": "0.2"}


def ours(threads: list[str]) -> list[str]:
    return [t for t in threads if t.startswith("celeryops")]


def touches(broker: str, queue: str, n: int) -> list[str]:
    with touch.app.connection_for_write(broker) as conn:
        return [str(touch.apply_async(queue=queue, connection=conn).id) for _ in range(n)]


def finished(client: redis.Redis, ids: list[str]) -> bool:
    return all(client.hget(f"ct:run:{i}", "finished") for i in ids)


def entry(client: redis.Redis, worker: WorkerProcess) -> PluginWorkerInfo | None:
    return plugin_workers(client).get(worker.nodename)


def beats(client: redis.Redis, worker: WorkerProcess) -> int:
    info = entry(client, worker)
    return -1 if info is None else info.beats


def start(start_workers: Callable[..., list[WorkerProcess]], broker: str, queue: str, fork_log: Path,
          **env: str) -> WorkerProcess:
    (worker,) = start_workers(broker, app="celeryops_harness.forkapp", pool="prefork", concurrency=2, queues=[queue],
                              env={**ENV, FORK_LOG: str(fork_log), **env})
    return worker


def test_a_prefork_worker_forks_with_no_celeryops_thread_and_both_plugins_work(
        redis_url: str, redis_client: redis.Redis, start_workers: Callable[..., list[WorkerProcess]],
        queue_name: str, tmp_path: Path) -> None:
    fork_log = tmp_path / "forks.jsonl"
    host = "forksafe"
    worker = start(start_workers, redis_url, queue_name, fork_log, CELERYOPS_SLOTS_HOST=host)
    store = SlotStore(redis_client, f"host:{host}")

    # slots: a 1-GPU host and a backlog that only the handoff can start, each task in a child forked for it
    ids = [send(slot_gpu, redis_url, queue_name, 0.2, f"g{i}") for i in range(6)]
    wait_for(lambda: redis_client.llen("ct:finishes") >= len(ids), WAIT,
             "every GPU task to run (their retries are an hour away: only the handoff starts them)")
    assert all(redis_client.get(f"ct:runs:{i}") == "1" for i in ids)
    assert int(redis_client.get("ct:gpu:overlap") or 0) == 1  # never two tasks on the device
    wait_for(lambda: store.snapshot().usage("gpu").used == 0, 30, "the GPU to be free")
    # the host's contribution (3 s TTL) outlives many TTLs: the main process renews it
    wait_for(lambda: all(hc.age > 6 for hc in store.snapshot().hosts), 60, "two contribution TTLs to pass")
    assert store.snapshot().usage("gpu").total == 1

    # fence: a raised fence stops consumption, its lift resumes it
    fence = FenceStore(redis_client)
    fence.raise_fence("run-fork", [queue_name], "test", ttl=60)
    held = wait_for(lambda: (e := entry(redis_client, worker)) is not None and e.state == "held" and e, WAIT,
                    "the worker to hold its queue")
    assert isinstance(held, PluginWorkerInfo)
    fenced = touches(redis_url, queue_name, 3)
    wait_for(lambda: beats(redis_client, worker) >= held.beats + 5, WAIT, "five more fence heartbeats")
    assert not any(redis_client.hget(f"ct:run:{i}", "started") for i in fenced), "a task started under the fence"
    assert fence.lift("run-fork")
    wait_for(lambda: finished(redis_client, fenced), WAIT, "the fenced tasks after the lift")

    # the first two children, then one for each task run (forked once the child that ran it has exited)
    wait_for(lambda: len(forks(fork_log, worker.pid)) >= 2 + len(ids) + len(fenced), WAIT, "a child for every task")
    seen = forks(fork_log, worker.pid)
    assert not [ours(t) for t in seen if ours(t)], f"celeryops threads alive at a fork: {seen}"
    assert "slots: host forksafe:" in worker.log()  # the start-up lines reach the worker's log


def test_the_fence_beats_while_the_worker_reconnects_to_its_broker_and_no_fork_sees_it(
        redis_url: str, redis_client: redis.Redis, own_redis: RedisServer,
        start_workers: Callable[..., list[WorkerProcess]], queue_name: str, tmp_path: Path) -> None:
    """The broker (own_redis) goes away: the consumer's loop stops while it reconnects, so a thread keeps the fence's
    registry heartbeat (a silent worker whose heartbeat expired would count as gone); it ends before the loop runs
    again, and the children forked after the reconnect see no celeryops thread."""
    fork_log = tmp_path / "forks.jsonl"
    worker = start(start_workers, own_redis.url, queue_name, fork_log, CELERYOPS_SLOTS_HOST="forksafe-reconnect",
                   CELERYOPS_FENCE_REDIS_URL=redis_url, CELERYOPS_SLOTS_REDIS_URL=redis_url)
    wait_for(lambda: beats(redis_client, worker) >= 1, WAIT, "the first fence heartbeat")
    own_redis.stop()
    try:
        down = beats(redis_client, worker)
        wait_for(lambda: beats(redis_client, worker) >= down + 5, WAIT, "five fence heartbeats without a broker")
    finally:
        own_redis.start()
    wait_for(lambda: (e := entry(redis_client, worker)) is not None and e.consumer_starts >= 2, WAIT,
             "the consumer to start again")
    ids = touches(own_redis.url, queue_name, 4)
    wait_for(lambda: finished(redis_client, ids), WAIT, "the tasks after the reconnect")
    wait_for(lambda: len(forks(fork_log, worker.pid)) >= 2 + len(ids), WAIT, "a child for every task")
    seen = forks(fork_log, worker.pid)
    assert not [ours(t) for t in seen if ours(t)], f"celeryops threads alive at a fork: {seen}"


def test_a_hung_plugin_redis_does_not_stall_consuming(
        redis_url: str, redis_client: redis.Redis, own_redis: RedisServer,
        start_workers: Callable[..., list[WorkerProcess]], queue_name: str, tmp_path: Path) -> None:
    """The fence's and the slots' Redis (own_redis) stops answering (SIGSTOP: connections open, no reply) while the
    broker works: every call the plugins make on the worker's event loop is bounded, so the worker goes on fetching
    and forking a child for each task; once that Redis answers again, the fence heartbeat resumes."""
    fork_log = tmp_path / "forks.jsonl"
    worker = start(start_workers, redis_url, queue_name, fork_log, CELERYOPS_SLOTS_HOST="forksafe-hung",
                   CELERYOPS_FENCE_REDIS_URL=own_redis.url, CELERYOPS_SLOTS_REDIS_URL=own_redis.url)
    plugin_redis = redis.Redis.from_url(own_redis.url, decode_responses=True)
    wait_for(lambda: beats(plugin_redis, worker) >= 1, WAIT, "the first fence heartbeat")
    assert own_redis.pid is not None
    os.kill(own_redis.pid, signal.SIGSTOP)
    try:
        ids = touches(redis_url, queue_name, 30)
        wait_for(lambda: finished(redis_client, ids), WAIT, "every task while the plugins' Redis hangs")
    finally:
        os.kill(own_redis.pid, signal.SIGCONT)
    hung = beats(plugin_redis, worker)
    wait_for(lambda: beats(plugin_redis, worker) >= hung + 3, WAIT, "the fence heartbeat once Redis answers again")
    assert "cannot read the drain fence" in worker.log()
    plugin_redis.close()
