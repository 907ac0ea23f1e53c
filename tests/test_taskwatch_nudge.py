"""TaskWatch nudges the workers holding the tasks it waits for (a real threads-pool worker with task events holds a
task's end event until its event loop wakes): ``ping`` casts to those workers only, only while armed, and the
drain is woken by the task's end event.

The broker is a Redis of this test alone: the spy reads every control message published on it, and the session's
shared Redis may carry other tests' (their workers' pings, a drain's broadcasts)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import uuid
from typing import Any

import redis

from celeryops.adapters.taskevents import TaskWatch
from celeryops.core.events import DrainProgress, TaskInfo
from celeryops.demo.standins.redis_server import RedisServer
from celeryops_harness.taskapp import release
from celeryops_harness.workers import control_app, wait_for

WAIT = 30.0


async def periods(watch: TaskWatch, n: int) -> None:
    """Until ``n`` more nudge periods of ``watch`` went by (its nudger's own count, not a guessed sleep)."""
    until = watch.rounds + n
    deadline = time.monotonic() + WAIT
    while watch.rounds < until:
        assert time.monotonic() < deadline, f"the nudger did not go through {n} periods"
        await asyncio.sleep(0.05)


def progress(worker: str, task_id: str, streak: int) -> DrainProgress:
    task = TaskInfo(worker=worker, id=task_id, name="celeryops.testing.hold", state="active", runtime=0.1)
    return DrainProgress(elapsed=1.0, remaining=100.0, streak=streak, required=2, active=1, reserved=0, scheduled=0,
                         unknown=(), workers={}, tasks=(task,))


class ControlSpy:
    """Every remote-control message published on the broker (the pidbox fanout channel), decoded."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.pubsub = self.client.pubsub()
        self.pubsub.psubscribe("*celery.pidbox*")
        self.messages: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            msg = self.pubsub.get_message(timeout=0.1)
            if msg and msg["type"] == "pmessage":
                envelope = json.loads(msg["data"])
                self.messages.append(json.loads(base64.b64decode(envelope["body"])))

    def caught_up(self, app: Any) -> None:
        """Until the spy received a marker published now: every message published before it has arrived too (Redis
        delivers a channel's messages in the order it took them)."""
        marker = f"spy-marker-{uuid.uuid4()}"
        app.control.broadcast("ping", reply=False, destination=[marker])
        wait_for(lambda: any(m.get("destination") == [marker] for m in self.messages), WAIT, "the spy's marker")
        self.messages = [m for m in self.messages if m.get("destination") != [marker]]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.pubsub.close()
        self.client.close()


def test_the_watch_nudges_the_busy_worker_until_its_task_ended(own_redis: RedisServer, start_workers: Any,
                                                               redis_client: redis.Redis, queue_name: str) -> None:
    broker = own_redis.url
    (worker,) = start_workers(broker, queues=[queue_name], env={"CELERYOPS_TEST_EVENTS": "1"})
    app = control_app(broker)
    spy = ControlSpy(broker)
    tid = str(uuid.uuid4())
    try:  # the task runs until the test releases it: it is still running when the watch is armed
        app.send_task("celeryops.testing.hold", args=(queue_name, "nudge"), queue=queue_name, task_id=tid)
        wait_for(lambda: redis_client.hget(f"ct:run:{tid}", "started"), WAIT, "the task to start")

        async def run() -> tuple[TaskWatch, int]:
            wake = asyncio.Event()
            watch = TaskWatch(app, wake, asyncio.get_running_loop(), nudge=0.2)
            await asyncio.to_thread(watch.start)
            try:
                watch.on_event(progress(worker.nodename, "some-other-task", streak=1))  # not armed: no nudge
                await periods(watch, 3)  # three nudge periods went by, none nudged
                assert watch.nudges == 0 and not spy.messages
                watch.on_event(progress(worker.nodename, tid, streak=0))  # armed: waits for tid
                deadline = time.monotonic() + WAIT
                while not watch.nudges:  # nudged while the task still runs, as in a drain
                    assert time.monotonic() < deadline, "timed out waiting for the first nudge"
                    await asyncio.sleep(0.05)
                release(redis_client, queue_name)
                await asyncio.wait_for(wake.wait(), WAIT)
                fired = watch.nudges
                await periods(watch, 3)  # three nudge periods: none once the wake fired (the watch is disarmed)
                return watch, fired
            finally:
                await asyncio.to_thread(watch.stop)

        watch, fired = asyncio.run(run())
        assert redis_client.hget(f"ct:run:{tid}", "finished")  # woken by the task's end
        # (one nudge may have been on its way while the wake fired; none after)
        assert watch.wakes == 1 and fired >= 1 and fired <= watch.nudges <= fired + 1
        spy.caught_up(app)  # every nudge published before the watch stopped has reached the spy
        assert spy.messages and all(m["method"] == "ping" and m["destination"] == [worker.nodename]
                                    and not m.get("reply_to") for m in spy.messages), spy.messages
        assert len(spy.messages) == watch.nudges
    finally:
        spy.close()
        app.close()
