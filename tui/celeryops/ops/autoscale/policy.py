"""The autoscaler's decision, pure: from one look at the pool (what Celery holds per queue, what one instance runs
at once, the cohorts and whether each is busy) to one :class:`Decision` with its reason in one sentence.

- **Demand** per queue is what Celery holds: ready messages (priority lists included) + reserved (prefetched) +
  active; scheduled (ETA) tasks are reported apart and size nothing. The pool needs ``ceil(demand / per instance)``
  instances, kept between ``min_instances`` and ``max_instances``.
- **Out**: more needed than the pool runs: one new cohort (a revision of the same image) of the difference, at most
  ``max_step`` instances.
- **In**: fewer needed for ``idle_after`` seconds on end: one cohort whose every instance is idle (none runs or
  holds a task, every worker answered, every instance started) is drained and taken away whole, or, when it has
  more instances than the surplus, taken down to what is still needed. A busy cohort is never chosen, and no
  scale-in goes below what is needed. None idle: the surplus is held until one is.

No I/O and no clock: the loop gives the time and keeps :class:`Memory` between looks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from celeryops.core.autoscale import AutoscaleSettings

Action = Literal["out", "in", "hold", "wait"]


@dataclass(frozen=True)
class QueueDemand:
    """What Celery holds for one queue: ``ready`` in the broker (None: it could not tell), ``reserved`` and
    ``active`` on the pool's workers, and ``scheduled`` (ETA, reported apart)."""

    queue: str
    ready: int | None = 0
    reserved: int = 0
    active: int = 0
    scheduled: int = 0

    @property
    def total(self) -> int:
        return (self.ready or 0) + self.reserved + self.active


@dataclass(frozen=True)
class Cohort:
    """One revision of the pool: ``count`` instances asked of Cloud Run, ``live`` seen running (the fence
    registry), ``busy`` of them running or holding a task (or silent: unknown is never idle), ``scheduled`` ETA
    tasks its workers hold, ``held``: its workers are fenced (a scale-in of it is under way)."""

    revision: str
    count: int
    live: int = 0
    busy: int = 0
    scheduled: int = 0
    held: bool = False

    @property
    def idle(self) -> bool:
        """Every instance started and none runs or holds a task."""
        return self.busy == 0 and self.live >= self.count and not self.held

    @property
    def state(self) -> str:
        """How the console and ``--json`` name it."""
        if self.held:
            return "draining"
        if self.live < self.count:
            return "starting"
        return "busy" if self.busy else "idle"


@dataclass(frozen=True)
class Look:
    """One look at the pool, at ``at`` (seconds, the loop's clock)."""

    at: float
    demand: tuple[QueueDemand, ...]
    per_instance: int
    cohorts: tuple[Cohort, ...]

    @property
    def tasks(self) -> int:
        return sum(q.total for q in self.demand)

    @property
    def scheduled(self) -> int:
        return sum(q.scheduled for q in self.demand)

    @property
    def instances(self) -> int:
        return sum(c.count for c in self.cohorts)

    @property
    def capacity(self) -> int:
        """Tasks the pool runs at once at its asked-for count."""
        return self.instances * max(1, self.per_instance)


@dataclass(frozen=True)
class Memory:
    """What the policy remembers between looks: since when the pool has had surplus capacity (None: it has not)."""

    surplus_since: float | None = None


@dataclass(frozen=True)
class Decision:
    """What to do now and why (one sentence). ``out``: a new cohort of ``add`` instances; ``in``: drain cohort
    ``revision`` and keep ``keep`` of its instances; ``hold``: nothing to change; ``wait``: the pool cannot be
    changed now (the loop's own reasons: a run holds the fleet, Cloud Run is rolling out)."""

    action: Action
    reason: str
    desired: int = 0
    current: int = 0
    add: int = 0
    revision: str = ""
    keep: int = 0
    at: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"action": self.action, "reason": self.reason, "desired": self.desired, "current": self.current,
                "add": self.add, "revision": self.revision, "keep": self.keep, "at": self.at}


def needed(look: Look, settings: AutoscaleSettings) -> int:
    """The instances the demand needs, between the bounds."""
    raw = math.ceil(look.tasks / max(1, look.per_instance))
    return max(settings.min_instances, min(settings.max_instances, raw))


