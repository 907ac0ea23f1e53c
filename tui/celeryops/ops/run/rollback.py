"""``celeryops rollback`` (and the console's B): each target back to the revision its last deploy replaced, or the one
named, as safely as a deploy, in the same run context (:class:`~celeryops.ops.run.context.RunContext`), by the
targets' strategy (:mod:`celeryops.ops.run.strategies`: the same registry and protocol as a deploy).

1. **What to go back to** (:mod:`celeryops.ops.run.rollback_plan`): from the run journal or ``--to``; the revision
   must exist and be Ready, and the strategy must be able to take that way back (``check_targets``,
   ``check_rollback``). A bad request is one sentence, exit 2, nothing touched; a target that already serves it is
   left alone.
2. **Preflight**: the rollback's own checks (``revision``, read again; ``permissions``; ``revisions``), then the
   strategy's (``rollback_checks``: the drain's ``validate`` of the route and the fleet's checks; a pool strategy's
   ``traffic``, ``validate`` of the scale-up, ``fence``, ``mixed_versions``). No branch, image or freshness check:
   nothing is built and no image is rolled out.
3. **The strategy brings the revisions to serve** (``rollback``): the drain's way (drain, route each target back,
   verify), or, on a worker pool, the overlap's way to the existing revision without a pause (the canary's target
   goes back that way too). The split a rollback leaves pins named revisions, recorded on the resource as
   celeryops' own (annotation ``celeryops/split``), so the next deploy moves everything to its new revision.

An interrupted rollback is recovered by its strategy, as its deploys are (``celeryops resume`` / ``abort`` through
the session: the run records its ``strategy`` and ``kind``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import cast

from celeryops.adapters.deploy import DeployError
from celeryops.adapters.deploy.base import describe_split
from celeryops.core.config import Config, Target
from celeryops.core.errors import EXIT_OK, EXIT_PREFLIGHT, EXIT_USAGE, UserError
from celeryops.core.events import Event, Notice, PhaseChanged, RunFinished, StageStarted
from celeryops.ops.journal import Journal
from celeryops.ops.preflight import Check, CheckResult, permissions_check
from celeryops.ops.preflight.overlap import revisions_check
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.rollback_plan import (
    Recorded,
    RollbackRequest,
    RollbackStep,
    Split,
    changed_since,
    checked_step,
    chosen_targets,
    recorded_deploy,
    strategy_of,
)
from celeryops.ops.run.routing import router
from celeryops.ops.run.strategies import STRATEGIES, Strategy, strategy_named

__all__ = ["Rollback", "RollbackRequest", "RollbackStep", "chosen"]


def chosen(config: Config, request: RollbackRequest, journal: Journal | None) -> tuple[tuple[Target, ...], Strategy]:
    """The targets to roll back and the strategy that brings them back, checked without touching anything: the
    targets (:func:`~celeryops.ops.run.rollback_plan.chosen_targets`), a known ``--strategy``, one strategy for all
    (the flag wins over a target's ``strategy``), and targets that strategy can move (its ``check_targets``)."""
    targets = chosen_targets(config, request, journal)
    if request.strategy and request.strategy not in STRATEGIES:
        raise UserError(f"--strategy {request.strategy!r} is not a strategy: nothing was changed; use "
                        f"{' or '.join(STRATEGIES)}.", EXIT_USAGE)
    names = {strategy_of(request, t) for t in targets}
    if len(names) > 1:
        raise UserError(f"The targets ask for different strategies ({', '.join(sorted(names))}): nothing was "
                        "changed; roll them back one at a time (--target), or say --strategy.", EXIT_USAGE)
    strategy = strategy_named(names.pop())
    strategy.check_targets(targets, rollback=True)
    return targets, strategy


@dataclass
class Rollback:
    """A rollback in run context ``ctx``: :meth:`run`, from the request to the end."""

    ctx: RunContext

    @property
    def config(self) -> Config:
        return self.ctx.config

    def emit(self, event: Event) -> None:
        self.ctx.emit(event)

    async def run(self, request: RollbackRequest) -> RunFinished:
        """What to go back to, preflight, the operator's go, then the strategy. Returns the run's end."""
        self.ctx.refuse_if_read_only("roll back")
        await self.ctx.require_operator("roll back")
        going = False
        try:
            steps, strategy = await self.plan(request)
            self.emit(StageStarted(stage="preflight", detail="roll back " + "; ".join(s.line() for s in steps),
                                   strategy=strategy.name))
            left = [s for s in steps if s.serving and dict(s.serving) == dict(s.split)]
            for step in left:
                self.emit(Notice(level="info", message=f"{step.target.name} already serves "
                                                       f"{describe_split(step.split)}: it is left as it is."))
            steps = tuple(s for s in steps if s not in left)
            if not steps:
                message = "Nothing to roll back: every target already serves the revision it would go back to."
                self.emit(PhaseChanged("done", message))
                return self.ctx.finish("rolled_back", EXIT_OK, message + " Nothing was changed.")
            report = await self.ctx.preflight(strategy.rollback_checks(self.ctx, steps, self.checks(steps)))
            ended = await self.ctx.review(report, unreachable_exit=EXIT_PREFLIGHT)
            if ended is not None:
                return ended
            going = True
        finally:
            if not going:  # nothing was started: the strategy's run closes them otherwise
                await self.ctx.rollouts.close()
        return await strategy.rollback(self.ctx, steps)

    async def plan(self, request: RollbackRequest) -> tuple[tuple[RollbackStep, ...], Strategy]:
        """Each target's step and the strategy (bad input: UserError, exit 2; Cloud Run unreadable: its sentence,
        exit 5)."""
        journal = self.ctx.runner.journal
        targets, strategy = await asyncio.to_thread(chosen, self.config, request, journal)
        wanted: list[tuple[Target, Split, str, Recorded | None]] = []
        for target in targets:
            if request.to:
                wanted.append((target, ((request.to, 100),), "named with --to", None))
            else:
                record = await asyncio.to_thread(recorded_deploy, self.config, journal, target, request.run_id)
                wanted.append((target, record.replaced, record.source, record))

        async def step(target: Target, split: Split, source: str, recorded: Recorded | None) -> RollbackStep:
            to = router(self.ctx, target)
            try:
                now, revisions = await asyncio.gather(to.current(target), to.revisions(target))
            except DeployError as err:
                raise UserError(str(err), EXIT_PREFLIGHT) from None
            if recorded is not None:  # what serves now must be what the recorded deploy left: no two steps back
                changed_since(target, recorded, now, revisions)
            found = checked_step(target, split, source, now, revisions, strategy.name, strategy.check_rollback)
            return found

        steps = await asyncio.gather(*(step(*w) for w in wanted), return_exceptions=True)  # every read ends here
        for found in steps:
            if isinstance(found, BaseException):
                raise found
        return tuple(cast(list[RollbackStep], steps)), strategy

    def checks(self, steps: Sequence[RollbackStep]) -> list[Check]:
        """The checks every rollback runs first (its strategy adds the rest): revision, permissions, revisions."""
        return [self._revision_check(steps),
                permissions_check([(s.target.name, self._missing(s.target)) for s in steps]),
                revisions_check([(s.target.name, self._unreadable(s.target)) for s in steps])]

    def _unreadable(self, target: Target) -> Callable[[], Awaitable[list[str]]]:
        return lambda: router(self.ctx, target).missing_revision_permissions(target)

    def _missing(self, target: Target) -> Callable[[], Awaitable[list[str]]]:
        return lambda: router(self.ctx, target).missing_permissions(target)

    def _revision_check(self, steps: Sequence[RollbackStep]) -> Check:
        async def run() -> CheckResult:
            found: list[str] = []
            for step in steps:
                to = router(self.ctx, step.target)
                now = await to.current(step.target)
                checked_step(step.target, step.split, step.source, now, await to.revisions(step.target),
                             step.strategy)
                image = f" ({step.image})" if step.image else ""
                found.append(f"{step.target.name}: {describe_split(step.split)}{image}, {step.source}, is ready; "
                             f"{describe_split(now.served_split)} serves now")
            return CheckResult("revision", "Revision to return to", "ok", "; ".join(found))

        return Check("revision", "Revision to return to", run)
