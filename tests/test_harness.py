"""The harness itself: the private redis-server restarts on its port; a real worker runs a task."""

from __future__ import annotations

import redis

from celeryops.demo.standins.redis_server import RedisServer
from celeryops_harness.taskapp import sleep
from celeryops_harness.workers import wait_for


def test_private_redis_restarts_on_same_port(own_redis: RedisServer) -> None:
    client = redis.Redis.from_url(own_redis.url)
    client.set("k", "v")
    port = own_redis.port
    own_redis.restart()
    assert own_redis.port == port
    assert client.get("k") is None  # nothing persisted: a restart is a clean server
    assert client.ping()


def test_worker_runs_a_task(redis_url: str, redis_client: redis.Redis, start_workers, queue_name: str) -> None:
    (worker,) = start_workers(redis_url, queues=[queue_name])
    with sleep.app.connection_for_write(redis_url) as conn:
        result = sleep.apply_async(args=(0.1, "x"), queue=queue_name, connection=conn)
    wait_for(lambda: redis_client.hget(f"ct:run:{result.id}", "finished"), 20, "the task to finish")
    assert redis_client.hget(f"ct:run:{result.id}", "worker") == worker.nodename
    assert redis_client.get(f"ct:runs:{result.id}") == "1"
