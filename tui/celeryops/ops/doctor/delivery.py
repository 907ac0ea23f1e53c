"""The doctor's rules about how tasks are delivered, acknowledged and stored (pure).

- The visibility timeout (Redis, SQS): a message not acknowledged within ``visibility_timeout`` of its delivery
  (an ETA task waiting on a worker, a late-ack task still running) is handed to another worker and runs twice.
- Prefetch: a worker reserves ``worker_prefetch_multiplier`` times its concurrency in messages (and, with late acks
  off, its running tasks do not count): behind a long task the reserved ones wait while other processes sit idle.
- Late acks: off (the default), a task running when its worker dies is lost; on, without
  ``task_reject_on_worker_lost``, a task whose pool process dies is failed and acknowledged, not run again; on, with
  it, the task runs again (it must be idempotent). The first and the last are notes: which is right is the user's.
- A connection lost with late-ack tasks running: they cannot be acknowledged any more and are delivered again.
- Results in Redis without ``result_expires`` on a Redis that never evicts them: memory grows until writes fail.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from celeryops.core.events import DoctorNote, Finding
from celeryops.core.findings import docs, title
from celeryops.core.wording import duration
from celeryops.ops.doctor.facts import REDIS_BACKENDS, VISIBILITY_TRANSPORTS, FleetFacts, WorkerFacts
from celeryops.ops.doctor.shutdown import names

EVICTING = ("allkeys-",)  # policies under which Redis may drop a result without a TTL (broker_safety fails them)


def _tasks_on(workers: list[WorkerFacts], keep: object) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(workers, task names) of the tasks ``keep(worker, task)`` selects."""
    found: dict[str, set[str]] = defaultdict(set)
    for w in workers:
        for t in w.tasks():
            if keep(w, t):  # type: ignore[operator]
                found[t.name].add(w.name)
    return tuple(sorted({n for ws in found.values() for n in ws})), tuple(sorted(found))


def _on_visibility_brokers(facts: FleetFacts) -> Iterator[tuple[WorkerFacts, float]]:
    """The checked workers whose broker hands a message not acknowledged in time to another worker, each with its
    visibility timeout (seconds)."""
    for w in facts.checked:
        if w.transport(facts.transport) in VISIBILITY_TRANSPORTS:
            yield w, w.visibility_timeout


def visibility_eta(facts: FleetFacts) -> list[Finding]:
    out = []
    for w, vt in _on_visibility_brokers(facts):
        far = [h for h in w.scheduled if h.eta is not None and h.eta - facts.now > vt]
        if not far:
            continue
        furthest = max(h.eta or 0 for h in far) - facts.now
        out.append(Finding(
            "visibility_eta", title("visibility_eta"),
            f"{len(far)} task(s) held by {w.name} wait for an ETA up to {duration(furthest)} away, past the broker's "
            f"visibility_timeout of {duration(vt)}: that long after delivery the broker hands each one to another "
            "worker while this one still holds it, so it runs twice (again at every further timeout)",
            f"broker_transport_options={{'visibility_timeout': {int(furthest) + 3600}}} (above the longest ETA or "
            "countdown you use), or schedule work that far off with celery beat instead of a countdown",
            docs("visibility_eta"), workers=(w.name,), tasks=tuple(sorted({h.name for h in far}))))
    return out


def visibility_runtime(facts: FleetFacts) -> list[Finding]:
    out = []
    for w, vt in _on_visibility_brokers(facts):
        longest = w.longest()
        late = [t for t in w.tasks() if t.acks_late and (t.time_limit is None or t.time_limit > vt
                                                         or longest.get(t.name, 0.0) > vt)]
        if not late:
            continue
        seen = [t.name for t in late if longest.get(t.name, 0.0) > vt]
        why = (f" ({', '.join(seen)} ran longer than that already)" if seen else "")
        out.append(Finding(
            "visibility_runtime", title("visibility_runtime"),
            f"these tasks acknowledge late on {w.name} and nothing ends them within the broker's visibility_timeout "
            f"of {duration(vt)}{why}: one still running then is handed to another worker and runs twice",
            f"a time limit under the visibility timeout (task_time_limit, or time_limit= on the task, below {vt:g}), "
            "or broker_transport_options={'visibility_timeout': N} above their longest run",
            docs("visibility_runtime"), workers=(w.name,), tasks=tuple(t.name for t in late)))
    return out


def prefetch_long_tasks(facts: FleetFacts, long: float) -> list[Finding]:
    out = []
    for w in facts.checked:
        longest = w.longest()
        tasks = {t.name: t for t in w.tasks()}
        slow = sorted(n for n, s in longest.items() if s >= long)
        early = [n for n in slow if not (tasks[n].acks_late if n in tasks else w.acks_late)]
        multiplier = w.prefetch_multiplier
        if not slow or (multiplier <= 1 and not early):
            continue
        held = multiplier * w.concurrency
        why = [f"worker_prefetch_multiplier is {multiplier} ({held} messages reserved)"] if multiplier > 1 else []
        if early:
            why.append("late acks are off, so a running task does not count against the prefetch")
        out.append(Finding(
            "prefetch_long_tasks", title("prefetch_long_tasks"),
            f"on {w.name}, tasks run {duration(max(longest[n] for n in slow))} or more while "
            f"{' and '.join(why)}: tasks it reserved wait behind a busy process while other processes or workers "
            "sit idle",
            "worker_prefetch_multiplier=1 and task_acks_late=True (with task_reject_on_worker_lost=True) on the "
            "workers of long tasks, or route long tasks to a queue of their own",
            docs("prefetch_long_tasks"), workers=(w.name,), tasks=tuple(slow)))
    return out


