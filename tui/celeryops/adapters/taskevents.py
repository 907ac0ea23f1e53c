"""Early re-poll: wake a drain as soon as the fleet reports that every task the last poll saw has finished.

Celery task events (``task-succeeded`` / ``-failed`` / ``-revoked`` / ``-rejected`` / ``-retried``, sent by workers
running with ``-E`` / ``worker_send_task_events``) are received on the broker in a thread. This only shortens the
pause before the next poll; the drained verdict still needs ``streak`` empty observations ``interval`` apart, and
workers without events simply never wake it (no Textual here).

A worker may hold a task's end event for up to a second: Celery buffers task events on workers whose consumer
runs an event loop (``buffer_group=['task']``) and sends them from that loop, which a threads-pool worker wakes only
when a message arrives or its one-second poll times out (measured: 0-0.9 s after the task's end, uniformly). So
while the watch waits for the tasks of the last poll, it nudges the workers holding them every ``nudge`` seconds
with a ``ping`` cast (no reply: the message only wakes the worker's loop, which then sends what it buffered).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

from celery import Celery

from celeryops.adapters.eventreceiver import EventReceiverThread, Handlers
from celeryops.core.events import DrainProgress, Event

END_EVENTS = ("task-succeeded", "task-failed", "task-revoked", "task-rejected", "task-retried")
NUDGE = 0.2  # seconds between nudges while the watch waits for the tasks in flight
NUDGE_DESTINATIONS = 64  # above this many workers, a nudge is one broadcast to all (a small message)


class TaskWatch(EventReceiverThread):
    """Wake a drain early when the fleet reports that every task the last poll saw in flight has finished.

    Listens to Celery task events (``task-succeeded`` / ``-failed`` / ``-revoked`` / ``-rejected`` / ``-retried``)
    with an event receiver on the broker, in a thread. ``on_event`` is chained into ``Drain.on_event``: each
    ``DrainProgress`` arms the watch with the ids of its active + reserved tasks; once all of them have an end
    event, ``wake`` is set (once per poll) from the loop's thread. Workers without task events never wake it:
    the drain then keeps its interval, so correctness never depends on events (nor on the events missed while the
    receiver reconnects)."""

    def __init__(self, app: Celery, wake: asyncio.Event, loop: asyncio.AbstractEventLoop, *,
                 nudge: float | None = NUDGE) -> None:
        super().__init__(app, "taskwatch")
        self.wake = wake
        self.loop = loop
        self.nudge = nudge
        self.lock = threading.Lock()
        self.pending: set[str] = set()
        self.holders: dict[str, str] = {}  # pending task id -> the worker holding it
        self.armed = False
        self.finished: dict[str, float] = {}  # recent end events (an event may beat the poll's report)
        self.nudger = threading.Thread(target=self._nudge_loop, name="taskwatch-nudge", daemon=True)
        self.wakes = 0
        self.nudges = 0
        self.rounds = 0  # nudge periods gone by (nudged or not): how long the nudger has been watching

    def start(self, timeout: float = 30.0) -> TaskWatch:
        self.thread.start()
        if not self.ready.wait(timeout):
            raise TimeoutError("task event receiver not consuming")
        if self.nudge:
            self.nudger.start()
        return self

    def stop(self) -> None:
        self.stop_receiving(self.nudger, 3)

    def handlers(self) -> Handlers:
        return {name: self._on_end for name in END_EVENTS}

    def on_event(self, event: Event) -> None:
        if not isinstance(event, DrainProgress):
            return
        held = {t.id: t.worker for t in event.tasks if t.state in ("active", "reserved")}
        with self.lock:
            cutoff = time.monotonic() - 60
            self.finished = {k: v for k, v in self.finished.items() if v > cutoff}
            self.pending = set(held) - set(self.finished)
            self.holders = {k: held[k] for k in self.pending}
            self.armed = bool(held) and event.streak == 0 and not event.unknown
            if self.armed and not self.pending:
                self._fire()

    def _on_end(self, event: dict[str, Any]) -> None:
        task_id = str(event.get("uuid"))
        with self.lock:
            self.finished[task_id] = time.monotonic()
            self.pending.discard(task_id)
            self.holders.pop(task_id, None)
            if self.armed and not self.pending:
                self._fire()

    def _nudge_loop(self) -> None:
        """While armed: a ``ping`` cast to the workers holding the pending tasks, every ``nudge`` seconds."""
        assert self.nudge
        while not self.stopping.wait(self.nudge):
            with self.lock:
                workers = sorted(set(self.holders.values())) if self.armed else []
                self.rounds += 1
            if not workers:
                continue
            try:
                self.app.control.broadcast("ping", reply=False,
                                           destination=workers if len(workers) <= NUDGE_DESTINATIONS else None)
                self.nudges += 1
            except Exception:  # the broker is away: the drain's own poll says so; nudging is an optimisation
                continue

    def _fire(self) -> None:
        self.armed = False
        self.wakes += 1
        self.loop.call_soon_threadsafe(self.wake.set)


async def start_watch(app: Celery, wake: asyncio.Event, timeout: float = 5.0) -> TaskWatch | None:
    """A started watch, or None when the event receiver could not start (the drain then keeps its interval)."""
    watch = TaskWatch(app, wake, asyncio.get_running_loop())
    try:
        await asyncio.to_thread(watch.start, timeout)
    except Exception:  # no event support on this broker, connection trouble: early re-poll is an optimisation
        with contextlib.suppress(Exception):
            await asyncio.to_thread(watch.stop)
        return None
    return watch
