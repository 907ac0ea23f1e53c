"""Moving every instance of a worker pool from one revision to another without a pause, on the steps of
:mod:`celeryops.ops.run.pool.steps`: :func:`hand_over` (the new revision consumes, the old one drains, then
:func:`cut_over`), :func:`retire_new` (the way back: the old revision consumes again, the new one is held, drained
and taken away), and :func:`attempt`, which turns a flow that cannot go on into the new revision's retirement.

The overlap strategy is :func:`~celeryops.ops.run.pool.steps.scale_up` then :func:`hand_over`; the canary's promotion
ends with :func:`hand_over`; a rollback of a worker pool (:func:`move`) is the same with an existing revision.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

from celeryops.adapters.deploy.base import DeployError, PoolUpdate, short_revision
from celeryops.core.config import Target
from celeryops.core.errors import EXIT_DEPLOY, EXIT_OK, EXIT_TIMEOUT, UserError
from celeryops.core.events import FleetBack, Notice, RunFinished, StageStarted, TargetDeployed, TargetRolledBack
from celeryops.core.splits import served_counts
from celeryops.ops.drain.engine import NoWorkers
from celeryops.ops.journal import OVERLAP_CUTOVER, OVERLAP_REVERT, Run
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.pool.pool import Ending, Pool, Refused, Stop, cap
from celeryops.ops.run.pool.progress import ticking
from celeryops.ops.run.pool.recover import Next, abort_plan, guarded, recovery_step, taken_over, unforced
from celeryops.ops.run.pool.rules import Destination, Plan, Step, progress_of, stopped_map
from celeryops.ops.run.pool.steps import (
    Drained,
    drain_old,
    drain_revision,
    drain_revisions,
    hold,
    release,
    resumed,
    scale_up,
    wait_new,
)
from celeryops.ops.run.recovery import RecoveryPlan
from celeryops.ops.run.rollback_plan import RollbackStep, label_of, settings_of
from celeryops.ops.run.runner import uncut

#: Where a flow on two revisions starts: the scale-up, waiting for the new revision, a promotion written ahead, the
#: old revision's drain.
Start = Literal["up", "wait", "promote", "drain"]


async def attempt(pool: Pool, work: Callable[[], Awaitable[Ending]]) -> Ending:
    """``work``, ended in one sentence when it cannot go on: Cloud Run refused the scale-up (nothing changed), or
    the new revision failed to start or to consume (it is retired first)."""
    try:
        return await work()
    except Refused as refused:
        return Ending("deploy_failed", EXIT_DEPLOY, str(refused))
    except Stop as stop:
        sentence, _done = await retire_new(pool, stop.plan)
        return Ending(stop.outcome, stop.code, f"{stop.message} {sentence}", logs_url=stop.logs_url)


async def switch(pool: Pool, start: Start, plan: Plan | None = None) -> Ending:
    """The overlap's sequence from ``start``: the new revision up beside the old one (as many instances), then
    :func:`hand_over`. ``plan``: the run's recorded plan (a resumed flow)."""
    async def work() -> Ending:
        now = await scale_up(pool, pool_destination(await pool.run())) if start == "up" or plan is None \
            else await resumed(pool, plan)
        return await hand_over(pool, now, skip_wait=start == "drain")

    return await attempt(pool, work)


async def hand_over(pool: Pool, plan: Plan, *, skip_wait: bool = False, late: str = "") -> Ending:
    """The new revision consumes (unless ``skip_wait``: it did already), only the old revision's workers stop and
    are drained, then :func:`cut_over`. The old revision not idle within max wait: its consumers come back and the
    new revision is retired (``late``: when its drain began, in the sentence)."""
    async with ticking(pool, plan):
        if not skip_wait:
            await wait_new(pool, plan)
        held = await drain_old(pool, plan)
    if held is not None:
        sentence, _done = await retire_new(pool, plan)
        return Ending("timeout", EXIT_TIMEOUT, f"{cap(pool.words.old)} {plan.old_names} was not idle within "
                      f"{pool.settings.max_wait:g} s ({held}){late}: nothing was killed, its consumers were restored; "
                      f"{sentence}")
    return await cut_over(pool, plan)