def late_acks(facts: FleetFacts) -> list[Finding]:
    workers, tasks = _tasks_on(facts.checked, lambda w, t: t.acks_late and not t.reject_on_worker_lost)
    if not tasks:
        return []
    return [Finding("lost_on_crash", title("lost_on_crash"),
                    "these tasks acknowledge late but not when their pool process dies: if it is killed (the OOM "
                    "killer, a segfault, SIGKILL) Celery fails the task with WorkerLostError and acknowledges it, "
                    "so it is not run again despite the late ack",
                    "task_reject_on_worker_lost=True (or reject_on_worker_lost=True on these tasks), if they are "
                    "idempotent", docs("lost_on_crash"), workers=workers, tasks=tasks)]


def late_ack_notes(facts: FleetFacts) -> list[DoctorNote]:
    out = []
    workers, tasks = _tasks_on(facts.checked, lambda w, t: not t.acks_late)
    if tasks:
        out.append(DoctorNote("acks_early", title("acks_early"),
                              f"{len(tasks)} task(s) are acknowledged when they start (late acks off, Celery's "
                              "default): one running when its worker is killed (OOM, SIGKILL, a platform's "
                              "shutdown) is lost, never run twice",
                              "task_acks_late=True with task_reject_on_worker_lost=True where a task must survive "
                              "a crash and may run twice", docs("acks_early"), workers=workers, tasks=tasks))
    workers, tasks = _tasks_on(facts.checked, lambda w, t: t.acks_late and t.reject_on_worker_lost)
    if tasks:
        out.append(DoctorNote("runs_again", title("runs_again"),
                              f"{len(tasks)} task(s) acknowledge late and go back to the queue when their worker "
                              "dies: after a crash they run again from the start, so they must be idempotent",
                              docs=docs("runs_again"), workers=workers, tasks=tasks))
    return out


def connection_loss(facts: FleetFacts) -> list[Finding]:
    exposed = [w for w in facts.checked
               if w.has("cancel_long_running_tasks_on_connection_loss",
                        "worker_cancel_long_running_tasks_on_connection_loss")
               and not w.cancel_on_connection_loss and any(t.acks_late for t in w.tasks())]
    if not exposed:
        return []
    _, tasks = _tasks_on(exposed, lambda w, t: t.acks_late)
    return [Finding("connection_loss", title("connection_loss"),
                    "when these workers lose the broker connection, their running late-ack tasks go on but can no "
                    "longer be acknowledged, and the broker delivers them again (RabbitMQ at once, Redis after the "
                    "visibility timeout): they run twice",
                    "worker_cancel_long_running_tasks_on_connection_loss=True", docs("connection_loss"),
                    workers=tuple(sorted(w.name for w in exposed)), tasks=tasks)]


def result_expires(facts: FleetFacts) -> list[Finding]:
    exposed = [w for w in facts.checked
               if w.result_backend.split(":", 1)[0] in REDIS_BACKENDS and not w.result_expires]
    policy = facts.policy
    if not exposed or (policy is not None and policy.startswith(EVICTING)):
        return []
    where = facts.backend or "the result backend's Redis"
    if policy is None:
        kept = f"{where} did not say its eviction policy; with noeviction (what a broker needs) nothing removes them"
    else:
        kept = f"{where} runs maxmemory-policy {policy}, which never removes them"
    end = ("every write fails once maxmemory is reached (\"OOM command not allowed\"), new tasks included"
           if facts.maxmemory else "memory grows until the machine runs out")
    return [Finding("result_expires", title("result_expires"),
                    f"these workers store task results in Redis with no expiry (result_expires unset) and {kept}: "
                    f"{end}",
                    "result_expires=86400 (Celery's default, one day), or task_ignore_result=True for tasks whose "
                    "result nobody reads", docs("result_expires"), workers=tuple(sorted(w.name for w in exposed)))]


def unchecked(facts: FleetFacts) -> list[Finding]:
    if not facts.workers:
        return [Finding("unchecked", title("unchecked"),
                        "no worker answered and none is registered: there were no settings to read",
                        "start the workers, or point the doctor at their broker (-A MODULE or --broker URL)",
                        docs("unchecked"))]
    silent = facts.unchecked
    if not silent:
        return []
    return [Finding("unchecked", title("unchecked"),
                    f"{names(silent)} did not answer `inspect conf` and report nothing through the fence plugin "
                    "(remote control disabled, a solo pool busy with a task, an old Celery, or gone): their settings "
                    "were not checked, so nothing says they are safe",
                    "run the doctor again when they are idle, or install celeryops.fence in the worker app (it "
                    "reports the settings from inside, also while a solo pool is busy)", docs("unchecked"),
                    workers=tuple(silent))]
