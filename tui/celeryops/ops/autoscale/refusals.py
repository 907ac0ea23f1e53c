"""What ``celeryops autoscale`` refuses before it changes anything, each in one sentence (what failed, that nothing
changed, what to do): a target that is not a worker pool (services scale themselves), missing Cloud Run
permissions, a pool that Cloud Run scales itself, a second autoscaler for the fleet, queues nobody consumes."""

from __future__ import annotations

import asyncio

from celeryops.adapters.deploy.base import DeployError, role_for
from celeryops.core.autoscale import AutoscaleSettings
from celeryops.core.config import Target
from celeryops.ops.autoscale.demand import PoolReader, pool_workers
from celeryops.ops.fleetwide.scalestatus import ScaleStatus
from celeryops.ops.run.context import RunContext

POOL_KIND = 'kind = "cloudrun-worker-pool"'
MAX_POOL_NAME = 63 - len("-as0611101502-3f1a")  # a revision name is at most 63 characters


def target_refusal(target: Target) -> str | None:
    """Why ``target`` cannot be autoscaled (a service, a command target), or None. Pure."""
    if target.kind == "cloudrun-worker-pool":
        return None
    if target.kind == "cloudrun-service":
        return (f"Target {target.name!r} is a Cloud Run service, and services scale themselves (Cloud Run adds and "
                "removes their instances by the requests they get): nothing was changed; `celeryops autoscale` sizes "
                f"Cloud Run worker pools ({POOL_KIND}).")
    return (f"Target {target.name!r} is a command target, whose instances celeryops cannot count: nothing was "
            f"changed; `celeryops autoscale` sizes Cloud Run worker pools ({POOL_KIND}).")


def pick_target(targets: tuple[Target, ...], name: str | None, configured: str = "") -> Target | str:
    """The target to autoscale: ``name`` (the argument), else ``[autoscale] target``, else the only worker pool (or
    the only target); a sentence when there is no such choice. Pure."""
    wanted = name or configured
    if wanted:
        found = [t for t in targets if t.name == wanted]
        if found:
            return found[0]
        known = ", ".join(t.name for t in targets) or "none are configured"
        return (f"There is no target {wanted!r} to autoscale (targets: {known}): nothing was changed; name one of "
                "the configured [[targets]].")
    pools = [t for t in targets if t.kind == "cloudrun-worker-pool"]
    if len(pools) == 1:
        return pools[0]
    if len(targets) == 1:
        return targets[0]
    if not targets:
        return ("No target is configured to autoscale: nothing was changed; add a [[targets]] table of "
                f"{POOL_KIND} to celeryops.toml.")
    return (f"{len(pools) or len(targets)} targets could be autoscaled ({', '.join(t.name for t in pools or targets)}):"
            " nothing was changed; name one: `celeryops autoscale TARGET`, or [autoscale] target.")


async def refusals(ctx: RunContext, target: Target, settings: AutoscaleSettings, reader: PoolReader,
                   published: ScaleStatus | None, *, dry_run: bool) -> str | None:
    """The first reason to refuse (see the module), or None. Reads only."""
    kind = target_refusal(target)
    if kind is not None:
        return kind
    pool = target.display
    if len(target.resource) > MAX_POOL_NAME:
        return (f"{pool} has a name of {len(target.resource)} characters, and a cohort's revision is named "
                f"<pool>-asMMDDHHMMSS-xxxx within Cloud Run's 63: nothing was changed; autoscale a pool whose name "
                f"has at most {MAX_POOL_NAME} characters.")
    deployer = reader.deployer
    try:
        missing = [] if dry_run else await deployer.missing_permissions(target)
        state = await deployer.current(target)
    except DeployError as err:
        return f"{err} Nothing was changed." if not str(err).rstrip().endswith("changed.") else str(err)
    if missing:
        grants = "; ".join(f"{p}: {role_for(p)}" for p in missing)
        return (f"The credentials in use lack {', '.join(missing)} on {pool}, so the autoscaler could not change its "
                f"instance count: nothing was changed; grant them ({grants}), or look with `celeryops autoscale "
                "--dry-run`, which changes nothing.")
    if state.scaling_mode == "automatic":
        return (f"Cloud Run scales {pool} itself (automatic scaling), so celeryops leaves it alone: nothing was "
                "changed; set the pool to manual scaling to let `celeryops autoscale` size it.")
    if published is not None and published.alive() and not dry_run:
        return (f"An autoscaler already runs for fleet {published.fleet} ({published.owner}@{published.host}, pid "
                f"{published.pid}, on {published.target}): nothing was changed; one autoscaler per fleet: stop that "
                "one first.")
    return await _queue_refusal(ctx, target, settings, reader)


async def _queue_refusal(ctx: RunContext, target: Target, settings: AutoscaleSettings,
                         reader: PoolReader) -> str | None:
    """A configured queue that no worker of the pool consumes (its live workers, else the registry's memory of
    them); no queue known at all while the pool runs no worker."""
    runner = ctx.runner
    pool = target.display
    consumed: set[str] = set()
    if runner.coord is not None:
        from celeryops.fence import listed_workers, plugin_workers

        live = pool_workers(await asyncio.to_thread(plugin_workers, runner.coord, runner.fleet_name), target)
        known = live or pool_workers(await asyncio.to_thread(listed_workers, runner.coord, runner.fleet_name), target)
        consumed = {q for info in known.values() for q in (*info.queues, *info.held_queues)}
    if settings.queues and consumed:
        nobody = [q for q in settings.queues if q not in consumed]
        if nobody:
            return (f"autoscale.queues names {', '.join(repr(q) for q in nobody)}, which no worker of {pool} "
                    f"consumes (they consume {', '.join(sorted(consumed))}): nothing was changed; name the queues "
                    "the pool's workers consume, or leave autoscale.queues out to size the pool by all of them.")
    if not settings.queues and not consumed and not reader.queues:
        return (f"{pool} runs no worker that says which queues it consumes, and autoscale.queues is empty: nothing "
                "was changed; name the queues that size the pool in [autoscale] queues.")
    return None


__all__ = ["pick_target", "refusals", "target_refusal"]
