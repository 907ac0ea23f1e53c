"""``celeryops status`` (the fleet's current run, from Redis or the local journal, and what recovery would do)
and ``celeryops runs`` (the run history of the local journal). Both only read: no key, no journal is written; with
no run open, ``status`` asks the workers the last run restored what they consume (one active_queues round), to name
those a broker reconnect stranded."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from dataclasses import dataclass, field
from typing import Any

import click
import humanize
import redis

from celeryops.commands.common import FleetSpec, fleet_options, state_dir_option
from celeryops.core.errors import UserError
from celeryops.core.events import RUN_PHASES
from celeryops.core.masking import mask_text, mask_url
from celeryops.core.untrusted import MalformedRecord
from celeryops.ops.access.probe import refused_login
from celeryops.ops.fleetwide.brokersafety import SafetyVerdict, assess
from celeryops.ops.fleetwide.lease import LeaseInfo, ago, read_lease
from celeryops.ops.fleetwide.publish import PublishedStatus, read_status
from celeryops.ops.fleetwide.scalestatus import ScaleStatus, read_scale_status
from celeryops.ops.journal import (
    TERMINAL_PHASES,
    FleetStore,
    Journal,
    Run,
    consumers_text,
    journal_path,
    merge_open,
    newest,
    unconfirmed_restore,
)
from celeryops.ops.run.interrupted import RunHolder, holder_of
from celeryops.ops.run.recovery import RecoveryPlan
from celeryops.ops.run.stranded import REMEDY, Stranded, last_restore, stranded, stranded_text


def _duration(seconds: float) -> str:
    return humanize.naturaldelta(seconds) if seconds >= 1 else "under a second"


def _precise(seconds: float) -> str:
    """To the second, in words: ``4 minutes and 54 seconds``."""
    if seconds < 1:
        return "0 seconds"
    return str(humanize.precisedelta(dt.timedelta(seconds=round(seconds)), minimum_unit="seconds", format="%0.0f"))


def progress_words(progress: dict[str, Any]) -> str:
    """A published drain poll in words (no raw floats): ``streak 1 of 2 · 3 active · 0 reserved · 6 seconds
    elapsed · 4 minutes and 54 seconds to max wait``."""
    parts = []
    if "streak" in progress:
        parts.append(f"streak {progress['streak']} of {progress.get('required', '?')}")
    for key in ("active", "reserved", "scheduled"):
        if isinstance(progress.get(key), int):
            parts.append(f"{progress[key]} {key}")
    unknown = progress.get("unknown")
    if isinstance(unknown, list | tuple) and unknown:
        parts.append(f"{len(unknown)} unknown ({', '.join(map(str, unknown))})")
    if isinstance(progress.get("elapsed"), int | float):
        parts.append(f"{_precise(progress['elapsed'])} elapsed")
    if isinstance(progress.get("remaining"), int | float):
        parts.append(f"{_precise(progress['remaining'])} to max wait")
    return " · ".join(parts)


def phase_word(phase: str | None) -> str:
    """The run phase in the one vocabulary (``core.events.RUN_PHASES``); anything else is shown as unknown."""
    return phase if phase in RUN_PHASES else f"unknown ({phase})"


def open_journal_if_any(state_dir: str | None) -> Journal | None:
    """The journal if its file exists (reading never creates the state dir); UserError if it is unusable."""
    path = journal_path(state_dir)
    return Journal(path, read_only=True) if path.exists() else None


def status_redis(fleet: FleetSpec) -> tuple[str | None, str | None]:
    """(the fleet's coordination Redis, ``RunSettings.coordination_url``, or None; a note on why not). The broker
    is resolved only when ``$CELERYOPS_REDIS_URL`` is not set."""
    run = fleet.config().run
    try:
        broker = None if run.redis_url else fleet.resolve_broker_url()
    except UserError:
        if fleet.app_path:  # a broken -A is the operator's mistake: say it
            raise
        return None, "no fleet given (--broker, -A or $CELERY_BROKER_URL), so only the local journal was read"
    url = run.coordination_url(broker)
    if url:
        return url, None
    return None, "the broker is not Redis and $CELERYOPS_REDIS_URL is not set, so only the local journal was read"


@dataclass
class StatusReport:
    """Everything ``celeryops status`` knows, before it is printed."""

    fleet: str
    source: str | None = None  # "redis" | "journal" | None (no current run)
    published: PublishedStatus | None = None
    run: Run | None = None  # from the local journal
    lease: LeaseInfo | None = None
    recovery: RecoveryPlan | None = None
    notes: list[str] = field(default_factory=list)
    redis_read: bool = False  # Redis answered (so "no lease" means no lease)
    redis_unreachable: bool = False  # the fleet's Redis was asked and did not answer: only the local journal was read
    local_ids: set[str] = field(default_factory=set)  # runs the local journal knows
    last: PublishedStatus | None = None  # a finished run still published, when nothing is current
    unconfirmed: Run | None = None  # the latest run ended aborted with consumers never confirmed back
    holder: RunHolder | None = None  # who holds the current run now (None: Redis not read)
    stranded: tuple[Stranded, ...] = ()  # live workers the last run's restore lost to a broker reconnect
    broker_safety: SafetyVerdict | None = None  # may the fleet's Redis evict keys or lose them on a restart
    autoscaler: ScaleStatus | None = None  # what the fleet's autoscaler last published

    @property
    def interrupted(self) -> bool:
        return self.holder is not None and self.holder.interrupted

    @property
    def current(self) -> bool:
        return self.source is not None

    @property
    def run_id(self) -> str | None:
        return self.published.run_id if self.published else self.run.id if self.run else None

    @property
    def kind(self) -> str | None:
        """deploy | drain | rollback: the journal's word when it has the run, else the published release's."""
        if self.run is not None:
            return self.run.kind
        return None if self.published is None else self.published.run_kind

    @property
    def phase(self) -> str | None:
        if self.run is not None:
            return self.run.phase
        return self.published.phase if self.published else None

    def as_dict(self) -> dict[str, Any]:
        run: dict[str, Any] | None = None
        if self.current:
            started = self.run.created if self.run else self.published.started_at if self.published else None
            run = {
                "id": self.run_id, "phase": self.phase, "kind": self.kind,
                "owner": self.run.user if self.run else self.published.owner if self.published else None,
                "host": self.run.host if self.run else self.published.host if self.published else None,
                "release": self.run.release if self.run else self.published.release if self.published else None,
                "started_at": started, "age": time.time() - started if started else None,
                "progress": self.published.progress if self.published else None,
                "updated_at": self.published.updated_at if self.published else self.run.updated if self.run else None,
                "in_local_journal": self.run is not None and self.run.id in self.local_ids,
                "held_by_fleet": self.run is not None and self.run.id not in self.local_ids,
                "held": self.holder.state if self.holder else None,
                "interrupted": self.interrupted,
                "interrupted_at": self.holder.since if self.holder and self.interrupted else None,
                "interrupted_why": self.holder.why if self.holder and self.interrupted else None,
            }
        recovery = None
        if self.recovery is not None:
            recovery = {"action": self.recovery.action, "restore": self.recovery.restore,
                        "explanation": self.recovery.explanation, "next": self.recovery.next_commands,
                        "depends_on_rollout": self.recovery.action == "ask"}
        return {"fleet": self.fleet, "source": self.source, "run": run,
                "lease": self.lease.as_dict() if self.lease else None, "recovery": recovery, "notes": self.notes,
                "last": self.last.as_dict() if self.last else None, "redis_unreachable": self.redis_unreachable,
                "unconfirmed": None if self.unconfirmed is None else {
                    "run": self.unconfirmed.id,
                    "consumers": {w: sorted(qs) for w, qs in sorted(self.unconfirmed.unconfirmed_consumers().items())}},
                "broker_safety": None if self.broker_safety is None else self.broker_safety.as_dict(),
                "autoscaler": None if self.autoscaler is None else {**self.autoscaler.as_dict(),
                                                                    "alive": self.autoscaler.alive()},
                "stranded": None if not self.stranded else {
                    "run": self.stranded[0].run_id, "restored_at": self.stranded[0].restored_at,
                    "consumers": {s.worker: list(s.queues) for s in self.stranded}, "remedy": REMEDY}}


def gather_status(fleet_spec: FleetSpec, state_dir: str | None, fleet: str | None = None) -> StatusReport:
    """Read the published status and lease (if Redis answers) and the local journal; decide nothing, write nothing."""
    name = fleet or fleet_spec.config().run.fleet
    report = StatusReport(fleet=name)
    journal = open_journal_if_any(state_dir)
    try:
        local = journal.unfinished_runs(name) if journal else []
        last_ended = journal.latest_ended(name) if journal else None
    finally:
        if journal is not None:
            journal.close()
    report.local_ids = {r.id for r in local}

    published: PublishedStatus | None = None
    redis_ok = False
    url, why_not = status_redis(fleet_spec)
    if url is None:
        if why_not:
            report.notes.append(why_not)
    else:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=3)
        try:
            published = read_status(client, name)
            report.lease = read_lease(client, name)
            # The run journal held by the fleet: open runs of any machine (its copy wins over the local one), and
            # its latest ended run (a restore another machine could not confirm).
            store = FleetStore(client, name)
            local, _ended = merge_open(local, store)
            last_ended = newest(last_ended, store.latest_ended())
            redis_ok = report.redis_read = True
            report.broker_safety = assess(client, f"the fleet's Redis at {mask_url(url)}")
            report.autoscaler = read_scale_status(client, name)
        except MalformedRecord as exc:  # named, not acted on: the local journal is what is shown
            report.notes.append(mask_text(str(exc)).rstrip("."))
            report.broker_safety = assess(client, f"the fleet's Redis at {mask_url(url)}")
        except redis.RedisError as exc:
            refused = refused_login(client, exc)
            if refused is not None:  # the URL's user and password: wrong now and later, not a Redis that is away
                raise refused from None
            report.redis_unreachable = True
            report.notes.append(f"Redis at {mask_url(url)} is unreachable ({mask_text(str(exc)).rstrip('.')}), "
                                "so this is the local journal only")
        finally:
            client.close()

    if published is not None and published.phase not in TERMINAL_PHASES:
        report.source = "redis"
        report.published = published
        report.run = next((r for r in local if r.id == published.run_id), None)
    elif local:
        report.source = "journal"
        report.run = local[-1]
        if published is not None and published.run_id == local[-1].id:
            report.published = published
        if redis_ok and published is None:
            report.notes.append("the run is not published in Redis (its status expired or Redis was down)")
    elif published is not None:
        report.last = published
    if report.current and len(local) > 1:
        others = ", ".join(r.id for r in local if report.run is None or r.id != report.run.id)
        report.notes.append(f"other unfinished runs in the local journal: {others}")

    if report.run is not None:
        from celeryops.ops.run.kinds import planner_of  # with an open run only: status stays light otherwise

        report.recovery = planner_of(report.run).recovery_plan(report.run, None)
        if redis_ok:
            report.holder = holder_of(report.run, report.lease, time.time(), fleet_spec.config().run.lease_ttl)
    if not local:
        report.unconfirmed = unconfirmed_restore(last_ended)
        report.stranded = ask_stranded(fleet_spec, last_ended, report.notes)
    return report


def ask_stranded(fleet_spec: FleetSpec, run: Run | None, notes: list[str]) -> tuple[Stranded, ...]:
    """The workers the last run's restore gave queues back to that consume nothing now (a broker reconnect made
    Celery forget them): one active_queues round of those workers only, and only when that run restored any."""
    found = last_restore(run) if run is not None else None
    if not found or not found[0]:
        return ()
    from celeryops.adapters.fleet import Fleet  # Celery loads only when there is a restore to check

    try:
        fleet = Fleet(fleet_spec.celery_app(), timeout=2.0)
    except UserError:
        return ()
    try:
        consuming = asyncio.run(fleet.active_queues(sorted(found[0])))
    except UserError as exc:
        notes.append(f"the workers of run {run.id if run else '?'}'s restore could not be asked what they consume "
                     f"({str(exc).rstrip('.')})")
        return ()
    finally:
        fleet.close()
    return stranded(run, consuming)


def _autoscaler_line(status: ScaleStatus) -> str:
    """The fleet's autoscaler in one line: who runs it, the pool's size against its demand, its last decision."""
    alive = status.alive()
    who = (f"runs on {status.host} (pid {status.pid}) for {status.target}" if alive else
           f"of {status.target} {'stopped' if status.state == 'stopped' else 'is silent'} "
           f"{ago(time.time() - status.updated_at)}")
    last = status.last
    point = status.points[-1] if status.points else None
    size = f": {status.instances} instance(s), demand {point[1]} against capacity {point[2]}" if point else ""
    return f"Autoscaler {who}{size}" + (f"; last decision: {last.get('reason', '')}" if last else ".")


def _status_lines(report: StatusReport) -> list[str]:
    auto = [_autoscaler_line(report.autoscaler)] if report.autoscaler is not None else []
    return [*_run_lines(report), *auto]


def _run_lines(report: StatusReport) -> list[str]:
    if not report.current:
        line = f"No run in progress on fleet {report.fleet}."
        if report.redis_unreachable:  # a run another machine started is held in that Redis: say what was not seen
            line = (f"No run in progress in the local journal for fleet {report.fleet}; a run started on another "
                    "machine would not show here, as the fleet's Redis did not answer.")
        if report.last is not None:
            line += (f" The last published run {report.last.run_id} ended in phase {phase_word(report.last.phase)} "
                     f"{ago(time.time() - report.last.updated_at)}.")
        if report.unconfirmed is not None:
            who = consumers_text(report.unconfirmed.unconfirmed_consumers())
            line += (f" Run {report.unconfirmed.id} ended aborted without confirming that these consumers came back: "
                     f"{who}; run `celeryops abort` to restore and confirm them.")
        if report.stranded:
            line += (f" Stranded by a broker reconnect: {stranded_text(report.stranded)} ({REMEDY}); run "
                     "`celeryops abort` to send the restore again.")
        return [line, *(f"Note: {n}." for n in report.notes)]
    data = report.as_dict()["run"]
    release = f", release {data['release']}" if data["release"] else ""
    if data["kind"] == "rollback":
        release = f", rolling back to {data['release']}"
    what = {"rollback": "rollback run", "autoscale": "autoscale step"}.get(data["kind"], "run")
    lines = [f"Fleet {report.fleet}: {what} {data['id']} is in phase {phase_word(data['phase'])}, started "
             f"{ago(data['age'] or 0)} "
             f"by {data['owner']}@{data['host']}{release}."]
    if report.interrupted and report.holder is not None:
        lines.append(f"Interrupted {ago(time.time() - (report.holder.since or time.time()))}: {report.holder.why}; "
                     f"nobody runs it now and it stays in phase {phase_word(data['phase'])} until `celeryops resume` "
                     "continues it or `celeryops abort` applies the recovery rules.")
    lines.append("Source: " + ("the status published in Redis" if report.source == "redis" else
                               "the run journal held by the fleet in Redis" if data["held_by_fleet"] else
                               "the local journal"))
    if report.published is not None and report.published.progress:
        label = "Last progress published" if report.interrupted else "Progress"
        lines.append(f"{label} ({ago(time.time() - report.published.updated_at)}): "
                     f"{progress_words(report.published.progress)}")
    if report.lease is not None:
        lines.append(f"Lease: {report.lease.describe()}.")
    elif report.redis_read:
        lines.append("Lease: not held (the run's process has exited; the run stays open until abort or resume).")
    if report.recovery is not None:
        rec = report.recovery
        label = {"nothing": "nothing to undo", "restore": "restore the stopped consumers",
                 "leave": "leave the consumers alone", "ask": "depends on the rollout",
                 "retire": "retire the new revision", "cutover": "finish the cutover"}[rec.action]
        lines.append(f"Recovery: {label}: {rec.explanation}")
        if rec.next_commands:
            lines.append("Next: " + " | ".join(rec.next_commands))
    elif report.published is not None:
        lines.append(f"Recovery: decided from the journal on {report.published.host}: run `celeryops status` there.")
    lines.extend(f"Note: {n}." for n in report.notes)
    return lines


@click.command()
@fleet_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@state_dir_option()
def status(fleet: FleetSpec, as_json: bool, state_dir: str | None) -> None:
    """Show the fleet's current run (phase, age, owner) and what recovery would do. Reads only."""
    report = gather_status(fleet, fleet.config({"state_dir": state_dir}).state_dir)  # flag > env > config file
    if as_json:
        click.echo(mask_text(json.dumps(report.as_dict(), default=str)))
    else:
        for line in _status_lines(report):
            click.echo(mask_text(line))
        if report.broker_safety is not None:
            click.echo(mask_text(safety_line(report.broker_safety)))


