"""The slots' periodic work in the main process of a worker whose pool forks, run by the worker's event loop: no
thread of ours may be alive there when the pool forks a child (:mod:`celeryops.core.forking`).

- The heartbeat: the consumer's timer calls ``SlotRuntime.heartbeat_once`` every ``heartbeat_interval`` (the host's
  contributions, and the leases this process holds: none in a prefork main process, each child renews its own from
  a thread of its own, where no fork follows).
- :class:`LoopWaker`, one per pool of the worker: it sends ``BLPOP <wake list> <block>`` on a Redis connection of its
  own and has the hub watch the socket. When the reply comes (a woken task, or nothing once the block is over), the
  loop sends the task on, reaps the pool if a lease may have expired while tasks wait (``tick``), and sends the next
  BLPOP: a freed slot starts the next waiting task within milliseconds, as the waker thread did, without polling and
  without the loop ever waiting on the BLPOP. A reply that never comes (a Redis that died silently) is noticed
  OVERDUE seconds after the block ended: the connection is dropped and made again.
- :class:`PollingWaker`, where the worker runs no hub (a transport without an event loop: Celery's timer is then a
  thread of Celery's own): it pops the wake list every POLL_EVERY seconds instead.

Every Redis call made here is bounded: a connection within LOOP_CONNECT_TIMEOUT, a reply within LOOP_REPLY_TIMEOUT,
no retry after a timeout (``connect(on_loop=True)``); a waker that cannot reach Redis tries again 1, 2, 4, then
every 8 seconds (RETRY_AFTER, RETRY_MAX), so a Redis that hangs costs the loop little.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from celeryops.core.forking import LOOP_CONNECT_TIMEOUT, LOOP_REPLY_TIMEOUT
from celeryops.slots.codec import as_text
from celeryops.slots.store import SlotStore
from celeryops.slots.worker import WAKE_BLOCK, SlotRuntime

log = logging.getLogger("celeryops.slots")

Publish = Callable[[str, str], None]  # (pool, message): send a woken task on
OVERDUE = 2.0  # s after its block a BLPOP reply is given up for lost
RETRY_AFTER = 1.0  # s before a waker that could not reach Redis tries again, doubled at each failure in a row
RETRY_MAX = 8.0
POLL_EVERY = 0.2  # s between two pops of a polling waker
WARN_EVERY = 30.0  # s between two warnings of one waker that cannot reach Redis


def _cancel(entry: Any) -> None:
    if entry is not None:
        entry.cancel()


class LoopDriver:
    """What the slots run on the event loop of a worker's main process: the heartbeat and a waker per pool.
    ``start`` at every consumer start (a consumer that restarts clears the timer and the hub), ``stop`` at its stop."""

    def __init__(self, rt: SlotRuntime, timer: Any, hub: Any, publish: Publish) -> None:
        self.rt = rt
        self.timer = timer
        self.wakers: list[_Waker] = []
        if rt.settings.handoff:
            self.wakers = [LoopWaker(rt, pool, publish, hub) if hub is not None else PollingWaker(rt, pool, publish,
                                                                                                  timer)
                           for pool in rt.wake_pools()]
        self._beat: Any = None

    def start(self) -> None:
        self.stop()
        self._beat = self.timer.call_repeatedly(self.rt.settings.heartbeat_interval, self._heartbeat)
        for waker in self.wakers:
            waker.start()

    def stop(self) -> None:
        beat, self._beat = self._beat, None
        _cancel(beat)
        for waker in self.wakers:
            waker.stop()

    def _heartbeat(self) -> None:
        try:
            self.rt.heartbeat_once()  # a Redis error is logged there
        except Exception:  # never let the slots take the consumer down
            log.exception("slots: heartbeat failed")


class _Waker:
    """A pool's waker: reaps the pool when a lease may have expired while tasks wait, and sends the woken tasks on."""

    def __init__(self, rt: SlotRuntime, pool: str, publish: Publish) -> None:
        self.pool = pool
        self.store: SlotStore = rt.store_for(pool)  # the runtime's client, bounded for the loop
        self.publish = publish
        self.running = False
        self._next_tick = 0.0
        self._last_warning = 0.0
        self.fails = 0  # failures in a row

    def start(self) -> None:
        self.running = True
        self._next_tick = 0.0

    def stop(self) -> None:
        self.running = False

    def tick_if_due(self) -> float:
        """Reap the pool if a lease or a contribution may have expired; the seconds until the next may."""
        now = time.monotonic()
        if now >= self._next_tick:
            t = self.store.tick()
            self._next_tick = now + (min(WAKE_BLOCK, t.next_expiry_in + 0.002) if t.waiting else WAKE_BLOCK)
        return max(0.01, min(WAKE_BLOCK, self._next_tick - time.monotonic()))

    def send(self, message: str) -> None:
        try:
            self.publish(self.pool, message)
        except Exception:  # a lost wake-up: the task's fallback retry still comes
            log.exception("slots: could not send a woken task of pool %s; its retry will run it", self.pool)

    def failed(self, exc: Exception) -> None:
        self.fails += 1
        if not isinstance(exc, redis.RedisError | OSError):
            log.error("slots: waker of pool %s failed", self.pool, exc_info=exc)
            return
        now = time.monotonic()
        if not self._last_warning or now - self._last_warning >= WARN_EVERY:
            self._last_warning = now
            log.warning("slots: waker of pool %s cannot reach Redis (%s); waiting tasks run at their retry",
                        self.pool, exc)

    def retry_in(self) -> float:
        """Seconds before the next try after ``fails`` failures in a row: 1, 2, 4, then 8."""
        return float(min(RETRY_AFTER * 2.0 ** max(0, self.fails - 1), RETRY_MAX))

    def reached(self) -> None:
        self.fails = 0
        if self._last_warning:
            self._last_warning = 0.0
            log.info("slots: waker of pool %s reaches Redis again", self.pool)


