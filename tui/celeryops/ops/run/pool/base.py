"""The shared mechanics of two revisions on one Cloud Run worker pool, for the strategies that run a new revision
beside the old one (:mod:`celeryops.ops.run.strategies.overlap`, :mod:`celeryops.ops.run.strategies.canary`) and
the rollback that reuses them: :class:`PoolFlow`, the plumbing (the pool read and updated, the fence registry's
workers by revision, the run's phases and steps, the recovery entry points ``resume`` / ``abort``, progress), and
:class:`~celeryops.ops.run.pool.steps.PoolSteps`, the steps (scale-up, waiting for a revision to consume, a
revision's drain, the cutover, the retirement).

A strategy subclasses :class:`~celeryops.ops.run.pool.steps.PoolSteps` and gives :meth:`PoolFlow._continue`: what
``abort`` (``resume`` False) and ``resume`` do with an interrupted run of its own, from the journal and the pool.
The rules each step follows are in :mod:`celeryops.ops.run.overlap_rules`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from celeryops.adapters.deploy.base import DeployError, PoolDeployer, PoolUpdate, RevisionInfo
from celeryops.core.config import DrainSettings, Target
from celeryops.core.errors import EXIT_DEPLOY, EXIT_OK, EXIT_USAGE, UserError
from celeryops.core.events import (
    Event,
    Notice,
    OverlapStep,
    OverlapStepName,
    RunFinished,
    RunOutcome,
    TargetDeployed,
)
from celeryops.ops.journal import OVERLAP_CUTOVER, OVERLAP_UP, PHASES, Phase, Run
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.overlap_rules import ABORT, RESUME, Plan, PoolNow, pool_now, recovery_plan, stopped_map
from celeryops.ops.run.recovery import Action, Choice, RecoveryPlan, Rollout
from celeryops.ops.run.runner import Runner, uncut

GONE_WAIT = 60.0  # seconds to wait for a retired revision's workers to leave (Cloud Run: SIGKILL 10 s after SIGTERM)


@dataclass(frozen=True)
class Words:
    """How the operator reads the flow: what it is (``flow``), the revision it moves away from (``old``) and the one
    it moves to (``new``). A deploy's old and new revision; a rollback's deployed revision and the previous one it
    goes back to."""

    flow: str = "deploy"
    old: str = "the old revision"
    new: str = "the new revision"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


DEPLOY_WORDS = Words()
ROLLBACK_WORDS = Words(flow="rollback", old="the deployed revision", new="the previous revision")
#: A rollback run's outcomes (the ``--json`` events a drain rollback ends with).
ROLLBACK_OUTCOMES: dict[str, RunOutcome] = {"deployed": "rolled_back", "deploy_failed": "rollback_failed"}


@dataclass(frozen=True)
class Destination:
    """What the pool moves to: the revision ``revision``, made by the deploy from ``image`` (its name chosen up
    front), or, with ``image`` None, a revision that exists already (a rollback)."""

    revision: str
    image: str | None = None


@dataclass(frozen=True)
class Ending:
    """How a step of the flow ended: the run's outcome and exit code, one sentence, and (for ``abort``) what was
    done (``action``)."""

    outcome: RunOutcome
    code: int
    message: str
    action: Action = "nothing"
    targets: tuple[TargetDeployed, ...] = ()
    logs_url: str = ""


class _Refused(Exception):
    """Cloud Run refused the scale-up before anything changed: the run ends aborted."""


class _Stop(Exception):
    """The deploy cannot go on (the new revision failed to start or to consume): retire it, then end with this."""

    def __init__(self, message: str, *, code: int = EXIT_DEPLOY, outcome: RunOutcome = "deploy_failed",
                 logs_url: str = "", plan: Plan | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.outcome, self.logs_url = message, code, outcome, logs_url
        self.plan = plan


def new_revision_name(target: Target, sha: str) -> str:
    """The new revision's name, chosen up front: ``<pool>-<short sha>-<4 hex>`` (Cloud Run wants a revision's name
    to start with its resource's)."""
    return f"{target.resource}-{sha[:7] or 'r'}-{secrets.token_hex(2)}"


