"""A worker pool whose instances are split between celeryops' own cohorts (the autoscaler's: revisions of one image,
each with an exact instance count) told apart from a split someone pinned by hand (the Cloud console, gcloud).

An overlap or canary deploy moves every instance from its old revisions to the new one; from a split of several
revisions it may start only when the split is celeryops' own cohorts, each kept at its count until it is drained
(:attr:`~celeryops.ops.run.pool.rules.Plan.cohorts`). Evidence, all of it:

- the split Cloud Run asks for is still the one celeryops recorded on the resource (``celeryops/split``, written with
  every autoscaler step and with a retirement back to the cohorts: :attr:`RolloutState.owned`); an edit of the split
  in the Cloud console or by gcloud makes it another;
- and the counts it runs are the ones celeryops set last: the newest run of the fleet's journal that changed the
  pool's counts (:func:`counts_left`: an autoscale step, a deploy's retirement, a cutover) left exactly them, or
  the autoscaler's published status shows exactly them as its cohorts, not left alone.

:func:`own_cohorts` is the rule, pure; :func:`read_cohorts` reads the journal and the published status for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping

import redis

from celeryops.adapters.deploy.base import RolloutState
from celeryops.core.config import Target
from celeryops.core.errors import UserError
from celeryops.core.splits import served_counts
from celeryops.ops.fleetwide.scalestatus import ScaleStatus, read_scale_status
from celeryops.ops.journal import DEPLOY_START, OVERLAP_CUTOVER, OVERLAP_REVERT, OVERLAP_UP, SCALE_POOL, Record, Run
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.pool.rules import Plan

HISTORY = 50  # the fleet's latest runs searched for the one that set the pool's counts last


def _ok(run: Run, intent: Record) -> bool:
    settled = run.settlement(intent.seq)
    if settled is not None:
        return bool(settled.payload.get("ok", True))
    return run.phase == "done"  # recovered: followed to its end without a settle of its own


def counts_left(run: Run, target: str) -> dict[str, int] | None:
    """The instances per revision that ``run``'s last pool change on ``target`` left (``{}``: one revision at a count
    the journal does not say, a drain deploy's), or None when it changed none."""
    if target not in (run.settings.get("targets") or ()):
        return None
    left: dict[str, int] | None = None
    for intent in run.intents():
        if not _ok(run, intent):
            continue
        if intent.intent == SCALE_POOL:
            left = {str(rev): int(n) for rev, n in (intent.payload.get("after") or {}).items() if int(n) > 0}
        elif intent.intent in (OVERLAP_UP, OVERLAP_CUTOVER, OVERLAP_REVERT):
            plan = Plan.from_payload(intent.payload)
            left = {OVERLAP_UP: plan.up_counts, OVERLAP_CUTOVER: {plan.new: plan.count},
                    OVERLAP_REVERT: plan.olds}[intent.intent]
        elif intent.intent == DEPLOY_START:
            left = {}
    return left


def published_counts(status: ScaleStatus | None, target: str) -> dict[str, int] | None:
    """The cohorts the autoscaler of ``target`` last published, unless it left the pool alone (someone else changed
    it)."""
    if status is None or status.target != target or status.message:
        return None
    return {str(c.get("revision")): int(c.get("count") or 0) for c in status.cohorts if int(c.get("count") or 0) > 0}


def own_cohorts(state: RolloutState, target: str, runs: Iterable[Run],
                published: ScaleStatus | None = None) -> dict[str, int] | None:
    """The exact instances per revision when worker pool ``target`` runs several revisions and they are celeryops'
    own cohorts (see the module; ``runs``: the fleet's, newest first), else None."""
    counts = served_counts(state.instance_count or 0, state.served)
    if len(counts) < 2 or not state.owned:
        return None
    for run in runs:
        left = counts_left(run, target)
        if left is not None:  # the newest run that set the pool's counts decides
            return counts if left == counts else None
    return counts if published_counts(published, target) == counts else None


async def read_cohorts(ctx: RunContext, target: Target, state: RolloutState) -> dict[str, int] | None:
    """:func:`own_cohorts` of ``target`` in ``state``, from the fleet's journal (this machine's and the fleet's
    Redis copy) and the autoscaler's published status."""
    if len(state.served) < 2 or not state.owned:
        return None
    runner = ctx.runner
    runs = await asyncio.to_thread(runner.journal.fleet_history, HISTORY, runner.fleet_name)
    published = None
    if runner.coord is not None:
        with contextlib.suppress(redis.RedisError, UserError):  # unread: the journal decides alone
            published = await asyncio.to_thread(read_scale_status, runner.coord, runner.fleet_name)
    return own_cohorts(state, target.name, runs, published)


def largest(counts: Mapping[str, int]) -> str:
    """The revision with the most instances (the first of those that tie)."""
    return max(counts, key=lambda rev: counts[rev])


__all__ = ["counts_left", "largest", "own_cohorts", "published_counts", "read_cohorts"]
