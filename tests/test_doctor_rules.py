"""The doctor's pure parts: what a worker reports read back, the readings' parsing, and rules on edge cases that
real workers make slow to reach (an old Celery, tasks bounded by their time limits, a malformed report)."""

from __future__ import annotations

import signal

import pytest

from celeryops.fence.record import platform_of
from celeryops.fence.selfreport import WorkerReport, pid1_kind
from celeryops.ops.doctor import diagnose
from celeryops.ops.doctor.facts import FleetFacts, WorkerFacts, parse_registered, seconds

TERM = format(1 << (signal.SIGTERM - 1), "x")


@pytest.mark.parametrize(("environ", "platform"), [
    ({"CLOUD_RUN_WORKER_POOL": "pool", "K_SERVICE": "x"}, "cloudrun-worker-pool"),
    ({"K_SERVICE": "svc"}, "cloudrun-service"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "kubernetes"),
    ({"HOSTNAME": "box"}, ""),
])
def test_the_platform_comes_from_what_the_platform_sets(environ: dict[str, str], platform: str) -> None:
    assert platform_of(environ) == platform


def test_pid1_is_judged_only_as_the_workers_own_entrypoint() -> None:
    assert pid1_kind(1, 0, None, None) == "worker"
    assert pid1_kind(40, 1, "0", "0") == "drops"  # a shell without a trap: the kernel drops SIGTERM
    assert pid1_kind(40, 1, TERM, "0") == "forwards"  # tini, dumb-init, a trap
    assert pid1_kind(40, 1, TERM, TERM) == "drops"  # caught but ignored
    assert pid1_kind(40, 7, "0", "0") == "unknown"  # PID 1 is not its parent: not this worker's entrypoint
    assert pid1_kind(40, 1, None, None) == "unknown" and pid1_kind(40, 1, "zz", "0") == "unknown"


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("None", None), (True, None), (5, 5.0), ("7.5", 7.5), ("1 day, 0:00:00", 86400.0),
    ("0:00:30", 30.0), ("2 days, 1:00:00", 176400.0), ("soon", None),
])
def test_durations_as_workers_print_them(value: object, expected: float | None) -> None:
    assert seconds(value) == expected


def test_registered_with_task_options() -> None:
    parsed = parse_registered(["app.a [acks_late=True time_limit=30]", "app.b", "not a task name [", 5])
    assert parsed == {"app.a": {"acks_late": "True", "time_limit": "30"}, "app.b": {}}


def test_a_malformed_report_reads_as_empty() -> None:
    assert WorkerReport.from_json("nonsense") is None
    report = WorkerReport.from_json({"platform": "mars", "pid1": [], "tasks": {"t": 3}, "longest": {"t": "long"}})
    assert report == WorkerReport()


def _worker(**settings: object) -> WorkerFacts:
    base = {"prefetch_multiplier": 1, "acks_late": False, "visibility_timeout": 3600.0}
    return WorkerFacts("w@1", report=WorkerReport(platform="cloudrun-service", pid1="worker",
                                                  settings={**base, **settings}))


def test_a_warm_shutdown_bounded_by_time_limits_is_no_finding() -> None:
    """Every task stops within the grace by its hard time limit: Celery's warm shutdown ends in time."""
    bounded = _worker(time_limit=8.0)
    found = diagnose(FleetFacts({"w@1": bounded}, now=0.0))
    assert "shutdown_grace" not in found.ids
    unbounded = _worker(time_limit=None)
    assert "shutdown_grace" in diagnose(FleetFacts({"w@1": unbounded}, now=0.0)).ids


def test_an_old_celery_without_these_settings_is_not_blamed_for_them() -> None:
    """Before 5.5 there is no soft shutdown, before 5.1 no cancel on connection loss: REMAP_SIGTERM alone is a cold
    shutdown at once (nothing to bound), and the connection-loss finding needs the setting to exist."""
    old = WorkerFacts("w@1", report=WorkerReport(platform="cloudrun-service", remap_sigterm="SIGQUIT",
                                                 settings={"acks_late": True, "reject_on_worker_lost": True}))
    found = diagnose(FleetFacts({"w@1": old}, now=0.0))
    assert "shutdown_grace" not in found.ids and "connection_loss" not in found.ids


def test_no_worker_at_all_is_unchecked_not_healthy() -> None:
    found = diagnose(FleetFacts({}, now=0.0))
    assert found.ids == ("unchecked",) and "no worker answered" in found.findings[0].what


async def test_a_check_with_parts_reports_each_part_as_a_warning_of_its_own_id() -> None:
    """The settings check passes and its findings follow it, each accepted by its own id."""
    from celeryops.ops.preflight import (
        Check,
        CheckFinished,
        CheckResult,
        check_accept_ids,
        run_checks,
        unaccepted_warnings,
    )

    async def run() -> CheckResult:
        return CheckResult("settings", "", "ok", "2 worker(s) checked",
                           parts=(CheckResult("shutdown_grace", "Shutdown", "warn", "a\nb", "fix it"),
                                  CheckResult("lost_on_crash", "Late acks", "warn", "c")))

    seen: list[str] = []
    report = await run_checks([Check("settings", "Worker settings", run)],
                              lambda e: seen.append(e.result.id) if isinstance(e, CheckFinished) else None)
    assert seen == ["settings", "shutdown_grace", "lost_on_crash"]
    assert [r.id for r in report.warnings] == ["shutdown_grace", "lost_on_crash"]
    assert report.get("shutdown_grace") is not None and report.get("shutdown_grace").detail == "a b"  # one line
    assert [r.id for r in unaccepted_warnings(report, False, check_accept_ids(["shutdown_grace"]))] == \
        ["lost_on_crash"]
