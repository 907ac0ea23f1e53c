"""One run of celeryops on one fleet, from preflight to done or aborted: :class:`RunSession`.

The console, the headless commands (``drain``, ``deploy``, ``resume``, ``abort``) and the demo all drive this same
session. It runs the same preflight for the same kind of run wherever it is started, asks its
:class:`~celeryops.ops.run.operator.Operator` for every decision (go ahead after preflight, deploy after the drain),
and emits the typed events of :mod:`celeryops.core.events` through the runner (to the printer or the console, and
to the published status). Every side effect is written ahead in the journal by the runner and the rollouts; every
interruption (task cancellation) follows the recovery rules before the session's coroutine ends:

- preflight / waiting for the operator: nothing was touched;
- stopping or draining: the runner restores the consumers it stopped;
- drained, deploying, deployed: the recovery rules decide with the rollout's real outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis

from celeryops.adapters.gitrepo import GitRepo
from celeryops.core.config import Config, DrainSettings, Target
from celeryops.core.errors import (
    EXIT_BROKER,
    EXIT_DEPLOY,
    EXIT_OK,
    EXIT_PREFLIGHT,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    ReadOnlyRefused,
    UserError,
)
from celeryops.core.events import (
    CheckUpdate,
    Event,
    FleetBack,
    PhaseChanged,
    PreflightDone,
    RunFinished,
    RunOutcome,
    StageStarted,
    TargetDeployed,
)
from celeryops.ops.access.probe import Need, operator_needs, require
from celeryops.ops.journal import Run
from celeryops.ops.preflight import (
    Check,
    PreflightEvent,
    PreflightReport,
    is_accepted,
    run_checks,
    unaccepted_warnings,
)
from celeryops.ops.preflight.checks import (
    cloudrun_checks,
    freshness_check,
    image_check,
    permissions_check,
    release_branch_check,
)
from celeryops.ops.preflight.fleet import UNREACHABLE, fleet_checks
from celeryops.ops.run.operator import Operator
from celeryops.ops.run.recovery import RecoveryPlan, Rollout
from celeryops.ops.run.rollout import DeployFailure, Rollouts
from celeryops.ops.run.runner import Outcome, Runner, uncut

T = TypeVar("T")


@dataclass(frozen=True)
class DrainRequest:
    """What a drain-only run should do (the ``celeryops drain`` flags); ``settings`` None: the config's."""

    queues: tuple[str, ...] = ()
    settings: DrainSettings | None = None
    forget: tuple[str, ...] = ()
    take_over: bool = False


