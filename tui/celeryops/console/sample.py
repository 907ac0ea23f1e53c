"""Fixed, realistic data for snapshots and the preview: a small GPU/CPU fleet in the middle of a deploy.
No real hostnames, no wall-clock times (instants are relative to ``NOW``)."""

from __future__ import annotations

import dataclasses

from celeryops.adapters.deploy.base import ConditionChanged, RevisionCreated, RolloutEvent, RolloutReady
from celeryops.core.events import (
    CheckUpdate,
    ConsumersCancelled,
    DrainProgress,
    DrainStarted,
    Finding,
    Notice,
    PhaseChanged,
    PoolStep,
    PreflightDone,
    StageStarted,
    TaskInfo,
    WorkerObs,
)
from celeryops.core.findings import docs, title
from celeryops.ops.backend.views import (
    BrokerSafetyView,
    DeviceView,
    FleetView,
    HostShare,
    PoolView,
    QueueView,
    RecoveryChoice,
    ReleasesView,
    ReleaseView,
    ResourceView,
    RunRecordView,
    RunSummary,
    RunView,
    SlotHolder,
    SlotsView,
    SlotWaiter,
    StrandedWorker,
    TimelineEntry,
    WorkerView,
)

NOW = 1_800_000_000.0  # the injected clock's "now" in tests and the preview
QUEUES = ("default", "render", "gpu")

TASK_NAMES = ("media.render_video", "ml.train_adapter", "reports.build_monthly", "media.transcode", "ml.embed_batch")


def tasks(n: int, workers: int = 4) -> tuple[TaskInfo, ...]:
    """``n`` active/reserved/scheduled tasks spread over ``workers`` workers, deterministic."""
    out = []
    for i in range(n):
        state = "active" if i % 7 else "reserved"
        if i % 23 == 5:
            state = "scheduled"
        out.append(TaskInfo(
            worker=f"celery@worker-{i % workers + 1}", id=f"{i:08x}-7c1e-4a51-9b0d-{i:012x}",
            name=TASK_NAMES[i % len(TASK_NAMES)], state=state,  # type: ignore[arg-type]
            args=f"({i}, 'gs://bucket/input/{i:05d}.mp4', quality='high')",
            runtime=float(60 * (i % 90) + 17) if state == "active" else None,
            eta="+35 min" if state == "scheduled" else None))
    return tuple(out)


def workers() -> tuple[WorkerView, ...]:
    return (
        WorkerView("celery@worker-1", "consuming", ("default", "render"), active=3, reserved=1, plugin=True),
        WorkerView("celery@worker-2", "consuming", ("default",), active=1, reserved=0, plugin=True),
        WorkerView("celery@worker-3", "stopped", (), active=2, reserved=0, scheduled=1, plugin=True),
        WorkerView("celery@gpu-1", "consuming", ("gpu",), active=1, plugin=False),
        WorkerView("celery@gpu-2", "unknown", ("gpu",)),
    )


def fleet(with_run: bool = True) -> FleetView:
    run = RunSummary("r-20240611-01", "deploy", "draining", release="v2.14.0", owner="ops@laptop",
                     started_at=NOW - 420, streak=1, required=3, remaining=780.0) if with_run else None
    return FleetView(
        workers=workers(),
        queues=(QueueView("default", 1284, 2), QueueView("render", 37, 1), QueueView("gpu", 0, 1),
                QueueView("reports", None, 0)),
        tasks=tasks(8), run=run, broker_safety=BrokerSafetyView("ok", "noeviction, AOF"))


