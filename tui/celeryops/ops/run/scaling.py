"""The autoscaler's steps on a Cloud Run worker pool, each a run of its own (kind ``autoscale``) under the fleet's
lease and written ahead in the journal, and their recovery (:class:`Scaling`).

- **Add a cohort** (:meth:`Scaling.add`): one update names a new revision of the same image up front and gives every
  revision an exact count (:func:`celeryops.core.splits.split_for`): the instances that run keep running, the new
  ones start. Phases ``preflight -> scaling -> done``.
- **Take a cohort away** (:meth:`Scaling.remove`): an idle cohort's workers alone stop taking tasks (the fence scoped
  to its revision, their consumers cancelled by name) and are confirmed idle by the drain's rules (within
  ``drain_timeout``); only then one update lowers that revision's count (to 0, or to what is still needed), so the
  instances Cloud Run picks are idle and held; once they left, the fence is lifted and the cohort's remaining workers
  consume again. A cohort that got busy meanwhile is given back at once (nothing removed, nothing killed). Phases
  ``preflight -> stopping -> draining -> drained -> scaling -> done``. Every other cohort consumes throughout.
- **Recovery** (:meth:`Scaling.recover`: ``celeryops abort`` / ``resume``, the next ``celeryops autoscale``, an
  interruption): a pool update begun is followed to its end (never undone: what it took away was idle and held),
  then the fence is lifted and every stopped consumer whose worker is still there consumes again.

The split is recorded as celeryops' own, so a deploy (drain strategy) moves every instance to its new revision
without asking, at the count in force then.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass

from celeryops.adapters.deploy.base import DeployError, PoolUpdate
from celeryops.core.autoscale import AutoscaleSettings
from celeryops.core.config import Target
from celeryops.core.errors import EXIT_OK, EXIT_USAGE, UserError
from celeryops.core.events import Event
from celeryops.core.scaleevents import AutoscaleStep, ScaleStepName
from celeryops.core.splits import counts_of
from celeryops.ops.drain.engine import NoWorkers
from celeryops.ops.journal import SCALE_POOL, Phase, Run
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.pool.pool import GONE_WAIT, Ending, Pool, Words
from celeryops.ops.run.pool.recover import taken_over
from celeryops.ops.run.pool.rules import Destination
from celeryops.ops.run.pool.steps import drain_revision, hold, scale_to
from celeryops.ops.run.recovery import ABORT, Choice, RecoveryPlan, Rollout, describe, plan
from celeryops.ops.run.runner import Runner, uncut


@dataclass(frozen=True)
class StepOutcome:
    """How a step ended: ``changed`` (the pool's counts are now ``counts``), one sentence, the run it was."""

    changed: bool
    message: str
    counts: dict[str, int]
    run_id: str = ""


def cohort_name(target: Target, now: float | None = None) -> str:
    """A new cohort's revision name, chosen up front: ``<pool>-as<MMDDHHMMSS>-<4 hex>`` (Cloud Run wants a
    revision's name to start with its resource's)."""
    stamp = time.strftime("%m%d%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{target.resource}-as{stamp}-{secrets.token_hex(2)}"


def nonzero(counts: Mapping[str, int]) -> dict[str, int]:
    return {rev: n for rev, n in counts.items() if n > 0}


WORDS = Words(name="autoscale step", old="the cohort", new="the new cohort")


class Scaling:
    """The steps of the autoscaler on ``target`` in run context ``ctx`` (see the module), on the pool's public steps
    (:mod:`celeryops.ops.run.pool.steps`)."""

    def __init__(self, ctx: RunContext, target: Target, settings: AutoscaleSettings) -> None:
        self.ctx = ctx
        self.target = target
        self.settings = settings

    @property
    def runner(self) -> Runner:
        return self.ctx.runner

    def emit(self, event: Event) -> None:
        self.ctx.emit(event)

    def _step(self, step: ScaleStepName, run: Run | None, message: str, revision: str = "", count: int = 0) -> None:
        self.emit(AutoscaleStep(step=step, target=self.target.name, revision=revision, count=count,
                                run_id=run.id if run else "", message=message))

    async def _open(self, step: str, **more: object) -> tuple[Run, Pool]:
        """A new step run, the fleet's lease held for it (LeaseHeld or a UserError when another run holds the
        fleet: nothing changed), and the pool in it."""
        drain = self.ctx.config.drain
        run = await self.runner.open_run(release=None, settings={
            "kind": "autoscale", "strategy": "drain", "step": step, "targets": [self.target.name], "queues": [],
            "forget": [], "interval": min(drain.interval, max(0.5, self.settings.interval)), "streak": drain.streak,
            "max_wait": self.settings.drain_timeout, "autoscale": self.settings.to_dict(), **more})
        return run, Pool.of(self.ctx, run, self.target, WORDS)

    async def _scale(self, pool: Pool, before: Mapping[str, int], after: Mapping[str, int], *,
                     new: Destination | None = None) -> str:
        """One update to exactly ``after`` (written ahead as ``scale_pool``, recorded as celeryops' own split); ""
        when Cloud Run serves it, else why it refused."""
        wanted = nonzero(after)
        payload = {"target": self.target.name, "before": dict(before), "after": wanted, "count": sum(wanted.values()),
                   "revision": new.revision if new is not None else ""}
        try:
            if wanted:
                await scale_to(pool, wanted, intent=SCALE_POOL, payload=payload, new=new,
                               owned_by=f"autoscale run {pool.run_id}")
            else:  # no instance at all: the count goes to 0, the split stays as it is
                await pool.written_ahead(SCALE_POOL, payload, lambda: pool.update(PoolUpdate(instance_count=0)))
        except DeployError as err:
            return str(err)
        return ""

    # -- add a cohort ------------------------------------------------------------------------------------------

    async def add(self, before: Mapping[str, int], add: int) -> StepOutcome:
        """A new cohort of ``add`` instances (a new revision of the pool's image) beside the cohorts ``before``
        (revision -> count, as set now)."""
        revision = cohort_name(self.target)
        after = {**nonzero(before), revision: add}
        run, pool = await self._open("out", revision=revision, add=add)
        try:
            return await uncut(self._add(run, pool, before, after, revision))
        finally:
            await uncut(self.runner.release_lease())  # a stop that cancels the step still gives it back

    async def _add(self, run: Run, pool: Pool, before: Mapping[str, int], after: dict[str, int],
                   revision: str) -> StepOutcome:
        add = after[revision]
        self._step("adding", run, f"adding cohort {revision} of {add} instance(s): {sum(after.values())} in all",
                   revision, add)
        await pool.phase("scaling")
        image = (await pool.state()).image
        why = await self._scale(pool, before, after, new=Destination(revision, image))
        if why:
            await pool.phase("aborted", reason="the pool update was refused")
            self._step("given_up", run, f"Cloud Run did not add cohort {revision}: {why}", revision, add)
            return StepOutcome(False, why, dict(before), run.id)
        await pool.phase("done")
        self._step("added", run, f"cohort {revision} of {add} instance(s) runs", revision, add)
        return StepOutcome(True, f"added cohort {revision}", after, run.id)

    # -- take a cohort away ------------------------------------------------------------------------------------

    async def remove(self, before: Mapping[str, int], revision: str, keep: int) -> StepOutcome:
        """Drain cohort ``revision`` alone, then lower its count to ``keep`` (0: it goes), the others as ``before``.
        Interrupted while draining: its workers consume again (nothing removed); once the update is sent: finished."""
        count = before.get(revision, 0)
        run, pool = await self._open("in", revision=revision, keep=keep, before=dict(before))
        try:
            self._step("draining", run, f"the workers of cohort {revision} stop taking tasks and are confirmed "
                       "idle; every other cohort consumes", revision, count)
            try:
                await pool.phase("stopping")  # interrupted from here on: given back, the run ends aborted
                drained = await drain_revision(pool, revision, phases=True)
            except asyncio.CancelledError:
                await uncut(self._give_back(pool, "interrupted"))
                self._step("restored", run, f"interrupted: the workers of cohort {revision} consume again, nothing "
                           "was removed", revision, count)
                raise
            except NoWorkers:
                await uncut(self._give_back(pool, "no worker of the cohort answered"))
                return StepOutcome(False, f"no worker of cohort {revision} answered: nothing was removed",
                                   dict(before), run.id)
            if not drained.idle:
                await uncut(self._give_back(pool, f"busy: {drained.held_by}"))
                self._step("given_up", run, f"cohort {revision} got busy ({drained.held_by}): nothing was removed, "
                           "its workers consume again", revision, count)
                return StepOutcome(False, f"cohort {revision} got busy", dict(before), run.id)
            return await uncut(self._take_away(run, pool, before, revision, keep))
        finally:
            await uncut(self.runner.release_lease())  # a stop that cancels the step still gives it back

    async def _take_away(self, run: Run, pool: Pool, before: Mapping[str, int], revision: str,
                         keep: int) -> StepOutcome:
        count = before.get(revision, 0)
        await pool.phase("drained")
        await hold(pool)  # held even if this process dies before the update
        self._step("drained", run, f"cohort {revision} is idle and held", revision, count)
        after = {**nonzero(before), revision: keep}
        await pool.phase("scaling")
        self._step("removing", run, f"{count - keep} instance(s) of cohort {revision} are taken away: idle and held",
                   revision, keep)
        why = await self._scale(pool, before, after)
        if why:
            await self._give_back(pool, f"the pool update was refused: {why}")
            self._step("given_up", run, f"Cloud Run did not take cohort {revision} away ({why}): its workers "
                       "consume again", revision, count)
            return StepOutcome(False, why, dict(before), run.id)
        await self._wait_left(pool, revision, keep)
        await self._give_back(pool, "", end="done")
        what = "it is gone" if keep == 0 else f"{keep} of its instance(s) consume again"
        self._step("removed", run, f"cohort {revision}: {count - keep} idle instance(s) taken away, {what}",
                   revision, keep)
        return StepOutcome(True, f"took {count - keep} instance(s) of {revision} away", nonzero(after), run.id)

    async def _wait_left(self, pool: Pool, revision: str, keep: int) -> None:
        """Until at most ``keep`` instances of ``revision`` are live (all gone: :meth:`Pool.wait_gone`)."""
        if keep == 0:
            await pool.wait_gone(revision)
            return
        deadline = time.monotonic() + GONE_WAIT
        while (await pool.instances(revision)).get(revision, 0) > keep and time.monotonic() < deadline:
            await asyncio.sleep(0.5)

    async def _give_back(self, pool: Pool, why: str, *, end: Phase = "aborted") -> None:
        """The fence lifted and every consumer the step stopped whose worker is still there consuming again; the
        run ends ``end``."""
        current = await pool.run()
        await self.runner.lift_fence(pool.run_id)
        stopped = current.stopped_consumers()
        if stopped:
            live = set((await pool.registry()).get(str(current.settings.get("revision") or ""), ()))
            back = {w: sorted(qs) for w, qs in stopped.items() if w in live}
            if back:
                await self.runner.restore(current, back)
        if not (await pool.run()).finished:
            await self.runner.advance(pool.run_id, end, reason=why or None)

    # -- recovery ----------------------------------------------------------------------------------------------

    async def recover(self, run: Run) -> str:
        """Finish or undo an interrupted step (``abort``, ``resume``, the next ``autoscale``, from any machine): a
        pool update begun is followed to its end; the fence is lifted; the stopped consumers of the workers still
        there consume again. Returns one sentence. Refused while the step's own process still runs it."""
        pool = Pool.of(self.ctx, run, self.target, WORDS)
        said: list[str] = []

        async def work() -> Ending:
            said.append(await self._recover(pool))
            return Ending("aborted", EXIT_OK, said[-1])

        await taken_over(pool, work, work)
        self._step("recovered", run, said[-1], str(run.settings.get("revision") or ""))
        return said[-1]

    async def _recover(self, pool: Pool) -> str:
        run = await pool.run()
        updates = run.intents(SCALE_POOL)
        revision = str(run.settings.get("revision") or "")
        if not updates:
            await self._give_back(pool, "abort: no pool update was sent")
            return (f"Autoscale step {run.id} was interrupted before it changed the pool: the fence is lifted and "
                    "its workers consume again; nothing was removed.")
        await pool.settled()
        state = await pool.state()
        now = nonzero(counts_of(state.instance_count or 0, state.served_split))
        asked = {str(k): int(v) for k, v in (updates[-1].payload.get("after") or {}).items()}
        took = now == asked
        if took and run.settings.get("step") == "in":
            await self._wait_left(pool, revision, int(run.settings.get("keep") or 0))
        await self._give_back(pool, "" if took else "the pool update did not take effect",
                              end="done" if took else "aborted")
        if took:
            return (f"Autoscale step {run.id} had sent its pool update and Cloud Run runs it ({_counts(now)}): the "
                    "fence is lifted and every remaining worker consumes.")
        return (f"Autoscale step {run.id}'s pool update did not take effect (the pool runs {_counts(now)}): the fence "
                "is lifted and its workers consume again; nothing was removed.")


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{rev} x{n}" for rev, n in sorted(counts.items())) or "no instance"


def step_plan(run: Run) -> RecoveryPlan:
    """What ``abort`` (or ``resume``, or the next ``celeryops autoscale``) does with an interrupted step of the
    autoscaler: its pool update followed to its end, the fence lifted, the stopped consumers of the workers still
    there given back."""
    stopped = {w: sorted(qs) for w, qs in sorted(run.stopped_consumers().items())}
    sent = bool(run.intents(SCALE_POOL))
    what = (f"stopped consumers ({describe(stopped)}) of cohort {run.settings.get('revision') or '?'}"
            if stopped else "stopped no consumer")
    then = ("its pool update was sent: it is followed to its end (what it takes away is idle and held), " if sent
            else "no pool update was sent: nothing is removed, ")
    return RecoveryPlan("restore" if stopped else "nothing", stopped,
                        f"Autoscale step {run.id} was interrupted in {run.phase} and {what}; {then}the fence is lifted "
                        f"and the workers still there consume again (`{ABORT}`, or the next `celeryops autoscale`).",
                        [ABORT], "aborted")


class ScalingSteps:
    """The run kind ``autoscale`` (a step of the autoscaler: :data:`celeryops.ops.run.kinds.RUN_KINDS`): ``resume``
    and ``abort`` alike finish or undo it (:func:`recover_open_step`); its plan and the recovery view's choice say
    so."""

    async def resume(self, ctx: RunContext, run: Run) -> int:
        return ctx.finish("aborted", EXIT_OK, await recover_open_step(ctx, run)).exit_code

    async def abort(self, ctx: RunContext, run: Run, *, force_restore: bool = False) -> RecoveryPlan:
        return RecoveryPlan("restore", {}, await recover_open_step(ctx, run))

    def recovery_plan(self, run: Run, rollout: Rollout | None = None) -> RecoveryPlan:
        return plan(run, rollout) if run.finished else step_plan(run)

    def choices(self, run: Run, decided: RecoveryPlan) -> tuple[Choice, ...]:
        return (Choice("abort", "Abort: finish or undo the step", decided.explanation),
                Choice("resume", "Resume: finish or undo the step", "The same as abort: a step of the autoscaler is "
                       "never taken up again; the next look of `celeryops autoscale` decides anew."))


async def recover_open_step(ctx: RunContext, run: Run, settings: AutoscaleSettings | None = None) -> str:
    """``celeryops abort`` / ``resume`` of an autoscale step: :meth:`Scaling.recover` on its worker pool."""
    names = list(run.settings.get("targets") or [])
    if len(names) != 1:
        raise UserError(f"Autoscale step {run.id} names no single worker pool: nothing was changed.", EXIT_USAGE)
    target = ctx.config.target(str(names[0]))
    chosen = settings or AutoscaleSettings.from_dict(run.settings.get("autoscale") or {})
    try:
        return await Scaling(ctx, target, chosen).recover(run)
    finally:
        with contextlib.suppress(Exception):
            await ctx.rollouts.close()


__all__ = ["Scaling", "ScalingSteps", "StepOutcome", "cohort_name", "recover_open_step", "step_plan"]
