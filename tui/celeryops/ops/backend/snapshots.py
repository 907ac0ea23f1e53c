"""What the console's views show between runs and around them: the fleet (workers, queues, tasks, the run),
the slot pool, and an interrupted run with its recovery choices. Reads only: no control command that changes a
worker, no key written."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis

from celeryops.core.events import DrainProgress
from celeryops.core.untrusted import MalformedRecord
from celeryops.ops.backend import views
from celeryops.ops.backend.watch import live_status, published_progress, summary_from_status
from celeryops.ops.fleetwide.brokersafety import assess_all, safety_targets
from celeryops.ops.fleetwide.lease import LeaseInfo, read_lease
from celeryops.ops.fleetwide.publish import PublishedStatus
from celeryops.ops.journal import ALL_WORKERS, FleetStore, Run
from celeryops.ops.run.interrupted import RunHolder, holder_of
from celeryops.ops.run.stranded import stranded

SAFETY_EVERY = 30.0  # seconds between two reads of the broker's eviction policy and persistence

if TYPE_CHECKING:
    from celeryops.ops.backend.findings import FleetFindings
    from celeryops.ops.run.wiring import Wiring
    from celeryops.slots.snapshot import PoolSnapshot, Snapshot


@dataclass(frozen=True)
class Seen:
    """What the polls of :class:`Snapshots` go on from: every queue seen so far, and each slot resource's history
    (the sparkline's usage values, oldest first). A first look read elsewhere hands them to the console's own."""

    queues: frozenset[str] = frozenset()
    history: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass
class Snapshots:
    wiring: Wiring
    queues: set[str] = field(default_factory=set)  # every queue seen so far (their depths are shown)
    read_only: bool = False  # watch mode: between runs, list the workers from cheap reads, broadcast nothing
    doctor: bool = True  # the doctor's findings and the live ones (False: a first look, which shows the fleet first)
    _history: dict[str, deque[int]] = field(default_factory=dict)
    _safety: tuple[float, views.BrokerSafetyView | None] | None = None  # (read at, view): read again after SAFETY_EVERY
    _findings: FleetFindings | None = None  # the doctor's findings and the live ones (made at the first poll)

    @property
    def findings(self) -> FleetFindings:
        if self._findings is None:
            from celeryops.ops.backend.findings import FleetFindings  # the doctor: not on a first look's path

            self._findings = FleetFindings(self.wiring, read_only=self.read_only)
        return self._findings

    def seen(self) -> Seen:
        return Seen(frozenset(self.queues), tuple((key, tuple(values)) for key, values in self._history.items()))

    def go_on_from(self, seen: Seen) -> None:
        """Go on from what another reader of this fleet saw before this one's first poll (a first look)."""
        self.queues |= seen.queues
        for key, values in seen.history:
            mine = self._history.get(key, ())
            self._history[key] = deque((*values, *mine), maxlen=60)

    async def fleet(self, own: views.RunSummary | None, own_progress: DrainProgress | None) -> views.FleetView:
        view = dataclasses.replace(await self._fleet(own, own_progress), broker_safety=await self.broker_safety())
        if not self.doctor:
            return view
        found, note = await self.findings.current()
        return dataclasses.replace(view, findings=found, findings_note=note)

    def close(self) -> None:
        if self._findings is not None:
            self._findings.close()

    async def broker_safety(self) -> views.BrokerSafetyView | None:
        """The broker's safety (eviction policy, persistence), read at most every ``SAFETY_EVERY`` seconds: reads
        only (CONFIG GET, else INFO; in watch mode INFO only). None when no Redis serves the fleet."""
        now = time.monotonic()
        if self._safety is not None and now - self._safety[0] < SAFETY_EVERY:
            return self._safety[1]
        fleet = self.wiring.fleet
        targets = safety_targets(fleet.redis(), fleet.display_url, self.wiring.coord)
        view = None
        if targets:
            verdict = await assess_all(targets, config=not self.read_only)  # watch mode: INFO only
            view = views.BrokerSafetyView(verdict.status, verdict.short, verdict.detail)
        self._safety = (now, view)
        return view

    async def _fleet(self, own: views.RunSummary | None, own_progress: DrainProgress | None) -> views.FleetView:
        """``own``: the run this console drives (its last poll is the freshest view); else a run published by
        another process, else one observation of the fleet. The fleet's open run (local journal and the fleet's
        copy) is read at every poll: an interrupted one is named in the header and offered for resume/abort, and
        the queues it stopped are listed in the queue depths although no worker consumes them now."""
        opened = await asyncio.to_thread(self.open_run) if own is None else None
        if opened is not None:
            self.queues.update(run_queues(opened.run))
        interrupted = self._recovery_view(opened) if opened is not None and opened.holder.interrupted else None
        if own is not None and own_progress is not None:
            return await self._from_progress(own_progress, own)
        published = None if interrupted is not None else await self._published()
        if published is not None and published.phase != "drained":
            progress = published_progress(published)
            if progress is not None:
                return await self._from_progress(progress, self._summary(published, progress, opened))
        fleet = self.wiring.fleet
        run = own or (self._summary(published, None, opened) if published is not None else None)
        if run is None and opened is not None:  # never "no run" while the journal holds one open
            run = run_summary(opened)
        if self.read_only:
            return await self._listed(run, interrupted)
        latest = await asyncio.to_thread(self.latest_ended) if run is None else None
        if latest is not None:
            self.queues.update(run_queues(latest))
        obs = await fleet.observe(await fleet.members())
        gone = {name for name, live in (await fleet.heartbeats()).items() if not live}
        if self.doctor:
            self.findings.observe(obs, gone)
        workers = tuple(views.WorkerView(w.name, w.state, w.queues, w.active, w.reserved, w.scheduled, w.plugin)
                        for w in obs.workers.values())
        lost = stranded(latest, {w.name: w.queues for w in obs.workers.values() if w.replied})
        return views.FleetView(workers=workers, queues=await self._queue_views(workers), tasks=obs.tasks, run=run,
                               interrupted=interrupted,
                               stranded=tuple(views.StrandedWorker(s.worker, s.queues, s.run_id, s.restored_at)
                                              for s in lost))

    @staticmethod
    def _summary(published: PublishedStatus, progress: DrainProgress | None,
                 opened: OpenRun | None) -> views.RunSummary:
        """A run another process runs, as published; its phase is the journal's (written ahead of every step, while
        the published status follows it a moment later and stays behind if its process dies in between)."""
        summary = summary_from_status(published, progress)
        if opened is not None and opened.run.id == published.run_id and opened.run.phase != "preflight":
            return dataclasses.replace(summary, phase=opened.run.phase)
        return summary

    async def _listed(self, run: views.RunSummary | None, interrupted: views.RunView | None) -> views.FleetView:
        """Watch mode with no live run: the workers kombu's pidbox bindings and the fence plugin's registry list
        (SMEMBERS and registry reads), and the depths of the queues seen so far (LLEN). No control command: not even
        ping or inspect (a broadcast is a PUBLISH, and its replies a reply queue bound on the broker)."""
        fleet = self.wiring.fleet
        sources = [fleet.pidbox_members(), *(src() for src in fleet.extra_members)]
        found: set[str] = set()
        for result in await asyncio.gather(*sources, return_exceptions=True):
            if isinstance(result, set):
                found |= result
        workers = tuple(views.WorkerView(name, "unknown", observed=False) for name in sorted(found))
        return views.FleetView(workers=workers, queues=await self._queue_views(workers), run=run,
                               interrupted=interrupted)

    async def _from_progress(self, progress: DrainProgress, run: views.RunSummary | None) -> views.FleetView:
        if self.doctor:
            self.findings.observe_progress(progress)
        workers = tuple(views.WorkerView(w.name, w.state, w.queues, w.active, w.reserved, w.scheduled, w.plugin)
                        for w in progress.workers.values())
        return views.FleetView(workers=workers, queues=await self._queue_views(workers), tasks=progress.tasks, run=run)

    async def _queue_views(self, workers: tuple[views.WorkerView, ...]) -> tuple[views.QueueView, ...]:
        """Every queue seen so far: consumed by a worker now, or stopped by a run (0 consumers is then the truth)."""
        for w in workers:
            self.queues.update(w.queues)
        if not self.queues:
            return ()
        depths = await self.wiring.fleet.queue_depths(sorted(self.queues))
        return tuple(views.QueueView(d.queue, d.messages, sum(1 for w in workers if d.queue in w.queues))
                     for d in depths)

    async def _published(self) -> PublishedStatus | None:
        # unreadable or malformed: no run is followed on its word
        return await self.wiring.read_coord(live_status, MalformedRecord)

    async def slots(self) -> views.SlotsView | None:
        client = self.wiring.slots_client
        if client is None:
            return None
        from celeryops.slots import read_all

        try:
            snap = await asyncio.to_thread(read_all, client)
        except redis.RedisError:
            return None
        if not snap.pools:
            return None
        order = {"host": 0, "global": 1, "legacy": 2}  # the machines first, then what they share
        pools = sorted(snap.pools, key=lambda p: (order.get(p.scope, 3), p.pool))
        return views.SlotsView(pools=tuple(self._pool_view(p, snap) for p in pools))

    def _pool_view(self, pool: PoolSnapshot, snap: Snapshot) -> views.PoolView:
        resources = []
        for usage in pool.types:
            history = self._history.setdefault(f"{pool.pool}\0{usage.type}", deque(maxlen=60))
            history.append(usage.used)
            resources.append(views.ResourceView(usage.type, usage.total, usage.used, tuple(history)))
        holders = tuple(views.SlotHolder(h.task_id, h.task_name, h.worker, dict(h.slots), h.age or 0.0,
                                         0.0 if h.expired else (h.lease_remaining if h.lease_remaining is not None
                                                                else 24 * 3600.0), pool=pool.pool,
                                         devices={t: tuple(str(d) for d in ds) for t, ds in h.devices.items()})
                        for h in pool.holders)
        waiting = tuple(views.SlotWaiter(w.task_name, w.worker, dict(w.slots), w.waited, pool=pool.pool,
                                         no_capacity=w.no_capacity,
                                         capacity=snap.capacity(pool, list(w.slots)) if w.no_capacity else {})
                        for w in pool.waiting)
        hosts = tuple(views.HostShare(c.host, dict(c.totals), tuple(c.workers), c.expires_in, c.expired)
                      for c in pool.hosts)
        expired = {h.task_id for h in pool.holders if h.expired}
        devices = tuple(views.DeviceView(d.type, str(d.device), d.task_id or "", d.task_name, d.worker,
                                         d.held_for or 0.0, d.task_id in expired) for d in pool.devices)
        return views.PoolView(pool.pool, pool.scope, pool.host, tuple(resources), holders, waiting, hosts, devices)

    def open_run(self) -> OpenRun | None:
        """The fleet's latest unfinished run (the local journal's and the fleet's copy in Redis) and who holds it now;
        None when there is none or neither could be read. Changes nothing in the fleet (the local journal may bring
        home how the fleet's copy says a run ended, as ``Journal.unfinished_runs`` does)."""
        journal, coord, fleet = self.wiring.journal, self.wiring.coord, self.wiring.fleet_name
        runs: list[Run] = []
        with contextlib.suppress(redis.RedisError):
            if journal is not None:
                runs = journal.unfinished_runs(fleet)
            elif coord is not None:  # watch mode without a journal here: the fleet's copy alone
                runs = [held.run for held in FleetStore(coord, fleet).open_runs()]
        if not runs:
            return None
        lease, read = None, False
        if coord is not None:
            with contextlib.suppress(redis.RedisError):
                lease, read = read_lease(coord, fleet), True
        run = runs[-1]
        holder = holder_of(run, lease, time.time(), self.wiring.config.run.lease_ttl, lease_read=read)
        return OpenRun(run, holder, lease)

    def latest_ended(self) -> Run | None:
        """The fleet's latest run if it has ended (this machine's journal or the fleet's copy). Reads only."""
        journal, coord, fleet = self.wiring.journal, self.wiring.coord, self.wiring.fleet_name
        with contextlib.suppress(redis.RedisError):
            if journal is not None:
                return journal.latest_ended(fleet)
            if coord is not None:
                return FleetStore(coord, fleet).latest_ended()
        return None

    def unfinished_run(self) -> views.RunView | None:
        """The fleet's interrupted (or parked) run from the journal, with what each recovery choice would do; None
        when there is none or when it is running elsewhere right now (the home view shows it live)."""
        opened = self.open_run()
        if opened is None or opened.holder.state in ("live", "starting"):
            return None
        return self._recovery_view(opened)

    @staticmethod
    def _recovery_view(opened: OpenRun) -> views.RunView:
        from celeryops.ops.run.kinds import planner_of  # with the first interrupted run: not on every start

        run, holder = opened.run, opened.holder
        owner = planner_of(run)  # its kind's or its strategy's (a newer version's strategy: the default's)
        decided = owner.recovery_plan(run, None)
        choices = [views.RecoveryChoice(c.action, c.label, c.detail) for c in owner.choices(run, decided)]
        stopped = {w: qs for w, qs in run.stopped_consumers().items() if w != ALL_WORKERS}
        queues = sorted({q for qs in run.stopped_consumers().values() for q in qs})
        detail = (f"consumers cancelled on {len(stopped)} worker(s) for queues {', '.join(queues)}"
                  if queues else "no consumer stopped") + f"; journal phase {run.phase}"
        if decided.action in ("leave", "ask"):
            detail += f". {decided.explanation}"
        return views.RunView(run.id, run.kind, run.phase, started_at=run.created,
                             owner=f"{run.user}@{run.host}", release=run.release, choices=tuple(choices), detail=detail,
                             interrupted_at=holder.since if holder.interrupted else None,
                             interrupted_why=holder.why if holder.interrupted else "")


@dataclass(frozen=True)
class OpenRun:
    """The fleet's open run, who holds it now, and the lease read with it."""

    run: Run
    holder: RunHolder
    lease: LeaseInfo | None = None


def run_queues(run: Run) -> set[str]:
    """Every queue a run names: what it stopped, what its workers consumed before, what it was asked to drain."""
    queues = {q for qs in run.stopped_consumers().values() for q in qs}
    queues |= {q for qs in run.consumed_before().values() for q in qs}
    return queues | {str(q) for q in run.settings.get("queues") or ()}


def run_summary(opened: OpenRun) -> views.RunSummary:
    """An interrupted or parked run from the journal, as the home view's header line."""
    run, holder = opened.run, opened.holder
    stopped = [w for w in run.stopped_consumers() if w != ALL_WORKERS]
    return views.RunSummary(run_id=run.id, kind=run.kind, phase=run.phase, release=run.release,
                            owner=f"{run.user}@{run.host}", started_at=run.created,
                            interrupted_at=holder.since if holder.interrupted else None,
                            interrupted_why=holder.brief if holder.interrupted else "", stopped_workers=len(stopped))
