"""The canary's decision function alone (``celeryops.ops.run.analysis.rules.judge``), seeded: how often it rolls back,
promotes or gives up on a release as good as the old one and on one that fails 20 % of its tasks on top, at a low
and a realistic task rate.

Model: a worker pool of ``--old`` instances of the old revision plus the canary's instance(s) (the ``[canary]``
defaults: 1 instance), tasks arriving at random (Poisson) at ``rate`` per second over the whole pool, each run by
any instance alike (so the canary gets ``instances / (old + instances)`` of them). The old revision fails
``--base`` of its tasks (2 %), with exception types drawn from a fixed mix (ConnectionError, TimeoutError,
ValueError: a rare one too). The identical release fails the same way; the bad release fails 20 % more of its tasks
(22 %), with the same mix of exception types, so only the failure-rate test can catch it (not the new-exception
rule). Every ``look_interval`` the judge looks at the counts so far; the first promote or rollback ends the run;
at ``max_duration`` without one the run is inconclusive. Each run has its own seed (``--seed`` + run number).

Targets (issue 28): identical release rolled back <= 1 %, bad release rolled back >= 99 %, at both rates.

Usage: .venv/bin/python bench/bench_canary_rules.py [--runs 300] [--seed 1] [--rates 0.5,5]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass

from celeryops.core.canary import CanarySettings, RevisionCounts
from celeryops.ops.run.analysis.rules import judge
from common import table

EXCEPTIONS = (("ConnectionError", 0.55), ("TimeoutError", 0.40), ("ValueError", 0.05))


@dataclass(frozen=True)
class Outcome:
    verdict: str
    seconds: float
    canary_tasks: int


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw: Knuth's product of uniforms for small means, the normal approximation above 500."""
    if mean > 500:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def exception(rng: random.Random) -> str:
    x = rng.random()
    for name, share in EXCEPTIONS:
        if x < share:
            return name
        x -= share
    return EXCEPTIONS[-1][0]


class Tally:
    def __init__(self) -> None:
        self.succeeded = 0
        self.failed: Counter[str] = Counter()

    def add(self, rng: random.Random, tasks: int, rate: float) -> None:
        for _ in range(tasks):
            if rng.random() < rate:
                self.failed[exception(rng)] += 1
            else:
                self.succeeded += 1

    def counts(self) -> RevisionCounts:
        return RevisionCounts(self.succeeded, dict(self.failed))


def one_run(seed: int, rate: float, base: float, canary_rate: float, old: int, settings: CanarySettings) -> Outcome:
    rng = random.Random(seed)
    share = settings.instances / (old + settings.instances)
    baseline, canary = Tally(), Tally()
    look, elapsed = 0, 0.0
    while True:
        step = min(settings.look_interval, settings.max_duration - elapsed)
        baseline.add(rng, poisson(rng, rate * (1 - share) * step), base)
        canary.add(rng, poisson(rng, rate * share * step), canary_rate)
        look, elapsed = look + 1, elapsed + step
        verdict = judge(baseline.counts(), canary.counts(), crashes=0, look=look, elapsed=elapsed,
                        settings=settings, explain=False)
        if verdict.verdict != "continue":
            return Outcome(verdict.verdict, elapsed, canary.counts().completed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rates", default="0.5,5", help="tasks per second over the whole pool")
    parser.add_argument("--old", type=int, default=4, help="instances of the old revision")
    parser.add_argument("--base", type=float, default=0.02, help="the old revision's failure rate")
    parser.add_argument("--extra", type=float, default=0.20, help="the bad release's failure rate on top")
    args = parser.parse_args()
    settings = CanarySettings()
    print(f"[canary] defaults: min_tasks={settings.min_tasks}, max_duration={settings.max_duration:.0f} s, "
          f"instances={settings.instances}, margin={settings.margin}, min_effect={settings.min_effect}, "
          f"alpha={settings.alpha} spent over {settings.max_looks} looks, "
          f"confidence={settings.confidence}, look_interval={settings.look_interval:.0f} s; pool: {args.old} old + "
          f"{settings.instances} canary; base failure rate {args.base:.0%}; {args.runs} seeded runs per row")
    rows: list[list[str]] = []
    misses: list[str] = []
    started = time.perf_counter()
    for rate in (float(r) for r in args.rates.split(",")):
        for release, canary_rate in (("identical", args.base), (f"+{args.extra:.0%} failures", args.base + args.extra)):
            outcomes = [one_run(args.seed + i, rate, args.base, canary_rate, args.old, settings)
                        for i in range(args.runs)]
            share = Counter(o.verdict for o in outcomes)
            decided = [o for o in outcomes if o.verdict in ("promote", "rollback")] or outcomes
            pct = {v: 100 * share[v] / len(outcomes) for v in ("rollback", "promote", "inconclusive")}
            rows.append([f"{rate:g}/s", release, f"{pct['rollback']:.1f} %", f"{pct['promote']:.1f} %",
                         f"{pct['inconclusive']:.1f} %", f"{statistics.median(o.canary_tasks for o in decided):.0f}",
                         f"{statistics.median(o.seconds for o in decided):.0f} s"])
            if release == "identical" and pct["rollback"] > 1.0:
                misses.append(f"identical release at {rate:g}/s rolled back {pct['rollback']:.1f} % (target <= 1 %)")
            if release != "identical" and pct["rollback"] < 99.0:
                misses.append(f"bad release at {rate:g}/s rolled back {pct['rollback']:.1f} % (target >= 99 %)")
    print(table(["pool rate", "release", "rollback", "promote", "inconclusive", "median canary tasks",
                 "median time"], rows))
    print("median canary tasks / time: to the verdict, over the runs that promoted or rolled back (all runs when "
          f"none did); {time.perf_counter() - started:.1f} s of simulation")
    for miss in misses:
        print("MISSED:", miss)
    return 0


if __name__ == "__main__":
    sys.exit(main())
