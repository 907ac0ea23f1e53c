"""The one event vocabulary: what a run emits, typed from the adapters up to the screens, ``--json`` and the
published status. The headless CLI prints these events (text or ``--json``), the console folds them into its
model, and the status publisher mirrors them to Redis, where :mod:`celeryops.ops.fleetwide.decode` turns them back
into the same types for watchers. No Textual, no I/O here; nothing downstream parses the human text of an event.

Every event has ``kind`` (the ``--json`` event name) and ``to_json()``. The deployers' rollout progress events
(``celeryops.adapters.deploy.base``) are events of this vocabulary too (kind ``deploy``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

WorkerState = Literal["consuming", "stopped", "unknown", "gone"]
TaskState = Literal["active", "reserved", "scheduled"]
DrainOutcome = Literal["drained", "timeout", "interrupted", "error"]
#: The phases of a run, in order: the journal's (from ``stopping`` on), plus ``ready`` (preflight done, waiting for
#: the operator). The console, ``status``, ``runs`` and watchers all use these words.
#: An autoscale step adds ``scaling`` (the pool's instance count changes).
#: An overlap deploy (a Cloud Run worker pool) adds ``overlapping`` (the new revision comes up and consumes beside the
#: old one), ``cutting_over`` (every instance moves to the new revision) and ``retiring`` (the new revision is taken
#: away again: an abort, a timeout); its old revision's drain is ``stopping``, ``draining``, ``drained``.
RunPhase = Literal["preflight", "ready", "overlapping", "stopping", "draining", "drained", "scaling", "cutting_over",
                   "deploying", "deployed", "retiring", "done", "aborted", "failed"]
RUN_PHASES: tuple[RunPhase, ...] = ("preflight", "ready", "overlapping", "stopping", "draining", "drained", "scaling",
                                    "cutting_over", "deploying", "deployed", "retiring", "done", "aborted", "failed")
CheckStatus = Literal["pending", "running", "ok", "warn", "fail"]
RunOutcome = Literal["drained", "deployed", "preflight_failed", "declined", "timeout", "deploy_failed",
                     "interrupted", "aborted", "error", "rolled_back", "rollback_failed",
                     "canary_rolled_back", "canary_paused"]
#: What a run does: drain only, deploy a release, route targets back to revisions they ran before (rollback), or one
#: step of the autoscaler (a worker pool's cohort added, or an idle one drained and taken away).
RunKind = Literal["deploy", "drain", "rollback", "autoscale"]


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
    queue: str = ""  # the queue it came from (its delivery's routing key; "" when the worker did not say)


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
    # Known workers that did not answer (and no evidence says they are gone): name -> seconds silent so far.
    silent: dict[str, float] = field(default_factory=dict)
    # Of ``silent``: alive by evidence (a live plugin heartbeat: busy), so the remedy --forget does not apply.
    alive: tuple[str, ...] = ()
    # AMQP: consumers left on each drained queue (the broker's count); drained needs 0. Empty on Redis.
    consumers: dict[str, int] = field(default_factory=dict)
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


# -- the run: preflight, phases, the deploy's end -------------------------------------------------------------------


@dataclass(frozen=True)
class CheckUpdate(Event):
    """A preflight check started (``running``) or finished (ok / warn / fail)."""

    id: str
    title: str
    status: CheckStatus
    detail: str = ""
    remedy: str = ""
    accepted: bool = False  # a warning accepted up front (--accept-warning(s) or [preflight] accept)
    kind: str = field(init=False, default="check")


@dataclass(frozen=True)
class PreflightDone(Event):
    """Every check finished: ``failed`` and ``warnings`` counted; ``accepted``: warnings the fleet or the command
    accepts up front (their ids). Unless something failed, the run now waits for the operator."""

    failed: int
    warnings: int
    accepted: tuple[str, ...] = ()
    kind: str = field(init=False, default="preflight_done")


@dataclass(frozen=True)
class StageStarted(Event):
    """A step of the run begins: ``preflight``, ``drain``, ``deploy``, ``verify``. ``strategy``: on a deploy's
    ``preflight``, the strategy that runs it (``drain``, ``overlap``, ``canary``; empty on the other stages)."""

    stage: str
    detail: str = ""
    strategy: str = ""
    kind: str = field(init=False, default="stage")


@dataclass(frozen=True)
class PhaseChanged(Event):
    """The run moved to another phase (the journal's phase, as the console and watchers show it)."""

    phase: RunPhase
    message: str = ""
    kind: str = field(init=False, default="phase")


@dataclass(frozen=True)
class FleetBack(Event):
    """After the deploy: which workers consume which queues."""

    workers: dict[str, tuple[str, ...]]
    kind: str = field(init=False, default="fleet")


@dataclass(frozen=True)
class DeployedRevision:
    """Where a deployed target's result is: the ``revision`` (and ``image``) that serves it, the
    ``previous_revision`` that served it before, its URL (services), its Cloud Run console link and the revision's
    logs. A deployer's result (:class:`celeryops.adapters.deploy.base.DeployResult`) names the revisions in full,
    the ``target`` event (:class:`TargetDeployed`) by their short names."""

    target: str
    revision: str = ""
    url: str = ""
    console_url: str = ""
    image: str = ""
    previous_revision: str = ""
    logs_url: str = ""


@dataclass(frozen=True)
class TargetDeployed(Event, DeployedRevision):
    """Where a deployed target's result is (``--json`` event ``target``; revisions by their short names)."""

    kind: str = field(init=False, default="target")


@dataclass(frozen=True)
class TargetRolledBack(TargetDeployed):
    """A target a rollback routed back: ``revision`` serves it now, ``previous_revision`` served it before (the
    ``target`` event with ``"rolled_back": true``)."""

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "rolled_back": True}


