"""The demo's autoscaled worker pool (``celeryops demo --autoscale``): the real ``celeryops autoscale`` loop
(:func:`celeryops.ops.autoscale.loop.autoscale`, the one entry point) on a thread of its own, sizing the sandbox's
worker pool by what Celery holds. Its steps are told as progress lines; its looks are published in the sandbox's
Redis, where the console's autoscaler view (``a``) reads them. ``stop()`` lets the step in progress complete or be
undone before it returns."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from celery import Celery

from celeryops.core.config import Config
from celeryops.core.events import Event, Notice
from celeryops.core.scaleevents import AutoscaleStep
from celeryops.ops.autoscale.loop import autoscale
from celeryops.ops.run.operator import FlagOperator
from celeryops.ops.run.wiring import wire

log = logging.getLogger("celeryops.demo")

#: The steps worth a progress line (a cohort added or taken away, a step given up, a run waited for).
TOLD = ("added", "removed", "given_up", "waiting", "recovered")


class PoolScaler:
    """``celeryops autoscale`` of the demo's ``worker`` pool, started with :meth:`start`, ended with :meth:`stop`."""

    def __init__(self, broker: str, config: Config, progress: Callable[[str], None]) -> None:
        self.broker = broker
        self.config = config
        self.progress = progress
        self.steps: list[AutoscaleStep] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-pool-autoscaler", daemon=True)

    def start(self) -> PoolScaler:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _sink(self, event: Event) -> None:
        if isinstance(event, AutoscaleStep):
            self.steps.append(event)
            if event.step in TOLD:
                self.progress(f"autoscaler: {event.message}")
        elif isinstance(event, Notice) and event.level != "info":
            self.progress(f"autoscaler: {event.message}")

    def _run(self) -> None:
        app = Celery("celeryops-demo-autoscaler", broker=self.broker, set_as_current=False)
        wiring = wire(app, self.config)
        target = self.config.target(self.config.autoscale.target or "worker")

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            session = wiring.session(FlagOperator(ask=None), self._sink)
            await autoscale(session, target, self.config.autoscale, self._stop)

        try:
            asyncio.run(main())
        except Exception as exc:  # the demo goes on without it; the reason is shown once
            self.progress(f"autoscaler stopped: {exc}")
            log.debug("demo pool autoscaler", exc_info=True)
        finally:
            self._ready.set()
            wiring.close()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the loop (the step in progress completes or is undone) and wait for it, at most ``timeout`` s."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout)


__all__ = ["PoolScaler"]
