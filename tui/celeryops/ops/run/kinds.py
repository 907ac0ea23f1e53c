"""Who carries an open run on, by what it is: the one seam through which the session resumes and aborts a run and
the console and ``status`` say what recovery would do (:func:`owner_of`, :func:`planner_of`).

A run of a kind that no strategy owns is given to its entry in :data:`RUN_KINDS`, each implemented by the module
whose flow it is: a drain alone (``drain``: the drain engine's own resume; its abort and plan are the drain
strategy's), a step of the autoscaler (``autoscale``: :class:`celeryops.ops.run.scaling.ScalingSteps`). Every other
run (a deploy, a rollback) is its strategy's (:data:`celeryops.ops.run.strategies.STRATEGIES`). Adding a kind of
run is a module with its :class:`Owner` and one line here; the session compares no kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from celeryops.core.config import DEFAULT_STRATEGY
from celeryops.core.errors import EXIT_OK, EXIT_TIMEOUT
from celeryops.ops.journal import Run
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.recovery import Choice, RecoveryPlan, Rollout
from celeryops.ops.run.scaling import ScalingSteps
from celeryops.ops.run.strategies import STRATEGIES, Strategy, strategy_of_run


class Owner(Protocol):
    """An open run's life after its start: ``resume`` (its exit code), ``abort`` (what was done), ``recovery_plan``
    (what abort would do, decided without acting) and ``choices`` (what the console's recovery view offers)."""

    async def resume(self, ctx: RunContext, run: Run) -> int: ...

    async def abort(self, ctx: RunContext, run: Run, *, force_restore: bool = False) -> RecoveryPlan: ...

    def recovery_plan(self, run: Run, rollout: Rollout | None = None) -> RecoveryPlan: ...

    def choices(self, run: Run, decided: RecoveryPlan) -> tuple[Choice, ...]: ...


@dataclass(frozen=True)
class Strategic:
    """A run of ``strategy`` (a deploy, a rollback): its strategy carries it on."""

    strategy: Strategy

    async def resume(self, ctx: RunContext, run: Run) -> int:
        return (await self.strategy.resume(ctx, run)).exit_code

    async def abort(self, ctx: RunContext, run: Run, *, force_restore: bool = False) -> RecoveryPlan:
        return await self.strategy.abort(ctx, run, force_restore=force_restore)

    def recovery_plan(self, run: Run, rollout: Rollout | None = None) -> RecoveryPlan:
        return self.strategy.recovery_plan(run, rollout)

    def choices(self, run: Run, decided: RecoveryPlan) -> tuple[Choice, ...]:
        return self.strategy.choices(run, decided)


@dataclass(frozen=True)
class DrainAlone(Strategic):
    """A drain with no deploy (``celeryops drain``): resumed by the drain engine (it drains again); its abort, plan
    and choices are the drain strategy's."""

    async def resume(self, ctx: RunContext, run: Run) -> int:
        outcome, _ = await ctx.runner.resume(run=run)
        return EXIT_OK if outcome == "drained" else EXIT_TIMEOUT


#: The kinds of run no strategy owns, by :attr:`Run.kind <celeryops.ops.journal.Run.kind>`.
RUN_KINDS: dict[str, Owner] = {"drain": DrainAlone(STRATEGIES[DEFAULT_STRATEGY]), "autoscale": ScalingSteps()}


def owner_of(run: Run) -> Owner:
    """Who resumes and aborts ``run``: its kind's entry, else its strategy (one sentence, exit 2, for a strategy this
    version does not know)."""
    return RUN_KINDS.get(run.kind) or Strategic(strategy_of_run(run))


def planner_of(run: Run) -> Owner:
    """Who says what recovery would do with ``run`` (``status``, the console's recovery view): as :func:`owner_of`,
    a newer version's strategy read as the default's."""
    return RUN_KINDS.get(run.kind) or Strategic(STRATEGIES.get(run.strategy) or STRATEGIES[DEFAULT_STRATEGY])


__all__ = ["RUN_KINDS", "DrainAlone", "Owner", "Strategic", "owner_of", "planner_of"]
