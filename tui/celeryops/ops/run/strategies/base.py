"""The strategy protocol: how a deploy replaces a target's workers, as one object per strategy
(:data:`celeryops.ops.run.strategies.STRATEGIES`, the only switch), each in a module of its own.

A strategy is given the run context (:class:`~celeryops.ops.run.context.RunContext`) and owns its run from the
preflight to the end, and its recovery:

- ``deploy``: its checks (the preflight), the operator's go, then the whole run, every side effect written ahead in
  the journal, the recovery rules applied before an interrupted coroutine ends;
- ``resume``: continue an interrupted run of this strategy from its journal (and what the target says now);
- ``abort``: apply its recovery rules to an interrupted run (from any machine);
- ``recovery_plan``: what ``abort`` would do, decided without acting (the console's recovery view, ``status``);
- ``choices``: what the recovery view offers for an interrupted run of this strategy.

Strategies import neither each other nor the session (import-linter contracts); what two of them share lives
below them: the drain (:mod:`celeryops.ops.run.runner`), two revisions on a pool (:mod:`celeryops.ops.run.pool`).
"""

from __future__ import annotations

from typing import Protocol

from celeryops.core.config import Target
from celeryops.core.events import RunFinished
from celeryops.ops.journal import Run
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.recovery import Choice, RecoveryPlan, Rollout


class Strategy(Protocol):
    """One way to deploy (see the module)."""

    @property
    def name(self) -> str: ...

    async def deploy(self, ctx: RunContext, release: str, targets: tuple[Target, ...]) -> RunFinished: ...

    async def resume(self, ctx: RunContext, run: Run) -> RunFinished: ...

    async def abort(self, ctx: RunContext, run: Run, *, force_restore: bool = False) -> RecoveryPlan: ...

    def recovery_plan(self, run: Run, rollout: Rollout | None = None) -> RecoveryPlan: ...

    def choices(self, run: Run, decided: RecoveryPlan) -> tuple[Choice, ...]: ...


__all__ = ["Choice", "Strategy"]
