"""What the doctor knows of each worker, and the settings it runs with (pure: no I/O).

A worker's settings come from three places, the first that says winning: what the worker's fence plugin reports
from inside (:class:`~celeryops.fence.selfreport.WorkerReport`: its command line, each task's own options, its
platform, ``REMAP_SIGTERM``, PID 1, the longest runs seen), ``inspect stats`` (the prefetch count, the pool's
concurrency and time limits, the broker's transport options) and ``inspect conf`` (the app's configuration, secrets
filtered by Celery). A worker that answered neither ``conf`` nor through its plugin is *unchecked*, never healthy.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from celeryops.fence.record import Platform
from celeryops.fence.selfreport import WorkerReport

#: Transports that hand an unacknowledged message to another consumer after ``visibility_timeout``.
VISIBILITY_TRANSPORTS = frozenset({"redis", "rediss", "sentinel", "sqs", "redis+socket"})
DEFAULT_VISIBILITY = 3600.0  # kombu's Redis and SQS default
REDIS_BACKENDS = frozenset({"redis", "rediss", "sentinel", "redis+socket"})
#: ``inspect registered`` with these items shows each task's effective options (``name [acks_late=True ...]``).
TASK_ITEMS = ("acks_late", "reject_on_worker_lost", "time_limit", "soft_time_limit")
_REGISTERED = re.compile(r"^(?P<name>\S+)(?: \[(?P<items>.*)\])?$")
T = TypeVar("T")
_TIMEDELTA = re.compile(r"^(?:(?P<days>-?\d+) days?, )?(?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d(?:\.\d+)?)$")


def seconds(value: Any) -> float | None:
    """A duration as a worker reports it: a number, a number in a string, or a ``timedelta`` as ``inspect conf``
    prints it (``1 day, 0:00:00``); None for unset, ``None``, or anything else."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    if text in ("", "None"):
        return None
    try:
        return float(text)
    except ValueError:
        pass
    match = _TIMEDELTA.match(text)
    if match is None:
        return None
    days = int(match.group("days") or 0)
    return days * 86400 + int(match.group("h")) * 3600 + int(match.group("m")) * 60 + float(match.group("s"))


def _truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


def parse_registered(entries: object) -> dict[str, dict[str, str]]:
    """``inspect registered`` with :data:`TASK_ITEMS`: task name -> its options as the worker printed them."""
    out: dict[str, dict[str, str]] = {}
    for entry in entries if isinstance(entries, list) else []:
        match = _REGISTERED.match(entry) if isinstance(entry, str) else None
        if match is None:
            continue
        items = dict(part.split("=", 1) for part in (match.group("items") or "").split() if "=" in part)
        out[match.group("name")] = items
    return out


def eta_of(entry: Mapping[str, Any]) -> float | None:
    """The epoch seconds of a scheduled entry's ETA (``inspect scheduled``), None when it has none."""
    raw = entry.get("eta")
    if not raw:
        return None
    try:
        when = dt.datetime.fromisoformat(str(raw))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


@dataclass(frozen=True)
class TaskSettings:
    """One task's effective options on one worker."""

    name: str
    acks_late: bool
    reject_on_worker_lost: bool
    time_limit: float | None


@dataclass(frozen=True)
class Held:
    """A task a worker holds now: ``eta`` (epoch) for a scheduled one, ``runtime`` (seconds) for a running one."""

    id: str
    name: str
    eta: float | None = None
    runtime: float | None = None


class _Setting(Generic[T]):
    """A worker setting read by ``parse`` from where :meth:`WorkerFacts.setting` finds it."""

    def __init__(self, report_key: str, conf_key: str, parse: Callable[[Any], T]) -> None:
        self.report_key, self.conf_key, self.parse = report_key, conf_key, parse

    def __get__(self, worker: WorkerFacts, owner: type | None = None) -> T:
        return self.parse(worker.setting(self.report_key, self.conf_key))


