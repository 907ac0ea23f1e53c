"""One look at an autoscaled worker pool (:class:`PoolReader`): demand from Celery, capacity, the cohorts.

- **Cohorts**: the pool's revisions and the instances Cloud Run runs for each (its count divided by its split:
  :func:`celeryops.core.splits.counts_of`), with their workers from the fence registry (worker -> revision ->
  instance), live instances, busy ones and whether a fence holds them.
- **Demand** per queue: the broker's ready messages (every priority list) + the reserved and active tasks of the
  pool's workers (one observation round addressed to them, which returns as soon as each replied), scheduled (ETA)
  apart. With no worker there is nobody to ask: the broker's ready counts decide.
- **Capacity** per instance: ``tasks_per_instance``, else the sum of the concurrency of one instance's workers
  (``inspect stats``, asked once per worker), bounded by the instance's slot total of ``slot_resource``; remembered
  from the last look (and from the published status) when the pool runs no worker.

Reads only: no consumer command, no key written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import redis

from celeryops.adapters.deploy.base import PoolDeployer, RolloutState
from celeryops.adapters.fleet import Fleet
from celeryops.core.autoscale import AutoscaleSettings
from celeryops.core.config import Target
from celeryops.core.events import Observation
from celeryops.core.splits import counts_of
from celeryops.fence.registry import PluginWorkerInfo
from celeryops.ops.autoscale.policy import Cohort, Look, QueueDemand


@dataclass(frozen=True)
class PoolView:
    """What a look saw beyond the policy's inputs: the pool's state, the asked-for counts per revision (what
    celeryops compares with what it set), the pool's workers by revision, the queues it consumes."""

    state: RolloutState
    counts: dict[str, int]
    workers: dict[str, tuple[str, ...]]
    queues: tuple[str, ...]
    unknown: tuple[str, ...] = ()

    @property
    def automatic(self) -> bool:
        """The pool is not in manual scaling: Cloud Run sizes it itself."""
        return self.state.scaling_mode == "automatic"


def pool_workers(infos: Mapping[str, PluginWorkerInfo], target: Target) -> dict[str, PluginWorkerInfo]:
    """The registry entries of ``target``'s instances (a worker pool of that name); by hostname."""
    return {host: info for host, info in infos.items()
            if info.cloudrun_kind == "worker-pool" and info.cloudrun_name == target.resource}


def instances_of(infos: Mapping[str, PluginWorkerInfo]) -> dict[str, dict[str, list[str]]]:
    """Revision -> instance id -> its workers' hostnames (an entry without an instance id is its own)."""
    out: dict[str, dict[str, list[str]]] = {}
    for host, info in sorted(infos.items()):
        out.setdefault(info.revision, {}).setdefault(info.instance_id or host, []).append(host)
    return out


def demand_of(queues: Iterable[str], ready: Mapping[str, int | None],
              seen: Observation | None) -> tuple[QueueDemand, ...]:
    """Per queue: ready in the broker, reserved / active / scheduled on the observed workers (by the queue each
    task came from; a task whose worker did not say counts on the first queue)."""
    names = list(dict.fromkeys(queues))
    held: dict[str, dict[str, int]] = {q: {"reserved": 0, "active": 0, "scheduled": 0} for q in names}
    for task in seen.tasks if seen is not None else ():
        queue = task.queue if task.queue in held else (names[0] if names else "")
        if queue:
            held[queue][task.state] += 1
    return tuple(QueueDemand(q, ready.get(q), held[q]["reserved"], held[q]["active"], held[q]["scheduled"])
                 for q in names)


