"""The canary's outcome collector: credits each task's outcome to the revision of the worker that ran it, from
Celery task events received on the broker in a thread.

``task-succeeded`` (with its ``runtime``), ``task-failed`` (with its ``exception``, a repr such as
``ValueError('boom')``: the type name is what counts) and ``task-retried`` carry the ``hostname`` of the worker
that sent them; ``revisions()`` (given by the caller, e.g. the fence registry's hostname -> Cloud Run revision)
says which revision that worker runs. A hostname it does not know is looked up again at most once per
``refresh`` seconds, then credited to the revision ``""`` (unattributed: a worker without the fence plugin).
``task-received`` gives the task's name, for counts per task name.

Task events are often off in production (``-E`` / ``worker_send_task_events``). Like Flower, the collector turns
them on with the ``enable_events`` broadcast and sends it again every ``resend`` seconds (a worker started since,
or one that missed the broadcast while busy, gets it at the next one). A worker's reply says whether its events
were off (``task events enabled``) or already on (``task events already enabled``): :meth:`stop` turns them off
again (``disable_events``) on the workers that said they were off, and on no other. A worker that never replied
(a busy solo pool) keeps what it got. Celery's ``enable_events`` adds the task group to a worker's event
dispatcher, which exists only when the worker sends some events: a worker started with ``--without-heartbeat
--without-gossip`` and without ``-E`` cannot be turned on remotely (Flower has the same limit).

Celery 5.6.3 drops some task events of a threads-pool worker (celery/celery#10434: the pool's threads append to the
event buffer while the worker's loop publishes and clears it): the collector then counts fewer outcomes, never
wrong ones, and both revisions alike when they run the same pool. Solo and prefork pools lose none (measured).
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from celeryops.adapters.eventreceiver import EventReceiverThread, Handlers
from celeryops.core.canary import RevisionCounts

OUTCOME_EVENTS = ("task-succeeded", "task-failed", "task-retried")
RESEND = 10.0  # seconds between enable_events broadcasts (Flower: 5 s by default)
REFRESH = 1.0  # seconds between lookups of an unknown hostname's revision
NAMES_KEPT = 100_000  # task ids whose name is remembered (from task-received) until their outcome comes
_EXC_TYPE = re.compile(r"\s*([A-Za-z_][\w.]*)")


def exception_type(text: object) -> str:
    """The exception type name of a task-failed event's ``exception`` (``"ValueError('boom')"`` -> ``ValueError``,
    ``"myapp.errors.Oops(1)"`` -> ``Oops``); ``Exception`` when it names none."""
    match = _EXC_TYPE.match(str(text or ""))
    return match.group(1).rsplit(".", 1)[-1] if match else "Exception"


@dataclass
class _Tally:
    succeeded: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    retried: int = 0
    runtimes: list[float] = field(default_factory=list)

    def frozen(self) -> RevisionCounts:
        return RevisionCounts(self.succeeded, dict(self.failed), self.retried, tuple(self.runtimes))


class OutcomeCollector(EventReceiverThread):
    """Task outcomes per revision (and per revision and task name) from Celery task events.

    ``app``: the fleet's Celery app (its broker). ``revisions``: hostname -> revision of the workers known now
    (called from the collector's thread). ``enable``: turn task events on while collecting (and back at
    :meth:`stop`). ``start()`` returns once the event receiver consumes; :meth:`counts` can be read any time.
    Events missed while the receiver reconnects are outcomes not counted: the judge then decides on fewer tasks,
    never on wrong ones."""

    def __init__(self, app: Celery, revisions: Callable[[], Mapping[str, str]], *, enable: bool = True,
                 resend: float = RESEND, refresh: float = REFRESH) -> None:
        super().__init__(app, "canary-events")
        self.revisions = revisions
        self.enable = enable
        self.resend = resend
        self.refresh = refresh
        self.lock = threading.Lock()
        self.revision_of: dict[str, str] = {}
        self.looked_up = -1e9  # monotonic time of the last revisions() call
        self.tallies: dict[str, _Tally] = {}
        self.by_name: dict[tuple[str, str], _Tally] = {}
        self.names: OrderedDict[str, str] = OrderedDict()
        self.unattributed = 0  # outcomes of workers no revision is known for
        self.enabled_by_us: set[str] = set()  # workers that said their task events were off
        self.already_on: set[str] = set()  # workers that said their task events were on
        self.broadcasts = 0
        self.enabler = threading.Thread(target=self._enable_loop, name="canary-enable-events", daemon=True)

    # ------------------------------------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 30.0) -> OutcomeCollector:
        """Start receiving (and, with ``enable``, turn task events on); raises TimeoutError when the receiver
        did not consume within ``timeout`` seconds."""
        self.thread.start()
        if not self.ready.wait(timeout):
            self.stop(restore=False)
            raise TimeoutError("the task event receiver is not consuming")
        if self.enable:
            self.enabler.start()
        return self

    def stop(self, restore: bool = True) -> None:
        """Stop receiving; with ``restore``, turn task events off again on the workers that had them off."""
        self.stop_receiving(self.enabler, 5)
        if restore:
            self.restore_events()

    def restore_events(self) -> list[str]:
        """``disable_events`` to the workers this collector turned on (none else); returns them."""
        with self.lock:
            ours = sorted(self.enabled_by_us)
        if ours:
            self.app.control.disable_events(destination=ours)
        return ours

    # ------------------------------------------------------------------------------------------- reading

    def counts(self) -> dict[str, RevisionCounts]:
        """The outcomes credited so far, by revision (``""``: workers of no known revision)."""
        with self.lock:
            return {rev: t.frozen() for rev, t in sorted(self.tallies.items())}

    def counts_by_task(self) -> dict[tuple[str, str], RevisionCounts]:
        """The outcomes by (revision, task name); the name is ``""`` when its task-received event was missed."""
        with self.lock:
            return {key: t.frozen() for key, t in sorted(self.by_name.items())}

    # ------------------------------------------------------------------------------------------- events

    def _revision(self, hostname: str) -> str | None:
        revision = self.revision_of.get(hostname)
        if revision is None and time.monotonic() - self.looked_up >= self.refresh:
            self.looked_up = time.monotonic()
            try:
                known = dict(self.revisions())
            except Exception:  # the registry is away: credit it later if it comes back, else unattributed
                known = {}
            self.revision_of.update({h: r for h, r in known.items() if r})
            revision = self.revision_of.get(hostname)
        return revision

    def _on_received(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.names[str(event.get("uuid"))] = str(event.get("name") or "")
            while len(self.names) > NAMES_KEPT:
                self.names.popitem(last=False)

    def _on_outcome(self, event: dict[str, Any]) -> None:
        kind, hostname, task_id = event.get("type"), str(event.get("hostname") or ""), str(event.get("uuid"))
        with self.lock:
            revision = self._revision(hostname)
            if revision is None:
                self.unattributed += 1
                revision = ""
            name = self.names.get(task_id, "") if kind == "task-retried" else self.names.pop(task_id, "")
            for tally in (self.tallies.setdefault(revision, _Tally()),
                          self.by_name.setdefault((revision, name), _Tally())):
                if kind == "task-succeeded":
                    tally.succeeded += 1
                    runtime = event.get("runtime")
                    if isinstance(runtime, int | float):
                        tally.runtimes.append(float(runtime))
                elif kind == "task-failed":
                    tally.failed[exception_type(event.get("exception"))] += 1
                else:
                    tally.retried += 1

    def _enable_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                replies = self.app.control.enable_events(reply=True, timeout=1.0)
                self.broadcasts += 1
            except Exception:  # the broker is away: the receiver reconnects, the next broadcast tries again
                replies = []
            with self.lock:
                for reply in replies or []:
                    for hostname, answer in reply.items():
                        said = str(answer.get("ok", "")) if isinstance(answer, dict) else ""
                        if said == "task events enabled":  # off until now (also after a restart)
                            self.enabled_by_us.add(hostname)
                            self.already_on.discard(hostname)
                        elif said == "task events already enabled" and hostname not in self.enabled_by_us:
                            self.already_on.add(hostname)
            if self.stopping.wait(self.resend):
                return

    def handlers(self) -> Handlers:
        handlers: Handlers = {name: self._on_outcome for name in OUTCOME_EVENTS}
        handlers["task-received"] = self._on_received
        return handlers


__all__ = ["OUTCOME_EVENTS", "OutcomeCollector", "exception_type"]
