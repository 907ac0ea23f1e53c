"""The published status's decoder: one stream entry (its kind and ``to_json()`` data, as :class:`Runner` publishes
every event of a run) back into the same typed event, for watchers on any machine. The inverse of ``to_json``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from celeryops.adapters.deploy.base import (
    CommandOutput,
    ConditionChanged,
    PollTrouble,
    RevisionCreated,
    RolloutEvent,
    RolloutReady,
    RolloutStarted,
    RouteStarted,
)
from celeryops.core.canarylook import CanaryLook
from celeryops.core.events import (
    RUN_PHASES,
    CheckUpdate,
    ConsumersCancelled,
    ConsumersRestored,
    DeployedRevision,
    DrainFinished,
    DrainProgress,
    DrainStarted,
    Event,
    FleetBack,
    Notice,
    PhaseChanged,
    PoolStep,
    PreflightDone,
    RunFinished,
    StageStarted,
    TargetDeployed,
    TargetRolledBack,
    TaskInfo,
    WorkerObs,
)

Data = dict[str, Any]


def _queues(value: Any) -> dict[str, tuple[str, ...]]:
    return {str(w): tuple(q) for w, q in (value or {}).items()}


def progress_from_json(data: Data) -> DrainProgress | None:
    """A DrainProgress from its JSON (``DrainProgress.to_json``), or None if it is not one."""
    if "streak" not in data or "workers" not in data:
        return None
    workers = {name: WorkerObs(name=name, replied=bool(w.get("replied")), active=int(w.get("active", 0)),
                               reserved=int(w.get("reserved", 0)), scheduled=int(w.get("scheduled", 0)),
                               queues=tuple(w.get("queues", ())), state=w.get("state", "unknown"),
                               plugin=bool(w.get("plugin")))
               for name, w in (data.get("workers") or {}).items()}
    tasks = tuple(TaskInfo(worker=str(t.get("worker", "")), id=str(t.get("id", "")), name=str(t.get("name", "")),
                           state=t.get("state", "active"), args=str(t.get("args", "")), runtime=t.get("runtime"),
                           eta=t.get("eta"))
                  for t in data.get("tasks") or ())
    return DrainProgress(elapsed=float(data.get("elapsed", 0.0)), remaining=float(data.get("remaining", 0.0)),
                         streak=int(data.get("streak", 0)), required=int(data.get("required", 0)),
                         active=int(data.get("active", 0)), reserved=int(data.get("reserved", 0)),
                         scheduled=int(data.get("scheduled", 0)), unknown=tuple(data.get("unknown") or ()),
                         workers=workers, tasks=tasks, warnings=tuple(data.get("warnings") or ()),
                         joined=tuple(data.get("joined") or ()), left=tuple(data.get("left") or ()),
                         silent={str(n): float(s) for n, s in (data.get("silent") or {}).items()},
                         alive=tuple(data.get("alive") or ()),
                         consumers={str(q): int(c) for q, c in (data.get("consumers") or {}).items()})


def _phase(data: Data) -> Event | None:
    phase = str(data.get("phase", ""))
    if phase not in RUN_PHASES:
        return None
    return PhaseChanged(phase, str(data.get("reason", "") or data.get("message", "") or ""))  # type: ignore[arg-type]


def _target(data: Data) -> TargetDeployed:
    kind = TargetRolledBack if data.get("rolled_back") else TargetDeployed
    return kind(**{f.name: str(data.get(f.name, "")) for f in fields(DeployedRevision)})


def _finished(data: Data) -> Event:
    outcome = str(data.get("event", "error"))
    if "exit_code" in data:  # the run's end (RunFinished); a drain's own end has no exit code
        targets = tuple(_target(t) for t in data.get("targets") or ())
        return RunFinished(outcome=outcome, exit_code=int(data["exit_code"]),  # type: ignore[arg-type]
                           message=str(data.get("message", "")), targets=targets,
                           logs_url=str(data.get("logs_url", "")))
    if outcome not in ("drained", "timeout", "interrupted", "error"):
        outcome = "error"
    return DrainFinished(outcome=outcome, elapsed=float(data.get("elapsed", 0.0)),  # type: ignore[arg-type]
                         message=str(data.get("message", "")))


def _overlap(data: Data) -> PoolStep:
    completed, rate = data.get("completed"), data.get("rate")
    return PoolStep(step=data["step"], target=str(data.get("target", "")),
                       old_revision=str(data.get("old_revision", "")), new_revision=str(data.get("new_revision", "")),
                       instances={str(r): int(n) for r, n in (data.get("instances") or {}).items()},
                       split={str(r): int(p) for r, p in (data.get("split") or {}).items()},
                       peak=int(data.get("peak") or 0), workers=_queues(data.get("workers")),
                       consuming=tuple(data.get("consuming") or ()),
                       completed=None if completed is None else int(completed),
                       rate=None if rate is None else float(rate), message=str(data.get("message", "")))


_ROLLOUT: dict[str, Callable[[Data], RolloutEvent]] = {
    "started": lambda d: RolloutStarted(str(d.get("target", "")), str(d.get("image", "")),
                                        str(d.get("operation", "")), str(d.get("previous_revision", ""))),
    "routing": lambda d: RouteStarted(str(d.get("target", "")), str(d.get("revision", "")), str(d.get("split", "")),
                                      str(d.get("operation", "")), str(d.get("previous_revision", ""))),
    "revision": lambda d: RevisionCreated(str(d.get("target", "")), str(d.get("revision", ""))),
    "condition": lambda d: ConditionChanged(str(d.get("target", "")), str(d.get("condition", "")),
                                            str(d.get("state", "")), str(d.get("message", ""))),
    "ready": lambda d: RolloutReady(str(d.get("target", "")), str(d.get("revision", ""))),
    "trouble": lambda d: PollTrouble(str(d.get("target", "")), str(d.get("message", ""))),
    "output": lambda d: CommandOutput(str(d.get("target", "")), str(d.get("line", ""))),
}


def _rollout(data: Data) -> Event | None:
    make = _ROLLOUT.get(str(data.get("step", "")))
    return make(data) if make is not None else None


_DECODERS: dict[str, Callable[[Data], Event | None]] = {
    "phase": _phase,
    "progress": progress_from_json,
    "poll": progress_from_json,
    "started": lambda d: DrainStarted(queues=tuple(d.get("queues") or ()), workers=_queues(d.get("workers")),
                                      interval=float(d.get("interval", 0.0)), streak=int(d.get("streak", 0)),
                                      max_wait=float(d.get("max_wait", 0.0)),
                                      forgotten=tuple(d.get("forgotten") or ())),
    "cancelled": lambda d: ConsumersCancelled(queues=tuple(d.get("queues") or ()),
                                              acknowledged=tuple(d.get("acknowledged") or ())),
    "restored": lambda d: ConsumersRestored(restored=_queues(d.get("restored")), verified=bool(d.get("verified")),
                                            missing=_queues(d.get("missing"))),
    "finished": _finished,
    "notice": lambda d: Notice(level=d.get("level") if d.get("level") in ("info", "warning", "error")  # type: ignore[arg-type]
                               else "info", message=str(d.get("message", ""))),
    "check": lambda d: CheckUpdate(str(d.get("id", "")), str(d.get("title", "")), d.get("status", "pending"),
                                   str(d.get("detail", "")), str(d.get("remedy", "")), bool(d.get("accepted"))),
    "preflight_done": lambda d: PreflightDone(failed=int(d.get("failed", 0)), warnings=int(d.get("warnings", 0)),
                                              accepted=tuple(d.get("accepted") or ())),
    "stage": lambda d: StageStarted(stage=str(d.get("stage", "")), detail=str(d.get("detail", ""))),
    "fleet": lambda d: FleetBack(workers=_queues(d.get("workers"))),
    "target": lambda d: _target(d),
    "deploy": _rollout,
    "overlap": _overlap,
    "canary_look": CanaryLook.from_json,
}


def decode(kind: str, data: Data) -> Event | None:
    """The typed event one published entry stands for; None for an entry this version does not know."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        return None
    try:
        return decoder(data)
    except (TypeError, ValueError, KeyError):
        return None
