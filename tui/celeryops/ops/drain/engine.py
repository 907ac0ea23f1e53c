"""The drain: stop every worker from taking new tasks and wait until nothing runs (no Textual).

Policy (pure, see ``judge``): drained only when every known worker replied AND active + reserved == 0, observed
``streak`` times in a row at ``interval``; any non-zero or unknown observation resets the streak. ETA/countdown
tasks (scheduled) are reported and warned about, not counted. ``max_wait`` ends the drain as timed out: nothing
is killed or revoked; the caller restores the consumers (``Drain.restore``) exactly as they were.

The loop (``Drain``) re-broadcasts ``cancel_consumer`` for every queue at every poll, after observing, so a
worker that scaled out since the last poll is seen with its own queues first, then stopped within one poll.
A drain with a member ``scope`` (an overlap deploy: the old revision's workers) observes, stops and restores only the
workers in scope, addressing them by name: the others (the new revision's) keep consuming, and are never waited for.
Membership is by evidence (``celeryops.ops.drain.membership``): a silent worker leaves the known set only when evidence
says it is gone, and is otherwise named with how long it has been silent and the remedy. On AMQP, drained also
needs the drained queues' consumer counts at 0 (a busy solo worker answers nothing but keeps its consumer).
Putting stopped consumers back (``restore_consumers``, which recovery runs too) is in :mod:`.restore`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from celeryops.adapters.fleet import Fleet
from celeryops.core.config import DrainSettings
from celeryops.core.errors import BrokerUnreachable
from celeryops.core.events import (
    ConsumersCancelled,
    ConsumersRestored,
    DrainProgress,
    DrainStarted,
    Event,
    Notice,
    Observation,
)
from celeryops.ops.drain.membership import (
    BINDING,
    Evidence,
    Membership,
    alive_by_heartbeat,
    consumers_warning,
    remedy,
)
from celeryops.ops.drain.restore import BROADCAST, RESTORE_PATIENCE, restore_consumers

__all__ = ["BROADCAST", "RESTORE_PATIENCE", "Drain", "DrainHooks", "DrainResult", "NoHooks", "NoWorkers", "PolicyState",
           "Verdict", "judge", "restore_consumers"]


# -- the pure policy --------------------------------------------------------------------------------------------

Status = Literal["continue", "drained", "timeout"]


@dataclass(frozen=True)
class PolicyState:
    started: float
    streak: int = 0
    polls: int = 0


@dataclass(frozen=True)
class Verdict:
    status: Status
    streak: int
    elapsed: float
    remaining: float


def judge(settings: DrainSettings, state: PolicyState, empty: bool, now: float) -> tuple[PolicyState, Verdict]:
    """The drain verdict from one observation (``empty``: every known worker replied and none holds an active or
    reserved task) and the clock. Pure: no I/O."""
    streak = state.streak + 1 if empty else 0
    elapsed = max(0.0, now - state.started)
    remaining = max(0.0, settings.max_wait - elapsed)
    new = replace(state, streak=streak, polls=state.polls + 1)
    if streak >= settings.streak:
        return new, Verdict("drained", streak, elapsed, remaining)
    if elapsed >= settings.max_wait:
        return new, Verdict("timeout", streak, elapsed, 0.0)
    return new, Verdict("continue", streak, elapsed, remaining)


# -- the loop ---------------------------------------------------------------------------------------------------


class DrainHooks(Protocol):
    """Durable records around side effects (the run journal). ``before_*`` is awaited BEFORE the side effect."""

    async def before_stop(self, stops: dict[str, tuple[str, ...]], before: dict[str, tuple[str, ...]]) -> None:
        """About to cancel ``stops`` (worker or "*" -> queues); ``before``: what those workers consumed."""

    async def before_restore(self, restore: dict[str, tuple[str, ...]]) -> None: ...

    async def after_restore(self, event: ConsumersRestored) -> None: ...

    async def member_changed(self, name: str, change: Literal["gone", "rejoined"], evidence: str) -> None:
        """A known worker left the known set by evidence, or answered again (a record, no side effect)."""


class NoHooks:
    async def before_stop(self, stops: dict[str, tuple[str, ...]], before: dict[str, tuple[str, ...]]) -> None:
        return None

    async def before_restore(self, restore: dict[str, tuple[str, ...]]) -> None:
        return None

    async def after_restore(self, event: ConsumersRestored) -> None:
        return None

    async def member_changed(self, name: str, change: Literal["gone", "rejoined"], evidence: str) -> None:
        return None


class NoWorkers(BrokerUnreachable):
    pass


@dataclass
class DrainResult:
    outcome: Literal["drained", "timeout"]
    elapsed: float
    polls: int
    last: DrainProgress | None


@dataclass
class Drain:
    """One drain of one fleet. ``start()`` stops the consumers, ``run()`` polls to a verdict, ``restore()`` puts
    every stopped consumer back. The stop record (``stopped``) is what recovery needs to undo it."""

    fleet: Fleet
    settings: DrainSettings = field(default_factory=DrainSettings)
    queues: tuple[str, ...] = ()
    forget: tuple[str, ...] = ()
    on_event: Callable[[Event], None] = lambda e: None
    hooks: DrainHooks = field(default_factory=NoHooks)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    prior_stopped: dict[str, tuple[str, ...]] = field(default_factory=dict)  # from an interrupted run (resume)
    restore_patience: float = RESTORE_PATIENCE  # seconds the restore retries while the broker or a worker is slow
    # Only these workers are drained: ``scope()`` names the workers in scope now (a worker once in scope stays in
    # it); ``scope_label`` says who they are in messages ("of revision worker-00001-abc"). None: the whole fleet.
    # A scoped drain sends its stops by name (never a broadcast), so its stop record has no "*" entry.
    scope: Callable[[], Awaitable[set[str]]] | None = None
    scope_label: str = ""
    in_scope: set[str] = field(default_factory=set)
    # state
    known: set[str] = field(default_factory=set)
    stopped: dict[str, tuple[str, ...]] = field(default_factory=dict)
    baseline: dict[str, tuple[str, ...]] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    membership: Membership = field(default_factory=Membership)
    policy: PolicyState | None = None
    last: DrainProgress | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    # -- phases ------------------------------------------------------------------------------------------------

    async def start(self) -> DrainStarted:
        """Discover the fleet, record what will be stopped (write-ahead), then broadcast cancel_consumer."""
        self.settings.validate()
        await self.fleet.check_broker()
        self.in_scope |= {w for w in self.prior_stopped if w != BROADCAST}
        members = await self._scoped(await self.fleet.members())
        if self.scope is not None:
            answered = await self._scoped(await self.fleet.ping(sorted(members))) if members else set()
        else:
            answered = await self.fleet.ping(limit=len(members) or None)
        members |= answered
        forgotten = set(self.forget)
        answered -= forgotten
        # A scoped drain taken up again over workers this run stopped already (a resume, an abort finishing a
        # cutover): silent ones are not "no worker" but members like any other (unknown is never empty), waited for
        # until they answer or the evidence says they left (a reconnect after a broker restart, a warm shutdown).
        resumed = self.scope is not None and bool(set(self.prior_stopped) - {BROADCAST})
        if not answered and not resumed:
            silent = sorted(members - forgotten)
            hint = f" ({len(silent)} registered but silent: {', '.join(silent[:5])})" if silent else ""
            whose = f" {self.scope_label}" if self.scope_label else ""
            raise NoWorkers(f"No worker{whose} answered on {self.fleet.display_url}{hint}: nothing was stopped; "
                            "check that workers run against this broker (or --forget dead ones).")
        self.known = members - forgotten
        self.baseline = await self.fleet.active_queues(sorted(answered)) if answered else {}
        if not self.queues:
            self.queues = tuple(sorted({q for qs in (*self.baseline.values(), *self.prior_stopped.values())
                                        for q in qs}))
        if not self.queues:
            raise NoWorkers("The workers that answered consume no queue: nothing was stopped; pass --queue.")
        drained = set(self.queues)
        stops = {w: tuple(q for q in qs if q in drained) for w, qs in self.baseline.items()}
        if self.scope is None:
            stops[BROADCAST] = self.queues
        else:  # silent ones (busy) get the stop by name too: their own queues were never seen, so all drained ones
            stops.update({w: self.queues for w in sorted(self.known - set(self.baseline))})
        await self.hooks.before_stop(stops, dict(self.baseline))
        for worker, qs in self.prior_stopped.items():
            stops[worker] = tuple(sorted(set(stops.get(worker, ())) | set(qs)))
        self.stopped = stops
        event = DrainStarted(queues=self.queues, workers=dict(self.baseline), interval=self.settings.interval,
                             streak=self.settings.streak, max_wait=self.settings.max_wait,
                             forgotten=tuple(sorted(forgotten)))
        self.on_event(event)
        acked: set[str] = set()
        destination = self._destination()
        for queue in self.queues if destination != [] else ():  # nobody left in scope: never a broadcast
            acked |= await self.fleet.cancel_consumer(queue, destination, reply=True,
                                                      expect=len(self.known) or None)
        self.on_event(ConsumersCancelled(queues=self.queues, acknowledged=tuple(sorted(acked))))
        self.policy = PolicyState(started=self.clock())
        for name in self.known - answered:  # silent from the start (the clock of "silent for" starts here)
            self.membership.silent_since.setdefault(name, self.policy.started)
        return event

    async def poll(self) -> DrainProgress:
        """Observe, judge, then re-broadcast cancel_consumer (workers that scaled out stop within one poll)."""
        assert self.policy is not None, "start() first"
        members, before = await asyncio.gather(self.fleet.members(), self.fleet.pidbox_listeners())
        members = await self._scoped(members)
        forget = set(self.forget)
        obs = self._only_scope(await self.fleet.observe((self.known | self.gone | members) - forget, self.queues))
        bindings, evidence, counts = await self._evidence(obs, before)
        joined, left = await self._update_membership(obs, bindings, evidence)
        obs = self._mark_gone(obs)
        consumers = {q: -1 if n is None else n for q, n in counts.items()}  # AMQP; -1: the broker could not tell
        now = self.clock()
        state, verdict = judge(self.settings, self.policy, obs.empty and not any(consumers.values()), now)
        self.policy = state
        silent = self.membership.silent_for(obs.unknown, now)
        alive = alive_by_heartbeat(silent, evidence)
        warnings = [remedy(n) for n in silent if n not in alive]
        if any(consumers.values()):
            warnings.append(consumers_warning(consumers))
        if obs.scheduled:
            warnings.append(f"{obs.scheduled} ETA/countdown task(s) are held by workers: they are not waited for "
                            "and will run on their worker when due (or return to the queue on a warm shutdown).")
        progress = DrainProgress(
            elapsed=verdict.elapsed, remaining=verdict.remaining, streak=verdict.streak,
            required=self.settings.streak, active=obs.active, reserved=obs.reserved, scheduled=obs.scheduled,
            unknown=tuple(obs.unknown), workers=obs.workers, tasks=obs.tasks, warnings=tuple(warnings),
            joined=tuple(sorted(joined)), left=tuple(sorted(left)), silent=silent, alive=alive,
            consumers=consumers)
        self.last = progress
        self.on_event(progress)
        destination = self._destination()
        if verdict.status == "continue" and destination != []:
            for queue in self.queues:
                await self.fleet.cancel_consumer(queue, destination, reply=False)
        return progress

    async def run(self) -> DrainResult:
        """Start (unless started) and poll until drained or timed out. Never kills, never revokes."""
        if self.policy is None:
            await self.start()
        assert self.policy is not None
        while True:
            began = self.clock()
            self.wake.clear()  # a task that ends while we poll still shortens the next pause
            progress = await self.poll()
            assert self.policy is not None
            if progress.streak >= self.settings.streak:
                return DrainResult("drained", progress.elapsed, self.policy.polls, progress)
            if progress.remaining <= 0:
                return DrainResult("timeout", progress.elapsed, self.policy.polls, progress)
            # Polls start ``interval`` apart (not interval + poll time); ``wake`` may end the pause early, and the
            # verdict still needs ``streak`` empty observations in a row.
            await self._pause(min(self.settings.interval - (self.clock() - began), progress.remaining))

    async def restore(self) -> ConsumersRestored:
        """Put back exactly the consumers this drain stopped, then verify with active_queues."""
        record = dict(self.stopped)
        await self.hooks.before_restore(record)
        event = await restore_consumers(self.fleet, record, known=self.known, exclude=set(self.forget) | self.gone,
                                        patience=self.restore_patience, on_wait=self.on_event)
        await self.hooks.after_restore(event)
        self.on_event(event)
        return event

    # -- helpers -----------------------------------------------------------------------------------------------

    async def _scoped(self, names: set[str]) -> set[str]:
        """``names`` within the drain's scope (all of them without one); the scope is read again each time."""
        if self.scope is None:
            return set(names)
        self.in_scope |= await self.scope()
        return set(names) & self.in_scope

    def _only_scope(self, obs: Observation) -> Observation:
        """A scoped drain's observation holds only the workers in scope (a round addressed to nobody is a
        broadcast: others may have answered it)."""
        if self.scope is None:
            return obs
        return Observation(workers={n: w for n, w in obs.workers.items() if n in self.in_scope},
                           tasks=tuple(t for t in obs.tasks if t.worker in self.in_scope))

    def _destination(self) -> list[str] | None:
        """Where a stop goes: every worker (None: a broadcast), or a scoped drain's known workers by name."""
        return None if self.scope is None else sorted(self.known)

    async def _pause(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if not self.wake.is_set():
            sleeper = asyncio.ensure_future(self.sleep(seconds))
            waker = asyncio.ensure_future(self.wake.wait())
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waker.cancel()
        if self.wake.is_set():
            self.on_event(Notice(level="info", message="The tasks in flight have finished (task events): "
                                                       "polling again now."))

    async def _evidence(self, obs: Observation, before: int | None
                        ) -> tuple[set[str] | None, Evidence, dict[str, int | None]]:
        """Bindings (Redis), and what says whether silent workers live: plugin heartbeats, the listeners on the
        control channel (the larger of the reads before and after the observation: a worker that answered and
        died in between still counts), each silent worker's pidbox queue (AMQP); and the drained queues' consumer
        counts (AMQP)."""
        silent = sorted(n for n, w in obs.workers.items() if not w.replied)
        bindings, heartbeats, after, pidbox, counts = await asyncio.gather(
            self.fleet.pidbox_members(), self.fleet.heartbeats(), self.fleet.pidbox_listeners(),
            self.fleet.pidbox_consumers(silent), self.fleet.queue_consumers(self.queues))
        listeners = None if before is None or after is None else max(before, after)
        return bindings, Evidence(listeners=listeners, heartbeats=heartbeats, pidbox=pidbox), counts

    async def _update_membership(self, obs: Observation, bindings: set[str] | None,
                                 evidence: Evidence = Evidence()) -> tuple[set[str], set[str]]:
        replied = {n for n, w in obs.workers.items() if w.replied}
        left: set[str] = set()
        if bindings is not None:
            # On Redis, a worker that shut down cleanly removes its pidbox binding: it left the fleet.
            left = {n for n in self.known - self.gone if n not in bindings and n not in replied}
            self.membership.left(left)
        silent = {n for n, w in obs.workers.items() if not w.replied} - self.gone - left - set(self.forget)
        departed, rejoined = self.membership.update(self.clock(), silent, replied, evidence)
        for name in sorted(rejoined & self.gone):
            self.gone.discard(name)
            self.known.add(name)
            self.on_event(Notice(level="info", message=f"{name} answers again: it rejoined the fleet and is "
                                                       "waited for like every known worker."))
            await self.hooks.member_changed(name, "rejoined", "it answered")
        for name in sorted(left):
            await self.hooks.member_changed(name, "gone", BINDING)
        if left:
            self.on_event(Notice(level="info", message=f"Left the fleet: {', '.join(sorted(left))}"))
        for name, why in sorted(departed.items()):
            self.on_event(Notice(level="warning", message=f"{name} left the known set: {why}. It is not waited "
                                                          "for any more (it rejoins if it answers again)."))
            await self.hooks.member_changed(name, "gone", why)
        left |= set(departed)
        self.gone |= left
        self.known -= left
        joined = {n for n in replied if n not in self.known and n not in self.forget}
        self.known |= joined
        additions: dict[str, tuple[str, ...]] = {}
        before: dict[str, tuple[str, ...]] = {}
        drained = set(self.queues)
        for name in joined:
            w = obs.workers[name]
            if w.replied and name not in self.stopped:
                additions[name] = tuple(q for q in w.queues if q in drained)
                before[name] = w.queues
        if additions:
            self.baseline.update(before)
            await self.hooks.before_stop(additions, before)
            self.stopped.update(additions)
        if joined:
            self.on_event(Notice(level="info", message=f"Joined mid-drain (stopped at this poll): "
                                                       f"{', '.join(sorted(joined))}"))
        unseen = {n for n, w in obs.workers.items() if w.replied and n not in self.stopped and n not in joined}
        for name in sorted(unseen):
            # Busy (silent) when the drain started: its own queues were never seen before our cancel reached it.
            self.stopped[name] = tuple(self.stopped.get(BROADCAST, self.queues if self.scope is not None else ()))
            self.on_event(Notice(level="warning", message=(
                f"{name} did not answer when the drain started (busy), so the queues it consumed before were not "
                f"seen; a restore will give it every drained queue ({', '.join(self.queues)}).")))
        return joined, left

    def _mark_gone(self, obs: Observation) -> Observation:
        if not self.gone:
            return obs
        workers = dict(obs.workers)
        for name in self.gone:
            if name in workers and not workers[name].replied:
                workers[name] = replace(workers[name], state="gone")
        return Observation(workers=workers, tasks=obs.tasks)
