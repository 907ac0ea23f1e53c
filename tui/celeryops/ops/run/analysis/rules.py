"""The canary's judge: one pure function from the task outcomes of both revisions to a verdict. No I/O, no clock
(the caller passes the look number and the time elapsed since the canary started consuming).

At each look, in this order:

1. **rollback** when the canary's instances crashed ``crash_limit`` times or more;
2. **rollback** when an exception type failed ``new_exception_count`` canary tasks or more and not one baseline
   task (ignored types aside), and that is beyond chance: with a canary that runs a fifth of the tasks, 3 failures
   of a type that both revisions raise all land on the canary 0.8 % of the time, so the type's own one-sided
   Fisher p-value must also be at most its share of the look's alpha (below);
3. **rollback** when the canary fails more often than the baseline beyond chance and beyond the minimum effect:
   the one-sided Fisher exact p-value is at most the look's alpha, and the observed increase of the failure rate
   is at least ``min_effect``;
4. **promote** when ``min_tasks`` canary tasks completed and the one-sided upper bound of the increase (at
   ``confidence``) is below ``margin``: at any look, the one at ``max_duration`` too;
5. otherwise **continue**, or, at or past ``max_duration``, **inconclusive** (the run pauses for the operator).

The verdict's sentence names the rule that decided, or what is missing (too few tasks, or the bound not below the
margin: both numbers shown with the decimals that tell them apart), and ``decide`` says what would decide it.

Alpha spending: repeated looks would inflate false alarms, so the whole ``alpha`` is spent over the planned looks
(``max_looks = ceil(max_duration / look_interval)``), look ``k`` of ``K`` spending ``alpha * ((k/K)^2 -
((k-1)/K)^2)`` (the Lan-DeMets power family with rho = 2: little at the first looks, where a canary with a few
tasks proves little, more at the last ones), three quarters of it on the failure-rate test and one quarter shared
equally by the exception types the canary raised. Each look's tests are held to their share, so by the union
bound (Bonferroni over looks and tests) the chance of a false rollback by failure rate is at most three quarters of
``alpha``, whatever the correlation between looks; the exception types' quarter is split over the types seen, whose
number is itself random, so that part of the bound is approximate. The looks share their data, which makes the
whole conservative (the bench measures at most 0.1 % false rollbacks with ``alpha`` 1 %). A Pocock boundary
would spend the same total with a slightly larger per-look level, at the price of assuming normal increments,
which a few failures among a few dozen tasks are not. A look past the planned ones (the run was resumed after
the end) spends ``alpha / look``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from celeryops.core.canary import CanarySettings, RevisionCounts
from celeryops.core.wording import duration
from celeryops.ops.run.analysis.stats import Rate, difference_bounds, fisher_greater, wilson, z_for

Verdict = Literal["continue", "promote", "rollback", "inconclusive"]
VERDICTS: tuple[Verdict, ...] = ("continue", "promote", "rollback", "inconclusive")
#: Which rule gave the verdict.
Rule = Literal["crashes", "new-exception", "failure-rate", "bound", "max-duration", ""]
SEARCH_CAP = 1_000_000  # the what-if searches look this many tasks ahead at most


@dataclass(frozen=True)
class Judgement:
    """One look's verdict with its statistic. ``reason``: one sentence. ``decide``: what would decide it (empty
    once decided). ``p_value``: the one-sided Fisher p-value of the failure-rate test and ``alpha_look`` the level
    it is held to at this look. ``increase``: canary rate minus baseline rate, with its Newcombe bounds
    ``increase_low``/``increase_high`` (``increase_high`` is the one-sided bound at ``confidence`` promotion uses).
    ``canary_rate``/``baseline_rate``: the rates with their two-sided Wilson intervals at ``confidence``.
    ``promote_after``: more canary tasks (at least) before it can promote, ``promote_failures``: how many of those
    may fail; ``rollback_after``: canary failures in a row that roll it back (None: none within reach)."""

    verdict: Verdict
    rule: Rule
    reason: str
    decide: str
    look: int
    max_looks: int
    elapsed: float
    canary_rate: Rate
    baseline_rate: Rate
    p_value: float
    alpha_look: float
    increase: float
    increase_low: float
    increase_high: float
    crashes: int = 0
    new_exceptions: tuple[str, ...] = ()
    promote_after: int | None = None
    promote_failures: int | None = None
    rollback_after: int | None = None
    settings: CanarySettings = field(default_factory=CanarySettings, repr=False, compare=False)

    @property
    def decided(self) -> bool:
        return self.verdict in ("promote", "rollback")

    def to_dict(self) -> dict[str, object]:
        """The statistic and the verdict, for the journal and the ``--json`` look event."""
        def rate(r: Rate) -> dict[str, object]:
            return {"failed": r.failed, "completed": r.total, "rate": r.value, "low": r.low, "high": r.high}
        return {
            "verdict": self.verdict, "rule": self.rule, "reason": self.reason, "decide": self.decide,
            "look": self.look, "max_looks": self.max_looks, "elapsed": self.elapsed,
            "canary": rate(self.canary_rate), "baseline": rate(self.baseline_rate),
            "p_value": self.p_value, "alpha_look": self.alpha_look, "increase": self.increase,
            "increase_low": self.increase_low, "increase_high": self.increase_high, "crashes": self.crashes,
            "new_exceptions": list(self.new_exceptions), "promote_after": self.promote_after,
            "promote_failures": self.promote_failures, "rollback_after": self.rollback_after,
        }


RHO = 2.0  # the power of the alpha spending function alpha * t^RHO (t: the fraction of the planned looks made)
RATE_SHARE = 0.75  # of each look's alpha, the failure-rate test's share; the rest is the exception types'


def look_alpha(look: int, settings: CanarySettings) -> float:
    """The false-rollback chance look ``look`` (1-based) may spend in all: ``alpha * ((k/K)^RHO -
    ((k-1)/K)^RHO)`` for look k of the K planned, ``alpha / look`` for a look past them."""
    k, big_k = look, settings.max_looks
    if k > big_k:
        return settings.alpha / k
    return settings.alpha * (math.pow(k / big_k, RHO) - math.pow((k - 1) / big_k, RHO))


def split_counts(by_revision: Mapping[str, RevisionCounts], canary: str,
                 baseline: Iterable[str]) -> tuple[RevisionCounts, RevisionCounts]:
    """``(baseline, canary)`` counts from the collector's counts by revision: the ``baseline`` revisions summed
    (an old pool may run more than one), the ``canary`` revision's own; other revisions and the unattributed
    ones (``""``) are left out."""
    old = sum((by_revision.get(r, RevisionCounts()) for r in dict.fromkeys(baseline) if r and r != canary),
              RevisionCounts())
    return old, by_revision.get(canary, RevisionCounts())


def alpha_for_look(look: int, settings: CanarySettings) -> float:
    """The level the failure-rate test of look ``look`` is held to: its share of :func:`look_alpha`."""
    return look_alpha(look, settings) * RATE_SHARE


def new_exception_types(baseline: RevisionCounts, canary: RevisionCounts, at_least: int,
                        alpha: float = 1.0) -> tuple[str, ...]:
    """Exception types that failed at least ``at_least`` canary tasks and no baseline task, sorted, and whose
    concentration on the canary is beyond chance: the type's one-sided Fisher p-value (its failures against every
    other completed task) is at most ``alpha`` shared by the types the canary raised (``alpha=1``: no test)."""
    raised = [t for t, n in canary.failed.items() if n > 0]
    level = alpha / max(1, len(raised))
    nc, nb = canary.completed, baseline.completed
    return tuple(sorted(
        t for t in raised
        if canary.failed[t] >= at_least and not baseline.failed.get(t)
        and fisher_greater(canary.failed[t], nc - canary.failed[t], 0, nb) <= level))


def judge(baseline: RevisionCounts, canary: RevisionCounts, *, crashes: int, look: int, elapsed: float,
          settings: CanarySettings, explain: bool = True) -> Judgement:
    """The verdict of look ``look`` (1-based) after ``elapsed`` seconds of canary, from the outcomes credited to
    the ``baseline`` (old) and ``canary`` (new) revisions and the canary instances' ``crashes``. Pure.
    ``explain=False`` leaves out what would decide it (``decide``, ``promote_after``, ...: a few searches over
    future counts), for simulations; the verdict is the same."""
    ignored = frozenset(settings.ignore_exceptions)
    base, can = baseline.without(ignored), canary.without(ignored)
    fc, nc, fb, nb = can.failures, can.completed, base.failures, base.completed
    alpha_look = alpha_for_look(look, settings)
    z_one = z_for(settings.confidence)
    p_value = fisher_greater(fc, nc - fc, fb, nb - fb)
    low, high = difference_bounds((fc, nc), (fb, nb), z_one)
    c_rate, b_rate = wilson(fc, nc, settings.confidence), wilson(fb, nb, settings.confidence)
    increase = c_rate.value - b_rate.value
    fresh = new_exception_types(base, can, settings.new_exception_count,
                                look_alpha(look, settings) * (1 - RATE_SHARE))
    base_j = Judgement("continue", "", "", "", look=look, max_looks=settings.max_looks, elapsed=elapsed,
                       canary_rate=c_rate, baseline_rate=b_rate, p_value=p_value, alpha_look=alpha_look,
                       increase=increase, increase_low=low, increase_high=high, crashes=crashes,
                       new_exceptions=fresh, settings=settings)
    rates = f"{_pct(c_rate.value)} of {nc} canary tasks failed against {_pct(b_rate.value)} of {nb} baseline tasks"

    if crashes >= settings.crash_limit:
        return replace(base_j, verdict="rollback", rule="crashes", reason=f"Roll back: the canary's instances "
                       f"crashed {crashes} times (the limit is {settings.crash_limit}).")
    if fresh:
        named = ", ".join(f"{t} ({can.failed[t]} times)" for t in fresh)
        return replace(base_j, verdict="rollback", rule="new-exception",
                       reason=f"Roll back: the canary raised {named}, which the baseline never raised.")
    if _rate_rollback(fc, nc, fb, nb, alpha_look, settings.min_effect):
        return replace(base_j, verdict="rollback", rule="failure-rate",
                       reason=f"Roll back: {rates}, an increase of {_pct(increase)} beyond chance "
                       f"(Fisher p = {p_value:.2g}, at most {alpha_look:.2g} at this look).")
    if nc >= settings.min_tasks and high < settings.margin:  # at any look, the last one (max_duration) too
        bound, tolerated = _versus(high, settings.margin)
        return replace(base_j, verdict="promote", rule="bound",
                       reason=f"Promote: {rates}; the increase is at most {bound} "
                       f"({_pct(settings.confidence)} confidence), below the tolerated {tolerated}.")

    over = elapsed >= settings.max_duration
    verdict: Verdict = "inconclusive" if over else "continue"
    head = f"Inconclusive after {duration(elapsed)}" if over else "Continue"
    tail = "; paused for the operator to promote or roll back." if over else "."
    pending = replace(base_j, verdict=verdict, rule="max-duration" if over else "",
                      reason=f"{head}: {rates}, {_pending(nc, high, settings)}{tail}")
    if not explain:
        return pending
    rollback_after = _rollback_after(fc, nc, fb, nb, alpha_look, settings.min_effect)
    promote_after, promote_failures = _promote_after(fc, nc, fb, nb, z_one, settings)
    decide = _promote_hint(promote_after, promote_failures, rollback_after)
    if not over:
        decide += f"; inconclusive in {duration(settings.max_duration - elapsed)} without a verdict"
    return replace(pending, decide=decide, promote_after=promote_after, promote_failures=promote_failures,
                   rollback_after=rollback_after)


# ----------------------------------------------------------------------------------------------- helpers


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def _versus(value: float, limit: float) -> tuple[str, str]:
    """``value`` and ``limit`` as percentages with the fewest decimals (one at least) that show them in their true
    order: 4.96 % against 5 % is "4.96 %" and "5.00 %", never "5.0 %" and "5.0 %"."""
    for places in range(1, 13):
        shown = round(value * 100, places), round(limit * 100, places)
        if (shown[0] < shown[1]) == (value < limit) and (shown[0] > shown[1]) == (value > limit):
            break
    return f"{value * 100:.{places}f} %", f"{limit * 100:.{places}f} %"


def _pending(nc: int, high: float, settings: CanarySettings) -> str:
    """Why it does not promote yet (the judge promotes once neither holds): too few canary tasks, or the bound of
    the increase not below the margin."""
    if nc < settings.min_tasks:
        return f"fewer than the {settings.min_tasks} canary tasks a promotion needs"
    bound, tolerated = _versus(high, settings.margin)
    return f"and the increase may still be up to {bound}, {'above' if high > settings.margin else 'equal to'} " \
           f"the tolerated {tolerated}"


def _rate_rollback(fc: int, nc: int, fb: int, nb: int, alpha_look: float, min_effect: float) -> bool:
    if nc == 0 or nb == 0 or fc / nc - fb / nb < min_effect:
        return False
    return fisher_greater(fc, nc - fc, fb, nb - fb) <= alpha_look


def _rollback_after(fc: int, nc: int, fb: int, nb: int, alpha_look: float, min_effect: float) -> int | None:
    """The fewest further canary failures in a row that roll it back by failure rate (None: not within reach)."""
    if nb == 0:
        return None
    def hit(d: int) -> bool:
        return _rate_rollback(fc + d, nc + d, fb, nb, alpha_look, min_effect)
    return _first(hit, 1, min(SEARCH_CAP, 10 * (nc + nb) + 100))


def _promote_after(fc: int, nc: int, fb: int, nb: int, z: float,
                   settings: CanarySettings) -> tuple[int | None, int | None]:
    """The fewest further canary tasks after which it promotes if none of them fails, and how many of that many
    may fail and still promote (the baseline as it is now)."""
    def bound_ok(f: int, n: int) -> bool:
        return n >= settings.min_tasks and difference_bounds((f, n), (fb, nb), z)[1] < settings.margin
    start = max(0, settings.min_tasks - nc)
    more = _first(lambda m: bound_ok(fc, nc + m), start, SEARCH_CAP)
    if more is None:
        return None, None
    allowed = _first(lambda f: not bound_ok(fc + f, nc + more), 1, more)
    return more, (more if allowed is None else allowed - 1)


def _promote_hint(more: int | None, failures: int | None, rollback_after: int | None) -> str:
    """What would decide it: ``more`` canary tasks of which at most ``failures`` fail promote (None: no count
    does), ``rollback_after`` failures in a row roll back."""
    parts = []
    if more is not None:
        some = "none of them fails" if not failures else f"at most {failures} of them fail"
        parts.append(f"promote after {more} more canary tasks if {some}")
    if rollback_after is not None:
        parts.append(f"roll back if the next {rollback_after} canary tasks fail")
    return "; ".join(parts) if parts else "no count of tasks decides it: the operator does"


def _first(pred: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The smallest ``x`` in ``[lo, hi]`` with ``pred(x)``, for a ``pred`` false then true (binary search)."""
    if lo > hi or not pred(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


__all__ = ["RATE_SHARE", "RHO", "VERDICTS", "Judgement", "Rule", "Verdict", "alpha_for_look", "judge", "look_alpha",
           "new_exception_types", "split_counts"]