@dataclass
class RunSession:
    """The one orchestrator of a run. ``accepted``: warnings the config accepts up front (``[preflight] accept``)."""

    runner: Runner
    config: Config
    operator: Operator
    repo: Path = field(default_factory=Path.cwd)
    accepted: frozenset[str] = frozenset()  # check ids whose warnings are accepted up front (flags, config)
    accept_all: bool = False  # --accept-warnings
    rollouts: Rollouts | None = None

    def __post_init__(self) -> None:
        if self.rollouts is None:
            self.rollouts = Rollouts(self.runner, self.config)

    @property
    def _rollouts(self) -> Rollouts:
        assert self.rollouts is not None
        return self.rollouts

    def emit(self, event: Event) -> None:
        self.runner.emit(event)

    def detach(self) -> None:
        """The operator detaches from the run (the console): an interruption from now on leaves its consumers stopped
        and the run open for ``celeryops resume``."""
        self.runner.detached = True

    def _refuse_if_read_only(self, action: str) -> None:
        if self.runner.read_only:
            raise ReadOnlyRefused(action)

    async def _require_operator(self, action: str) -> None:
        """Refuse ``action`` in one sentence, before anything changes, when the connected Redis user lacks a
        permission of the operator role (a watcher's user: a drain stops nothing)."""
        r = self.runner
        opts = r.fleet.app.conf.broker_transport_options or {}
        fleet_needs = operator_needs(r.fleet_name, keyprefix=str(opts.get("global_keyprefix", "")),
                                     control=str(r.fleet.app.conf.control_exchange))
        clients: list[tuple[redis.Redis, list[Need]]] = []
        if r.coord is not None:
            clients.append((r.coord, fleet_needs[:2]))
        broker = r.fleet.redis()
        if broker is not None:
            clients.append((broker, fleet_needs[2:]))
        await require(action, clients)

    # -- preflight -------------------------------------------------------------------------------------------------

    def _fleet_checks(self, take_over: bool = False) -> list[Check]:
        r = self.runner
        return fleet_checks(r.fleet, r.journal, r.coord, r.fleet_name, take_over=take_over)

    def _release_checks(self, release: str, sha: str, targets: tuple[Target, ...]) -> list[Check]:
        git = GitRepo(self.repo)
        rel = self.config.release
        images = [t.image_for(sha, release, release) for t in targets if t.image]
        checks = [release_branch_check(git, rel.remote, release),
                  freshness_check(git, rel.remote, release, rel.max_age_days, sha=sha or None),
                  permissions_check([(t.name, _missing(self._rollouts, t)) for t in targets]),
                  *cloudrun_checks(targets, self._rollouts.deployer, lambda t: t.image_for(sha, release, release))]
        if images:
            checks.insert(1, image_check(images))
        return checks

    async def _preflight(self, checks: list[Check]) -> PreflightReport:
        self.emit(PhaseChanged("preflight", "checking before anything changes"))

        def on_check(event: PreflightEvent) -> None:
            result = getattr(event, "result", None)
            if result is None:
                self.emit(CheckUpdate(event.id, event.title, "running"))  # type: ignore[union-attr]
            else:
                self.emit(CheckUpdate(result.id, result.title, result.status, result.detail, result.remedy,
                                      accepted=is_accepted(result, self.accept_all, self.accepted)))

        return await run_checks(checks, on_check)

    async def _review(self, report: PreflightReport, *, unreachable_exit: int) -> RunFinished | None:
        """None: the operator said go. Else the run ends here, having touched nothing."""
        accepted = frozenset(w.id for w in report.warnings if is_accepted(w, self.accept_all, self.accepted))
        self.emit(PreflightDone(failed=len(report.failed), warnings=len(report.warnings),
                                accepted=tuple(sorted(accepted))))
        if report.failed:
            failed_ids = {r.id for r in report.failed}
            code = unreachable_exit if failed_ids & UNREACHABLE else EXIT_PREFLIGHT
            return self._finish("preflight_failed", code, _failure_sentence(report))
        self.emit(PhaseChanged("ready", "waiting for the operator"))
        review = await self.operator.review(report, accepted)
        unaccepted = unaccepted_warnings(report, review.accept_all, accepted | review.accepted)
        if unaccepted:
            flags = " ".join(f"--accept-warning {w.id}" for w in unaccepted)
            return self._finish("preflight_failed", EXIT_PREFLIGHT,
                                f"Preflight has warnings ({', '.join(w.title for w in unaccepted)}): nothing was "
                                f"stopped or deployed; read them, then run again with {flags} (or --accept-warnings) "
                                "to go ahead anyway.")
        if not review.proceed:
            return self._finish("declined", EXIT_OK, "Declined before stopping consumers: nothing was changed.")
        return None

    def _finish(self, outcome: RunOutcome, code: int, message: str, **extra: Any) -> RunFinished:
        event = RunFinished(outcome=outcome, exit_code=code, message=message, **extra)
        if outcome in ("preflight_failed", "declined"):
            self.emit(PhaseChanged("failed" if outcome == "preflight_failed" else "aborted", message))
        self.emit(event)
        return event

    # -- drain-only runs -------------------------------------------------------------------------------------------

    async def drain(self, request: DrainRequest = DrainRequest()) -> int:
        """Preflight, the operator's go, then stop the consumers and wait until drained. Returns the exit code:
        0 drained (the consumers stay stopped), 3 timed out (restored), 4/5 preflight."""
        self._refuse_if_read_only("stop consumers")
        await self._require_operator("stop consumers")
        settings = request.settings or self.config.drain
        settings.validate()
        report = await self._preflight(self._fleet_checks(request.take_over))
        ended = await self._review(report, unreachable_exit=EXIT_BROKER)
        if ended is not None:
            return ended.exit_code
        outcome, _run = await self.runner.drain(queues=request.queues, settings=settings, forget=request.forget,
                                                take_over=request.take_over)
        return EXIT_OK if outcome == "drained" else EXIT_TIMEOUT

    # -- deploy runs -----------------------------------------------------------------------------------------------

    async def deploy(self, release: str, targets: tuple[Target, ...]) -> RunFinished:
        """Preflight (the fleet's checks and the release's), the operator's go, drain, the operator's go, deploy,
        verify. Interrupted after the drain: the recovery rules, with the rollout's real outcome."""
        self._refuse_if_read_only("deploy")
        await self._require_operator("deploy")
        if not targets:
            raise UserError("No deploy target is configured: nothing was changed; add a [[targets]] table to "
                            "celeryops.toml (see the README).", EXIT_USAGE)
        if any(t.strategy == "overlap" for t in targets):  # a worker pool's new revision beside the old one
            from celeryops.ops.run.overlap import OverlapDeploy

            return await OverlapDeploy(self).deploy(release, targets)
        self.emit(StageStarted(stage="preflight", detail=f"release {release}"))
        sha = await GitRepo(self.repo).ls_remote(self.config.release.remote, release) or ""
        report = await self._preflight([*self._release_checks(release, sha, targets), *self._fleet_checks()])
        ended = await self._review(report, unreachable_exit=EXIT_PREFLIGHT)
        if ended is not None:
            return ended
        self.emit(StageStarted(stage="drain"))
        async with self._recovering(lambda current: current.release == release):
            outcome, run = await self.runner.drain(settings=self.config.drain, release=release, keep_lease=True,
                                                   extra_settings={"sha": sha, "targets": [t.name for t in targets]})
            return await self._after_drain(outcome, run, targets, sha, ask=True)

    @contextlib.asynccontextmanager
    async def _recovering(self, ours: Callable[[Run], bool]) -> AsyncIterator[None]:
        """Around a deploy run's drain and what follows it. Interrupted inside (also inside ``runner.drain()`` right
        after its ``drained`` record), the fleet's open run, if ``ours``, has its consumers stopped: the recovery rules
        are applied before the process ends (unless the operator detached). Always: the lease is given back and the
        rollouts closed."""
        try:
            yield
        except asyncio.CancelledError:
            current = await asyncio.to_thread(self.runner.unfinished)
            if current is not None and ours(current) and not self.runner.detached:
                with contextlib.suppress(Exception):  # the interruption is what the caller must see
                    await uncut(self._recover(current))
            raise
        finally:
            await self.runner.release_lease()
            await self._rollouts.close()

    async def _after_drain(self, outcome: Outcome, run: Run, targets: tuple[Target, ...], sha: str,
                           *, ask: bool) -> RunFinished:
        release = run.release or ""
        if outcome != "drained":
            return self._finish("timeout", EXIT_TIMEOUT, "The drain timed out: nothing was killed or deployed, the "
                                                         "consumers were restored.")
        if ask and not await self.operator.confirm_deploy(release, tuple(t.name for t in targets)):
            plan, _ = await self.runner.abort(run=run)
            return self._finish("declined", EXIT_OK, "Declined before deploying: " + plan.explanation)
        return await self._deploy(run, targets, sha)

    async def _deploy(self, run: Run, targets: tuple[Target, ...], sha: str) -> RunFinished:
        release = run.release or ""
        await self.runner.advance(run.id, "deploying")
        self.emit(StageStarted(stage="deploy", detail=", ".join(t.name for t in targets)))
        await self.runner.exempt_from_fence([sha, sha[:7], release])
        result = await self._rollouts.deploy(run.id, targets, sha, release)
        if isinstance(result, DeployFailure):
            return await self._deploy_failed(run.id, result)
        await self.runner.advance(run.id, "deployed")
        deployed = tuple(TargetDeployed(**r.summary()) for r in result)
        for event in deployed:
            self.emit(event)
        return await self._verify(run, f"Release {release} deployed", deployed)

    async def _verify(self, run: Run, what: str, deployed: tuple[TargetDeployed, ...] = (),
                      outcome: RunOutcome = "deployed") -> RunFinished:
        self.emit(StageStarted(stage="verify", detail="waiting for the fleet to answer"))
        workers = await self._rollouts.fleet_back()
        self.emit(FleetBack(workers=workers))
        await self.runner.advance(run.id, "done")
        await self.runner.lift_fence(run.id)
        return self._finish(outcome, EXIT_OK, f"{what}: {len(workers)} worker(s) consume again.", targets=deployed)

    async def _deploy_failed(self, run_id: str, failure: DeployFailure) -> RunFinished:
        run = await self.runner.journal.aio.get(run_id)
        plan, _restored = await self.runner.abort(run=run, rollout=failure.rollout)
        state = "consumers restored on the old workers" if plan.action == "restore" else plan.explanation
        return self._finish("deploy_failed", EXIT_DEPLOY, f"Deploy to {failure.target.name} failed: {failure.message} "
                                                          f"— {state}.", logs_url=failure.logs_url)

    async def _recover(self, run: Run) -> RecoveryPlan:
        """The recovery rules for an interrupted deploy run, with the rollout's real outcome."""
        plan, _ = await self.runner.abort(run=run, rollout=await self._rollouts.outcome(run))
        return plan

    # -- recovery: resume and abort --------------------------------------------------------------------------------

    async def resume(self, run: Run | None = None) -> int:
        """Continue the fleet's interrupted run from its phase; returns the exit code. A drain-only run drains
        again; a deploy run drains then deploys, or (deploying/deployed) follows the rollout's outcome."""
        self._refuse_if_read_only("resume the run")
        await self._require_operator("resume the run")
        run = run or self.runner.unfinished()
        if run is None:
            raise self.runner.no_open_run("nothing was resumed",
                                          "; start one with `celeryops drain` or `celeryops deploy`")
        if not run.release:
            outcome, _ = await self.runner.resume(run=run)
            return EXIT_OK if outcome == "drained" else EXIT_TIMEOUT
        if run.kind == "rollback":  # routed back to existing revisions: its own flow (ops/run/rollback.py)
            from celeryops.ops.run.rollback import Rollback

            return (await Rollback(self).resume(run)).exit_code
        if run.strategy == "overlap":
            from celeryops.ops.run.overlap import OverlapDeploy

            return (await OverlapDeploy(self).resume(run)).exit_code
        return (await self._resume_release(run)).exit_code

    async def _resume_release(self, run: Run) -> RunFinished:
        names = list(run.settings.get("targets") or [t.name for t in self.config.targets])
        targets = tuple(self.config.target(name) for name in names)
        sha = str(run.settings.get("sha") or "")
        if run.phase in ("preflight", "stopping", "draining", "drained"):
            self.emit(StageStarted(stage="drain", detail=f"resuming run {run.id}"))
            run_id = run.id
            async with self._recovering(lambda current: current.id == run_id):
                outcome, run = await self.runner.resume(run=run, keep_lease=True)
                return await self._after_drain(outcome, run, targets, sha, ask=False)
        # deploying / deployed: the deploy was started; its outcome decides.
        await self.runner.hold(run)
        try:
            rollout = await self._rollouts.outcome(run)
            plan = self.runner.recovery_plan(run, rollout)
            if plan.action == "leave":
                if run.phase == "deploying":
                    await self.runner.advance(run.id, "deployed", reason="resume: rollout ready")
                return await self._verify(run, f"Release {run.release} is deployed (the new revision is ready)")
        finally:
            await self.runner.release_lease()
            await self._rollouts.close()
        return await self._recovered(run, rollout)

    async def _recovered(self, run: Run, rollout: Rollout) -> RunFinished:
        decided, _restored = await self.runner.abort(run=run, rollout=rollout)
        if decided.action == "ask":
            return self._finish("deploy_failed", EXIT_DEPLOY, decided.explanation)
        return self._finish("deploy_failed", EXIT_DEPLOY, "The deploy did not take effect: " + decided.explanation)

    async def abort(self, run: Run | None = None, *, force_restore: bool = False) -> RecoveryPlan:
        """Apply the recovery rules to the fleet's unfinished run (restore what it stopped, mark it aborted)."""
        self._refuse_if_read_only("abort the run")
        await self._require_operator("abort the run")
        run = run or await asyncio.to_thread(self.runner.unfinished)
        if run is not None and run.strategy == "overlap" and not run.finished:
            from celeryops.ops.run.overlap import OverlapDeploy

            return await OverlapDeploy(self).abort(run)
        decided, _ = await self.runner.abort(run=run, force_restore=force_restore)
        return decided

    async def forget(self, name: str) -> None:
        self._refuse_if_read_only("forget a worker")
        await self.runner.forget(name)


def _failure_sentence(report: PreflightReport) -> str:
    """One sentence for a failed preflight: the broker's own when it cannot be reached (every other check failed
    for that reason too), the check's finding and remedy when one failed, else the failed checks' titles."""
    broker = report.get("broker")
    if broker is not None and broker.status == "fail":
        return broker.detail
    if len(report.failed) == 1:
        only = report.failed[0]
        detail = only.detail[:1].upper() + only.detail[1:]
        return f"{detail}: nothing was changed; {only.remedy or 'fix it and try again'}."
    names = ", ".join(r.title for r in report.failed)
    return (f"Preflight failed ({names}): nothing was stopped or deployed; fix what the checks say and try "
            "again.")


def _missing(rollouts: Rollouts, target: Target) -> Callable[[], Awaitable[list[str]]]:
    async def missing() -> list[str]:
        return await rollouts.deployer(target).missing_permissions(target)

    return missing
