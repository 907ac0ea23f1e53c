"""One observation round (``Fleet.observe`` on Redis: every command published at once, replies routed straight to one
reply list, collected in bulk) observes exactly what Celery's standard inspect calls observe, on real workers:
workers without the plugin (four standard commands), workers with it (``celeryops_observe``), both in one fleet.

The reference is four ``app.control.inspect(...)`` calls (kombu's own rounds: reply exchange, one collection per
command). The workers hold long tasks, so nothing changes between the two looks; the raw replies are compared,
not only the counts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import redis
from celery import Celery

from celeryops.adapters.fleet import OBSERVE_PARTS, Fleet
from celeryops_harness.workers import WorkerProcess, control_app, wait_for

FENCE_APP = "celeryops_harness.fenceapp"
WAIT = 60.0


def reference(app: Celery, names: list[str]) -> tuple[dict[str, Any], ...]:
    """The four standard inspect calls, one after another, as `celery inspect` makes them."""
    inspect = app.control.inspect(destination=names, limit=len(names), timeout=5.0)
    return tuple(getattr(inspect, part)() or {} for part in OBSERVE_PARTS)


def load(app: Celery, worker: WorkerProcess, queue: str) -> None:
    """Two running tasks, one prefetched, one ETA task held; returns once both run."""
    for i in range(3):
        app.send_task("celeryops.testing.sleep", args=(600.0, f"{queue}-{i}"), queue=queue)
    app.send_task("celeryops.testing.sleep", args=(1.0, f"{queue}-eta"), queue=queue, countdown=3600)

    def busy() -> bool:
        insp = app.control.inspect(destination=[worker.nodename], limit=1, timeout=2.0)
        active = (insp.active() or {}).get(worker.nodename) or []
        scheduled = (insp.scheduled() or {}).get(worker.nodename) or []
        return len(active) >= 2 and len(scheduled) >= 1

    wait_for(busy, WAIT, f"{worker.nodename} to run two tasks and hold an ETA task")


def test_one_round_observes_what_the_standard_inspect_calls_observe(redis_url: str, start_workers: Any) -> None:
    plain = [*start_workers(redis_url, queues=["obs-a", "obs-x"], concurrency=2),
             *start_workers(redis_url, queues=["obs-b"], concurrency=2)]
    (plugin,) = start_workers(redis_url, app=FENCE_APP, queues=["obs-c", "obs-d"], concurrency=2,
                              env={"CELERYOPS_FENCE_INTERVAL": "0.5"})
    workers = [*plain, plugin]
    names = sorted(w.nodename for w in workers)
    app = control_app(redis_url)
    fleet = _CountingFleet(app, timeout=5.0)
    try:
        # Different states: one plain worker stopped consuming one of its queues, the plugin worker too.
        # Confirmed by their replies: a cancel still queued at a loaded worker would land between the reference
        # and our rounds.
        for queue, worker in (("obs-x", plain[0]), ("obs-d", plugin)):
            replies = app.control.cancel_consumer(queue, destination=[worker.nodename], reply=True, timeout=WAIT,
                                                  limit=1)
            assert replies and "ok" in replies[0][worker.nodename], replies
        for worker, queue in ((plain[0], "obs-a"), (plain[1], "obs-b"), (plugin, "obs-c")):
            load(app, worker, queue)

        want = reference(app, names)
        assert all(set(part) == set(names) for part in want), want
        first = asyncio.run(fleet._observe_round(names))  # learns that the two plain workers lack the plugin
        assert fleet.rounds == 1  # issue 34: asked both ways at once, not the plugin's command then the four
        again = asyncio.run(fleet._observe_round(names))  # one round: 1 command to the plugin worker, 4 to the others
        assert fleet._plain == {w.nodename for w in plain} and fleet.rounds == 2
        assert first == want
        assert again == want

        # The Observation built from it equals the one built from the reference replies.
        obs = asyncio.run(fleet.observe(names, ("obs-a", "obs-b", "obs-c", "obs-d", "obs-x"), now=lambda: 1e10))
        ref_fleet = _ReferenceFleet(app, want)
        ref = asyncio.run(ref_fleet.observe(names, ("obs-a", "obs-b", "obs-c", "obs-d", "obs-x"), now=lambda: 1e10))
        assert {n: (w.replied, w.active, w.reserved, w.scheduled, w.queues, w.state) for n, w in obs.workers.items()} \
            == {n: (w.replied, w.active, w.reserved, w.scheduled, w.queues, w.state) for n, w in ref.workers.items()}
        assert sorted(obs.tasks, key=lambda t: t.id) == sorted(ref.tasks, key=lambda t: t.id)
        assert obs.workers[plain[0].nodename].queues == ("obs-a",)
        assert obs.workers[plugin.nodename].plugin and not obs.workers[plain[1].nodename].plugin
        assert obs.active == 6 and obs.scheduled == 3, obs.workers
    finally:
        fleet.close()
        app.close()


class _CountingFleet(Fleet):
    """Fleet, counting its rounds."""

    rounds = 0

    async def _rounds(self, requests: list[Any]) -> list[dict[str, Any]]:
        self.rounds += 1
        return await super()._rounds(requests)


class _ReferenceFleet(Fleet):
    """Fleet.observe's bookkeeping over given replies (the reference's)."""

    def __init__(self, app: Celery, parts: tuple[dict[str, Any], ...]) -> None:
        super().__init__(app)
        self.parts = parts

    async def _observe_round(self, known: list[str]) -> tuple[dict[str, Any], ...]:
        return self.parts


def test_a_transport_key_prefix_is_honoured(redis_url: str, start_workers: Any, redis_client: redis.Redis) -> None:
    """With ``global_keyprefix`` the worker pushes its replies to the prefixed list: the round reads that one."""
    (worker,) = start_workers(redis_url, queues=["obs-p"], env={"CELERYOPS_TEST_KEYPREFIX": "pfx:"}, wait=False)
    app = control_app(redis_url)
    app.conf.broker_transport_options = {"global_keyprefix": "pfx:"}
    fleet = Fleet(app, timeout=5.0)
    try:
        worker.wait_ready(app)
        names = [worker.nodename]
        want = reference(app, names)
        assert asyncio.run(fleet._observe_round(names)) == want  # celeryops_observe refused, the four answered
        assert asyncio.run(fleet._observe_round(names)) == want
        obs = asyncio.run(fleet.observe(names, ("obs-p",)))
        assert obs.workers[worker.nodename].replied and obs.workers[worker.nodename].queues == ("obs-p",)
        assert all(k.startswith("pfx:") for k in redis_client.keys("*") if "binding" in k or "reply" in k)
    finally:
        fleet.close()
        app.close()
    assert not [k for k in redis_client.keys("*") if "reply" in k]


def test_a_frozen_worker_is_unknown_and_its_late_replies_never_reach_a_later_round(
        redis_url: str, start_workers: Any) -> None:
    """A worker that does not answer in time is not replied (never zero); when it thaws, the replies it sends to the
    round that gave up on it are told apart by their ticket and dropped; the reply list is removed on close."""
    a, b = start_workers(redis_url, n=2, queues=["obs-f"])
    names = sorted([a.nodename, b.nodename])
    app = control_app(redis_url)
    fleet = Fleet(app, timeout=1.0)
    client = redis.Redis.from_url(redis_url)
    try:
        fleet._plain.update(names)
        os.kill(b.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            obs = asyncio.run(fleet.observe(names, ("obs-f",)))
            waited = time.monotonic() - started
        finally:
            os.kill(b.pid, signal.SIGCONT)
        assert obs.workers[a.nodename].replied and obs.workers[a.nodename].state == "consuming"
        assert not obs.workers[b.nodename].replied and obs.workers[b.nodename].state == "unknown"
        assert obs.unknown == [b.nodename]
        assert waited >= 0.9  # it waited for the frozen worker (the round's whole window), then gave up
        assert fleet._round is not None
        key = fleet._round.reply_key
        # The thawed worker answers the four commands of the round that gave up on it: into the reply list.
        wait_for(lambda: client.llen(key) >= 4, WAIT, "the thawed worker's late replies")
        replies = app.control.cancel_consumer("obs-f", destination=[b.nodename], reply=True, timeout=WAIT, limit=1)
        assert replies and "ok" in replies[0][b.nodename], replies  # b no longer consumes obs-f
        # Every later round: a reply from b tells the truth (stopped), never its late, stale "consuming". A round may
        # give up on b again while it catches up on a loaded machine; it then says unknown, never a state.
        deadline = time.monotonic() + WAIT
        while True:
            obs = asyncio.run(fleet.observe(names, ("obs-f",)))
            assert client.llen(key) == 0  # the late replies were dropped, not left for another round
            late = obs.workers[b.nodename]
            assert late.state == ("stopped" if late.replied else "unknown"), late
            if all(w.replied for w in obs.workers.values()):
                break
            assert time.monotonic() < deadline, f"the thawed worker never answered a round in {WAIT}s"
        assert obs.workers[a.nodename].state == "consuming"
    finally:
        fleet.close()
        app.close()
    assert not client.exists(key)
    client.close()


def _old_short_args(args: Any, kwargs: Any = None, width: int = 60) -> str:
    """short_args before issue 16 (the reference)."""

    def text(value: Any) -> str:
        if value in (None, "", (), [], {}, "()", "{}", "[]"):
            return ""
        return str(value)

    joined = ", ".join(p for p in (text(args), text(kwargs)) if p)
    return joined if len(joined) <= width else joined[: width - 1] + "…"


def test_short_args_gives_the_texts_it_gave_before() -> None:
    from celeryops.adapters.fleet import short_args

    values: list[Any] = [None, "", (), [], {}, "()", "{}", "[]", 0, 0.0, False, True, set(), frozenset(), b"", "x",
                         [1.5], (1, "a"), {"k": [1, 2]}, [[]], [None], "x" * 80, list(range(40)), {"a": "b" * 70}]
    for args in values:
        for kwargs in values:
            assert short_args(args, kwargs) == _old_short_args(args, kwargs), (args, kwargs)
