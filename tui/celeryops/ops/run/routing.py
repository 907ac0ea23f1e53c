"""Routing targets back to revisions that exist (a drain rollback's step once the fleet is drained): each target gets
one update that routes its traffic (a worker pool: its instances) to a split of existing revisions, written ahead as
a ``deploy_start`` intent that names the ``split``; the check that Cloud Run accepts it (validate only); and how an
interrupted rollback whose routing began is finished (every target serves its split) or recovered."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from celeryops.adapters.deploy.base import Deployer, DeployResult, Router
from celeryops.core.config import Target
from celeryops.core.errors import EXIT_DEPLOY
from celeryops.core.events import RunFinished, TargetRolledBack
from celeryops.ops.journal import Run
from celeryops.ops.preflight import Check, validate_check
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.rollback_plan import RollbackStep, Split
from celeryops.ops.run.rollout import DeployFailure, start_target


def router(ctx: RunContext, target: Target) -> Router:
    return cast(Router, ctx.rollouts.deployer(target))


@dataclass(frozen=True)
class _RouteValidation:
    """The validate check's view of a router: validating "the update" means validating the route to ``split``."""

    router: Router
    split: Split

    async def validate(self, target: Target, _image: str) -> None:
        await self.router.validate_route(target, self.split)


def route_check(ctx: RunContext, steps: Sequence[RollbackStep]) -> Check:
    """``validate``: Cloud Run accepts the exact update that routes each target back (validate only)."""
    return validate_check([(s.target, cast(Deployer, _RouteValidation(router(ctx, s.target), s.split)), "")
                           for s in steps], title="Cloud Run accepts the rollback")


async def route_all(ctx: RunContext, run_id: str, steps: Sequence[RollbackStep]) -> list[DeployResult] | DeployFailure:
    """Route every target in turn (each start written ahead, naming the split); the first failure stops."""
    results: list[DeployResult] = []
    for step in steps:
        result = await _route(ctx, run_id, step)
        if isinstance(result, DeployFailure):
            return result
        results.append(result)
    return results


async def _route(ctx: RunContext, run_id: str, step: RollbackStep) -> DeployResult | DeployFailure:
    target, to = step.target, router(ctx, step.target)
    return await start_target(
        ctx.runner.journal, run_id, target, lambda: to.current(target),
        lambda before: {"target": target.name, "image": step.image, "previous": before.to_dict(),
                        "revision": step.revision, "split": [list(e) for e in step.split]},
        lambda: to.route(target, step.split, ctx.emit, by=f"rollback run {run_id}"),
        settle=lambda _result: {"revision": step.revision},
        outcome=lambda _before: to.route_outcome(target, step.split))


async def routed(ctx: RunContext, run: Run, rolled: tuple[TargetRolledBack, ...]) -> RunFinished:
    """The targets serve their revisions: one line each, then the fleet verified and the run done."""
    for event in rolled:
        ctx.emit(event)
    serves = "; ".join(f"{t.target} serves revision {t.revision}" for t in rolled)
    return await ctx.verify(run, f"Rolled back ({serves})", rolled, outcome="rolled_back")


async def route_failed(ctx: RunContext, run_id: str, failure: DeployFailure) -> RunFinished:
    """A target refused or failed its route: the recovery rules with its real outcome."""
    run = await ctx.journaled(run_id)
    decided, _ = await ctx.runner.abort(run=run, rollout=failure.rollout)
    state = "consumers restored on the workers that served before" if decided.action == "restore" else \
        decided.explanation
    return ctx.finish("rollback_failed", EXIT_DEPLOY, f"Rollback of {failure.target.name} failed: "
                                                      f"{failure.message} — {state}.", logs_url=failure.logs_url)


async def settle_started(ctx: RunContext, run: Run, steps: Sequence[RollbackStep]) -> RunFinished:
    """A rollback interrupted once routing began (deploying / deployed): finish it if every target serves its split,
    else the recovery rules."""
    await ctx.runner.hold(run)
    try:
        rollout = await ctx.rollouts.outcome(run)
        if ctx.runner.recovery_plan(run, rollout).action == "leave":
            if run.phase == "deploying":
                await ctx.runner.advance(run.id, "deployed", reason="resume: the rollback took effect")
            return await routed(ctx, run, tuple(
                TargetRolledBack(target=s.target.name, revision=s.revision, image=s.image,
                                 previous_revision=s.was, console_url=s.target.console_url) for s in steps))
    finally:
        await ctx.close()
    decided, _ = await ctx.runner.abort(run=run, rollout=rollout)
    what = decided.explanation if decided.action == "ask" else "The rollback did not take effect: " + \
        decided.explanation
    return ctx.finish("rollback_failed", EXIT_DEPLOY, what)


__all__ = ["route_all", "route_check", "route_failed", "routed", "router", "settle_started"]