@dataclass
class PoolReader:
    """Looks at ``target`` (a Cloud Run worker pool) for the autoscaler. ``remembered``: the capacity per instance
    and the queues of an earlier look (the published status), used while the pool runs no worker."""

    fleet: Fleet
    coord: redis.Redis | None
    fleet_name: str
    target: Target
    deployer: PoolDeployer
    settings: AutoscaleSettings
    slots: redis.Redis | None = None
    per_instance: int = 0
    queues: tuple[str, ...] = ()
    _concurrency: dict[str, int] = field(default_factory=dict)

    async def registry(self) -> dict[str, PluginWorkerInfo]:
        """The pool's live plugin workers (the fence registry), by hostname."""
        if self.coord is None:
            return {}
        from celeryops.fence import plugin_workers

        return pool_workers(await asyncio.to_thread(plugin_workers, self.coord, self.fleet_name), self.target)

    async def look(self, at: float) -> tuple[Look, PoolView]:
        """One look (see the module) at ``at`` (the loop's clock)."""
        state, infos = await asyncio.gather(self.deployer.current(self.target), self.registry())
        counts = {rev: n for rev, n in counts_of(state.instance_count or 0, state.served_split).items()}
        by_revision = instances_of(infos)
        queues = self.settings.queues or tuple(sorted({q for i in infos.values() for q in i.queues})) or self.queues
        self.queues = queues
        names = sorted(infos)
        depths, seen = await asyncio.gather(self.fleet.queue_depths(queues),
                                            self.fleet.observe(names) if names else _nothing())
        per = await self._per_instance(infos, by_revision)
        busy_workers = {n for n, w in (seen.workers if seen else {}).items() if not w.replied or w.active or w.reserved}
        cohorts = []
        for revision in sorted(set(counts) | set(by_revision)):
            instances = by_revision.get(revision, {})
            if not counts.get(revision) and not instances:
                continue
            busy = sum(1 for hosts in instances.values() if busy_workers & set(hosts))
            scheduled = sum(seen.workers[h].scheduled for hosts in instances.values() for h in hosts
                            if seen is not None and h in seen.workers)
            held = any(infos[h].held for hosts in instances.values() for h in hosts)
            cohorts.append(Cohort(revision, counts.get(revision, 0), live=len(instances), busy=busy,
                                  scheduled=scheduled, held=held))
        demand = demand_of(queues, {d.queue: d.messages for d in depths}, seen)
        workers = {rev: tuple(sorted(h for hosts in inst.values() for h in hosts)) for rev, inst in by_revision.items()}
        unknown = tuple(sorted(n for n, w in seen.workers.items() if not w.replied)) if seen else ()
        view = PoolView(state, counts, workers, queues, unknown)
        return Look(at=at, demand=demand, per_instance=per, cohorts=tuple(cohorts)), view

    async def _per_instance(self, infos: Mapping[str, PluginWorkerInfo],
                            by_revision: Mapping[str, Mapping[str, list[str]]]) -> int:
        """Tasks one instance runs at once (see the module); the last known value while no worker runs."""
        if self.settings.tasks_per_instance > 0:
            self.per_instance = self.settings.tasks_per_instance
            return self.per_instance
        new = [h for h in infos if h not in self._concurrency]
        if new:
            self._concurrency.update(await self.fleet.concurrency(new))
        sums = [sum(self._concurrency.get(h, 0) for h in hosts)
                for instances in by_revision.values() for hosts in instances.values()]
        found = max((s for s in sums if s > 0), default=0)
        slots = await self._slot_total()
        if found and slots:
            found = min(found, slots)
        elif slots and not found:
            found = slots
        if found:
            self.per_instance = found
        return max(1, self.per_instance)

    async def _slot_total(self) -> int:
        """The largest per-host total of ``slot_resource`` (an instance on Cloud Run is a slot host): 0 unknown."""
        resource = self.settings.slot_resource
        if not resource or self.slots is None:
            return 0
        from celeryops.slots.store import read_all

        try:
            pools = await asyncio.to_thread(read_all, self.slots)
        except redis.RedisError:
            return 0
        return max((p.usage(resource).total for p in pools.pools if p.scope == "host"), default=0)


async def _nothing() -> None:
    return None


__all__ = ["PoolReader", "PoolView", "demand_of", "instances_of", "pool_workers"]
