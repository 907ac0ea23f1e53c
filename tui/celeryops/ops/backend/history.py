"""The fleet's run history for the console: recent runs (phase, kind, release, who, started, duration, outcome)
and one run's event timeline, read from the local journal (a phase worded as the console's log words it:
:mod:`celeryops.core.wording`). Plain functions over a journal (the console's backend runs them in a worker
thread); a fleet-held run store plugs in as another source of the same views."""

from __future__ import annotations

from celeryops.adapters.deploy.base import describe_split
from celeryops.core.wording import phase_line
from celeryops.ops.backend.views import RunRecordView, TimelineEntry
from celeryops.ops.journal import ADD_CONSUMERS, CANCEL_CONSUMERS, DEPLOY_START, OVERLAP_UP, Journal, Record, Run
from celeryops.ops.run.pool.rules import Plan
from celeryops.ops.run.rollback_plan import replaced_by


def local_runs(journal: Journal, fleet: str, limit: int) -> list[RunRecordView]:
    """The fleet's latest ``limit`` runs in this machine's journal, newest first."""
    out = []
    for summary in journal.history(limit, fleet):
        run = journal.get(summary.id)
        out.append(RunRecordView(
            run_id=run.id, kind=run.kind, phase=run.phase, release=run.release,
            owner=f"{run.user}@{run.host}", started_at=run.created,
            duration=summary.duration if run.finished else None, outcome=run.outcome, source="journal"))
    return out


def merge_runs(*sources: list[RunRecordView], limit: int) -> tuple[RunRecordView, ...]:
    """One list from several sources (a run in two of them is listed once, from the first), newest first."""
    seen: dict[str, RunRecordView] = {}
    for rows in sources:
        for row in rows:
            seen.setdefault(row.run_id, row)
    return tuple(sorted(seen.values(), key=lambda r: (r.started_at, r.run_id), reverse=True)[:limit])


def _queues(section: object) -> str:
    if not isinstance(section, dict) or not section:
        return "no queue"
    workers = [w for w in section if w != "*"]
    queues = sorted({q for qs in section.values() if isinstance(qs, list) for q in qs})
    where = "every worker" if "*" in section else f"{len(workers)} worker(s)"
    return f"{', '.join(queues) or 'no queue'} on {where}"


def _line(run: Run, rec: Record) -> tuple[str, str]:
    p = rec.payload
    if rec.kind == "created":
        what = {"rollback": f" to roll back to {run.release}", "deploy": f" to deploy {run.release}"}
        return "info", f"run created by {run.user}@{run.host}" + what.get(run.kind, " to drain")
    if rec.kind == "phase":
        level = {"done": "ok", "drained": "ok", "failed": "error", "aborted": "warning"}.get(str(p.get("to")), "info")
        return level, phase_line(str(p.get("to")), str(p.get("reason") or ""), before=str(p.get("from")))
    if rec.kind == "intent":
        if rec.intent == CANCEL_CONSUMERS:
            return "info", f"about to cancel consumers: {_queues(p.get('stop'))}"
        if rec.intent == ADD_CONSUMERS:
            return "info", f"about to restore consumers: {_queues(p.get('add'))}"
        if rec.intent == DEPLOY_START and p.get("split"):  # a rollback's route to existing revisions
            return "info", f"about to route {p.get('target')} back to revision {p.get('revision')}"
        was = replaced_by(rec) if rec.intent in (DEPLOY_START, OVERLAP_UP) else ()
        previous = f" (previous: {describe_split(was)})" if was else ""
        if rec.intent == DEPLOY_START:
            return "info", f"about to deploy {p.get('image')} to {p.get('target')}{previous}"
        if rec.intent == OVERLAP_UP:
            plan = Plan.from_payload(p)
            verb = "promote" if p.get("promote") else "run"
            return "info", (f"about to {verb} {plan.new_count} instance(s) of {plan.new} beside {plan.count} of "
                            f"{plan.old} on {plan.target}{previous}")
        return "info", f"about to {rec.intent}"
    if rec.kind == "settle":
        ok = p.get("ok", True)
        extra = ", ".join(f"{k} {v}" for k, v in p.items() if k != "ok" and isinstance(v, str | int | float) and v)
        return ("ok" if ok else "error"), f"{rec.intent} {'done' if ok else 'did not take effect'}" + (
            f" ({extra})" if extra else "")
    words = ", ".join(f"{k} {v}" for k, v in p.items() if isinstance(v, str | int | float))
    return "info", f"note: {words}" if words else "note"


def local_timeline(journal: Journal, run_id: str) -> tuple[TimelineEntry, ...]:
    """Every journal record of the run, oldest first, one line each (raises ``UnknownRun`` for a bad id)."""
    run = journal.get(run_id)
    return tuple(TimelineEntry(rec.at, *_line(run, rec)) for rec in run.records)