def safety_line(verdict: SafetyVerdict) -> str:
    """The broker's safety in one line: what was found and, unless it is safe, what to do."""
    word = {"ok": "safe", "warn": "warning", "fail": "UNSAFE, a drain or deploy refuses it"}[verdict.status]
    line = f"Broker safety: {word}: {verdict.detail}"
    return line + (f"; {verdict.remedy}." if verdict.remedy else ".")


@click.command()
@click.option("--limit", "-n", type=click.IntRange(min=1), default=20, show_default=True, help="How many runs.")
@click.option("--json", "as_json", is_flag=True, help="A JSON array, newest first.")
@state_dir_option()
def runs(limit: int, as_json: bool, state_dir: str | None) -> None:
    """List the runs recorded in the local journal, newest first. Reads only."""
    state_dir = FleetSpec().config({"state_dir": state_dir}).state_dir  # flag > env > ./celeryops.toml's
    journal = open_journal_if_any(state_dir)
    kinds: dict[str, str] = {}  # run id -> deploy | drain | rollback
    previous: dict[str, dict[str, str]] = {}  # run id -> target -> what its deploy replaced there
    if journal is None:
        rows = []
    else:
        from celeryops.adapters.deploy.base import describe_split
        from celeryops.ops.run.rollback_plan import replaced

        try:
            rows = journal.history(limit)
            for r in rows:
                run = journal.get(r.id)
                kinds[r.id] = run.kind
                previous[r.id] = {target: describe_split(split) for target, split in replaced(run).items()}
        finally:
            journal.close()
    if as_json:
        click.echo(json.dumps([{"id": r.id, "fleet": r.fleet, "kind": kinds[r.id], "release": r.release,
                                "phase": r.phase, "outcome": r.outcome, "created": r.created, "duration": r.duration,
                                "previous": previous[r.id]} for r in rows]))
        return
    if not rows:
        click.echo(f"No runs recorded in {journal_path(state_dir)}.")
        return
    table = [("RUN", "FLEET", "KIND", "RELEASE", "PHASE", "OUTCOME", "DURATION", "STARTED")]
    now = time.time()
    for r in rows:
        table.append((r.id, r.fleet, kinds[r.id], r.release or "-", phase_word(r.phase),
                      r.outcome or "open", _duration(r.duration), ago(now - r.created)))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


COMMANDS = [status, runs]
