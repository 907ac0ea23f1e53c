"""The simulated fleet (celeryops_harness.simfleet) against a real redis-server, seen through the real Fleet adapter:
members from the pidbox bindings, observe with task counts, cancel/add_consumer, silent workers, evolving tasks
and the task-succeeded events they send."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celeryops.adapters.fleet import Fleet
from celeryops_harness.simfleet import SimFleet, SimSpec, SimTask, sim_fleet
from celeryops_harness.workers import control_app, wait_for


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = control_app(redis_url)
    yield app
    app.close()


@pytest.fixture
def fleet(app: Celery) -> Iterator[Fleet]:
    fleet = Fleet(app, timeout=2.0)
    yield fleet
    fleet.close()


async def test_observe_sees_every_sim_worker_with_its_tasks(redis_url: str, fleet: Fleet) -> None:
    spec = SimSpec(n=40, processes=2, tasks_per_worker=2, reserved_per_worker=1, scheduled_per_worker=1,
                   task_duration=(600.0, 900.0), prefix="obs")
    with sim_fleet(redis_url, spec) as sim:
        members = await fleet.members()
        assert members == set(sim.names)
        obs = await fleet.observe(members, ("celery",))
        assert not obs.unknown
        assert {n: (w.active, w.reserved, w.scheduled, w.queues, w.state) for n, w in obs.workers.items()} == {
            n: (2, 1, 1, ("celery",), "consuming") for n in sim.names}
        planned = {(n, t.id) for n, tasks in sim.plan.items() for t in tasks}
        assert {(t.worker, t.id) for t in obs.tasks} == planned
        running = [t for t in obs.tasks if t.state == "active"]
        assert running and all(t.runtime is not None and 0 <= t.runtime <= 120 for t in running)
    assert await fleet.members() == set()  # stopped workers unbind their pidbox queues


async def test_cancel_and_add_consumer_change_active_queues(redis_url: str, fleet: Fleet) -> None:
    spec = SimSpec(n=12, processes=2, queues=("a", "b"), prefix="cc")
    with sim_fleet(redis_url, spec) as sim:
        assert await fleet.cancel_consumer("a", expect=len(sim.names)) == set(sim.names)
        assert await fleet.active_queues(sim.names) == {n: ("b",) for n in sim.names}
        back = sim.names[:3]
        assert await fleet.add_consumer("a", destination=back) == set(back)
        queues = await fleet.active_queues(sim.names)
        assert queues == {n: ("a", "b") if n in back else ("b",) for n in sim.names}
        obs = await fleet.observe(sim.names, ("a",))
        assert {n for n, w in obs.workers.items() if w.state == "stopped"} == set(sim.names) - set(back)


async def test_silent_workers_are_reported_unknown(redis_url: str, fleet: Fleet) -> None:
    spec = SimSpec(n=20, processes=2, silent=0.25, tasks_per_worker=1, task_duration=(600.0, 900.0),
                   prefix="silent", seed=7)
    with sim_fleet(redis_url, spec) as sim:
        assert len(sim.silent) == 5
        members = await fleet.members()
        assert members == set(sim.names)  # silent workers are bound, like a busy solo worker
        obs = await fleet.observe(members, ("celery",))
        assert obs.unknown == sorted(sim.silent)
        assert not obs.empty
        assert obs.active == len(sim.answering)
        assert await fleet.ping(limit=len(sim.names), timeout=1.0) == set(sim.answering)


def test_tasks_evolve_and_send_task_succeeded_events(redis_url: str, app: Celery) -> None:
    spec = SimSpec(n=4, processes=1, events=True, prefix="ev")
    received: list[dict[str, Any]] = []
    ready = threading.Event()
    receivers: list[Any] = []

    def listen() -> None:
        with app.connection_for_read() as conn:
            recv = app.events.Receiver(conn, handlers={"task-succeeded": received.append})
            recv.on_consume_ready = lambda *a, **kw: ready.set()  # bound and consuming
            receivers.append(recv)
            recv.capture(limit=None, timeout=None, wakeup=False)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert ready.wait(30)
    sim: SimFleet
    with sim_fleet(redis_url, spec) as sim:
        worker = sim.names[0]
        now = time.time()
        task = SimTask(id="t-evolves", start=now + 1.0, end=now + 2.0)
        sim.set_tasks({worker: [task]})

        def states() -> tuple[int, int]:
            replies = app.control.inspect(destination=[worker], timeout=2.0)
            return len((replies.active() or {}).get(worker, [])), len((replies.reserved() or {}).get(worker, []))

        assert states() == (0, 1)  # prefetched, not started
        wait_for(lambda: states() == (1, 0), 30, "the task to start")
        wait_for(lambda: states() == (0, 0), 30, "the task to finish")
        wait_for(lambda: any(e.get("uuid") == task.id for e in received), 30, "its task-succeeded event")
        event = next(e for e in received if e.get("uuid") == task.id)
        assert event["hostname"] == worker
        assert sim.last_finish() == task.end
    receivers[0].should_stop = True
    thread.join(10)
    assert not thread.is_alive()
