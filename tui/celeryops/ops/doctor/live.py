"""What the console sees happen (no I/O, thread-safe): the doctor's live findings.

- ``redelivered``: a task id received twice (Celery task events: a second ``task-received`` with the same retry
  count; or seen held by one worker, then by another, in the console's polls), named with its likely cause: its
  first worker left holding it, its ETA lay beyond the visibility timeout, or it was running (a late-ack task past
  the visibility timeout, or a broker connection lost under it). A task that retried itself without counting the
  retry (the slots' handoff: a task waiting for slots is sent again twice, woken and as a fallback, with the same
  retry count, and the copy that does not get the slots drops itself) is no redelivery when its copies arrive.
- ``hoarding``: a worker holds reserved tasks while all its processes are busy and another worker that consumes the
  same queue is idle (its polls, and each worker's concurrency).
- ``orphaned_task``: a task started on a worker that has left since (a ``worker-offline`` event, or a worker gone by
  evidence in the polls) without ending: lost with late acks off, delivered again later with them on.

Fed from the task event receiver's thread and from the console's polls; :meth:`LiveFindings.findings` is what the
home view shows. A finding stays :data:`KEEP` seconds after it was last seen.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from celeryops.core.events import Finding, Observation
from celeryops.core.findings import docs, title
from celeryops.ops.doctor.shutdown import names

KEEP = 600.0  # seconds a live finding stays shown after it was last seen
HOARD_POLLS = 3  # polls in a row a worker must hoard (one poll catches short tasks turning over)
TRACKED = 50_000  # task ids remembered (receipts, who holds or runs them)
END_EVENTS = frozenset({"task-succeeded", "task-failed", "task-revoked", "task-rejected", "task-retried"})


@dataclass
class _Seen:
    worker: str
    name: str
    retries: int = 0
    eta: bool = False
    started: bool = False
    ended: bool = False
    copies: bool = False  # it retried itself at this retry count: more receipts of it are its own copies


class LiveFindings:
    """See the module. ``clock``: epoch seconds (injected in tests)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._tasks: OrderedDict[str, _Seen] = OrderedDict()
        self._left: set[str] = set()
        self._found: dict[tuple[str, str], tuple[float, Finding]] = {}
        self._last_active: dict[str, dict[str, str]] = {}  # worker -> running task id -> name, at the last poll
        self._hoards: dict[str, int] = {}  # worker -> polls in a row it held reserved tasks behind busy processes
        self._runtimes: dict[str, dict[str, float]] = {}  # worker -> task name -> longest run (task events)

    # -- inputs ------------------------------------------------------------------------------------------------

    def on_task_event(self, event: Mapping[str, Any]) -> None:
        """A Celery event (as the event receiver gives it: ``type``, ``uuid``, ``hostname``...)."""
        kind = str(event.get("type") or "")
        worker = str(event.get("hostname") or "")
        with self._lock:
            if kind == "worker-offline":
                self._worker_left(worker)
                return
            task_id = str(event.get("uuid") or "")
            if not task_id:
                return
            seen = self._tasks.get(task_id)
            if kind == "task-received":
                retries = int(event.get("retries") or 0)
                copies = seen is not None and seen.copies and seen.retries == retries
                if seen is not None and not seen.ended and seen.retries == retries and not copies:
                    self._redelivered(task_id, seen, worker)
                self._remember(task_id, _Seen(worker, str(event.get("name") or (seen.name if seen else "")),
                                              retries, eta=bool(event.get("eta")), copies=copies))
            elif seen is not None and kind == "task-started":
                seen.worker, seen.started = worker or seen.worker, True
            elif seen is not None and kind in END_EVENTS:
                seen.ended = True
                # a retry sent at the same count (the slots' handoff) is a copy; Celery's own retry counts one more
                seen.copies = seen.copies or kind == "task-retried"
                runtime = event.get("runtime")
                if isinstance(runtime, int | float) and seen.name:
                    runs = self._runtimes.setdefault(worker or seen.worker, {})
                    runs[seen.name] = max(runs.get(seen.name, 0.0), float(runtime))

    def observe(self, obs: Observation, concurrency: Mapping[str, int], gone: Iterable[str] = ()) -> None:
        """One poll of the console: who holds which task, who left (``gone``: by evidence), and how many processes
        each worker has (``concurrency``; a worker missing there is not judged for hoarding)."""
        with self._lock:
            for worker in set(gone):
                self._worker_left(worker)
            active: dict[str, dict[str, str]] = {}
            for task in obs.tasks:
                seen = self._tasks.get(task.id)
                if seen is not None and seen.worker and seen.worker != task.worker and task.state != "scheduled" \
                        and not seen.ended and not seen.copies and seen.worker in obs.workers:
                    self._redelivered(task.id, seen, task.worker)
                if seen is None or seen.worker != task.worker:
                    self._remember(task.id, _Seen(task.worker, task.name, seen.retries if seen else 0,
                                                  eta=task.state == "scheduled", copies=bool(seen and seen.copies)))
                if task.state == "active":
                    self._tasks[task.id].started = True
                    active.setdefault(task.worker, {})[task.id] = task.name
            self._last_active = {w: a for w, a in active.items()}
            self._hoarding(obs, concurrency)

    def runtimes(self) -> dict[str, dict[str, float]]:
        """The longest run of each task name on each worker, as task events reported them."""
        with self._lock:
            return {w: dict(r) for w, r in self._runtimes.items()}

    # -- the findings ------------------------------------------------------------------------------------------

    def findings(self) -> tuple[Finding, ...]:
        now = self.clock()
        with self._lock:
            self._found = {k: v for k, v in self._found.items() if now - v[0] < KEEP}
            return tuple(f for _, f in sorted(self._found.values(), key=lambda v: (v[1].id, v[1].workers)))

    def _add(self, key: str, finding: Finding) -> None:
        self._found[(finding.id, key)] = (self.clock(), finding)

    def _remember(self, task_id: str, seen: _Seen) -> None:
        self._tasks[task_id] = seen
        self._tasks.move_to_end(task_id)
        while len(self._tasks) > TRACKED:
            self._tasks.popitem(last=False)

    def _redelivered(self, task_id: str, first: _Seen, worker: str) -> None:
        if first.worker in self._left and not first.started:
            return  # a worker that left gave back what it had not started: it runs once, elsewhere
        if first.worker in self._left:
            cause = f"its first worker {first.worker} left while holding it, so the broker gave it back"
        elif first.eta:
            cause = ("it waited for an ETA on its first worker longer than the broker's visibility timeout "
                     "(celery#5935): raise broker_transport_options' visibility_timeout above the longest countdown")
        elif first.started:
            cause = ("it was still running on its first worker: a late-ack task past the visibility timeout, or a "
                     "broker connection lost under it (worker_cancel_long_running_tasks_on_connection_loss)")
        else:
            cause = ("its first worker held it unacknowledged past the visibility timeout (prefetched behind long "
                     "tasks), or lost its broker connection")
        self._add(task_id, Finding(
            "redelivered", title("redelivered"),
            f"task {task_id} ({first.name or '?'}) was delivered to {worker} after {first.worker} had received it: "
            f"it may run twice; likely cause: {cause}",
            "see `celeryops doctor` for the settings behind it", docs("redelivered"),
            workers=tuple(sorted({first.worker, worker})), tasks=(first.name,) if first.name else ()))

    def _worker_left(self, worker: str) -> None:
        if not worker or worker in self._left:
            return
        self._left.add(worker)
        running = {tid: s.name for tid, s in self._tasks.items()
                   if s.worker == worker and s.started and not s.ended}
        running.update(self._last_active.get(worker, {}))
        for task_id, name in running.items():
            self._add(task_id, Finding(
                "orphaned_task", title("orphaned_task"),
                f"task {task_id} ({name or '?'}) had started on {worker}, which left before it ended: with late acks "
                "off it is lost; with them on it is delivered again after the visibility timeout",
                "task_acks_late=True with task_reject_on_worker_lost=True for tasks that must survive their worker",
                docs("orphaned_task"), workers=(worker,), tasks=(name,) if name else ()))

    def _hoarding(self, obs: Observation, concurrency: Mapping[str, int]) -> None:
        workers = [w for w in obs.workers.values() if w.replied]
        idle = [w for w in workers if w.active == 0 and w.queues]
        hoards: dict[str, int] = {}
        for w in workers:
            limit = concurrency.get(w.name)
            if not limit or w.reserved == 0 or w.active < limit:
                continue
            others = [o.name for o in idle if o.name != w.name and set(o.queues) & set(w.queues)]
            if not others:
                continue
            hoards[w.name] = self._hoards.get(w.name, 0) + 1
            if hoards[w.name] < HOARD_POLLS:
                continue
            held = sorted({t.name for t in obs.tasks if t.worker == w.name and t.state == "reserved"})
            self._add(w.name, Finding(
                "hoarding", title("hoarding"),
                f"{w.name} holds {w.reserved} reserved task(s) while all its {limit} process(es) are busy, and "
                f"{names(others)} consuming the same queue sit idle: the reserved tasks wait for {w.name}",
                "worker_prefetch_multiplier=1 and task_acks_late=True on workers of long tasks",
                docs("hoarding"), workers=(w.name, *sorted(others)), tasks=tuple(held)))
        self._hoards = hoards
