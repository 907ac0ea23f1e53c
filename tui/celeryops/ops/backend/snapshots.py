"""What the console's views show between runs and around them: the fleet (workers, queues, tasks, the run),
the slot pool, and an interrupted run with its recovery choices. Reads only: no control command that changes a
worker, no key written."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis

from celeryops.core.events import DrainProgress
from celeryops.ops.backend.views import (
    DeviceView,
    FleetView,
    HostShare,
    PoolView,
    QueueView,
    RecoveryChoice,
    ResourceView,
    RunSummary,
    RunView,
    SlotHolder,
    SlotsView,
    SlotWaiter,
    WorkerView,
)
from celeryops.ops.backend.watch import live_status, published_progress, summary_from_status
from celeryops.ops.fleetwide.lease import read_lease
from celeryops.ops.fleetwide.publish import PublishedStatus
from celeryops.ops.run.recovery import plan
from celeryops.ops.run.wiring import Wiring

if TYPE_CHECKING:
    from celeryops.slots.snapshot import PoolSnapshot, Snapshot


@dataclass
class Snapshots:
    wiring: Wiring
    queues: set[str] = field(default_factory=set)  # every queue seen so far (their depths are shown)
    read_only: bool = False  # watch mode: between runs, list the workers from cheap reads, broadcast nothing
    _history: dict[str, deque[int]] = field(default_factory=dict)

    async def fleet(self, own: RunSummary | None, own_progress: DrainProgress | None) -> FleetView:
        """``own``: the run this console drives (its last poll is the freshest view); else a run published by
        another process, else one observation of the fleet."""
        if own is not None and own_progress is not None:
            return await self._from_progress(own_progress, own)
        published = await self._published()
        if published is not None and published.phase != "drained":
            progress = published_progress(published)
            if progress is not None:
                return await self._from_progress(progress, summary_from_status(published, progress))
        fleet = self.wiring.fleet
        if self.read_only:
            return await self._listed(own, published)
        obs = await fleet.observe(await fleet.members())
        workers = tuple(WorkerView(w.name, w.state, w.queues, w.active, w.reserved, w.scheduled, w.plugin)
                        for w in obs.workers.values())
        run = own or (summary_from_status(published, None) if published is not None else None)
        return FleetView(workers=workers, queues=await self._queue_views(workers), tasks=obs.tasks, run=run)

    async def _listed(self, own: RunSummary | None, published: PublishedStatus | None) -> FleetView:
        """Watch mode with no live run: the workers kombu's pidbox bindings and the fence plugin's registry list
        (SMEMBERS and registry reads), and the depths of the queues seen so far (LLEN). No control command: not even
        ping or inspect (a broadcast is a PUBLISH, and its replies a reply queue bound on the broker)."""
        fleet = self.wiring.fleet
        sources = [fleet.pidbox_members(), *(src() for src in fleet.extra_members)]
        found: set[str] = set()
        for result in await asyncio.gather(*sources, return_exceptions=True):
            if isinstance(result, set):
                found |= result
        workers = tuple(WorkerView(name, "unknown", observed=False) for name in sorted(found))
        run = own or (summary_from_status(published, None) if published is not None else None)
        return FleetView(workers=workers, queues=await self._queue_views(workers), run=run)

    async def _from_progress(self, progress: DrainProgress, run: RunSummary | None) -> FleetView:
        workers = tuple(WorkerView(w.name, w.state, w.queues, w.active, w.reserved, w.scheduled, w.plugin)
                        for w in progress.workers.values())
        return FleetView(workers=workers, queues=await self._queue_views(workers), tasks=progress.tasks, run=run)

    async def _queue_views(self, workers: tuple[WorkerView, ...]) -> tuple[QueueView, ...]:
        for w in workers:
            self.queues.update(w.queues)
        if not self.queues:
            return ()
        depths = await self.wiring.fleet.queue_depths(sorted(self.queues))
        return tuple(QueueView(d.queue, d.messages, sum(1 for w in workers if d.queue in w.queues)) for d in depths)

    async def _published(self) -> PublishedStatus | None:
        coord = self.wiring.coord
        if coord is None:
            return None
        try:
            return await asyncio.to_thread(live_status, coord, self.wiring.fleet_name)
        except redis.RedisError:
            return None

    async def slots(self) -> SlotsView | None:
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
        return SlotsView(pools=tuple(self._pool_view(p, snap) for p in pools))

    def _pool_view(self, pool: PoolSnapshot, snap: Snapshot) -> PoolView:
        resources = []
        for usage in pool.types:
            history = self._history.setdefault(f"{pool.pool}\0{usage.type}", deque(maxlen=60))
            history.append(usage.used)
            resources.append(ResourceView(usage.type, usage.total, usage.used, tuple(history)))
        holders = tuple(SlotHolder(h.task_id, h.task_name, h.worker, dict(h.slots), h.age or 0.0,
                                   0.0 if h.expired else (h.lease_remaining if h.lease_remaining is not None
                                                          else 24 * 3600.0), pool=pool.pool,
                                   devices={t: tuple(str(d) for d in ds) for t, ds in h.devices.items()})
                        for h in pool.holders)
        waiting = tuple(SlotWaiter(w.task_name, w.worker, dict(w.slots), w.waited, pool=pool.pool,
                                   no_capacity=w.no_capacity,
                                   capacity=snap.capacity(pool, list(w.slots)) if w.no_capacity else {})
                        for w in pool.waiting)
        hosts = tuple(HostShare(c.host, dict(c.totals), tuple(c.workers), c.expires_in, c.expired)
                      for c in pool.hosts)
        expired = {h.task_id for h in pool.holders if h.expired}
        devices = tuple(DeviceView(d.type, str(d.device), d.task_id or "", d.task_name, d.worker, d.held_for or 0.0,
                                   d.task_id in expired) for d in pool.devices)
        return PoolView(pool.pool, pool.scope, pool.host, tuple(resources), holders, waiting, hosts, devices)

    def unfinished_run(self) -> RunView | None:
        """The fleet's interrupted run from the journal, with what each recovery choice would do; None when there
        is none or when it is running elsewhere right now (the home view shows it live)."""
        journal, coord = self.wiring.journal, self.wiring.coord
        if journal is None:
            return None
        runs = journal.unfinished_runs(self.wiring.fleet_name)
        if not runs:
            return None
        run = runs[-1]
        if coord is not None:
            with contextlib.suppress(redis.RedisError):
                holder = read_lease(coord, self.wiring.fleet_name)
                if holder is not None and holder.run_id == run.id and not holder.orphaned:
                    return None
        decided = plan(run, None)
        choices = []
        if run.phase in ("preflight", "stopping", "draining", "drained"):
            then = ", then the release is deployed" if run.release else ""
            choices.append(RecoveryChoice(
                "resume", "Resume the run" if run.release else "Resume the drain",
                "Take over the run with its journalled settings: consumers it stopped stay stopped and the drain "
                f"continues from a fresh streak{then} (what `celeryops resume` does)."))
        elif run.phase in ("deploying", "deployed"):
            choices.append(RecoveryChoice(
                "resume", "Resume the run",
                "Ask the deploy target how the rollout went: if the new revision serves, finish the run; if it "
                "never took effect, restore the consumers (what `celeryops resume` does)."))
        if decided.action in ("restore", "nothing"):
            choices.append(RecoveryChoice("abort", "Abort and restore consumers" if decided.restore
                                          else "Abort (nothing to restore)", decided.explanation))
        stopped = run.stopped_consumers()
        queues = sorted({q for qs in stopped.values() for q in qs})
        detail = (f"consumers cancelled on {len(stopped)} worker(s) for queues {', '.join(queues)}"
                  if stopped else "no consumer stopped") + f"; journal phase {run.phase}"
        if decided.action in ("leave", "ask"):
            detail += f". {decided.explanation}"
        return RunView(run.id, run.kind, run.phase, started_at=run.created,
                       owner=f"{run.user}@{run.host}", release=run.release, choices=tuple(choices), detail=detail)
