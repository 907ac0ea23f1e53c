"""The doctor's rules about a worker's shutdown against its platform's grace (pure).

Cloud Run sends SIGTERM and SIGKILLs 10 s later (services and worker pools alike); Kubernetes waits the pod's
``terminationGracePeriodSeconds`` (30 by default, not visible from inside: ``--grace``). Celery's SIGTERM is a warm
shutdown that waits for the running tasks without a limit; its soft shutdown (5.5+, ``worker_soft_shutdown_timeout``)
bounds the wait, but only on a cold shutdown, which SIGTERM starts only with ``REMAP_SIGTERM=SIGQUIT``. A PID 1 that
has no SIGTERM handler (a shell running the worker as its child) drops the signal: the worker never hears it.
"""

from __future__ import annotations

from collections.abc import Iterable

from celeryops.core.events import DoctorNote, Finding
from celeryops.core.findings import docs, title
from celeryops.core.wording import duration
from celeryops.ops.doctor.facts import FleetFacts, WorkerFacts

CLOUD_RUN_GRACE = 10.0
KUBERNETES_GRACE = 30.0
MARGIN = 2.0  # seconds left for the cold shutdown to requeue what it cancelled


def names(items: Iterable[str], limit: int = 4) -> str:
    ordered = sorted(set(items))
    return ", ".join(ordered[:limit]) + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


def platform_words(platform: str) -> str:
    return {"cloudrun-service": "Cloud Run (service)", "cloudrun-worker-pool": "Cloud Run (worker pool)",
            "kubernetes": "Kubernetes"}.get(platform, "the platform")


def grace_of(worker: WorkerFacts, grace: float | None) -> float | None:
    """The seconds between SIGTERM and SIGKILL on the worker's platform: Cloud Run's 10, Kubernetes' ``grace``
    (default 30); on a platform not recognised, ``grace`` when the operator gave one, else None (not checked)."""
    if worker.platform.startswith("cloudrun"):
        return CLOUD_RUN_GRACE
    if worker.platform == "kubernetes":
        return grace if grace is not None else KUBERNETES_GRACE
    return grace if worker.report is not None else None


def _bounded(worker: WorkerFacts, grace: float) -> bool:
    """Every task this worker runs has a hard time limit within the grace: a warm shutdown ends in time."""
    tasks = worker.tasks()
    limits = [t.time_limit for t in tasks] or [worker.time_limit]
    return all(limit is not None and limit <= grace for limit in limits)


def _where(worker: WorkerFacts, grace: float) -> str:
    return f"on {platform_words(worker.platform)}" if worker.platform else "under the grace you gave"


def shutdown_findings(facts: FleetFacts, grace: float | None) -> list[Finding]:
    groups: dict[tuple[str, str, float, float | None], list[str]] = {}
    for w in facts.checked:
        limit = grace_of(w, grace)
        if limit is None or w.report is None:
            continue
        soft = w.soft_shutdown
        if not w.remap_sigquit:
            if not _bounded(w, limit):
                groups.setdefault(("warm", _where(w, limit), limit, None), []).append(w.name)
        elif soft is not None and soft >= limit:
            groups.setdefault(("soft", _where(w, limit), limit, soft), []).append(w.name)
    out: list[Finding] = []
    for (problem, where, limit, soft), workers in sorted(groups.items()):
        target = max(1.0, limit - MARGIN)
        if problem == "warm":
            what = (f"{where}, a worker is SIGKILLed {duration(limit)} after SIGTERM, but Celery's SIGTERM "
                    "is a warm shutdown that waits for running tasks without a limit: a task still running then "
                    "is killed mid-run (lost with late acks off, run again after the visibility timeout with them "
                    "on)")
            fix = (f"set REMAP_SIGTERM=SIGQUIT in the worker's environment and worker_soft_shutdown_timeout="
                   f"{target:g} (Celery 5.5+), with task_acks_late=True so that the tasks the cold shutdown "
                   "cancels go back to the queue")
        else:
            what = (f"{where}, a worker is SIGKILLed {duration(limit)} after SIGTERM, but its soft shutdown waits "
                    f"{duration(soft or 0)}: the cold shutdown that gives running tasks back never comes, and they "
                    "are killed mid-run")
            fix = f"worker_soft_shutdown_timeout={target:g} (under the platform's grace)"
        out.append(Finding("shutdown_grace", title("shutdown_grace"), what, fix, docs("shutdown_grace"),
                           workers=tuple(sorted(workers))))
    return out