def _demand_text(look: Look) -> str:
    busy = [q for q in look.demand if q.total]
    if not busy:
        return "nothing waits or runs"
    parts = ", ".join(f"{q.queue} {q.total}" for q in busy)
    return f"{look.tasks} task(s) wait or run ({parts})"


def _plural(n: int, word: str = "instance") -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def decide(look: Look, settings: AutoscaleSettings, memory: Memory = Memory()) -> tuple[Decision, Memory]:
    """The decision for ``look`` (see the module) and what to remember for the next one."""
    want, have = needed(look, settings), look.instances
    per = max(1, look.per_instance)
    base = Decision("hold", "", desired=want, current=have, at=look.at)
    if want > have:
        add = want - have if settings.max_step <= 0 else min(want - have, settings.max_step)
        why = (f"the pool runs {_plural(have)} under its minimum of {settings.min_instances}"
               if have < settings.min_instances and look.tasks <= have * per else
               f"{_demand_text(look)}: {_plural(want)} at {per} task(s) each are needed and the pool runs {have}")
        return replace(base, action="out", add=add, reason=f"{why[:1].upper()}{why[1:]}: adding a cohort of "
                                                           f"{_plural(add)}."), Memory()
    if want == have:
        return replace(base, reason=f"{_demand_text(look)[:1].upper()}{_demand_text(look)[1:]}: the pool's "
                                    f"{_plural(have)} at {per} task(s) each fit."), Memory()
    since = memory.surplus_since if memory.surplus_since is not None else look.at
    kept = Memory(surplus_since=since)
    surplus = have - want
    lasted = look.at - since
    head = (f"{_demand_text(look)[:1].upper()}{_demand_text(look)[1:]}: {want} of the {_plural(have)} "
            f"{'is' if want == 1 else 'are'} needed")
    if lasted < settings.idle_after:
        return replace(base, reason=f"{head}; the surplus of {surplus} has lasted {lasted:.0f} s, one goes after "
                                    f"{settings.idle_after:g} s."), kept
    chosen = choose(look.cohorts, surplus)
    if chosen is None:
        return replace(base, reason=f"{head}, but every cohort runs or holds a task (or is starting): waiting for "
                                    "one to be idle; no busy instance is taken away."), kept
    keep = max(0, chosen.count - surplus)
    what = "taken away" if keep == 0 else f"{chosen.count - keep} of its {chosen.count} instances taken away"
    return replace(base, action="in", revision=chosen.revision, keep=keep,
                   reason=f"{head} for {lasted:.0f} s: cohort {chosen.revision} ({_plural(chosen.count)}) is idle, "
                          f"so it is drained and {what}."), kept


def choose(cohorts: tuple[Cohort, ...], surplus: int) -> Cohort | None:
    """The idle cohort a scale-in of ``surplus`` instances takes away: whole cohorts first (the largest that fits),
    then the smallest larger one (cut down); among equals, the one holding no ETA task, then the oldest listed."""
    idle = [c for c in cohorts if c.idle and c.count > 0]
    whole = [c for c in idle if c.count <= surplus]
    if whole:
        return min(whole, key=lambda c: (-c.count, c.scheduled > 0, cohorts.index(c)))
    if idle:
        return min(idle, key=lambda c: (c.count, c.scheduled > 0, cohorts.index(c)))
    return None


@dataclass
class Trace:
    """The last decisions and looks, for the console's plot and ``--json`` (kept to ``size`` each)."""

    size: int = 120
    points: list[tuple[float, int, int]] = field(default_factory=list)  # (at, demand, capacity)
    decisions: list[Decision] = field(default_factory=list)

    def add(self, look: Look, decision: Decision) -> None:
        self.points = [*self.points, (look.at, look.tasks, look.capacity)][-self.size:]
        last = self.decisions[-1] if self.decisions else None
        if last is None or _gist(last) != _gist(decision):
            self.decisions = [*self.decisions, decision][-self.size:]


def _gist(decision: Decision) -> tuple[object, ...]:
    """What makes a decision news (a surplus that merely lasts longer is the same one)."""
    return decision.action, decision.desired, decision.current, decision.add, decision.revision, decision.keep


__all__ = ["Action", "Cohort", "Decision", "Look", "Memory", "QueueDemand", "Trace", "choose", "decide", "needed"]
