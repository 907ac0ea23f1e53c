"""The strategy protocol: how a deploy replaces a target's workers, and how a rollback brings them back, as one object
per strategy (:data:`celeryops.ops.run.strategies.STRATEGIES`, the only switch), each in a module of its own.

A strategy is given the run context (:class:`~celeryops.ops.run.context.RunContext`) and owns its runs from the
preflight to the end, their recovery, and what the CLI and the console say about them:

- ``check_targets``: refuse, in one sentence and before anything is contacted, targets it cannot move;
- ``deploy``: its checks (the preflight), the operator's go, then the whole run, every side effect written ahead in
  the journal, the recovery rules applied before an interrupted coroutine ends;
- ``check_rollback``, ``rollback_checks``, ``rollback``: a way back it cannot take refused in one sentence; its
  rollback's preflight (after the rollback's own ``revision`` / ``permissions`` checks); the whole rollback run;
- ``resume``: continue an interrupted run of this strategy (a deploy or a rollback) from its journal;
- ``abort``: apply its recovery rules to an interrupted run (from any machine);
- ``recovery_plan``: what ``abort`` would do, decided without acting (the console's recovery view, ``status``);
- ``choices``: what the recovery view offers for an interrupted run of this strategy;
- ``said``: what the preflight and the go question say before a run of it starts (:class:`Said`), ``peak``: the
  most instances a run of it may reach on a target of ``count``, ``decisions``: the operator's decisions it takes
  mid-run (the console's keys send them), ``demo``: how the demo's home view says a deploy goes.

Strategies import neither each other nor the session (import-linter contracts), and nothing outside this package
imports a strategy module: the registry is the way in. What two strategies share lives below them: the drain
(:mod:`celeryops.ops.run.runner`), the routing of targets back (:mod:`celeryops.ops.run.routing`), the pool's steps
(:mod:`celeryops.ops.run.pool`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from celeryops.core.config import Config, Target
from celeryops.core.events import RunFinished, RunKind
from celeryops.ops.journal import Run
from celeryops.ops.preflight import Check
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.decisions import DecisionAction
from celeryops.ops.run.pool.checks import rollback_checks
from celeryops.ops.run.pool.recover import pool_choices
from celeryops.ops.run.pool.rules import one_revision, pool_target, recovery_plan
from celeryops.ops.run.pool.switch import move_back
from celeryops.ops.run.recovery import Choice, RecoveryPlan, Rollout
from celeryops.ops.run.rollback_plan import RollbackStep


@dataclass(frozen=True)
class Said:
    """What the console says before a run of a strategy starts: the preflight title's ``aside`` (after "Before the
    deploy R"), its line once every check passed (``go``), and G's confirmation: its ``question``, what happens
    (``plan``; ``{peak}`` stands for the peak's line, the ``traffic`` check's finding), its button and, with
    warnings to accept, ``warned_button``."""

    aside: str
    go: str
    question: str
    plan: str
    button: str
    warned_button: str


def said_starting(flow: str, kind: str, *, aside: str, go: str, plan: str) -> Said:
    """What a strategy says whose G starts its own ``flow`` (``overlap``, ``canary``) rather than the drain."""
    return Said(aside=aside, go=go, question=f"Start the {flow} {kind}?", plan=plan, button=f"Start the {flow}",
                warned_button=f"Accept warnings and start the {flow}")


def pool_rollback_said(release: str | None) -> Said:
    """What every strategy of two revisions on a worker pool says about its rollback: the overlap's way back."""
    named = f" {release}" if release else ""
    return said_starting(
        "overlap", "rollback", aside=" (overlap: the previous revision consumes beside the deployed one)",
        go="Press G to start the overlap: the new revision first, then the old one drains.",
        plan=(f"{{peak}}The previous revision{named} comes up beside the current one (no instance is taken "
              "away) and starts consuming. Only then do the current revision's workers stop taking new "
              "tasks: their running and prefetched tasks finish while the previous revision consumes, so "
              "processing never pauses. Once they are idle, every instance moves back to the previous "
              "revision at the original count. Nothing is killed: if the current revision is not idle "
              "within max wait, it consumes again and the previous one is retired."))


