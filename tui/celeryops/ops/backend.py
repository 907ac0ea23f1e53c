"""The console's real backend (ops side, no Textual): :class:`OpsBackend` implements
``celeryops.console.ports.ConsoleBackend`` over the same ``Runner`` / ``ReleaseFlow`` / ``Fleet`` the headless
commands use, and translates their events into the console's view events (``celeryops.ops.views``).

- Runs (drain, deploy, resume) run as tasks in the console's event loop; operator decisions arrive as method calls
  (``proceed``, ``abort_run``, ``detach``). A cancelled run restores its consumers (the runner's rule); a detached
  run is left in the journal, stopped, for ``celeryops resume`` (its fence expires if nobody resumes it).
- Read-only (watch mode): every dangerous method raises ``ReadOnlyRefused``; while a run is live the fleet view and
  the run come from its published status (HGETALL / XRANGE / LLEN only); Redis connections are named
  ``celeryops-watch`` so a MONITOR log can tell them apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import redis
from celery import Celery

from celeryops.adapters.fleet import Fleet
from celeryops.core.config import Config, Target
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.events import (
    ConsumersCancelled,
    ConsumersRestored,
    DrainFinished,
    DrainProgress,
    DrainStarted,
    Event,
    Notice,
    TaskInfo,
    WorkerObs,
)
from celeryops.core.masking import mask_text
from celeryops.core.namespace import fleet_name as default_fleet_name
from celeryops.ops.drain import DrainSettings
from celeryops.ops.journal import TERMINAL_PHASES, Journal, journal_path
from celeryops.ops.preflight import Check, CheckResult, run_checks
from celeryops.ops.preflight.checks import fence_plugin_check
from celeryops.ops.publish import PublishedStatus, read_events, read_status
from celeryops.ops.recovery import plan
from celeryops.ops.runlease import read_lease
from celeryops.ops.runner import Runner
from celeryops.ops.views import (
    CheckUpdate,
    Condition,
    DeployTarget,
    DeployUpdate,
    EventSink,
    FleetBack,
    FleetView,
    PhaseChanged,
    PreflightDone,
    QueueView,
    ReadOnlyRefused,
    RecoveryChoice,
    ResourceView,
    RolloutState,
    RunFollowed,
    RunPhase,
    RunSummary,
    RunView,
    SlotHolder,
    SlotsView,
    SlotWaiter,
    WorkerView,
)

WATCH_CLIENT_NAME = "celeryops-watch"
CONSOLE_CLIENT_NAME = "celeryops-console"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
# Journal phases the console's RunPhase does not have, shown as the nearest one.
PHASE_MAP: dict[str, RunPhase] = {"deployed": "deploying"}


def console_phase(phase: str) -> RunPhase:
    known = ("preflight", "ready", "stopping", "draining", "drained", "deploying", "restoring", "done", "aborted",
             "failed")
    mapped = PHASE_MAP.get(phase, phase)
    return mapped if mapped in known else "draining"  # type: ignore[return-value]


@dataclass(frozen=True)
class DrainRequest:
    """What a drain run of this console should do (the ``celeryops drain`` flags)."""

    queues: tuple[str, ...] = ()
    settings: DrainSettings | None = None  # None: the config's
    forget: tuple[str, ...] = ()
    take_over: bool = False


@dataclass
class _Live:
    """The run this console drives."""

    kind: Literal["deploy", "drain"]
    release: str | None
    sink: EventSink
    started_at: float
    phase: RunPhase = "preflight"
    task: asyncio.Task[None] | None = None
    proceed: asyncio.Event = field(default_factory=asyncio.Event)
    warnings: int = 0
    failed: int = 0
    warnings_accepted: bool = False
    detached: bool = False
    aborting: bool = False
    progress: DrainProgress | None = None
    targets: dict[str, DeployTarget] = field(default_factory=dict)
    preexisting: set[str] = field(default_factory=set)  # unfinished runs in the journal before this one

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


class OpsBackend:
    """:class:`~celeryops.console.ports.ConsoleBackend` over the real ops layer."""

    def __init__(self, fleet: Fleet, *, config: Config, runner: Runner | None, journal: Journal | None,
                 coord: redis.Redis | None, slots_client: redis.Redis | None = None, fleet_name: str = "default",
                 read_only: bool = False, fleet_display: str = "", drain: DrainRequest | None = None,
                 targets: tuple[Target, ...] | None = None, repo: Path | None = None,
                 clock: Callable[[], float] = time.time, follow_interval: float = 1.0) -> None:
        self.fleet = fleet
        self.config = config
        self.runner = runner
        self.journal = journal
        self.coord = coord
        self.slots_client = slots_client
        self.fleet_name = fleet_name
        self.read_only = read_only
        self.fleet_display = fleet_display or fleet.display_url
        self.drain_request = drain or DrainRequest()
        self.targets = targets
        self.repo = repo or Path.cwd()
        self.clock = clock
        self.follow_interval = follow_interval
        self._live: _Live | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._queues: set[str] = set(self.drain_request.queues)
        self._history: dict[str, deque[int]] = {}
        self._published: PublishedStatus | None = None

    # -- helpers -----------------------------------------------------------------------------------------------

    def _refuse(self, action: str) -> Runner:
        if self.read_only:
            raise ReadOnlyRefused(action)
        if self.runner is None:
            raise UserError(f"Cannot {action}: this console has no run journal, nothing was changed; "
                            "start it with --state-dir pointing at a writable directory.", EXIT_USAGE)
        return self.runner

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Stop following; a run still going is cancelled (which restores its consumers)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    def close_sync(self) -> None:
        for client in (self.coord, self.slots_client):
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
        self.fleet.close()
        if self.journal is not None:
            self.journal.close()

    # -- snapshots (read-only) ---------------------------------------------------------------------------------

    async def fleet_snapshot(self) -> FleetView:
        live = self._live
        if live is not None and live.running and live.progress is not None:
            return await self._view_from_progress(live.progress, self._own_summary(live))
        published = await self._read_published()
        if published is not None and published.progress and published.phase != "drained":
            progress = progress_from_json(published.progress)
            if progress is not None:
                return await self._view_from_progress(progress, summary_from_status(published, progress))
        members = await self.fleet.members()
        obs = await self.fleet.observe(members)
        workers = tuple(WorkerView(w.name, w.state, w.queues, w.active, w.reserved, w.scheduled, w.plugin)
                        for w in obs.workers.values())
        for w in obs.workers.values():
            self._queues.update(w.queues)
        run = self._own_summary(live) if live is not None and live.running else (
            summary_from_status(published, None) if published is not None else None)
        return FleetView(workers=workers, queues=await self._queue_views(workers), tasks=obs.tasks, run=run)

    async def _view_from_progress(self, progress: DrainProgress, run: RunSummary | None) -> FleetView:
        workers = tuple(WorkerView(w.name, w.state, w.queues, w.active, w.reserved, w.scheduled, w.plugin)
                        for w in progress.workers.values())
        for w in progress.workers.values():
            self._queues.update(w.queues)
        return FleetView(workers=workers, queues=await self._queue_views(workers), tasks=progress.tasks, run=run)

    async def _queue_views(self, workers: tuple[WorkerView, ...]) -> tuple[QueueView, ...]:
        if not self._queues:
            return ()
        depths = await self.fleet.queue_depths(sorted(self._queues))
        return tuple(QueueView(d.queue, d.messages, sum(1 for w in workers if d.queue in w.queues)) for d in depths)

    async def _read_published(self) -> PublishedStatus | None:
        if self.coord is None:
            return None
        coord = self.coord

        def read() -> PublishedStatus | None:
            status = read_status(coord, self.fleet_name)
            if status is None or status.phase in TERMINAL_PHASES:
                return None
            if status.phase == "drained":
                return status  # parked: a drain-only run keeps its consumers stopped until abort or deploy
            holder = read_lease(coord, self.fleet_name)  # a run is live while its lease is
            return status if holder is not None and holder.run_id == status.run_id and not holder.orphaned else None

        try:
            self._published = await asyncio.to_thread(read)
        except redis.RedisError:
            return None
        return self._published

    def _own_summary(self, live: _Live) -> RunSummary:
        p = live.progress
        return RunSummary(run_id="this console", kind=live.kind, phase=live.phase, release=live.release,
                          owner="you", started_at=live.started_at, streak=p.streak if p else 0,
                          required=p.required if p else 0, remaining=p.remaining if p else None)

    async def slots_snapshot(self) -> SlotsView | None:
        if self.slots_client is None:
            return None
        from celeryops.slots import read_all

        client = self.slots_client
        try:
            snap = await asyncio.to_thread(read_all, client)
        except redis.RedisError:
            return None
        if not snap.pools:
            return None
        pool = next((p for p in snap.pools if p.scope == "global"), snap.pools[0])
        resources = []
        for usage in pool.types:
            history = self._history.setdefault(usage.type, deque(maxlen=60))
            history.append(usage.used)
            resources.append(ResourceView(usage.type, usage.total, usage.used, tuple(history)))
        holders = tuple(SlotHolder(h.task_id, h.task_name, h.worker, dict(h.slots), h.age or 0.0,
                                   0.0 if h.expired else (h.lease_remaining if h.lease_remaining is not None
                                                          else 24 * 3600.0))
                        for h in pool.holders)
        waiting = tuple(SlotWaiter(w.task_name, w.worker, dict(w.slots), w.waited) for w in pool.waiting)
        return SlotsView(pool=pool.pool, resources=tuple(resources), holders=holders, waiting=waiting)

    def unfinished_run(self) -> RunView | None:
        if self.journal is None:
            return None
        runs = self.journal.unfinished_runs(self.fleet_name)
        if not runs:
            return None
        run = runs[-1]
        if self.coord is not None:
            with contextlib.suppress(redis.RedisError):
                holder = read_lease(self.coord, self.fleet_name)
                if holder is not None and holder.run_id == run.id and not holder.orphaned:
                    return None  # it is running elsewhere right now: the home screen shows it live
        decided = plan(run, None)
        choices = []
        if run.phase in ("preflight", "stopping", "draining") or (run.phase == "drained" and not run.release):
            choices.append(RecoveryChoice(
                "resume", "Resume the drain",
                "Take over the run with its journalled settings: consumers it stopped stay stopped and the drain "
                "continues from a fresh streak (what `celeryops resume` does)."))
        if decided.action in ("restore", "nothing"):
            choices.append(RecoveryChoice("abort", "Abort and restore consumers" if decided.restore
                                          else "Abort (nothing to restore)", decided.explanation))
        stopped = run.stopped_consumers()
        queues = sorted({q for qs in stopped.values() for q in qs})
        detail = (f"consumers cancelled on {len(stopped)} worker(s) for queues {', '.join(queues)}"
                  if stopped else "no consumer stopped") + f"; journal phase {run.phase}"
        if decided.action in ("leave", "ask"):
            detail += f". {decided.explanation}"
        return RunView(run.id, "deploy" if run.release else "drain", console_phase(run.phase),
                       started_at=run.created, owner=f"{run.user}@{run.host}", release=run.release,
                       choices=tuple(choices), detail=detail)

    # -- starting runs -----------------------------------------------------------------------------------------

    def _begin(self, kind: Literal["deploy", "drain"], release: str | None, on_event: EventSink) -> _Live:
        if self._live is not None and self._live.running:
            raise UserError("A run is already in progress in this console: nothing was changed; finish or abort it "
                            "first.", EXIT_USAGE)
        live = _Live(kind=kind, release=release, sink=on_event, started_at=self.clock())
        if self.journal is not None:
            live.preexisting = {r.id for r in self.journal.unfinished_runs(self.fleet_name)}
        self._live = live
        return live

    async def start_deploy(self, release: str, on_event: EventSink) -> None:
        runner = self._refuse("start a deploy")
        live = self._begin("deploy", release, on_event)
        live.task = self._spawn(self._guard(live, self._deploy_flow(runner, live)))

    async def start_drain(self, on_event: EventSink) -> None:
        runner = self._refuse("start a drain")
        live = self._begin("drain", None, on_event)
        live.task = self._spawn(self._guard(live, self._drain_flow(runner, live)))

    async def accept_warnings(self) -> None:
        self._refuse("accept the preflight warnings")
        if self._live is not None:
            self._live.warnings_accepted = True

    async def proceed(self) -> None:
        self._refuse("stop consumers")
        live = self._live
        if live is None or not live.running or live.phase not in ("preflight", "ready"):
            raise UserError("There is no run waiting to proceed: nothing was changed.", EXIT_USAGE)
        if live.failed:
            raise UserError("Preflight failed: nothing was stopped; fix what the checks say and start again.",
                            EXIT_USAGE)
        if live.warnings and not live.warnings_accepted:
            raise UserError("Preflight warned and the warnings were not accepted: nothing was stopped; review "
                            "them and confirm.", EXIT_USAGE)
        live.proceed.set()

    async def _guard(self, live: _Live, flow: Any) -> None:
        """Run a flow; its failures reach the operator as one sentence and end the run."""
        try:
            await flow
        except asyncio.CancelledError:
            if not live.detached:
                self._to(live, PhaseChanged("aborted", "the run was stopped; consumers restored"))
            raise
        except UserError as err:
            self._to(live, Notice(level="error", message=mask_text(str(err))))
            self._to(live, PhaseChanged("failed", "the run could not go on"))
        except Exception as exc:  # an unexpected failure must still end the run visibly
            self._to(live, Notice(level="error", message=mask_text(f"{type(exc).__name__}: {exc}")))
            self._to(live, PhaseChanged("failed", "unexpected error"))

    def _to(self, live: _Live, event: Event) -> None:
        if isinstance(event, PhaseChanged):
            live.phase = event.phase
        live.sink(event)

    def _wire(self, runner: Runner, live: _Live) -> None:
        runner.on_event = lambda event: self._translate(live, event)
        runner.detached = False

    async def _drain_flow(self, runner: Runner, live: _Live) -> None:
        self._wire(runner, live)
        self._to(live, PhaseChanged("preflight", "checking before anything changes"))
        report = await run_checks(self._drain_checks(runner), lambda e: self._check_event(live, e))
        live.failed, live.warnings = len(report.failed), len(report.warnings)
        self._to(live, PreflightDone(failed=live.failed, warnings=live.warnings))
        live.phase = "failed" if live.failed else "ready"
        if live.failed:
            return
        await live.proceed.wait()
        req = self.drain_request
        cfg = self.config.drain
        settings = req.settings or DrainSettings(interval=cfg.interval, streak=cfg.streak, max_wait=cfg.max_wait)
        self._to(live, PhaseChanged("stopping", "cancelling consumers"))
        outcome, _run = await runner.drain(queues=req.queues, settings=settings, forget=req.forget,
                                           take_over=req.take_over)
        if outcome == "drained":
            self._to(live, PhaseChanged("done", "drained: the consumers stay stopped, ready for a deploy; "
                                                "undo with `celeryops abort`"))
        else:
            self._to(live, PhaseChanged("aborted", f"{outcome}: consumers restored, nothing was killed"))

    def _drain_checks(self, runner: Runner) -> list[Check]:
        fleet = self.fleet

        async def broker() -> CheckResult:
            try:
                await fleet.check_broker()
            except UserError as err:
                return CheckResult("broker", "", "fail", str(err), "start the broker or fix --broker / -A")
            return CheckResult("broker", "", "ok", fleet.display_url)

        async def workers() -> CheckResult:
            answered = await fleet.ping()
            members = await fleet.members()
            silent = sorted(members - answered)
            if not answered and not members:
                return CheckResult("workers", "", "fail", "no worker answered and none is registered",
                                   "start the workers (or check that they use this broker)")
            if silent:
                return CheckResult("workers", "", "warn", f"{len(silent)} registered worker(s) did not answer ping: "
                                   f"{', '.join(silent[:4])}", "they count as unknown until they reply; forget "
                                   "them with --forget if they are gone")
            return CheckResult("workers", "", "ok", f"{len(answered)} worker(s) answer")

        async def lease() -> CheckResult:
            if runner.coord is None:
                return CheckResult("lease", "", "warn", "no Redis for the run lease",
                                   "set CELERYOPS_REDIS_URL so that two operators cannot drain at once")
            holder = await asyncio.to_thread(read_lease, runner.coord, runner.fleet_name)
            if holder is not None and not (holder.orphaned and self.drain_request.take_over):
                return CheckResult("lease", "", "fail", f"another run holds the fleet: {holder.describe()}",
                                   "wait for it, or take over an orphaned run with --take-over")
            open_run = runner.unfinished()
            if open_run is not None and open_run.stopped_consumers() and not self.drain_request.take_over:
                return CheckResult("lease", "", "fail", f"run {open_run.id} is unfinished and holds stopped "
                                   "consumers", "open `celeryops` to resume or abort it first")
            return CheckResult("lease", "", "ok", "the lease is free")

        return [Check("broker", "Broker reachable", broker, timeout=15),
                Check("workers", "Every known worker replies", workers, timeout=20),
                Check("lease", "No other run holds the fleet", lease, timeout=10),
                fence_plugin_check(fleet.app, runner.fleet_name)]

    def _check_event(self, live: _Live, event: Any) -> None:
        result = getattr(event, "result", None)
        if result is None:
            self._to(live, CheckUpdate(event.id, event.title, "running"))
        else:
            self._to(live, CheckUpdate(result.id, result.title, result.status, result.detail, result.remedy))

    async def _deploy_flow(self, runner: Runner, live: _Live) -> None:
        from celeryops.ops.release import ReleaseFlow

        self._wire(runner, live)
        asked = 0

        async def confirm(_question: str) -> bool:
            nonlocal asked
            asked += 1
            if asked > 1:  # "drained, deploy now?": the operator's proceed covered the deploy
                return True
            report = flow.report
            live.warnings = len(report.warnings) if report else 0
            self._to(live, PreflightDone(failed=0, warnings=live.warnings))
            live.phase = "ready"
            await live.proceed.wait()
            return True

        targets = self.targets if self.targets is not None else self.config.targets
        flow = ReleaseFlow(runner, self.config, live.release or "", targets, repo=self.repo, accept_warnings=True,
                           confirm=confirm)
        await flow.run()

    # -- ops events -> console events --------------------------------------------------------------------------

    def _translate(self, live: _Live, event: Event) -> None:
        from celeryops.ops import release as rel

        if live.detached and isinstance(event, DrainFinished) and event.outcome == "interrupted":
            return  # the runner did not restore: don't say it did
        if isinstance(event, rel.CheckEvent):
            self._to(live, CheckUpdate(event.id, event.title, _check_status(event.status), event.detail,
                                       event.remedy))
        elif isinstance(event, rel.StageEvent):
            phase = {"preflight": "preflight", "drain": "stopping", "deploy": "deploying",
                     "verify": "deploying"}.get(event.stage)
            if event.stage == "verify":
                self._to(live, Notice(level="info", message=f"verify: {event.detail}"))
            elif phase is not None:
                self._to(live, PhaseChanged(phase, event.detail))  # type: ignore[arg-type]
        elif isinstance(event, rel.DeployProgressEvent):
            self._deploy_progress(live, event.target, event.text)
        elif isinstance(event, rel.FleetBack):
            self._to(live, FleetBack(tuple(WorkerView(w, "consuming", tuple(q)) for w, q in
                                           sorted(event.workers.items()))))
        elif isinstance(event, rel.ReleaseFinished):
            self._release_finished(live, event)
        else:
            if isinstance(event, DrainStarted):
                self._queues.update(event.queues)
            elif isinstance(event, DrainProgress):
                live.progress = event
                if live.phase != "draining":
                    self._to(live, PhaseChanged("draining"))
            self._to(live, event)

    def _deploy_progress(self, live: _Live, target: str, text: str) -> None:
        old = live.targets.get(target) or DeployTarget(target)
        body = text.split(": ", 1)[1] if text.startswith(f"{target}: ") else text
        revision, state, conditions = old.revision, old.state, dict((c.name, c) for c in old.conditions)
        words = body.split()
        state_now: RolloutState = state
        if body.startswith("revision ") and len(words) > 1:
            revision = words[1]
            state_now = "ready" if body.endswith("is ready") else "creating"
        elif words and words[0] in ("Ready", "ConfigurationsReady", "RoutesReady") and len(words) > 1:
            cond_state = words[1].rstrip(":")
            message = body.split(": ", 1)[1] if ": " in body else ""
            conditions[words[0]] = Condition(words[0], cond_state, message)
            state_now = "failed" if cond_state == "failed" else "rolling" if state_now != "ready" else state_now
        elif state_now == "pending":
            state_now = "creating"
        live.targets[target] = DeployTarget(target, revision, state_now, tuple(conditions.values()), body)
        self._to(live, DeployUpdate(tuple(live.targets.values())))

    def _release_finished(self, live: _Live, event: Any) -> None:
        outcome, message = str(event.outcome), str(event.message)
        if outcome == "preflight_failed":
            report_failed = max(1, live.failed)
            self._to(live, Notice(level="error", message=message))
            self._to(live, PreflightDone(failed=report_failed, warnings=live.warnings))
            live.phase = "failed"
        elif outcome == "deployed":
            live.targets = {k: DeployTarget(t.target, t.revision, "ready", t.conditions, t.message)
                            for k, t in live.targets.items()}
            if live.targets:
                self._to(live, DeployUpdate(tuple(live.targets.values())))
            self._to(live, PhaseChanged("done", message))
        elif outcome == "deploy_failed":
            live.targets = {k: DeployTarget(t.target, t.revision, "failed", t.conditions, t.message)
                            for k, t in live.targets.items()} or {"deploy": DeployTarget("deploy", state="failed")}
            self._to(live, DeployUpdate(tuple(live.targets.values())))
            self._to(live, Notice(level="error", message=message))
            self._to(live, PhaseChanged("failed", message))
        else:
            self._to(live, Notice(level="warning" if outcome != "timeout" else "error", message=message))
            self._to(live, PhaseChanged("aborted", message))

    # -- decisions on a run ------------------------------------------------------------------------------------

    async def abort_run(self) -> None:
        runner = self._refuse("abort the run")
        live = self._live
        if live is not None and live.running and live.task is not None:
            live.aborting = True
            live.task.cancel()  # the runner restores what it stopped before the task ends
            with contextlib.suppress(asyncio.CancelledError):
                await live.task
            # A run interrupted outside the drain (e.g. while deploying) follows the recovery rules.
            leftover = [r for r in runner.journal.unfinished_runs(self.fleet_name) if r.id not in live.preexisting]
            if leftover:
                runner.on_event = lambda event: self._translate(live, event)
                decided, _ = await runner.abort(run=leftover[-1])
                self._to(live, Notice(level="info", message=decided.explanation))
            return
        run = runner.unfinished()
        if run is None:
            raise UserError("There is no run to abort: nothing was changed.", EXIT_USAGE)
        sink = live.sink if live is not None else None
        runner.on_event = sink if sink is not None else (lambda event: None)
        decided, _restored = await runner.abort(run=run)
        if sink is not None:
            sink(Notice(level="info" if decided.action != "ask" else "warning", message=decided.explanation))
            if decided.action != "ask" and decided.mark_as is not None:
                sink(PhaseChanged(console_phase(decided.mark_as), "consumers restored"
                                  if decided.action == "restore" else ""))

    async def detach(self) -> None:
        runner = self._refuse("detach from the run")
        live = self._live
        if live is None or not live.running or live.task is None:
            return
        live.detached = True
        runner.detached = True
        live.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await live.task

    async def resume_run(self, on_event: EventSink) -> None:
        runner = self._refuse("resume the run")
        live = self._begin("drain", None, on_event)
        live.phase = "draining"

        async def flow() -> None:
            self._wire(runner, live)
            outcome, run = await runner.resume()
            if outcome == "drained":
                self._to(live, PhaseChanged("done", f"run {run.id} drained: consumers stay stopped"))
            else:
                self._to(live, PhaseChanged("aborted", f"{outcome}: consumers restored"))

        live.task = self._spawn(self._guard(live, flow()))

    async def forget_worker(self, name: str) -> None:
        runner = self._refuse("forget a worker")
        await runner.forget(name)

    # -- watch mode --------------------------------------------------------------------------------------------

    async def follow_run(self, on_event: EventSink) -> None:
        if self.coord is None:
            on_event(Notice(level="warning", message="No Redis holds the published status (the broker is not Redis "
                                                     "and CELERYOPS_REDIS_URL is not set): only the fleet is shown."))
            return
        self._spawn(self._follow(on_event))

    async def _follow(self, on_event: EventSink) -> None:
        coord = self.coord
        assert coord is not None
        run_id: str | None = None
        last: str | None = None
        phase: str | None = None
        while True:
            try:
                status = await asyncio.to_thread(read_status, coord, self.fleet_name)
                if status is not None and status.run_id != run_id and status.phase not in TERMINAL_PHASES:
                    run_id, last, phase = status.run_id, None, None
                    on_event(RunFollowed(run_id=status.run_id, run_kind="deploy" if status.release else "drain",
                                         release=status.release, owner=f"{status.owner}@{status.host}"))
                if run_id is not None:
                    events = await asyncio.to_thread(read_events, coord, self.fleet_name, last)
                    for ev in events:
                        last = ev.id
                        if ev.run_id != run_id:
                            continue
                        for out in events_from_published(ev.kind, ev.data):
                            if isinstance(out, DrainStarted):
                                self._queues.update(out.queues)
                            if isinstance(out, PhaseChanged):
                                if out.phase == phase:
                                    continue
                                phase = out.phase
                            on_event(out)
            except redis.RedisError as exc:
                on_event(Notice(level="warning", message=mask_text(f"reading the published status failed ({exc}); "
                                                                   "retrying")))
            await asyncio.sleep(self.follow_interval)


def _check_status(status: str) -> Literal["pending", "running", "ok", "warn", "fail"]:
    return status if status in ("pending", "running", "ok", "warn", "fail") else "warn"  # type: ignore[return-value]


# -- the published status -> console events (watch mode) -----------------------------------------------------------


def progress_from_json(data: dict[str, Any]) -> DrainProgress | None:
    """A DrainProgress from its published JSON (``DrainProgress.to_json``), or None if it is not one."""
    if "streak" not in data or "workers" not in data:
        return None
    workers = {name: WorkerObs(name=name, replied=bool(w.get("replied")), active=int(w.get("active", 0)),
                               reserved=int(w.get("reserved", 0)), scheduled=int(w.get("scheduled", 0)),
                               queues=tuple(w.get("queues", ())), state=w.get("state", "unknown"),
                               plugin=bool(w.get("plugin")))
               for name, w in (data.get("workers") or {}).items()}
    tasks = tuple(TaskInfo(worker=str(t.get("worker", "")), id=str(t.get("id", "")), name=str(t.get("name", "")),
                           state=t.get("state", "active"), args=str(t.get("args", "")), runtime=t.get("runtime"),
                           eta=t.get("eta"))
                  for t in data.get("tasks") or ())
    return DrainProgress(elapsed=float(data.get("elapsed", 0.0)), remaining=float(data.get("remaining", 0.0)),
                         streak=int(data.get("streak", 0)), required=int(data.get("required", 0)),
                         active=int(data.get("active", 0)), reserved=int(data.get("reserved", 0)),
                         scheduled=int(data.get("scheduled", 0)), unknown=tuple(data.get("unknown") or ()),
                         workers=workers, tasks=tasks, warnings=tuple(data.get("warnings") or ()),
                         joined=tuple(data.get("joined") or ()), left=tuple(data.get("left") or ()))


def events_from_published(kind: str, data: dict[str, Any]) -> list[Event]:
    """The console events one published stream entry stands for (unknown kinds become info notices)."""
    if kind == "phase":
        phase = str(data.get("phase", ""))
        reason = str(data.get("reason", "") or "")
        return [PhaseChanged(console_phase(phase), reason or (phase if phase in PHASE_MAP else ""))]
    if kind == "progress":
        progress = progress_from_json(data)
        return [progress] if progress is not None else []
    if kind == "started":
        return [DrainStarted(queues=tuple(data.get("queues") or ()),
                             workers={w: tuple(q) for w, q in (data.get("workers") or {}).items()},
                             interval=float(data.get("interval", 0.0)), streak=int(data.get("streak", 0)),
                             max_wait=float(data.get("max_wait", 0.0)), forgotten=tuple(data.get("forgotten") or ()))]
    if kind == "cancelled":
        return [ConsumersCancelled(queues=tuple(data.get("queues") or ()),
                                   acknowledged=tuple(data.get("acknowledged") or ()))]
    if kind == "restored":
        return [ConsumersRestored(restored={w: tuple(q) for w, q in (data.get("restored") or {}).items()},
                                  verified=bool(data.get("verified")),
                                  missing={w: tuple(q) for w, q in (data.get("missing") or {}).items()})]
    if kind == "finished":
        outcome = str(data.get("event", "error"))
        if outcome not in ("drained", "timeout", "interrupted", "error"):
            outcome = "error"
        return [DrainFinished(outcome=outcome, elapsed=float(data.get("elapsed", 0.0)),  # type: ignore[arg-type]
                              message=str(data.get("message", "")))]
    if kind == "notice":
        level = str(data.get("level", "info"))
        return [Notice(level=level if level in ("info", "warning", "error") else "info",  # type: ignore[arg-type]
                       message=str(data.get("message", "")))]
    return [Notice(level="info", message=f"{kind}: {data}")]


def summary_from_status(status: PublishedStatus, progress: DrainProgress | None) -> RunSummary:
    return RunSummary(run_id=status.run_id, kind="deploy" if status.release else "drain",
                      phase=console_phase(status.phase), release=status.release,
                      owner=f"{status.owner}@{status.host}", started_at=status.started_at,
                      streak=progress.streak if progress else 0, required=progress.required if progress else 0,
                      remaining=progress.remaining if progress else None)


# -- building one -----------------------------------------------------------------------------------------------


def _named_redis(url: str, name: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=5, decode_responses=True,
                                client_name=name)


def open_backend(app: Celery, config: Config, *, read_only: bool, fleet_display: str,
                 state_dir: str | None = None, drain: DrainRequest | None = None,
                 targets: tuple[Target, ...] | None = None, repo: Path | None = None,
                 coord_url: str | None = None, slots_url: str | None = None,
                 follow_interval: float = 1.0, env: dict[str, str] | None = None) -> OpsBackend:
    """The backend for the fleet of ``app``: journal first (a bad state dir stops us before the fleet is touched);
    read-only opens the journal read-only (if it exists) and names every Redis connection ``celeryops-watch``."""
    import os

    environ = env if env is not None else dict(os.environ)
    name = WATCH_CLIENT_NAME if read_only else CONSOLE_CLIENT_NAME
    if read_only:
        options = dict(app.conf.broker_transport_options or {})
        options.setdefault("client_name", name)
        app.conf.broker_transport_options = options
        path = journal_path(state_dir)
        journal: Journal | None = Journal(path, read_only=True) if path.exists() else None
    else:
        journal = Journal(state_dir=state_dir)
    fleet = Fleet(app)
    coord_url = coord_url or environ.get("CELERYOPS_REDIS_URL") or (
        fleet.broker_url if fleet.broker_url.startswith(REDIS_SCHEMES) else None)
    slots_url = slots_url or environ.get("CELERYOPS_SLOTS_REDIS_URL") or (
        fleet.broker_url if fleet.broker_url.startswith(REDIS_SCHEMES) else None)
    coord = _named_redis(coord_url, name) if coord_url else None
    slots_client = coord if slots_url == coord_url else (_named_redis(slots_url, name) if slots_url else None)
    fleet_id = default_fleet_name(environ.get("CELERYOPS_FLEET"))
    if coord is not None:
        def plugin_members(client: redis.Redis = coord) -> Any:
            from celeryops.fence import plugin_workers

            async def members() -> set[str]:
                return set(await asyncio.to_thread(plugin_workers, client, fleet_id))
            return members()

        fleet.extra_members.append(plugin_members)
    runner: Runner | None = None
    if journal is not None:
        runner = Runner(fleet=fleet, journal=journal, fleet_name=fleet_id, read_only=read_only,
                                coord=coord)
    return OpsBackend(fleet, config=config, runner=runner, journal=journal, coord=coord, slots_client=slots_client,
                      fleet_name=fleet_id, read_only=read_only, fleet_display=fleet_display, drain=drain,
                      targets=targets, repo=repo, follow_interval=follow_interval)