@dataclass
class PoolFlow:
    """A flow of two revisions on one worker pool, in run context ``ctx`` (its runner, rollouts and operator)."""

    ctx: RunContext
    _completed: tuple[float, int] | None = field(default=None, init=False)
    _words: Words = field(default=DEPLOY_WORDS, init=False)  # a rollback run's: see :meth:`_kind`
    _denied: DeployError | None = field(default=None, init=False)  # the pool could not be read: a permission
    # A retirement that finds the new revision busy past max wait keeps it held (a canary: its workers never consume
    # again) instead of giving both revisions their consumers back (the overlap).
    _hold_new: ClassVar[bool] = False

    async def deploy(self, release: str, targets: tuple[Target, ...]) -> RunFinished:
        """The strategy's whole deploy run: preflight, the operator's go, the flow, its end."""
        raise NotImplementedError

    async def _continue(self, run: Run, target: Target, *, resume: bool) -> Ending:
        """Abort (``resume`` False) or resume ``run`` by the strategy's rules, from its journal and the pool now."""
        raise NotImplementedError

    # -- recovery entry points ---------------------------------------------------------------------------------

    async def resume(self, run: Run) -> RunFinished:
        """``celeryops resume`` of an overlap run: the rules' resume column (finish the cutover, go on, ...)."""
        return self._finish(await self._recover(run, resume=True))

    async def abort(self, run: Run) -> RecoveryPlan:
        """``celeryops abort`` of an overlap run: the rules' abort column (retire the new revision, or finish a
        cutover that was begun)."""
        ending = await self._recover(run, resume=False)
        if ending.code != EXIT_OK:
            return RecoveryPlan("ask", {}, ending.message, [ABORT, RESUME])
        return RecoveryPlan(ending.action, {}, ending.message)

    # -- plumbing ----------------------------------------------------------------------------------------------

    async def _recover(self, run: Run, *, resume: bool) -> Ending:
        """Take the interrupted run's lease (refused while its owner lives), apply the rules, give the lease back."""
        target = self._target_of(run)
        self._kind(run)
        await self.runner.hold(run)
        try:
            await self._bring_home(run)
            return await self._guarded(run, target, lambda: self._continue(run, target, resume=resume))
        finally:
            await self._close()

    async def _bring_home(self, run: Run) -> None:
        """The fleet's copy of ``run`` into this journal before the rules read it: the records another machine added
        (a resume or abort from there) are then in what this journal returns (else its own older copy of a run it
        started hides them: the old revision's stops a teammate made, for one)."""
        journal = self.runner.journal
        await asyncio.to_thread(journal.bring_home, run.id, journal.fleet_copy.store_for(run.fleet))

    @property
    def runner(self) -> Runner:
        return self.ctx.runner

    def emit(self, event: Event) -> None:
        self.ctx.emit(event)

    def deployer(self, target: Target) -> PoolDeployer:
        deployer = self.ctx.rollouts.deployer(target)
        if not all(hasattr(deployer, name) for name in ("update_worker_pool", "validate_pool_update", "revisions")):
            raise UserError(f"The deployer of target {target.name!r} cannot run revisions side by side: nothing "
                            "was changed; deploy it with --strategy drain.", EXIT_USAGE)
        return cast(PoolDeployer, deployer)

    def _target_of(self, run: Run) -> Target:
        names = list(run.settings.get("targets") or [])
        if len(names) != 1:
            raise UserError(f"Run {run.id} names no single worker pool: nothing was changed.", EXIT_USAGE)
        return self.ctx.config.target(str(names[0]))

    def _settings(self, run: Run) -> DrainSettings:
        st = run.settings
        return DrainSettings(interval=float(st.get("interval", 15.0)), streak=int(st.get("streak", 2)),
                             max_wait=float(st.get("max_wait", 1200.0)))

    def _destination(self, run: Run) -> Destination:
        image = run.settings.get("image")
        return Destination(str(run.settings.get("new_revision") or ""), str(image) if image else None)

    async def _close(self) -> None:
        await self.runner.release_lease()
        await self.ctx.rollouts.close()

    def _kind(self, run: Run) -> None:
        """A rollback run (routed back to an existing revision) is told as one: its words and outcomes."""
        self._words = ROLLBACK_WORDS if run.kind == "rollback" else DEPLOY_WORDS

    def _finish(self, ending: Ending) -> RunFinished:
        outcome = ROLLBACK_OUTCOMES.get(ending.outcome, ending.outcome) if self._words.flow == "rollback" \
            else ending.outcome
        return self.ctx.finish(outcome, ending.code, ending.message, targets=ending.targets,
                                    logs_url=ending.logs_url)

    async def _phase(self, run: Run, to: Phase, reason: str | None = None) -> None:
        """Move the run to ``to`` unless it is there already (a resumed run may be)."""
        current = (await self.runner.journal.aio.get(run.id)).phase
        if current != to:
            await self.runner.advance(run.id, to, reason=reason)

    async def _past(self, run: Run, phase: Phase) -> bool:
        current = (await self.runner.journal.aio.get(run.id)).phase
        return PHASES.index(current) >= PHASES.index(phase)

    def _step(self, step: OverlapStepName, plan: Plan, message: str = "", **more: Any) -> None:
        self.emit(OverlapStep(step=step, target=plan.target, old_revision=plan.old, new_revision=plan.new,
                              peak=plan.highest, message=message, **more))

    async def _guarded(self, run: Run, target: Target, work: Callable[[], Awaitable[Ending]]) -> Ending:
        """``work``, and when it is interrupted the abort's rules before the interruption goes on (unless the
        operator detached). Any other failure gives stopped consumers back and leaves the run open."""
        try:
            return await work()
        except asyncio.CancelledError:
            if not self.runner.detached:
                self.emit(Notice(level="warning", message=f"Interrupted: applying the overlap {self._words.flow}'s "
                                                          "recovery rules (those of `celeryops abort`) before "
                                                          "exiting."))
                with contextlib.suppress(Exception):  # the interruption is what the caller must see
                    await uncut(self._continue(run, target, resume=False))
            raise
        except Exception as exc:
            with contextlib.suppress(Exception):
                await uncut(self._after_error(run, exc))
            raise

    async def _after_error(self, run: Run, exc: Exception) -> None:
        """A failure the flow did not expect: a run that never touched the pool ends aborted; else nothing stays
        stopped and the run stays open for ``abort`` / ``resume``."""
        current = await self.runner.journal.aio.get(run.id)
        if current.finished:
            return
        if not current.intents(OVERLAP_UP):
            await self.runner.advance(run.id, "aborted", reason=f"error: {exc}")
            return
        await self._give_back(run)
        w = self._words
        self.emit(Notice(level="error", message=f"The overlap {w.flow} stopped on an error; run {run.id} stays open "
                                                f"with nothing stopped: `celeryops abort` retires {w.new}, "
                                                "`celeryops resume` goes on."))

    async def _give_back(self, run: Run) -> None:
        """Every consumer the run stopped consumes again (the fence first); not once a cutover was begun (the old
        revision's workers, idle and held, are being taken away: they must not take tasks)."""
        run = await self.runner.journal.aio.get(run.id)
        if run.finished or run.intents(OVERLAP_CUTOVER):
            return
        stopped = run.stopped_consumers()
        await self.runner.lift_fence(run.id)
        if stopped:
            await self.runner.restore(run, stopped_map(stopped))

    # -- the pool ----------------------------------------------------------------------------------------------

    async def _pool(self, target: Target) -> PoolNow | None:
        deployer = self.deployer(target)
        try:
            state, revisions = await asyncio.gather(deployer.current(target), deployer.revisions(target))
        except DeployError as err:
            self._denied = err if err.permission else None
            self.emit(Notice(level="warning", message=f"Cloud Run did not say how the pool is: {err}"))
            return None
        return pool_now(state, revisions)

    async def _update(self, target: Target, change: PoolUpdate) -> None:
        await self.deployer(target).update_worker_pool(target, change, self.emit)

    async def _settled(self, target: Target) -> None:
        """Wait until no rollout of the pool is in progress (a scale-up sent before an interruption), up to the
        target's timeout."""
        deployer = self.deployer(target)
        deadline = time.monotonic() + target.timeout
        while (await deployer.current(target)).reconciling:
            if time.monotonic() > deadline:
                raise UserError(f"{target.display} is still rolling out after {target.timeout:g} s: nothing more "
                                "was changed; watch it in the Cloud console, then run `celeryops resume` or "
                                "`celeryops abort` again.", EXIT_DEPLOY)
            await asyncio.sleep(1.0)

    async def _registry(self) -> dict[str, tuple[str, ...]]:
        """Live plugin workers by revision (the fence registry)."""
        coord = self.runner.coord
        if coord is None:
            return {}
        from celeryops.fence import by_revision, plugin_workers

        return by_revision(await asyncio.to_thread(plugin_workers, coord, self.runner.fleet_name))

    async def _queues_of(self, revision: str) -> set[str]:
        """Every queue the live plugin workers of ``revision`` consume or hold."""
        coord = self.runner.coord
        if coord is None:
            return set()
        from celeryops.fence import plugin_workers

        infos = await asyncio.to_thread(plugin_workers, coord, self.runner.fleet_name)
        return {q for info in infos.values() if info.revision == revision for q in info.queues}

    def _scope(self, revision: str) -> Callable[[], Awaitable[set[str]]]:
        """The workers of ``revision`` by their registry entries, expired ones too: a worker whose heartbeat
        stopped is still the old revision's, and leaves the drain only by the drain's evidence."""
        async def members() -> set[str]:
            coord = self.runner.coord
            if coord is None:
                return set()
            from celeryops.fence import listed_workers

            infos = await asyncio.to_thread(listed_workers, coord, self.runner.fleet_name)
            return {host for host, info in infos.items() if info.revision == revision}

        return members

    async def _wait_gone(self, revision: str) -> None:
        """Until no live worker of ``revision`` is left (taken away: they stop), at most :data:`GONE_WAIT` s."""
        deadline = time.monotonic() + GONE_WAIT
        while (left := (await self._registry()).get(revision, ())) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        if left:
            self.emit(Notice(level="warning", message=f"Workers of revision {revision} are still registered "
                                                      f"{GONE_WAIT:g} s after their instances were taken away: "
                                                      f"{', '.join(left)}; check the pool in the Cloud console."))

    # -- progress --------------------------------------------------------------------------------------------

    async def _instances(self, target: Target, plan: Plan) -> dict[str, int]:
        """Live instances of the two revisions as the fence registry sees them, one per instance id ({} without a
        registry): what runs, not Cloud Run's ``desired_min_instance_count``, which worker-pool revisions may report
        as 0."""
        coord = self.runner.coord
        if coord is None:
            return {}
        from celeryops.fence import instances_by_revision, plugin_workers

        live = instances_by_revision(await asyncio.to_thread(plugin_workers, coord, self.runner.fleet_name))
        return {revision: live.get(revision, 0) for revision in (plan.old, plan.new)}

    @contextlib.asynccontextmanager
    async def _ticker(self, run: Run, target: Target, plan: Plan) -> AsyncIterator[None]:
        """While both revisions run: a ``progress`` step every interval (at least a second)."""
        every = max(self._settings(run).interval, 1.0)

        async def tick() -> None:
            while True:
                with contextlib.suppress(Exception):  # progress is shown, never decided on
                    await self._progress(target, plan)
                await asyncio.sleep(every)

        task = asyncio.ensure_future(tick())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _progress(self, target: Target, plan: Plan) -> None:
        fleet = self.runner.fleet
        registry, instances, state = await asyncio.gather(self._registry(), self._instances(target, plan),
                                                          self.deployer(target).current(target))
        new = registry.get(plan.new, ())
        observed, processed = await asyncio.gather(fleet.observe(new), fleet.processed(new)) if new else (None, {})
        consuming = tuple(sorted(n for n, w in observed.workers.items() if w.queues)) if observed else ()
        completed = max(0, sum(processed.values()) - (observed.active if observed else 0))
        now = time.monotonic()
        rate = None
        if self._completed is not None and now > self._completed[0]:
            rate = round(max(0, completed - self._completed[1]) / (now - self._completed[0]), 2)
        self._completed = (now, completed)
        self._step("progress", plan, instances=instances, split=state.served,
                   workers={rev: registry.get(rev, ()) for rev in (plan.old, plan.new)}, consuming=consuming,
                   completed=completed, rate=rate)

    async def _revision_info(self, target: Target, revision: str) -> RevisionInfo | None:
        try:
            found = [r for r in await self.deployer(target).revisions(target) if r.name == revision]
        except DeployError:
            return None
        return found[0] if found else None

    async def _image_of(self, target: Target, revision: str) -> str:
        info = await self._revision_info(target, revision)
        return info.image if info is not None else ""

    async def _logs_url(self, target: Target, revision: str) -> str:
        info = await self._revision_info(target, revision)
        return info.log_uri if info is not None else ""