def findings_fleet() -> FleetView:
    """No run; `celeryops doctor`'s findings on Cloud Run workers and one redelivery the console saw."""
    found = (
        Finding("shutdown_grace", title("shutdown_grace"),
                "on Cloud Run (worker pool), a worker is SIGKILLed 10 seconds after SIGTERM, but Celery's SIGTERM is "
                "a warm shutdown that waits for running tasks without a limit",
                "set REMAP_SIGTERM=SIGQUIT and worker_soft_shutdown_timeout=8", docs("shutdown_grace"),
                workers=("celery@render-1", "celery@render-2", "celery@gpu-1")),
        Finding("visibility_eta", title("visibility_eta"),
                "2 task(s) held by celery@web-1 wait for an ETA up to 3 hours away, past the broker's "
                "visibility_timeout of 1 hour", "broker_transport_options={'visibility_timeout': 14400}",
                docs("visibility_eta"), workers=("celery@web-1",), tasks=("billing.charge",)),
        Finding("redelivered", title("redelivered"),
                "task 5f1c0d2e (billing.charge) was delivered to celery@web-2 after celery@web-1 had received it: "
                "it may run twice", docs=docs("redelivered"), workers=("celery@web-1", "celery@web-2")),
    )
    return dataclasses.replace(fleet(with_run=False), findings=found)


def interrupted_fleet() -> FleetView:
    """A drain whose owner died mid-drain: every worker stopped, the drained queues at 0 consumers."""
    stopped = tuple(WorkerView(w.name, "stopped", (), w.active, w.reserved, w.scheduled, w.plugin) for w in workers())
    run = RunSummary("r-20240611-01", "deploy", "draining", release="v2.14.0", owner="ops@laptop",
                     started_at=NOW - 420, interrupted_at=NOW - 95, interrupted_why="process gone",
                     stopped_workers=5)
    return FleetView(workers=stopped, queues=(QueueView("default", 1284, 0), QueueView("gpu", 0, 0),
                                              QueueView("render", 37, 0)),
                     tasks=tasks(8), run=run, interrupted=unfinished_run())


def stranded_fleet() -> FleetView:
    """No run; a plain worker left consuming nothing by a broker reconnect after the last run's restore."""
    idle = tuple(WorkerView(w.name, "stopped", (), w.active, 0, 0, False) if w.name == "celery@gpu-1" else w
                 for w in workers())
    return FleetView(workers=idle, queues=(QueueView("default", 12, 2), QueueView("gpu", 40, 0),
                                           QueueView("render", 0, 1)),
                     stranded=(StrandedWorker("celery@gpu-1", ("gpu",), "r-20240611-01", NOW - 600),))


