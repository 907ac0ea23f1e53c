"""The live findings, with real workers: the operator's console (its event receiver and polls) and a watcher (the
broker's events channel, the fence registry; reads only, recorded with MONITOR) see a task delivered twice; the
operator's console sees reserved tasks wait behind a busy worker while another is idle, and a task whose worker was
killed while it ran."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celeryops.core.config import Config
from celeryops.core.events import Finding
from celeryops.ops.backend.console import OpsBackend, open_backend
from celeryops.ops.run.wiring import WATCH_CLIENT_NAME
from celeryops_harness.doctorapp import started_key
from celeryops_harness.gates import release
from celeryops_harness.workers import WorkerProcess, wait_for
from monitorhelp import READS, Monitor, owned_by

APP = "celeryops_harness.doctorapp"

pytestmark = pytest.mark.slow


def backend(url: str, state: Path, *, read_only: bool) -> OpsBackend:
    app = Celery("doctor-live", broker=url, set_as_current=False)
    return open_backend(app, Config(broker=url), read_only=read_only, fleet_display="fleet", state_dir=str(state))


async def seen(consoles: list[OpsBackend], finding_id: str, timeout: float = 90.0) -> list[Finding]:
    """Poll each console's home view until every one shows a finding of ``finding_id``; those findings."""
    deadline = time.monotonic() + timeout
    while True:
        views = [await c.fleet_snapshot() for c in consoles]
        found = [next((f for f in v.findings if f.id == finding_id), None) for v in views]
        if all(found):
            return [f for f in found if f is not None]
        assert time.monotonic() < deadline, f"no {finding_id} finding: {[v.findings for v in views]}"
        await asyncio.sleep(0.3)


async def listening(consoles: list[OpsBackend], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(c.snapshots.findings.listening for c in consoles):
        assert time.monotonic() < deadline, "the consoles never received task events"
        for c in consoles:
            await c.fleet_snapshot()
        await asyncio.sleep(0.1)


async def closed(*consoles: OpsBackend) -> None:
    for c in consoles:
        await c.close()
        c.close_sync()


async def test_a_task_delivered_twice_is_named_in_the_console_and_in_watch(
        redis_url: str, redis_control: Celery, start_workers: Any, queue_name: str, tmp_path: Path) -> None:
    """A countdown past a 2-second visibility timeout: the broker hands the message out again, and both consoles
    name the redelivery with its cause (the ETA). The watcher subscribes to the events channel and reads: no
    write, no control command."""
    conf = {"broker_transport_options": {"visibility_timeout": 2, "unacked_restore_interval": 0.2},
            "worker_send_task_events": True}
    start_workers(redis_url, app=APP, queues=[queue_name], extra_args=["-E"],
                  env={"CELERYOPS_DOCTOR_CONF": json.dumps(conf)})
    operator = backend(redis_url, tmp_path / "operator", read_only=False)
    watcher = backend(redis_url, tmp_path / "watcher", read_only=True)
    monitor = Monitor(redis_url).start()
    try:
        await listening([operator, watcher])
        task = redis_control.send_task("doctor.quick", queue=queue_name, countdown=300).id
        found = await seen([operator, watcher], "redelivered")
    finally:
        monitor.stop()
        await closed(operator, watcher)
    for finding in found:
        assert f"task {task} (doctor.quick)" in finding.what and "ETA" in finding.what, finding
    mine = owned_by(list(monitor.records), WATCH_CLIENT_NAME)
    verbs = {str(r["command"]).split(" ", 1)[0].lower() for r in mine}
    assert "psubscribe" in verbs and verbs <= READS, sorted(verbs - READS)


async def test_reserved_tasks_behind_a_busy_worker_while_another_is_idle(
        redis_url: str, redis_client: redis.Redis, redis_control: Celery, start_workers: Any, queue_name: str,
        tmp_path: Path) -> None:
    gate = f"gate-{queue_name}"
    (busy,) = start_workers(redis_url, app=APP, queues=[queue_name], concurrency=1)
    ids = [redis_control.send_task("doctor.hold", args=(gate,), queue=queue_name).id for _ in range(3)]
    operator = backend(redis_url, tmp_path / "operator", read_only=False)
    try:
        wait_for(lambda: redis_client.exists(started_key(ids[0])), 60, "the first task to start")
        (idle,) = start_workers(redis_url, app=APP, queues=[queue_name], concurrency=1)
        (found,) = await seen([operator], "hoarding")
    finally:
        release(redis_client, gate)
        await closed(operator)
    assert found.workers == (busy.nodename, idle.nodename) and found.tasks == ("doctor.hold",), found
    assert "2 reserved task(s)" in found.what and "all its 1 process(es) are busy" in found.what


async def test_a_task_whose_worker_was_killed_while_it_ran(
        redis_url: str, redis_client: redis.Redis, redis_control: Celery, start_workers: Any, queue_name: str,
        tmp_path: Path) -> None:
    """SIGKILL mid-task: the fence registry's heartbeat expires (evidence that it left) and the console names the
    task it had seen running there."""
    gate = f"gate-{queue_name}"
    (doomed,) = start_workers(redis_url, app=APP, queues=[queue_name],
                              env={"CELERYOPS_DOCTOR_FENCE": "1", "CELERYOPS_FENCE_REGISTRY_TTL": "2"})
    assert isinstance(doomed, WorkerProcess)
    task = redis_control.send_task("doctor.hold", args=(gate,), queue=queue_name).id
    operator = backend(redis_url, tmp_path / "operator", read_only=False)
    try:
        wait_for(lambda: redis_client.exists(started_key(task)), 60, "the task to start")
        deadline = time.monotonic() + 60
        while not any(t.id == task for t in (await operator.fleet_snapshot()).tasks):  # seen running
            assert time.monotonic() < deadline, "the console never saw the task running"
            await asyncio.sleep(0.2)
        doomed.kill()
        (found,) = await seen([operator], "orphaned_task")
    finally:
        release(redis_client, gate)
        await closed(operator)
    assert found.workers == (doomed.nodename,) and f"task {task} (doctor.hold)" in found.what, found