@dataclass(frozen=True)
class RunFinished(Event):
    """The run ended (for a drain-only run: the drain's outcome). ``exit_code`` is the command's."""

    outcome: RunOutcome
    exit_code: int
    message: str
    targets: tuple[TargetDeployed, ...] = ()
    logs_url: str = ""
    kind: str = field(init=False, default="finished")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"event": self.outcome, "exit_code": self.exit_code, "message": self.message}
        if self.targets:
            data["targets"] = [{k: v for k, v in t.to_json().items() if k != "event"} for t in self.targets]
        if self.logs_url:
            data["logs_url"] = self.logs_url
        return data


PoolStepName = Literal["planned", "scaling_up", "scaled_up", "consuming", "stopping_old", "old_idle", "cutting_over",
                       "cut_over", "retiring", "old_restored", "holding_new", "retired", "kept_both", "progress",
                       "promoting"]


@dataclass(frozen=True)
class PoolStep(Event):
    """A step of two revisions on worker pool ``target`` (an overlap or canary deploy, a pool's rollback; ``--json``
    event ``overlap``, its name since the overlap deploy), from the old revision ``old_revision`` to
    ``new_revision``. ``step``:

    - ``planned``: the new revision's name, chosen up front, the instance count and ``peak`` (the most instances the
      run can make the pool run at once: quota, cost; a canary's is its promotion's, the overlap's, unless its
      canary instances are more); ``scaling_up`` / ``scaled_up``: the update that brings the new revision up
      beside the old one (no old instance taken away) was sent / Cloud Run serves it; ``consuming``: the new
      revision's workers consume (``consuming``: their names);
    - ``stopping_old``: only the old revision's workers are told to stop taking tasks (the drain's ``started``,
      ``cancelled`` and ``poll`` events follow, about the old revision's workers alone); ``old_idle``: they are
      idle by the drain's rules;
    - ``cutting_over`` / ``cut_over``: every instance moves to the new revision at the original count;
    - ``retiring`` (an abort, a timeout, a revision that failed), ``old_restored`` (the old revision's workers
      consume again), ``holding_new`` (the new revision's workers stop taking tasks and are drained), ``retired``
      (the pool is back on the old revision), ``kept_both`` (the new revision stayed busy: both keep consuming);
    - ``promoting``: a canary's promotion: one update runs as many instances of the new revision as of the old one
      (the overlap's peak), then the overlap's steps from ``consuming`` on;
    - ``progress``: repeated while both run: ``instances`` and ``workers`` per revision, ``consuming`` (the new
      revision's workers that consume), ``completed`` (tasks the new revision's workers completed so far) and
      ``rate`` (per second since the last ``progress``); the old revision's tasks, streak and countdown are in the
      drain's ``poll`` events.

    ``instances``: per revision, as Cloud Run asks each to run; ``split``: revision -> percent of the instances as
    Cloud Run serves them; ``message``: one sentence for people."""

    step: PoolStepName
    target: str
    old_revision: str
    new_revision: str
    instances: dict[str, int] = field(default_factory=dict)
    split: dict[str, int] = field(default_factory=dict)
    peak: int = 0
    workers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    consuming: tuple[str, ...] = ()
    completed: int | None = None
    rate: float | None = None
    message: str = ""
    kind: str = field(init=False, default="overlap")


@dataclass(frozen=True)
class RunFollowed(Event):
    """Watch mode: the published status names a run this console now follows (what came before was another run)."""

    run_id: str
    run_kind: RunKind
    release: str | None
    owner: str
    kind: str = field(init=False, default="followed")


# -- the doctor: worker settings that lose or duplicate work (``celeryops doctor``, preflight, the console) ------------


@dataclass(frozen=True)
class Finding(Event):
    """Something that loses or duplicates work, with its id (:data:`celeryops.core.findings.CATALOG`: stable, for
    ``--accept-warning``), the workers and tasks it concerns, ``what`` happens and when (one sentence), the ``fix``
    (the setting and its value) and ``docs`` (the Celery documentation)."""

    id: str
    title: str
    what: str
    fix: str = ""
    docs: str = ""
    workers: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    kind: str = field(init=False, default="finding")


@dataclass(frozen=True)
class DoctorNote(Finding):
    """What a setting means (often a default: late acks off), shown beside the findings but never one of them
    (``--json`` event ``note``)."""

    kind: str = field(init=False, default="note")


@dataclass(frozen=True)
class DoctorDone(Event):
    """The doctor's last word: the ids of its findings, how many notes, the workers whose settings it read
    (``checked``) and those it could not (``unchecked``), and the command's exit code."""

    findings: tuple[str, ...]
    notes: int
    checked: tuple[str, ...]
    unchecked: tuple[str, ...]
    exit_code: int
    message: str
    kind: str = field(init=False, default="doctor_done")
