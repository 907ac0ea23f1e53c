"""The home view's findings: ``celeryops doctor``'s, read again every :data:`SETTINGS_EVERY` seconds, and the live
ones the console sees happen (:mod:`celeryops.ops.doctor.live`), from its polls and from Celery's events.

The operator's console reads the workers' settings with inspect commands (the doctor's one round) and receives the
events with Celery's event receiver. Watch mode writes nothing and sends no control command: the settings come from
what the fence plugin's workers publish in its registry (HGETALL), the events from the broker's events channel
(PSUBSCRIBE, Redis only), the polls from the operator's published status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterable
from typing import Any

from celeryops.core.errors import UserError
from celeryops.core.events import DrainProgress, Finding, Observation
from celeryops.ops.doctor import Diagnosis, diagnose
from celeryops.ops.doctor.facts import FleetFacts
from celeryops.ops.doctor.live import LiveFindings
from celeryops.ops.doctor.read import read_fleet, registry_facts
from celeryops.ops.run.wiring import Wiring

SETTINGS_EVERY = 60.0  # seconds between two readings of the workers' settings
WATCH_NOTE = "watch mode: settings as the fence plugin's workers report them; live findings from task events"


class FleetFindings:
    def __init__(self, wiring: Wiring, *, read_only: bool) -> None:
        self.wiring = wiring
        self.read_only = read_only
        self.live = LiveFindings()
        self._feed: Any = None
        self._read_at: float | None = None
        self._diagnosis: Diagnosis | None = None
        self._concurrency: dict[str, int] = {}

    def _start_feed(self) -> None:
        if self._feed is not None:
            return
        fleet = self.wiring.fleet
        from celeryops.adapters.eventfeed import EventFeed, PubSubFeed

        if self.read_only:
            self._feed = PubSubFeed(fleet.app, fleet.broker_url, self.live.on_task_event) if fleet.is_redis else False
        else:
            self._feed = EventFeed(fleet.app, self.live.on_task_event)
        if self._feed:
            self._feed.start()

    @property
    def listening(self) -> bool:
        """Whether the task events reach the live findings now (the feed started and listens)."""
        return bool(self._feed) and self._feed.ready.is_set()

    async def _settings(self) -> None:
        """Read the workers' settings again when the last reading is older than SETTINGS_EVERY."""
        now = time.monotonic()
        if self._read_at is not None and now - self._read_at < SETTINGS_EVERY:
            return
        self._read_at = now
        w = self.wiring
        try:
            if self.read_only:
                facts: FleetFacts = await asyncio.to_thread(registry_facts, w.coord, w.fleet_name, w.fleet.broker_url)
            else:
                facts = await read_fleet(w.fleet, w.coord, w.fleet_name)
        except (UserError, OSError):  # the broker is away: the fleet view says so; keep the last reading
            return
        runs = self.live.runtimes()  # the runs task events reported count as long tasks too (prefetch)
        facts = dataclasses.replace(facts, workers={n: dataclasses.replace(f, event_runs=runs.get(n, {}))
                                                    for n, f in facts.workers.items()})
        # watch mode knows only the plugin workers: without any, it has nothing to say (not "no worker answered")
        self._diagnosis = diagnose(facts) if facts.workers or not self.read_only else None
        self._concurrency = {f.name: f.concurrency for f in facts.checked}

    def observe(self, obs: Observation, gone: Iterable[str] = ()) -> None:
        self.live.observe(obs, self._concurrency, gone)

    def observe_progress(self, progress: DrainProgress) -> None:
        self.observe(Observation(workers=progress.workers, tasks=progress.tasks), progress.left)

    async def current(self) -> tuple[tuple[Finding, ...], str]:
        """(every finding to show, the note on where they come from)."""
        self._start_feed()
        await self._settings()
        settings = self._diagnosis.findings if self._diagnosis is not None else ()
        return (*settings, *self.live.findings()), WATCH_NOTE if self.read_only else ""

    def close(self) -> None:
        feed, self._feed = self._feed, None
        if feed:
            with contextlib.suppress(Exception):
                feed.stop()
