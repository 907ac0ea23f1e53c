"""Published run status on a real redis-server: round trip, coalescing, Redis down, read-only readers."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from celeryops.demo.standins.redis_server import RedisServer
from celeryops.ops.fleetwide.lease import RunLease, read_lease
from celeryops.ops.fleetwide.publish import Publisher, events_key, read_events, read_status, status_key


def make(client: redis.Redis, **kw: object) -> Publisher:
    return Publisher(client, "prod", run_id="run-1", owner="alice", host="box1", release="v42",
                     started_at=1000.0, **kw)  # type: ignore[arg-type]


async def test_status_and_events_round_trip(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    pub = make(client, ttl=600)
    pub.start()
    pub.phase("stopping")
    pub.progress({"in_flight": 3, "broker": "redis://:pw@h/0"})
    pub.event("note", {"text": "worker w9 appeared"})
    assert await pub.close()

    status = read_status(client, "prod")
    assert status is not None
    assert (status.run_id, status.phase, status.owner, status.host, status.release, status.started_at) == (
        "run-1", "stopping", "alice", "box1", "v42", 1000.0)
    assert status.progress == {"in_flight": 3, "broker": "redis://:***@h/0"}
    events = read_events(client, "prod")
    assert [e.kind for e in events] == ["phase", "note", "progress"]
    assert events[0].data == {"phase": "stopping"} and events[0].run_id == "run-1"
    assert read_events(client, "prod", events[0].id) == events[1:]
    assert read_events(client, "prod", events[-1].id) == []
    for key in (status_key("prod"), events_key("prod")):
        assert 0 < client.ttl(key) <= 600


async def test_bursts_are_coalesced_and_latest_progress_wins(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    pub = make(client, max_writes_per_second=2.0)
    pub.start()
    await asyncio.sleep(0)  # let the writer start its first flush
    for i in range(5000):  # one burst, the writer cannot run in between
        pub.progress({"i": i})
    pub.phase("draining")
    for i in range(5000, 5010):
        pub.progress({"i": i})
    assert await pub.close()
    status = read_status(client, "prod")
    assert status is not None and status.progress == {"i": 5009} and status.phase == "draining"
    events = read_events(client, "prod")
    progress = [e for e in events if e.kind == "progress"]
    assert len(progress) <= 2 and progress[-1].data == {"i": 5009}
    assert [e.kind for e in events].count("phase") == 1  # phases are never dropped
    assert pub.writes <= 3


async def test_events_are_kept_in_order_and_the_stream_is_capped(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    pub = make(client, maxlen=100, max_pending_events=5000)
    for i in range(50):
        pub.event("note", {"i": i})
    assert pub.flush()
    assert [e.data["i"] for e in read_events(client, "prod")] == list(range(50))
    for i in range(50, 3000):
        pub.event("note", {"i": i})
        if i % 100 == 0:
            assert pub.flush()
    assert pub.flush()
    assert client.xlen(events_key("prod")) <= 300  # MAXLEN ~ trims whole stream nodes
    assert read_events(client, "prod")[-1].data == {"i": 2999}


async def test_redis_down_never_blocks_nor_raises_and_catches_up(own_redis: RedisServer) -> None:
    client = redis.Redis.from_url(own_redis.url, socket_connect_timeout=0.5, socket_timeout=1.0)
    pub = make(client, max_writes_per_second=20.0)
    pub.start()
    pub.phase("stopping")
    await asyncio.wait_for(_until(lambda: read_status(client, "prod") is not None), 30)

    own_redis.stop()
    pub.phase("draining")
    for i in range(100):
        pub.progress({"i": i})  # returns at once: memory only
    await asyncio.wait_for(_until(lambda: pub._failing), 30)
    pub.event("note", {"text": "while down"})

    own_redis.start()
    await asyncio.wait_for(_until(lambda: _published(client, 99)), 60)
    kinds = [(e.kind, e.data.get("phase") or e.data.get("text")) for e in read_events(client, "prod")]
    assert ("phase", "draining") in kinds and ("note", "while down") in kinds
    assert await pub.close()


def _published(client: redis.Redis, i: int) -> bool:
    try:
        status = read_status(client, "prod")
    except redis.RedisError:
        return False
    return status is not None and status.phase == "draining" and status.progress == {"i": i}


async def _until(cond: object, step: float = 0.05) -> None:
    assert callable(cond)
    while not cond():
        await asyncio.sleep(step)


def test_close_without_redis_gives_up_quickly_and_reports_it(own_redis: RedisServer) -> None:
    client = redis.Redis.from_url(own_redis.url, socket_connect_timeout=0.3, socket_timeout=0.5)
    pub = make(client)
    own_redis.stop()
    pub.phase("stopping")
    assert pub.flush() is False  # kept pending, no exception
    own_redis.start()
    assert pub.flush() is True
    assert read_status(client, "prod").phase == "stopping"  # type: ignore[union-attr]


def test_readers_need_only_read_permissions(redis_url: str, redis_client: redis.Redis) -> None:
    """A watcher connected as a Redis user allowed to read only can follow the run (and could not write)."""
    pub = make(redis.Redis.from_url(redis_url))
    pub.phase("draining")
    pub.progress({"in_flight": 1})
    assert pub.flush()
    RunLease(redis.Redis.from_url(redis_url), "prod", "run-1").acquire()
    redis_client.acl_setuser("watcher", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@read", "+ping"])
    try:
        port = redis_client.connection_pool.connection_kwargs["port"]
        reader = redis.Redis(host="127.0.0.1", port=port, username="watcher", password="pw")
        assert read_status(reader, "prod").progress == {"in_flight": 1}  # type: ignore[union-attr]
        assert [e.kind for e in read_events(reader, "prod")] == ["phase", "progress"]
        assert read_lease(reader, "prod").run_id == "run-1"  # type: ignore[union-attr]
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.set("x", "1")
    finally:
        redis_client.acl_deluser("watcher")


def test_status_is_overwritten_by_the_next_run(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    first = make(client)
    first.progress({"old": True})
    assert first.flush()
    second = Publisher(client, "prod", run_id="run-2", owner="bob", host="box2", clock=lambda: 5000.0)
    assert second.flush()
    status = read_status(client, "prod")
    assert status is not None and (status.run_id, status.owner, status.release, status.progress) == (
        "run-2", "bob", None, {})
    assert status.updated_at == 5000.0 and time.time() > 0