def slots() -> SlotsView:
    """Two hosts' pools (a GPU host whose four devices are all held, one lease expired; a CPU host without GPU, a
    request there no live host could serve) and the global pool of a shared type (a licence) they contribute to."""
    gpu_host = PoolView(
        "host:gpu-node-a", "host", "gpu-node-a",
        resources=(ResourceView("cpu", 16, 11, (4, 6, 8, 8, 10, 12, 12, 11, 14, 13, 11, 11)),
                   ResourceView("gpu", 4, 4, (1, 2, 2, 3, 4, 4, 4, 4, 3, 4, 4, 4)),
                   ResourceView("nvme", 2, 0, (0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0))),
        holders=(SlotHolder("l-01", "ml.train_adapter", "celery@gpu-1", {"gpu": 2, "cpu": 4}, 1840.0, 52.0,
                            "host:gpu-node-a", {"gpu": ("0", "1")}),
                 SlotHolder("l-02", "ml.train_adapter", "celery@gpu-2", {"gpu": 2, "cpu": 4}, 3605.0, -14.0,
                            "host:gpu-node-a", {"gpu": ("2", "3")}),
                 SlotHolder("l-03", "media.render_video", "celery@gpu-1", {"cpu": 3}, 95.0, 25.0,
                            "host:gpu-node-a")),
        waiting=(SlotWaiter("ml.embed_batch", "celery@gpu-1", {"gpu": 1}, 130.0, "host:gpu-node-a"),),
        hosts=(HostShare("gpu-node-a", {"cpu": 16, "gpu": 4, "nvme": 2}, ("celery@gpu-1", "celery@gpu-2"), 48.0),),
        devices=(DeviceView("gpu", "0", "l-01", "ml.train_adapter", "celery@gpu-1", 1840.0),
                 DeviceView("gpu", "1", "l-01", "ml.train_adapter", "celery@gpu-1", 1840.0),
                 DeviceView("gpu", "2", "l-02", "ml.train_adapter", "celery@gpu-2", 3605.0, expired=True),
                 DeviceView("gpu", "3", "l-02", "ml.train_adapter", "celery@gpu-2", 3605.0, expired=True)))
    cpu_host = PoolView(
        "host:cpu-node-b", "host", "cpu-node-b",
        resources=(ResourceView("cpu", 8, 2, (0, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2)),
                   ResourceView("gpu", 0, 0, (0,) * 12)),
        holders=(SlotHolder("l-04", "reports.build_monthly", "celery@worker-3", {"cpu": 2}, 610.0, 41.0,
                            "host:cpu-node-b"),),
        waiting=(SlotWaiter("ml.finetune_large", "celery@worker-2", {"gpu": 8}, 7260.0, "host:cpu-node-b",
                            no_capacity=True, capacity={"cpu-node-b": {"gpu": 0}, "gpu-node-a": {"gpu": 4}}),),
        hosts=(HostShare("cpu-node-b", {"cpu": 8, "gpu": 0}, ("celery@worker-1", "celery@worker-2",
                                                             "celery@worker-3"), 51.0),))
    shared = PoolView(
        "global", "global",
        resources=(ResourceView("licence", 4, 3, (1, 1, 2, 2, 3, 3, 3, 3, 2, 3, 3, 3)),),
        holders=(SlotHolder("l-05", "cad.solve", "celery@worker-1", {"licence": 3}, 300.0, 47.0, "global"),),
        hosts=(HostShare("gpu-node-a", {"licence": 2}, ("celery@gpu-1",), 48.0),
               HostShare("cpu-node-b", {"licence": 2}, ("celery@worker-1",), 51.0)))
    return SlotsView(pools=(gpu_host, cpu_host, shared))


def unfinished_run() -> RunView:
    return RunView(
        "r-20240611-01", "deploy", "draining", started_at=NOW - 3 * 3600, owner="ops@laptop", release="v2.14.0",
        detail="consumers cancelled on 3 workers for queues default, render; deploy not started",
        interrupted_at=NOW - 2 * 3600, interrupted_why="its owner stopped heart-beating (pid 4242 on laptop)",
        choices=(
            RecoveryChoice("resume", "Resume the drain",
                           "Take over the run, keep consumers stopped and continue the drain from a fresh streak; "
                           "deploy v2.14.0 when drained."),
            RecoveryChoice("abort", "Abort and restore consumers",
                           "Add the queues back exactly as journalled (default, render on 3 workers) and mark the "
                           "run aborted; nothing is deployed."),
        ))


def checks(done: bool = True) -> list[CheckUpdate]:
    rows = [
        CheckUpdate("broker", "Broker reachable", "ok", "redis 7.2, 3 ms"),
        CheckUpdate("workers", "Every known worker replies", "warn", "celery@gpu-2 did not reply to ping",
                    "Forget it if it is gone (F on the drain screen), or check the pod."),
        CheckUpdate("lease", "No other run holds the fleet", "ok", "lease free"),
        CheckUpdate("image", "Image v2.14.0 exists in the registry", "ok" if done else "running",
                    "sha256:4f2a…e91c" if done else ""),
        CheckUpdate("iam", "Cloud Run permissions", "ok" if done else "pending", "run.services.update granted"
                    if done else ""),
    ]
    return rows


def failed_checks() -> list[CheckUpdate]:
    return [*checks()[:3], CheckUpdate("image", "Image v2.14.0 exists in the registry", "fail",
                                       "manifest unknown: tag v2.14.0 not found",
                                       "Push the image first (make push TAG=v2.14.0), then run the deploy again."),
            checks()[4]]


def drain_started() -> DrainStarted:
    return DrainStarted(queues=("default", "render"),
                        workers={w.name: w.queues for w in workers()}, interval=15.0, streak=3, max_wait=1200.0)