async def cut_over(pool: Pool, plan: Plan) -> Ending:
    """Every instance to the new revision at the original count (written ahead as ``overlap_cutover``; the old
    workers, idle and held, are taken away), the fence lifted once they left, the fleet verified, the run done."""
    w, target, run_id = pool.words, pool.target, pool.run_id
    pool.emit(StageStarted(stage="rollback" if w.rollback else "deploy",
                           detail=f"every instance of {target.name} to {plan.new}"))
    await pool.phase("cutting_over")
    await hold(pool)  # the old revision stays held even if this process dies meanwhile
    state = await pool.state()
    if state.served != {plan.new: 100} or state.instance_count != plan.count:
        split = (("", 100),) if short_revision(state.latest_ready_revision) == plan.new else ((plan.new, 100),)
        pool.step("cutting_over", plan, f"every instance moves to {plan.new}: {plan.count} in all",
                  instances=await pool.instances(*plan.revisions), split=state.served)
        # A rollback pins the previous revision by name: recorded as celeryops' own, so the next deploy moves on.
        owner = f"rollback run {run_id}" if w.rollback and split[0][0] else ""
        try:
            await pool.written_ahead(OVERLAP_CUTOVER, plan.payload(
                before={"count": state.instance_count, "served": state.served}, split=[list(e) for e in split],
                count_after=plan.count),
                lambda: pool.update(PoolUpdate(instance_count=plan.count, split=split, owned_by=owner)))
        except DeployError as err:
            return Ending("deploy_failed", EXIT_DEPLOY, f"Could not move every instance to {plan.new}: {err} "
                          f"{cap(w.old)} {plan.old_names} is idle and held, {plan.new} consumes: nothing is lost; run "
                          "`celeryops resume` to finish the cutover.", action="ask", logs_url=err.logs_url)
    await pool.wait_gone(*plan.olds)
    pool.step("cut_over", plan, f"{plan.count} instance(s) of {plan.new} serve; {plan.old_names} was retired",
              instances=await pool.instances(*plan.revisions), split={plan.new: 100})
    await pool.runner.lift_fence(run_id)
    await pool.phase("deployed")
    kind = TargetRolledBack if w.rollback else TargetDeployed  # a rollback's: "rolled_back": true, its image read
    image = plan.image or (await pool.image_of(plan.new) if w.rollback else "")
    deployed = kind(target=target.name, revision=plan.new, image=image, previous_revision=plan.old,
                    console_url=target.console_url, logs_url=await pool.logs_url(plan.new))
    pool.emit(deployed)
    pool.emit(StageStarted(stage="verify", detail="waiting for the fleet to answer"))
    workers = await pool.ctx.rollouts.fleet_back()
    pool.emit(FleetBack(workers=workers))
    await pool.runner.advance(run_id, "done")
    run = await pool.run()
    what = f"Release {run.release} deployed" if run.release else f"{target.name} moved to {plan.new}"
    if w.rollback:
        what = f"Rolled back ({target.name} serves revision {plan.new})"
    return Ending("deployed", EXIT_OK, f"{what} without a pause: {plan.count} instance(s) of {plan.new} serve "
                  f"and {plan.old_names} was retired once idle; {len(workers)} worker(s) consume.", action="cutover",
                  targets=(deployed,))


async def finish_cutover(pool: Pool, plan: Plan) -> Ending:
    """Recovery of a cutover that was begun: follow it if it still rolls out; if it never took effect, make sure
    the old revision is idle again (its fence may have expired meanwhile), then send it again."""
    await pool.settled()
    state = await pool.state()
    if state.served != {plan.new: 100} or state.instance_count != plan.count:
        prior = progress_of(await pool.run()).old_stopped
        w = pool.words
        pool.emit(StageStarted(stage="drain", detail=f"{w.old} {plan.old_names}, before the cutover again"))
        drained = await drain_revisions(pool, tuple(plan.olds), exempt=plan.new, prior=prior)
        if not drained.idle:
            await release(pool, drained)
            return Ending("deploy_failed", EXIT_DEPLOY, f"The cutover to {plan.new} never took effect and "
                          f"{w.old} {plan.old_names} is busy again ({drained.held_by}): nothing was killed, both "
                          "consume; "
                          "run `celeryops resume` again later.", action="ask")
    return await cut_over(pool, plan)


