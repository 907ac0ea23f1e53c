"""Typed, read-only views of slot pools for the console and ``celeryops slots``.

A ``Snapshot`` holds one ``PoolSnapshot`` per pool (per-host pools of machine resources, the global pool of the
shared types, and a pool written by the seed's schema, marked ``legacy``); a pool lists the hosts whose
contributions make its totals, and a host pool its devices (free, or held by which task for how long). Times are
Redis ``TIME`` (ms) so that ages and lease remainders don't depend on the reader's clock. ``to_dict()`` gives the
JSON shape printed by ``celeryops slots --json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

DeviceId = int | str


@dataclass(frozen=True)
class TypeUsage:
    """One resource type of a pool. ``free`` is what an acquire could get now (``total - used``, not below 0: after
    a host left, ``used`` may exceed ``total`` until the running leases end). ``fixed``: an explicit total, not the
    sum of the hosts' contributions."""

    type: str
    total: int
    used: int
    fixed: bool = False

    @property
    def free(self) -> int:
        return max(0, self.total - self.used)


@dataclass(frozen=True)
class Holder:
    """A lease. ``lease_remaining`` is None for seed-schema holders (they have no lease)."""

    task_id: str
    task_name: str
    worker: str
    host: str
    slots: dict[str, int]
    token: int | None
    age: float | None
    lease_remaining: float | None
    expired: bool = False
    adopted: bool = False
    devices: dict[str, list[DeviceId]] = field(default_factory=dict)  # {"gpu": [2, 3]}: what the task was given


@dataclass(frozen=True)
class DeviceUsage:
    """One device of a host pool: free, or held by the lease ``task_id`` for ``held_for`` seconds."""

    type: str
    device: DeviceId
    task_id: str | None = None
    task_name: str = ""
    worker: str = ""
    held_for: float | None = None

    @property
    def free(self) -> bool:
        return self.task_id is None


@dataclass(frozen=True)
class Waiting:
    """A refused request; ``reserved`` once it has waited longer than the starvation guard allows.
    ``no_capacity``: no live host (no pool that could serve it) has that many of what it needs: it waits until one
    comes (``Snapshot.capacity`` gives the hosts' totals)."""

    task_id: str
    task_name: str
    worker: str
    slots: dict[str, int]
    waited: float
    reserved: bool
    no_capacity: bool = False


@dataclass(frozen=True)
class HostContribution:
    """What one host adds to a global pool's totals (the largest numbers of its workers), for as long as one of
    ``workers`` renews it: ``expires_in`` seconds from now unless renewed. ``expired``: not renewed in time, no longer
    counted (the next script call reaps it)."""

    host: str
    totals: dict[str, int]
    workers: list[str]
    age: float
    expires_in: float
    expired: bool = False
    devices: dict[str, list[DeviceId]] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolSnapshot:
    pool: str
    scope: str  # "global" | "host" | "legacy"
    host: str | None
    types: list[TypeUsage]
    holders: list[Holder] = field(default_factory=list)
    waiting: list[Waiting] = field(default_factory=list)
    hosts: list[HostContribution] = field(default_factory=list)
    devices: list[DeviceUsage] = field(default_factory=list)

    def usage(self, type_: str) -> TypeUsage:
        for t in self.types:
            if t.type == type_:
                return t
        return TypeUsage(type_, 0, 0)

    def can_hold(self, needs: dict[str, int]) -> bool:
        """Whether this pool's totals are large enough for ``needs`` at all (now busy or not)."""
        return all(self.usage(t).total >= n for t, n in needs.items())


@dataclass(frozen=True)
class Snapshot:
    taken_at: float  # Redis TIME, seconds
    pools: list[PoolSnapshot]

    def pool(self, name: str) -> PoolSnapshot | None:
        return next((p for p in self.pools if p.pool == name), None)

    def candidates(self, pool: PoolSnapshot) -> list[PoolSnapshot]:
        """The pools that could serve a request refused in ``pool``: every host pool for a host pool's (a task goes
        back to its queue and any host's worker may take it), else that pool alone."""
        if pool.scope == "host":
            return [p for p in self.pools if p.scope == "host"]
        return [pool]

    def capacity(self, pool: PoolSnapshot, types: list[str]) -> dict[str, dict[str, int]]:
        """The totals of ``types`` per host (or per pool) among the candidates of ``pool``: what "no capacity
        anywhere" is measured against."""
        return {(p.host or p.pool): {t: p.usage(t).total for t in sorted(types)} for p in self.candidates(pool)}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"taken_at": self.taken_at, "pools": []}
        for p in self.pools:
            d = asdict(p)
            d["types"] = [{"type": t.type, "total": t.total, "used": t.used, "free": t.free, "fixed": t.fixed}
                          for t in p.types]
            for w, wd in zip(p.waiting, d["waiting"], strict=True):
                if w.no_capacity:
                    wd["capacity"] = self.capacity(p, list(w.slots))
            for dev, dd in zip(p.devices, d["devices"], strict=True):
                dd["free"] = dev.free
            out["pools"].append(d)
        return out
