"""What the console knows about the run it shows: built from ops events, read by the screens.
Plain Python (the screens render it; tests can inspect it)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from celeryops.core.errors import EXIT_DEPLOY, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREFLIGHT, EXIT_TIMEOUT
from celeryops.core.masking import mask_text

if TYPE_CHECKING:  # imported by apply() with the first event: the console's first frame does not wait for them
    from celeryops.core.canarylook import CanaryLook
    from celeryops.core.events import (
        CheckUpdate,
        DrainFinished,
        DrainProgress,
        DrainStarted,
        Event,
        PoolStep,
        PreflightDone,
        RunFinished,
        RunFollowed,
        RunKind,
        RunPhase,
    )
    from celeryops.ops.backend.views import DeployTarget, WorkerView
    from celeryops.ops.run.strategies import Said

View = Literal["preflight", "drain", "deploy", "overlap", "canary"]
ACTIVE_PHASES = ("preflight", "ready", "overlapping", "stopping", "draining", "scaling", "cutting_over", "deploying",
                 "deployed", "retiring")
DEPLOY_PHASES = ("deploying", "deployed", "overlapping", "cutting_over", "retiring")  # the deploy screen shows them
OVERLAP_PHASES = ("overlapping", "cutting_over", "retiring")  # only an overlap deploy has them
#: Preflight checks only an overlap deploy runs (ops/preflight/overlap.py): their ids tell the console, before the
#: first ``overlap`` event, that G starts an overlap (the new revision beside the old one), not a drain.
OVERLAP_CHECKS = ("mixed_versions",)
LEVEL_STYLE = {"info": "", "warning": "yellow", "error": "bold red", "ok": "green"}


@dataclass
class LogLine:
    level: str
    text: str


@dataclass
class OverlapState:
    """An overlap deploy as its ``overlap`` events told it so far: the two revisions, the last step, and the latest
    instances, split, workers and the new revision's completed tasks (each kept until an event says otherwise)."""

    target: str
    old: str
    new: str
    step: str = "planned"
    peak: int = 0
    instances: dict[str, int] = field(default_factory=dict)
    split: dict[str, int] = field(default_factory=dict)
    workers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    consuming: tuple[str, ...] = ()
    completed: int | None = None
    rate: float | None = None
    rates: deque[float] = field(default_factory=lambda: deque(maxlen=240))  # the new revision's tasks/s, per tick
    steps: list[str] = field(default_factory=list)  # every step but progress, in order
    count: int = 0  # the pool's instance count before the deploy (and after it)

    def fold(self, event: PoolStep) -> None:
        if event.step != "progress":
            self.step = event.step
            self.steps.append(event.step)
        self.old, self.new = event.old_revision or self.old, event.new_revision or self.new
        self.peak = event.peak or self.peak
        if event.instances:
            self.instances = dict(event.instances)
            if event.step == "planned":
                self.count = sum(event.instances.values())  # the old revision's, or every old cohort's
        if event.split:
            self.split = dict(event.split)
        if event.workers:
            self.workers = {rev: tuple(names) for rev, names in event.workers.items()}
        if event.consuming:
            self.consuming = tuple(event.consuming)
        if event.completed is not None:
            self.completed = event.completed
        if event.rate is not None:
            self.rate = event.rate
            self.rates.append(event.rate)

    def seen(self, step: str) -> bool:
        return step in self.steps

    @property
    def retiring(self) -> bool:
        """The new revision is being taken away again (an abort, a timeout, a failure)."""
        return any(s in self.steps for s in ("retiring", "old_restored", "holding_new", "retired", "kept_both"))

    @property
    def drained_revision(self) -> str:
        """Whose workers the drain's polls are about: the new revision's while it is held, else the old one's."""
        return self.new if self.step == "holding_new" else self.old