def pid1_findings(facts: FleetFacts, grace: float | None) -> list[Finding]:
    by_name: dict[tuple[str, str, float], list[str]] = {}
    for w in facts.checked:
        limit = grace_of(w, grace)
        if w.report is None or not w.platform or limit is None or w.report.pid1 != "drops":
            continue
        by_name.setdefault((w.report.pid1_name or "?", w.platform, limit), []).append(w.name)
    return [Finding("pid1_signals", title("pid1_signals"),
                    f"PID 1 of the container ({pid1}) has no SIGTERM handler, so the SIGTERM "
                    f"{platform_words(platform)} sends is dropped and the worker never starts its shutdown: "
                    f"{duration(limit)} later SIGKILL ends it with every running task",
                    "start the worker with exec (`exec celery -A proj worker ...` as the entrypoint script's last "
                    "line), or run an init that passes signals on (tini, dumb-init) as PID 1",
                    docs("pid1_signals"), workers=tuple(sorted(workers)))
            for (pid1, platform, limit), workers in sorted(by_name.items())]


def eta_shutdown_findings(facts: FleetFacts, grace: float | None) -> list[Finding]:
    """A cold shutdown (REMAP_SIGTERM=SIGQUIT) on an idle worker skips the soft shutdown, and the ETA tasks it holds
    may be lost (Celery's documentation), unless ``worker_enable_soft_shutdown_on_idle``."""
    workers = [w for w in facts.checked if grace_of(w, grace) is not None and w.remap_sigquit
               and (w.soft_shutdown or 0) > 0 and not w.soft_on_idle and w.scheduled]
    if not workers:
        return []
    held = sorted({h.name for w in workers for h in w.scheduled})
    return [Finding("eta_shutdown", title("eta_shutdown"),
                    "these workers hold ETA/countdown tasks and shut down cold on SIGTERM (REMAP_SIGTERM=SIGQUIT): "
                    "when no task runs, Celery skips the soft shutdown and the ETA tasks may not be given back",
                    "worker_enable_soft_shutdown_on_idle=True", docs("eta_shutdown"),
                    workers=tuple(sorted(w.name for w in workers)), tasks=tuple(held))]


def platform_notes(facts: FleetFacts, grace: float | None) -> list[DoctorNote]:
    plain = [w.name for w in facts.checked if w.report is None]
    unknown = [w.name for w in facts.checked if w.report is not None and not w.platform]
    out = []
    if unknown:
        checked = (f"their shutdown was checked against the grace you gave ({duration(grace)})" if grace is not None
                   else "their shutdown was not checked against a grace (give one with --grace SECONDS)")
        out.append(DoctorNote("platform_unknown", title("platform_unknown"),
                              "no platform celeryops recognises (Cloud Run: K_SERVICE or CLOUD_RUN_WORKER_POOL; "
                              f"Kubernetes: KUBERNETES_SERVICE_HOST) is set in these workers' environment: {checked}",
                              docs=docs("platform_unknown"), workers=tuple(sorted(unknown))))
    if plain:
        out.append(DoctorNote("platform_unknown", title("platform_unknown"),
                              "these workers run without the celeryops fence plugin, which reports the platform, "
                              "REMAP_SIGTERM and PID 1 from inside: their shutdown was not checked",
                              "fence.install(app) in the worker app (see the README's Worker side)",
                              docs("platform_unknown"), workers=tuple(sorted(plain))))
    return out
