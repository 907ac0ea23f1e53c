"""What a run's engine holds while it runs (:class:`RunnerBase`, under :class:`~celeryops.ops.run.runner.Runner`):
the fleet's run lease (one run at a time per fleet), the live status mirrored to Redis for watchers (every event the
run emits goes there too), the fence, the journal's phases, and the refusals when another process still holds the
run. The drain and the recovery rules are the runner's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import redis

from celeryops.adapters.fleet import Fleet
from celeryops.core.aio import cancel_and_wait
from celeryops.core.errors import EXIT_BROKER, EXIT_FAILURE, ReadOnlyRefused, UserError
from celeryops.core.events import DrainProgress, Event, Notice, PhaseChanged
from celeryops.core.identity import current_user
from celeryops.core.runsettings import RunSettings
from celeryops.core.untrusted import MalformedRecord
from celeryops.fence import FenceStore
from celeryops.ops.drain.engine import Drain
from celeryops.ops.drain.runfence import RunFence
from celeryops.ops.fleetwide.lease import (
    LeaseHeld,
    LeaseInfo,
    RunLease,
    drop_dead_lease,
    drop_want,
    read_lease,
    want_fleet,
)
from celeryops.ops.fleetwide.publish import Publisher
from celeryops.ops.journal import Journal, Phase, Run

log = logging.getLogger(__name__)

#: How long a run waits for a step of the autoscaler that holds the fleet (a cohort drained and taken away: the
#: drain's confirmation and a rollout) before it is refused like any other holder's.
STEP_PATIENCE = 900.0


@dataclass
class RunnerBase:
    """What the engine of one run session on one fleet holds (see the module); its events go to ``on_event``, the
    session's sink (the printer, or the console's run)."""

    fleet: Fleet
    journal: Journal
    fleet_name: str = "default"
    on_event: Callable[[Event], None] = lambda e: None
    read_only: bool = False
    coord: redis.Redis | None = None  # Redis for the lease and the published status (None: not available)
    settings: RunSettings = field(default_factory=RunSettings)  # lease/fence TTLs, task events
    # A run opened while a step of the autoscaler holds the fleet waits for it (the autoscaler's own steps do not).
    waits_for_steps: bool = True
    # The console's "detach" (RunSession.detach): an interruption then leaves the consumers stopped and the run open
    # for `resume`.
    detached: bool = field(default=False, init=False)
    # A restore of this process that the broker never let finish (it stayed down past the patience): the run id.
    restore_failed: str | None = field(default=None, init=False)
    _drain: Drain | None = field(default=None, init=False)
    _held: RunLease | None = field(default=None, init=False)
    _deploy_follows: bool = field(default=False, init=False)
    _pub: Publisher | None = field(default=None, init=False)
    _fence: RunFence | None = field(default=None, init=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)

    def _refuse_if_read_only(self, what: str) -> None:
        if self.read_only:
            raise ReadOnlyRefused(what)

    def journal_warning(self, message: str) -> None:
        """The journal could not copy a record to the fleet's Redis (called from the journal's thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            log.warning("%s", message)
            return
        loop.call_soon_threadsafe(self.emit, Notice(level="warning", message=message))

    def emit(self, event: Event) -> None:
        """To the operator's sink, and to the published status while this process holds the run."""
        if self._pub is not None and not isinstance(event, PhaseChanged):
            if isinstance(event, DrainProgress):
                self._pub.progress(event.to_json())
            else:
                self._pub.event(event.kind, event.to_json())
        self.on_event(event)

    async def advance(self, run_id: str, phase: Phase, reason: str | None = None) -> None:
        """The run moves to ``phase``: journalled first, then published and emitted."""
        self._loop = asyncio.get_running_loop()
        await self.journal.aio.advance(run_id, phase, reason=reason)
        if self._pub is not None:
            self._pub.phase(phase, **({"reason": reason} if reason else {}))
            await self._pub.caught_up()  # published before the step it announces (watchers, a death right after)
        self.on_event(PhaseChanged(phase, reason or ""))

    # -- the current run ---------------------------------------------------------------------------------------

    def unfinished(self) -> Run | None:
        runs = self.journal.unfinished_runs(self.fleet_name)
        return runs[-1] if runs else None

    def left_stopped(self) -> Run | None:
        """After an interrupted run: the fleet's open run if a restore of this process could not finish (the broker
        stayed down) and its consumers are still recorded as stopped, else None."""
        if self.restore_failed is None:
            return None
        run = self.unfinished()
        return run if run is not None and run.id == self.restore_failed and run.stopped_consumers() else None

    def no_open_run(self, nothing: str, then: str = "") -> UserError:
        """The error when there is no unfinished run to act on. When the fleet's Redis did not answer, a run another
        machine started may be open there: say so (exit 4), rather than that there is none."""
        if self.journal.fleet_unread is not None:
            return UserError("The local journal has no unfinished run for this fleet and the fleet's Redis did not "
                             f"answer ({self.journal.fleet_unread}), so a run started on another machine cannot be "
                             f"seen: {nothing}; try again when Redis answers (`celeryops status`).", EXIT_BROKER)
        return UserError(f"There is no unfinished run for this fleet in the journal: {nothing}{then}.", EXIT_FAILURE)

    async def _acquire(self, run: Run, take_over: bool, own_run: str | None = None) -> None:
        """Take the fleet's run lease (one run at a time), start the status mirror and the fence keeper."""
        if self.coord is None:
            self.emit(Notice(level="warning", message="No Redis for the run lease: another operator could start "
                                                      "a run on this fleet at the same time."))
            return
        lease = RunLease(self.coord, self.fleet_name, run.id, ttl=self.settings.lease_ttl)
        expected = ""
        try:
            if take_over:
                holder = await asyncio.to_thread(read_lease, self.coord, self.fleet_name)
                if holder is not None and holder.dead_here and (own_run is None or holder.run_id == own_run):
                    await asyncio.to_thread(drop_dead_lease, self.coord, self.fleet_name, holder.run_id)
                    holder = await asyncio.to_thread(read_lease, self.coord, self.fleet_name)
                expected = holder.run_id if holder is not None else ""
                if holder is not None and own_run is not None and holder.run_id != own_run:
                    raise LeaseHeld(self.fleet_name, holder, taking_over=own_run)
            if expected:
                await asyncio.to_thread(lease.take_over, expected)
            else:
                await asyncio.to_thread(lease.acquire)
        except redis.RedisError as exc:
            raise UserError(f"Cannot take the run lease in Redis ({exc}): nothing was changed; check Redis.",
                            EXIT_FAILURE) from None
        lease.start_heartbeat()
        self._held = lease
        self._pub = Publisher(self.coord, self.fleet_name, run_id=run.id, owner=run.user, host=run.host,
                              release=run.release, started_at=run.created, phase=run.phase, kind=run.kind)
        self._pub.start()
        self._fence = RunFence(FenceStore(self.coord, self.fleet_name), run.id, self.settings, self.emit)

    async def release_lease(self) -> None:
        """Stop the heartbeats and give the lease back (the fence, if any, is left to expire unless lifted)."""
        lease, self._held = self._held, None
        pub, self._pub = self._pub, None
        if self._fence is not None:
            await self._fence.stop_keeping()
        if pub is not None:
            await pub.close()
        if lease is not None:
            await lease.stop_heartbeat()
            with contextlib.suppress(redis.RedisError):
                await asyncio.to_thread(lease.release)

    @property
    def _who(self) -> str:
        """This process, as it says that it waits for the fleet."""
        return f"{current_user()}@{socket.gethostname()} pid {os.getpid()}"

    async def lease_holder(self) -> LeaseInfo | None:
        """The fleet's lease holder (read in Redis: ``redis.RedisError`` when it does not answer). A lease whose
        holder is gone (orphaned) and whose run has ended in the journal (its process died between the run's last
        record and giving the lease back) holds nothing any more: it is dropped first, from any machine, said once,
        and the run's published status says how it ended. A live holder's lease, or an orphaned one of a run still
        open, stays."""
        assert self.coord is not None
        holder = await asyncio.to_thread(read_lease, self.coord, self.fleet_name)
        said = await self.drop_ended_lease(holder)
        if not said:
            return holder
        self.emit(Notice(level="info", message=said))
        return await asyncio.to_thread(read_lease, self.coord, self.fleet_name)

    async def drop_ended_lease(self, holder: LeaseInfo | None) -> str:
        """The lease of ``holder`` dropped if it is orphaned and its run has ended (see :meth:`lease_holder`):
        the sentence that says so, else ""."""
        assert self.coord is not None
        ended = await asyncio.to_thread(self._ended, holder.run_id) if holder and holder.orphaned else None
        if holder is None or ended is None:
            return ""
        if not await asyncio.to_thread(drop_dead_lease, self.coord, self.fleet_name, holder.run_id):
            return ""
        await asyncio.to_thread(self._publish_end, ended)
        return (f"Run {holder.run_id} had ended ({ended.phase}), but its process was gone before it gave the "
                f"fleet's lease back ({holder.describe()}): the lease is dropped.")

    def _ended(self, run_id: str) -> Run | None:
        """Run ``run_id`` if it has ended, as this journal or the fleet's copy (any machine's run) says; None when it
        is open, neither knows it, or they cannot be read."""
        try:
            run = self.journal.get(run_id)
        except UserError:  # an unknown run, or a journal that cannot be read: not known to have ended
            return None
        if run.finished:
            return run
        store = self.journal.fleet_copy.store_for(self.fleet_name)
        try:
            held = store.read(run_id) if store is not None else None
        except (redis.RedisError, UserError):
            return None
        return held.run if held is not None and held.run.finished else None

    def _publish_end(self, run: Run) -> None:
        """The fleet's published status, where it still shows ``run`` (ended) in an earlier phase: its end."""
        from celeryops.ops.fleetwide.publish import read_status

        assert self.coord is not None
        with contextlib.suppress(redis.RedisError, UserError):
            published = read_status(self.coord, self.fleet_name)
            if published is None or published.run_id != run.id or published.phase == run.phase:
                return
            pub = Publisher(self.coord, self.fleet_name, run_id=run.id, owner=run.user, host=run.host,
                            release=run.release, started_at=run.created, phase=run.phase, kind=run.kind)
            pub.phase(run.phase)
            pub.flush(True)

    async def _after_steps(self) -> LeaseInfo | None:
        """The fleet's lease holder once no live step of the autoscaler holds it: meanwhile this run waits (it says
        so once, and asks the autoscaler to start no new step), up to :data:`STEP_PATIENCE`."""
        assert self.coord is not None
        who = self._who
        deadline = time.monotonic() + STEP_PATIENCE
        said = False
        while True:
            holder = await self.lease_holder()
            if (holder is None or holder.orphaned or time.monotonic() > deadline
                    or not await asyncio.to_thread(self._is_step, holder.run_id)):
                if said and holder is not None:
                    with contextlib.suppress(redis.RedisError):
                        await asyncio.to_thread(drop_want, self.coord, self.fleet_name, who)
                return holder
            await asyncio.to_thread(want_fleet, self.coord, self.fleet_name, who, self.settings.lease_ttl)
            if not said:
                said = True
                self.emit(Notice(level="info", message=f"Run {holder.run_id}, a step of the autoscaler, holds the "
                                                       "fleet: waiting for it to end (the autoscaler starts no new "
                                                       "step meanwhile)."))
            await asyncio.sleep(0.5)

    @contextlib.asynccontextmanager
    async def going_first(self) -> AsyncIterator[None]:
        """Around a run's preflight: a live step of the autoscaler that holds the fleet is waited for first (the
        pool update it sent ends with it), and the autoscaler is told that this run waits for the fleet, so that it
        starts no new step while the checks look: they see the pool as the run will find it. The word is withdrawn
        when the block raises; else it is left to expire (the run takes the lease next)."""
        if self.coord is None or not self.waits_for_steps or self.read_only:
            yield
            return
        # a Redis that does not answer, or a lease it holds that is malformed: the checks say so, as a failed check
        with contextlib.suppress(redis.RedisError, MalformedRecord):
            await self._after_steps()
        keeper = asyncio.ensure_future(self._keep_wanting())
        try:
            yield
        except BaseException:
            await self.drop_want()
            raise
        finally:
            await cancel_and_wait(keeper)

    async def _keep_wanting(self) -> None:
        assert self.coord is not None
        while True:
            with contextlib.suppress(redis.RedisError):
                await asyncio.to_thread(want_fleet, self.coord, self.fleet_name, self._who, self.settings.lease_ttl)
            await asyncio.sleep(max(0.2, self.settings.lease_ttl / 3))

    async def drop_want(self) -> None:
        """This process no longer waits for the fleet (a run that ended at its preflight)."""
        if self.coord is not None:
            with contextlib.suppress(redis.RedisError):
                await asyncio.to_thread(drop_want, self.coord, self.fleet_name, self._who)

    def _is_step(self, run_id: str) -> bool:
        """Whether ``run_id`` is a step of the autoscaler: as its published status says (also in the moment between
        its end and its lease given back), or as the journal's open runs say."""
        from celeryops.ops.fleetwide.publish import read_status

        assert self.coord is not None
        with contextlib.suppress(redis.RedisError, UserError):
            published = read_status(self.coord, self.fleet_name)
            if published is not None and published.run_id == run_id:
                return published.kind == "autoscale"
        return any(r.id == run_id and r.kind == "autoscale" for r in self.journal.unfinished_runs(self.fleet_name))

    # -- fence (ops/drain/runfence.py) -------------------------------------------------------------------------

    def _the_fence(self) -> RunFence | None:
        """The fence of the run this process holds; else, to lift one after the fact, the fleet's."""
        if self._fence is not None:
            return self._fence
        return RunFence(FenceStore(self.coord, self.fleet_name), None, self.settings, self.emit) if self.coord else None

    async def raise_fence(self, queues: tuple[str, ...], *, only_revisions: tuple[str, ...] = (),
                          exempt_revisions: tuple[str, ...] = ()) -> None:
        if self._fence is not None:
            await self._fence.raise_(queues, current_user(), only_revisions=only_revisions,
                                     exempt_revisions=exempt_revisions)

    async def exempt_from_fence(self, versions: list[str], revisions: list[str] | None = None) -> None:
        if self._fence is not None:
            await self._fence.exempt(versions, revisions or [])

    async def park_fence(self) -> None:
        if self._fence is not None:
            await self._fence.park()

    async def lift_fence(self, run_id: str | None = None) -> None:
        fence = self._the_fence()
        if fence is not None:
            await fence.lift(run_id)

    async def hold(self, run: Run) -> None:
        """Take the lease of an interrupted run of ours again (to finish it); ``release_lease`` after."""
        self._refuse_if_read_only("resume the run")
        await self._acquire(run, take_over=True, own_run=run.id)

    async def _drop_dead_lease(self, run_id: str) -> None:
        """The run is over: free the fleet from its lease if its owner is gone (a live owner keeps it)."""
        assert self.coord is not None
        with contextlib.suppress(redis.RedisError):
            await asyncio.to_thread(drop_dead_lease, self.coord, self.fleet_name, run_id)

    async def _refuse_if_live(self, run: Run, doing: str) -> None:
        """Another process still runs ``run`` (its lease is alive): acting on it would fight that process."""
        if self.coord is None or self._held is not None:
            return
        try:
            holder = await asyncio.to_thread(read_lease, self.coord, self.fleet_name)
        except redis.RedisError:
            return
        if holder is not None and holder.run_id == run.id and not holder.orphaned and not holder.dead_here:
            raise UserError(f"Run {run.id} is still running ({holder.describe()}): nothing was changed; stop it with "
                            f"Ctrl-C where it runs (it restores the consumers itself), or wait until its lease "
                            f"expires before you {doing}.", EXIT_FAILURE)
