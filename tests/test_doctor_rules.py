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


# -- live findings (celeryops.ops.doctor.live): what the console sees happen -------------------------------------------


def _received(task_id: str, worker: str, retries: int = 0, eta: str | None = None) -> dict[str, object]:
    return {"type": "task-received", "uuid": task_id, "hostname": worker, "name": "billing.charge",
            "retries": retries, "eta": eta}


def test_a_task_received_twice_is_a_redelivery_with_its_likely_cause() -> None:
    from celeryops.ops.doctor.live import LiveFindings

    live = LiveFindings(clock=lambda: 100.0)
    live.on_task_event(_received("t1", "w@1", eta="2030-01-01T00:00:00+00:00"))
    live.on_task_event(_received("t1", "w@2", eta="2030-01-01T00:00:00+00:00"))
    (found,) = live.findings()
    assert found.id == "redelivered" and found.workers == ("w@1", "w@2") and found.tasks == ("billing.charge",)
    assert "ETA" in found.what and "celery#5935" in found.what
    live.on_task_event(_received("t2", "w@1"))
    live.on_task_event({"type": "task-started", "uuid": "t2", "hostname": "w@1"})
    live.on_task_event(_received("t2", "w@2"))
    assert "still running" in live.findings()[1].what


def test_a_retry_is_no_redelivery() -> None:
    from celeryops.ops.doctor.live import LiveFindings

    live = LiveFindings()
    live.on_task_event(_received("t1", "w@1"))
    live.on_task_event({"type": "task-retried", "uuid": "t1", "hostname": "w@1"})
    live.on_task_event(_received("t1", "w@1", retries=1))
    assert live.findings() == ()


def test_the_copies_a_slot_task_sends_of_itself_are_no_redelivery() -> None:
    """A task waiting for slots retries itself at the same count (the woken copy and the fallback copy, of which one
    runs): neither copy arriving, in events or in the polls, is a redelivery; a task received twice otherwise still
    is."""
    from celeryops.core.events import Observation, TaskInfo, WorkerObs
    from celeryops.ops.doctor.live import LiveFindings

    live = LiveFindings()
    live.on_task_event(_received("t1", "w@1"))
    live.on_task_event({"type": "task-started", "uuid": "t1", "hostname": "w@1"})
    live.on_task_event({"type": "task-retried", "uuid": "t1", "hostname": "w@1"})  # parked: no slot free
    live.on_task_event(_received("t1", "w@2"))  # the woken copy
    live.on_task_event({"type": "task-started", "uuid": "t1", "hostname": "w@2"})
    live.on_task_event(_received("t1", "w@3", eta="2030-01-01T00:00:00+00:00"))  # the fallback, while w@2 runs it
    workers = {w: WorkerObs(w, True, active=1) for w in ("w@1", "w@2", "w@3")}
    live.observe(Observation(workers, (TaskInfo("w@2", "t1", "billing.charge", "active"),)), {})
    live.observe(Observation(workers, (TaskInfo("w@3", "t1", "billing.charge", "active"),)), {})
    assert live.findings() == ()
    live.on_task_event(_received("t2", "w@1"))
    live.on_task_event(_received("t2", "w@2"))
    assert [f.id for f in live.findings()] == ["redelivered"]


def test_a_task_started_on_a_worker_that_left_is_orphaned_and_what_it_never_started_is_no_redelivery() -> None:
    from celeryops.ops.doctor.live import LiveFindings

    live = LiveFindings()
    live.on_task_event(_received("run", "w@1"))
    live.on_task_event({"type": "task-started", "uuid": "run", "hostname": "w@1"})
    live.on_task_event(_received("held", "w@1"))
    live.on_task_event({"type": "worker-offline", "hostname": "w@1"})
    (orphan,) = live.findings()
    assert orphan.id == "orphaned_task" and "task run " in orphan.what and orphan.workers == ("w@1",)
    live.on_task_event(_received("held", "w@2"))  # given back by a worker that left, unstarted: it runs once
    assert [f.id for f in live.findings()] == ["orphaned_task"]


def test_reserved_tasks_behind_busy_processes_while_a_worker_of_the_queue_is_idle() -> None:
    from celeryops.core.events import Observation, TaskInfo, WorkerObs
    from celeryops.ops.doctor.live import HOARD_POLLS, LiveFindings

    busy = WorkerObs("w@1", True, active=2, reserved=3, queues=("render",))
    idle = WorkerObs("w@2", True, active=0, queues=("render",))
    other = WorkerObs("w@3", True, active=0, queues=("mail",))
    tasks = (TaskInfo("w@1", "a", "render.page", "active"), TaskInfo("w@1", "b", "render.page", "reserved"))
    live = LiveFindings()
    live.observe(Observation({"w@1": busy, "w@3": other}, tasks), {"w@1": 2, "w@3": 1})
    assert live.findings() == ()  # nobody idle consumes render
    for _ in range(HOARD_POLLS - 1):  # a prefetch one poll catches while short tasks turn over is no finding yet
        live.observe(Observation({"w@1": busy, "w@2": idle}, tasks), {"w@1": 2, "w@2": 1})
    assert live.findings() == ()
    live.observe(Observation({"w@1": idle, "w@2": idle}, ()), {"w@1": 2, "w@2": 1})  # it turned over: counts anew
    for _ in range(HOARD_POLLS - 1):
        live.observe(Observation({"w@1": busy, "w@2": idle}, tasks), {"w@1": 2, "w@2": 1})
    assert live.findings() == ()
    live.observe(Observation({"w@1": busy, "w@2": idle}, tasks), {"w@1": 2, "w@2": 1})
    (found,) = live.findings()
    assert found.id == "hoarding" and found.workers == ("w@1", "w@2") and found.tasks == ("render.page",)
    live2 = LiveFindings()
    for _ in range(HOARD_POLLS):
        live2.observe(Observation({"w@1": busy, "w@2": idle}, tasks), {"w@1": 4})  # a free process: no hoarding
    assert live2.findings() == ()


def test_a_task_seen_on_one_worker_then_another_in_the_polls_is_a_redelivery() -> None:
    from celeryops.core.events import Observation, TaskInfo, WorkerObs
    from celeryops.ops.doctor.live import LiveFindings

    workers = {"w@1": WorkerObs("w@1", True, active=1), "w@2": WorkerObs("w@2", True, active=1)}
    live = LiveFindings()
    live.observe(Observation(workers, (TaskInfo("w@1", "t", "report", "active"),)), {})
    live.observe(Observation(workers, (TaskInfo("w@2", "t", "report", "active"),)), {})
    (found,) = live.findings()
    assert found.id == "redelivered" and "still running" in found.what


def test_runtimes_in_task_events_count_as_long_tasks() -> None:
    """A fleet that sends task events: their runtimes make a task long (prefetch), without the fence plugin."""
    import dataclasses

    from celeryops.ops.doctor.live import LiveFindings

    live = LiveFindings()
    live.on_task_event(_received("t1", "w@1"))
    live.on_task_event({"type": "task-succeeded", "uuid": "t1", "hostname": "w@1", "runtime": 95.0})
    assert live.runtimes() == {"w@1": {"billing.charge": 95.0}}
    plain = WorkerFacts("w@1", conf={"worker_prefetch_multiplier": 4, "task_acks_late": False})
    assert "prefetch_long_tasks" not in diagnose(FleetFacts({"w@1": plain}, now=0.0)).ids
    timed = dataclasses.replace(plain, event_runs=live.runtimes()["w@1"])
    assert "prefetch_long_tasks" in diagnose(FleetFacts({"w@1": timed}, now=0.0)).ids
