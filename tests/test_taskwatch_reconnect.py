"""TaskWatch survives its broker: when the broker restarts mid-drain, the event receiver reconnects by itself (no
thread dies, nothing is printed) and a task's end event sent after the restart still wakes the drain; ``stop``
ends the thread, even while the broker is down."""

from __future__ import annotations

import asyncio
import threading
import uuid

from celeryops.adapters.taskevents import TaskWatch
from celeryops.core.events import DrainProgress, TaskInfo
from celeryops.demo.standins.redis_server import RedisServer
from celeryops_harness.workers import control_app, wait_for

WAIT = 30.0


def armed_on(task_id: str) -> DrainProgress:
    task = TaskInfo(worker="celery@w1", id=task_id, name="celeryops.testing.sleep", state="active", runtime=0.1)
    return DrainProgress(elapsed=1.0, remaining=100.0, streak=0, required=2, active=1, reserved=0, scheduled=0,
                         unknown=(), workers={}, tasks=(task,))


def test_the_watch_reconnects_after_a_broker_restart_and_still_wakes_the_drain(own_redis: RedisServer) -> None:
    app = control_app(own_redis.url)
    died: list[BaseException | None] = []
    previous_hook = threading.excepthook
    threading.excepthook = lambda args: died.append(args.exc_value)
    try:
        async def run() -> TaskWatch:
            wake = asyncio.Event()
            watch = TaskWatch(app, wake, asyncio.get_running_loop(), nudge=None)
            await asyncio.to_thread(watch.start)
            try:
                await asyncio.to_thread(own_redis.restart)
                # No wait on watch.reconnects here: kombu's Redis poller may take the lost connection in its stride
                # (it drops the dead LISTEN and subscribes again on its next cycle) or raise it to the watch, which
                # reconnects: either way the restarted server starts with no subscription, so the end event below
                # can only wake the drain through a receiver that came back.
                tid = str(uuid.uuid4())
                watch.on_event(armed_on(tid))
                with app.connection_for_write() as conn:
                    dispatcher = app.events.Dispatcher(conn, hostname="celery@w1", enabled=True)

                    async def send_until_woken() -> None:  # sent again until the reconnected receiver hears one
                        while not wake.is_set():
                            await asyncio.to_thread(dispatcher.send, "task-succeeded", uuid=tid)
                            await asyncio.sleep(0.2)

                    await asyncio.wait_for(send_until_woken(), WAIT)
                    dispatcher.close()
                assert watch.thread.is_alive(), "the receiver thread must outlive the restart"
                return watch
            finally:
                await asyncio.to_thread(watch.stop)

        watch = asyncio.run(run())
        assert watch.wakes == 1
        assert not watch.thread.is_alive(), "stop() ends the receiver thread"
        assert died == [], f"the receiver thread raised: {died}"
    finally:
        threading.excepthook = previous_hook
        app.close()


def test_stop_ends_the_thread_while_the_broker_is_down(own_redis: RedisServer) -> None:
    """start_watch gives up on a receiver that cannot connect and stops it: the thread must not retry for ever."""
    app = control_app(own_redis.url)
    try:
        watch = TaskWatch(app, asyncio.Event(), asyncio.new_event_loop(), nudge=None)
        own_redis.stop()
        watch.thread.start()
        wait_for(lambda: watch.reconnects >= 1, WAIT, "the first failed connection")
        watch.stop()
        assert not watch.thread.is_alive()
    finally:
        app.close()
