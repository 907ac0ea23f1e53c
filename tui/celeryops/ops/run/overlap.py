"""The overlap deploy of a Cloud Run worker pool: the new revision comes up beside the old one and consumes, only
the old revision's workers stop taking tasks, and the old instances are taken away once they are idle by the
drain's own rules. Processing never pauses, and no task is killed.

The flow (each pool update and each stop written ahead in the journal; the rules in
:mod:`celeryops.ops.run.overlap_rules`):

1. preflight: the drain deploy's checks, with the overlap's ``traffic`` (the pool runs one revision; the peak),
   ``validate`` (the scale-up, validate only), ``fence`` (required on every worker) and ``mixed_versions``;
2. ``overlapping``: one update names the new revision up front and runs it beside the old one at twice the count,
   split 50/50 (the old revision keeps every instance); then wait until the new revision's workers consume the old
   revision's queues, one per instance at least;
3. ``stopping`` / ``draining`` / ``drained``: a fence scoped to the old revision (the new one exempt) and
   ``cancel_consumer`` sent to the old revision's workers by name, re-sent to old workers that appear; drained by
   the drain's rules over the old revision's workers alone;
4. ``cutting_over``: the fence is parked (the old workers stay held even if this process dies), one update puts
   every instance on the new revision at the original count; once the old workers left, the fence is lifted.

Retiring the new revision (abort, the old revision's drain timing out, the new revision failing to start or to
consume): the old revision's consumers come back first, then the new revision's workers are held and drained (a
fence scoped to it), then one update puts the pool back on the old revision. If the new revision stays busy past
max wait, its consumers come back too and both keep consuming (nothing lost, nothing stopped; the run stays open).

Interrupted (Ctrl-C, SIGTERM, SIGHUP), the flow applies the abort's rules before the process ends; killed, the next
``celeryops abort`` / ``resume`` from any machine does, from the journal the fleet holds.

Entry points, from :class:`~celeryops.ops.run.session.RunSession`: :meth:`OverlapDeploy.deploy`, ``resume``,
``abort``; :meth:`OverlapDeploy.move` takes what the pool moves to (:class:`Destination`: a new revision made from
an image, or an existing revision) for a flow that has its own preflight (a rollback:
:class:`~celeryops.ops.run.rollback.OverlapStrategy`). A rollback run (``kind`` rollback in its settings) is told as
one (:class:`Words`: the deployed revision, the previous one; outcomes ``rolled_back`` / ``rollback_failed``, a
``target`` event with ``"rolled_back": true``), and the split its cutover pins is recorded as celeryops' own, as is
the one a retirement pins.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from celeryops.adapters.deploy.base import DeployError, PoolDeployer, PoolUpdate, RolloutState, short_revision
from celeryops.adapters.gitrepo import GitRepo
from celeryops.adapters.taskevents import start_watch
from celeryops.core.config import DrainSettings, Target
from celeryops.core.errors import EXIT_DEPLOY, EXIT_OK, EXIT_PREFLIGHT, EXIT_TIMEOUT, EXIT_USAGE, UserError
from celeryops.core.events import (
    DrainFinished,
    Event,
    FleetBack,
    Notice,
    OverlapStep,
    OverlapStepName,
    RunFinished,
    RunOutcome,
    StageStarted,
    TargetDeployed,
    TargetRolledBack,
)
from celeryops.ops.drain.engine import Drain, DrainResult
from celeryops.ops.drain.membership import held_by
from celeryops.ops.journal import CANCEL_CONSUMERS, OVERLAP_CUTOVER, OVERLAP_REVERT, OVERLAP_UP, PHASES, Phase, Run
from celeryops.ops.preflight import Check
from celeryops.ops.preflight.overlap import PoolView, overlap_checks
from celeryops.ops.run.hooks import JournalHooks
from celeryops.ops.run.overlap_rules import (
    ABORT,
    RESUME,
    Plan,
    PoolNow,
    decide,
    overlap_target,
    pool_now,
    progress_of,
    stopped_map,
)
from celeryops.ops.run.recovery import Action, RecoveryPlan
from celeryops.ops.run.runner import Runner, uncut

if TYPE_CHECKING:
    from celeryops.ops.run.session import RunSession

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

class RevisionHooks(JournalHooks):
    """The drain's write-ahead records, each stop tagged with the revision whose workers it stops."""

    def __init__(self, session: RunSession, run_id: str, revision: str, exempt: str) -> None:
        runner = session.runner

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


