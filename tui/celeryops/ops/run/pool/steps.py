"""The steps of two revisions on one worker pool (:class:`PoolSteps`): the scale-up that runs the new revision
beside the old one (:meth:`PoolSteps._scale_up`, with the plan's split), waiting until it consumes, a revision's
drain by the drain's rules with the fence scoped to it (:class:`RevisionHooks`), the cutover to the new revision
and the retirement of the new revision. Each pool update and each stop is written ahead in the journal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Literal

from celeryops.adapters.deploy.base import DeployError, PoolUpdate, RolloutState, short_revision
from celeryops.adapters.taskevents import start_watch
from celeryops.core.config import Target
from celeryops.core.errors import EXIT_DEPLOY, EXIT_OK, EXIT_PREFLIGHT, EXIT_TIMEOUT, UserError
from celeryops.core.events import (
    DrainFinished,
    Event,
    FleetBack,
    Notice,
    StageStarted,
    TargetDeployed,
    TargetRolledBack,
)
from celeryops.ops.drain.engine import Drain, DrainResult, NoWorkers
from celeryops.ops.drain.membership import held_by
from celeryops.ops.journal import CANCEL_CONSUMERS, OVERLAP_CUTOVER, OVERLAP_REVERT, OVERLAP_UP, Run
from celeryops.ops.preflight import Check
from celeryops.ops.preflight.overlap import PoolView, overlap_checks
from celeryops.ops.run.hooks import JournalHooks
from celeryops.ops.run.overlap_rules import Plan, Step, decide, progress_of, stopped_map
from celeryops.ops.run.pool.base import Destination, Ending, PoolFlow, _cap, _Refused, _Stop
from celeryops.ops.run.runner import Runner, uncut

#: Where a flow starts: the scale-up, waiting for the new revision, a promotion written ahead, the old revision's drain.
Start = Literal["up", "wait", "promote", "drain"]


class RevisionHooks(JournalHooks):
    """The drain's write-ahead records, each stop tagged with the revision whose workers it stops."""

    def __init__(self, runner: Runner, run_id: str, revision: str, exempt: str) -> None:
        async def raise_fence(queues: tuple[str, ...]) -> None:
            await runner.raise_fence(queues, only_revisions=(revision,), exempt_revisions=(exempt,))

        super().__init__(runner.journal, run_id, on_first_stop=raise_fence)
        self.revision = revision

    async def before_stop(self, stops: dict[str, tuple[str, ...]], before: dict[str, tuple[str, ...]]) -> None:
        await self.journal.aio.intend(self.run_id, CANCEL_CONSUMERS, {
            "stop": {w: sorted(q) for w, q in stops.items()}, "before": {w: sorted(q) for w, q in before.items()},
            "revision": self.revision})
        if self.on_first_stop is not None:
            first, self.on_first_stop = self.on_first_stop, None
            await first(tuple(sorted({q for qs in stops.values() for q in qs})))


