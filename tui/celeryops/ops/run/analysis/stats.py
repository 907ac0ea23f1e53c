"""The statistics a canary is judged by, in pure Python (no scipy in the product): Fisher's exact test (one-sided,
in log space with ``math.lgamma``), Wilson score intervals of a failure rate, Newcombe's hybrid score interval of
the difference of two rates, and runtime percentiles. No I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from celeryops.core.canary import RevisionCounts


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_greater(a: int, b: int, c: int, d: int) -> float:
    """One-sided Fisher's exact test of the 2x2 table ``[[a, b], [c, d]]`` (rows: canary, baseline; columns:
    failed, succeeded): the chance, with both rows drawn from one failure rate and the margins fixed, of the
    canary having ``a`` failures or more. Small when the canary fails more often than the baseline beyond chance.

    Under that null hypothesis the canary's failures follow the hypergeometric law (``a + b`` draws from
    ``a + b + c + d`` tasks, of which ``a + c`` failed); its tail is summed in log space, so the value is exact
    to float precision also for tables of 10^5 tasks."""
    if min(a, b, c, d) < 0:
        raise ValueError("a 2x2 table holds counts >= 0")
    n_canary, failed, total = a + b, a + c, a + b + c + d
    hi = min(n_canary, failed)
    if a > hi:
        return 0.0
    lo = max(0, n_canary - (total - failed))
    if a <= lo:
        return 1.0
    denom = _log_comb(total, n_canary)

    def tail(xs: range) -> float:
        terms = [_log_comb(failed, x) + _log_comb(total - failed, n_canary - x) - denom for x in xs]
        top = max(terms)
        return math.exp(top) * math.fsum(math.exp(t - top) for t in terms)

    # sum the shorter side: a p-value near 1 is 1 minus a small lower tail (fewer terms, less rounding)
    if a - lo < hi - a + 1:
        return min(1.0, max(0.0, 1.0 - tail(range(lo, a))))
    return min(1.0, tail(range(a, hi + 1)))


def z_for(confidence: float) -> float:
    """The standard normal quantile of ``confidence`` (one-sided: 0.95 -> 1.645)."""
    return NormalDist().inv_cdf(confidence)


@dataclass(frozen=True)
class Rate:
    """A failure rate ``failed / total`` with its Wilson score interval ``[low, high]`` (``total`` 0: 0 in
    ``[0, 1]``)."""

    failed: int
    total: int
    low: float
    high: float

    @property
    def value(self) -> float:
        return self.failed / self.total if self.total else 0.0


def wilson(failed: int, total: int, confidence: float = 0.95) -> Rate:
    """The failure rate and its two-sided Wilson score interval at ``confidence`` (0.95: the 2.5 % and 97.5 %
    bounds). Unlike the normal approximation it stays inside [0, 1] and is honest at 0 or ``total`` failures."""
    return _wilson(failed, total, z_for(0.5 + confidence / 2))


def _wilson(failed: int, total: int, z: float) -> Rate:
    if not 0 <= failed <= total:
        raise ValueError("need 0 <= failed <= total")
    if total == 0:
        return Rate(0, 0, 0.0, 1.0)
    p = failed / total
    z2 = z * z
    centre = (p + z2 / (2 * total)) / (1 + z2 / total)
    half = z / (1 + z2 / total) * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total))
    low = 0.0 if failed == 0 else max(0.0, min(p, centre - half))  # exact at the edges, whatever the rounding
    high = 1.0 if failed == total else min(1.0, max(p, centre + half))
    return Rate(failed, total, low, high)


def difference_bounds(canary: tuple[int, int], baseline: tuple[int, int], z: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval (his method 10) of ``canary rate - baseline rate``, each ``(failed,
    total)``, built from Wilson intervals at ``z``: ``(low, high)``. With ``z`` of a one-sided level, ``high`` is
    the one-sided upper bound. A baseline with no task counts as rate 0 known exactly (then ``high`` is the
    canary's own upper bound: the most cautious reading, since a rate is never below 0)."""
    c = _wilson(canary[0], canary[1], z)
    if baseline[1] == 0:
        return c.low - 1.0, c.high
    b = _wilson(baseline[0], baseline[1], z)
    diff_point = c.value - b.value
    low = diff_point - math.sqrt((c.value - c.low) ** 2 + (b.high - b.value) ** 2)
    high = diff_point + math.sqrt((c.high - c.value) ** 2 + (b.value - b.low) ** 2)
    return max(-1.0, low), min(1.0, high)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values`` by linear interpolation between the closest ranks (numpy's
    default); None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class RevisionSummary:
    """What the console shows of one revision (or one task name of it): completed and failed tasks, the failure
    rate with its Wilson interval, retries, and the runtime p50/p95 of the succeeded tasks (None: none yet)."""

    completed: int
    failed: int
    retried: int
    rate: Rate
    p50: float | None
    p95: float | None


def summarize(counts: RevisionCounts, confidence: float = 0.95,
              ignore: tuple[str, ...] | frozenset[str] = ()) -> RevisionSummary:
    """The console's line for ``counts`` (failures of the ``ignore`` types left out, as the judge does)."""
    judged = counts.without(ignore)
    return RevisionSummary(judged.completed, judged.failures, judged.retried,
                           wilson(judged.failures, judged.completed, confidence),
                           percentile(judged.runtimes, 50), percentile(judged.runtimes, 95))


__all__ = ["Rate", "RevisionSummary", "difference_bounds", "fisher_greater", "percentile", "summarize", "wilson",
           "z_for"]
