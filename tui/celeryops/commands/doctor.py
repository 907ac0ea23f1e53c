"""``celeryops doctor``: name the worker settings that lose or duplicate work on the platform the fleet runs on,
read from the live workers. Read-only: inspect commands only, no key written (:mod:`celeryops.ops.doctor`)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

from celeryops.commands.common import FleetSpec, fleet_options
from celeryops.commands.output import Printer
from celeryops.core.errors import EXIT_FAILURE, EXIT_OK, UserError
from celeryops.core.events import DoctorDone, DoctorNote, Finding
from celeryops.core.masking import mask_text

CLIENT_NAME = "celeryops-doctor"


def finding_lines(finding: Finding) -> list[str]:
    """A finding (or a note) in text: its id and title, whom it concerns, what happens, the fix, the docs."""
    mark = "note" if isinstance(finding, DoctorNote) else "FINDING"
    who = [*finding.workers[:4], *(["..."] if len(finding.workers) > 4 else [])]
    lines = [f"{mark} [{finding.id}] {finding.title}" + (f" ({', '.join(who)})" if who else "")]
    if finding.tasks:
        more = f" and {len(finding.tasks) - 6} more" if len(finding.tasks) > 6 else ""
        lines.append(f"  tasks: {', '.join(finding.tasks[:6])}{more}")
    lines.append(f"  {finding.what[:1].upper()}{finding.what[1:]}.")
    if finding.fix:
        lines.append(f"  fix: {finding.fix}")
    if finding.docs:
        lines.append(f"  docs: {finding.docs}")
    return lines


def done_line(done: DoctorDone) -> str:
    return done.message


@click.command()
@fleet_options
@click.option("--grace", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Seconds between SIGTERM and SIGKILL where the workers cannot see it: Kubernetes' "
                   "terminationGracePeriodSeconds (default 30), or any platform celeryops does not recognise (not "
                   "checked there unless given). Cloud Run's is 10.")
@click.option("--long", "long_task", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="A task that runs at least this long counts as long, for prefetch (default 60).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per finding and note, then a final one.")
def doctor(fleet: FleetSpec, grace: float | None, long_task: float | None, as_json: bool) -> None:
    """Name the worker settings that lose or duplicate work on the platform the fleet runs on, read from the live
    workers (exit 0: nothing found, 1: findings). Reads only."""
    printer = Printer(as_json)
    try:
        code = _run(fleet, grace, long_task, printer)
    except UserError as err:
        if as_json:
            printer.json({"event": "error", "message": str(err), "exit_code": err.exit_code})
        raise
    sys.exit(code)


def _run(fleet: FleetSpec, grace: float | None, long_task: float | None, printer: Printer) -> int:
    from celeryops.ops.doctor import LONG_TASK, diagnose
    from celeryops.ops.doctor.read import read_fleet
    from celeryops.ops.run.wiring import wire

    app = fleet.celery_app()
    wiring = wire(app, fleet.config(), read_only=True, client_name=CLIENT_NAME, journal=False)
    try:
        async def read() -> Any:
            await wiring.fleet.check_broker()
            backend = str(app.conf.result_backend or "") if fleet.app_path or fleet.config().app else None
            return await read_fleet(wiring.fleet, wiring.coord, wiring.fleet_name, app_backend=backend)

        facts = asyncio.run(read())
    finally:
        wiring.close()
    found = diagnose(facts, grace=grace, long=long_task or LONG_TASK)
    code = EXIT_FAILURE if found.findings else EXIT_OK
    checked = len(found.checked)
    if found.findings:
        message = (f"{len(found.findings)} finding(s) ({', '.join(found.ids)}) on {checked} worker(s) checked"
                   + (f", {len(found.unchecked)} unchecked" if found.unchecked else "")
                   + ": each says what happens and the setting that fixes it.")
    else:
        message = f"No finding: {checked} worker(s) checked on {wiring.fleet.display_url}."
    done = DoctorDone(findings=found.ids, notes=len(found.notes), checked=found.checked, unchecked=found.unchecked,
                      exit_code=code, message=message)
    if printer.as_json:
        for event in (*found.findings, *found.notes, done):
            printer.json(event.to_json())
        return code
    for event in (*found.findings, *found.notes):
        for line in finding_lines(event):
            printer.stream.write(mask_text(line) + "\n")
    printer.stream.write(mask_text(done_line(done)) + "\n")
    printer.stream.flush()
    return code


COMMANDS = [doctor]
