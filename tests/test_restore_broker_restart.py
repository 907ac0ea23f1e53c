"""A restore over a broker restart: the consumers a drain stopped come back although the broker (Redis) is down
when the restore begins and only answers again a moment later (chaos seed 114: a SIGINT during the deploy, the
broker restarting, and the deploy exited saying the recovery rules were applied with its consumers still stopped).
A broker that never comes back within the patience is reported, not waited for forever."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from celeryops.adapters.fleet import Fleet
from celeryops.core.errors import BrokerUnreachable
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.ops.drain import restore_consumers
from celeryops_harness.workers import control_app, wait_for

WAIT = 60.0


def consuming(app: Any, name: str) -> list[str] | None:
    replies = app.control.inspect(destination=[name], timeout=2.0, limit=1).active_queues() or {}
    return None if name not in replies else sorted(q["name"] for q in replies[name] or [])


@pytest.mark.slow
def test_a_restore_waits_out_a_broker_restart_and_brings_the_consumers_back(
        own_redis: RedisServer, start_workers: Any, queue_name: str) -> None:
    (worker,) = start_workers(own_redis.url, queues=[queue_name])
    app = control_app(own_redis.url)
    try:
        app.control.cancel_consumer(queue_name, destination=[worker.nodename], reply=True, timeout=5.0)
        wait_for(lambda: consuming(app, worker.nodename) == [], WAIT, "the consumer to be cancelled")
        own_redis.stop()
        back = threading.Timer(1.5, own_redis.start)  # the broker answers again while the restore keeps trying
        waits: list[BrokerUnreachable] = []

        async def restore() -> Any:
            fleet = Fleet(app, timeout=2.0)
            try:
                return await restore_consumers(fleet, {worker.nodename: (queue_name,)}, on_wait=waits.append)
            finally:
                fleet.close()

        back.start()
        event = asyncio.run(restore())
        back.join()
        assert event.verified, event
        assert len(waits) == 1, "the operator is told once why the restore takes longer"
        wait_for(lambda: consuming(app, worker.nodename) == [queue_name], WAIT, "the consumer back after the restart")
    finally:
        app.close()


def test_a_broker_that_stays_down_ends_the_restore_after_its_patience(own_redis: RedisServer) -> None:
    app = control_app(own_redis.url)
    own_redis.stop()
    fleet = Fleet(app, timeout=1.0)
    try:
        with pytest.raises(BrokerUnreachable):
            asyncio.run(restore_consumers(fleet, {"celery@gone": ("q",)}, patience=1.0))
    finally:
        fleet.close()
        app.close()
