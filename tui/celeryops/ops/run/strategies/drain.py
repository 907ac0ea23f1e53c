"""``strategy = "drain"``: stop every consumer of the fleet, wait until no task runs, then act (deploy the release,
or route the targets back to the revisions they ran before), verify, lift the fence. Processing pauses for the
drain; nothing is killed.

:func:`drain_then` is the one drain-then-act path: the deploy's and the rollback's runs both go through it, and
:func:`resume_drain_then` continues either. An interrupted run follows the recovery rules of
:mod:`celeryops.ops.run.recovery`, with the rollout's (or the route's) real outcome.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celeryops.core.config import Config, Target
from celeryops.core.errors import EXIT_DEPLOY, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, UserError
from celeryops.core.events import RunFinished, RunKind, StageStarted, TargetDeployed, TargetRolledBack
from celeryops.ops.journal import Run
from celeryops.ops.preflight import Check
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.decisions import DecisionAction
from celeryops.ops.run.recovery import RecoveryPlan, Rollout, plan
from celeryops.ops.run.rollback_plan import RollbackStep, label_of, settings_of, steps_of
from celeryops.ops.run.rollout import DeployFailure
from celeryops.ops.run.routing import route_all, route_check, route_failed, routed, settle_started
from celeryops.ops.run.strategies.base import Choice, Said

#: What the drain's run does once drained: given the drained run, it returns the run's end.
Act = Callable[[Run], Awaitable[RunFinished]]


@dataclass(frozen=True)
class DrainWords:
    """How the run's end is told: what is done after the drain (``done``, ``doing``)."""

    done: str = "deployed"
    doing: str = "deploying"


DEPLOY = DrainWords()
ROLLBACK = DrainWords(done="rolled back", doing="rolling back")


async def recover(ctx: RunContext, run: Run) -> RecoveryPlan:
    """The recovery rules for an interrupted drain-strategy run, with the rollout's real outcome."""
    decided, _ = await ctx.runner.abort(run=run, rollout=await ctx.rollouts.outcome(run))
    return decided


async def drain_then(ctx: RunContext, act: Act, *, release: str, ours: Callable[[Run], bool],
                     confirm: Callable[[], Awaitable[bool]], settings: dict[str, Any],
                     words: DrainWords = DEPLOY) -> RunFinished:
    """Drain the fleet (the run named ``release``, its ``settings`` journaled), ask ``confirm``, then ``act``.
    Interrupted: the fleet's open run, if ``ours``, gets the recovery rules before the coroutine ends."""
    ctx.emit(StageStarted(stage="drain"))
    async with ctx.recovering(ours, lambda current: recover(ctx, current)):
        outcome, run = await ctx.runner.drain(settings=ctx.config.drain, release=release, keep_lease=True,
                                              extra_settings=settings)
        return await _after_drain(ctx, outcome == "drained", run, act, confirm, words)


async def resume_drain_then(ctx: RunContext, run: Run, act: Act, words: DrainWords = DEPLOY) -> RunFinished:
    """Drain an interrupted run again (its consumers stay recorded), then ``act`` without asking again."""
    ctx.emit(StageStarted(stage="drain", detail=f"resuming run {run.id}"))
    run_id = run.id
    async with ctx.recovering(lambda current: current.id == run_id, lambda current: recover(ctx, current)):
        outcome, run = await ctx.runner.resume(run=run, keep_lease=True)
        return await _after_drain(ctx, outcome == "drained", run, act, None, words)


async def _after_drain(ctx: RunContext, drained: bool, run: Run, act: Act,
                       confirm: Callable[[], Awaitable[bool]] | None, words: DrainWords) -> RunFinished:
    if not drained:
        return ctx.finish("timeout", EXIT_TIMEOUT, f"The drain timed out: nothing was killed or {words.done}, the "
                                                   "consumers were restored.")
    if confirm is not None and not await confirm():
        decided, _ = await ctx.runner.abort(run=run)
        return ctx.finish("declined", EXIT_OK, f"Declined before {words.doing}: " + decided.explanation)
    return await act(run)


def is_drain_phase(run: Run) -> bool:
    return run.phase in ("preflight", "stopping", "draining", "drained")


