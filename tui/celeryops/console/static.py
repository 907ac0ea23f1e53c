"""A backend filled with fixed data: drives the snapshot tests, the Pilot tests and the preview.

It is rendering test data, not a stand-in for Redis or Celery: it records the decisions the console sends
(``calls``) and refuses dangerous ones when read-only, as the real ops backend must. ``emit`` pushes an event
to the console as the orchestrator would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from celeryops.core.errors import ReadOnlyRefused
from celeryops.core.events import Event
from celeryops.ops.backend import views

if TYPE_CHECKING:
    from celeryops.ops.fleetwide.scalestatus import ScaleStatus
    from celeryops.ops.run.decisions import Decision


@dataclass
class StaticBackend:
    """A :class:`~celeryops.console.ports.ConsoleBackend` over fixed views and scripted events."""

    fleet: views.FleetView = field(default_factory=views.FleetView)
    slots: views.SlotsView | None = None
    scale: ScaleStatus | None = None  # the autoscaler's published status
    run: views.RunView | None = None
    releases_view: views.ReleasesView = field(default_factory=views.ReleasesView)
    history: tuple[views.RunRecordView, ...] = ()
    timelines: dict[str, tuple[views.TimelineEntry, ...]] = field(default_factory=dict)
    read_only: bool = False
    fleet_display: str = "redis://:***@broker.internal:6379/0"
    preflight_script: Sequence[Event] = ()  # emitted by start_deploy / start_drain
    proceed_script: Sequence[Event] = ()  # emitted by proceed
    follow_script: Sequence[Event] = ()  # emitted by follow_run (watch mode)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)  # the canary decisions sent, as sent
    sink: views.EventSink | None = None

    def emit(self, event: Event) -> None:
        if self.sink is not None:
            self.sink(event)

    def _play(self, events: Sequence[Event]) -> None:
        for event in events:
            self.emit(event)

    def _dangerous(self, action: str, *args: str) -> None:
        if self.read_only:
            self.calls.append(("refused", action))
            raise ReadOnlyRefused(action)
        self.calls.append((action, *args))

    async def fleet_snapshot(self) -> views.FleetView:
        return self.fleet

    async def slots_snapshot(self) -> views.SlotsView | None:
        return self.slots

    async def autoscaler(self) -> ScaleStatus | None:
        return self.scale

    async def unfinished_run(self) -> views.RunView | None:
        return self.run

    async def releases(self) -> views.ReleasesView:
        self.calls.append(("releases",))
        return self.releases_view

    async def run_history(self, limit: int = 50) -> tuple[views.RunRecordView, ...]:
        return self.history[:limit]

    async def run_timeline(self, run_id: str) -> tuple[views.TimelineEntry, ...]:
        return self.timelines.get(run_id, ())

    async def start_deploy(self, release: str, on_event: views.EventSink) -> None:
        self._dangerous("start deploy", release)
        self.sink = on_event
        self._play(self.preflight_script)

    async def start_rollback(self, run_id: str | None, on_event: views.EventSink) -> None:
        self._dangerous("start rollback", run_id or "")
        self.sink = on_event
        self._play(self.preflight_script)

    async def start_drain(self, on_event: views.EventSink) -> None:
        self._dangerous("start drain")
        self.sink = on_event
        self._play(self.preflight_script)

    async def accept_warnings(self) -> None:
        self._dangerous("accept warnings")

    async def proceed(self) -> None:
        self._dangerous("stop consumers")
        self._play(self.proceed_script)

    async def canary_decision(self, decision: Decision) -> None:
        self._dangerous("canary", decision.action)
        self.decisions.append(decision)

    async def abort_run(self, on_event: views.EventSink | None = None) -> None:
        self._dangerous("abort the run")
        self.run = None

    async def detach(self) -> None:
        self._dangerous("detach from the run")

    async def resume_run(self, on_event: views.EventSink) -> None:
        self._dangerous("resume the run")
        self.sink = on_event
        self.run = None
        self._play(self.proceed_script)

    async def forget_worker(self, name: str) -> None:
        self._dangerous("forget a worker", name)

    async def follow_run(self, on_event: views.EventSink) -> None:
        self.calls.append(("follow",))
        self.sink = on_event
        self._play(self.follow_script)