def progress(n_tasks: int = 12, streak: int = 1, elapsed: float = 420.0) -> DrainProgress:
    ts = tasks(n_tasks)
    obs = {w.name: WorkerObs(w.name, w.state != "unknown", w.active, w.reserved, w.scheduled, (),
                             "stopped" if w.state == "consuming" else w.state, w.plugin) for w in workers()}
    return DrainProgress(
        elapsed=elapsed, remaining=1200.0 - elapsed, streak=streak, required=3,
        active=sum(1 for t in ts if t.state == "active"), reserved=sum(1 for t in ts if t.state == "reserved"),
        scheduled=sum(1 for t in ts if t.state == "scheduled"), unknown=("celery@gpu-2",), workers=obs, tasks=ts,
        warnings=("1 ETA task on celery@worker-3 will run after the drain on a stopped worker",))


def preflight_script(done: bool = True) -> list[object]:
    events: list[object] = [PhaseChanged("preflight", "checking before anything changes"), *checks(done)]
    if done:
        events.append(PreflightDone(failed=0, warnings=1))
    return events


def drain_script() -> list[object]:
    return [PhaseChanged("stopping", "cancelling consumers"), drain_started(),
            ConsumersCancelled(("default", "render"), ("celery@worker-1", "celery@worker-2", "celery@worker-3")),
            PhaseChanged("draining"), Notice("warning", "celery@gpu-2 did not reply: counted as unknown, not zero"),
            progress(12, 2, 390.0), progress(12, 1, 420.0)]


OLD_REV, NEW_REV = "worker-pool-00041-kol", "worker-pool-4f2ae91-b7c3"


def overlap_checks() -> list[CheckUpdate]:
    """An overlap deploy's preflight: the drain deploy's checks with the overlap's own (peak, fence, mixed code)."""
    return [
        CheckUpdate("broker", "Broker reachable", "ok", "redis 7.2, 3 ms"),
        CheckUpdate("traffic", "Instances on one revision (peak shown)", "ok",
                    f"all 3 instance(s) of worker pool worker-pool run {OLD_REV}; the deploy runs 3 of {NEW_REV} "
                    "beside them: 6 instances at the peak (quota, cost), then back to 3"),
        CheckUpdate("validate", "Cloud Run accepts the scale-up", "ok",
                    f"Cloud Run accepted the update that runs {NEW_REV} beside {OLD_REV} (6 instances, 50/50; "
                    "validate only: nothing changed)"),
        CheckUpdate("fence", "Fence plugin on every worker (required)", "ok",
                    f"all 3 worker(s) run the fence plugin and report their revision: 3 of {OLD_REV} will be held"),
        CheckUpdate("mixed_versions", "Old and new code side by side", "warn",
                    f"the old revision {OLD_REV} and the new one (registry/worker:4f2ae91) consume the same queues "
                    "side by side until the old one is idle: a task sent by either version may run on the other",
                    "keep task names and arguments compatible both ways for this deploy (new arguments optional, "
                    "none removed), accept with --accept-warning mixed_versions, or deploy with --strategy drain"),
    ]


def overlap_preflight_script(strategy: str = "overlap") -> list[object]:
    """The preflight of a deploy of two revisions on a worker pool (``strategy``: the one its stage names)."""
    return [StageStarted(stage="preflight", detail=f"release v2.14.0, {strategy} on worker-pool", strategy=strategy),
            PhaseChanged("preflight", "checking before anything changes"), *overlap_checks(),
            PreflightDone(failed=0, warnings=1)]


OLD_WORKERS = ("celery@worker-1", "celery@worker-2", "celery@worker-3")
NEW_WORKERS = ("celery@worker-4", "celery@worker-5", "celery@worker-6")


def overlap_step(step: str, message: str = "", **more: object) -> PoolStep:
    return PoolStep(step=step, target="worker-pool", old_revision=OLD_REV, new_revision=NEW_REV,  # type: ignore[arg-type]
                       peak=6, message=message, **more)  # type: ignore[arg-type]


