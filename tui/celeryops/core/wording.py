"""How a run's events read for people: the one wording of each event, and how much it weighs, for the text output
of the commands (``celeryops drain``, ``deploy`` ... without ``--json``), the console's event log and the run
history's timeline. ``--json`` and the published status carry the events' data, never these sentences.

What a channel adds around a sentence stays with it: the text output's ``== `` before a stage, its mark before a
check and the check's remedy on a line of its own, its one line per poll; the console's views of the polls, the
rollouts and the fleet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import humanize

from celeryops.core.canarylook import CanaryLook, look_line
from celeryops.core.events import (
    CheckUpdate,
    ConsumersCancelled,
    ConsumersRestored,
    DrainFinished,
    DrainStarted,
    Event,
    Notice,
    PhaseChanged,
    PoolStep,
    PreflightDone,
    RunFinished,
    RunFollowed,
    StageStarted,
    TargetDeployed,
    TargetRolledBack,
)
from celeryops.core.scaleevents import AutoscaleLook, AutoscaleStep, AutoscaleStopped

Level = Literal["info", "ok", "warning", "error"]
Line = tuple[Level, str]


def duration(seconds: float) -> str:
    """``20 minutes``, ``1 minute and 5 seconds``; under a second: ``0 seconds``."""
    return humanize.precisedelta(seconds, minimum_unit="seconds", format="%0.0f") if seconds >= 1 else "0 seconds"


def phase_line(phase: str, reason: str = "", before: str | None = None) -> str:
    """``phase draining``, ``phase drained → aborted: timeout`` (``before``: the phase it left, where known)."""
    moved = f"{before} → {phase}" if before else phase
    return f"phase {moved}" + (f": {reason}" if reason else "")


def consumers(by_worker: Mapping[str, Iterable[str]]) -> str:
    """``w1 (a, b), w2 (c)``; queues given by broadcast (``*``) read as ``every worker (a)``."""
    named = [(w, q) for w, q in sorted(by_worker.items()) if w != "*"]
    every = [("every worker", by_worker["*"])] if "*" in by_worker else []
    return ", ".join(f"{w} ({', '.join(sorted(q))})" for w, q in [*named, *every])


def check_line(event: CheckUpdate) -> str:
    """A finished check's finding: ``Broker: redis://... answers``."""
    return f"{event.title}: {event.detail}"


def say(event: Event) -> Line | None:
    """The sentence a person reads for ``event`` and its weight; None for what has no sentence of its own (a poll,
    a rollout step, the fleet after a deploy: each channel shows those its own way)."""
    if isinstance(event, PhaseChanged):
        return "info", phase_line(event.phase, event.message)
    if isinstance(event, CheckUpdate):
        level: Level = {"warn": "warning", "fail": "error", "ok": "ok"}.get(event.status, "info")  # type: ignore[assignment]
        return level, check_line(event) + (" (accepted)" if event.accepted else "")
    if isinstance(event, PreflightDone):
        accepted = f" ({len(event.accepted)} accepted by the configuration)" if event.accepted else ""
        return ("error" if event.failed else "ok"), (f"Preflight: {event.failed} failed, {event.warnings} "
                                                     f"warning(s){accepted}.")
    if isinstance(event, DrainStarted):
        every = f"{round(event.interval, 2):g}s"
        return "info", (f"Draining {', '.join(event.queues)} on {len(event.workers)} worker(s): poll every {every}, "
                        f"drained after {event.streak} empty polls in a row, give up after {duration(event.max_wait)}.")
    if isinstance(event, ConsumersCancelled):
        return "info", (f"Consumers stopped on {', '.join(event.queues)} ({len(event.acknowledged)} worker(s) "
                        "confirmed).")
    if isinstance(event, ConsumersRestored):
        if event.verified:
            restored = f"Consumers restored and verified: {consumers(event.restored)}." if event.restored else \
                "Consumers: nothing needed restoring."
            return "ok", restored
        missing = f"not back yet: {consumers(event.missing)}" if event.missing else "not all confirmed"
        if not event.restored:
            return ("warning", f"Consumers {missing}.") if event.missing else None
        return "warning", f"Consumers restored: {consumers(event.restored)}; {missing}."
    if isinstance(event, DrainFinished):
        return ("ok" if event.outcome == "drained" else "error"), event.message
    if isinstance(event, StageStarted):
        return "info", event.stage + (f": {event.detail}" if event.detail else "")
    if isinstance(event, TargetDeployed):
        where = ", ".join(w for w in (f"revision {event.revision}" if event.revision else "", event.url,
                                      f"console {event.console_url}" if event.console_url else "") if w)
        logs = f"; logs {event.logs_url}" if event.logs_url else ""
        if isinstance(event, TargetRolledBack):
            was = f" (was {event.previous_revision})" if event.previous_revision else ""
            return "ok", f"{event.target} rolled back: {where} serves now{was}{logs}"
        return "ok", f"{event.target} deployed" + (f": {where}" if where else "") + logs
    if isinstance(event, RunFinished):
        return ("ok" if event.exit_code == 0 else "error"), event.message
    if isinstance(event, Notice):
        return event.level, event.message
    if isinstance(event, PoolStep):
        if event.step == "progress":  # shown by the screens and --json, not a line each time
            return None
        steps: dict[str, Level] = {"kept_both": "warning", "retiring": "warning", "cut_over": "ok", "retired": "ok",
                                   "consuming": "ok", "old_idle": "ok"}
        return steps.get(event.step, "info"), f"{event.target}: {event.message or event.step.replace('_', ' ')}"
    if isinstance(event, CanaryLook):  # one line per look
        levels: dict[str, Level] = {"rollback": "error", "promote": "ok", "inconclusive": "warning"}
        return levels.get(event.verdict, "info"), look_line(event)
    if isinstance(event, AutoscaleLook):
        what = f"{event.demand} task(s) against {event.capacity} ({event.instances} x {event.per_instance})"
        dry = " (dry run: nothing changed)" if event.dry_run and event.action in ("out", "in") else ""
        return ("info" if event.action != "wait" else "warning"), f"{event.target}: {what}; {event.reason}{dry}"
    if isinstance(event, AutoscaleStep):
        levels = {"given_up": "warning", "waiting": "info", "added": "ok", "removed": "ok"}
        return levels.get(event.step, "info"), f"{event.target}: {event.message}"  # type: ignore[return-value]
    if isinstance(event, AutoscaleStopped):
        return ("ok" if event.exit_code == 0 else "error"), event.message
    if isinstance(event, RunFollowed):
        return "info", f"following run {event.run_id} of {event.owner}" + (
            f", release {event.release}" if event.release else "")
    return None
