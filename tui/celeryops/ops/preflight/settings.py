"""The ``settings`` preflight check: ``celeryops doctor`` before a drain or a deploy. The check itself passes; each
finding comes after it as a warning of its own, under the finding's id, so that it is accepted one at a time
(``--accept-warning shutdown_grace``, ``[preflight] accept``) like the other warnings."""

from __future__ import annotations

import redis

from celeryops.adapters.fleet import Fleet
from celeryops.core.events import Finding
from celeryops.core.findings import title
from celeryops.ops.doctor import diagnose
from celeryops.ops.doctor.read import read_fleet
from celeryops.ops.preflight.framework import Check, CheckResult

CHECK_ID = "settings"
TITLE = "Worker settings (celeryops doctor)"


def finding_result(found: list[Finding]) -> CheckResult:
    """One warning for the findings of one id (their workers and sentences, the fixes)."""
    first = found[0]
    workers = sorted({w for f in found for w in f.workers})
    who = f" ({', '.join(workers[:4])}{'...' if len(workers) > 4 else ''})" if workers else ""
    detail = "; ".join(dict.fromkeys(f.what for f in found)) + who
    fixes = "; ".join(dict.fromkeys(f.fix for f in found if f.fix))
    return CheckResult(first.id, title(first.id), "warn", detail,
                       f"{fixes} ({first.docs}); or accept it with --accept-warning {first.id}")


def settings_check(fleet: Fleet, coord: redis.Redis | None, fleet_name: str, *, grace: float | None = None) -> Check:
    """ok, followed by one warning per finding id (see the module)."""

    async def run() -> CheckResult:
        found = diagnose(await read_fleet(fleet, coord, fleet_name), grace=grace)
        by_id: dict[str, list[Finding]] = {}
        for finding in found.findings:
            by_id.setdefault(finding.id, []).append(finding)
        parts = tuple(finding_result(f) for f in by_id.values())
        if parts:
            detail = (f"{len(found.checked)} worker(s) checked: {len(parts)} setting(s) lose or duplicate work "
                      f"({', '.join(by_id)}), each a warning below")
        else:
            detail = f"{len(found.checked)} worker(s) checked: no setting loses or duplicates work"
        return CheckResult(CHECK_ID, TITLE, "ok", detail, parts=parts)

    return Check(CHECK_ID, TITLE, run, timeout=20)
