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

from celeryops.adapters.deploy.base import DeployError, PoolDeployer, PoolUpdate
from celeryops.core.autoscale import AutoscaleSettings
from celeryops.core.config import DrainSettings, Target
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.events import Event, Notice
from celeryops.core.scaleevents import AutoscaleStep, ScaleStepName
from celeryops.core.splits import counts_of, split_for
from celeryops.ops.drain.engine import Drain, DrainResult, NoWorkers
from celeryops.ops.drain.membership import held_by
from celeryops.ops.journal import SCALE_POOL, Run
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.pool.steps import RevisionHooks
from celeryops.ops.run.runner import Runner, uncut

GONE_WAIT = 60.0  # seconds for the instances taken away to leave (Cloud Run: SIGKILL 10 s after SIGTERM)


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


class Scaling:
    """The steps of the autoscaler on ``target`` in run context ``ctx`` (see the module)."""

    def __init__(self, ctx: RunContext, target: Target, settings: AutoscaleSettings) -> None:
        self.ctx = ctx
        self.target = target
        self.settings = settings

    @property
    def runner(self) -> Runner:
        return self.ctx.runner

    def deployer(self) -> PoolDeployer:
        deployer = self.ctx.rollouts.deployer(self.target)
        if not hasattr(deployer, "update_worker_pool"):
            raise UserError(f"The deployer of target {self.target.name!r} cannot change a worker pool's counts: "
                            "nothing was changed.", EXIT_USAGE)
        return deployer  # type: ignore[return-value]

    def emit(self, event: Event) -> None:
        self.ctx.emit(event)

    def _step(self, step: ScaleStepName, run: Run | None, message: str, revision: str = "", count: int = 0) -> None:
        self.emit(AutoscaleStep(step=step, target=self.target.name, revision=revision, count=count,
                                run_id=run.id if run else "", message=message))

    async def _open(self, step: str, **more: object) -> Run:
        """A new step run, the fleet's lease held for it (LeaseHeld or a UserError when another run holds the
        fleet: nothing changed)."""
        drain = self.ctx.config.drain
        return await self.runner.open_run(release=None, settings={
            "kind": "autoscale", "strategy": "drain", "step": step, "targets": [self.target.name], "queues": [],
            "forget": [], "interval": min(drain.interval, max(0.5, self.settings.interval)), "streak": drain.streak,
            "max_wait": self.settings.drain_timeout, "autoscale": self.settings.to_dict(), **more})

    # -- add a cohort ------------------------------------------------------------------------------------------

    async def add(self, before: Mapping[str, int], add: int) -> StepOutcome:
        """A new cohort of ``add`` instances beside the cohorts ``before`` (revision -> count, as set now)."""
        revision = cohort_name(self.target)
        after = {**nonzero(before), revision: add}
        run = await self._open("out", revision=revision, add=add)
        try:
            return await uncut(self._add(run, before, after, revision))
        finally:
            await self.runner.release_lease()

    async def _add(self, run: Run, before: Mapping[str, int], after: dict[str, int], revision: str) -> StepOutcome:
        add = after[revision]
        self._step("adding", run, f"adding cohort {revision} of {add} instance(s): {sum(after.values())} in all",
                   revision, add)
        await self.runner.advance(run.id, "scaling")
        ok, why = await self._update(run, before, after, revision=revision)
        if not ok:
            await self.runner.advance(run.id, "aborted", reason="the pool update was refused")
            self._step("given_up", run, f"Cloud Run did not add cohort {revision}: {why}", revision, add)
            return StepOutcome(False, why, dict(before), run.id)
        await self.runner.advance(run.id, "done")
        self._step("added", run, f"cohort {revision} of {add} instance(s) runs", revision, add)
        return StepOutcome(True, f"added cohort {revision}", after, run.id)

    async def _update(self, run: Run, before: Mapping[str, int], after: Mapping[str, int], *,
                      revision: str = "") -> tuple[bool, str]:
        """One pool update to exactly ``after`` (written ahead, settled); False and why when Cloud Run refused."""
        wanted = nonzero(after)
        total = sum(wanted.values())
        split = split_for(wanted) if total else tuple((rev, pct) for rev, pct in
                                                      (await self.deployer().current(self.target)).served_split)
        intent = await self.runner.journal.aio.intend(run.id, SCALE_POOL, {
            "target": self.target.name, "before": dict(before), "after": dict(wanted), "count": total,
            "revision": revision, "split": [list(e) for e in split]})
        change = PoolUpdate(revision=revision, instance_count=total, split=split or None,
                            owned_by=f"autoscale run {run.id}")
        try:
            await self.deployer().update_worker_pool(self.target, change, self.emit)
        except DeployError as err:
            await self.runner.journal.aio.settle(intent, {"ok": False, "error": str(err)})
            return False, str(err)
        await self.runner.journal.aio.settle(intent, {"ok": True, "counts": dict(wanted)})
        return True, ""

    # -- take a cohort away ------------------------------------------------------------------------------------

    async def remove(self, before: Mapping[str, int], revision: str, keep: int) -> StepOutcome:
        """Drain cohort ``revision`` alone, then lower its count to ``keep`` (0: it goes), the others as ``before``.
        Interrupted while draining: its workers consume again (nothing removed); once the update is sent: finished."""
        count = before.get(revision, 0)
        run = await self._open("in", revision=revision, keep=keep, before=dict(before))
        try:
            self._step("draining", run, f"the workers of cohort {revision} stop taking tasks and are confirmed "
                       "idle; every other cohort consumes", revision, count)
            try:
                result = await self._drain(run, revision)
            except asyncio.CancelledError:
                await uncut(self._give_back(run, "interrupted"))
                self._step("restored", run, f"interrupted: the workers of cohort {revision} consume again, nothing "
                           "was removed", revision, count)
                raise
            except NoWorkers:
                await uncut(self._give_back(run, "no worker of the cohort answered"))
                return StepOutcome(False, f"no worker of cohort {revision} answered: nothing was removed",
                                   dict(before), run.id)
            if result.outcome != "drained":
                what = held_by(result.last)
                await uncut(self._give_back(run, f"busy: {what}"))
                self._step("given_up", run, f"cohort {revision} got busy ({what}): nothing was removed, its workers "
                           "consume again", revision, count)
                return StepOutcome(False, f"cohort {revision} got busy", dict(before), run.id)
            return await uncut(self._take_away(run, before, revision, keep))
        finally:
            await self.runner.release_lease()

    async def _drain(self, run: Run, revision: str) -> DrainResult:
        """The workers of ``revision`` alone, by the drain's rules (fence scoped to it), within ``drain_timeout``."""
        runner = self.runner
        st = run.settings
        settings = DrainSettings(interval=float(st["interval"]), streak=int(st["streak"]),
                                 max_wait=float(st["max_wait"]))
        await runner.advance(run.id, "stopping")

        async def members() -> set[str]:
            if runner.coord is None:
                return set()
            from celeryops.fence import listed_workers

            infos = await asyncio.to_thread(listed_workers, runner.coord, runner.fleet_name)
            return {host for host, info in infos.items() if info.revision == revision}

        drain = Drain(runner.fleet, settings, on_event=self.emit, hooks=RevisionHooks(runner, run.id, revision, ""),
                      restore_patience=runner.settings.recovery_patience, scope=members,
                      scope_label=f"of cohort {revision}")
        await drain.start()
        await runner.advance(run.id, "draining")
        result = await drain.run()
        if result.outcome == "drained":
            await runner.advance(run.id, "drained")
        return result

    async def _take_away(self, run: Run, before: Mapping[str, int], revision: str, keep: int) -> StepOutcome:
        count = before.get(revision, 0)
        await self.runner.park_fence()  # held even if this process dies before the update
        self._step("drained", run, f"cohort {revision} is idle and held", revision, count)
        after = {**nonzero(before), revision: keep}
        await self.runner.advance(run.id, "scaling")
        self._step("removing", run, f"{count - keep} instance(s) of cohort {revision} are taken away: idle and held",
                   revision, keep)
        ok, why = await self._update(run, before, after)
        if not ok:
            await self._give_back(run, f"the pool update was refused: {why}")
            self._step("given_up", run, f"Cloud Run did not take cohort {revision} away ({why}): its workers "
                       "consume again", revision, count)
            return StepOutcome(False, why, dict(before), run.id)
        await self._wait_left(revision, keep)
        await self._give_back(run, "", end="done")
        what = "it is gone" if keep == 0 else f"{keep} of its instance(s) consume again"
        self._step("removed", run, f"cohort {revision}: {count - keep} idle instance(s) taken away, {what}",
                   revision, keep)
        return StepOutcome(True, f"took {count - keep} instance(s) of {revision} away", nonzero(after), run.id)

    async def _live(self, revision: str) -> set[str]:
        """The live plugin workers of ``revision`` (the fence registry)."""
        coord = self.runner.coord
        if coord is None:
            return set()
        from celeryops.fence import plugin_workers

        infos = await asyncio.to_thread(plugin_workers, coord, self.runner.fleet_name)
        return {host for host, info in infos.items() if info.revision == revision}

    async def _wait_left(self, revision: str, keep: int) -> None:
        """Until at most ``keep`` instances of ``revision`` are live, at most :data:`GONE_WAIT` seconds."""
        coord = self.runner.coord
        if coord is None:
            return
        from celeryops.fence import instances_by_revision, plugin_workers

        deadline = time.monotonic() + GONE_WAIT
        while time.monotonic() < deadline:
            infos = await asyncio.to_thread(plugin_workers, coord, self.runner.fleet_name)
            if instances_by_revision(infos).get(revision, 0) <= keep:
                return
            await asyncio.sleep(0.5)
        self.emit(Notice(level="warning", message=f"Instances of cohort {revision} are still registered {GONE_WAIT:g} "
                                                  "s after they were taken away; check the pool in the Cloud "
                                                  "console."))

    async def _give_back(self, run: Run, why: str, *, end: str = "aborted") -> None:
        """The fence lifted and every consumer the step stopped whose worker is still there consuming again; the
        run ends ``end``."""
        current = await self.runner.journal.aio.get(run.id)
        await self.runner.lift_fence(run.id)
        stopped = current.stopped_consumers()
        if stopped:
            live = await self._live(str(current.settings.get("revision") or ""))
            back = {w: sorted(qs) for w, qs in stopped.items() if w in live}
            if back:
                await self.runner.restore(current, back)
        if not (await self.runner.journal.aio.get(run.id)).finished:
            await self.runner.advance(run.id, end, reason=why or None)  # type: ignore[arg-type]

    # -- recovery ----------------------------------------------------------------------------------------------

    async def recover(self, run: Run) -> str:
        """Finish or undo an interrupted step (``abort``, ``resume``, the next ``autoscale``, from any machine): a
        pool update begun is followed to its end; the fence is lifted; the stopped consumers of the workers still
        there consume again. Returns one sentence. Refused while the step's own process still runs it."""
        await self.runner.hold(run)  # refused while its owner lives
        try:
            await asyncio.to_thread(self.runner.journal.bring_home, run.id,
                                    self.runner.journal.fleet_copy.store_for(run.fleet))
            run = await self.runner.journal.aio.get(run.id)
            sentence = await self._recover(run)
        finally:
            await self.runner.release_lease()
        self._step("recovered", run, sentence, str(run.settings.get("revision") or ""))
        return sentence

    async def _recover(self, run: Run) -> str:
        updates = run.intents(SCALE_POOL)
        revision = str(run.settings.get("revision") or "")
        if not updates:
            await self._give_back(run, "abort: no pool update was sent")
            return (f"Autoscale step {run.id} was interrupted before it changed the pool: the fence is lifted and "
                    "its workers consume again; nothing was removed.")
        await self._settled()
        state = await self.deployer().current(self.target)
        now = nonzero(counts_of(state.instance_count or 0, state.served_split))
        asked = {str(k): int(v) for k, v in (updates[-1].payload.get("after") or {}).items()}
        took = now == asked
        if took and run.settings.get("step") == "in":
            await self._wait_left(revision, int(run.settings.get("keep") or 0))
        await self._give_back(run, "" if took else "the pool update did not take effect", end="done" if took
                              else "aborted")
        if took:
            return (f"Autoscale step {run.id} had sent its pool update and Cloud Run runs it ({_counts(now)}): the "
                    "fence is lifted and every remaining worker consumes.")
        return (f"Autoscale step {run.id}'s pool update did not take effect (the pool runs {_counts(now)}): the fence "
                "is lifted and its workers consume again; nothing was removed.")

    async def _settled(self) -> None:
        """Until no rollout of the pool is in progress, up to the target's timeout."""
        deadline = time.monotonic() + self.target.timeout
        while (await self.deployer().current(self.target)).reconciling and time.monotonic() < deadline:
            await asyncio.sleep(1.0)


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{rev} x{n}" for rev, n in sorted(counts.items())) or "no instance"


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


__all__ = ["GONE_WAIT", "Scaling", "StepOutcome", "cohort_name", "recover_open_step"]
