"""The canary's vocabulary, shared by the outcome collector (adapters) and the judge (ops): its settings (the
``[canary]`` table of celeryops.toml, read by :mod:`celeryops.core.configcanary`) and the task outcomes credited
to one revision. Pure data, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from celeryops.core.settingsrecord import SettingsRecord

#: The settings of the ``[canary]`` table, in the order the README documents them.
CANARY_KEYS = ("min_tasks", "max_duration", "instances", "margin", "min_effect", "alpha", "confidence",
               "new_exception_count", "crash_limit", "look_interval", "ignore_exceptions")


@dataclass(frozen=True)
class CanarySettings(SettingsRecord):
    """How a canary is run and judged (defaults documented in the README's "Canary settings"); journaled with a
    canary run (:meth:`to_dict`: its resume judges by the settings it started with).

    ``min_tasks``: canary tasks that must complete before it can be promoted. ``max_duration``: seconds; a look at
    or past it that neither promotes nor rolls back is inconclusive and pauses the run for the operator.
    ``instances``: canary instances of the new revision added beside the old ones. ``margin``: the tolerated
    increase of the failure rate (canary minus baseline, a fraction): promote once the upper confidence bound of
    the increase is below it.
    ``min_effect``: a rollback by failure rate also needs the observed increase to be at least this. ``alpha``: the
    chance of rolling back a release as good as the old one, over the whole canary (spent over the looks:
    :mod:`celeryops.ops.run.analysis.rules`). ``confidence``: of the promotion bound (one-sided) and of the
    console's intervals.
    ``new_exception_count``: an exception type seen this many times on the canary and never on the baseline rolls
    back. ``crash_limit``: canary instance crashes that roll back. ``look_interval``: seconds between looks.
    ``ignore_exceptions``: exception type names (``SoftTimeLimitExceeded``) left out of every count."""

    min_tasks: int = 50
    max_duration: float = 900.0
    instances: int = 1
    margin: float = 0.05
    min_effect: float = 0.02
    alpha: float = 0.01
    confidence: float = 0.95
    new_exception_count: int = 3
    crash_limit: int = 2
    look_interval: float = 30.0
    ignore_exceptions: tuple[str, ...] = ()

    LIST_FIELDS: ClassVar[tuple[str, ...]] = ("ignore_exceptions",)

    @property
    def max_looks(self) -> int:
        """The looks planned over ``max_duration`` (one every ``look_interval``, the last one at the end): the
        rollback test's alpha is split over these."""
        return max(1, math.ceil(self.max_duration / self.look_interval - 1e-9))


def run_peak(count: int, canary: int = 0) -> int:
    """The most instances a deploy of a worker pool of ``count`` instances runs at once (quota, cost): the overlap's
    ``2 * count`` (``canary`` 0); a canary's ``count + canary`` while it is judged, then the overlap's peak when it
    is promoted: whichever is more, since the run may reach both."""
    return count + max(count, canary)


def canary_split(old: str, new: str, count: int, canary: int) -> tuple[tuple[str, int], ...]:
    """The instance split that runs exactly ``count`` instances of ``old`` beside ``canary`` of ``new`` (``count +
    canary`` in all): integer percentages, the canary's the nearest to its share, which Cloud Run's division by
    percent (each revision its share rounded down, the rest to the largest remainders) turns back into exactly those
    counts for up to 100 instances in all."""
    total = count + canary
    pct = round(100 * canary / total)
    pct = min(99, max(1, pct))
    return ((old, 100 - pct), (new, pct))


def _frozen(mapping: Mapping[str, int] | None = None) -> Mapping[str, int]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class RevisionCounts:
    """Task outcomes credited to one revision: ``succeeded`` tasks, ``failed`` by exception type name,
    ``retried`` (a retry is not an outcome: the task runs again), the ``runtimes`` (seconds) of the succeeded
    ones (Celery's task-failed event carries none)."""

    succeeded: int = 0
    failed: Mapping[str, int] = field(default_factory=_frozen)
    retried: int = 0
    runtimes: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "failed", _frozen(self.failed))

    @property
    def failures(self) -> int:
        return sum(self.failed.values())

    @property
    def completed(self) -> int:
        """Tasks that ended (succeeded or failed)."""
        return self.succeeded + self.failures

    def without(self, ignored: tuple[str, ...] | frozenset[str]) -> RevisionCounts:
        """These counts with the failures of the ``ignored`` exception types left out."""
        if not ignored:
            return self
        return RevisionCounts(self.succeeded, {k: v for k, v in self.failed.items() if k not in ignored},
                              self.retried, self.runtimes)

    def to_dict(self, runtimes: bool = False) -> dict[str, object]:
        """The counts for the journal and ``--json``; the runtimes only when asked (a journal that must give p50/p95
        back after a resume)."""
        data: dict[str, object] = {"succeeded": self.succeeded, "failed": dict(sorted(self.failed.items())),
                                   "retried": self.retried, "completed": self.completed}
        if runtimes:
            data["runtimes"] = list(self.runtimes)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RevisionCounts:
        """The counts :meth:`to_dict` wrote (a resume continues from them); ``completed`` is derived, not read.
        Raises ValueError on a record that is not such counts."""
        failed = data.get("failed") or {}
        runtimes = data.get("runtimes") or []
        succeeded, retried = data.get("succeeded", 0), data.get("retried", 0)
        if (not isinstance(failed, Mapping) or not isinstance(runtimes, list)
                or not isinstance(succeeded, int) or not isinstance(retried, int)
                or not all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in failed.items())
                or succeeded < 0 or retried < 0):
            raise ValueError(f"not canary counts: {data!r}")
        return cls(succeeded, dict(failed), retried, tuple(float(r) for r in runtimes))

    def __add__(self, other: RevisionCounts) -> RevisionCounts:
        """Both counts together: recorded counts plus those collected since a resume, or several old revisions
        as one baseline."""
        failed = dict(self.failed)
        for kind, n in other.failed.items():
            failed[kind] = failed.get(kind, 0) + n
        return RevisionCounts(self.succeeded + other.succeeded, failed, self.retried + other.retried,
                              self.runtimes + other.runtimes)


__all__ = ["CANARY_KEYS", "CanarySettings", "RevisionCounts", "canary_split", "run_peak"]
