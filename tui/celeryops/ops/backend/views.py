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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, TypeAlias

from celeryops.core.events import Event, Finding, RunKind, RunPhase, TaskInfo, WorkerState

if TYPE_CHECKING:  # the rollout events load with the first one: the console's first fleet needs none of them
    from celeryops.adapters.deploy.base import RolloutEvent

RolloutState = Literal["pending", "creating", "rolling", "ready", "failed"]
ImageState = Literal["exists", "missing", "unknown", "none"]
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
    observed: bool = True  # False: only listed (watch mode between runs asks workers nothing); counts unknown


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
    kind: RunKind
    phase: RunPhase
    release: str | None = None
    owner: str = ""
    started_at: float = 0.0  # epoch seconds
    streak: int = 0
    required: int = 0
    remaining: float | None = None  # seconds to max wait
    measured_at: float | None = None  # epoch seconds when ``remaining`` was measured: the home banner counts down
    # An interrupted run (its owner died or stopped heart-beating): since when (epoch seconds) and the evidence.
    interrupted_at: float | None = None
    interrupted_why: str = ""
    stopped_workers: int = 0  # workers whose consumers the run still holds stopped (journal)

    @property
    def interrupted(self) -> bool:
        return self.interrupted_at is not None


@dataclass(frozen=True)
class StrandedWorker:
    """A live worker that consumes nothing although the fleet's last run restored its queues: a broker reconnect
    since made Celery forget them (celery/celery#987). ``run_id``: the run whose restore it lost."""

    name: str
    queues: tuple[str, ...]
    run_id: str
    restored_at: float  # epoch seconds


@dataclass(frozen=True)
class FleetView:
    """One look at the fleet: workers, queue depths, tasks held, the current run; an interrupted run with its
    recovery choices (``interrupted``: the resume/abort panel opens for it) and workers stranded by a reconnect."""

    workers: tuple[WorkerView, ...] = ()
    queues: tuple[QueueView, ...] = ()
    tasks: tuple[TaskInfo, ...] = ()
    run: RunSummary | None = None
    interrupted: RunView | None = None
    stranded: tuple[StrandedWorker, ...] = ()
    broker_safety: BrokerSafetyView | None = None  # None: not read (yet)
    # `celeryops doctor`'s findings (worker settings, read every minute) and what the console saw happen (live)
    findings: tuple[Finding, ...] = ()
    findings_note: str = ""  # where the findings come from, when it is not the whole story (watch mode)


@dataclass(frozen=True)
class BrokerSafetyView:
    """May the fleet's Redis drop tasks (``fail``: it evicts keys) or lose them on a restart (``warn``)?"""

    status: str  # ok | warn | fail
    short: str  # a few words: "noeviction, AOF", "evicts keys (allkeys-lru, maxmemory 512 MiB)"
    detail: str = ""


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
    pool: str = ""
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # {"gpu": ("2", "3")}: what it was given

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
    pool: str = ""
    # no live host could ever serve it; then the hosts' totals of what it needs: {"cpu-a": {"gpu": 0}}
    no_capacity: bool = False
    capacity: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class HostShare:
    """What one host adds to a global pool's totals, while one of its workers renews it."""

    host: str
    totals: dict[str, int]
    workers: tuple[str, ...] = ()
    expires_in: float = 0.0
    expired: bool = False


@dataclass(frozen=True)
class DeviceView:
    """One device of a host (a GPU by index, a MIG device by UUID): free, or held by a lease for ``held_for`` s."""

    type: str
    device: str
    lease_id: str = ""  # "" = free
    task: str = ""
    worker: str = ""
    held_for: float = 0.0
    expired: bool = False  # the holding lease expired (it is reaped, and the device freed, at the next acquire)

    @property
    def free(self) -> bool:
        return not self.lease_id


@dataclass(frozen=True)
class PoolView:
    """One slot pool: a host's machine resources (with its devices), the global pool of shared types (its totals
    add up its hosts' contributions), or the seed's schema."""

    name: str
    scope: str = "global"  # global | host | legacy
    host: str | None = None
    resources: tuple[ResourceView, ...] = ()
    holders: tuple[SlotHolder, ...] = ()
    waiting: tuple[SlotWaiter, ...] = ()
    hosts: tuple[HostShare, ...] = ()
    devices: tuple[DeviceView, ...] = ()


