"""What a worker tells ``celeryops doctor`` about itself, from inside (worker side: celery and the standard library).

Remote control shows a worker's configuration (``inspect conf``) but not what only the worker's process knows: the
platform it runs on (its environment), ``REMAP_SIGTERM`` (read by billiard from the environment), whether the
container's PID 1 passes SIGTERM on to it, the settings its command line gave (``--prefetch-multiplier``,
``--time-limit`` go to the worker, not to ``app.conf``), each task's own options (``@app.task(acks_late=True)``)
and how long its tasks ran. The fence plugin puts :meth:`SelfReport.snapshot` in its status, so it is in the
plugin's registry entry (read while the worker is too busy to answer), in its ``celeryops_fence`` reply and in the
worker's ``inspect stats`` reply (``celeryops_doctor``); :class:`WorkerReport` reads it back on the operator's side.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from celeryops.fence.record import Platform, platform_of

#: PID 1 of the worker's container, when the worker is PID 1 or its child: the worker itself, a parent that catches
#: SIGTERM (tini, dumb-init, a shell with a trap: it can pass it on), one that does not (the kernel drops a signal
#: PID 1 has no handler for, so a shell running the worker as a child never passes SIGTERM on); ``unknown``: /proc
#: cannot tell, or PID 1 is further up (not a container's entrypoint of this worker: not judged).
Pid1Kind = Literal["worker", "forwards", "drops", "unknown"]
STATS_KEY = "celeryops_doctor"  # the key of the report in the worker's ``inspect stats`` reply
TASKS_KEPT = 500  # task option overrides reported at most (the registry entry stays small)
TASK_OPTIONS = ("acks_late", "reject_on_worker_lost", "time_limit", "soft_time_limit")


def pid1_kind(own_pid: int, parent_pid: int, sigcgt: str | None, sigign: str | None) -> Pid1Kind:
    """Pure: what PID 1 does with the SIGTERM meant for this process, from its pid, its parent's, and PID 1's
    ``SigCgt`` / ``SigIgn`` masks (hex, from ``/proc/1/status``; None when unreadable)."""
    if own_pid == 1:
        return "worker"
    if parent_pid != 1 or sigcgt is None:
        return "unknown"
    bit = 1 << (signal.SIGTERM - 1)
    try:
        caught, ignored = int(sigcgt, 16), int(sigign or "0", 16)
    except ValueError:
        return "unknown"
    return "forwards" if caught & bit and not ignored & bit else "drops"


def read_pid1() -> dict[str, str]:
    """PID 1's name and what it does with SIGTERM (see :func:`pid1_kind`); ``unknown`` when /proc cannot tell."""
    fields: dict[str, str] = {}
    name = ""
    try:
        with open("/proc/1/comm") as f:
            name = f.read().strip()
        with open("/proc/1/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    except OSError:
        pass
    return {"kind": pid1_kind(os.getpid(), os.getppid(), fields.get("SigCgt"), fields.get("SigIgn")), "name": name}


def _seconds(value: Any) -> float | None:
    """A duration setting as seconds: a number, a ``timedelta``; None for unset or anything else."""
    if value is None or isinstance(value, bool):
        return None
    if hasattr(value, "total_seconds"):
        return float(value.total_seconds())
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def effective_settings(consumer: Any) -> dict[str, Any]:
    """The settings the doctor judges, as this worker runs with them (its command line included); a setting its
    Celery does not have (``worker_soft_shutdown_timeout`` before 5.5) is left out. No URL, no secret."""
    app = consumer.app
    conf = app.conf
    worker = getattr(consumer, "controller", None)
    pool = getattr(consumer, "pool", None)
    out: dict[str, Any] = {
        "prefetch_multiplier": getattr(worker, "prefetch_multiplier", conf.get("worker_prefetch_multiplier")),
        "concurrency": getattr(worker, "concurrency", conf.get("worker_concurrency")),
        "pool": type(pool).__module__.rsplit(".", 1)[-1] if pool is not None else "",
        "time_limit": _seconds(getattr(worker, "time_limit", conf.get("task_time_limit"))),
        "soft_time_limit": _seconds(getattr(worker, "soft_time_limit", conf.get("task_soft_time_limit"))),
        "acks_late": bool(conf.get("task_acks_late")),
        "reject_on_worker_lost": bool(conf.get("task_reject_on_worker_lost")),
        "visibility_timeout": _seconds((conf.get("broker_transport_options") or {}).get("visibility_timeout")),
        "result_backend": str(conf.get("result_backend") or "").split(":", 1)[0] if conf.get("result_backend")
        else "",
        "result_expires": _seconds(conf.get("result_expires")),
    }
    for key in ("worker_soft_shutdown_timeout", "worker_enable_soft_shutdown_on_idle",
                "worker_cancel_long_running_tasks_on_connection_loss"):
        if key in conf:
            value = conf.get(key)
            out[key.removeprefix("worker_")] = value if isinstance(value, bool) else _seconds(value)
    return out


def task_options(app: Any, acks_late_default: bool) -> dict[str, dict[str, Any]]:
    """Each task's own options where they differ from the app's (at most :data:`TASKS_KEPT` tasks, by name)."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(app.tasks.keys()):
        if name.startswith("celery.") or len(out) >= TASKS_KEPT:
            continue
        task = app.tasks[name]
        own: dict[str, Any] = {}
        if getattr(task, "acks_late", None) is not None and bool(task.acks_late) != acks_late_default:
            own["acks_late"] = bool(task.acks_late)
        if getattr(task, "reject_on_worker_lost", None) is not None:
            own["reject_on_worker_lost"] = bool(task.reject_on_worker_lost)
        for key in ("time_limit", "soft_time_limit"):
            if _seconds(getattr(task, key, None)) is not None:
                own[key] = _seconds(getattr(task, key))
        if own:
            out[name] = own
    return out


class SelfReport:
    """Made once when the plugin starts in the worker's main process; :meth:`snapshot` adds the longest run seen of
    each task so far (sampled from the requests the worker runs now, at every snapshot)."""

    def __init__(self, consumer: Any, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.platform: Platform = platform_of(env)
        self.remap_sigterm = env.get("REMAP_SIGTERM", "")
        self.pid1 = read_pid1()
        self.settings = effective_settings(consumer)
        self.tasks = task_options(consumer.app, bool(self.settings.get("acks_late")))
        self.longest: dict[str, float] = {}

    def sample(self) -> None:
        from celery.worker import state

        now = time.time()
        try:
            running = list(state.active_requests)
        except RuntimeError:  # changed size while copied: the next sample sees it
            return
        for request in running:
            start = getattr(request, "time_start", None)
            if start:
                name = str(getattr(request, "name", "") or "")
                self.longest[name] = max(self.longest.get(name, 0.0), round(now - float(start), 1))

    def snapshot(self) -> dict[str, Any]:
        try:
            self.sample()
        except Exception:  # a report never takes the plugin down
            pass
        return {"platform": self.platform, "remap_sigterm": self.remap_sigterm, "pid1": dict(self.pid1),
                "settings": dict(self.settings), "tasks": dict(self.tasks), "longest": dict(self.longest)}


@dataclass(frozen=True)
class WorkerReport:
    """A :class:`SelfReport` snapshot read back (operator side); unknown or malformed parts read as empty."""

    platform: Platform = ""
    remap_sigterm: str = ""
    pid1: Pid1Kind = "unknown"
    pid1_name: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    longest: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: object) -> WorkerReport | None:
        if not isinstance(data, Mapping):
            return None
        platform = data.get("platform")
        pid1 = data.get("pid1") if isinstance(data.get("pid1"), Mapping) else {}
        kind = pid1.get("kind") if isinstance(pid1, Mapping) else None
        tasks = data.get("tasks") if isinstance(data.get("tasks"), Mapping) else {}
        longest = data.get("longest") if isinstance(data.get("longest"), Mapping) else {}
        settings = data.get("settings")
        return cls(
            platform=platform if platform in ("cloudrun-service", "cloudrun-worker-pool", "kubernetes") else "",
            remap_sigterm=str(data.get("remap_sigterm") or ""),
            pid1=kind if kind in ("worker", "forwards", "drops") else "unknown",
            pid1_name=str(pid1.get("name") or "") if isinstance(pid1, Mapping) else "",
            settings=dict(settings) if isinstance(settings, Mapping) else {},
            tasks={str(k): dict(v) for k, v in (tasks or {}).items() if isinstance(v, Mapping)},
            longest={str(k): float(v) for k, v in (longest or {}).items() if isinstance(v, int | float)},
        )
