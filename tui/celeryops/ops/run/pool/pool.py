"""One Cloud Run worker pool in one run: :class:`Pool`, what every pool step (:mod:`celeryops.ops.run.pool.steps`)
takes. It holds the run context (the runner: journal, lease, fence, drain; the rollouts: the deployer), the target,
the run's id and how the operator reads the flow (:class:`Words`), and reads and updates the pool: its rollout state,
its revisions, the fence registry's workers by revision, the run's phases, and the ``overlap`` step events.

A flow that is no strategy (scaling a pool in and out) makes one with :meth:`Pool.of` from a run it opened
(``ctx.runner.open_run``), and calls the steps with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from celeryops.adapters.deploy.base import (
    DeployError,
    DeployResult,
    PoolDeployer,
    PoolUpdate,
    RevisionInfo,
    RolloutState,
)
from celeryops.core.config import DrainSettings, Target
from celeryops.core.errors import EXIT_DEPLOY, EXIT_USAGE, UserError
from celeryops.core.events import Event, Notice, PoolStep, PoolStepName, RunFinished, RunOutcome
from celeryops.ops.journal import PHASES, AsyncJournal, Phase, Run
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.pool.rules import Plan, PoolNow, pool_now
from celeryops.ops.run.runner import Runner

T = TypeVar("T")
GONE_WAIT = 60.0  # seconds to wait for a retired revision's workers to leave (Cloud Run: SIGKILL 10 s after SIGTERM)


@dataclass(frozen=True)
class Words:
    """How the operator reads a flow on the pool: its ``name`` (``overlap deploy``, ``canary deploy``, ``overlap
    rollback``), whether it is a ``rollback`` (routed back to an existing revision: its outcomes, its ``target``
    events), the revision it moves away from (``old``) and the one it moves to (``new``)."""

    name: str = "deploy"
    old: str = "the old revision"
    new: str = "the new revision"
    rollback: bool = False

    @property
    def kind(self) -> str:
        """``rollback`` or ``deploy``: what the run is, in the sentences that name it."""
        return "rollback" if self.rollback else "deploy"

    @classmethod
    def of(cls, run: Run) -> Words:
        """The words of ``run``: its strategy's and its kind's (a rollback moves from the deployed revision back to
        the previous one)."""
        if run.kind == "rollback":
            return cls(f"{run.strategy} rollback", "the deployed revision", "the previous revision", rollback=True)
        return cls(f"{run.strategy} deploy")


#: A rollback run's outcomes (the ``--json`` events a drain rollback ends with).
ROLLBACK_OUTCOMES: dict[str, RunOutcome] = {"deployed": "rolled_back", "deploy_failed": "rollback_failed"}


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


@dataclass(frozen=True)
class Ending:
    """How a step of a flow ended: the run's outcome and exit code, one sentence, and (for ``abort``) what was done
    (``action``)."""

    outcome: RunOutcome
    code: int
    message: str
    action: str = "nothing"
    targets: tuple[Any, ...] = ()
    logs_url: str = ""


class Refused(Exception):
    """Cloud Run refused a pool update before anything changed: the run ends aborted."""


class Stop(Exception):
    """The flow cannot go on (the new revision failed to start or to consume): :func:`steps.attempt` retires the new
    revision of ``plan``, then ends the run with this."""

    def __init__(self, message: str, plan: Plan, *, code: int = EXIT_DEPLOY, outcome: RunOutcome = "deploy_failed",
                 logs_url: str = "") -> None:
        super().__init__(message)
        self.message, self.plan, self.code, self.outcome, self.logs_url = message, plan, code, outcome, logs_url


@dataclass
class Pool:
    """Worker pool ``target`` in run ``run_id`` of run context ``ctx``; ``settings``: the run's drain settings (how a
    revision's drain polls, its max wait, which is also how long a revision may take to consume), ``forget``: workers
    the run treats as gone."""

    ctx: RunContext
    target: Target
    run_id: str
    words: Words = field(default_factory=Words)
    settings: DrainSettings = field(default_factory=DrainSettings)
    forget: tuple[str, ...] = ()
    # A retirement that finds the new revision busy past max wait keeps it held (a canary: its workers never consume
    # again) instead of giving both revisions their consumers back (the overlap).
    keep_new_held: bool = False
    denied: DeployError | None = None  # the pool could not be read for want of a permission (:meth:`read`)
    completed: tuple[float, int] | None = None  # the last ``progress`` step's (time, tasks completed)

    @classmethod
    def of(cls, ctx: RunContext, run: Run, target: Target | None = None, words: Words | None = None, *,
           keep_new_held: bool = False) -> Pool:
        """The pool of ``run`` (its one target unless given), read as ``words`` (default: the run's)."""
        return cls(ctx, target or target_of(ctx, run), run.id, words or Words.of(run), run.drain_settings(),
                   tuple(run.settings.get("forget") or ()), keep_new_held)

    # -- what it runs in ---------------------------------------------------------------------------------------

    @property
    def runner(self) -> Runner:
        return self.ctx.runner

    @property
    def journal(self) -> AsyncJournal:
        return self.ctx.runner.journal.aio

    def emit(self, event: Event) -> None:
        self.ctx.emit(event)

    async def run(self) -> Run:
        """The run as the journal holds it now."""
        return await self.ctx.journaled(self.run_id)

    async def written_ahead(self, intent: str, payload: dict[str, Any], act: Callable[[], Awaitable[T]],
                            **kw: Any) -> T:
        """:meth:`RunContext.written_ahead` for this run."""
        return await self.ctx.written_ahead(self.run_id, intent, payload, act, **kw)

    @property
    def deployer(self) -> PoolDeployer:
        deployer = self.ctx.rollouts.deployer(self.target)
        if not all(hasattr(deployer, name) for name in ("update_worker_pool", "validate_pool_update", "revisions")):
            raise UserError(f"The deployer of target {self.target.name!r} cannot run revisions side by side: nothing "
                            "was changed; deploy it with --strategy drain.", EXIT_USAGE)
        return cast(PoolDeployer, deployer)

    def finish(self, ending: Ending) -> RunFinished:
        """The run's end event from ``ending`` (a rollback's outcomes named as such)."""
        outcome = ROLLBACK_OUTCOMES.get(ending.outcome, ending.outcome) if self.words.rollback else ending.outcome
        return self.ctx.finish(outcome, ending.code, ending.message, targets=ending.targets,
                               logs_url=ending.logs_url)

    # -- the run's phases and steps ----------------------------------------------------------------------------

    async def phase(self, to: Phase, reason: str | None = None) -> None:
        """Move the run to ``to`` unless it is there already (a resumed run may be)."""
        if (await self.run()).phase != to:
            await self.runner.advance(self.run_id, to, reason=reason)

    async def past(self, phase: Phase) -> bool:
        return PHASES.index((await self.run()).phase) >= PHASES.index(phase)

    def step(self, step: PoolStepName, plan: Plan, message: str = "", **more: Any) -> None:
        """The ``overlap`` event of ``step`` (``--json``, the console's revision rows); its peak is the most the run
        can reach."""
        self.emit(PoolStep(step=step, target=plan.target, old_revision=plan.old, new_revision=plan.new,
                           peak=plan.highest, message=message, **more))

    # -- the pool as Cloud Run reports it ----------------------------------------------------------------------

    async def state(self) -> RolloutState:
        return await self.deployer.current(self.target)

    async def read(self) -> PoolNow | None:
        """The pool now, or None when Cloud Run did not say (a warning is emitted; :attr:`denied` set when a
        permission is missing)."""
        deployer = self.deployer
        try:
            state, revisions = await asyncio.gather(deployer.current(self.target), deployer.revisions(self.target))
        except DeployError as err:
            self.denied = err if err.permission else None
            self.emit(Notice(level="warning", message=f"Cloud Run did not say how the pool is: {err}"))
            return None
        return pool_now(state, revisions)

    async def update(self, change: PoolUpdate) -> DeployResult:
        """One update of the pool, followed until Cloud Run serves it (the deployer's progress events emitted)."""
        return await self.deployer.update_worker_pool(self.target, change, self.emit)

    async def settled(self) -> None:
        """Wait until no rollout of the pool is in progress (an update sent before an interruption), up to the
        target's timeout."""
        deadline = time.monotonic() + self.target.timeout
        while (await self.state()).reconciling:
            if time.monotonic() > deadline:
                raise UserError(f"{self.target.display} is still rolling out after {self.target.timeout:g} s: nothing "
                                "more was changed; watch it in the Cloud console, then run `celeryops resume` or "
                                "`celeryops abort` again.", EXIT_DEPLOY)
            await asyncio.sleep(1.0)

    async def revision_info(self, revision: str) -> RevisionInfo | None:
        try:
            found = [r for r in await self.deployer.revisions(self.target) if r.name == revision]
        except DeployError:
            return None
        return found[0] if found else None

    async def image_of(self, revision: str) -> str:
        info = await self.revision_info(revision)
        return info.image if info is not None else ""

    async def logs_url(self, revision: str) -> str:
        info = await self.revision_info(revision)
        return info.log_uri if info is not None else ""

    # -- the workers, by revision (the fence registry) ---------------------------------------------------------

    async def registry(self) -> dict[str, tuple[str, ...]]:
        """Live plugin workers by revision."""
        coord = self.runner.coord
        if coord is None:
            return {}
        from celeryops.fence import by_revision, plugin_workers

        return by_revision(await asyncio.to_thread(plugin_workers, coord, self.runner.fleet_name))

    async def queues_of(self, *revisions: str) -> set[str]:
        """Every queue the live plugin workers of ``revisions`` consume or hold."""
        coord = self.runner.coord
        if coord is None:
            return set()
        from celeryops.fence import plugin_workers

        infos = await asyncio.to_thread(plugin_workers, coord, self.runner.fleet_name)
        return {q for info in infos.values() if info.revision in revisions for q in info.queues}

    def scope(self, *revisions: str) -> Callable[[], Awaitable[set[str]]]:
        """The workers of ``revisions`` by their registry entries, expired ones too: a worker whose heartbeat
        stopped is still that revision's, and leaves a drain only by the drain's evidence."""
        async def members() -> set[str]:
            coord = self.runner.coord
            if coord is None:
                return set()
            from celeryops.fence import listed_workers

            infos = await asyncio.to_thread(listed_workers, coord, self.runner.fleet_name)
            return {host for host, info in infos.items() if info.revision in revisions}

        return members

    async def instances(self, *revisions: str) -> dict[str, int]:
        """Live instances of ``revisions`` as the fence registry sees them, one per instance id ({} without a
        registry): what runs, not Cloud Run's ``desired_min_instance_count``, which worker-pool revisions may report
        as 0."""
        coord = self.runner.coord
        if coord is None:
            return {}
        from celeryops.fence import instances_by_revision, plugin_workers

        live = instances_by_revision(await asyncio.to_thread(plugin_workers, coord, self.runner.fleet_name))
        return {revision: live.get(revision, 0) for revision in revisions}

    async def wait_gone(self, *revisions: str) -> None:
        """Until no live worker of ``revisions`` is left (taken away: they stop), at most :data:`GONE_WAIT` s."""
        deadline = time.monotonic() + GONE_WAIT

        async def left() -> list[str]:
            registry = await self.registry()
            return [name for revision in revisions for name in registry.get(revision, ())]

        while (still := await left()) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        if still:
            self.emit(Notice(level="warning", message=f"Workers of revision {', '.join(revisions)} are still "
                                                      f"registered {GONE_WAIT:g} s after their instances were taken "
                                                      f"away: {', '.join(still)}; check the pool in the Cloud "
                                                      "console."))


def target_of(ctx: RunContext, run: Run) -> Target:
    """The one worker pool ``run`` moves (its ``targets`` setting)."""
    names = list(run.settings.get("targets") or [])
    if len(names) != 1:
        raise UserError(f"Run {run.id} names no single worker pool: nothing was changed.", EXIT_USAGE)
    return ctx.config.target(str(names[0]))


__all__ = ["GONE_WAIT", "ROLLBACK_OUTCOMES", "Ending", "Pool", "Refused", "Stop", "Words", "cap", "target_of"]
