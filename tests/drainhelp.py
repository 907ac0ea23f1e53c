"""Helpers for drain tests: enqueue recorded tasks, read their start/finish records."""

from __future__ import annotations

from typing import Any

import redis

from celeryops_harness.taskapp import hold, sleep


def enqueue(broker: str, queue: str, seconds: float, n: int = 1, **options: Any) -> list[str]:
    ids = []
    with sleep.app.connection_for_write(broker) as conn:
        for i in range(n):
            ids.append(sleep.apply_async(args=(seconds, f"t{i}"), queue=queue, connection=conn, **options).id)
    return ids


def enqueue_hold(broker: str, queue: str, gate: str, n: int = 1, **options: Any) -> list[str]:
    """Tasks that run until the test calls ``taskapp.release(record_client, gate)``."""
    with hold.app.connection_for_write(broker) as conn:
        return [hold.apply_async(args=(gate, f"h{i}"), queue=queue, connection=conn, **options).id for i in range(n)]


def runs(client: redis.Redis, task_id: str) -> dict[str, Any]:
    data = client.hgetall(f"ct:run:{task_id}")
    count = client.get(f"ct:runs:{task_id}")
    return {**{k: float(v) if k in ("started", "finished") else v for k, v in data.items()}, "runs": int(count or 0)}


def started(client: redis.Redis, ids: list[str]) -> list[str]:
    return [i for i in ids if client.exists(f"ct:run:{i}")]


def finished(client: redis.Redis, ids: list[str]) -> list[str]:
    return [i for i in ids if client.hget(f"ct:run:{i}", "finished")]
