"""The preflight of a flow of two revisions on one worker pool: the pool's own checks (``traffic``: the pool runs
one revision or celeryops' own cohorts (:mod:`~celeryops.ops.run.pool.cohorts`), and the peak; ``validate``: the
scale-up, validate only; ``fence``: required on every worker; ``mixed_versions``) in place of the fleet's and the
release's of those ids (:mod:`celeryops.ops.preflight.overlap`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from celeryops.adapters.deploy.base import PoolUpdate
from celeryops.core.config import Target
from celeryops.core.events import StageStarted
from celeryops.ops.preflight import Check
from celeryops.ops.preflight.overlap import PoolView, overlap_checks
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.pool.cohorts import read_cohorts
from celeryops.ops.run.pool.pool import Pool
from celeryops.ops.run.pool.rules import Destination, pool_target
from celeryops.ops.run.pool.steps import new_revision_name
from celeryops.ops.run.rollback_plan import RollbackStep


def _own(ctx: RunContext, target: Target, destination: Destination, *, beside: int = 0,
         rollback: bool = False) -> list[Check]:
    deployer = Pool(ctx, target, "").deployer  # one sentence when it cannot run two revisions side by side
    runner = ctx.runner
    read: list[asyncio.Future[PoolView]] = []

    async def view() -> PoolView:
        state = await deployer.current(target)
        return PoolView(state, await read_cohorts(ctx, target, state) or {})

    async def read_pool() -> PoolView:
        if not read:
            read.append(asyncio.ensure_future(view()))
        return await asyncio.shield(read[0])

    async def validate(change: PoolUpdate) -> None:
        await deployer.validate_pool_update(target, change)

    return overlap_checks(target, read_pool, validate, destination.image or destination.revision,
                          destination.revision, app=runner.fleet.app, fleet=runner.fleet_name,
                          known=runner.fleet.members, has_registry=runner.coord is not None, rollback=rollback,
                          revisions=None if rollback else (lambda: deployer.missing_revision_permissions(target)),
                          canary=beside)


def _merged(first: Sequence[Check], own: list[Check]) -> list[Check]:
    replaced = {c.id for c in own}
    return [*(c for c in first if c.id not in replaced), *own]


async def begin_deploy(ctx: RunContext, strategy: str, release: str,
                       targets: Sequence[Target]) -> tuple[Target, str, Destination]:
    """The start of a deploy of ``strategy`` to one pool: the pool (one sentence, exit 2, for anything else), the
    preflight stage said, the release's commit and the new revision, named up front, of its image."""
    target = pool_target(targets, strategy)
    ctx.emit(StageStarted(stage="preflight", detail=f"release {release}, {strategy} on {target.name}",
                          strategy=strategy))
    sha = await ctx.release_sha(release)
    return target, sha, Destination(new_revision_name(target, sha), target.image_for(sha, release, release))


def deploy_checks(ctx: RunContext, target: Target, destination: Destination, release: str, sha: str, *,
                  beside: int = 0) -> list[Check]:
    """A deploy's: the release's and the fleet's checks, with the pool's own (``beside``: the new revision's
    instances at the scale-up beside all of the old one's; 0: as many)."""
    own = _own(ctx, target, destination, beside=beside)
    return _merged([*ctx.release_checks(release, sha, (target,)), *ctx.fleet_checks()], own)


def rollback_checks(ctx: RunContext, steps: Sequence[RollbackStep], first: Sequence[Check]) -> list[Check]:
    """A rollback's of one pool to an existing revision: ``first`` (the rollback's own: revision, permissions) and the
    fleet's, with the pool's own (``traffic``, ``validate`` of the scale-up to that revision, ``fence``,
    ``mixed_versions``) told in a rollback's words."""
    (step,) = steps  # one worker pool (the strategy's check_targets)
    own = _own(ctx, step.target, Destination(step.revision, step.image or None), rollback=True)
    return _merged([*first, *ctx.fleet_checks()], own)


__all__ = ["begin_deploy", "deploy_checks", "rollback_checks"]