class PoolSteps(PoolFlow):
    """The steps a strategy of two revisions on one pool is made of."""

    async def _continue(self, run: Run, target: Target, *, resume: bool) -> Ending:
        """Abort (``resume`` False) or resume ``run`` by the pool's rules, from its journal and the pool now: what
        every strategy of two revisions does alike (nothing to do, start again, ask, finish a cutover), then
        :meth:`_go_on` for the rest."""
        run = await self.runner.journal.aio.get(run.id)
        plan = progress_of(run).plan
        pool = None if plan is None else await self._pool(target)
        decision = decide(run, pool, resume=resume, denied=self._denied)
        self.emit(Notice(level="info", message=decision.explanation))
        if decision.step == "done":
            return Ending("aborted", EXIT_OK, decision.explanation)
        if decision.step == "nothing":
            await self.runner.advance(run.id, "aborted", reason="abort: nothing to undo")
            return Ending("aborted", EXIT_OK, decision.explanation)
        if decision.step == "start":
            return await self._forward(run, target, "up")
        if decision.step == "ask":
            await self._give_back(run)
            return Ending("deploy_failed", EXIT_DEPLOY, decision.explanation, action="ask")
        assert plan is not None
        if decision.step == "cutover":
            return await self._finish_cutover(run, target, plan)
        return await self._go_on(run, target, plan, decision.step, resume=resume)

    async def _go_on(self, run: Run, target: Target, plan: Plan, step: Step, *, resume: bool) -> Ending:
        """The strategy's own part of abort / resume: ``step`` is ``wait_new``, ``drain_old`` or ``retire``."""
        raise NotImplementedError

    async def _forward(self, run: Run, target: Target, start: Start, plan: Plan | None = None) -> Ending:
        """The flow from ``start``: the scale-up, what the strategy does before the old revision goes
        (:meth:`_before_drain`), the old revision's drain, the cutover. The new revision failing, or the old one not
        idle in time, retires the new one."""
        try:
            if start == "up" or plan is None:
                plan = await self._scale_up(run, target, self._destination(run), canary=self._canary_count(run))
            else:
                await self._settled(target)
                pool = await self._pool(target)
                if pool is not None and pool.revisions.get(plan.new) == "failed":
                    raise _Stop(f"{_cap(self._words.new)} {plan.new} failed to start.")
            async with self._ticker(run, target, plan):
                before = await self._before_drain(run, target, plan, start)
                if isinstance(before, Ending):
                    return before
                plan = before
                drained = await self._drain_old(run, plan)
            if drained is not None:
                sentence, _done = await self._retire(run, target, plan)
                return Ending("timeout", EXIT_TIMEOUT, f"{_cap(self._words.old)} {plan.old} was not idle within "
                              f"{self._settings(run).max_wait:g} s ({drained}){self._late}: nothing was killed, its "
                              f"consumers were restored; {sentence}")
            return await self._cutover(run, target, plan)
        except _Refused as refused:
            return Ending("deploy_failed", EXIT_DEPLOY, str(refused))
        except _Stop as stop:
            plan = stop.plan or plan
            assert plan is not None
            sentence, _done = await self._retire(run, target, plan)
            return Ending(stop.outcome, stop.code, f"{stop.message} {sentence}", logs_url=stop.logs_url)

    _late = ""  # what the timeout's sentence adds about when the old revision's drain began

    def _canary_count(self, run: Run) -> int:
        """The new revision's instances beside the old ones at the scale-up (0: as many as the old one has)."""
        return 0

    async def _before_drain(self, run: Run, target: Target, plan: Plan, start: Start) -> Plan | Ending:
        """Between the scale-up and the old revision's drain: the plan the drain goes on with, or the run's end.
        The overlap's: wait until the new revision consumes (unless resumed at the drain)."""
        if start != "drain":
            await self._wait_new(run, plan)
        return plan

    def _checks(self, target: Target, destination: Destination, release: str, sha: str, *,
                canary: int = 0) -> list[Check]:
        """The deploy's checks, with the pool's own ``traffic``, ``validate`` (the scale-up: as many new instances
        as old ones, or ``canary`` of them) and ``fence``, and ``mixed_versions``."""
        ctx, runner = self.ctx, self.ctx.runner
        deployer = self.deployer(target)
        read: list[asyncio.Future[RolloutState]] = []

        async def read_pool() -> PoolView:
            if not read:
                read.append(asyncio.ensure_future(deployer.current(target)))
            return PoolView(await asyncio.shield(read[0]))

        async def validate(change: PoolUpdate) -> None:
            await deployer.validate_pool_update(target, change)

        own = overlap_checks(target, read_pool, validate, destination.image or destination.revision,
                             destination.revision, app=runner.fleet.app, fleet=runner.fleet_name,
                             known=runner.fleet.members, has_registry=runner.coord is not None,
                             revisions=lambda: deployer.missing_revision_permissions(target), canary=canary)
        replaced = {c.id for c in own}
        return [*(c for c in ctx.release_checks(release, sha, (target,)) if c.id not in replaced),
                *(c for c in ctx.fleet_checks() if c.id not in replaced), *own]

    async def _scale_up(self, run: Run, target: Target, destination: Destination, *, canary: int = 0) -> Plan:
        """Step 2: name the plan, write it ahead, send the one update that runs the new revision beside the old one
        (as many instances as the old one has, or ``canary`` of them), follow it. Raises _Refused when Cloud Run
        refused it before anything changed (the run ends aborted)."""
        deployer = self.deployer(target)
        state = await deployer.current(target)
        served = state.served
        count = state.instance_count or 0
        if len(served) != 1 or count <= 0:
            raise UserError(f"{target.display} does not run all of its instances on one revision ({served}, count "
                            f"{count}): nothing was changed; run the preflight again.", EXIT_PREFLIGHT)
        old = next(iter(served))
        plan = Plan(target=target.name, old=old, new=destination.revision, count=count, image=destination.image,
                    split_before=state.traffic, canary=canary)
        each = f"{count} instance(s) each" if not canary else \
            f"{canary} instance(s) beside {count} ({plan.peak} while judged, as many as {old} if promoted)"
        self._step("planned", plan, f"{plan.new} will run beside {old}: {each}, {plan.highest} at the peak",
                   instances={old: count}, split=served)
        self.emit(StageStarted(stage="overlap", detail=f"{plan.new} beside {old} on {target.name}"))
        await self._phase(run, "overlapping")
        intent = await self.runner.journal.aio.intend(run.id, OVERLAP_UP, plan.payload(
            before={"count": count, "split": [list(e) for e in state.traffic], "served": served}))
        shares = " / ".join(f"{rev} {pct}%" for rev, pct in plan.up_split)
        self._step("scaling_up", plan, f"{plan.peak} instances, {shares}",
                   instances={old: count}, split=served)
        change = PoolUpdate(image=destination.image, revision=destination.revision if destination.image else "",
                            instance_count=plan.peak, split=plan.up_split)
        try:
            result = await deployer.update_worker_pool(target, change, self.emit)
        except DeployError as err:
            await self.runner.journal.aio.settle(intent, {"ok": False, "error": str(err)})
            pool = await self._pool(target)
            if pool is not None and not pool.reconciling and (
                    plan.new not in pool.revisions if plan.image else pool.serves_only(old, count)):
                await self.runner.advance(run.id, "aborted", reason="the pool update was refused")
                raise _Refused(f"{err} The pool was left as it was.") from None
            raise _Stop(f"Cloud Run could not bring {plan.new} up beside {old}: {err}", logs_url=err.logs_url,
                        plan=plan) from None
        await self.runner.journal.aio.settle(intent, {"ok": True, "revision": short_revision(result.revision)})
        self._step("scaled_up", plan, f"Cloud Run runs {plan.new} beside {old}", instances=await self._instances(
            target, plan), split=dict(plan.up_split))
        return plan

    async def _wait_new(self, run: Run, plan: Plan) -> None:
        """Step 3: until at least one worker per instance of the new revision consumes, covering every queue the old
        revision's workers consume (max wait: then the deploy cannot go on)."""
        settings = self._settings(run)
        deadline = time.monotonic() + settings.max_wait
        wanted = await self._queues_of(plan.old)
        fleet = self.runner.fleet
        consuming: dict[str, tuple[str, ...]] = {}
        while True:
            names = (await self._registry()).get(plan.new, ())
            replies = await fleet.active_queues(names) if names else {}
            consuming = {w: q for w, q in replies.items() if q}
            covered = {q for qs in consuming.values() for q in qs}
            if len(consuming) >= plan.new_count and wanted <= covered:
                break
            if time.monotonic() > deadline:
                missing = f"; nobody consumes {', '.join(sorted(wanted - covered))}" if wanted - covered else ""
                raise _Stop(f"{_cap(self._words.new)} {plan.new} did not consume within {settings.max_wait:g} s "
                            f"({len(consuming)} of {plan.new_count} worker(s) consume{missing}; a crash loop? read the "
                            "revision's logs).")
            await asyncio.sleep(min(settings.interval, 1.0))
        self._step("consuming", plan, f"{len(consuming)} worker(s) of {plan.new} consume "
                   f"{', '.join(sorted({q for qs in consuming.values() for q in qs}))}",
                   consuming=tuple(sorted(consuming)))

    async def _drain_old(self, run: Run, plan: Plan) -> str | None:
        """Step 4: stop and drain the old revision's workers alone. None: drained (they stay held); else what held
        the drain at max wait (their consumers restored: the caller retires the new revision)."""
        w = self._words
        self.emit(StageStarted(stage="drain", detail=f"{w.old} {plan.old}"))
        self._step("stopping_old", plan, f"only the workers of {plan.old} stop taking tasks; {plan.new} consumes")
        prior = progress_of(await self.runner.journal.aio.get(run.id)).old_stopped
        if not await self._past(run, "stopping"):
            await self._phase(run, "stopping")
        drain, result = await self._drain(run, plan.old, plan.new, prior, phases=True)
        if result.outcome == "drained":
            await self._phase(run, "drained")
            self._step("old_idle", plan, f"the workers of {plan.old} are idle")
            self.emit(DrainFinished(outcome="drained", elapsed=result.elapsed, message=(
                f"{_cap(w.old)} {plan.old} is idle: every instance moves to {plan.new} next.")))
            return None
        what = held_by(result.last)
        await uncut(self.runner.lift_fence(run.id))
        await uncut(drain.restore())
        self.emit(DrainFinished(outcome="timeout", elapsed=result.elapsed, message=(
            f"{_cap(w.old)} {plan.old} was not idle within {self._settings(run).max_wait:g} s, held by {what}: "
            f"nothing was killed, its consumers were restored; {w.new} is retired next.")))
        return what

    async def _drain(self, run: Run, revision: str, exempt: str, prior: Mapping[str, Iterable[str]], *,
                     phases: bool) -> tuple[Drain, DrainResult]:
        """Drain the workers of ``revision`` alone by the drain's rules (the fence scoped to it, ``exempt`` never
        held), with the consumers ``prior`` stopped already; ``phases``: record stopping/draining."""
        runner = self.runner
        settings = self._settings(run)
        wake = asyncio.Event()
        watch = await start_watch(runner.fleet.app, wake) if runner.settings.task_events else None

        def on_event(event: Event) -> None:
            if watch is not None:
                watch.on_event(event)
            self.emit(event)

        drain = Drain(runner.fleet, settings, forget=tuple(run.settings.get("forget") or ()), on_event=on_event,
                      hooks=RevisionHooks(self.runner, run.id, revision, exempt),
                      prior_stopped={w: tuple(sorted(q)) for w, q in prior.items()}, wake=wake,
                      restore_patience=runner.settings.recovery_patience, scope=self._scope(revision),
                      scope_label=f"of revision {revision}")
        runner._drain = drain  # the console's F (forget a dead worker) reaches it
        try:
            await drain.start()
            if phases and not await self._past(run, "draining"):
                await self._phase(run, "draining")
            return drain, await drain.run()
        finally:
            if watch is not None:
                await asyncio.to_thread(watch.stop)

    async def _cutover(self, run: Run, target: Target, plan: Plan) -> Ending:
        """Step 5: every instance to the new revision at the original count (the old workers, idle and held, are
        taken away), the fence lifted once they left, the fleet verified."""
        w = self._words
        rollback = w.flow == "rollback"
        self.emit(StageStarted(stage="rollback" if rollback else "deploy",
                               detail=f"every instance of {target.name} to {plan.new}"))
        await self._phase(run, "cutting_over")
        await self.runner.park_fence()  # the old revision stays held even if this process dies meanwhile
        deployer = self.deployer(target)
        state = await deployer.current(target)
        if state.served != {plan.new: 100} or state.instance_count != plan.count:
            split = (("", 100),) if short_revision(state.latest_ready_revision) == plan.new else ((plan.new, 100),)
            self._step("cutting_over", plan, f"every instance moves to {plan.new}: {plan.count} in all",
                       instances=await self._instances(target, plan), split=state.served)
            intent = await self.runner.journal.aio.intend(run.id, OVERLAP_CUTOVER, plan.payload(
                before={"count": state.instance_count, "served": state.served}, split=[list(e) for e in split],
                count_after=plan.count))
            # A rollback pins the previous revision by name: recorded as celeryops' own, so the next deploy moves on.
            owner = f"rollback run {run.id}" if rollback and split[0][0] else ""
            try:
                await self._update(target, PoolUpdate(instance_count=plan.count, split=split, owned_by=owner))
            except DeployError as err:
                await self.runner.journal.aio.settle(intent, {"ok": False, "error": str(err)})
                return Ending("deploy_failed", EXIT_DEPLOY, f"Could not move every instance to {plan.new}: {err} "
                              f"{_cap(w.old)} {plan.old} is idle and held, {plan.new} consumes: nothing is lost; run "
                              "`celeryops resume` to finish the cutover.", action="ask", logs_url=err.logs_url)
            await self.runner.journal.aio.settle(intent, {"ok": True})
        await self._wait_gone(plan.old)
        self._step("cut_over", plan, f"{plan.count} instance(s) of {plan.new} serve; {plan.old} was retired",
                   instances=await self._instances(target, plan), split={plan.new: 100})
        await self.runner.lift_fence(run.id)
        await self._phase(run, "deployed")
        kind = TargetRolledBack if rollback else TargetDeployed  # a rollback's: "rolled_back": true, its image read
        image = plan.image or (await self._image_of(target, plan.new) if rollback else "")
        deployed = kind(target=target.name, revision=plan.new, image=image, previous_revision=plan.old,
                        console_url=target.console_url, logs_url=await self._logs_url(target, plan.new))
        self.emit(deployed)
        self.emit(StageStarted(stage="verify", detail="waiting for the fleet to answer"))
        workers = await self.ctx.rollouts.fleet_back()
        self.emit(FleetBack(workers=workers))
        await self.runner.advance(run.id, "done")
        what = f"Release {run.release} deployed" if run.release else f"{target.name} moved to {plan.new}"
        if rollback:
            what = f"Rolled back ({target.name} serves revision {plan.new})"
        return Ending("deployed", EXIT_OK, f"{what} without a pause: {plan.count} instance(s) of {plan.new} serve "
                      f"and {plan.old} was retired once idle; {len(workers)} worker(s) consume.", action="cutover",
                      targets=(deployed,))

    async def _finish_cutover(self, run: Run, target: Target, plan: Plan) -> Ending:
        """Recovery of a cutover that was begun: follow it if it still rolls out; if it never took effect, make sure
        the old revision is idle again (its fence may have expired meanwhile), then send it again."""
        await self._settled(target)
        state = await self.deployer(target).current(target)
        if state.served != {plan.new: 100} or state.instance_count != plan.count:
            prior = progress_of(await self.runner.journal.aio.get(run.id)).old_stopped
            w = self._words
            self.emit(StageStarted(stage="drain", detail=f"{w.old} {plan.old}, before the cutover again"))
            drain, result = await self._drain(run, plan.old, plan.new, prior, phases=False)
            if result.outcome != "drained":
                await uncut(self.runner.lift_fence(run.id))
                await uncut(drain.restore())
                return Ending("deploy_failed", EXIT_DEPLOY, f"The cutover to {plan.new} never took effect and "
                              f"{w.old} {plan.old} is busy again ({held_by(result.last)}): nothing was killed, both "
                              "consume; run `celeryops resume` again later.", action="ask")
        return await self._cutover(run, target, plan)

    async def _retire(self, run: Run, target: Target, plan: Plan) -> tuple[str, bool]:
        """Retire the new revision (written ahead): the old revision's consumers back, the new revision's workers
        held and drained, one update back to the old revision, the fence lifted once they left. Returns one sentence
        and whether it was retired (False: the new revision stayed busy, both consume, the run stays open)."""
        run = await self.runner.journal.aio.get(run.id)
        progress = progress_of(run)
        w = self._words
        self.emit(StageStarted(stage="retire", detail=f"{w.new} {plan.new}"))
        await self._phase(run, "retiring")
        reverts = run.intents(OVERLAP_REVERT)
        if reverts and run.settlement(reverts[-1].seq) is None:
            # Settled below by its number in this journal: a run only the fleet's Redis held (its operator's machine
            # is gone) numbers its records as Redis does until a write brings it here; the note makes that write.
            await self.runner.journal.aio.note(run.id, {"resumes": OVERLAP_REVERT})
            intent = (await self.runner.journal.aio.get(run.id)).intents(OVERLAP_REVERT)[-1].seq
        else:
            state = await self.deployer(target).current(target)
            intent = await self.runner.journal.aio.intend(run.id, OVERLAP_REVERT, plan.payload(
                before={"count": state.instance_count, "served": state.served}, split=[[plan.old, 100]],
                count_after=plan.count))
        self._step("retiring", plan, f"{plan.new} is retired: {plan.old} consumes again first")
        await self.runner.lift_fence(run.id)
        if progress.old_stopped:
            await self.runner.restore(run, stopped_map(progress.old_stopped))
        self._step("old_restored", plan, f"the workers of {plan.old} consume again")
        await self._settled(target)  # a scale-up still rolling out ends first (the old revision consumes meanwhile)
        result: DrainResult | None = None
        if (await self._registry()).get(plan.new) or progress.new_stopped:
            self._step("holding_new", plan, f"the workers of {plan.new} stop taking tasks and are drained")
            try:
                drain, result = await self._drain(run, plan.new, plan.old, progress.new_stopped, phases=False)
            except NoWorkers:
                # Registered but silent: if the pool no longer runs the new revision (an update back that an
                # interruption cut short already took its instances away), there is nothing left to hold.
                if (await self.deployer(target).current(target)).served.get(plan.new):
                    raise
                self.emit(Notice(level="info", message=f"The workers of {plan.new} are gone with its instances: "
                                                       "nothing is left to hold."))
                result = None
        if result is not None and result.outcome != "drained" and self._hold_new:
            await uncut(self.runner.park_fence())  # held: it takes no task, its running ones finish
            sentence = (f"{w.new} {plan.new} is still busy ({held_by(result.last)}): its workers take no new "
                        f"task and finish what they run; {plan.old} consumes; run `celeryops abort` again to "
                        f"finish taking {plan.new} away once they are idle.")
            self._step("holding_new", plan, sentence)
            return sentence, False
        if result is not None and result.outcome != "drained":
            await uncut(self.runner.lift_fence(run.id))
            await uncut(drain.restore())
            await self.runner.journal.aio.settle(intent, {"ok": False, "kept": "both"})
            await self._phase(run, "overlapping", reason=f"{w.new} stayed busy")
            sentence = (f"{w.new} {plan.new} stayed busy ({held_by(result.last)}), so both revisions "
                        f"keep consuming at {plan.peak} instances: nothing was lost or stopped; run `celeryops "
                        f"abort` later to retire it, or `celeryops resume` to go on with the {w.flow}.")
            self._step("kept_both", plan, sentence)
            return sentence, False
        await self.runner.park_fence()  # the new revision stays held even if this process dies meanwhile
        state = await self.deployer(target).current(target)
        if state.served != {plan.old: 100} or state.instance_count != plan.count:
            try:
                # Pinned by name, by celeryops: recorded as its own, so the next deploy moves on without asking.
                await self._update(target, PoolUpdate(instance_count=plan.count, split=((plan.old, 100),),
                                                      owned_by=f"{w.flow} run {run.id}"))
            except DeployError as err:
                await self.runner.lift_fence(run.id)
                raise UserError(f"Could not put {target.display} back on {plan.old}: {err} {_cap(w.old)} "
                                f"consumes, so does {plan.new}: nothing is lost; run `celeryops abort` again.",
                                EXIT_DEPLOY) from None
        await self._wait_gone(plan.new)
        await self.runner.lift_fence(run.id)
        await self.runner.journal.aio.settle(intent, {"ok": True})
        sentence = (f"{w.new} {plan.new} was retired: {plan.count} instance(s) of {plan.old} serve, "
                    f"pinned to it by name.")
        self._step("retired", plan, sentence, instances=await self._instances(target, plan), split={plan.old: 100})
        await self.runner.advance(run.id, "aborted", reason=f"retired {plan.new}")
        return sentence[0].upper() + sentence[1:], True

    # -- progress ----------------------------------------------------------------------------------------------
