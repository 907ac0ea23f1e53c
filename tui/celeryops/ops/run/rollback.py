"""``celeryops rollback`` (and the console's B): each target back to the revision its last deploy replaced, or the one
named, as safely as a deploy, in the same run context (:class:`~celeryops.ops.run.context.RunContext`).

1. **What to go back to** (:mod:`celeryops.ops.run.rollback_plan`): from the run journal or ``--to``; the revision
   must exist and be Ready. A bad request is one sentence, exit 2, nothing touched; a target that already serves it
   is left alone.
2. **Preflight**, the strategy's (:meth:`Strategy.checks`): the ``revision`` check (read again), ``permissions``, and
   ``drain``: ``validate`` (Cloud Run's validate_only of the exact update that routes back) and the fleet's checks;
   ``overlap``: the overlap deploy's ``traffic`` (the peak), ``validate`` (the scale-up), ``fence`` (required) and
   ``mixed_versions`` with the fleet's others. No branch, image or freshness check: nothing is built and no image
   is rolled out.
3. **A strategy brings the revisions to serve** (:class:`Strategy`, by name in :data:`STRATEGIES`). ``drain``: the
   deploy's drain (the same run journal, lease, fence, Ctrl-C and recovery), then each target routed to its revision
   with one update that makes no revision (written ahead as a ``deploy_start`` intent that names the ``split``),
   the fleet verified, the fence lifted. ``overlap`` (one worker pool): the overlap deploy's flow
   (:meth:`~celeryops.ops.run.strategies.overlap.OverlapFlow.move`) to the existing revision: it comes up beside
   the deployed one and consumes, only the deployed revision's workers stop and are drained, then every instance
   moves to it at the original count. Processing never pauses.
4. The split a rollback leaves pins named revisions; it is recorded on the resource as celeryops' own (annotation
   ``celeryops/split``), so the next deploy moves everything to its new revision without ``traffic = "latest"``.

An interrupted rollback recovers like a deploy of its strategy: ``drain``: :func:`celeryops.ops.run.recovery.plan`
with the route's real outcome (:meth:`~celeryops.ops.run.rollout.Rollouts.outcome` asks whether each target serves
its split); ``overlap``: the overlap deploy's rules (:mod:`celeryops.ops.run.overlap_rules`). ``celeryops resume``
continues it here (:meth:`Rollback.resume`); ``celeryops abort`` applies the same rules (the session dispatches an
overlap run, rollback or deploy, to its flow).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from celeryops.adapters.deploy import DeployError
from celeryops.adapters.deploy.base import (
    Deployer,
    DeployResult,
    Router,
    describe_split,
)
from celeryops.core.config import Config, Target
from celeryops.core.errors import EXIT_DEPLOY, EXIT_OK, EXIT_PREFLIGHT, EXIT_USAGE, UserError
from celeryops.core.events import Event, Notice, PhaseChanged, RunFinished, StageStarted, TargetRolledBack
from celeryops.ops.journal import DEPLOY_START, FleetStoreDown, Run
from celeryops.ops.preflight import Check, CheckResult, permissions_check, validate_check
from celeryops.ops.preflight.overlap import revisions_check
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.pool.checks import rollback_checks
from celeryops.ops.run.pool.rules import Destination
from celeryops.ops.run.pool.switch import move, resume_switch
from celeryops.ops.run.recovery import Rollout
from celeryops.ops.run.rollback_plan import (
    Recorded,
    RollbackRequest,
    RollbackStep,
    Split,
    changed_since,
    checked_step,
    chosen_targets,
    label_of,
    recorded_deploy,
    settings_of,
    steps_of,
    strategy_of,
)
from celeryops.ops.run.rollout import DeployFailure, Rollouts
from celeryops.ops.run.runner import Runner
from celeryops.ops.run.strategies.drain import DrainWords, drain_then, is_drain_phase, resume_drain_then

__all__ = ["STRATEGIES", "DrainStrategy", "OverlapStrategy", "Rollback", "RollbackRequest", "RollbackStep",
           "Strategy"]


class Strategy(Protocol):
    """How a rollback brings its revisions to serve. What it cannot do is refused before anything is read
    (:func:`~celeryops.ops.run.rollback_plan.chosen_targets`, :func:`~celeryops.ops.run.rollback_plan.checked_step`).
    ``checks``: the whole preflight; ``bring``: the whole run once the operator said go (the run journal's records,
    the lease, the recovery on interruption); ``resume``: continue a run of this strategy from its journal."""

    @property
    def name(self) -> str: ...

    def checks(self, rollback: Rollback, steps: tuple[RollbackStep, ...]) -> list[Check]: ...

    async def bring(self, rollback: Rollback, steps: tuple[RollbackStep, ...]) -> RunFinished: ...

    async def resume(self, rollback: Rollback, run: Run, steps: tuple[RollbackStep, ...]) -> RunFinished: ...


@dataclass(frozen=True)
class DrainStrategy:
    """The deploy's way: drain the fleet, route every target back, verify, lift the fence (the drain strategy's
    :func:`~celeryops.ops.run.strategies.drain.drain_then`, with routing as what follows the drain)."""

    name: str = "drain"

    def checks(self, rollback: Rollback, steps: tuple[RollbackStep, ...]) -> list[Check]:
        return [*rollback.checks(steps),
                validate_check([(s.target, cast(Deployer, _RouteValidation(rollback.router(s.target), s.split)), "")
                                for s in steps], title="Cloud Run accepts the rollback"),
                *rollback.ctx.fleet_checks()]

    async def bring(self, rollback: Rollback, steps: tuple[RollbackStep, ...]) -> RunFinished:
        label = label_of(steps)
        ctx = rollback.ctx
        return await drain_then(ctx, lambda run: self._route(rollback, run, steps), release=label,
                                ours=lambda current: current.kind == "rollback" and current.release == label,
                                confirm=lambda: ctx.operator.confirm_rollback("; ".join(s.line() for s in steps)),
                                settings=settings_of(steps, self.name), words=ROLLBACK_WORDS)

    async def resume(self, rollback: Rollback, run: Run, steps: tuple[RollbackStep, ...]) -> RunFinished:
        if is_drain_phase(run):
            return await resume_drain_then(rollback.ctx, run, lambda drained: self._route(rollback, drained, steps),
                                           ROLLBACK_WORDS)
        return await rollback.settle_started(run, steps)  # routing began: its outcome decides

    async def _route(self, rollback: Rollback, run: Run, steps: tuple[RollbackStep, ...]) -> RunFinished:
        await rollback.runner.advance(run.id, "deploying")
        rollback.emit(StageStarted(stage="rollback", detail="; ".join(s.line() for s in steps)))
        # The revisions' workers (Cloud Run starts them now) consume while the fence holds the others.
        await rollback.runner.exempt_from_fence([], revisions=sorted({rev for s in steps for rev, _ in s.split}))
        routed = await rollback.route_all(run.id, steps)
        if isinstance(routed, DeployFailure):
            return await rollback.failed(run.id, routed)
        await rollback.runner.advance(run.id, "deployed")
        return await rollback.verify(run, tuple(TargetRolledBack(**r.summary()) for r in routed))


ROLLBACK_WORDS = DrainWords(done="rolled back", doing="rolling back")


@dataclass(frozen=True)
class OverlapStrategy:
    """One worker pool back without a pause, by the overlap deploy's flow to an existing revision (no image, no
    build): the previous revision comes up beside the deployed one (twice the count at the peak) and consumes, only
    the deployed revision's workers stop taking tasks and are drained by the drain's rules, then every instance moves
    to the previous revision at the original count, recorded as celeryops' own split. Every pool update and stop is
    written ahead; ``abort`` / ``resume`` recover it as they recover an overlap deploy."""

    name: str = "overlap"

    def checks(self, rollback: Rollback, steps: tuple[RollbackStep, ...]) -> list[Check]:
        """``revision``, ``permissions``, then the overlap deploy's ``traffic``, ``validate`` (the scale-up to the
        existing revision), ``fence`` and ``mixed_versions`` in place of the fleet's own of those ids."""
        (step,) = steps  # one worker pool (chosen_targets)
        return rollback_checks(rollback.ctx, step.target, Destination(step.revision, step.image or None),
                               rollback.checks(steps))

    async def bring(self, rollback: Rollback, steps: tuple[RollbackStep, ...]) -> RunFinished:
        (step,) = steps
        return await move(rollback.ctx, step.target, Destination(step.revision, image=None), strategy=self.name,
                          release=label_of(steps), settings=settings_of(steps, self.name))

    async def resume(self, rollback: Rollback, run: Run, steps: tuple[RollbackStep, ...]) -> RunFinished:
        return await resume_switch(rollback.ctx, run)


