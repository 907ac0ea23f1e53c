"""Recovery rules: what to do with an interrupted (or open) run, decided from its journal alone. Pure, no I/O.

The rules follow the facts recorded ahead of every side effect, not just the phase:

- nothing is stopped                       -> nothing to undo (an unfinished run is marked aborted);
- consumers stopped, no deploy started     -> restore exactly the recorded consumers, mark aborted;
- deploy started, new revision ready       -> leave the consumers alone, the operator finishes the run (resume);
- deploy started, failed / never took effect (the old revision still serves) -> restore, mark aborted;
- deploy started, outcome unknown or still rolling out -> touch nothing and ask the operator.

So no path leaves workers stopped: either the plan restores them, or the new revision is ready, or a person decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from celeryops.core.errors import EXIT_DEPLOY, EXIT_OK
from celeryops.ops.journal import ALL_WORKERS, OVERLAP_UP, Phase, Run

Rollout = Literal["ready", "failed", "in_progress", "not_started", "unknown"]
# "retire" / "cutover": a flow's of two revisions on a worker pool, carried out by its strategy (ops/run/pool/).
Action = Literal["nothing", "restore", "leave", "ask", "retire", "cutover"]
ROLLOUTS: Final[tuple[Rollout, ...]] = ("ready", "failed", "in_progress", "not_started", "unknown")

# The commands a plan points the operator at (the lead's command names; keep them in sync with the CLI).
ABORT: Final = "celeryops abort"  # carry out "nothing"/"restore": restore recorded consumers, mark aborted
ABORT_RESTORE: Final = "celeryops abort --restore"  # "ask": the operator says the old revision serves: restore
RESUME: Final = "celeryops resume"  # "leave"/"ask": the new revision serves: keep consumers, finish the run


@dataclass(frozen=True)
class RecoveryPlan:
    """What recovery would do. ``restore`` maps a worker (or ``"*"``: by broadcast, for workers that appeared
    since) to the queues to consume again; ``mark_as`` is the phase to record once ``abort`` carried the plan out
    (None: leave the run's phase alone: "leave" is finished by ``resume``, which records deployed/done itself;
    "ask" waits for a person)."""

    action: Action
    restore: dict[str, list[str]]
    explanation: str
    next_commands: list[str] = field(default_factory=list)
    mark_as: Phase | None = None

    @property
    def exit_code(self) -> int:
        """Headless mode: ``ask`` is not something a script may decide, so it exits non-zero."""
        return EXIT_DEPLOY if self.action == "ask" else EXIT_OK


def deploy_state(run: Run, rollout: Rollout | None) -> Rollout | None:
    """None when no deploy was started; else the observed ``rollout`` if known, else what the journal says."""
    start, settled = run.deploy()
    if start is None:
        # The deploy_start intent is durable (in the fleet's Redis too) before any update is sent: a run that
        # reached deploying without one never changed the target (e.g. Redis was down when it would have started).
        if run.phase == "deploying":
            return "not_started"
        if run.phase != "deployed":
            return None
    if rollout is not None and rollout != "unknown":
        return rollout
    if run.phase in ("deployed", "done") and start is not None:
        return "ready"
    if settled is not None:
        return "ready" if settled.payload.get("ok", True) else "failed"
    return "unknown"


def describe(stopped: dict[str, list[str]]) -> str:
    """Stopped consumers in words: their queues, on how many workers (or by broadcast)."""
    queues = sorted({q for qs in stopped.values() for q in qs})
    workers = sorted(w for w in stopped if w != ALL_WORKERS)
    where = f"{len(workers)} worker{'s' if len(workers) != 1 else ''}" if workers else "all workers"
    if workers and ALL_WORKERS in stopped:
        where += " and by broadcast"
    return f"{', '.join(queues)} on {where}"


def _target(run: Run) -> str:
    start, _ = run.deploy()
    if start is None:
        return "the service"
    return str(start.payload.get("target") or "the service")


def plan(run: Run, rollout: Rollout | None) -> RecoveryPlan:
    """Decide recovery for ``run`` given what the deploy target reports (``rollout``; None = not checked)."""
    if run.intents(OVERLAP_UP):  # a worker pool's revisions were changed: the pool's rules (ops/run/pool/rules.py)
        from celeryops.ops.run.pool.rules import recovery_plan

        return recovery_plan(run)
    stopped = {w: sorted(qs) for w, qs in sorted(run.stopped_consumers().items())}
    state = deploy_state(run, rollout)
    end: Phase | None = None if run.finished else "aborted"

    if not stopped:
        if run.finished:
            return RecoveryPlan("nothing", {}, f"Run {run.id} already ended ({run.outcome or run.phase}) "
                                "and no consumer is left stopped: there is nothing to do.")
        if state == "ready":
            return RecoveryPlan("leave", {}, f"Run {run.id} deployed to {_target(run)} and the new revision is ready; "
                                f"no consumer is stopped: finish the run with `{RESUME}`.", [RESUME])
        return RecoveryPlan("nothing", {}, f"Run {run.id} was interrupted in {run.phase} with no consumer stopped: "
                            "there is nothing to undo; it will be marked aborted.", [ABORT], end)

    what = describe(stopped)
    if state is None or state in ("failed", "not_started"):
        why = ("no deploy was started" if state is None
               else f"the deploy to {_target(run)} {'failed' if state == 'failed' else 'never took effect'} "
                    "and the old revision still serves")
        return RecoveryPlan("restore", stopped, f"Run {run.id} stopped consumers ({what}) and {why}: "
                            "they will be restored exactly as recorded and the run marked aborted.", [ABORT], end)
    if state == "ready":
        return RecoveryPlan("leave", {}, f"The new revision of {_target(run)} is ready, so the consumers run {run.id} "
                            f"stopped ({what}) belong to the old workers being replaced: leave them and finish "
                            f"the run with `{RESUME}`.", [] if run.finished else [RESUME])
    how = "is still rolling out" if state == "in_progress" else "has an unknown outcome"
    return RecoveryPlan("ask", {}, f"Run {run.id} stopped consumers ({what}) and the deploy to {_target(run)} {how}: "
                        f"nothing was touched; run `{RESUME}` once the new revision serves, or `{ABORT_RESTORE}` if "
                        "the old revision still serves.", [RESUME, ABORT_RESTORE], None)


@dataclass(frozen=True)
class Choice:
    """One recovery choice for an interrupted run: ``action`` (``resume`` / ``abort``), a label and what it does."""

    action: Literal["resume", "abort"]
    label: str
    detail: str
