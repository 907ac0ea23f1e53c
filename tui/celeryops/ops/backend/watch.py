"""Following a run from its published status (watch mode, and the console's home view while another process runs
the fleet): reads only (HGETALL, XRANGE, GET of the lease), and turns the entries back into typed events."""

from __future__ import annotations

import asyncio

import redis

from celeryops.core.events import DrainProgress, Notice, PhaseChanged, RunFollowed
from celeryops.core.masking import mask_text
from celeryops.core.untrusted import MalformedRecord
from celeryops.ops.backend.views import EventSink, RunSummary
from celeryops.ops.fleetwide.lease import read_lease
from celeryops.ops.fleetwide.publish import PublishedStatus, read_events, read_status
from celeryops.ops.journal import TERMINAL_PHASES


def live_status(coord: redis.Redis, fleet: str) -> PublishedStatus | None:
    """The fleet's run as published, if it is live (its lease held by its process) or parked drained."""
    status = read_status(coord, fleet)
    if status is None or status.phase in TERMINAL_PHASES:
        return None
    if status.phase == "drained":
        return status  # parked: a drain-only run keeps its consumers stopped until abort or deploy
    holder = read_lease(coord, fleet)  # a run is live while its lease is
    return status if holder is not None and holder.run_id == status.run_id and not holder.orphaned else None


def summary_from_status(status: PublishedStatus, progress: DrainProgress | None) -> RunSummary:
    from celeryops.ops.fleetwide.decode import decode  # with a published run: not on every console start

    phase = decode("phase", {"phase": status.phase})
    return RunSummary(run_id=status.run_id, kind=status.run_kind,
                      phase=phase.phase if isinstance(phase, PhaseChanged) else "draining",
                      release=status.release, owner=f"{status.owner}@{status.host}", started_at=status.started_at,
                      streak=progress.streak if progress else 0, required=progress.required if progress else 0,
                      remaining=progress.remaining if progress else None,
                      measured_at=status.updated_at if progress else None)


def published_progress(status: PublishedStatus) -> DrainProgress | None:
    from celeryops.ops.fleetwide.decode import progress_from_json

    return progress_from_json(status.progress) if status.progress else None


async def follow(coord: redis.Redis, fleet: str, on_event: EventSink, interval: float) -> None:
    """Stream the fleet's current run to ``on_event`` until cancelled: a ``RunFollowed`` when a new run appears,
    then its published events in order (a phase repeated back to back is sent once)."""
    from celeryops.ops.fleetwide.decode import decode

    run_id: str | None = None
    last: str | None = None
    phase: str | None = None
    while True:
        try:
            # A run is followed while its process runs it (or it is parked drained): an interrupted one is not (the
            # console's home names it and offers its panel).
            status = await asyncio.to_thread(live_status, coord, fleet)
            if status is not None and status.run_id != run_id:
                run_id, last, phase = status.run_id, None, None
                on_event(RunFollowed(run_id=status.run_id, run_kind=status.run_kind,
                                     release=status.release, owner=f"{status.owner}@{status.host}"))
            if run_id is not None:
                for entry in await asyncio.to_thread(read_events, coord, fleet, last):
                    last = entry.id
                    if entry.run_id != run_id:
                        continue
                    event = decode(entry.kind, entry.data)
                    if event is None:
                        continue
                    if isinstance(event, PhaseChanged):
                        if event.phase == phase:
                            continue
                        phase = event.phase
                    on_event(event)
        except MalformedRecord as exc:  # named, not followed
            on_event(Notice(level="warning", message=mask_text(str(exc))))
        except redis.RedisError as exc:
            on_event(Notice(level="warning", message=mask_text(f"reading the published status failed ({exc}); "
                                                               "retrying")))
        await asyncio.sleep(interval)
