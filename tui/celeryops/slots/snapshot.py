"""Typed, read-only views of slot pools for the console and ``celeryops slots``.

A ``Snapshot`` holds one ``PoolSnapshot`` per pool (global pools, per-host pools, and a pool written by the seed's
schema, marked ``legacy``); a global pool lists the hosts whose contributions add up to its totals. Times are Redis
``TIME`` (ms) so that ages and lease remainders don't depend on the reader's clock. ``to_dict()`` gives the JSON
shape printed by ``celeryops slots --json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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


@dataclass(frozen=True)
class Waiting:
    """A refused request; ``reserved`` once it has waited longer than the starvation guard allows."""

    task_id: str
    task_name: str
    worker: str
    slots: dict[str, int]
    waited: float
    reserved: bool


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


@dataclass(frozen=True)
class PoolSnapshot:
    pool: str
    scope: str  # "global" | "host" | "legacy"
    host: str | None
    types: list[TypeUsage]
    holders: list[Holder] = field(default_factory=list)
    waiting: list[Waiting] = field(default_factory=list)
    hosts: list[HostContribution] = field(default_factory=list)

    def usage(self, type_: str) -> TypeUsage:
        for t in self.types:
            if t.type == type_:
                return t
        return TypeUsage(type_, 0, 0)


@dataclass(frozen=True)
class Snapshot:
    taken_at: float  # Redis TIME, seconds
    pools: list[PoolSnapshot]

    def pool(self, name: str) -> PoolSnapshot | None:
        return next((p for p in self.pools if p.pool == name), None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"taken_at": self.taken_at, "pools": []}
        for p in self.pools:
            d = asdict(p)
            d["types"] = [{"type": t.type, "total": t.total, "used": t.used, "free": t.free, "fixed": t.fixed}
                          for t in p.types]
            out["pools"].append(d)
        return out
