"""What a simulated fleet's workers hold: ``SimTask``, the fleet's shape (``SimSpec``) and random plans of tasks.

Shared by the parent side (``simfleet``), which draws and sends the plans, and the simulation processes
(``simfleet_node``), which answer from them. Times are epoch seconds, so every process sees the same states.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TASK_NAME = "celeryops.testing.sleep"


@dataclass(frozen=True)
class SimTask:
    """One task held by a simulated worker. Times are epoch seconds (``time.time()``), shared by all processes.

    Reserved (prefetched) before ``start``, active from ``start`` to ``end``, then finished. With ``eta`` set the
    task is an ETA/countdown task: listed by ``scheduled`` until its eta, never active."""

    id: str
    start: float
    end: float
    name: str = TASK_NAME
    args: tuple[Any, ...] = ()
    eta: float | None = None

    def state(self, now: float) -> str:
        if self.eta is not None:
            return "scheduled" if now < self.eta else "done"
        if now < self.start:
            return "reserved"
        return "active" if now < self.end else "done"


@dataclass(frozen=True)
class SimSpec:
    """The shape of a simulated fleet.

    ``tasks_per_worker`` running tasks each end at a random time within ``task_duration`` from the plan's start;
    ``reserved_per_worker`` more start when a running one ends; ``scheduled_per_worker`` ETA tasks are due in an
    hour. ``silent``: fraction of workers that never answer; ``drop_rate``: chance that one reply is lost.
    ``reply_delay``: each reply waits uniform(lo, hi) seconds."""

    n: int = 10
    processes: int = 2
    queues: tuple[str, ...] = ("celery",)
    tasks_per_worker: int = 0
    reserved_per_worker: int = 0
    scheduled_per_worker: int = 0
    task_duration: tuple[float, float] = (5.0, 30.0)
    reply_delay: tuple[float, float] = (0.0, 0.0)
    silent: float = 0.0
    drop_rate: float = 0.0
    events: bool = False
    seed: int = 0
    prefix: str = ""
    control_exchange: str = "celery"
    plugin: bool = False  # answer ``celeryops_observe`` like workers running the celeryops plugin

    def names(self) -> list[str]:
        prefix = self.prefix or "sim"
        width = max(4, len(str(self.n)))
        return [f"celery@{prefix}-{i:0{width}d}" for i in range(self.n)]

    def silent_names(self) -> set[str]:
        names = self.names()
        count = round(self.silent * len(names))
        return set(random.Random(f"{self.seed}-silent").sample(names, count)) if count else set()


def make_plan(spec: SimSpec, names: Sequence[str], now: float | None = None,
              rng: random.Random | None = None) -> dict[str, list[SimTask]]:
    """Random tasks per worker from ``spec`` (seeded): running ones that started up to a minute ago and end within
    ``task_duration``, reserved ones queued behind them, ETA ones due in an hour."""
    start = time.time() if now is None else now
    rng = rng or random.Random(spec.seed)
    lo, hi = spec.task_duration
    plan: dict[str, list[SimTask]] = {}
    for name in names:
        tasks: list[SimTask] = []
        ends: list[float] = []
        for _ in range(spec.tasks_per_worker):
            end = start + rng.uniform(lo, hi)
            ends.append(end)
            tasks.append(SimTask(id=str(uuid.uuid4()), start=start - rng.uniform(0, 60), end=end,
                                 args=(round(end - start, 3),)))
        for i in range(spec.reserved_per_worker):
            begin = sorted(ends)[i % len(ends)] if ends else start + rng.uniform(lo, hi)
            end = begin + rng.uniform(lo, hi)
            tasks.append(SimTask(id=str(uuid.uuid4()), start=begin, end=end, args=(round(end - begin, 3),)))
        for _ in range(spec.scheduled_per_worker):
            tasks.append(SimTask(id=str(uuid.uuid4()), start=start, end=start, eta=start + 3600, args=(1.0,)))
        plan[name] = tasks
    return plan


def last_finish(plan: Mapping[str, Iterable[SimTask]]) -> float | None:
    """When the last active or reserved task of ``plan`` ends (ETA tasks do not count), or None."""
    ends = [t.end for tasks in plan.values() for t in tasks if t.eta is None]
    return max(ends) if ends else None
