"""The slots' work on a worker's event loop (``celeryops.slots.loop``), against a real redis-server and kombu's real
hub and timers, driven in the test's thread as a prefork worker's main process drives them: the waker's BLPOP is
watched by the hub (a release wakes the next task at once, a lease that expires while a task waits is reaped and
handed off, a Redis restart is survived), the heartbeat renews the host's contribution from the timer, a stopped
driver leaves nothing on the hub, and the polling waker of a worker without a hub sends the same wake-ups. No
thread of the slots is started by any of it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis
from celery.utils.timer2 import Timer
from kombu.asynchronous import Hub

from celeryops.demo.standins.redis_server import RedisServer
from celeryops.slots import SlotRuntime, SlotSettings
from celeryops.slots.loop import LoopDriver
from celeryops.slots.store import Park, SlotStore
from celeryops_harness.workers import wait_for

GPU = {"gpu": 1}


def loop_runtime(url: str, **kw: Any) -> SlotRuntime:
    settings = SlotSettings(**{"lease_ttl": 30.0, "totals": {"gpu": 1, "cpu": 8}, "detect": False, "host": "h1",
                               **kw})
    rt = SlotRuntime(settings, url)
    rt.run_on_loop()
    rt.on_worker_start("celery@loop")
    return rt


def run_until(hub: Hub, cond: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    def turn() -> object:
        hub.run_once()
        return cond()

    wait_for(turn, timeout, what, step=0)


def park(store: SlotStore, tid: str) -> None:
    res = store.acquire(tid, GPU, ttl=30, park=Park(f"T-{tid}", f"wake {tid}", 30))
    assert not res.ok


def slots_threads() -> list[str]:
    """The slots' threads (heartbeat, waker) alive now. Only the slots' names: another test of this process may
    leave a thread of its own behind (the console's event feed), which says nothing about the slots."""
    return [t.name for t in threading.enumerate() if t.name.startswith("celeryops-slots")]


def test_the_hub_watches_the_wake_list_and_the_timer_beats(own_redis: RedisServer) -> None:
    hub = Hub()
    rt = loop_runtime(own_redis.url, host_ttl=0.9)  # a contribution of 0.9 s: the heartbeat renews it every 0.3 s
    sent: list[tuple[str, str]] = []
    driver = LoopDriver(rt, hub.timer, hub, lambda pool, message: sent.append((pool, message)))
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    store = SlotStore(client, "host:h1")
    try:
        driver.start()
        run_until(hub, lambda: len(hub.readers) == 1, "the waker's BLPOP to be watched")
        held = store.acquire("a", GPU, ttl=30)
        assert held.ok
        park(store, "b")
        store.release("a", held.token)
        run_until(hub, lambda: sent, "the woken task to be sent")
        assert sent == [("host:h1", "wake b")]

        claimed = store.acquire("b", GPU, ttl=30, ticket="T-b")  # the woken copy runs, then ends
        assert claimed.status == "claimed" and store.release("b", claimed.token)
        short = store.acquire("c", GPU, ttl=1)  # expires while d waits: the waker's tick reaps it
        park(store, "d")
        run_until(hub, lambda: len(sent) == 2, "the expired lease's slots to go to the waiting task")
        assert short.ok and sent[1] == ("host:h1", "wake d")

        run_until(hub, lambda: all(hc.age > 2.0 for hc in store.snapshot().hosts), "two contribution TTLs")
        assert store.snapshot().usage("gpu").total == 1  # renewed from the timer all along

        own_redis.restart()  # the BLPOP's connection is cut: the waker makes a new one
        client.connection_pool.disconnect()
        store.contribute("h1", {"gpu": 1, "cpu": 8}, ttl=600, worker="celery@other", devices={"gpu": [0]})
        held = store.acquire("e", GPU, ttl=30)
        park(store, "f")
        store.release("e", held.token)
        run_until(hub, lambda: len(sent) == 3, "a wake-up after the Redis restart")
        assert sent[2] == ("host:h1", "wake f")
        assert slots_threads() == []
    finally:
        driver.stop()
        client.close()
    assert hub.readers == {} and not [s for s in hub.timer.queue if not s.entry.canceled]


def test_a_worker_without_a_hub_polls_the_wake_list(own_redis: RedisServer) -> None:
    timer = Timer()  # Celery's own timer thread, as a worker without an event loop has
    rt = loop_runtime(own_redis.url)
    sent: list[tuple[str, str]] = []
    driver = LoopDriver(rt, timer, None, lambda pool, message: sent.append((pool, message)))
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    store = SlotStore(client, "host:h1")
    try:
        driver.start()
        held = store.acquire("a", GPU, ttl=30)
        park(store, "b")
        store.release("a", held.token)
        wait_for(lambda: sent, 30, "the woken task to be sent")
        assert sent == [("host:h1", "wake b")]
        assert slots_threads() == []
    finally:
        driver.stop()
        timer.stop()
        client.close()