async def retire_new(pool: Pool, plan: Plan) -> tuple[str, bool]:
    """Retire the new revision (written ahead as ``overlap_revert``): the old revision's consumers back, the new
    revision's workers held and drained, one update back to the old revision, the fence lifted once they left.
    Returns one sentence and whether it was retired (False: the new revision stayed busy past max wait: it stays
    held when the pool says so (:attr:`Pool.keep_new_held`, a canary's), else both consume; the run stays open)."""
    run = await pool.run()
    progress = progress_of(run)
    w, run_id = pool.words, pool.run_id
    pool.emit(StageStarted(stage="retire", detail=f"{w.new} {plan.new}"))
    await pool.phase("retiring")
    reverts = run.intents(OVERLAP_REVERT)
    if reverts and run.settlement(reverts[-1].seq) is None:
        # Settled below by its number in this journal: a run only the fleet's Redis held (its operator's machine
        # is gone) numbers its records as Redis does until a write brings it here; the note makes that write.
        await pool.journal.note(run_id, {"resumes": OVERLAP_REVERT})
        intent = (await pool.run()).intents(OVERLAP_REVERT)[-1].seq
    else:
        state = await pool.state()
        intent = await pool.journal.intend(run_id, OVERLAP_REVERT, plan.payload(
            before={"count": state.instance_count, "served": state.served}, split=[list(e) for e in plan.back_split],
            count_after=plan.count))
    pool.step("retiring", plan, f"{plan.new} is retired: {plan.old_names} consumes again first")
    await pool.runner.lift_fence(run_id)
    if progress.old_stopped:
        await pool.runner.restore(run, stopped_map(progress.old_stopped))
    pool.step("old_restored", plan, f"the workers of {plan.old_names} consume again")
    await pool.settled()  # an update still rolling out ends first (the old revision consumes meanwhile)
    drained: Drained | None = None
    if (await pool.registry()).get(plan.new) or progress.new_stopped:
        pool.step("holding_new", plan, f"the workers of {plan.new} stop taking tasks and are drained")
        try:
            drained = await drain_revision(pool, plan.new, exempt=plan.old, prior=progress.new_stopped)
        except NoWorkers:
            # Registered but silent: if the pool no longer runs the new revision (an update back that an
            # interruption cut short already took its instances away), there is nothing left to hold.
            if (await pool.state()).served.get(plan.new):
                raise
            pool.emit(Notice(level="info", message=f"The workers of {plan.new} are gone with its instances: "
                                                   "nothing is left to hold."))
    if drained is not None and not drained.idle and pool.keep_new_held:
        await uncut(hold(pool))  # held: it takes no task, its running ones finish
        sentence = (f"{w.new} {plan.new} is still busy ({drained.held_by}): its workers take no new "
                    f"task and finish what they run; {plan.old_names} consumes; run `celeryops abort` again to "
                    f"finish taking {plan.new} away once they are idle.")
        pool.step("holding_new", plan, sentence)
        return sentence, False
    if drained is not None and not drained.idle:
        await release(pool, drained)
        await pool.journal.settle(intent, {"ok": False, "kept": "both"})
        await pool.phase("overlapping", reason=f"{w.new} stayed busy")
        sentence = (f"{w.new} {plan.new} stayed busy ({drained.held_by}), so both revisions "
                    f"keep consuming at {plan.peak} instances: nothing was lost or stopped; run `celeryops "
                    f"abort` later to retire it, or `celeryops resume` to go on with the {w.kind}.")
        pool.step("kept_both", plan, sentence)
        return sentence, False
    await hold(pool)  # the new revision stays held even if this process dies meanwhile
    state = await pool.state()
    if served_counts(state.instance_count or 0, state.served) != plan.olds:
        try:
            # Pinned by name, by celeryops (each old cohort at its count): recorded as its own, so the next deploy
            # moves on without asking.
            await pool.update(PoolUpdate(instance_count=plan.count, split=plan.back_split,
                                         owned_by=f"{w.kind} run {run_id}"))
        except DeployError as err:
            await pool.runner.lift_fence(run_id)
            raise UserError(f"Could not put {pool.target.display} back on {plan.old_names}: {err} {cap(w.old)} "
                            f"consumes, so does {plan.new}: nothing is lost; run `celeryops abort` again.",
                            EXIT_DEPLOY) from None
    await pool.wait_gone(plan.new)
    await pool.runner.lift_fence(run_id)
    await pool.journal.settle(intent, {"ok": True})
    sentence = (f"{w.new} {plan.new} was retired: {plan.count} instance(s) of {plan.old_names} serve, "
                f"pinned to {'them' if plan.cohorts else 'it'} by name.")
    pool.step("retired", plan, sentence, instances=await pool.instances(*plan.revisions), split=dict(plan.back_split))
    await pool.runner.advance(run_id, "aborted", reason=f"retired {plan.new}")
    return cap(sentence), True