@dataclass(frozen=True)
class WorkerFacts:
    """Everything read about one worker (``conf`` None: it did not answer ``inspect conf``)."""

    name: str
    conf: dict[str, Any] | None = None
    stats: dict[str, Any] | None = None
    registered: dict[str, dict[str, str]] = field(default_factory=dict)
    report: WorkerReport | None = None
    scheduled: tuple[Held, ...] = ()
    active: tuple[Held, ...] = ()
    event_runs: dict[str, float] = field(default_factory=dict)  # task name -> longest run in task events

    @property
    def checked(self) -> bool:
        return self.conf is not None or self.report is not None

    def setting(self, report_key: str, conf_key: str) -> Any:
        """A setting as the worker's plugin reports it (``report_key``), else as ``inspect conf`` shows it."""
        if self.report is not None and report_key in self.report.settings:
            return self.report.settings[report_key]
        return (self.conf or {}).get(conf_key)

    def has(self, report_key: str, conf_key: str) -> bool:
        """Whether this worker's Celery has the setting (``worker_soft_shutdown_timeout`` came with 5.5)."""
        if self.report is not None:
            return report_key in self.report.settings
        return conf_key in (self.conf or {})

    # -- the platform and the shutdown --------------------------------------------------------------------------

    @property
    def platform(self) -> Platform:
        return self.report.platform if self.report is not None else ""

    @property
    def remap_sigquit(self) -> bool:
        return self.report is not None and self.report.remap_sigterm.strip().upper() in ("SIGQUIT", "QUIT")

    soft_shutdown = _Setting("soft_shutdown_timeout", "worker_soft_shutdown_timeout", seconds)
    soft_on_idle = _Setting("enable_soft_shutdown_on_idle", "worker_enable_soft_shutdown_on_idle", _truthy)
    cancel_on_connection_loss = _Setting("cancel_long_running_tasks_on_connection_loss",
                                         "worker_cancel_long_running_tasks_on_connection_loss", _truthy)

    # -- prefetch, pool ------------------------------------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        pool = (self.stats or {}).get("pool") or {}
        value = pool.get("max-concurrency") if isinstance(pool, Mapping) else None
        if value is None:
            value = self.setting("concurrency", "worker_concurrency")
        try:
            return max(1, int(value))
        except (TypeError, ValueError):
            return 1

    @property
    def prefetch_multiplier(self) -> int:
        if self.report is not None and "prefetch_multiplier" in self.report.settings:
            value: Any = self.report.settings["prefetch_multiplier"]
        elif isinstance((self.stats or {}).get("prefetch_count"), int):
            value = int((self.stats or {})["prefetch_count"]) // self.concurrency
        else:
            value = (self.conf or {}).get("worker_prefetch_multiplier", 4)
        try:
            return int(value)
        except (TypeError, ValueError):
            return 4

    @property
    def time_limit(self) -> float | None:
        """The worker's hard time limit (``task_time_limit`` or ``--time-limit``)."""
        if self.report is not None and "time_limit" in self.report.settings:
            return seconds(self.report.settings["time_limit"])
        pool = (self.stats or {}).get("pool") or {}
        timeouts = pool.get("timeouts") if isinstance(pool, Mapping) else None
        if isinstance(timeouts, list) and len(timeouts) == 2 and seconds(timeouts[1]):
            return seconds(timeouts[1])
        return seconds((self.conf or {}).get("task_time_limit"))

    # -- the broker and the results ------------------------------------------------------------------------------

    def transport(self, fallback: str) -> str:
        broker = (self.stats or {}).get("broker") or {}
        name = broker.get("transport") if isinstance(broker, Mapping) else None
        return str(name or fallback)

    @property
    def visibility_timeout(self) -> float:
        value = None
        if self.report is not None:
            value = seconds(self.report.settings.get("visibility_timeout"))
        options = (self.conf or {}).get("broker_transport_options")
        if value is None and isinstance(options, Mapping):
            value = seconds(options.get("visibility_timeout"))
        broker = (self.stats or {}).get("broker") or {}
        options = broker.get("transport_options") if isinstance(broker, Mapping) else None
        if value is None and isinstance(options, Mapping):
            value = seconds(options.get("visibility_timeout"))
        return value if value is not None else DEFAULT_VISIBILITY

    @property
    def result_backend(self) -> str:
        """The result backend's URL as the worker shows it (password masked by Celery), ``""`` when none."""
        raw = (self.conf or {}).get("result_backend")
        if raw:
            return str(raw)
        return str(self.report.settings.get("result_backend") or "") if self.report is not None else ""

    result_expires = _Setting("result_expires", "result_expires", seconds)

    # -- the tasks -----------------------------------------------------------------------------------------------

    acks_late = _Setting("acks_late", "task_acks_late", _truthy)
    reject_on_worker_lost = _Setting("reject_on_worker_lost", "task_reject_on_worker_lost", _truthy)

    def tasks(self) -> list[TaskSettings]:
        """Every task this worker runs, with its effective options (its own over the app's)."""
        own = self.report.tasks if self.report is not None else {}
        names = sorted(set(self.registered) | set(own))
        out = []
        for name in names:
            printed = self.registered.get(name, {})
            mine = own.get(name, {})
            late = mine.get("acks_late", _truthy(printed["acks_late"]) if "acks_late" in printed else self.acks_late)
            reject = mine.get("reject_on_worker_lost", _truthy(printed["reject_on_worker_lost"])
                              if "reject_on_worker_lost" in printed else self.reject_on_worker_lost)
            limit = seconds(mine.get("time_limit", printed.get("time_limit")))
            out.append(TaskSettings(name, bool(late), bool(reject), limit if limit is not None else self.time_limit))
        return out

    def longest(self) -> dict[str, float]:
        """The longest run seen of each task name: the plugin's record, task events, and what runs now."""
        seen = dict(self.report.longest) if self.report is not None else {}
        for name, runtime in self.event_runs.items():
            seen[name] = max(seen.get(name, 0.0), runtime)
        for held in self.active:
            if held.runtime is not None:
                seen[held.name] = max(seen.get(held.name, 0.0), held.runtime)
        return seen


@dataclass(frozen=True)
class FleetFacts:
    """One reading of the fleet: its workers (by name), who was asked and stayed silent, the broker's transport
    scheme, when it was read (epoch seconds), and the maxmemory-policy of the Redis holding the results
    (``policy``: None when unknown; ``backend``: how it was named)."""

    workers: dict[str, WorkerFacts]
    now: float
    transport: str = "redis"
    gone: tuple[str, ...] = ()  # silent, and evidence says they left (their plugin heartbeat expired)
    policy: str | None = None
    maxmemory: int | None = None
    backend: str = ""

    @property
    def checked(self) -> list[WorkerFacts]:
        return [w for w in self.workers.values() if w.checked]

    @property
    def unchecked(self) -> list[str]:
        return sorted(n for n, w in self.workers.items() if not w.checked)
