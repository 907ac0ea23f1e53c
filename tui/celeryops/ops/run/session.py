"""One run of celeryops on one fleet, from preflight to done or aborted: :class:`RunSession`.

The console, the headless commands (``drain``, ``deploy``, ``rollback``, ``resume``, ``abort``) and the demo all
drive this same session. It is the run context (:class:`~celeryops.ops.run.context.RunContext`: the preflight, the
operator's review, the events, the journal phases, the end) with the entry points: a drain-only run, and the deploy
and rollback runs, each given to its strategy by the registry (:data:`celeryops.ops.run.strategies.STRATEGIES`, the
only switch).
Every interruption (task cancellation) follows the strategy's recovery rules before the session's coroutine ends:

- preflight / waiting for the operator: nothing was touched;
- stopping or draining: the runner restores the consumers it stopped;
- later: the strategy's rules decide with what the target really did.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from celeryops.core.config import DrainSettings, Target
from celeryops.core.errors import EXIT_BROKER, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, UserError
from celeryops.core.events import RunFinished
from celeryops.ops.journal import Run
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.kinds import owner_of
from celeryops.ops.run.recovery import RecoveryPlan
from celeryops.ops.run.rollback_plan import RollbackRequest
from celeryops.ops.run.strategies import strategy_of_targets


@dataclass(frozen=True)
class DrainRequest:
    """What a drain-only run should do (the ``celeryops drain`` flags); ``settings`` None: the config's."""

    queues: tuple[str, ...] = ()
    settings: DrainSettings | None = None
    forget: tuple[str, ...] = ()
    take_over: bool = False


@dataclass
class RunSession(RunContext):
    """The one orchestrator of a run: a run context with its entry points."""

    # -- drain-only runs -------------------------------------------------------------------------------------------

    async def drain(self, request: DrainRequest = DrainRequest()) -> int:
        """Preflight, the operator's go, then stop the consumers and wait until drained. Returns the exit code:
        0 drained (the consumers stay stopped), 3 timed out (restored), 4/5 preflight."""
        self.refuse_if_read_only("stop consumers")
        await self.require_operator("stop consumers")
        settings = request.settings or self.config.drain
        settings.validate()
        report = await self.preflight(self.fleet_checks(request.take_over))
        ended = await self.review(report, unreachable_exit=EXIT_BROKER)
        if ended is not None:
            return ended.exit_code
        outcome, _run = await self.runner.drain(queues=request.queues, settings=settings, forget=request.forget,
                                                take_over=request.take_over)
        return EXIT_OK if outcome == "drained" else EXIT_TIMEOUT

    # -- deploy runs -----------------------------------------------------------------------------------------------

    async def deploy(self, release: str, targets: tuple[Target, ...]) -> RunFinished:
        """The release to ``targets`` by their strategy (preflight, the operator's go, the run, its recovery)."""
        self.refuse_if_read_only("deploy")
        await self.require_operator("deploy")
        if not targets:
            raise UserError("No deploy target is configured: nothing was changed; add a [[targets]] table to "
                            "celeryops.toml (see the README).", EXIT_USAGE)
        return await strategy_of_targets(targets).deploy(self, release, targets)

    # -- recovery: resume and abort --------------------------------------------------------------------------------

    async def resume(self, run: Run | None = None) -> int:
        """Continue the fleet's interrupted run from its phase; returns the exit code. Who carries it on is its
        kind's or its strategy's to say (:func:`~celeryops.ops.run.kinds.owner_of`): a drain-only run drains again,
        a step of the autoscaler is finished or undone, a deploy or a rollback goes on by its strategy's rules."""
        self.refuse_if_read_only("resume the run")
        await self.require_operator("resume the run")
        run = run or self.runner.unfinished()
        if run is None:
            raise self.runner.no_open_run("nothing was resumed",
                                          "; start one with `celeryops drain` or `celeryops deploy`")
        return await owner_of(run).resume(self, run)

    async def abort(self, run: Run | None = None, *, force_restore: bool = False) -> RecoveryPlan:
        """Apply the recovery rules of its owner (:func:`~celeryops.ops.run.kinds.owner_of`: its kind's or its
        strategy's) to the fleet's unfinished run (restore what it stopped, undo what it changed, mark it aborted);
        with no open run, the runner's (a restore that was never confirmed)."""
        self.refuse_if_read_only("abort the run")
        await self.require_operator("abort the run")
        run = run or await asyncio.to_thread(self.runner.unfinished)
        if run is not None and not run.finished:
            return await owner_of(run).abort(self, run, force_restore=force_restore)
        decided, _ = await self.runner.abort(run=run, force_restore=force_restore)
        return decided

    async def rollback(self, request: RollbackRequest) -> RunFinished:
        """The targets back to what their last deploy replaced (or ``--to``), by their strategy
        (:class:`~celeryops.ops.run.rollback.Rollback`: what to go back to, preflight, the operator's go, the run)."""
        from celeryops.ops.run.rollback import Rollback

        return await Rollback(self).run(request)

    async def forget(self, name: str) -> None:
        self.refuse_if_read_only("forget a worker")
        await self.runner.forget(name)
