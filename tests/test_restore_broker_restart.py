"""A restore over a broker restart: the consumers a drain stopped come back although the broker (Redis) is down
when the restore begins and only answers again a moment later (chaos seed 114: a SIGINT during the deploy, the
broker restarting, and the deploy exited saying the recovery rules were applied with its consumers still stopped).
A broker that never comes back within the patience is reported, not waited for forever. A worker that has not yet
reconnected after a Redis restart is not taken for gone (it would come back with its queue still stopped)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest
import redis

from celeryops.adapters.fleet import Fleet
from celeryops.core.errors import BrokerUnreachable
from celeryops.core.events import Notice
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.ops.drain.engine import restore_consumers
from celeryops.ops.drain.membership import NO_LISTENER, gone_now
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
        waits: list[Notice] = []

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
        broker_waits = [n for n in waits if "The broker does not answer" in n.message]
        assert len(broker_waits) == 1, "the operator is told once why the restore takes longer"
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


@pytest.mark.slow
def test_a_worker_still_reconnecting_after_a_redis_restart_is_not_taken_for_gone(
        own_redis: RedisServer, start_workers: Any, queue_name: str) -> None:
    """The worker is frozen (SIGSTOP) through a Redis restart, so it has not reconnected when the restore runs: no
    listener on the control channel, as for a SIGKILLed worker. Taken for gone, it would be skipped and the restore
    reported as confirmed, and the worker would come back with its queue stopped. It is reported as unconfirmed
    instead, and once it has reconnected the restore (``abort`` again) brings its consumer back."""
    (worker,) = start_workers(own_redis.url, queues=[queue_name], pool="solo")
    app = control_app(own_redis.url)
    began = time.time() - 10  # the run began before the restart

    async def restore(patience: float) -> Any:
        fleet = Fleet(app, timeout=1.0)
        try:
            return await restore_consumers(fleet, {worker.nodename: (queue_name,)}, since=began, patience=patience)
        finally:
            fleet.close()

    try:
        app.control.cancel_consumer(queue_name, destination=[worker.nodename], reply=True, timeout=5.0)
        wait_for(lambda: consuming(app, worker.nodename) == [], WAIT, "the consumer to be cancelled")
        os.kill(worker.pid, signal.SIGSTOP)  # it reconnects only once thawed
        try:
            own_redis.restart()
            event = asyncio.run(restore(2.0))  # the worker stays frozen through the restore's whole patience
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        assert not event.verified and event.missing == {worker.nodename: (queue_name,)}, event
        wait_for(lambda: consuming(app, worker.nodename) is not None, WAIT, "the worker to reconnect")
        again = asyncio.run(restore(30.0))
        assert again.verified, again
        wait_for(lambda: consuming(app, worker.nodename) == [queue_name], WAIT, "the consumer back")
    finally:
        app.close()


def test_listener_evidence_counts_again_for_a_run_begun_after_the_restart(own_redis: RedisServer) -> None:
    """Nobody listens for ``celery@ghost``: gone by evidence, except for a run begun before a restart less than a
    minute ago (it may be reconnecting); a run begun after the restart reads the evidence as before."""
    app = control_app(own_redis.url)
    fleet = Fleet(app, timeout=1.0)

    async def gone(since: float) -> dict[str, str]:
        return await gone_now(fleet, ["celery@ghost"], [], await fleet.pidbox_listeners(since), since)

    client = redis.Redis.from_url(own_redis.url)
    try:  # the run began 2 s ago, the server a while before that (uptime counts in whole seconds)
        wait_for(lambda: int(client.info("server")["uptime_in_seconds"]) >= 5, 30, "the server to be up 5 s")
        before_restart = time.time() - 2
        assert asyncio.run(gone(before_restart)) == {"celery@ghost": NO_LISTENER}
        own_redis.restart()
        assert asyncio.run(gone(before_restart)) == {}
        assert asyncio.run(gone(time.time())) == {"celery@ghost": NO_LISTENER}
    finally:
        client.close()
        fleet.close()
        app.close()