@dataclass
class OverlapDeploy:
    """The overlap deploy of one worker pool, driven by the run session (its runner, rollouts and operator)."""

    session: RunSession
    _completed: tuple[float, int] | None = field(default=None, init=False)
    _words: Words = field(default=DEPLOY_WORDS, init=False)  # a rollback run's: see :meth:`_kind`
    _denied: DeployError | None = field(default=None, init=False)  # the pool could not be read: a permission

    # -- entry points ------------------------------------------------------------------------------------------

    async def deploy(self, release: str, targets: tuple[Target, ...]) -> RunFinished:
        """Preflight (the overlap's checks), the operator's go, then :meth:`move` to a new revision of the release's
        image."""
        target = overlap_target(targets)
        session = self.session
        self.emit(StageStarted(stage="preflight", detail=f"release {release}, overlap on {target.name}"))
        sha = await GitRepo(session.repo).ls_remote(session.config.release.remote, release) or ""
        destination = Destination(new_revision_name(target, sha), target.image_for(sha, release, release))
        try:
            report = await session._preflight(self.checks(target, destination, release, sha))
            ended = await session._review(report, unreachable_exit=EXIT_PREFLIGHT)
        except BaseException:
            await session._rollouts.close()
            raise
        if ended is not None:
            await session._rollouts.close()
            return ended
        return await self.move(target, destination, release=release, settings={"sha": sha})  # closes them

    def checks(self, target: Target, destination: Destination, release: str, sha: str) -> list[Check]:
        """The deploy's checks, with the overlap's own ``traffic``, ``validate`` and ``fence``, and
        ``mixed_versions``."""
        session, runner = self.session, self.session.runner
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
                             revisions=lambda: deployer.missing_revision_permissions(target))
        replaced = {c.id for c in own}
        return [*(c for c in session._release_checks(release, sha, (target,)) if c.id not in replaced),
                *(c for c in session._fleet_checks() if c.id not in replaced), *own]

    async def move(self, target: Target, destination: Destination, *, release: str | None,
                   settings: Mapping[str, Any] | None = None) -> RunFinished:
        """Open the run (the lease held), move the pool to ``destination``, end the run. Interrupted: the abort's
        rules, before the coroutine ends."""
        drain = self.session.config.drain
        run = await self.runner.open_run(release=release, settings={
            "strategy": "overlap", "targets": [target.name], "new_revision": destination.revision,
            "image": destination.image, "queues": [], "forget": [], "interval": drain.interval,
            "streak": drain.streak, "max_wait": drain.max_wait, **dict(settings or {})})
        self._kind(run)
        try:
            ending = await self._guarded(run, target, lambda: self._forward(run, target, destination, "up"))
        finally:
            await self._close()
        return self._finish(ending)

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
        return self.session.runner

    def emit(self, event: Event) -> None:
        self.session.emit(event)

    def deployer(self, target: Target) -> PoolDeployer:
        deployer = self.session._rollouts.deployer(target)
        if not all(hasattr(deployer, name) for name in ("update_worker_pool", "validate_pool_update", "revisions")):
            raise UserError(f"The deployer of target {target.name!r} cannot run revisions side by side: nothing "
                            "was changed; deploy it with --strategy drain.", EXIT_USAGE)
        return cast(PoolDeployer, deployer)

    def _target_of(self, run: Run) -> Target:
        names = list(run.settings.get("targets") or [])
        if len(names) != 1:
            raise UserError(f"Run {run.id} names no single worker pool: nothing was changed.", EXIT_USAGE)
        return self.session.config.target(str(names[0]))

    def _settings(self, run: Run) -> DrainSettings:
        st = run.settings
        return DrainSettings(interval=float(st.get("interval", 15.0)), streak=int(st.get("streak", 2)),
                             max_wait=float(st.get("max_wait", 1200.0)))

    def _destination(self, run: Run) -> Destination:
        image = run.settings.get("image")
        return Destination(str(run.settings.get("new_revision") or ""), str(image) if image else None)

    async def _close(self) -> None:
        await self.runner.release_lease()
        await self.session._rollouts.close()

    def _kind(self, run: Run) -> None:
        """A rollback run (routed back to an existing revision) is told as one: its words and outcomes."""
        self._words = ROLLBACK_WORDS if run.kind == "rollback" else DEPLOY_WORDS

    def _finish(self, ending: Ending) -> RunFinished:
        outcome = ROLLBACK_OUTCOMES.get(ending.outcome, ending.outcome) if self._words.flow == "rollback" \
            else ending.outcome
        return self.session._finish(outcome, ending.code, ending.message, targets=ending.targets,
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
                              peak=plan.peak, message=message, **more))

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

    # -- the flow ----------------------------------------------------------------------------------------------

    async def _continue(self, run: Run, target: Target, *, resume: bool) -> Ending:
        """Abort (``resume`` False) or resume ``run`` by the rules, from its journal and the pool now."""
        run = await self.runner.journal.aio.get(run.id)
        pool = None if progress_of(run).plan is None else await self._pool(target)
        decision = decide(run, pool, resume=resume, denied=self._denied)
        self.emit(Notice(level="info", message=decision.explanation))
        plan = progress_of(run).plan
        if decision.step == "done":
            return Ending("aborted", EXIT_OK, decision.explanation)
        if decision.step == "nothing":
            await self.runner.advance(run.id, "aborted", reason="abort: nothing to undo")
            return Ending("aborted", EXIT_OK, decision.explanation)
        if decision.step == "start":
            return await self._forward(run, target, self._destination(run), "up")
        if decision.step == "ask":
            await self._give_back(run)
            return Ending("deploy_failed", EXIT_DEPLOY, decision.explanation, action="ask")
        assert plan is not None
        if decision.step in ("wait_new", "drain_old"):
            return await self._forward(run, target, self._destination(run),
                                       "wait" if decision.step == "wait_new" else "drain", plan)
        if decision.step == "cutover":
            return await self._finish_cutover(run, target, plan)
        sentence, done = await self._retire(run, target, plan)
        if resume:  # the new revision failed to start, or a retirement was begun: the deploy did not happen
            return Ending("deploy_failed", EXIT_DEPLOY, f"The {self._words.flow} did not take place: {sentence}")
        return Ending("aborted" if done else "deploy_failed", EXIT_OK if done else EXIT_DEPLOY, sentence,
                      action="retire" if done else "ask")

    async def _forward(self, run: Run, target: Target, destination: Destination, start: Literal["up", "wait", "drain"],
                       plan: Plan | None = None) -> Ending:
        """The deploy from ``start``: the scale-up, waiting for the new revision to consume, the old revision's
        drain, the cutover. The new revision failing, or the old one not idle in time, retires the new one."""
        try:
            if start == "up" or plan is None:
                plan = await self._scale_up(run, target, destination)
            else:
                await self._settled(target)
                pool = await self._pool(target)
                if pool is not None and pool.revisions.get(plan.new) == "failed":
                    raise _Stop(f"{_cap(self._words.new)} {plan.new} failed to start.")
            async with self._ticker(run, target, plan):
                if start != "drain":
                    await self._wait_new(run, plan)
                drained = await self._drain_old(run, plan)
            if drained is not None:
                sentence, _done = await self._retire(run, target, plan)
                return Ending("timeout", EXIT_TIMEOUT, f"{_cap(self._words.old)} {plan.old} was not idle within "
                              f"{self._settings(run).max_wait:g} s ({drained}): nothing was killed, its consumers were "
                              f"restored; {sentence}")
            return await self._cutover(run, target, plan)
        except _Refused as refused:
            return Ending("deploy_failed", EXIT_DEPLOY, str(refused))
        except _Stop as stop:
            plan = stop.plan or plan
            assert plan is not None
            sentence, _done = await self._retire(run, target, plan)
            return Ending(stop.outcome, stop.code, f"{stop.message} {sentence}", logs_url=stop.logs_url)

    async def _scale_up(self, run: Run, target: Target, destination: Destination) -> Plan:
        """Step 2: name the plan, write it ahead, send the one update that runs the new revision beside the old one,
        follow it. Raises _Refused when Cloud Run refused it before anything changed (the run ends aborted)."""
        deployer = self.deployer(target)
        state = await deployer.current(target)
        served = state.served
        count = state.instance_count or 0
        if len(served) != 1 or count <= 0:
            raise UserError(f"{target.display} does not run all of its instances on one revision ({served}, count "
                            f"{count}): nothing was changed; run the preflight again.", EXIT_PREFLIGHT)
        old = next(iter(served))
        plan = Plan(target=target.name, old=old, new=destination.revision, count=count, image=destination.image,
                    split_before=state.traffic)
        self._step("planned", plan, f"{plan.new} will run beside {old}: {count} instance(s) each, {plan.peak} at the "
                   "peak", instances={old: count}, split=served)
        self.emit(StageStarted(stage="overlap", detail=f"{plan.new} beside {old} on {target.name}"))
        await self._phase(run, "overlapping")
        intent = await self.runner.journal.aio.intend(run.id, OVERLAP_UP, plan.payload(
            before={"count": count, "split": [list(e) for e in state.traffic], "served": served}))
        self._step("scaling_up", plan, f"{plan.peak} instances, {old} 50% / {plan.new} 50%",
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
            if len(consuming) >= plan.count and wanted <= covered:
                break
            if time.monotonic() > deadline:
                missing = f"; nobody consumes {', '.join(sorted(wanted - covered))}" if wanted - covered else ""
                raise _Stop(f"{_cap(self._words.new)} {plan.new} did not consume within {settings.max_wait:g} s "
                            f"({len(consuming)} of {plan.count} worker(s) consume{missing}; a crash loop? read the "
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
                      hooks=RevisionHooks(self.session, run.id, revision, exempt),
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
        workers = await self.session._rollouts.fleet_back()
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
        if (await self._registry()).get(plan.new) or progress.new_stopped:
            self._step("holding_new", plan, f"the workers of {plan.new} stop taking tasks and are drained")
            drain, result = await self._drain(run, plan.new, plan.old, progress.new_stopped, phases=False)
            if result.outcome != "drained":
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

    async def _image_of(self, target: Target, revision: str) -> str:
        try:
            found = [r for r in await self.deployer(target).revisions(target) if r.name == revision]
        except DeployError:
            return ""
        return found[0].image if found else ""

    async def _logs_url(self, target: Target, revision: str) -> str:
        try:
            found = [r for r in await self.deployer(target).revisions(target) if r.name == revision]
        except DeployError:
            return ""
        return found[0].log_uri if found else ""