@dataclass(frozen=True)
class PoolStrategy:
    """A strategy of two revisions on one worker pool: its ``flow`` (a :class:`PoolFlow`) run in the run context,
    its recovery by the pool's rules (:func:`~celeryops.ops.run.overlap_rules.recovery_plan`), and the words of
    its recovery choices."""

    name: str
    flow: type[PoolFlow]
    resume_label: str
    resume_detail: str
    retire_label: str
    cutover_label: str

    async def deploy(self, ctx: RunContext, release: str, targets: tuple[Target, ...]) -> RunFinished:
        return await self.flow(ctx).deploy(release, targets)

    async def resume(self, ctx: RunContext, run: Run) -> RunFinished:
        return await self.flow(ctx).resume(run)

    async def abort(self, ctx: RunContext, run: Run, *, force_restore: bool = False) -> RecoveryPlan:
        return await self.flow(ctx).abort(run)

    def recovery_plan(self, run: Run, rollout: Rollout | None = None) -> RecoveryPlan:
        return recovery_plan(run)

    def choices(self, run: Run, decided: RecoveryPlan) -> tuple[Choice, ...]:
        label = {"retire": self.retire_label, "cutover": self.cutover_label}.get(decided.action,
                                                                                 "Abort (nothing to undo)")
        return Choice("resume", self.resume_label, self.resume_detail), Choice("abort", label, decided.explanation)