def overlap_progress(completed: int, rate: float | None) -> PoolStep:
    return overlap_step("progress", instances={OLD_REV: 3, NEW_REV: 3}, split={OLD_REV: 50, NEW_REV: 50},
                        workers={OLD_REV: OLD_WORKERS, NEW_REV: NEW_WORKERS}, consuming=NEW_WORKERS,
                        completed=completed, rate=rate)


def overlap_poll(n_tasks: int = 5, streak: int = 0, elapsed: float = 210.0) -> DrainProgress:
    """A poll of the old revision's drain: ``n_tasks`` tasks still held by its three workers."""
    ts = tuple(TaskInfo(worker=OLD_WORKERS[i % 3], id=f"{i:08x}-7c1e-4a51-9b0d-{i:012x}",
                        name=TASK_NAMES[i % len(TASK_NAMES)], state="active" if i % 4 else "reserved",
                        args=f"({i}, 'gs://bucket/input/{i:05d}.mp4')",
                        runtime=float(60 * (7 * i % 45) + 17) if i % 4 else None) for i in range(n_tasks))
    obs = {w: WorkerObs(w, True, sum(1 for t in ts if t.worker == w and t.state == "active"),
                        sum(1 for t in ts if t.worker == w and t.state == "reserved"), 0, (), "stopped", True)
           for w in OLD_WORKERS}
    return DrainProgress(elapsed=elapsed, remaining=1200.0 - elapsed, streak=streak, required=2,
                         active=sum(1 for t in ts if t.state == "active"),
                         reserved=sum(1 for t in ts if t.state == "reserved"), scheduled=0, unknown=(),
                         workers=obs, tasks=ts)


def overlap_script() -> list[object]:
    """An overlap deploy in the middle of the old revision's drain: the new revision consumes and completes tasks."""
    old: dict[str, tuple[str, ...]] = {w: ("default", "render") for w in OLD_WORKERS}
    poll = overlap_poll()
    return [
        overlap_step("planned", f"{NEW_REV} will run beside {OLD_REV}: 3 instance(s) each, 6 at the peak",
                     instances={OLD_REV: 3}, split={OLD_REV: 100}),
        PhaseChanged("overlapping"),
        overlap_step("scaling_up", f"6 instances, {OLD_REV} 50% / {NEW_REV} 50%", instances={OLD_REV: 3},
                     split={OLD_REV: 100}),
        overlap_step("scaled_up", f"Cloud Run runs {NEW_REV} beside {OLD_REV}", instances={OLD_REV: 3, NEW_REV: 3},
                     split={OLD_REV: 50, NEW_REV: 50}),
        overlap_progress(4, None),
        overlap_step("consuming", f"3 worker(s) of {NEW_REV} consume default, render", consuming=NEW_WORKERS),
        overlap_step("stopping_old", f"only the workers of {OLD_REV} stop taking tasks; {NEW_REV} consumes"),
        PhaseChanged("stopping"),
        DrainStarted(queues=("default", "render"), workers=old, interval=15.0, streak=2, max_wait=1200.0),
        ConsumersCancelled(("default", "render"), OLD_WORKERS),
        PhaseChanged("draining"),
        overlap_progress(31, 1.2), overlap_progress(58, 1.8), overlap_progress(83, 1.6), overlap_progress(117, 2.3),
        poll,
    ]


def deploy_events(state: str = "rolling") -> list[RolloutEvent]:
    """Two targets' typed rollout events: one still rolling out (or ready), one ready."""
    pool, gpu = "worker-pool (europe-west1)", "gpu-pool (us-central1)"
    events: list[RolloutEvent] = [
        RevisionCreated(pool, "projects/p/locations/europe-west1/workerPools/worker-pool/revisions/"
                              "worker-pool-00042-xuv"),
        RevisionCreated(gpu, "projects/p/locations/us-central1/workerPools/gpu-pool/revisions/gpu-pool-00017-bax"),
        ConditionChanged(gpu, "Ready", "succeeded"),
        RolloutReady(gpu, "gpu-pool-00017-bax"),
        ConditionChanged(pool, "Ready", "pending"),
        ConditionChanged(pool, "ConfigurationsReady", "succeeded"),
        ConditionChanged(pool, "RoutesReady", "pending", "Waiting for revision to become ready"),
    ]
    if state == "ready":
        events += [ConditionChanged(pool, "RoutesReady", "succeeded"), ConditionChanged(pool, "Ready", "succeeded"),
                   RolloutReady(pool, "worker-pool-00042-xuv")]
    return events


