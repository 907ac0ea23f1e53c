"""The run journal's model: phases and their allowed moves, the records of a run and what they mean for recovery
(which consumers a run stopped, which deploy it started). Pure data, no I/O: the local journal
(:mod:`celeryops.ops.journal`) and the fleet-held copy (:mod:`celeryops.ops.journal.fleetstore`) both build these."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

from celeryops.core.config import DrainSettings
from celeryops.core.errors import UserError
from celeryops.core.events import RunKind
from celeryops.core.masking import mask_text

Phase = Literal["preflight", "overlapping", "stopping", "draining", "drained", "scaling", "cutting_over", "deploying",
                "deployed", "retiring", "done", "aborted", "failed"]
PHASES: Final[tuple[Phase, ...]] = (
    "preflight", "overlapping", "stopping", "draining", "drained", "scaling", "cutting_over", "deploying", "deployed",
    "retiring", "done", "aborted", "failed",
)
TERMINAL_PHASES: Final[frozenset[Phase]] = frozenset({"done", "aborted", "failed"})
# Forward moves only. Every non-terminal phase may also end in "aborted" or "failed" (added below).
# drained -> done is a drain-only run that was closed without a deploy (e.g. after the operator restored
# consumers by hand); a drain-only run that exits 0 simply stays open in "drained" until abort or deploy.
# An overlap deploy (a worker pool): preflight -> overlapping (the new revision up and consuming beside the old one)
# -> stopping -> draining -> drained (the old revision alone) -> cutting_over -> deployed -> done; from any step
# before the cutover it may go to retiring (the new revision is taken away), and back to overlapping when the new
# revision stayed busy (both consume again).
# An autoscale step (a worker pool's size): preflight -> scaling (a cohort added) -> done, or preflight -> stopping ->
# draining -> drained (an idle cohort, alone) -> scaling (its instances taken away) -> done.
_FORWARD: Final[dict[Phase, frozenset[Phase]]] = {
    "preflight": frozenset({"stopping", "overlapping", "scaling"}),
    "overlapping": frozenset({"stopping", "retiring"}),
    "stopping": frozenset({"draining", "retiring"}),
    "draining": frozenset({"drained", "retiring"}),
    "drained": frozenset({"deploying", "done", "cutting_over", "retiring", "scaling"}),
    "scaling": frozenset({"done"}),
    "cutting_over": frozenset({"deployed"}),
    "deploying": frozenset({"deployed"}),
    "deployed": frozenset({"done"}),
    "retiring": frozenset({"overlapping"}),
}
ALLOWED_TRANSITIONS: Final[dict[Phase, frozenset[Phase]]] = {
    phase: (_FORWARD.get(phase, frozenset()) | frozenset({"aborted", "failed"}))
    if phase not in TERMINAL_PHASES else frozenset()
    for phase in PHASES
}
DEFAULT_OUTCOME: Final[dict[Phase, str]] = {"done": "succeeded", "aborted": "aborted", "failed": "failed"}

# Intent kinds the journal understands (others are stored and replayed as plain records).
CANCEL_CONSUMERS: Final = "cancel_consumers"
ADD_CONSUMERS: Final = "add_consumers"
DEPLOY_START: Final = "deploy_start"
# An overlap deploy's pool updates, each written before it is sent (the pool's count and split before, the change):
# the new revision brought up beside the old one, every instance moved to the new one, the pool put back on the old
# one (the retirement of the new revision: begun by this intent, settled when done or given up).
OVERLAP_UP: Final = "overlap_up"
OVERLAP_CUTOVER: Final = "overlap_cutover"
OVERLAP_REVERT: Final = "overlap_revert"
# An autoscale step's pool update (the pool's counts per revision before, the counts it asks for): a cohort added, or
# an idle, fenced cohort's instances taken away.
SCALE_POOL: Final = "scale_pool"
ALL_WORKERS: Final = "*"

RecordKind = Literal["created", "phase", "intent", "settle", "note"]


class InvalidTransition(UserError):
    """A run was asked to move to a phase it cannot reach from where it is."""


class UnknownRun(UserError):
    """No run (or intent) with that id in this journal."""


@dataclass(frozen=True)
class Record:
    """One journal entry of a run, in write order (``seq`` increases)."""

    seq: int
    at: float
    kind: RecordKind
    payload: dict[str, Any]
    intent: str | None = None  # the intent kind, for "intent" and "settle" records
    settles: int | None = None  # for "settle": the seq of the intent it settles


@dataclass(frozen=True)
class Run:
    """A run as the journal knows it (``records`` oldest first)."""

    id: str
    fleet: str
    broker: str
    user: str
    host: str
    pid: int
    release: str | None
    settings: dict[str, Any]
    created: float
    updated: float
    phase: Phase
    outcome: str | None
    records: tuple[Record, ...] = field(default=())

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def kind(self) -> RunKind:
        """What the run does: a rollback (recorded in its settings), a deploy (it has a release), or a drain."""
        if self.settings.get("kind") in ("rollback", "autoscale"):
            return self.settings["kind"]  # type: ignore[no-any-return]
        return "deploy" if self.release else "drain"

    def intents(self, kind: str | None = None) -> list[Record]:
        return [r for r in self.records if r.kind == "intent" and (kind is None or r.intent == kind)]

    def settlement(self, intent_seq: int) -> Record | None:
        """The settle record of an intent, or None while it is unsettled."""
        for r in self.records:
            if r.kind == "settle" and r.settles == intent_seq:
                return r
        return None

    def stopped_consumers(self) -> dict[str, set[str]]:
        """Queues stopped by this run and not yet restored, per worker (``"*"``: by broadcast, i.e. also on
        workers that appeared since). Cancel intents count as soon as recorded; restores only once settled ok."""
        stopped: dict[str, set[str]] = {}
        for rec in self.records:
            if rec.kind == "intent" and rec.intent == CANCEL_CONSUMERS:
                for worker, queues in _queue_map(_section(rec.payload, "stop")).items():
                    stopped.setdefault(worker, set()).update(queues)
            elif rec.kind == "settle" and rec.intent == ADD_CONSUMERS and rec.payload.get("ok", True):
                intent = self._record(rec.settles)
                if intent is None:
                    continue
                for worker, queues in _queue_map(_section(intent.payload, "add")).items():
                    targets = list(stopped) if worker == ALL_WORKERS else [worker]
                    for target in targets:
                        stopped.get(target, set()).difference_update(queues)
        return {w: qs for w, qs in stopped.items() if qs}

    @property
    def strategy(self) -> str:
        """How this run deploys: ``drain`` (also every drain-only run) or ``overlap`` (recorded in its settings)."""
        return str(self.settings.get("strategy") or "drain")

    def drain_settings(self) -> DrainSettings:
        """How the run's drains poll and how long they wait: its recorded ``interval``, ``streak`` and ``max_wait``
        (the defaults for what a record lacks)."""
        st, default = self.settings, DrainSettings()
        return DrainSettings(interval=float(st.get("interval", default.interval)),
                             streak=int(st.get("streak", default.streak)),
                             max_wait=float(st.get("max_wait", default.max_wait)))

    def holds_fleet(self) -> bool:
        """Whether this run, while unfinished, holds something a new run must not start over: consumers it stopped,
        or a worker pool it began to change (an overlap deploy)."""
        return bool(self.stopped_consumers()) or bool(self.intents(OVERLAP_UP))

    def recorded_workers(self) -> set[str]:
        """Every worker a stop of this run named, also those it stopped nothing on (they consumed none of the drained
        queues): a restore must not take them for workers that appeared since."""
        named: set[str] = set()
        for rec in self.intents(CANCEL_CONSUMERS):
            named |= set(_queue_map(_section(rec.payload, "stop"))) | set(_queue_map(rec.payload.get("before", {})))
        return named - {ALL_WORKERS}

    def unconfirmed_consumers(self) -> dict[str, set[str]]:
        """The consumers the latest settled restore of this run could not confirm back, per worker ({} when it was
        confirmed, or none was settled)."""
        settled = [r for r in self.records if r.kind == "settle" and r.intent == ADD_CONSUMERS]
        if not settled or settled[-1].payload.get("ok", True):
            return {}
        missing = _queue_map(settled[-1].payload.get("missing", {}))
        return {w: set(qs) for w, qs in missing.items() if qs}

    def consumed_before(self) -> dict[str, set[str]]:
        """The queues each worker consumed before this run first stopped anything (as recorded)."""
        before: dict[str, set[str]] = {}
        for rec in self.intents(CANCEL_CONSUMERS):
            for worker, queues in _queue_map(rec.payload.get("before", {})).items():
                before.setdefault(worker, set(queues))
        return before

    def deploy(self) -> tuple[Record | None, Record | None]:
        """The latest ``deploy_start`` intent and its settle record (either may be None)."""
        starts = self.intents(DEPLOY_START)
        if not starts:
            return None, None
        return starts[-1], self.settlement(starts[-1].seq)

    def _record(self, seq: int | None) -> Record | None:
        return next((r for r in self.records if r.seq == seq), None)


@dataclass(frozen=True)
class RunLine:
    """One line of ``celeryops runs``: a run without its records, as :meth:`Journal.history` lists it."""

    id: str
    fleet: str
    release: str | None
    phase: Phase
    outcome: str | None
    created: float
    updated: float

    @property
    def duration(self) -> float:
        return max(0.0, self.updated - self.created)


def new_run_id(now: float | None = None) -> str:
    """Short, sortable, unique enough: ``20261202-152916-3fa9c1`` (UTC second + 24 random bits)."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


def _section(payload: dict[str, Any], name: str) -> object:
    """``payload[name]``; a payload given as a bare {worker: [queues]} map (generic ``intend``) is that map."""
    if name in payload:
        return payload[name]
    return {k: v for k, v in payload.items() if k not in ("before", "stop", "add")}


def consumers_text(consumers: Mapping[str, Iterable[str]]) -> str:
    """``worker (queue, queue), ...`` for the operator (the by-broadcast entry left out)."""
    return ", ".join(f"{w} ({', '.join(sorted(q))})" for w, q in sorted(consumers.items()) if w != ALL_WORKERS)


def _queue_map(value: object) -> dict[str, set[str]]:
    if not isinstance(value, Mapping):
        return {}
    return {str(w): {str(q) for q in qs} for w, qs in value.items() if isinstance(qs, (list, tuple, set))}


def queue_json(value: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    return {str(w): sorted({str(q) for q in qs}) for w, qs in value.items()}


def dumps_masked(value: object) -> str:
    """JSON with every ``scheme://user:password@`` masked: the journal never holds a password."""
    return mask_text(json.dumps(value, sort_keys=True, default=str))