#: The strategies a rollback can use, by name (``--strategy``, a target's ``strategy``; the flag wins).
STRATEGIES: dict[str, Strategy] = {"drain": DrainStrategy(), "overlap": OverlapStrategy()}


@dataclass(frozen=True)
class _RouteValidation:
    """The validate check's view of a router: validating "the update" means validating the route to ``split``."""

    router: Router
    split: Split

    async def validate(self, target: Target, _image: str) -> None:
        await self.router.validate_route(target, self.split)


@dataclass
class Rollback:
    """A rollback on ``session``: :meth:`run` from the request to the end, :meth:`resume` for an interrupted one."""

    ctx: RunContext

    @property
    def runner(self) -> Runner:
        return self.ctx.runner

    @property
    def config(self) -> Config:
        return self.ctx.config

    @property
    def rollouts(self) -> Rollouts:
        return self.ctx.rollouts

    def emit(self, event: Event) -> None:
        self.ctx.emit(event)

    def router(self, target: Target) -> Router:
        return cast(Router, self.rollouts.deployer(target))

    # -- the whole rollback --------------------------------------------------------------------------------------

    async def run(self, request: RollbackRequest) -> RunFinished:
        """What to go back to, preflight, the operator's go, then the strategy. Returns the run's end."""
        self.ctx.refuse_if_read_only("roll back")
        await self.ctx.require_operator("roll back")
        going = False
        try:
            steps = await self.plan(request)
            self.emit(StageStarted(stage="preflight", detail="roll back " + "; ".join(s.line() for s in steps)))
            left = [s for s in steps if s.serving and dict(s.serving) == dict(s.split)]
            for step in left:
                self.emit(Notice(level="info", message=f"{step.target.name} already serves "
                                                       f"{describe_split(step.split)}: it is left as it is."))
            steps = tuple(s for s in steps if s not in left)
            if not steps:
                message = "Nothing to roll back: every target already serves the revision it would go back to."
                self.emit(PhaseChanged("done", message))
                return self.ctx.finish("rolled_back", EXIT_OK, message + " Nothing was changed.")
            report = await self.ctx.preflight(STRATEGIES[steps[0].strategy].checks(self, steps))
            ended = await self.ctx.review(report, unreachable_exit=EXIT_PREFLIGHT)
            if ended is not None:
                return ended
            going = True
        finally:
            if not going:  # nothing was started: the strategy's run closes them otherwise
                await self.rollouts.close()
        return await STRATEGIES[steps[0].strategy].bring(self, steps)

    async def plan(self, request: RollbackRequest) -> tuple[RollbackStep, ...]:
        """Each target's step (bad input: UserError, exit 2; Cloud Run unreadable: its sentence, exit 5)."""
        journal = self.runner.journal
        targets = await asyncio.to_thread(chosen_targets, self.config, request, journal)  # one strategy
        wanted: list[tuple[Target, Split, str, Recorded | None]] = []
        for target in targets:
            if request.to:
                wanted.append((target, ((request.to, 100),), "named with --to", None))
            else:
                record = await asyncio.to_thread(recorded_deploy, self.config, journal, target, request.run_id)
                wanted.append((target, record.replaced, record.source, record))

        async def step(target: Target, split: Split, source: str, recorded: Recorded | None) -> RollbackStep:
            router = self.router(target)
            try:
                now, revisions = await asyncio.gather(router.current(target), router.revisions(target))
            except DeployError as err:
                raise UserError(str(err), EXIT_PREFLIGHT) from None
            if recorded is not None:  # what serves now must be what the recorded deploy left: no two steps back
                changed_since(target, recorded, now, revisions)
            return checked_step(target, split, source, now, revisions, strategy_of(request, target))

        steps = await asyncio.gather(*(step(*w) for w in wanted), return_exceptions=True)  # every read ends here
        for found in steps:
            if isinstance(found, BaseException):
                raise found
        return tuple(cast(list[RollbackStep], steps))

    def checks(self, steps: Sequence[RollbackStep]) -> list[Check]:
        """The checks every rollback runs first (its strategy adds the rest): revision, permissions."""
        return [self._revision_check(steps),
                permissions_check([(s.target.name, self._missing(s.target)) for s in steps]),
                revisions_check([(s.target.name, self._unreadable(s.target)) for s in steps])]

    def _unreadable(self, target: Target) -> Callable[[], Awaitable[list[str]]]:
        return lambda: self.router(target).missing_revision_permissions(target)

    def _missing(self, target: Target) -> Callable[[], Awaitable[list[str]]]:
        return lambda: self.router(target).missing_permissions(target)

    def _revision_check(self, steps: Sequence[RollbackStep]) -> Check:
        async def run() -> CheckResult:
            found: list[str] = []
            for step in steps:
                now = await self.router(step.target).current(step.target)
                checked_step(step.target, step.split, step.source, now,
                             await self.router(step.target).revisions(step.target), step.strategy)
                image = f" ({step.image})" if step.image else ""
                found.append(f"{step.target.name}: {describe_split(step.split)}{image}, {step.source}, is ready; "
                             f"{describe_split(now.served_split)} serves now")
            return CheckResult("revision", "Revision to return to", "ok", "; ".join(found))

        return Check("revision", "Revision to return to", run)

    # -- routing, written ahead ---------------------------------------------------------------------------------

    async def route_all(self, run_id: str, steps: Sequence[RollbackStep]) -> list[DeployResult] | DeployFailure:
        """Route every target in turn (each start written ahead, naming the split); the first failure stops."""
        journal = self.runner.journal.aio
        results: list[DeployResult] = []
        for step in steps:
            target, router = step.target, self.router(step.target)
            try:
                before = await router.current(target)
            except DeployError as err:
                return DeployFailure(target, str(err), started=False, logs_url=err.logs_url)
            try:
                intent = await journal.intend(run_id, DEPLOY_START, {
                    "target": target.name, "image": step.image, "previous": before.to_dict(),
                    "revision": step.revision, "split": [list(e) for e in step.split]})
            except FleetStoreDown as err:  # not recorded where a teammate could recover it: not started
                return DeployFailure(target, str(err), started=False)
            try:
                result = await router.route(target, step.split, self.emit, by=f"rollback run {run_id}")
            except DeployError as err:
                await journal.settle(intent, {"ok": False, "error": str(err)})
                rollout: Rollout = "unknown"
                with contextlib.suppress(Exception):
                    rollout = await router.route_outcome(target, step.split)
                return DeployFailure(target, str(err), started=True, rollout=rollout, logs_url=err.logs_url)
            await journal.settle(intent, {"ok": True, "revision": step.revision})
            results.append(result)
        return results

    async def verify(self, run: Run, rolled: tuple[TargetRolledBack, ...]) -> RunFinished:
        """The targets serve their revisions: one line each, then the fleet verified and the run done."""
        for event in rolled:
            self.emit(event)
        serves = "; ".join(f"{t.target} serves revision {t.revision}" for t in rolled)
        return await self.ctx.verify(run, f"Rolled back ({serves})", rolled, outcome="rolled_back")

    async def failed(self, run_id: str, failure: DeployFailure) -> RunFinished:
        run = await self.runner.journal.aio.get(run_id)
        decided, _ = await self.runner.abort(run=run, rollout=failure.rollout)
        state = "consumers restored on the workers that served before" if decided.action == "restore" else \
            decided.explanation
        return self.ctx.finish("rollback_failed", EXIT_DEPLOY, f"Rollback of {failure.target.name} failed: "
                                    f"{failure.message} — {state}.", logs_url=failure.logs_url)

    async def settle_started(self, run: Run, steps: tuple[RollbackStep, ...]) -> RunFinished:
        """A run interrupted once routing began (deploying / deployed): finish it if every target serves its split,
        else the recovery rules."""
        await self.runner.hold(run)
        try:
            rollout = await self.rollouts.outcome(run)
            if self.runner.recovery_plan(run, rollout).action == "leave":
                if run.phase == "deploying":
                    await self.runner.advance(run.id, "deployed", reason="resume: the rollback took effect")
                return await self.verify(run, tuple(
                    TargetRolledBack(target=s.target.name, revision=s.revision, image=s.image,
                                     previous_revision=s.was, console_url=s.target.console_url) for s in steps))
        finally:
            await self.runner.release_lease()
            await self.rollouts.close()
        decided, _ = await self.runner.abort(run=run, rollout=rollout)
        what = decided.explanation if decided.action == "ask" else "The rollback did not take effect: " + \
            decided.explanation
        return self.ctx.finish("rollback_failed", EXIT_DEPLOY, what)

    # -- resume -------------------------------------------------------------------------------------------------

    async def resume(self, run: Run) -> RunFinished:
        """Continue an interrupted rollback run from its phase, with the strategy it was started with."""
        steps = steps_of(self.config, run.settings)
        strategy = STRATEGIES.get(str(run.settings.get("strategy") or "drain"))
        if strategy is None or not steps:
            raise UserError(f"Run {run.id} is a rollback this version cannot continue: nothing was changed; run "
                            "`celeryops abort` to apply the recovery rules.", EXIT_USAGE)
        return await strategy.resume(self, run, steps)
