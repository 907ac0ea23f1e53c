"""The console's ops side (no Textual): :class:`OpsBackend` implements ``celeryops.console.ports.ConsoleBackend``
by driving the same :class:`~celeryops.ops.run.session.RunSession` the headless commands drive. It holds no flow of
its own: the console's keys become the session's operator decisions (:class:`ConsoleOperator`), and the session's
events go to the console as they are.

- A run runs as a task in the console's event loop, in a session of its own whose events go to the console's sink
  for that run. Cancelling it applies the recovery rules (the session's and the runner's); a detached run is left in
  the journal, stopped, for ``celeryops resume``.
- Read-only (watch mode): every dangerous method raises ``ReadOnlyRefused``; the live run comes from its published
  status (reads only), over Redis connections named ``celeryops-watch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from celeryops.core.config import Config, Target
from celeryops.core.errors import EXIT_USAGE, ReadOnlyRefused, UserError
from celeryops.core.events import (
    CheckUpdate,
    DrainProgress,
    Event,
    Notice,
    PhaseChanged,
    PreflightDone,
    RunKind,
    RunPhase,
)
from celeryops.core.masking import mask_text
from celeryops.ops.access.probe import PermissionRefused, missing, url_of, user_of, watcher_needs
from celeryops.ops.backend.history import local_runs, local_timeline, merge_runs
from celeryops.ops.backend.releases import list_releases
from celeryops.ops.backend.snapshots import Snapshots
from celeryops.ops.backend.views import (
    EventSink,
    FleetView,
    ReleasesView,
    RunRecordView,
    RunSummary,
    RunView,
    SlotsView,
    TimelineEntry,
)
from celeryops.ops.backend.watch import follow
from celeryops.ops.fleetwide.scalestatus import ScaleStatus, read_scale_status
from celeryops.ops.run.decisions import Decision
from celeryops.ops.run.operator import ConsoleOperator
from celeryops.ops.run.rollback_plan import RollbackRequest
from celeryops.ops.run.session import DrainRequest, RunSession
from celeryops.ops.run.strategies import strategy_of_run, strategy_of_targets
from celeryops.ops.run.wiring import CONSOLE_CLIENT_NAME, Wiring, wire

#: The check a failure before the operator's go is shown as (the preflight's checklist, failed).
PREFLIGHT_ERROR = "preflight"


@dataclass
class _Live:
    """The run this console drives (``session``: set as soon as it is made, with this run's sink)."""

    kind: RunKind
    release: str | None
    sink: EventSink
    started_at: float
    session: RunSession | None = None
    operator: ConsoleOperator = field(default_factory=ConsoleOperator)
    phase: RunPhase = "preflight"
    task: asyncio.Task[None] | None = None
    detached: bool = False
    progress: DrainProgress | None = None
    progress_at: float | None = None  # the console's clock when ``progress`` arrived
    decisions: tuple[str, ...] = ()  # the operator's decisions its strategy takes mid-run (a canary's)

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def summary(self) -> RunSummary:
        p = self.progress
        return RunSummary(run_id="this console", kind=self.kind, phase=self.phase, release=self.release,
                          owner="you", started_at=self.started_at, streak=p.streak if p else 0,
                          required=p.required if p else 0, remaining=p.remaining if p else None,
                          measured_at=self.progress_at if p else None)


class OpsBackend:
    """:class:`~celeryops.console.ports.ConsoleBackend` over the real ops layer."""

    def __init__(self, wiring: Wiring, *, read_only: bool = False, fleet_display: str = "",
                 drain: DrainRequest | None = None, targets: tuple[Target, ...] | None = None,
                 repo: Path | None = None, clock: Callable[[], float] = time.time,
                 follow_interval: float = 1.0, rollback: RollbackRequest | None = None) -> None:
        self.wiring = wiring
        self.read_only = read_only
        # The fleet's name first: a watcher whose CELERYOPS_FLEET differs from the operator's sees another fleet's
        # runs (none), so the header says which fleet this is.
        self.fleet_display = f"{wiring.fleet_name} @ {fleet_display or wiring.fleet.display_url}"
        self.drain_request = drain or DrainRequest()
        self.rollback_request = rollback or RollbackRequest()  # `celeryops rollback` in a terminal: its flags
        self.targets = targets
        self.repo = repo or Path.cwd()
        self.clock = clock
        self.follow_interval = follow_interval
        self.snapshots = Snapshots(wiring, queues=set(self.drain_request.queues), read_only=read_only)
        self._live: _Live | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def config(self) -> Config:
        return self.wiring.config

    def _writable(self, action: str) -> Wiring:
        """The wiring, for an action that changes something: refused in watch mode and without a journal."""
        if self.read_only:
            raise ReadOnlyRefused(action)
        if self.wiring.journal is None:
            raise UserError(f"Cannot {action}: this console has no run journal, nothing was changed; "
                            "start it with --state-dir pointing at a writable directory.", EXIT_USAGE)
        return self.wiring

    def _session(self, live: _Live | None, operator: ConsoleOperator | None = None) -> RunSession:
        """A session whose events go to ``live``'s run (its phase, progress and sink), or nowhere."""
        sink: EventSink = (lambda event: self._to(live, event)) if live is not None else (lambda event: None)
        return self.wiring.session(operator or ConsoleOperator(), sink, repo=self.repo)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Stop following; a run still going is cancelled (which applies the recovery rules)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    def close_sync(self) -> None:
        self.snapshots.close()
        self.wiring.close()

    # -- views (read-only) -----------------------------------------------------------------------------------------

    async def fleet_snapshot(self) -> FleetView:
        live = self._live if self._live is not None and self._live.running else None
        return await self.snapshots.fleet(live.summary() if live else None, live.progress if live else None)

    async def slots_snapshot(self) -> SlotsView | None:
        return await self.snapshots.slots()

    async def autoscaler(self) -> ScaleStatus | None:
        """What the fleet's autoscaler last published (one HGET), or None (no Redis, none published)."""
        return await self.wiring.read_coord(read_scale_status)

    async def unfinished_run(self) -> RunView | None:
        return await asyncio.to_thread(self.snapshots.unfinished_run)

    async def releases(self) -> ReleasesView:
        return await list_releases(self.config, self.repo, self.targets)

    async def run_history(self, limit: int = 50) -> tuple[RunRecordView, ...]:
        journal = self.wiring.journal
        if journal is None:
            return ()
        local = await asyncio.to_thread(local_runs, journal, self.wiring.fleet_name, limit)
        return merge_runs(local, limit=limit)

    async def run_timeline(self, run_id: str) -> tuple[TimelineEntry, ...]:
        journal = self.wiring.journal
        if journal is None:
            return ()
        return await asyncio.to_thread(local_timeline, journal, run_id)

    # -- runs ------------------------------------------------------------------------------------------------------

    def _refuse_if_running(self) -> None:
        if self._live is not None and self._live.running:
            raise UserError("A run is already in progress in this console: nothing was changed; finish or abort it "
                            "first.", EXIT_USAGE)

    def _new_live(self, kind: RunKind, release: str | None, sink: EventSink) -> _Live:
        live = _Live(kind=kind, release=release, sink=sink, started_at=self.clock())
        live.session = self._session(live, live.operator)
        return live

    def _begin(self, live: _Live, work: Callable[[RunSession], Coroutine[Any, Any, object]]) -> None:
        self._refuse_if_running()
        assert live.session is not None
        self._live = live
        live.task = self._spawn(self._guard(live, work(live.session)))

    def _to(self, live: _Live, event: Event) -> None:
        if isinstance(event, PhaseChanged):
            live.phase = event.phase
        elif isinstance(event, DrainProgress):
            live.progress, live.progress_at = event, self.clock()
        live.sink(event)

    async def _guard(self, live: _Live, work: Coroutine[Any, Any, object]) -> None:
        """Run a session call; its failures reach the operator as one sentence and end the run. A failure before the
        operator's go (what to deploy or roll back to, building the checks, the review) is the preflight's: it is shown
        there, as a failed check with its sentence, never a checklist left waiting."""
        try:
            await work
        except asyncio.CancelledError:
            if live.phase in ("preflight", "ready"):
                self._to(live, PhaseChanged("aborted", "stopped before anything was changed"))
            raise
        except UserError as err:
            self._failed(live, mask_text(str(err)), "the run could not go on")
        except Exception as exc:  # an unexpected failure must still end the run visibly
            self._failed(live, mask_text(f"{type(exc).__name__}: {exc}"), "unexpected error")

    def _failed(self, live: _Live, sentence: str, why: str) -> None:
        if live.phase in ("preflight", "ready"):
            self._to(live, CheckUpdate(PREFLIGHT_ERROR, "Preflight could not finish", "fail", sentence))
            self._to(live, PreflightDone(failed=1, warnings=0))
        self._to(live, Notice(level="error", message=sentence))
        self._to(live, PhaseChanged("failed", why))

    async def start_deploy(self, release: str, on_event: EventSink) -> None:
        self._writable("start a deploy")
        self._refuse_if_running()
        targets = self.targets if self.targets is not None else self.config.targets
        live = self._new_live("deploy", release, on_event)

        async def deploy(session: RunSession) -> object:
            if targets:  # (an unknown strategy is the run's failure: its sentence on the preflight's screen)
                live.decisions = strategy_of_targets(targets).decisions
            return await session.deploy(release, targets)

        self._begin(live, deploy)

    async def start_rollback(self, run_id: str | None, on_event: EventSink) -> None:
        self._writable("start a rollback")
        self._refuse_if_running()
        request = RollbackRequest(run_id=run_id) if run_id else self.rollback_request
        self._begin(self._new_live("rollback", None, on_event), lambda s: s.rollback(request))

    async def start_drain(self, on_event: EventSink) -> None:
        self._writable("start a drain")
        self._refuse_if_running()
        self._begin(self._new_live("drain", None, on_event), lambda s: s.drain(self.drain_request))

    async def resume_run(self, on_event: EventSink) -> None:
        self._writable("resume the run")
        self._refuse_if_running()
        live = self._new_live("drain", None, on_event)
        assert live.session is not None
        run = await asyncio.to_thread(live.session.runner.unfinished)
        if run is None:
            raise UserError("There is no unfinished run to resume: nothing was changed.", EXIT_USAGE)
        live.kind, live.release = run.kind, run.release
        if run.release:
            live.decisions = strategy_of_run(run).decisions
        self._begin(live, lambda s: s.resume(run))

    async def accept_warnings(self) -> None:
        self._writable("accept the preflight warnings")
        if self._live is not None:
            self._live.operator.accept_warnings()

    async def proceed(self) -> None:
        self._writable("stop consumers")
        live = self._live
        if live is None or not live.running:
            raise UserError("There is no run waiting to proceed: nothing was changed.", EXIT_USAGE)
        live.operator.proceed()

    async def canary_decision(self, decision: Decision) -> None:
        self._writable(f"{decision.action} the canary")
        live = self._live
        if live is None or not live.running or decision.action not in live.decisions:
            raise UserError(f"There is no canary running in this console to {decision.action}: nothing was "
                            "changed.", EXIT_USAGE)
        live.operator.decisions.send(decision)

    async def abort_run(self, on_event: EventSink | None = None) -> None:
        self._writable("abort the run")
        live = self._live
        if live is not None and live.running and live.task is not None:
            live.task.cancel()  # the session restores what it stopped (or applies the recovery rules) first
            with contextlib.suppress(asyncio.CancelledError):
                await live.task
            return
        # No open run: the runner sends the last run's restore again when it was not confirmed, or when a broker
        # reconnect since left its workers consuming nothing (else it says there is no run to abort). The abort's
        # events go to the console's last run, if any, else to ``on_event``.
        if live is not None:
            sink: EventSink = live.sink
            session = self._session(live)
        else:
            sink = on_event or (lambda event: None)
            session = self.wiring.session(ConsoleOperator(), sink, repo=self.repo)
        run = await asyncio.to_thread(session.runner.unfinished)
        decided = await session.abort(run)
        sink(Notice(level="info" if decided.action != "ask" else "warning", message=decided.explanation))

    async def detach(self) -> None:
        self._writable("detach from the run")
        live = self._live
        if live is None or not live.running or live.task is None or live.session is None:
            return
        live.detached = True
        live.session.detach()
        live.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await live.task

    async def forget_worker(self, name: str) -> None:
        self._writable("forget a worker")
        live = self._live  # the drain that runs is the console's run's
        session = live.session if live is not None and live.session is not None else self._session(None)
        await session.forget(name)

    async def follow_run(self, on_event: EventSink) -> None:
        coord = self.wiring.coord
        if coord is None:
            on_event(Notice(level="warning", message="No Redis holds the published status (the broker is not Redis "
                                                     "and CELERYOPS_REDIS_URL is not set): only the fleet is shown."))
            return
        self._spawn(follow(coord, self.wiring.fleet_name, on_event, self.follow_interval))


def open_backend(app: Celery, config: Config, *, read_only: bool, fleet_display: str, state_dir: str | None = None,
                 drain: DrainRequest | None = None, targets: tuple[Target, ...] | None = None,
                 repo: Path | None = None, follow_interval: float = 1.0,
                 rollback: RollbackRequest | None = None) -> OpsBackend:
    """The console's backend for the fleet of ``app`` (``state_dir`` overrides the config's)."""
    if state_dir is not None:
        config = dataclasses.replace(config, state_dir=state_dir)
    wiring = wire(app, config, read_only=read_only, client_name=None if read_only else CONSOLE_CLIENT_NAME)
    wiring.require_login()
    if read_only and wiring.coord is not None:
        _require_watcher(wiring)
    return OpsBackend(wiring, read_only=read_only, fleet_display=fleet_display, drain=drain, targets=targets,
                      repo=repo, follow_interval=follow_interval, rollback=rollback)


def _require_watcher(wiring: Wiring) -> None:
    """Watch mode: refuse in one sentence, before the console opens, a Redis user that may not read the fleet's
    published status (a worker's user); a Redis that does not answer is the console's to report."""

    assert wiring.coord is not None
    try:
        lacking = missing(wiring.coord, watcher_needs(wiring.fleet_name))
    except redis.RedisError:
        return
    if lacking:
        wiring.close()
        raise PermissionRefused("watch the fleet", user_of(wiring.coord), lacking[0], url_of(wiring.coord))
