"""The run's engine under :class:`~celeryops.ops.run.session.RunSession`: the drain with every side effect written
ahead in the journal, and the recovery rules applied by ``abort``; on what it holds while it runs
(:class:`~celeryops.ops.run.runnerbase.RunnerBase`: one run at a time per fleet (Redis lease), the fence, the live
status mirrored to Redis for watchers).

Interruptions (task cancellation from a signal handler or the console) restore the consumers before the drain ends:
no path leaves workers stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import redis

from celeryops.adapters.taskevents import TaskWatch, start_watch
from celeryops.core.config import DrainSettings
from celeryops.core.errors import EXIT_FAILURE, BrokerUnreachable, UserError
from celeryops.core.events import ConsumersRestored, DrainFinished, Event, Notice
from celeryops.core.identity import current_user
from celeryops.ops.drain.engine import Drain, DrainResult, restore_consumers
from celeryops.ops.drain.membership import held_by
from celeryops.ops.fleetwide.lease import LeaseHeld, read_lease
from celeryops.ops.fleetwide.publish import Publisher
from celeryops.ops.journal import ADD_CONSUMERS, PHASES, Phase, Run, queue_json
from celeryops.ops.run.hooks import JournalHooks, restore_settlement, unverified
from celeryops.ops.run.recovery import RecoveryPlan, Rollout, plan
from celeryops.ops.run.runnerbase import RunnerBase
from celeryops.ops.run.stranded import REMEDY, Stranded, last_restore, stranded, stranded_text
from celeryops.ops.run.writeahead import written_ahead

log = logging.getLogger(__name__)

T = TypeVar("T")
Outcome = Literal["drained", "timeout", "interrupted", "error"]


@dataclass
class Runner(RunnerBase):
    """The engine of one run session on one fleet (the wiring makes one per session): the drain, written ahead, and
    the recovery rules applied by ``abort``."""

    # -- drain -------------------------------------------------------------------------------------------------

    async def drain(self, *, queues: tuple[str, ...] = (), settings: DrainSettings = DrainSettings(),
                    forget: tuple[str, ...] = (), take_over: bool = False, release: str | None = None,
                    keep_lease: bool = False, extra_settings: dict[str, Any] | None = None) -> tuple[Outcome, Run]:
        """Stop consumers and wait until drained. ``drained``: consumers stay stopped (the run stays open in
        phase ``drained`` until a deploy or ``abort``); ``timeout``/``interrupted``: consumers restored, aborted.
        ``keep_lease``: a drained run keeps the lease (the deploy follows; call ``release_lease`` after)."""
        self._refuse_if_read_only("stop consumers")
        self._deploy_follows = keep_lease
        settings.validate()
        run = await self.open_run(release=release, take_over=take_over, settings={
            "queues": list(queues), "interval": settings.interval, "streak": settings.streak,
            "max_wait": settings.max_wait, "forget": list(forget), **(extra_settings or {})})
        outcome = await self._drain_holding(run, queues, settings, forget, keep_lease)
        return outcome, await self.journal.aio.get(run.id)

    async def open_run(self, *, release: str | None, settings: dict[str, Any], take_over: bool = False) -> Run:
        """A new run of this fleet in the journal, with the fleet's lease held for it (``release_lease`` after):
        refused, changing nothing, while another run holds the lease or an unfinished one holds the fleet
        (consumers it stopped, a worker pool it changed)."""
        self._refuse_if_read_only("start a run")
        self._loop = asyncio.get_running_loop()
        await self.fleet.check_broker()
        open_run = self.unfinished()
        if self.coord is not None and not take_over:
            holder = await (self._after_steps() if self.waits_for_steps  # a step of the autoscaler is waited for
                            else self.lease_holder())
            if holder is not None:
                raise LeaseHeld(self.fleet_name, holder)
            open_run = self.unfinished()
        if open_run is not None and open_run.holds_fleet() and not take_over:
            held = ("stopped consumers: nothing was changed; run `celeryops abort` to restore them"
                    if open_run.stopped_consumers() else
                    "a worker pool it changed: nothing was changed; run `celeryops abort` to undo that")
            raise UserError(
                f"Run {open_run.id} ({open_run.phase}, started by {open_run.user}@{open_run.host}) is unfinished "
                f"and still holds {held}, or `celeryops resume` to continue it.", EXIT_FAILURE)
        if take_over and self.coord is not None:
            holder = await asyncio.to_thread(read_lease, self.coord, self.fleet_name)
            if holder is not None and not holder.orphaned and not holder.dead_here:
                raise LeaseHeld(self.fleet_name, holder, taking_over=holder.run_id)
            if open_run is not None:
                await self.abort(run=open_run)
        # Journalled and under the lease as one: an interruption (Ctrl-C, a stop) lands after both, and the run
        # then ends "not started" with the lease given back (no run left open, no lease held by nobody).
        opening = asyncio.ensure_future(self._create_holding(release, settings, take_over))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            await uncut(self._not_started(opening))
            raise

    async def _create_holding(self, release: str | None, settings: dict[str, Any], take_over: bool) -> Run:
        run = await self.journal.aio.create_run(fleet=self.fleet_name, broker=self.fleet.broker_url, release=release,
                                                settings=settings)
        try:
            await self._acquire(run, take_over)
        except BaseException as exc:
            await self.journal.aio.advance(run.id, "aborted", reason=f"not started: {exc}")
            raise
        return run

    async def _not_started(self, opening: asyncio.Future[Run]) -> None:
        """A run interrupted while it was being opened: once opened, it ends aborted and its lease is given back
        (one that could not be opened has ended already)."""
        try:
            run = await opening
        except Exception:  # refused or failed: it changed nothing and ended itself
            return
        try:
            await self.advance(run.id, "aborted", reason="not started: interrupted")
        finally:
            await self.release_lease()

    async def _drain_holding(self, run: Run, queues: tuple[str, ...], settings: DrainSettings,
                             forget: tuple[str, ...], keep_lease: bool) -> Outcome:
        """Drain with the lease already held; give it back after, unless a drained run keeps it for its deploy
        (a drained run that ends here parks its fence: the consumers stay stopped until a deploy or abort)."""
        outcome: Outcome = "error"
        try:
            outcome = await self._drain_run(run, queues, settings, forget)
        finally:
            if not (keep_lease and outcome == "drained"):
                if outcome == "drained":
                    await self.park_fence()
                await self.release_lease()
        return outcome

    async def _drain_run(self, run: Run, queues: tuple[str, ...], settings: DrainSettings,
                         forget: tuple[str, ...]) -> Outcome:
        wake = asyncio.Event()
        watch = await start_watch(self.fleet.app, wake) if self.settings.task_events else None
        try:
            return await self._drain_phases(run, queues, settings, forget, wake, watch)
        finally:
            if watch is not None:
                await asyncio.to_thread(watch.stop)

    async def _drain_phases(self, run: Run, queues: tuple[str, ...], settings: DrainSettings,
                            forget: tuple[str, ...], wake: asyncio.Event, watch: TaskWatch | None) -> Outcome:
        hooks = JournalHooks(self.journal, run.id, on_first_stop=self.raise_fence)
        prior = {w: tuple(sorted(q)) for w, q in run.stopped_consumers().items()}

        def on_event(event: Event) -> None:
            if watch is not None:
                watch.on_event(event)
            self.emit(event)

        drain = Drain(self.fleet, settings, queues=queues, forget=forget, on_event=on_event, hooks=hooks,
                      prior_stopped=prior, wake=wake, restore_patience=self.settings.recovery_patience)
        self._drain = drain
        if run.phase == "preflight":
            for name in forget:
                await self.journal.aio.note(run.id, {"forget": name, "by": current_user()})

        current = run.phase

        async def phase(to: Phase) -> None:
            nonlocal current
            if PHASES.index(current) >= PHASES.index(to):
                return  # resumed past it already
            await self.advance(run.id, to)
            current = to

        await phase("stopping")
        try:
            await drain.start()
            await phase("draining")
            result: DrainResult = await drain.run()
        except asyncio.CancelledError:
            await self._restore_after(drain, run, "interrupted", DrainFinished(
                outcome="interrupted", elapsed=drain.last.elapsed if drain.last else 0.0,
                message="Interrupted: consumers restored, nothing was killed."))
            raise
        except BaseException as exc:
            if drain.stopped:
                await self._restore_after(drain, run, "error")
            else:
                await self.advance(run.id, "aborted", reason=f"error: {exc}")
            raise
        if result.outcome == "drained":
            await phase("drained")
            follows = "rolling back next" if run.kind == "rollback" else "deploying next"
            message = (f"Drained: no task is running; {follows}." if self._deploy_follows else
                       "Drained: no task is running and the consumers stay stopped, ready for a deploy. "
                       "To undo: celeryops abort")
            self.emit(DrainFinished(outcome="drained", elapsed=result.elapsed, message=message))
            return "drained"
        await self._restore_after(drain, run, "timeout", DrainFinished(
            outcome="timeout", elapsed=result.elapsed,
            message=f"Timed out after {settings.max_wait:g}s waiting for {held_by(result.last)}: nothing was "
                    "killed, the consumers were restored and the run aborted; try again when that is over."))
        return "timeout"

    async def forget(self, name: str) -> None:
        """Treat ``name`` as gone in the running drain (known dead: it will not be waited for); recorded."""
        self._refuse_if_read_only("forget a worker")
        drain = self._drain
        if drain is None or drain.policy is None:
            raise UserError(f"No drain is running, so {name} was not forgotten: nothing was changed.", EXIT_FAILURE)
        drain.forget = tuple(sorted({*drain.forget, name}))
        drain.known.discard(name)
        open_run = self.unfinished()
        run_id = (self._held.run_id if self._held is not None else None) or (open_run.id if open_run else None)
        if run_id is not None:
            await self.journal.aio.note(run_id, {"forget": name, "by": current_user()})
        self.emit(Notice(level="warning", message=f"{name} is treated as gone from now on (recorded)."))

    async def resume(self, *, run: Run | None = None, keep_lease: bool = False) -> tuple[Outcome, Run]:
        """Continue the fleet's interrupted run from its phase: a run interrupted while stopping or draining
        re-enters the drain with the same settings (the consumers it stopped stay recorded for a restore).
        ``keep_lease``: a drained run keeps the lease for the deploy that follows (``release_lease`` after)."""
        self._refuse_if_read_only("resume the run")
        run = run or self.unfinished()
        if run is None:
            raise self.no_open_run("nothing was resumed", "; start one with `celeryops drain` or `celeryops deploy`")
        if run.phase == "drained" and not run.release:
            self.emit(Notice(level="info", message=f"Run {run.id} is already drained; its consumers stay stopped. "
                                                   "Deploy now, or undo with `celeryops abort`."))
            return "drained", run
        # A drained deploy run is drained again before its deploy: time has passed since (a fence may have expired).
        if run.phase not in ("preflight", "stopping", "draining") and not (run.phase == "drained" and run.release):
            raise UserError(f"Run {run.id} is in phase {run.phase}, which `celeryops resume` cannot continue yet: "
                            "nothing was changed; use `celeryops abort` to apply the recovery rules.", EXIT_FAILURE)
        await self.fleet.check_broker()
        st = run.settings
        settings = run.drain_settings()
        queues = tuple(st.get("queues") or ())
        forget = tuple(st.get("forget") or ())
        self._loop = asyncio.get_running_loop()
        await self._acquire(run, take_over=True, own_run=run.id)  # refused while its owner is alive
        await self.journal.aio.note(run.id, {"resumed_by": current_user(), "pid": os.getpid()})
        self._deploy_follows = keep_lease
        outcome = await self._drain_holding(run, queues, settings, forget, keep_lease)
        return outcome, await self.journal.aio.get(run.id)

    async def _restore_after(self, drain: Drain, run: Run, why: str, finished: DrainFinished | None = None) -> None:
        """Restore what the drain stopped (the fence first), mark the run aborted, then say how the drain ended (the
        last event of a drain-only run)."""
        if self.detached and why == "interrupted":
            self.emit(Notice(level="warning", message="The operator detached from the run: its consumers stay "
                                                      "stopped until `celeryops resume` or `celeryops abort`."))
            return
        # The fence goes first: a plugin worker that still saw it would stop the queue the restore just added back
        # (and the restore's check would report it missing). A second interrupt must not cut either short.
        await uncut(self.lift_fence(run.id))
        try:
            event = await uncut(drain.restore())
        except BrokerUnreachable:
            self.restore_failed = run.id
            raise
        await self.advance(run.id, "aborted", reason=why)
        if finished is not None:
            self.emit(finished)
        if not event.verified:
            self.emit(Notice(level="warning", message=unverified(event)))

    # -- abort / recovery --------------------------------------------------------------------------------------

    def recovery_plan(self, run: Run, rollout: Rollout | None = None) -> RecoveryPlan:
        return plan(run, rollout)

    async def abort(self, *, run: Run | None = None, rollout: Rollout | None = None,
                    force_restore: bool = False) -> tuple[RecoveryPlan, ConsumersRestored | None]:
        """Apply the recovery rules to the fleet's unfinished run (restore what it stopped, mark it aborted)."""
        self._refuse_if_read_only("abort the run")
        self._loop = asyncio.get_running_loop()
        run = run or await asyncio.to_thread(self.unfinished)
        if run is None:
            again = await asyncio.to_thread(self.journal.unconfirmed, self.fleet_name)
            if again is not None:
                return await self._restore_again(again)
            latest = await asyncio.to_thread(self.journal.latest_ended, self.fleet_name)
            lost = await self.stranded(latest)
            if not lost or latest is None:
                dropped = await self._ended_lease_dropped()
                if dropped:  # the process of a run that had ended died holding the lease: nothing else to do
                    return RecoveryPlan("nothing", {}, dropped), None
                raise self.no_open_run("nothing was changed")
            return await self._restore_stranded(latest, lost)
        await self._refuse_if_live(run, "abort it")
        decided = self.recovery_plan(run, rollout)
        if decided.action in ("retire", "cutover"):  # an overlap deploy: its own flow (RunSession.abort) recovers it
            raise UserError(f"Run {run.id} is an overlap deploy of a worker pool, which only its own recovery can "
                            "undo or finish: nothing was changed; run `celeryops abort` or `celeryops resume` "
                            "first.", EXIT_FAILURE)
        if decided.action == "ask" and force_restore:
            decided = RecoveryPlan("restore", {w: sorted(q) for w, q in run.stopped_consumers().items()},
                                   "The operator says the old revision still serves: restoring the consumers.",
                                   mark_as="aborted")
        restored: ConsumersRestored | None = None
        if decided.action in ("restore", "nothing"):
            await self.lift_fence(run.id)  # before the restore: a plugin worker would stop the queue again
        if decided.action == "restore":
            restored = await self._restore_recorded(run, decided.restore)
        if decided.mark_as is not None and decided.action != "ask":
            await self.advance(run.id, decided.mark_as, reason="abort")
            if self._pub is None and self.coord is not None:  # not our run's process: publish the end once
                pub = Publisher(self.coord, self.fleet_name, run_id=run.id, owner=run.user, host=run.host,
                                release=run.release, started_at=run.created, phase=decided.mark_as, kind=run.kind)
                pub.phase(decided.mark_as, reason="abort")
                await asyncio.to_thread(pub.flush, True)
                await self._drop_dead_lease(run.id)
        return decided, restored

    async def _ended_lease_dropped(self) -> str:
        """``abort`` with no run open: the fleet's lease dropped if its run has ended and its holder is gone (the
        sentence that says so), else ""."""
        if self.coord is None:
            return ""
        try:
            return await self.drop_ended_lease(await asyncio.to_thread(read_lease, self.coord, self.fleet_name))
        except redis.RedisError:
            return ""

    async def restore(self, run: Run, restore: Mapping[str, Iterable[str]]) -> ConsumersRestored:
        """Give ``run``'s stopped consumers ``restore`` (worker -> queues) back: written ahead, confirmed, settled."""
        return await self._restore_recorded(run, restore)

    async def _restore_again(self, run: Run) -> tuple[RecoveryPlan, ConsumersRestored | None]:
        """``abort`` once more after an unverified restore: send the restore again and confirm it (the run stays
        aborted)."""
        stopped = {w: sorted(qs) for w, qs in run.stopped_consumers().items()}
        decided = RecoveryPlan("restore", stopped, f"Run {run.id} had ended aborted with consumers it stopped never "
                                                   "confirmed back: its restore was sent again and checked.")
        await self.lift_fence(run.id)
        return decided, await self._restore_recorded(run, stopped)

    async def stranded(self, run: Run | None) -> tuple[Stranded, ...]:
        """The live workers ``run``'s last restore gave queues back to that consume nothing now (a broker reconnect
        made Celery forget them): asked with one active_queues round of those workers only."""
        found = last_restore(run) if run is not None and run.finished else None
        if not found or not found[0]:
            return ()
        consuming = await self.fleet.active_queues(sorted(found[0]))
        return stranded(run, consuming)

    async def _restore_stranded(self, run: Run, lost: tuple[Stranded, ...]) -> tuple[RecoveryPlan,
                                                                                      ConsumersRestored | None]:
        """``abort`` with no open run, when the last run's restore was undone by a broker reconnect: send it again
        to the workers that dropped back to nothing, and check it (the run stays as it ended)."""
        again = {s.worker: list(s.queues) for s in lost}
        decided = RecoveryPlan("restore", again, f"{stranded_text(lost)}: {REMEDY}. Its restore was sent again to "
                                                 "them and checked; if one drops back at the next broker reconnect, "
                                                 "restart it.")
        return decided, await self._restore_recorded(run, again)

    async def _restore_recorded(self, run: Run, restore: Mapping[str, Iterable[str]]) -> ConsumersRestored:
        """Restore ``restore`` for ``run`` (intent first, settled with whether it was confirmed), over a broker
        outage of up to the recovery patience; an unconfirmed restore is warned about."""
        record = {w: tuple(qs) for w, qs in restore.items()}
        # Workers the run stopped nothing on are named too, with nothing to add: a restore gives the drained queues
        # (by broadcast) only to workers the run never saw.
        named = {**{w: () for w in run.recorded_workers()}, **record}
        try:
            restored = await written_ahead(
                self.journal, run.id, ADD_CONSUMERS, {"add": queue_json(record)},
                lambda: restore_consumers(self.fleet, named, exclude=set(run.settings.get("forget", [])),
                                          patience=self.settings.recovery_patience, since=run.created,
                                          on_wait=self.emit), settle=restore_settlement, failed=())
        except BrokerUnreachable:  # the intent stays unsettled: recovery reads the consumers as still stopped
            self.restore_failed = run.id
            raise
        self.emit(restored)
        if not restored.verified:
            self.emit(Notice(level="warning", message=unverified(restored)))
        return restored


async def uncut(work: Awaitable[T]) -> T:
    """Run ``work`` to its end although the caller is being cancelled (a second interrupt must not cut a restore
    or a recovery short)."""
    task = asyncio.ensure_future(work)
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)
    return task.result()