async def go_on(pool: Pool, plan: Plan, step: Step, *, resume: bool) -> Ending:
    """The overlap's part of abort / resume (``step``: ``wait_new``, ``drain_old`` or ``retire``): wait for the new
    revision or drain the old one again (resume), or retire the new one."""
    if step in ("wait_new", "drain_old"):
        return await switch(pool, "wait" if step == "wait_new" else "drain", plan)
    sentence, done = await retire_new(pool, plan)
    if resume:  # the new revision failed to start, or a retirement was begun: the deploy did not happen
        return Ending("deploy_failed", EXIT_DEPLOY, f"The {pool.words.kind} did not take place: {sentence}")
    return Ending("aborted" if done else "deploy_failed", EXIT_OK if done else EXIT_DEPLOY, sentence,
                  action="retire" if done else "ask")


async def switched(pool: Pool, *, resume: bool) -> Ending:
    """Abort (``resume`` False) or resume a run of :func:`switch` (an overlap deploy, a rollback of a pool) by the
    pool's rules."""
    got = await recovery_step(pool, resume=resume)
    if isinstance(got, Ending):
        return got
    return await _next(pool, got, resume=resume)


async def _next(pool: Pool, got: Next, *, resume: bool) -> Ending:
    if got.step == "start" or got.plan is None:
        return await switch(pool, "up")
    if got.step == "cutover":
        return await finish_cutover(pool, got.plan)
    return await go_on(pool, got.plan, got.step, resume=resume)


async def move(ctx: RunContext, target: Target, destination: Destination, *, strategy: str, release: str | None,
               settings: Mapping[str, Any] | None = None) -> RunFinished:
    """A whole run of :func:`switch` (its lease held, its end said): pool ``target`` moved to ``destination``
    (a rollback: an existing revision) as ``strategy``'s run. Interrupted: the abort's rules, before the coroutine
    ends."""
    run = await open_pool_run(ctx, target, destination, strategy=strategy, release=release, settings=settings)
    pool = Pool.of(ctx, run, target)
    try:
        ending = await guarded(pool, lambda: switch(pool, "up"), lambda: switched(pool, resume=False))
    finally:
        await ctx.close()
    return pool.finish(ending)


async def move_back(ctx: RunContext, steps: Sequence[RollbackStep], strategy: str) -> RunFinished:
    """A rollback of one pool (``steps``: its one step), the overlap's way to the existing revision it goes back to:
    it comes up beside the deployed one and consumes, only the deployed revision's workers stop and are drained, then
    every instance moves to it at the original count, recorded as celeryops' own split. No pause, no image."""
    (step,) = steps
    return await move(ctx, step.target, Destination(step.revision), strategy=strategy, release=label_of(steps),
                      settings=settings_of(steps, strategy))


async def resume_switch(ctx: RunContext, run: Run) -> RunFinished:
    """``celeryops resume`` of a run of :func:`switch`: the rules' resume column (finish the cutover, go on, ...)."""
    pool = Pool.of(ctx, run)
    return pool.finish(await taken_over(pool, lambda: switched(pool, resume=True),
                                        lambda: switched(pool, resume=False)))


async def abort_switch(ctx: RunContext, run: Run, *, force_restore: bool = False) -> RecoveryPlan:
    """``celeryops abort`` of a run of :func:`switch`: the rules' abort column (retire the new revision, or finish a
    cutover that was begun). ``force_restore`` (``abort --restore``: the operator says the old revision serves) has
    nothing to decide here, where Cloud Run says which revision serves: it is said so, and the rules go on."""
    pool = Pool.of(ctx, run)
    unforced(pool, force_restore)
    return abort_plan(await taken_over(pool, lambda: switched(pool, resume=False),
                                       lambda: switched(pool, resume=False)))


def pool_destination(run: Run) -> Destination:
    """What the run moves the pool to (its ``new_revision`` setting; ``image`` None: an existing revision)."""
    image = run.settings.get("image")
    return Destination(str(run.settings.get("new_revision") or ""), str(image) if image else None)


async def open_pool_run(ctx: RunContext, target: Target, destination: Destination, *, strategy: str,
                        release: str | None, settings: Mapping[str, Any] | None = None) -> Run:
    """A new run of ``strategy`` that moves pool ``target`` to ``destination`` (the lease held; ``release_lease``
    after): its settings are what recovery and resume read."""
    drain = ctx.config.drain
    return await ctx.runner.open_run(release=release, settings={
        "strategy": strategy, "targets": [target.name], "new_revision": destination.revision,
        "image": destination.image, "queues": [], "forget": [], "interval": drain.interval,
        "streak": drain.streak, "max_wait": drain.max_wait, **dict(settings or {})})


__all__ = ["Start", "abort_switch", "attempt", "cut_over", "finish_cutover", "go_on", "hand_over", "move", "move_back",
           "open_pool_run", "pool_destination", "resume_switch", "retire_new", "switch", "switched"]

