"""The canary's look event (``--json`` event ``canary_look``), part of the one event vocabulary of
:mod:`celeryops.core.events` (kept in a module of its own so that ``events`` stays small): the headless printer
prints it (one line per look, :func:`celeryops.core.wording.say`), the console folds it into its canary screen, and
:mod:`celeryops.ops.fleetwide.decode` turns the published entry back into this type for watchers.

A canary strategy emits one per look, built by :func:`celeryops.ops.run.analysis.look.look_event` from the judge's
:class:`~celeryops.ops.run.analysis.rules.Judgement` and the collector's counts. Pure data, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from celeryops.core.events import Event

CanaryVerdict = Literal["continue", "promote", "rollback", "inconclusive"]
CANARY_VERDICTS: tuple[CanaryVerdict, ...] = ("continue", "promote", "rollback", "inconclusive")
#: The two sides of a canary, the keys of :attr:`CanaryLook.counts` and of each task name's counts.
ROLES = ("baseline", "canary")


@dataclass(frozen=True)
class RevisionStats:
    """One side's outcomes (or one task name's on that side), ignored exception types left out: ``completed``
    tasks (succeeded or failed), ``failed``, ``retried``, the failure ``rate`` with its two-sided Wilson interval
    ``[low, high]`` at the canary's confidence, the runtime ``p50`` / ``p95`` of the succeeded tasks in seconds
    (None: none yet), and ``exceptions``: failed tasks by exception type name."""

    completed: int = 0
    failed: int = 0
    retried: int = 0
    rate: float = 0.0
    low: float = 0.0
    high: float = 1.0
    p50: float | None = None
    p95: float | None = None
    exceptions: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RevisionStats:
        def opt(key: str) -> float | None:
            value = data.get(key)
            return None if value is None else float(value)

        return cls(completed=int(data.get("completed", 0)), failed=int(data.get("failed", 0)),
                   retried=int(data.get("retried", 0)), rate=float(data.get("rate", 0.0)),
                   low=float(data.get("low", 0.0)), high=float(data.get("high", 1.0)), p50=opt("p50"),
                   p95=opt("p95"),
                   exceptions={str(k): int(v) for k, v in (data.get("exceptions") or {}).items()})


@dataclass(frozen=True)
class CanaryLook(Event):
    """One look of a canary deploy of worker pool ``target``: the ``canary`` revision judged against the
    ``baseline`` one (the old revision's name; several old revisions are summed as one baseline).

    - ``counts``: ``{"baseline": RevisionStats, "canary": RevisionStats}``; ``tasks``: the same per task name;
    - the statistic: ``p_value`` (one-sided Fisher exact test that the canary fails more often) and ``alpha_look``
      (the level this look holds it to: the alpha spent over the looks), ``increase`` (canary rate minus baseline
      rate) with its bounds ``increase_low`` / ``increase_high`` (``increase_high`` is the one-sided bound promotion
      compares with ``margin``); ``crashes`` of canary instances, ``new_exceptions`` (types only the canary raised);
    - the verdict (``continue``, ``promote``, ``rollback``, ``inconclusive``), ``rule`` (which rule gave it),
      ``reason`` (one sentence) and ``decide`` (what would decide it: empty once decided), with the same in numbers:
      ``promote_after`` more canary tasks of which at most ``promote_failures`` may fail, ``rollback_after`` canary
      failures in a row (None: not within reach);
    - ``look`` of ``max_looks`` planned, ``elapsed`` seconds since the canary consumes, ``max_duration``,
      ``min_tasks``; ``paused``: the run waits for the operator (an inconclusive end, or the operator paused it)."""

    target: str
    baseline: str
    canary: str
    look: int
    max_looks: int
    elapsed: float
    max_duration: float
    verdict: CanaryVerdict
    rule: str = ""
    reason: str = ""
    decide: str = ""
    p_value: float = 1.0
    alpha_look: float = 0.0
    increase: float = 0.0
    increase_low: float = -1.0
    increase_high: float = 1.0
    counts: dict[str, RevisionStats] = field(default_factory=dict)
    tasks: dict[str, dict[str, RevisionStats]] = field(default_factory=dict)
    crashes: int = 0
    new_exceptions: tuple[str, ...] = ()
    promote_after: int | None = None
    promote_failures: int | None = None
    rollback_after: int | None = None
    min_tasks: int = 0
    paused: bool = False
    kind: str = field(init=False, default="canary_look")

    def side(self, role: str) -> RevisionStats:
        """``baseline`` or ``canary``'s counts (zeros before the first task)."""
        return self.counts.get(role) or RevisionStats()

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data["new_exceptions"] = list(self.new_exceptions)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CanaryLook:
        """The event :meth:`to_json` wrote (the published status, a ``--json`` line); ValueError, TypeError or
        KeyError on anything else."""
        verdict = str(data["verdict"])
        if verdict not in CANARY_VERDICTS:
            raise ValueError(f"not a canary verdict: {verdict!r}")

        def opt(key: str) -> int | None:
            value = data.get(key)
            return None if value is None else int(value)

        return cls(target=str(data.get("target", "")), baseline=str(data.get("baseline", "")),
                   canary=str(data.get("canary", "")), look=int(data["look"]), max_looks=int(data.get("max_looks", 0)),
                   elapsed=float(data.get("elapsed", 0.0)), max_duration=float(data.get("max_duration", 0.0)),
                   verdict=verdict,  # type: ignore[arg-type]
                   rule=str(data.get("rule", "")), reason=str(data.get("reason", "")),
                   decide=str(data.get("decide", "")), p_value=float(data.get("p_value", 1.0)),
                   alpha_look=float(data.get("alpha_look", 0.0)), increase=float(data.get("increase", 0.0)),
                   increase_low=float(data.get("increase_low", -1.0)),
                   increase_high=float(data.get("increase_high", 1.0)),
                   counts={str(role): RevisionStats.from_json(s) for role, s in (data.get("counts") or {}).items()},
                   tasks={str(name): {str(role): RevisionStats.from_json(s) for role, s in sides.items()}
                          for name, sides in (data.get("tasks") or {}).items()},
                   crashes=int(data.get("crashes", 0)), new_exceptions=tuple(data.get("new_exceptions") or ()),
                   promote_after=opt("promote_after"), promote_failures=opt("promote_failures"),
                   rollback_after=opt("rollback_after"), min_tasks=int(data.get("min_tasks", 0)),
                   paused=bool(data.get("paused")))


def percent(value: float) -> str:
    """``2.5%``, ``0.4%``, ``12%``: a rate as people read it."""
    shown = value * 100
    return f"{shown:.1f}%" if abs(shown) < 10 else f"{shown:.0f}%"


def look_line(event: CanaryLook) -> str:
    """The look in one readable line: which look, the verdict's reason (both sides' failure rates), the statistic,
    and what would decide it."""
    from celeryops.core.wording import duration

    head = (f"{event.target + ': ' if event.target else ''}canary {event.canary} vs {event.baseline}, look "
            f"{event.look}/{event.max_looks} ({duration(event.elapsed)} of {duration(event.max_duration)})"
            + (", paused" if event.paused else ""))
    sign = "+" if event.increase >= 0 else ""
    stat = (f"increase {sign}{percent(event.increase)} [{percent(event.increase_low)}, "
            f"{percent(event.increase_high)}], p {event.p_value:.3g} (alpha {event.alpha_look:.2g})")
    reason = event.reason or f"{event.verdict.capitalize()}."
    decide = f" Decides it: {event.decide}." if event.decide else ""
    return f"{head}: {reason} {stat}.{decide}"


__all__ = ["CANARY_VERDICTS", "ROLES", "CanaryLook", "CanaryVerdict", "RevisionStats", "look_line", "percent"]