class OnePool:
    """What every strategy of two revisions on one worker pool does alike: one worker pool at a time (of the kinds
    its name runs on), what it says before a deploy from its own words (``aside``, ``go``, ``plan``: ``{release}``
    stands for the release's name) and before a rollback (the overlap's way back: :func:`pool_rollback_said`), one
    revision to go back to, the overlap's way back (:func:`~celeryops.ops.run.pool.switch.move_back`: no pause)
    after the pool's checks, recovered by the pool's rules, its recovery choices in its words. Mixed into the
    strategy, which declares those."""

    name: str
    aside: str
    go: str
    plan: str
    resume_label: str  # the recovery view's choices: resume, and the abort that retires or finishes a cutover
    resume_detail: str
    retire_label: str
    cutover_label: str

    def recovery_plan(self, run: Run, rollout: Rollout | None = None) -> RecoveryPlan:
        return recovery_plan(run)

    def choices(self, run: Run, decided: RecoveryPlan) -> tuple[Choice, ...]:
        if run.kind == "rollback":  # the overlap's way back, whatever the strategy
            return pool_choices(decided, resume="Resume the rollback", retire="Abort: retire the previous revision",
                                cutover="Abort: finish the cutover", detail=(
                                    "Ask Cloud Run how the pool is and continue from the journal: wait for the "
                                    "previous revision, drain the deployed one again, or finish the cutover (what "
                                    "`celeryops resume` does)."))
        return pool_choices(decided, resume=self.resume_label, retire=self.retire_label, cutover=self.cutover_label,
                            detail=self.resume_detail)

    def said(self, kind: RunKind, release: str | None) -> Said:
        if kind == "rollback":
            return pool_rollback_said(release)
        plan = self.plan.replace("{release}", f" {release}" if release else "")
        return said_starting(self.name, kind, aside=self.aside, go=self.go, plan=plan)

    def check_targets(self, targets: Sequence[Target], *, rollback: bool = False) -> None:
        pool_target(targets, self.name, rollback=rollback)

    def check_rollback(self, step: RollbackStep) -> None:
        one_revision(step.target, step.split, step.source)

    def rollback_checks(self, ctx: RunContext, steps: tuple[RollbackStep, ...],
                        first: Sequence[Check]) -> list[Check]:
        return rollback_checks(ctx, steps, first)

    async def rollback(self, ctx: RunContext, steps: tuple[RollbackStep, ...]) -> RunFinished:
        """The pool back to the revision its deploy replaced, the overlap's way: no pause."""
        return await move_back(ctx, steps, self.name)


class Strategy(Protocol):
    """One way to deploy and roll back (see the module)."""

    @property
    def name(self) -> str: ...

    @property
    def decisions(self) -> tuple[DecisionAction, ...]: ...

    @property
    def demo(self) -> str: ...

    def said(self, kind: RunKind, release: str | None) -> Said: ...

    def peak(self, count: int, config: Config) -> int: ...

    def check_targets(self, targets: Sequence[Target], *, rollback: bool = False) -> None: ...

    async def deploy(self, ctx: RunContext, release: str, targets: tuple[Target, ...]) -> RunFinished: ...

    def check_rollback(self, step: RollbackStep) -> None: ...

    def rollback_checks(self, ctx: RunContext, steps: tuple[RollbackStep, ...],
                        first: Sequence[Check]) -> list[Check]: ...

    async def rollback(self, ctx: RunContext, steps: tuple[RollbackStep, ...]) -> RunFinished: ...

    async def resume(self, ctx: RunContext, run: Run) -> RunFinished: ...

    async def abort(self, ctx: RunContext, run: Run, *, force_restore: bool = False) -> RecoveryPlan: ...

    def recovery_plan(self, run: Run, rollout: Rollout | None = None) -> RecoveryPlan: ...

    def choices(self, run: Run, decided: RecoveryPlan) -> tuple[Choice, ...]: ...


__all__ = ["Choice", "OnePool", "Said", "Strategy", "pool_rollback_said", "said_starting"]
