"""The narrow interface between the console and the ops layer.

The console only renders views (:mod:`celeryops.ops.backend.views`) and events (:mod:`celeryops.core.events` and the run
events in ``celeryops.ops.backend.views``) and sends operator decisions back through a :class:`ConsoleBackend`. The ops
side implements this protocol structurally (it never imports the console); a
:class:`~celeryops.console.static.StaticBackend` drives snapshot tests and the preview.

Contract for implementations:

- ``read_only`` True (watch mode): every method marked *dangerous* raises
  :class:`celeryops.ops.backend.views.ReadOnlyRefused` and changes nothing (the console also never offers them).
- Snapshots are read-only: they send no control command that changes a worker and write no key.
- ``on_event`` may be called from any thread; the console posts each event to its message queue.
- Nothing blocks the console's event loop: every journal read, Redis read, git and registry call runs off it
  (``asyncio.to_thread`` or async I/O), so a slow Redis never freezes the screen.
- Failures the operator can fix raise :class:`celeryops.core.errors.UserError` (one sentence); the console shows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: the console's first frame does not wait for the ops layer's views
    from celeryops.ops.backend import views
    from celeryops.ops.fleetwide.scalestatus import ScaleStatus
    from celeryops.ops.run.decisions import Decision


class ConsoleBackend(Protocol):
    """What the console needs from ops."""

    read_only: bool
    fleet_display: str  # the fleet as the header shows it: its name @ a masked broker URL or the -A path

    async def fleet_snapshot(self) -> views.FleetView:
        """Workers (queues consumed, active/reserved/scheduled, state), queue depths, the current run."""
        ...

    async def slots_snapshot(self) -> views.SlotsView | None:
        """The slot pool, or None when the fleet has none."""
        ...

    async def autoscaler(self) -> ScaleStatus | None:
        """What the fleet's autoscaler last published (its looks, cohorts, decisions), or None. Reads only."""
        ...

    async def unfinished_run(self) -> views.RunView | None:
        """An interrupted run from the journal, with the plan of each recovery choice, or None."""
        ...

    async def releases(self) -> views.ReleasesView:
        """The remote's release branches, newest first, with tip commit, age and whether the image exists."""
        ...

    async def run_history(self, limit: int = 50) -> tuple[views.RunRecordView, ...]:
        """The fleet's recent runs, newest first (the local journal, and the fleet-held store when there is one)."""
        ...

    async def run_timeline(self, run_id: str) -> tuple[views.TimelineEntry, ...]:
        """One run's events, oldest first."""
        ...

    async def start_deploy(self, release: str, on_event: views.EventSink) -> None:
        """Begin a deploy run: runs preflight (CheckUpdate ... PreflightDone), then waits for :meth:`proceed`.
        Dangerous only in what follows ``proceed``; refused in read-only mode."""
        ...

    async def start_rollback(self, run_id: str | None, on_event: views.EventSink) -> None:
        """Begin a rollback run: of deploy run ``run_id`` (B in the run history), or as ``celeryops rollback``'s
        flags say (None). Runs preflight, then waits for :meth:`proceed`. Refused in read-only mode."""
        ...

    async def start_drain(self, on_event: views.EventSink) -> None:
        """Begin a drain-only run: preflight, then waits for :meth:`proceed`. Refused in read-only mode."""
        ...

    async def accept_warnings(self) -> None:
        """The operator confirmed the preflight warnings. Dangerous."""
        ...

    async def proceed(self) -> None:
        """Stop consumers and drain (then deploy, for a deploy run). Dangerous."""
        ...

    async def canary_decision(self, decision: Decision) -> None:
        """The canary screen's keys: promote now, roll back now, pause or resume the automatic verdicts; the run's
        canary strategy takes them (``celeryops.ops.run.decisions``). Dangerous."""
        ...

    async def abort_run(self, on_event: views.EventSink | None = None) -> None:
        """Abort the current or interrupted run, restoring consumers as the recovery rules say; with no open run, send
        the last run's restore again (unconfirmed, or undone by a broker reconnect). ``on_event`` hears how it went
        when no run of this console does. Dangerous."""
        ...

    async def detach(self) -> None:
        """Leave the run for ``celeryops resume`` (the fence keeps workers stopped until it expires). Dangerous."""
        ...

    async def resume_run(self, on_event: views.EventSink) -> None:
        """Take over the interrupted run and continue it from its journalled phase. Dangerous."""
        ...

    async def forget_worker(self, name: str) -> None:
        """Stop waiting for a known worker that no longer replies (it is gone). Dangerous."""
        ...

    async def follow_run(self, on_event: views.EventSink) -> None:
        """Watch mode: stream the live run's events from the published status (reads only)."""
        ...
