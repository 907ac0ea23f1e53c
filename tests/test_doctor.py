"""``celeryops doctor`` against real Celery workers configured to cause each finding, and against a healthy fleet
(Celery's defaults, off Cloud Run, nothing scheduled: exit 0). Read-only on the wire (Redis MONITOR). Workers run
``celeryops_harness.doctorapp``: Celery's own defaults plus what each test sets."""

from __future__ import annotations

import base64
import json
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celeryops.core.findings import SETTING_FINDINGS
from celeryops_harness.doctorapp import started_key
from celeryops_harness.gates import release
from celeryops_harness.workers import WorkerProcess, wait_for
from clihelp import cli_env as _env
from clihelp import run_cli
from monitorhelp import READS, Monitor, owned_by

APP = "celeryops_harness.doctorapp"
CLOUD_RUN = {"K_SERVICE": "worker", "K_REVISION": "worker-00001-abc", "GCE_METADATA_HOST": "127.0.0.1:9"}
KUBERNETES = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
INSPECT = {"conf", "stats", "registered", "scheduled", "active"}

pytestmark = pytest.mark.slow


def doctor(url: str, tmp_path: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    result = run_cli(["doctor", "--broker", url, "--json", *args], _env(tmp_path / "state"))
    events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert events and events[-1]["event"] == "doctor_done", (result.stdout, result.stderr)
    assert events[-1]["exit_code"] == result.returncode
    return result.returncode, events, result.stderr


def findings(events: list[dict[str, Any]], finding_id: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "finding" and e["id"] == finding_id]


def worker(start_workers: Callable[..., list[WorkerProcess]], url: str, *, conf: dict[str, Any] | None = None,
           fence: bool = False, late: bool = False, env: dict[str, str] | None = None, **kw: Any) -> WorkerProcess:
    """One worker of the doctor's test app, with ``conf`` applied to ``app.conf`` (and the fence plugin; ``late``:
    the task ``doctor.late_hold``, whose own option is ``acks_late=True``)."""
    extra = {"CELERYOPS_DOCTOR_CONF": json.dumps(conf or {}), **({"CELERYOPS_DOCTOR_FENCE": "1"} if fence else {}),
             **({"CELERYOPS_DOCTOR_LATE": "1"} if late else {})}
    (w,) = start_workers(url, app=APP, env={**extra, **(env or {})}, **kw)
    return w


def inspect(control: Celery, what: str) -> dict[str, Any]:
    return dict(getattr(control.control.inspect(timeout=1.0), what)() or {})


def send(control: Celery, task: str, queue: str, *args: Any, **options: Any) -> str:
    return str(control.send_task(task, args=args, queue=queue, **options).id)


def test_a_healthy_fleet_has_no_finding_and_the_doctor_only_reads(
        redis_url: str, start_workers: Any, queue_name: str, tmp_path: Path) -> None:
    """Celery's defaults, off Cloud Run, nothing scheduled: exit 0; the platform it cannot recognise is said as
    such, late acks off is a note. The doctor's connections send inspect commands and reads, nothing else."""
    plain = worker(start_workers, redis_url, queues=[queue_name], pool="prefork")
    fenced = worker(start_workers, redis_url, fence=True, queues=[queue_name])
    monitor = Monitor(redis_url).start()
    try:
        code, events, _ = doctor(redis_url, tmp_path)
    finally:
        monitor.stop()
    assert code == 0, events
    done = events[-1]
    assert done["findings"] == [] and done["unchecked"] == [], events
    assert sorted(done["checked"]) == sorted([plain.nodename, fenced.nodename])
    assert not [e for e in events if e["event"] == "finding"]
    notes = {(e["id"], tuple(e["workers"])) for e in events if e["event"] == "note"}
    assert ("platform_unknown", (fenced.nodename,)) in notes  # the plugin says: no platform it recognises
    assert ("platform_unknown", (plain.nodename,)) in notes  # no plugin: nothing says which platform
    acks = next(e for e in events if e["id"] == "acks_early")
    assert "doctor.hold" in acks["tasks"] and acks["docs"].startswith("https://docs.celeryq.dev/")

    mine = owned_by(list(monitor.records), "celeryops-doctor")
    verbs = [str(r["command"]).split(" ", 1)[0].lower() for r in mine]
    assert "publish" in verbs and "smembers" in verbs, verbs  # it asked the workers, and listed them
    round_key = [str(r["command"]).split()[1].strip('"') for r in mine if verbs[mine.index(r)] == "brpop"]
    assert round_key and all(k.startswith("celeryops.") and k.endswith(".reply") for k in round_key), round_key
    for record in mine:
        words = str(record["command"]).split(" ", 2)
        verb = words[0].lower()
        if verb == "publish":  # remote control: inspect commands only
            assert words[1].endswith(".celery.pidbox"), words[:2]
            body = json.loads(base64.b64decode(json.loads(words[2])["body"]))
            assert body["method"] in INSPECT, body["method"]
        elif verb in ("del", "brpop"):  # the round's own reply list, which the workers' replies filled
            assert words[1] in round_key, words
        else:
            assert verb in READS | {"config"} and (verb != "config" or words[1].lower() == "get"), words[:3]

    text = run_cli(["doctor", "--broker", redis_url], _env(tmp_path / "state"))
    assert text.returncode == 0 and "No finding: 2 worker(s) checked" in text.stdout, text.stdout + text.stderr
    assert "Platform not recognised" in text.stdout


def test_shutdown_against_the_platforms_grace(redis_url: str, start_workers: Any, queue_name: str,
                                               tmp_path: Path) -> None:
    """Cloud Run SIGKILLs 10 s after SIGTERM: a warm SIGTERM (no REMAP_SIGTERM) is a finding; Kubernetes with
    --grace 30 and a soft shutdown of 60 s is one too; a Cloud Run worker set up as the fix says is not."""
    cloud = worker(start_workers, redis_url, fence=True, env=CLOUD_RUN, queues=[queue_name])
    kube = worker(start_workers, redis_url, fence=True, queues=[queue_name],
                  env={**KUBERNETES, "REMAP_SIGTERM": "SIGQUIT"}, conf={"worker_soft_shutdown_timeout": 60})
    fix = {"worker_soft_shutdown_timeout": 8, "task_acks_late": True, "task_reject_on_worker_lost": True,
           "worker_cancel_long_running_tasks_on_connection_loss": True, "task_time_limit": 600}
    fixed = worker(start_workers, redis_url, fence=True, queues=[queue_name],
                   env={**CLOUD_RUN, "REMAP_SIGTERM": "SIGQUIT"}, conf=fix)
    code, events, _ = doctor(redis_url, tmp_path, "--grace", "30")
    assert code == 1
    grace = findings(events, "shutdown_grace")
    by_worker = {w: e for e in grace for w in e["workers"]}
    assert set(by_worker) == {cloud.nodename, kube.nodename}, grace
    warm = by_worker[cloud.nodename]
    assert "Cloud Run (service)" in warm["what"] and "10 seconds" in warm["what"], warm
    assert "REMAP_SIGTERM=SIGQUIT" in warm["fix"] and "worker_soft_shutdown_timeout=8" in warm["fix"]
    soft = by_worker[kube.nodename]
    assert "Kubernetes" in soft["what"] and "30 seconds" in soft["what"] and "1 minute" in soft["what"], soft
    assert soft["fix"] == "worker_soft_shutdown_timeout=28 (under the platform's grace)"
    assert fixed.nodename in events[-1]["checked"]
    assert not [e for e in events if e["event"] == "finding" and fixed.nodename in e["workers"]], events


class Pid1Worker(WorkerProcess):
    """A worker in a PID namespace of its own, started by a shell that stays PID 1 (``sh -c '...; true'``: no exec)
    or replaced by the worker (``exec``)."""

    def __init__(self, *args: Any, exec_worker: bool, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.exec_worker = exec_worker

    def command(self) -> list[str]:
        inner = shlex.join(super().command())
        script = f"exec {inner}" if self.exec_worker else f"{inner}; true"
        return ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "sh", "-c", script]


def test_a_shell_as_pid_1_that_drops_sigterm(redis_url: str, redis_control: Any, queue_name: str,
                                             tmp_path: Path) -> None:
    env = {"CELERYOPS_DOCTOR_FENCE": "1", "CELERYOPS_TEST_RECORD": redis_url, **CLOUD_RUN, "REMAP_SIGTERM": "SIGQUIT",
           "CELERYOPS_DOCTOR_CONF": json.dumps({"worker_soft_shutdown_timeout": 5})}
    shell = Pid1Worker(redis_url, app=APP, queues=[queue_name], env=env, log_dir=tmp_path, exec_worker=False)
    direct = Pid1Worker(redis_url, app=APP, queues=[queue_name], env=env, log_dir=tmp_path, exec_worker=True)
    try:
        for w in (shell, direct):
            w.start()
        for w in (shell, direct):
            w.wait_ready(redis_control, timeout=60)
        code, events, _ = doctor(redis_url, tmp_path)
    finally:
        for w in (shell, direct):
            w.stop()
    assert code == 1
    (pid1,) = findings(events, "pid1_signals")
    assert pid1["workers"] == [shell.nodename], pid1
    assert "PID 1 of the container (sh)" in pid1["what"] and "exec" in pid1["fix"]


def test_eta_tasks_past_the_visibility_timeout_and_a_cold_shutdown(
        redis_url: str, redis_control: Celery, start_workers: Any, queue_name: str, tmp_path: Path) -> None:
    """A countdown of 10 minutes on a broker whose visibility_timeout is 2 minutes: delivered again, run twice. A
    worker that shuts down cold (REMAP_SIGTERM=SIGQUIT) with ETA tasks and no soft shutdown on idle may lose them."""
    short = worker(start_workers, redis_url, queues=[queue_name],
                   conf={"broker_transport_options": {"visibility_timeout": 120}})
    cold = worker(start_workers, redis_url, fence=True, queues=[f"{queue_name}-cold"],
                  env={**KUBERNETES, "REMAP_SIGTERM": "SIGQUIT"}, conf={"worker_soft_shutdown_timeout": 20})
    far = send(redis_control, "doctor.quick", queue_name, countdown=600)
    soon = send(redis_control, "doctor.quick", f"{queue_name}-cold", countdown=600)
    def held() -> bool:
        ids = {e["request"]["id"] for entries in inspect(redis_control, "scheduled").values() for e in entries}
        return {far, soon} <= ids

    wait_for(held, 60, "both countdown tasks to be held")
    code, events, _ = doctor(redis_url, tmp_path)
    assert code == 1
    (eta,) = findings(events, "visibility_eta")
    assert eta["workers"] == [short.nodename] and eta["tasks"] == ["doctor.quick"], eta
    assert "2 minutes" in eta["what"] and "runs twice" in eta["what"] and "visibility_timeout" in eta["fix"]
    (idle,) = findings(events, "eta_shutdown")
    assert idle["workers"] == [cold.nodename] and idle["fix"] == "worker_enable_soft_shutdown_on_idle=True", idle


def test_late_acks_per_task_connection_loss_and_results_that_never_expire(
        redis_url: str, start_workers: Any, queue_name: str, tmp_path: Path) -> None:
    """App-wide late acks without task_reject_on_worker_lost; a task of its own with acks_late=True on an app with
    Celery's defaults (only that task is named); neither cancels late-ack tasks on a lost connection nor bounds
    them under the visibility timeout; results in the broker's Redis (noeviction) without result_expires."""
    late = worker(start_workers, redis_url, queues=[queue_name], late=True,
                  conf={"task_acks_late": True, "result_backend": redis_url, "result_expires": None})
    plain = worker(start_workers, redis_url, queues=[queue_name], late=True)
    code, events, _ = doctor(redis_url, tmp_path)
    assert code == 1
    (lost,) = findings(events, "lost_on_crash")
    assert set(lost["workers"]) == {late.nodename, plain.nodename}
    assert {"doctor.hold", "doctor.late_hold", "doctor.quick"} == set(lost["tasks"]), lost
    assert "task_reject_on_worker_lost=True" in lost["fix"]
    runtime = {e["workers"][0]: e for e in findings(events, "visibility_runtime")}
    assert set(runtime[late.nodename]["tasks"]) == {"doctor.hold", "doctor.late_hold", "doctor.quick"}
    assert runtime[plain.nodename]["tasks"] == ["doctor.late_hold"]  # the task's own acks_late, the app's default
    (loss,) = findings(events, "connection_loss")
    assert set(loss["workers"]) == {late.nodename, plain.nodename}
    assert loss["fix"] == "worker_cancel_long_running_tasks_on_connection_loss=True"
    (results,) = findings(events, "result_expires")
    assert results["workers"] == [late.nodename] and "noeviction" in results["what"], results
    assert "result_expires=86400" in results["fix"]
    acks = next(e for e in events if e["event"] == "note" and e["id"] == "acks_early")
    assert acks["workers"] == [plain.nodename] and "doctor.late_hold" not in acks["tasks"]


def test_prefetch_behind_a_long_task(redis_url: str, redis_client: redis.Redis, redis_control: Celery,
                                     start_workers: Any, queue_name: str, tmp_path: Path) -> None:
    """Celery's default prefetch multiplier (4) on a worker running a task longer than --long: its reserved tasks
    wait behind it."""
    busy = worker(start_workers, redis_url, queues=[queue_name], pool="threads", concurrency=1)
    gate = f"gate-{queue_name}"
    task = send(redis_control, "doctor.hold", queue_name, gate)
    try:
        wait_for(lambda: redis_client.exists(started_key(task)), 60, "the long task to start")

        def ran_past_long() -> bool:  # as the worker reports it (time_start), past --long 1
            running = [t for ts in inspect(redis_control, "active").values() for t in ts if t["id"] == task]
            return bool(running) and time.time() - float(running[0]["time_start"]) > 1.5

        wait_for(ran_past_long, 30, "the task to run past --long", step=0.2)
        code, events, _ = doctor(redis_url, tmp_path, "--long", "1")
    finally:
        release(redis_client, gate)
    assert code == 1
    (prefetch,) = findings(events, "prefetch_long_tasks")
    assert prefetch["workers"] == [busy.nodename] and prefetch["tasks"] == ["doctor.hold"], prefetch
    assert "worker_prefetch_multiplier is 4" in prefetch["what"] and "late acks are off" in prefetch["what"]
    assert prefetch["fix"].startswith("worker_prefetch_multiplier=1 and task_acks_late=True")


def test_a_worker_that_does_not_answer_is_unchecked_never_healthy(
        redis_url: str, redis_client: redis.Redis, redis_control: Celery, start_workers: Any, queue_name: str,
        tmp_path: Path) -> None:
    """Two solo-pool workers busy with a task answer no remote control: the plain one is named unchecked (exit 1);
    the one with the fence plugin is checked all the same, from what its plugin reports in the registry."""
    plain = worker(start_workers, redis_url, queues=[queue_name], pool="solo", concurrency=1, late=True)
    fenced = worker(start_workers, redis_url, fence=True, queues=[f"{queue_name}-f"], pool="solo", concurrency=1,
                    late=True)
    gate = f"gate-{queue_name}"
    ids = [send(redis_control, "doctor.late_hold", q, gate) for q in (queue_name, f"{queue_name}-f")]
    try:
        wait_for(lambda: all(redis_client.exists(started_key(i)) for i in ids), 60, "both tasks to start")
        code, events, _ = doctor(redis_url, tmp_path)
    finally:
        release(redis_client, gate)
    assert code == 1
    (unchecked,) = findings(events, "unchecked")
    assert unchecked["workers"] == [plain.nodename] and "nothing says they are safe" in unchecked["what"]
    done = events[-1]
    assert done["unchecked"] == [plain.nodename] and fenced.nodename in done["checked"], done
    lost = findings(events, "lost_on_crash")  # read from the busy worker's registry entry: its task's own option
    assert lost and fenced.nodename in lost[0]["workers"] and "doctor.late_hold" in lost[0]["tasks"], lost


def test_every_setting_finding_is_caused_by_a_test_here() -> None:
    """Each finding id of the catalog has a test above that causes it with real workers."""
    source = Path(__file__).read_text()
    assert all(f'"{finding}"' in source for finding in SETTING_FINDINGS), SETTING_FINDINGS


def test_a_drain_shows_each_finding_as_a_warning_of_its_own_id(
        redis_url: str, start_workers: Any, queue_name: str, tmp_path: Path) -> None:
    """The drain's preflight runs the doctor: its `settings` check passes and the finding follows as a warning
    (a drain accepts its warnings; a deploy asks for --accept-warning shutdown_grace)."""
    cloud = worker(start_workers, redis_url, fence=True, env=CLOUD_RUN, queues=[queue_name])
    env = _env(tmp_path / "state")
    drained = run_cli(["drain", "--broker", redis_url, "-Q", queue_name, "--interval", "0.2", "--streak", "1",
                       "--json"], env)
    try:
        events = [json.loads(line) for line in drained.stdout.splitlines() if line.strip()]
        checks = {e["id"]: e for e in events if e["event"] == "check" and e["status"] != "running"}
        assert checks["settings"]["status"] == "ok", checks["settings"]
        warned = checks["shutdown_grace"]
        assert warned["status"] == "warn" and warned["accepted"] and cloud.nodename in warned["detail"], warned
        assert "--accept-warning shutdown_grace" in warned["remedy"]
        assert drained.returncode == 0, drained.stderr
    finally:
        assert run_cli(["abort", "--broker", redis_url], env).returncode == 0
