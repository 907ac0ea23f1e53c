"""The canary's look event from the judge's verdict and the collector's counts: what a canary strategy emits at
each look (``--json`` event ``canary_look``, :class:`celeryops.core.canarylook.CanaryLook`). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from celeryops.core.canary import CanarySettings, RevisionCounts
from celeryops.core.canarylook import CanaryLook, RevisionStats
from celeryops.ops.run.analysis.rules import Judgement, split_counts
from celeryops.ops.run.analysis.stats import summarize


def stats(counts: RevisionCounts, settings: CanarySettings) -> RevisionStats:
    """One side's counts as the look event carries them (ignored exception types left out, as the judge does)."""
    ignored = frozenset(settings.ignore_exceptions)
    summary = summarize(counts, settings.confidence, ignored)
    return RevisionStats(completed=summary.completed, failed=summary.failed, retried=summary.retried,
                         rate=summary.rate.value, low=summary.rate.low, high=summary.rate.high, p50=summary.p50,
                         p95=summary.p95, exceptions=dict(sorted(counts.without(ignored).failed.items())))


def look_event(judgement: Judgement, *, target: str, baseline: str, canary: str,
               by_revision: Mapping[str, RevisionCounts],
               by_task: Mapping[tuple[str, str], RevisionCounts] | None = None,
               baseline_revisions: Iterable[str] | None = None, paused: bool = False) -> CanaryLook:
    """The ``canary_look`` event of ``judgement``: ``baseline`` names the old revision (``baseline_revisions``: every
    old revision summed as the baseline, as :func:`~celeryops.ops.run.analysis.rules.split_counts` does; default
    ``baseline`` alone), ``canary`` the new one; ``by_revision`` and ``by_task`` are the collector's counts
    (:meth:`~celeryops.adapters.canaryevents.OutcomeCollector.counts` and ``counts_by_task``)."""
    settings = judgement.settings
    olds = tuple(baseline_revisions) if baseline_revisions is not None else (baseline,)
    old, new = split_counts(by_revision, canary, olds)
    names: dict[str, dict[str, RevisionCounts]] = {}
    for (revision, name), counts in (by_task or {}).items():
        names.setdefault(name, {})[revision] = counts
    tasks: dict[str, dict[str, RevisionStats]] = {}
    for name in sorted(names):
        t_old, t_new = split_counts(names[name], canary, olds)
        tasks[name] = {"baseline": stats(t_old, settings), "canary": stats(t_new, settings)}
    return CanaryLook(target=target, baseline=baseline, canary=canary, look=judgement.look,
                      max_looks=judgement.max_looks, elapsed=judgement.elapsed, max_duration=settings.max_duration,
                      verdict=judgement.verdict, rule=judgement.rule, reason=judgement.reason,
                      decide=judgement.decide, p_value=judgement.p_value, alpha_look=judgement.alpha_look,
                      increase=judgement.increase, increase_low=judgement.increase_low,
                      increase_high=judgement.increase_high,
                      counts={"baseline": stats(old, settings), "canary": stats(new, settings)}, tasks=tasks,
                      crashes=judgement.crashes, new_exceptions=judgement.new_exceptions,
                      promote_after=judgement.promote_after, promote_failures=judgement.promote_failures,
                      rollback_after=judgement.rollback_after, min_tasks=settings.min_tasks,
                      paused=paused or judgement.verdict == "inconclusive")


__all__ = ["look_event", "stats"]
