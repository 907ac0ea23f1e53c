"""``celeryops doctor``: the worker settings that lose or duplicate work on the platform the fleet runs on, read from
the live workers (:mod:`.read`), judged by pure rules (:mod:`.shutdown`, :mod:`.delivery`), and what the console sees
happen (:mod:`.live`). Read-only: the doctor sends only inspect commands and writes no key."""

from __future__ import annotations

from dataclasses import dataclass

from celeryops.core.events import DoctorNote, Finding
from celeryops.ops.doctor import delivery, shutdown
from celeryops.ops.doctor.facts import FleetFacts, WorkerFacts

LONG_TASK = 60.0  # seconds: a task that runs this long counts as long (prefetch)

__all__ = ["LONG_TASK", "Diagnosis", "FleetFacts", "WorkerFacts", "diagnose"]


@dataclass(frozen=True)
class Diagnosis:
    findings: tuple[Finding, ...]
    notes: tuple[DoctorNote, ...]
    checked: tuple[str, ...]
    unchecked: tuple[str, ...]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.id for f in self.findings))


def diagnose(facts: FleetFacts, *, grace: float | None = None, long: float = LONG_TASK) -> Diagnosis:
    """Every finding and note on ``facts``. ``grace``: the platform's grace where the doctor cannot see it
    (Kubernetes: default 30; a platform it does not recognise: checked only when given)."""
    findings: list[Finding] = [
        *shutdown.shutdown_findings(facts, grace), *shutdown.pid1_findings(facts, grace),
        *shutdown.eta_shutdown_findings(facts, grace), *delivery.visibility_eta(facts),
        *delivery.visibility_runtime(facts), *delivery.prefetch_long_tasks(facts, long), *delivery.late_acks(facts),
        *delivery.connection_loss(facts), *delivery.result_expires(facts), *delivery.unchecked(facts)]
    notes = [*shutdown.platform_notes(facts, grace), *delivery.late_ack_notes(facts)]
    return Diagnosis(tuple(findings), tuple(notes), tuple(sorted(w.name for w in facts.checked)),
                     tuple(facts.unchecked))
