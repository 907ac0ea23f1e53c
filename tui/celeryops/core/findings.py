"""The ids of what ``celeryops doctor`` (and the console's findings panel) can find, with a title and the Celery
documentation each one links to. The ids are stable: scripts read them from ``--json``, and a drain's or deploy's
preflight accepts a finding by its id (``--accept-warning ID``, ``[preflight] accept``). No I/O here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DOCS = "https://docs.celeryq.dev/en/stable"
#: A ``finding`` (exit 1, a preflight warning), a ``note`` (what a setting means; shown, never a finding), or a
#: ``live`` finding (seen happening by the console: a redelivery, hoarding, a task left on a worker that left).
FindingKind = Literal["finding", "note", "live"]


@dataclass(frozen=True)
class Kind:
    title: str
    docs: str
    kind: FindingKind = "finding"


CATALOG: dict[str, Kind] = {
    # -- findings: settings that lose or duplicate work (exit 1; preflight warnings) --------------------------------
    "shutdown_grace": Kind("Shutdown fits the platform's grace", f"{DOCS}/userguide/workers.html#soft-shutdown"),
    "pid1_signals": Kind("SIGTERM reaches the worker", f"{DOCS}/userguide/workers.html#stopping-the-worker"),
    "eta_shutdown": Kind("ETA tasks survive a shutdown",
                         f"{DOCS}/userguide/configuration.html#worker-enable-soft-shutdown-on-idle"),
    "visibility_eta": Kind("ETA within the visibility timeout",
                           f"{DOCS}/getting-started/backends-and-brokers/redis.html#visibility-timeout"),
    "visibility_runtime": Kind("Late-ack tasks end within the visibility timeout",
                               f"{DOCS}/getting-started/backends-and-brokers/redis.html#visibility-timeout"),
    "prefetch_long_tasks": Kind("No prefetch behind long tasks", f"{DOCS}/userguide/optimizing.html#prefetch-limits"),
    "lost_on_crash": Kind("Late acks requeue on a crash",
                          f"{DOCS}/userguide/configuration.html#task-reject-on-worker-lost"),
    "connection_loss": Kind("Late-ack tasks stop on a lost connection",
                            f"{DOCS}/userguide/configuration.html#worker-cancel-long-running-tasks-on-connection-loss"),
    "result_expires": Kind("Results expire", f"{DOCS}/userguide/configuration.html#result-expires"),
    "unchecked": Kind("Every worker's settings read", f"{DOCS}/userguide/workers.html#inspecting-workers"),
    # -- notes: what a setting (often a default) means; shown, never a finding -------------------------------------
    "platform_unknown": Kind("Platform not recognised", f"{DOCS}/userguide/workers.html#stopping-the-worker", "note"),
    "acks_early": Kind("Tasks acknowledged before they run", f"{DOCS}/faq.html#should-i-use-retry-or-acks-late",
                       "note"),
    "runs_again": Kind("Tasks run again after a crash", f"{DOCS}/userguide/tasks.html#Task.acks_late", "note"),
    # -- live: seen happening, in the console and watch ------------------------------------------------------------
    "redelivered": Kind("A task was delivered twice",
                        f"{DOCS}/getting-started/backends-and-brokers/redis.html#visibility-timeout", "live"),
    "hoarding": Kind("Tasks wait behind busy processes", f"{DOCS}/userguide/optimizing.html#prefetch-limits", "live"),
    "orphaned_task": Kind("A task's worker left while it ran", f"{DOCS}/faq.html#should-i-use-retry-or-acks-late",
                          "live"),
}

#: The settings findings: ``celeryops doctor`` exits 1 on any, and a preflight warns with each (accepted by id).
SETTING_FINDINGS: tuple[str, ...] = tuple(k for k, v in CATALOG.items() if v.kind == "finding")


def title(finding_id: str) -> str:
    kind = CATALOG.get(finding_id)
    return kind.title if kind is not None else finding_id


def docs(finding_id: str) -> str:
    kind = CATALOG.get(finding_id)
    return kind.docs if kind is not None else DOCS
