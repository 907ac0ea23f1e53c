"""Issue 22, item 5: on RabbitMQ, a worker whose pidbox queue vanished with the broker's connections (a broker
restart) is unconfirmed while it may still be reconnecting, not gone, for the same grace as on Redis. Real
RabbitMQ (a private vhost) and a real worker; the broker dropping every connection of the vhost stands in for its
restart (the shared RabbitMQ is not restarted), and the worker is held stopped so that it cannot reconnect yet."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from typing import Any

import pytest

from celeryops.adapters.fleet import Fleet
from celeryops.ops.drain.membership import gone_now
from celeryops_harness.workers import control_app, wait_for

pytestmark = [pytest.mark.amqp, pytest.mark.slow]


def test_a_worker_whose_pidbox_queue_vanished_with_a_broker_restart_is_unconfirmed_not_gone(
        amqp_vhost: str, amqp_url: str, redis_url: str, start_workers: Any, queue_name: str) -> None:
    url = amqp_url
    # AMQP heartbeats every few seconds: the broker's close of the connection reaches a stopped worker as bytes it
    # reads once it runs again, but under load its loop was seen to take more than a minute to notice; a heartbeat
    # it cannot send tells it at the next heartbeat check.
    (worker,) = start_workers(url, queues=[queue_name], env={"CELERYOPS_TEST_BROKER_HEARTBEAT": "4"})
    name = worker.nodename
    pidbox = f"{name}.celery.pidbox"
    app = control_app(url)
    fleet = Fleet(app, timeout=2.0)
    fresh = Fleet(app, timeout=2.0)  # reads the broker as it is, with no memory of a connection
    since = time.time()
    try:
        assert asyncio.run(fleet.pidbox_consumers([name], since)) == {name: 1}
        os.killpg(worker.pid, signal.SIGSTOP)  # still "reconnecting" for as long as the test wants
        try:
            subprocess.run(["rabbitmqctl", "-q", "close_all_connections", "-p", amqp_vhost, "broker restart"],
                           check=True, capture_output=True, timeout=60)
            wait_for(lambda: asyncio.run(fresh.queue_consumers([pidbox])) == {pidbox: 0}, 30,
                     "the worker's pidbox queue to go with its connection")
            # The fleet that saw its own connection break reads no evidence: unconfirmed, not gone.
            assert asyncio.run(fleet.pidbox_consumers([name], since)) == {name: None}
            assert asyncio.run(gone_now(fleet, [name], [], None, since)) == {}
        finally:
            os.killpg(worker.pid, signal.SIGCONT)
        wait_for(lambda: asyncio.run(fresh.queue_consumers([pidbox])) == {pidbox: 1}, 120,
                 "the worker to reconnect and declare its pidbox queue again")
    finally:
        fleet.close()
        fresh.close()
        app.close()

