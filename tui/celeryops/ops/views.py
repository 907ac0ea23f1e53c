"""What the console shows, as plain frozen dataclasses the ops layer fills (no Textual, no I/O).

The console renders these views and the typed drain events of :mod:`celeryops.core.events`; it never talks to Celery,
Redis or Cloud Run itself. The ops side builds them from its own objects (fleet observations, the slot store,
the journal, the deployer) and hands them over through the console's backend interface
(``celeryops.console.ports.ConsoleBackend``).

Times are plain numbers: durations in seconds, instants as epoch seconds that the console turns into ages with its
injected clock, so screens never print wall-clock text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.events import Event, TaskInfo, WorkerState

RunPhase = Literal["preflight", "ready", "stopping", "draining", "drained", "deploying", "restoring", "done", "aborted",
                   "failed"]
CheckStatus = Literal["pending", "running", "ok", "warn", "fail"]
RolloutState = Literal["pending", "creating", "rolling", "ready", "failed"]
ChoiceKind = Literal["resume", "abort", "detach"]


@dataclass(frozen=True)
class WorkerView:
    """One worker of the fleet as the home screen lists it."""

    name: str
    state: WorkerState
    queues: tuple[str, ...] = ()
    active: int = 0
    reserved: int = 0
    scheduled: int = 0
    plugin: bool = False


@dataclass(frozen=True)
class QueueView:
    """Messages waiting in one broker queue (``depth`` None: the broker did not say)."""

    name: str
    depth: int | None
    consumers: int = 0


@dataclass(frozen=True)
class RunSummary:
    """The run in progress (from the journal or the published status), as one line on the home screen."""

    run_id: str
    kind: Literal["deploy", "drain"]
    phase: RunPhase
    release: str | None = None
    owner: str = ""
    started_at: float = 0.0  # epoch seconds
    streak: int = 0
    required: int = 0
    remaining: float | None = None  # seconds to max wait


@dataclass(frozen=True)
class FleetView:
    """One look at the fleet: workers, queue depths, tasks held, the current run."""

    workers: tuple[WorkerView, ...] = ()
    queues: tuple[QueueView, ...] = ()
    tasks: tuple[TaskInfo, ...] = ()
    run: RunSummary | None = None


@dataclass(frozen=True)
class ResourceView:
    """One resource type of a slot pool (CPU, GPU, ...): ``used`` of ``total`` slots."""

    name: str
    total: int
    used: int
    history: tuple[int, ...] = ()  # used slots, oldest first, one sample per interval


@dataclass(frozen=True)
class SlotHolder:
    """A lease held by a running task."""

    lease_id: str
    task: str
    worker: str
    slots: dict[str, int]
    age: float  # seconds since acquired
    ttl_left: float  # seconds until the lease expires unless renewed (<= 0: expired)

    @property
    def expired(self) -> bool:
        return self.ttl_left <= 0


@dataclass(frozen=True)
class SlotWaiter:
    """A task waiting for slots (its reservation is queued)."""

    task: str
    worker: str
    slots: dict[str, int]
    waiting: float  # seconds


@dataclass(frozen=True)
class SlotsView:
    """The slot pool: gauges, holders, waiters."""

    pool: str
    resources: tuple[ResourceView, ...] = ()
    holders: tuple[SlotHolder, ...] = ()
    waiting: tuple[SlotWaiter, ...] = ()
    sample_interval: float = 5.0  # seconds between history samples


@dataclass(frozen=True)
class RecoveryChoice:
    """One thing the operator may do with an interrupted run, and what it will do, per the recovery rules."""

    kind: ChoiceKind
    label: str
    plan: str  # what will happen, one or two sentences
    dangerous: bool = True


@dataclass(frozen=True)
class RunView:
    """An unfinished run found in the journal."""

    run_id: str
    kind: Literal["deploy", "drain"]
    phase: RunPhase
    started_at: float  # epoch seconds
    owner: str
    release: str | None
    choices: tuple[RecoveryChoice, ...]
    detail: str = ""  # e.g. "consumers cancelled on 3 workers for queues default, gpu"


# Events the console receives besides the drain events (the orchestrator adapts preflight/deploy events to these).


@dataclass(frozen=True)
class CheckUpdate(Event):
    """A preflight check started or finished."""

    check_id: str
    title: str
    status: CheckStatus
    detail: str = ""
    remedy: str = ""
    kind: str = field(init=False, default="check")


@dataclass(frozen=True)
class PreflightDone(Event):
    """Every check finished: the run now waits for the operator (``proceed``) unless something failed."""

    failed: int
    warnings: int
    kind: str = field(init=False, default="preflight_done")


@dataclass(frozen=True)
class Condition:
    """A Cloud Run condition (Ready, ConfigurationsReady, RoutesReady, ...)."""

    name: str
    state: str  # e.g. CONDITION_SUCCEEDED, CONDITION_PENDING, CONDITION_FAILED
    message: str = ""


@dataclass(frozen=True)
class DeployTarget:
    """One deploy target: a Cloud Run service (or a shell command) and how its rollout goes."""

    target: str
    revision: str = ""
    state: RolloutState = "pending"
    conditions: tuple[Condition, ...] = ()
    message: str = ""


@dataclass(frozen=True)
class DeployUpdate(Event):
    """Rollout progress of every target, from the operation metadata."""

    targets: tuple[DeployTarget, ...]
    kind: str = field(init=False, default="deploy")


@dataclass(frozen=True)
class PhaseChanged(Event):
    """The run moved to another phase."""

    phase: RunPhase
    message: str = ""
    kind: str = field(init=False, default="phase")


@dataclass(frozen=True)
class RunFollowed(Event):
    """Watch mode: the published status names a run this console now follows (what came before was another run)."""

    run_id: str
    run_kind: Literal["deploy", "drain"]
    release: str | None
    owner: str
    kind: str = field(init=False, default="followed")


@dataclass(frozen=True)
class FleetBack(Event):
    """After the deploy: the fleet coming back (workers consuming again)."""

    workers: tuple[WorkerView, ...]
    kind: str = field(init=False, default="fleet_back")


ConsoleEvent: TypeAlias = Event
"""Anything the console renders: drain events (``celeryops.core.events``) or the events above."""

EventSink: TypeAlias = Callable[[Event], None]
"""Where ops sends events for the console; may be called from any thread."""


class ReadOnlyRefused(UserError):
    """A dangerous action was asked of a read-only (watch) console."""

    def __init__(self, action: str) -> None:
        super().__init__(
            f"Refused to {action}: this console is read-only (watch mode), nothing was changed; "
            "run the action from `celeryops` without `watch`.", EXIT_USAGE)
        self.action = action