@dataclass
class RunModel:
    """The run as the console has seen it so far."""

    kind: RunKind | None = None
    release: str | None = None
    phase: RunPhase | None = None
    checks: dict[str, CheckUpdate] = field(default_factory=dict)
    preflight: PreflightDone | None = None
    started: DrainStarted | None = None
    progress: DrainProgress | None = None
    inflight: deque[int] = field(default_factory=lambda: deque(maxlen=240))
    log: deque[LogLine] = field(default_factory=lambda: deque(maxlen=1000))
    log_total: int = 0  # lines ever logged (screens append the ones they have not shown)
    deploy: dict[str, DeployTarget] | None = None  # target -> its rollout, folded from the typed rollout events
    fleet_back: tuple[WorkerView, ...] = ()
    finished: DrainFinished | None = None
    result: RunFinished | None = None
    operator_aborted: bool = False
    overlap: OverlapState | None = None  # an overlap deploy (a worker pool), from its ``overlap`` events
    canary: CanaryLook | None = None  # a canary deploy's latest look (``canary_look`` events)
    canary_history: deque[float] = field(default_factory=lambda: deque(maxlen=240))  # the increase's upper bound
    strategy: str = ""  # the deploy's strategy, from its preflight stage ("" until said)

    @property
    def in_canary(self) -> bool:
        """A canary is being judged: its looks came, and no promotion's cutover or rollback moved on to the overlap's
        steps (the old revision's drain, the cutover, the retirement: the overlap screen shows those)."""
        return self.canary is not None and (self.overlap is None or not any(
            self.overlap.seen(step) for step in ("stopping_old", "cutting_over", "retiring", "holding_new")))

    @property
    def said(self) -> Said:
        """What the run's strategy says before it starts (its preflight names the strategy; a drain-only run none)."""
        from celeryops.ops.run.strategies import said_of

        return said_of(self.strategy, self.kind or "drain", self.release)

    @property
    def is_overlap(self) -> bool:
        """An overlap deploy: its events say so, or (before the first) its preflight runs the overlap's checks."""
        return self.overlap is not None or any(c in self.checks for c in OVERLAP_CHECKS)

    @property
    def active(self) -> bool:
        return self.phase in ACTIVE_PHASES or (self.phase == "drained" and self.kind in ("deploy", "rollback"))

    @property
    def parked(self) -> bool:
        """A drain-only run ended drained: its consumers stay stopped until a deploy or an abort."""
        return self.kind == "drain" and self.phase == "drained" and not self.operator_aborted

    @property
    def targets(self) -> tuple[DeployTarget, ...]:
        return tuple(self.deploy.values()) if self.deploy else ()

    @property
    def view(self) -> View | None:
        """The screen that shows the current phase best."""
        if self.phase in ("preflight", "ready") or (self.phase == "failed" and self.started is None
                                                     and self.overlap is None):
            return "preflight"
        if self.in_canary:  # the canary's looks, until a promotion or a rollback moves on
            return "canary"
        if self.overlap is not None or self.phase in OVERLAP_PHASES:  # both revisions side by side, to the end
            return "overlap"
        if self.phase in DEPLOY_PHASES or (self.phase in ("done", "failed", "aborted")
                                           and self.deploy is not None) or (
                self.kind in ("deploy", "rollback") and self.phase == "done"):
            return "deploy"
        if self.phase is not None or self.progress is not None:
            return "drain"
        return None

    @property
    def failed_checks(self) -> list[CheckUpdate]:
        return [c for c in self.checks.values() if c.status == "fail"]

    @property
    def warned_checks(self) -> list[CheckUpdate]:
        return [c for c in self.checks.values() if c.status == "warn" and not c.accepted]

    @property
    def may_proceed(self) -> bool:
        """Preflight finished with nothing failed, and the run waits for the operator."""
        return self.preflight is not None and not self.failed_checks and self.phase in ("preflight", "ready")

    def exit_code(self) -> int:
        if self.result is not None:
            return self.result.exit_code
        if self.phase in ("done", "drained") or self.phase is None:
            return EXIT_OK
        if self.finished is not None and self.finished.outcome == "timeout":
            return EXIT_TIMEOUT
        if self.failed_checks:
            return EXIT_PREFLIGHT
        if self.phase == "failed" and self.deploy is not None:
            return EXIT_DEPLOY
        return EXIT_INTERRUPTED

    def say(self, level: str, text: str) -> None:
        self.log.append(LogLine(level, mask_text(text)))
        self.log_total += 1

    def apply(self, event: Event) -> None:
        """Fold one event into the model, and its line (:mod:`celeryops.core.wording`) into the event log."""
        from celeryops.core import wording  # with the first event: the first frame does not wait for it
        from celeryops.core.events import CheckUpdate, DrainFinished, RunFinished

        self._fold(event)
        said = wording.say(event)
        if said is None or (isinstance(event, CheckUpdate) and event.status not in ("warn", "fail")):
            return
        if isinstance(event, DrainFinished) and event.outcome == "interrupted" and self.operator_aborted:
            said = "warning", "drain aborted from this console: consumers restored, nothing was killed."  # X here
        self.say(*said)
        if isinstance(event, RunFinished) and event.logs_url:
            self.say("info", f"Logs URL: {event.logs_url}")

    def _fold(self, event: Event) -> None:
        from celeryops.adapters.deploy.base import RolloutEvent
        from celeryops.core import events as ev
        from celeryops.core.canarylook import CanaryLook
        from celeryops.ops.backend.views import WorkerView, fold_rollout

        if isinstance(event, ev.PhaseChanged):
            self.phase = event.phase
        elif isinstance(event, ev.CheckUpdate):
            self.checks[event.id] = event
        elif isinstance(event, ev.PreflightDone):
            self.preflight = event
            self.phase = "ready" if not event.failed else "failed"
        elif isinstance(event, ev.DrainStarted):
            if self.started is not None:  # another drain of the same run (an overlap retiring its new revision)
                self.finished, self.progress = None, None
            self.started = event
        elif isinstance(event, ev.DrainProgress):
            self._progress(event)
        elif isinstance(event, ev.DrainFinished):
            self.finished = event
        elif isinstance(event, RolloutEvent):
            targets = dict(self.deploy or {})
            targets[event.target] = fold_rollout(targets.get(event.target), event)
            self.deploy = targets
        elif isinstance(event, ev.FleetBack):
            self.fleet_back = tuple(WorkerView(w, "consuming", tuple(q)) for w, q in sorted(event.workers.items()))
        elif isinstance(event, ev.PoolStep):
            if self.overlap is None or (event.new_revision and event.new_revision != self.overlap.new
                                        and self.overlap.new):
                self.overlap = OverlapState(event.target, event.old_revision, event.new_revision)
            self.overlap.fold(event)
        elif isinstance(event, ev.StageStarted):
            self.strategy = event.strategy or self.strategy
        elif isinstance(event, CanaryLook):
            self.canary = event
            self.canary_history.append(event.increase_high)
        elif isinstance(event, ev.RunFinished):
            self._finished(event)
        elif isinstance(event, ev.RunFollowed):
            self._follow(event)

    def _finished(self, event: RunFinished) -> None:
        from celeryops.ops.backend.views import DeployTarget

        self.result = event
        if event.outcome in ("deploy_failed", "rollback_failed"):
            self.phase = "failed"
            self.deploy = {name: DeployTarget(t.target, t.revision, "failed", t.conditions, t.message)
                           if t.state != "ready" else t for name, t in (self.deploy or {}).items()} or {
                "deploy": DeployTarget("deploy", state="failed")}

    def _follow(self, event: RunFollowed) -> None:
        """Watch mode: another run begins; what the model knew belongs to the run before (the log stays)."""
        self.kind, self.release, self.phase = event.run_kind, event.release, None
        self.checks, self.preflight, self.started, self.progress = {}, None, None, None
        self.inflight.clear()
        self.deploy, self.fleet_back, self.finished, self.operator_aborted = None, (), None, False
        self.result, self.overlap, self.canary = None, None, None
        self.canary_history.clear()

    def _progress(self, event: DrainProgress) -> None:
        previous = self.progress
        self.progress = event
        self.inflight.append(event.active + event.reserved)
        if previous is not None and event.streak < previous.streak:
            self.say("warning", f"empty streak reset ({previous.streak} → {event.streak}): "
                                f"{event.active} active, {event.reserved} reserved")
        for name in event.joined:
            self.say("warning", f"worker {name} joined mid-drain: consumers cancelled on it too")
        for name in event.left:
            self.say("info", f"worker {name} left")
        logged = () if previous is None else previous.warnings
        for warning in event.warnings:
            if warning not in logged:  # a warning that holds over several polls is logged once
                self.say("warning", warning)