@dataclass(frozen=True)
class SlotsView:
    """Every slot pool of the fleet (hosts first, then the global pool of shared types): gauges, devices, holders,
    waiters."""

    pools: tuple[PoolView, ...] = ()
    sample_interval: float = 5.0  # seconds between history samples

    @property
    def pool(self) -> str:
        return self.pools[0].name if self.pools else ""

    @property
    def resources(self) -> tuple[ResourceView, ...]:
        """The first pool's gauges (the home view shows these)."""
        return self.pools[0].resources if self.pools else ()

    @property
    def holders(self) -> tuple[SlotHolder, ...]:
        return tuple(h for p in self.pools for h in p.holders)

    @property
    def waiting(self) -> tuple[SlotWaiter, ...]:
        return tuple(w for p in self.pools for w in p.waiting)


@dataclass(frozen=True)
class ReleaseView:
    """A release branch on the remote, as the release picker lists it. ``image``: whether every target's image
    for this commit is in its registry (``unknown``: the registry did not say; ``none``: no target has an image)."""

    name: str
    sha: str
    committed_at: float | None  # epoch seconds of the tip commit
    subject: str = ""
    image: ImageState = "none"
    image_detail: str = ""


@dataclass(frozen=True)
class ReleasesView:
    """The release picker's list, newest first, and where it came from (``remote``, the pattern in words)."""

    releases: tuple[ReleaseView, ...] = ()
    remote: str = "origin"
    pattern: str = "every branch but the default one"


@dataclass(frozen=True)
class RunRecordView:
    """One past or open run of the fleet, as the run history lists it. ``phase`` is a word of
    ``core.events.RUN_PHASES``; ``duration`` None: still open (the screen counts from ``started_at``)."""

    run_id: str
    kind: RunKind
    phase: RunPhase
    release: str | None
    owner: str  # user@host
    started_at: float  # epoch seconds
    duration: float | None
    outcome: str | None = None
    source: str = "journal"  # where it was read: this machine's journal, or the fleet-held store


@dataclass(frozen=True)
class TimelineEntry:
    """One line of a run's event timeline: when (epoch seconds), how it went (info, ok, warning, error), what."""

    at: float
    level: str
    text: str


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
    kind: RunKind
    phase: RunPhase
    started_at: float  # epoch seconds
    owner: str
    release: str | None
    choices: tuple[RecoveryChoice, ...]
    detail: str = ""  # e.g. "consumers cancelled on 3 workers for queues default, gpu"
    interrupted_at: float | None = None  # when its owner was last heard of (epoch seconds); None: parked
    interrupted_why: str = ""  # e.g. "its process (pid 4242) is gone from vm"


@dataclass(frozen=True)
class Condition:
    """A Cloud Run condition (Ready, ConfigurationsReady, RoutesReady, ...)."""

    name: str
    state: str  # e.g. succeeded, failed, reconciling, pending
    message: str = ""


@dataclass(frozen=True)
class DeployTarget:
    """One deploy target as the deploy screen lists it: folded from its typed rollout events (:func:`fold_rollout`)."""

    target: str
    revision: str = ""
    state: RolloutState = "pending"
    conditions: tuple[Condition, ...] = ()
    message: str = ""


def fold_rollout(current: DeployTarget | None, event: RolloutEvent) -> DeployTarget:
    """The target's row after one rollout event (typed: nothing is read from the event's text)."""
    from celeryops.adapters.deploy.base import (
        ConditionChanged,
        RevisionCreated,
        RolloutReady,
        RolloutStarted,
        RouteStarted,
        short_revision,
    )

    row = current or DeployTarget(event.target)
    if isinstance(event, RolloutStarted):
        return replace(row, state="creating", message=event.detail)
    if isinstance(event, RouteStarted):  # a rollback: an existing revision, nothing to create
        return replace(row, revision=event.revision, state="rolling", message=event.detail)
    if isinstance(event, RevisionCreated):
        return replace(row, revision=short_revision(event.revision), state="creating", message=event.detail)
    if isinstance(event, ConditionChanged):
        conditions = {c.name: c for c in row.conditions}
        conditions[event.condition] = Condition(event.condition, event.state, event.message)
        state: RolloutState = "failed" if event.state == "failed" else row.state if row.state == "ready" else "rolling"
        return replace(row, conditions=tuple(conditions.values()), state=state, message=event.detail)
    if isinstance(event, RolloutReady):
        return replace(row, revision=short_revision(event.revision) or row.revision, state="ready",
                       message=event.detail)
    return replace(row, message=event.detail)  # trouble polling, a command's output line


EventSink: TypeAlias = Callable[[Event], None]
"""Where ops sends events for the console; may be called from any thread."""
