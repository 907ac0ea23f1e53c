"""The harness itself: the private redis-server restarts on its port; a real worker runs a task; a bad release's
``work`` fails as often as its worker's CELERYOPS_TEST_FAIL_RATE says; the bursty trace of bench_autoscale replays
from its seed, scales every duration, and its producer records each task's send time beside its start and finish."""

from __future__ import annotations

import pytest
import redis

from celeryops.demo.standins.redis_server import PRIVATE_PORTS, PortTaken, RedisServer
from celeryops_harness.taskapp import records, sleep, work
from celeryops_harness.trace import BurstTrace, TraceProducer
from celeryops_harness.workers import wait_for


def test_private_redis_restarts_on_same_port(own_redis: RedisServer) -> None:
    client = redis.Redis.from_url(own_redis.url)
    client.set("k", "v")
    port = own_redis.port
    own_redis.restart()
    assert own_redis.port == port
    assert client.get("k") is None  # nothing persisted: a restart is a clean server
    assert client.ping()


def answering_pid(server: RedisServer) -> int:
    client = redis.Redis.from_url(server.url)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def test_private_redis_never_takes_another_servers_port() -> None:
    """The session's server restarts on its port; if another server took the port meanwhile, the restart must fail
    loudly, not hand the session the other server (whose test would flush it, stop it, and close our
    connections). Before its first start a server that picked its port itself moves to another free one."""
    first = RedisServer()
    taker = RedisServer(port=first.port)
    try:
        assert first.port in PRIVATE_PORTS  # below the ephemeral range that outgoing connections use
        taker.start()
        first.start()  # its port was taken before it ever started: it moves
        assert first.port != taker.port and answering_pid(first) != answering_pid(taker)
        port = first.port
        first.stop()
        taker.stop()
        taker.port = port  # another server takes the port while the first one is down
        taker.start()
        with pytest.raises(PortTaken, match=f"port {port} on 127.0.0.1 is taken by another"):
            first.start()
        assert first.port == port and not first.running
        assert answering_pid(taker) == taker.pid  # the other server is left alone
    finally:
        first.close()
        taker.close()


def test_worker_runs_a_task(redis_url: str, redis_client: redis.Redis, start_workers, queue_name: str) -> None:
    (worker,) = start_workers(redis_url, queues=[queue_name])
    with sleep.app.connection_for_write(redis_url) as conn:
        result = sleep.apply_async(args=(0.1, "x"), queue=queue_name, connection=conn)
    wait_for(lambda: redis_client.hget(f"ct:run:{result.id}", "finished"), 20, "the task to finish")
    assert redis_client.hget(f"ct:run:{result.id}", "worker") == worker.nodename
    assert redis_client.get(f"ct:runs:{result.id}") == "1"


def test_work_fails_only_on_a_worker_with_a_fail_rate(redis_url: str, redis_client: redis.Redis, start_workers,
                                                     queue_name: str) -> None:
    """``work`` on a worker without CELERYOPS_TEST_FAIL_RATE always succeeds, on one with 1 always fails (the fence
    app runs it too); either way the run is recorded, a failure with ``failed`` and in ct:failed."""
    (good,) = start_workers(redis_url, queues=[f"{queue_name}.good"])
    (bad,) = start_workers(redis_url, queues=[f"{queue_name}.bad"], app="celeryops_harness.fenceapp",
                           env={"CELERYOPS_TEST_FAIL_RATE": "1", "CELERYOPS_FENCE_INTERVAL": "0.3"})
    with work.app.connection_for_write(redis_url) as conn:
        sent = {side: [work.apply_async(args=(0.01, side), queue=f"{queue_name}.{side}", connection=conn).id
                       for _ in range(5)] for side in ("good", "bad")}
    ids = [*sent["good"], *sent["bad"]]
    wait_for(lambda: all(redis_client.hget(f"ct:run:{t}", "finished") for t in ids), 30, "every task to finish")
    assert all(redis_client.get(f"ct:runs:{t}") == "1" for t in ids)
    assert sorted(redis_client.lrange("ct:failed", 0, -1)) == sorted(sent["bad"])
    assert {redis_client.hget(f"ct:run:{t}", "worker") for t in sent["bad"]} == {bad.nodename}
    assert not any(redis_client.hget(f"ct:run:{t}", "failed") for t in sent["good"])
    assert {redis_client.hget(f"ct:run:{t}", "worker") for t in sent["good"]} == {good.nodename}
    assert "BadReleaseError" in bad.log()


def test_a_burst_trace_replays_from_its_seed_and_scales_every_duration() -> None:
    trace = BurstTrace.draw(3)
    assert trace == BurstTrace.draw(3) and trace != BurstTrace.draw(4)
    assert len(trace.bursts) == 3 and all(3 <= len(b) <= 9 for b in trace.bursts)
    assert all(30.0 <= t.seconds <= 120.0 for t in trace.tasks)
    for before, after in zip(trace.bursts, trace.bursts[1:], strict=False):  # an idle gap between bursts
        assert after[0].at - before[-1].at >= 150.0
    fast = BurstTrace.draw(3, 0.1)
    assert [(t.at, t.seconds) for t in fast.tasks] == [
        (pytest.approx(t.at * 0.1, abs=0.002), pytest.approx(t.seconds * 0.1, abs=0.002)) for t in trace.tasks]


def test_the_trace_producer_records_send_start_and_finish(redis_url: str, redis_client: redis.Redis, start_workers,
                                                          queue_name: str) -> None:
    start_workers(redis_url, queues=[queue_name])
    trace = BurstTrace.draw(1, 0.002, bursts=2, size=(2, 2))  # four tasks of 0.06-0.24 s, within a second
    producer = TraceProducer(redis_url, redis_url, queue_name, sleep, trace).start()
    assert producer.done.wait(30)
    wait_for(lambda: all(r.get("finished") for r in records(redis_client, producer.ids).values()), 30,
             "every task of the trace to finish")
    assert len(producer.ids) == 4
    for rec in records(redis_client, producer.ids).values():
        assert float(rec["sent"]) <= float(rec["started"]) <= float(rec["finished"]) and rec["runs"] == 1
