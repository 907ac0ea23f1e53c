"""The autoscaler's control loop (:class:`Autoscaler`, entry point :func:`autoscale`): every ``interval`` seconds one
look at the pool (:mod:`.demand`), one decision (:mod:`.policy`), and at most one step (:mod:`celeryops.ops.run.
scaling`: a cohort added, or an idle cohort drained and taken away), each a run under the fleet's lease, given back
between steps.

It changes nothing, and says why in one sentence per look, while:

- Cloud Run sizes the pool itself (automatic scaling), or rolls it out;
- another run holds the fleet (a drain, deploy or rollback; one waiting for the lease goes first), or an unfinished
  one holds it (its consumers stopped, its pool changed: ``celeryops abort`` / ``resume``);
- someone else changed the pool's counts (they differ from what the autoscaler set or last adopted). After a run of
  celeryops that ended (a deploy's cutover) it goes on from the pool as that run left it.

Bad input is refused before anything changes (:meth:`Autoscaler.refuse`). An open step of the autoscaler left by a
killed process (of any machine) is finished or undone first. ``stop`` set (SIGINT, SIGTERM): the step in progress is
completed or undone (its drain given back, a sent update followed to its end) and the loop returns 0 with every
worker consuming. ``dry_run``: the decisions only; nothing is changed, nothing is published.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import redis

from celeryops.core.aio import wait_event
from celeryops.core.autoscale import AutoscaleSettings
from celeryops.core.config import Target
from celeryops.core.errors import EXIT_OK, EXIT_USAGE, UserError
from celeryops.core.events import Notice
from celeryops.core.identity import current_user
from celeryops.core.scaleevents import AutoscaleLook, AutoscaleStep, AutoscaleStopped
from celeryops.ops.autoscale.demand import PoolReader, PoolView
from celeryops.ops.autoscale.policy import Decision, Look, Memory, Trace, decide
from celeryops.ops.autoscale.refusals import refusals
from celeryops.ops.fleetwide.lease import LeaseHeld, fleet_wanted
from celeryops.ops.fleetwide.scalestatus import ScaleStatus, publish_scale_status, read_scale_status
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.scaling import Scaling, StepOutcome, nonzero, recover_open_step


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{rev} x{n}" for rev, n in sorted(counts.items())) or "no instance"


@dataclass
class Autoscaler:
    """The loop for worker pool ``target`` in run context ``ctx`` (see the module). ``clock``: epoch seconds."""

    ctx: RunContext
    target: Target
    settings: AutoscaleSettings
    dry_run: bool = False
    clock: Callable[[], float] = time.time
    trace: Trace = field(default_factory=Trace)
    memory: Memory = field(default_factory=Memory)
    expected: dict[str, int] | None = None  # the counts per revision the autoscaler set or adopted last
    left_alone: str = ""  # why the pool is left alone (someone else changed it), "" while it is not
    _seen_run: str | None = None  # the fleet's latest ended run when last looked at
    _step: asyncio.Task[StepOutcome] | None = None
    _started: float = 0.0
    _last: tuple[Look, Decision] | None = None

    def __post_init__(self) -> None:
        runner = self.ctx.runner
        runner.waits_for_steps = False  # its own steps never wait for each other
        deployer = self.ctx.rollouts.deployer(self.target)
        self.reader = PoolReader(runner.fleet, runner.coord, runner.fleet_name, self.target,
                                 deployer, self.settings)  # type: ignore[arg-type]
        self.scaling = Scaling(self.ctx, self.target, self.settings)

    # -- the loop ----------------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> int:
        """Refuse bad input, recover an open step, then look, decide and act every interval until ``stop``."""
        self._started = self.clock()
        try:
            await self.refuse()
            await self.recover()
            watcher = asyncio.ensure_future(self._cancel_step_on(stop))
            try:
                while not stop.is_set():
                    looked = await self._look_or_say()
                    if looked is not None and looked[0].action in ("out", "in") and not self.dry_run \
                            and not stop.is_set():
                        await self.act(*looked, stop)
                    await wait_event(stop, self.settings.interval)
            finally:
                watcher.cancel()
        finally:
            await self._publish_end()
            with contextlib.suppress(Exception):
                await self.ctx.rollouts.close()
        message = (f"The autoscaler of {self.target.name} stopped: every worker consumes"
                   f"{' (dry run: nothing was changed)' if self.dry_run else ''}.")
        self.ctx.emit(AutoscaleStopped(target=self.target.name, message=message, exit_code=EXIT_OK))
        return EXIT_OK

    async def _look_or_say(self) -> tuple[Decision, PoolView] | None:
        """:meth:`once`, or None when the pool could not be looked at now (Cloud Run, the broker or Redis did not
        answer): said in one sentence; nothing is changed and the next look tries again."""
        try:
            return await self.once()
        except (UserError, redis.RedisError) as err:
            self.ctx.emit(Notice(level="warning", message=f"The autoscaler could not look at {self.target.display} "
                                                          f"({str(err).rstrip('.')}): it changes nothing and looks "
                                                          f"again in {self.settings.interval:g} s."))
            return None

    async def _cancel_step_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        if self._step is not None and not self._step.done():
            self._step.cancel()

    async def once(self) -> tuple[Decision, PoolView]:
        """One look and its decision (emitted, traced, published); changes nothing."""
        look, view = await self.reader.look(self.clock())
        waiting = await self.guard(view, look)
        if waiting is not None:
            decision = waiting
        else:
            decision, self.memory = decide(look, self.settings, self.memory)
        self.trace.add(look, decision)
        self.ctx.emit(AutoscaleLook(
            target=self.target.name, action=decision.action, reason=decision.reason, desired=decision.desired,
            instances=look.instances, demand=look.tasks, capacity=look.capacity, per_instance=max(1, look.per_instance),
            scheduled=look.scheduled, dry_run=self.dry_run,
            queues={q.queue: {"ready": q.ready, "reserved": q.reserved, "active": q.active, "scheduled": q.scheduled}
                    for q in look.demand},
            cohorts=tuple({"revision": c.revision, "count": c.count, "live": c.live, "busy": c.busy, "state": c.state}
                          for c in look.cohorts)))
        await self._publish(look, decision)
        return decision, view

    async def act(self, decision: Decision, view: PoolView, stop: asyncio.Event) -> None:
        """The step ``decision`` asks for, as a task that ``stop`` cancels (the step completes or undoes itself)."""
        before = nonzero(view.counts)
        step = (self.scaling.add(before, decision.add) if decision.action == "out"
                else self.scaling.remove(before, decision.revision, decision.keep))
        self._step = asyncio.ensure_future(step)
        try:
            outcome = await self._step
        except (LeaseHeld, UserError) as err:  # another run took the fleet first: nothing changed
            self.ctx.emit(AutoscaleStep(step="waiting", target=self.target.name, message=str(err)))
            return
        except asyncio.CancelledError:
            if not stop.is_set():
                raise
            return
        except Exception as exc:  # the step's run stays open with what it did recorded: the next look recovers it
            self.ctx.emit(Notice(level="error", message=f"An autoscale step on {self.target.display} stopped on an "
                                                        f"error ({type(exc).__name__}: {exc}); the next look finishes "
                                                        "or undoes it from the journal."))
            return
        finally:
            self._step = None
        if outcome.changed:
            self.expected = outcome.counts
            self.memory = Memory()

    # -- what keeps the autoscaler from changing the pool -------------------------------------------------------

    async def guard(self, view: PoolView, look: Look) -> Decision | None:
        """A ``wait`` decision (one sentence) while the pool must not be changed now, else None."""
        pool = self.target.display

        def wait(reason: str) -> Decision:
            return Decision("wait", reason, desired=look.instances, current=look.instances, at=look.at)

        if view.automatic:
            return wait(f"Cloud Run scales {pool} itself (automatic scaling): the autoscaler leaves it alone and "
                        "changes nothing; set it to manual scaling to let celeryops size it.")
        if view.state.reconciling:
            return wait(f"Cloud Run is rolling {pool} out: the autoscaler waits until it is done.")
        holder = await self._holder()
        if holder:
            return wait(holder)
        ended = await asyncio.to_thread(self._latest_ended)
        counts = nonzero(view.counts)
        if self.expected is None or ended != self._seen_run:
            if self.expected is not None and counts != self.expected:
                self.ctx.emit(Notice(level="info", message=f"Run {ended} changed {pool}: the autoscaler goes on from "
                                                           f"the pool as it is ({_counts(counts)})."))
            self.expected, self.left_alone = counts, ""
        self._seen_run = ended
        if counts != self.expected:
            self.left_alone = (f"Someone else changed {pool}: it runs {_counts(counts)} where celeryops last set "
                               f"{_counts(self.expected)}; the autoscaler leaves it alone and changes nothing (run "
                               "`celeryops autoscale` again to go on from the pool as it is).")
        return wait(self.left_alone) if self.left_alone else None

    async def _holder(self) -> str:
        """Why another run keeps the pool from being changed now ("" when nothing does)."""
        runner = self.ctx.runner
        coord = runner.coord
        if coord is not None:
            with contextlib.suppress(redis.RedisError):
                holder = await runner.lease_holder()  # a dead process's lease of an ended run is dropped
                if holder is not None and holder.orphaned and not self.dry_run:
                    await self.recover()  # its own open step, of a process gone (any machine): finished or undone
                    holder = await runner.lease_holder()
                if holder is not None:
                    return (f"Run {holder.run_id} holds the fleet ({holder.describe()}): the autoscaler waits for "
                            "it and changes nothing meanwhile.")
                wanted = await asyncio.to_thread(fleet_wanted, coord, runner.fleet_name)
                if wanted:
                    return f"A run of {wanted} waits for the fleet: it goes first, the autoscaler waits."
        open_run = await asyncio.to_thread(runner.unfinished)
        if open_run is not None and open_run.kind != "autoscale" and open_run.holds_fleet():
            return (f"Run {open_run.id} ({open_run.kind}, {open_run.phase}) is unfinished and holds the fleet: the "
                    "autoscaler changes nothing until `celeryops abort` or `celeryops resume` ends it.")
        if open_run is not None and open_run.kind == "autoscale" and not self.dry_run:
            await self.recover()
        return ""

    def _latest_ended(self) -> str | None:
        """The id of the fleet's latest ended run that was not a step of the autoscaler (a deploy, a rollback)."""
        journal = self.ctx.runner.journal
        with contextlib.suppress(Exception):
            latest = journal.latest_ended(self.ctx.runner.fleet_name)
            if latest is not None and latest.kind != "autoscale":
                return latest.id
        return self._seen_run

    # -- refusals and recovery ---------------------------------------------------------------------------------

    async def refuse(self) -> None:
        """Bad input, in one sentence, before anything changes (see :mod:`.refusals`)."""
        if not self.dry_run:
            self.ctx.refuse_if_read_only("scale the worker pool")
            await self.ctx.require_operator("scale the worker pool")
        published = await self._published()
        if published is not None and published.target == self.target.name:
            self.reader.per_instance = self.reader.per_instance or published.per_instance
            self.reader.queues = self.reader.queues or published.queues
        problem = await refusals(self.ctx, self.target, self.settings, self.reader, published, dry_run=self.dry_run)
        if problem:
            raise UserError(problem, EXIT_USAGE)

    async def recover(self) -> None:
        """The fleet's open step of the autoscaler, left by a process that died: finished or undone first."""
        if self.dry_run:
            return
        run = await asyncio.to_thread(self.ctx.runner.unfinished)
        if run is None or run.kind != "autoscale":
            return
        try:
            sentence = await recover_open_step(self.ctx, run, self.settings)
        except LeaseHeld:
            return  # its process still runs it: not ours to touch
        self.ctx.emit(Notice(level="info", message=sentence))

    # -- the published status ----------------------------------------------------------------------------------

    async def _published(self) -> ScaleStatus | None:
        coord = self.ctx.runner.coord
        if coord is None:
            return None
        try:
            return await asyncio.to_thread(read_scale_status, coord, self.ctx.runner.fleet_name)
        except (redis.RedisError, UserError):
            return None

    def status(self, look: Look | None, decision: Decision | None, state: str = "running") -> ScaleStatus:
        """What the autoscaler publishes (and ``status --json`` shows)."""
        return ScaleStatus(
            fleet=self.ctx.runner.fleet_name, target=self.target.name, state=state, owner=current_user(),
            host=socket.gethostname(), pid=os.getpid(), started_at=self._started, updated_at=self.clock(),
            interval=self.settings.interval, per_instance=self.reader.per_instance, queues=self.reader.queues,
            instances=look.instances if look else 0, desired=decision.desired if decision else 0,
            cohorts=tuple({"revision": c.revision, "count": c.count, "live": c.live, "busy": c.busy, "state": c.state}
                          for c in look.cohorts) if look else (),
            demand=tuple({"queue": q.queue, "ready": q.ready, "reserved": q.reserved, "active": q.active,
                          "scheduled": q.scheduled} for q in look.demand) if look else (),
            points=tuple(self.trace.points), decisions=tuple(d.to_json() for d in self.trace.decisions[-20:]),
            settings=self.settings.to_dict(), message=self.left_alone)

    async def _publish(self, look: Look, decision: Decision) -> None:
        coord = self.ctx.runner.coord
        if coord is None or self.dry_run:
            return
        self._last = (look, decision)
        with contextlib.suppress(redis.RedisError):
            await asyncio.to_thread(publish_scale_status, coord, self.status(look, decision))

    async def _publish_end(self) -> None:
        coord = self.ctx.runner.coord
        last = self._last
        if coord is None or self.dry_run or last is None:
            return
        with contextlib.suppress(redis.RedisError):
            await asyncio.to_thread(publish_scale_status, coord, self.status(last[0], last[1], state="stopped"))


async def autoscale(ctx: RunContext, target: Target, settings: AutoscaleSettings, stop: asyncio.Event, *,
                    dry_run: bool = False) -> int:
    """The one entry point of the command, the demo and the benches: run the autoscaler of ``target`` in ``ctx``
    (a run session: ``Wiring.session(operator, sink)``) until ``stop`` is set; returns the exit code (0). Raises
    UserError (nothing changed) on bad input."""
    return await Autoscaler(ctx, target, settings, dry_run=dry_run).run(stop)


__all__ = ["Autoscaler", "autoscale"]
