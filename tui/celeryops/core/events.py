"""Typed events the ops layer emits while it works. The headless CLI prints them (text or ``--json``),
the console renders them, and the status publisher mirrors them to Redis. No Textual, no I/O here.

Every event has ``kind`` (the ``--json`` event name) and ``to_json()``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

WorkerState = Literal["consuming", "stopped", "unknown", "gone"]
TaskState = Literal["active", "reserved", "scheduled"]
DrainOutcome = Literal["drained", "timeout", "interrupted", "error"]


@dataclass(frozen=True)
class TaskInfo:
    """One task held by a worker: running (active), prefetched (reserved), or waiting for its ETA (scheduled)."""

    worker: str
    id: str
    name: str
    state: TaskState
    args: str = ""
    runtime: float | None = None  # seconds running, for active tasks
    eta: str | None = None  # ISO time, for scheduled tasks


@dataclass(frozen=True)
class WorkerObs:
    """What one worker reported in one observation round (``replied`` False: it did not answer: unknown)."""

    name: str
    replied: bool
    active: int = 0
    reserved: int = 0
    scheduled: int = 0
    queues: tuple[str, ...] = ()  # queues it consumes now (from active_queues)
    state: WorkerState = "unknown"
    plugin: bool = False  # runs the drain fence plugin


@dataclass(frozen=True)
class Observation:
    """One round over every known worker."""

    workers: dict[str, WorkerObs]
    tasks: tuple[TaskInfo, ...] = ()

    @property
    def unknown(self) -> list[str]:
        return sorted(n for n, w in self.workers.items() if not w.replied and w.state != "gone")

    @property
    def active(self) -> int:
        return sum(w.active for w in self.workers.values())

    @property
    def reserved(self) -> int:
        return sum(w.reserved for w in self.workers.values())

    @property
    def scheduled(self) -> int:
        return sum(w.scheduled for w in self.workers.values())

    @property
    def empty(self) -> bool:
        """Every known worker replied and none runs or holds a prefetched task (ETA tasks don't count)."""
        return not self.unknown and self.active == 0 and self.reserved == 0


def _jsonable(obj: Any) -> Any:
    return asdict(obj) if hasattr(obj, "__dataclass_fields__") else obj


@dataclass(frozen=True)
class Event:
    kind: str = field(init=False, default="event")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["event"] = data.pop("kind")
        return data


@dataclass(frozen=True)
class DrainStarted(Event):
    queues: tuple[str, ...]
    workers: dict[str, tuple[str, ...]]  # baseline: queues each worker consumed before the drain
    interval: float
    streak: int
    max_wait: float
    forgotten: tuple[str, ...] = ()
    kind: str = field(init=False, default="started")


@dataclass(frozen=True)
class ConsumersCancelled(Event):
    queues: tuple[str, ...]
    acknowledged: tuple[str, ...]  # workers that confirmed
    kind: str = field(init=False, default="cancelled")


@dataclass(frozen=True)
class DrainProgress(Event):
    """One poll: ``streak`` empty observations in a row out of ``required``."""

    elapsed: float
    remaining: float
    streak: int
    required: int
    active: int
    reserved: int
    scheduled: int
    unknown: tuple[str, ...]
    workers: dict[str, WorkerObs]
    tasks: tuple[TaskInfo, ...]
    warnings: tuple[str, ...] = ()
    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    kind: str = field(init=False, default="poll")

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data["workers"] = {
            name: {"replied": w.replied, "active": w.active, "reserved": w.reserved, "scheduled": w.scheduled,
                   "state": w.state, "queues": list(w.queues), "plugin": w.plugin}
            for name, w in self.workers.items()
        }
        return data


@dataclass(frozen=True)
class ConsumersRestored(Event):
    restored: dict[str, tuple[str, ...]]  # worker ("*" = broadcast) -> queues added back
    verified: bool
    missing: dict[str, tuple[str, ...]] = field(default_factory=dict)  # still not consuming after restore
    kind: str = field(init=False, default="restored")


@dataclass(frozen=True)
class DrainFinished(Event):
    outcome: DrainOutcome
    elapsed: float
    message: str
    kind: str = field(init=False, default="finished")

    def to_json(self) -> dict[str, Any]:
        return {"event": self.outcome, "elapsed": self.elapsed, "message": self.message}


@dataclass(frozen=True)
class Notice(Event):
    level: Literal["info", "warning", "error"]
    message: str
    kind: str = field(init=False, default="notice")
