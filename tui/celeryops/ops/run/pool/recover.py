"""What every flow on a worker pool does alike around its steps: :func:`guarded` (an interruption applies the
flow's abort before it ends; any other failure gives stopped consumers back and leaves the run open),
:func:`taken_over` (``resume`` / ``abort`` of an interrupted run: its lease taken, the fleet's copy of its journal
brought here), and :func:`recovery_step`, the pool's rules up to the flow's own part (nothing to do, ask).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from celeryops.core.errors import EXIT_DEPLOY, EXIT_OK
from celeryops.core.events import Notice
from celeryops.ops.journal import OVERLAP_CUTOVER, OVERLAP_UP
from celeryops.ops.run.pool.pool import Ending, Pool
from celeryops.ops.run.pool.rules import ABORT, RESUME, Plan, Step, decide, progress_of, stopped_map
from celeryops.ops.run.recovery import Choice, RecoveryPlan
from celeryops.ops.run.runner import uncut

Work = Callable[[], Awaitable[Ending]]


async def guarded(pool: Pool, work: Work, abort: Work) -> Ending:
    """``work``, and when it is interrupted ``abort`` (the flow's abort rules) before the interruption goes on (unless
    the operator detached). Any other failure gives stopped consumers back and leaves the run open."""
    try:
        return await work()
    except asyncio.CancelledError:
        if not pool.runner.detached:
            pool.emit(Notice(level="warning", message=f"Interrupted: applying the {pool.words.name}'s recovery rules "
                                                      "(those of `celeryops abort`) before exiting."))
            with contextlib.suppress(Exception):  # the interruption is what the caller must see
                await uncut(abort())
        raise
    except Exception as exc:
        with contextlib.suppress(Exception):
            await uncut(after_error(pool, exc))
        raise


async def taken_over(pool: Pool, work: Work, abort: Work) -> Ending:
    """``resume`` or ``abort`` of the interrupted run of ``pool``: its lease taken (refused while its owner lives),
    the fleet's copy of its journal brought here, :func:`guarded` ``work``, the lease given back."""
    runner = pool.runner
    run = await pool.run()
    await runner.hold(run)
    try:
        # The fleet's copy first: the records another machine added (a resume or abort from there) are then in what
        # this journal returns (else its own older copy of a run it started hides them).
        journal = runner.journal
        await asyncio.to_thread(journal.bring_home, pool.run_id, journal.fleet_copy.store_for(run.fleet))
        return await guarded(pool, work, abort)
    finally:
        await pool.ctx.close()


async def after_error(pool: Pool, exc: Exception) -> None:
    """A failure the flow did not expect: a run that never touched the pool ends aborted; else nothing stays
    stopped and the run stays open for ``abort`` / ``resume``."""
    current = await pool.run()
    if current.finished:
        return
    if not current.intents(OVERLAP_UP):
        await pool.runner.advance(pool.run_id, "aborted", reason=f"error: {exc}")
        return
    await give_back(pool)
    w = pool.words
    pool.emit(Notice(level="error", message=f"The {w.name} stopped on an error; run {pool.run_id} stays open with "
                                            f"nothing stopped: `celeryops abort` retires {w.new}, `celeryops resume` "
                                            "goes on."))


async def give_back(pool: Pool) -> None:
    """Every consumer the run stopped consumes again (the fence first); not once a cutover was begun (the old
    revision's workers, idle and held, are being taken away: they must not take tasks)."""
    run = await pool.run()
    if run.finished or run.intents(OVERLAP_CUTOVER):
        return
    stopped = run.stopped_consumers()
    await pool.runner.lift_fence(pool.run_id)
    if stopped:
        await pool.runner.restore(run, stopped_map(stopped))


@dataclass(frozen=True)
class Next:
    """What the pool's rules leave to the flow: ``start`` (``plan`` None: the scale-up again), ``wait_new``,
    ``drain_old``, ``retire`` or ``cutover``."""

    step: Step
    plan: Plan | None


async def recovery_step(pool: Pool, *, resume: bool) -> Ending | Next:
    """Abort (``resume`` False) or resume the run of ``pool`` by the pool's rules, from its journal and the pool now:
    what every flow of two revisions does alike (nothing to do, ask), else the :class:`Next` step for the flow
    (``start``, ``wait_new``, ``drain_old``, ``retire``, ``cutover``: finish a cutover that was begun)."""
    run = await pool.run()
    plan = progress_of(run).plan
    now = None if plan is None else await pool.read()
    decision = decide(run, now, resume=resume, denied=pool.denied)
    pool.emit(Notice(level="info", message=decision.explanation))
    if decision.step == "done":
        return Ending("aborted", EXIT_OK, decision.explanation)
    if decision.step == "nothing":
        await pool.runner.advance(pool.run_id, "aborted", reason="abort: nothing to undo")
        return Ending("aborted", EXIT_OK, decision.explanation)
    if decision.step == "ask":
        await give_back(pool)
        return Ending("deploy_failed", EXIT_DEPLOY, decision.explanation, action="ask")
    return Next(decision.step, plan)


def unforced(pool: Pool, force_restore: bool) -> None:
    """``abort --restore`` (the operator says the old revision serves) decides a drain deploy whose rollout is
    unknown; on a pool, Cloud Run says which revision serves: said so, and the pool's rules decide."""
    if force_restore:
        pool.emit(Notice(level="info", message=f"--restore decides a drain deploy whose rollout is unknown; run "
                                               f"{pool.run_id} moves a worker pool, whose revisions Cloud Run "
                                               "reports: its recovery rules decide from them."))


def abort_plan(ending: Ending) -> RecoveryPlan:
    """What ``abort`` did, as the recovery plan it returns (``ask`` when it could not finish)."""
    if ending.code != EXIT_OK:
        return RecoveryPlan("ask", {}, ending.message, [ABORT, RESUME])
    return RecoveryPlan(ending.action, {}, ending.message)  # type: ignore[arg-type]


def pool_choices(decided: RecoveryPlan, *, resume: str, detail: str, retire: str, cutover: str) -> tuple[Choice, ...]:
    """What the recovery view offers for an interrupted run of two revisions on a pool: ``resume`` (``detail``: what it
    does), then the abort, labelled by what it would do (``retire`` the new revision, or finish the ``cutover``)."""
    label = {"retire": retire, "cutover": cutover}.get(decided.action, "Abort (nothing to undo)")
    return Choice("resume", resume, detail), Choice("abort", label, decided.explanation)


__all__ = ["Next", "abort_plan", "after_error", "give_back", "guarded", "pool_choices", "recovery_step", "taken_over",
           "unforced"]