class LoopWaker(_Waker):
    """A waker whose BLPOP the hub watches (see the module's docstring)."""

    def __init__(self, rt: SlotRuntime, pool: str, publish: Publish, hub: Any) -> None:
        super().__init__(rt, pool, publish)
        self.hub = hub
        self._pool = redis.ConnectionPool.from_url(rt.redis_url, decode_responses=True,
                                                   socket_connect_timeout=LOOP_CONNECT_TIMEOUT,
                                                   socket_timeout=LOOP_REPLY_TIMEOUT)
        self._conn: Any = None  # the connection the BLPOP waits on
        self._fd = -1  # its socket, while the hub watches it
        self._overdue: Any = None
        self._retry: Any = None

    def start(self) -> None:
        self.stop()
        super().start()
        self._listen()

    def stop(self) -> None:
        super().stop()
        retry, self._retry = self._retry, None
        _cancel(retry)
        self._drop()

    def _listen(self) -> None:
        """Reap if due, then send the next BLPOP and have the hub call back when its reply is there."""
        self._retry = None
        if not self.running:
            return
        try:
            block = self.tick_if_due()
            if self._conn is None:
                conn: Any = self._pool.make_connection()
                conn.connect()
                self._conn = conn
            self._conn.send_command("BLPOP", self.store.wake_key, f"{block:.3f}")
            self._fd = self._conn._sock.fileno()
            self.hub.add_reader(self._fd, self._on_reply)
            self._overdue = self.hub.call_later(block + OVERDUE, self._on_overdue)
        except Exception as exc:
            self._give_up(exc)

    def _on_reply(self) -> None:
        self._unwatch()
        if self._conn is None or not self.running:
            return
        try:
            reply = self._conn.read_response()  # all there: the socket is readable (bounded all the same)
        except Exception as exc:
            self._give_up(exc)
            return
        self.reached()
        if reply:
            self.send(as_text(reply[1]))
        self._listen()

    def _on_overdue(self) -> None:
        self._overdue = None
        self._give_up(redis.TimeoutError(f"no reply to the wake list's BLPOP {OVERDUE:g} s after its block"))

    def _give_up(self, exc: Exception) -> None:
        """Drop the connection (a BLPOP may be pending on it) and try again later."""
        self._drop()
        self.failed(exc)
        if self.running:
            self._retry = self.hub.call_later(self.retry_in(), self._listen)

    def _unwatch(self) -> None:
        overdue, self._overdue = self._overdue, None
        _cancel(overdue)
        fd, self._fd = self._fd, -1
        if fd >= 0:
            self.hub.remove_reader(fd)

    def _drop(self) -> None:
        self._unwatch()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.disconnect()


class PollingWaker(_Waker):
    """A waker for a worker without a hub: pops the wake list every POLL_EVERY seconds on the worker's timer."""

    def __init__(self, rt: SlotRuntime, pool: str, publish: Publish, timer: Any) -> None:
        super().__init__(rt, pool, publish)
        self.timer = timer
        self._tref: Any = None
        self._resume_at = 0.0

    def start(self) -> None:
        self.stop()
        super().start()
        self._tref = self.timer.call_repeatedly(POLL_EVERY, self._poll)

    def stop(self) -> None:
        super().stop()
        tref, self._tref = self._tref, None
        _cancel(tref)

    def _poll(self) -> None:
        if time.monotonic() < self._resume_at:
            return
        try:
            self.tick_if_due()
            while self.running and (message := self.store.take_wake()) is not None:
                self.send(message)
            self.reached()
        except Exception as exc:
            self.failed(exc)
            self._resume_at = time.monotonic() + self.retry_in()