def fleet_back() -> dict[str, tuple[str, ...]]:
    """The workers consuming again after the deploy (a FleetBack event's payload)."""
    return {w.name: w.queues for w in workers() if w.queues}


def releases() -> ReleasesView:
    """The release picker's list: newest first; one image not pushed yet, one registry that did not answer."""
    return ReleasesView(remote="origin", pattern="branches matching release/*", releases=(
        ReleaseView("release/2.15", "9c1d2e3f4a5b6c7d8e9f00112233445566778899", NOW - 2 * 3600,
                    "Render queue: retry GPU jobs on OOM", "missing",
                    "image europe-west1-docker.pkg.dev/p/app/worker:9c1d2e3 was not found"),
        ReleaseView("release/2.14", "4f2ae91c0b1d2e3f4a5b6c7d8e9f001122334455", NOW - 26 * 3600,
                    "Faster monthly report exports", "exists", "image …/worker:4f2ae91 exists in europe-west1"),
        ReleaseView("release/2.13", "77aa88bb99cc00dd11ee22ff33aa44bb55cc66dd", NOW - 9 * 86400,
                    "Pin celery 5.4.0", "exists", "image …/worker:77aa88b exists in europe-west1"),
        ReleaseView("release/2.12-hotfix", "0123456789abcdef0123456789abcdef01234567", NOW - 41 * 86400,
                    "Hotfix: ETA tasks lost on warm shutdown", "unknown",
                    "registry europe-west1-docker.pkg.dev could not be reached (timed out)"),
    ))


def history() -> tuple[RunRecordView, ...]:
    """The run history: a deploy in progress, a deploy done, a drain that timed out, a rollback, a failed deploy."""
    return (
        RunRecordView("20240611-0912-3fa9c1", "deploy", "draining", "release/2.14", "ops@laptop", NOW - 420, None),
        RunRecordView("20240610-1630-9b0d2e", "deploy", "done", "release/2.13", "ci@runner-7", NOW - 17 * 3600,
                      1130.0, "succeeded"),
        RunRecordView("20240609-1105-7c1e4a", "drain", "aborted", None, "ops@laptop", NOW - 2 * 86400 - 3600,
                      1210.0, "timeout"),
        RunRecordView("20240607-2214-c4d8e1", "rollback", "done", "worker-00038-hzt", "ops@laptop",
                      NOW - 4 * 86400, 305.0, "succeeded"),
        RunRecordView("20240605-0840-51aa07", "deploy", "failed", "release/2.12", "ops@laptop", NOW - 6 * 86400,
                      742.0, "deploy_failed"),
    )


def timeline() -> tuple[TimelineEntry, ...]:
    start = NOW - 17 * 3600
    return (
        TimelineEntry(start, "info", "run created by ci@runner-7 to deploy release/2.13"),
        TimelineEntry(start + 1, "info", "phase preflight → stopping"),
        TimelineEntry(start + 1, "info", "about to cancel consumers: default, render on every worker"),
        TimelineEntry(start + 2, "info", "phase stopping → draining"),
        TimelineEntry(start + 905, "ok", "phase draining → deploying"),
        TimelineEntry(start + 905, "info", "about to deploy …/worker:77aa88b to worker-pool"),
        TimelineEntry(start + 1100, "ok", "deploy_start done (revision worker-pool-00042-xuv)"),
        TimelineEntry(start + 1130, "ok", "phase deployed → done"),
    )
