"""The demo's autoscaler: starts one more worker when the queue grows, never more than the fleet's cap.

Deliberately simple (no scale-in): during a drain the consumers are stopped, the backlog grows, and the autoscaler
adds a worker mid-drain, which is exactly the case the drain's re-broadcast and the fence plugin handle.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from celeryops.demo.fleet import DemoFleet
from celeryops.demo.producer import queue_depth

log = logging.getLogger("celeryops.demo")


class Autoscaler:
    """Every ``every`` seconds: if more than ``threshold`` messages wait, ``fleet.scale_out()`` (capped)."""

    def __init__(self, fleet: DemoFleet, broker: str, *, every: float, threshold: int = 8,
                 on_scale: Callable[[str, int], None] | None = None) -> None:
        self.fleet = fleet
        self.every = every
        self.threshold = threshold
        self.on_scale = on_scale
        self.scaled: list[str] = []
        self._redis = redis.Redis.from_url(broker, socket_timeout=5, socket_connect_timeout=3)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-autoscaler", daemon=True)

    def start(self) -> Autoscaler:
        self._thread.start()
        return self

    def tick(self) -> str | None:
        """One decision; returns the new worker's name when it scaled out."""
        depth = queue_depth(self._redis)
        if depth <= self.threshold:
            return None
        worker = self.fleet.scale_out()
        if worker is None:
            return None
        self.scaled.append(worker.nodename)
        if self.on_scale is not None:
            self.on_scale(worker.nodename, depth)
        return worker.nodename

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.tick()
            except (redis.RedisError, RuntimeError, TimeoutError, OSError) as exc:
                log.debug("demo autoscaler: %s", exc)

    def request_stop(self) -> None:
        """No more decisions (a scale-out under way ends when the fleet is stopped)."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        self._redis.close()