@dataclass(frozen=True)
class DrainStrategy:
    """``strategy = "drain"`` (the default): the whole fleet drained, then the release deployed to every target (or
    every target routed back to the revision its last deploy replaced)."""

    name: str = "drain"
    decisions: tuple[DecisionAction, ...] = ()
    demo: str = ""

    def said(self, kind: RunKind, release: str | None) -> Said:
        if kind == "rollback":
            plan = ("Consumers are cancelled on every worker (running and prefetched tasks finish), the fleet is "
                    "drained, then each target is routed back to its earlier revision (no new image, no new "
                    "revision). A timeout restores consumers and changes nothing.")
        else:
            deploy = f" then deploy {release}" if kind == "deploy" else ""
            plan = ("Consumers are cancelled on every worker (running and prefetched tasks finish), the fleet is "
                    f"drained{deploy}. A timeout restores consumers and deploys nothing.")
        return Said(aside="", go="Press G to stop consumers and start the drain.", question="Stop consumers and "
                    "drain?", plan=plan, button="Stop consumers", warned_button="Accept warnings and stop consumers")

    def peak(self, count: int, config: Config) -> int:
        return count  # the new workers replace the drained ones

    def check_targets(self, targets: Sequence[Target], *, rollback: bool = False) -> None:
        """Every target kind; several at once."""

    # -- deploy --------------------------------------------------------------------------------------------------

    async def deploy(self, ctx: RunContext, release: str, targets: tuple[Target, ...]) -> RunFinished:
        """Preflight (the fleet's checks and the release's), the operator's go, drain, the operator's go, deploy,
        verify. Interrupted after the drain: the recovery rules, with the rollout's real outcome."""
        ctx.emit(StageStarted(stage="preflight", detail=f"release {release}", strategy=self.name))
        sha = await ctx.release_sha(release)
        ended = await ctx.checked([*ctx.release_checks(release, sha, targets), *ctx.fleet_checks()])
        if ended is not None:
            return ended
        return await drain_then(ctx, lambda run: self._deploy(ctx, run, targets, sha), release=release,
                                ours=lambda current: current.release == release,
                                confirm=lambda: ctx.operator.confirm_deploy(release, tuple(t.name for t in targets)),
                                settings={"sha": sha, "targets": [t.name for t in targets]})

    async def _deploy(self, ctx: RunContext, run: Run, targets: tuple[Target, ...], sha: str) -> RunFinished:
        release = run.release or ""
        await ctx.runner.advance(run.id, "deploying")
        ctx.emit(StageStarted(stage="deploy", detail=", ".join(t.name for t in targets)))
        await ctx.runner.exempt_from_fence([sha, sha[:7], release])
        result = await ctx.rollouts.deploy(run.id, targets, sha, release)
        if isinstance(result, DeployFailure):
            return await self._failed(ctx, run.id, result)
        await ctx.runner.advance(run.id, "deployed")
        deployed = tuple(TargetDeployed(**r.summary()) for r in result)
        for event in deployed:
            ctx.emit(event)
        return await ctx.verify(run, f"Release {release} deployed", deployed)

    async def _failed(self, ctx: RunContext, run_id: str, failure: DeployFailure) -> RunFinished:
        run = await ctx.journaled(run_id)
        decided, _restored = await ctx.runner.abort(run=run, rollout=failure.rollout)
        state = "consumers restored on the old workers" if decided.action == "restore" else decided.explanation
        return ctx.finish("deploy_failed", EXIT_DEPLOY, f"Deploy to {failure.target.name} failed: {failure.message} "
                                                        f"— {state}.", logs_url=failure.logs_url)

    # -- rollback ------------------------------------------------------------------------------------------------

    def check_rollback(self, step: RollbackStep) -> None:
        """Any split of existing revisions: one update routes it."""

    def rollback_checks(self, ctx: RunContext, steps: tuple[RollbackStep, ...],
                        first: Sequence[Check]) -> list[Check]:
        """The rollback's own, ``validate`` (Cloud Run's validate_only of the exact update that routes back), the
        fleet's."""
        return [*first, route_check(ctx, steps), *ctx.fleet_checks()]

    async def rollback(self, ctx: RunContext, steps: tuple[RollbackStep, ...]) -> RunFinished:
        """The deploy's way: drain the fleet, route every target back, verify, lift the fence."""
        label = label_of(steps)
        return await drain_then(ctx, lambda run: self._route(ctx, run, steps), release=label,
                                ours=lambda current: current.kind == "rollback" and current.release == label,
                                confirm=lambda: ctx.operator.confirm_rollback("; ".join(s.line() for s in steps)),
                                settings=settings_of(steps, self.name), words=ROLLBACK)

    async def _route(self, ctx: RunContext, run: Run, steps: tuple[RollbackStep, ...]) -> RunFinished:
        await ctx.runner.advance(run.id, "deploying")
        ctx.emit(StageStarted(stage="rollback", detail="; ".join(s.line() for s in steps)))
        # The revisions' workers (Cloud Run starts them now) consume while the fence holds the others.
        await ctx.runner.exempt_from_fence([], revisions=sorted({rev for s in steps for rev, _ in s.split}))
        result = await route_all(ctx, run.id, steps)
        if isinstance(result, DeployFailure):
            return await route_failed(ctx, run.id, result)
        await ctx.runner.advance(run.id, "deployed")
        return await routed(ctx, run, tuple(TargetRolledBack(**r.summary()) for r in result))

    # -- recovery ------------------------------------------------------------------------------------------------

    async def resume(self, ctx: RunContext, run: Run) -> RunFinished:
        """A run interrupted while draining drains again, then deploys (routes back); one whose deploy (route) was
        started follows its outcome."""
        if run.kind == "rollback":
            return await self._resume_rollback(ctx, run)
        names = list(run.settings.get("targets") or [t.name for t in ctx.config.targets])
        targets = tuple(ctx.config.target(name) for name in names)
        sha = str(run.settings.get("sha") or "")
        if is_drain_phase(run):
            return await resume_drain_then(ctx, run, lambda drained: self._deploy(ctx, drained, targets, sha))
        # deploying / deployed: the deploy was started; its outcome decides.
        await ctx.runner.hold(run)
        try:
            rollout = await ctx.rollouts.outcome(run)
            if self.recovery_plan(run, rollout).action == "leave":
                if run.phase == "deploying":
                    await ctx.runner.advance(run.id, "deployed", reason="resume: rollout ready")
                return await ctx.verify(run, f"Release {run.release} is deployed (the new revision is ready)")
        finally:
            await ctx.close()
        decided, _restored = await ctx.runner.abort(run=run, rollout=rollout)
        if decided.action == "ask":
            return ctx.finish("deploy_failed", EXIT_DEPLOY, decided.explanation)
        return ctx.finish("deploy_failed", EXIT_DEPLOY, "The deploy did not take effect: " + decided.explanation)

    async def _resume_rollback(self, ctx: RunContext, run: Run) -> RunFinished:
        steps = steps_of(ctx.config, run.settings)
        if not steps:
            raise UserError(f"Run {run.id} is a rollback this version cannot continue: nothing was changed; run "
                            "`celeryops abort` to apply the recovery rules.", EXIT_USAGE)
        if is_drain_phase(run):
            return await resume_drain_then(ctx, run, lambda drained: self._route(ctx, drained, steps), ROLLBACK)
        return await settle_started(ctx, run, steps)  # routing began: its outcome decides

    async def abort(self, ctx: RunContext, run: Run, *, force_restore: bool = False) -> RecoveryPlan:
        decided, _ = await ctx.runner.abort(run=run, force_restore=force_restore)
        return decided

    def recovery_plan(self, run: Run, rollout: Rollout | None = None) -> RecoveryPlan:
        return plan(run, rollout)

    def choices(self, run: Run, decided: RecoveryPlan) -> tuple[Choice, ...]:
        found: list[Choice] = []
        if is_drain_phase(run):
            then = ", then the release is deployed" if run.release else ""
            found.append(Choice(
                "resume", "Resume the run" if run.release else "Resume the drain",
                "Take over the run with its journalled settings: consumers it stopped stay stopped and the drain "
                f"continues from a fresh streak{then} (what `celeryops resume` does)."))
        elif run.phase in ("deploying", "deployed"):
            found.append(Choice(
                "resume", "Resume the run",
                "Ask the deploy target how the rollout went: if the new revision serves, finish the run; if it "
                "never took effect, restore the consumers (what `celeryops resume` does)."))
        if decided.action in ("restore", "nothing"):
            found.append(Choice("abort", "Abort and restore consumers" if decided.restore
                                else "Abort (nothing to restore)", decided.explanation))
        return tuple(found)


__all__ = ["DrainStrategy", "DrainWords", "drain_then", "recover", "resume_drain_then"]
