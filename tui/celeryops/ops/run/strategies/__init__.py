"""The deploy strategies, by name: :data:`STRATEGIES` is the only switch between them (a target's ``strategy``,
``celeryops deploy --strategy``, a run's recorded ``strategy``). Each is a module of its own implementing
:class:`~celeryops.ops.run.strategies.base.Strategy`; adding one is a module and a line here (and its name in
:data:`celeryops.core.config.STRATEGIES`, the config schema's list, which a test keeps equal to this one)."""

from __future__ import annotations

from celeryops.core.config import Target
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.ops.journal import Run
from celeryops.ops.run.strategies.base import Choice, Strategy
from celeryops.ops.run.strategies.canary import CanaryStrategy
from celeryops.ops.run.strategies.drain import DrainStrategy
from celeryops.ops.run.strategies.overlap import OverlapStrategy

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (DrainStrategy(), OverlapStrategy(), CanaryStrategy())}


def strategy_named(name: str) -> Strategy:
    found = STRATEGIES.get(name)
    if found is None:
        raise UserError(f"{name!r} is not a deploy strategy this version knows: nothing was changed; use one of "
                        f"{', '.join(STRATEGIES)}.", EXIT_USAGE)
    return found


def strategy_of_run(run: Run) -> Strategy:
    """The strategy ``run`` was started with (its journal's ``strategy``)."""
    found = STRATEGIES.get(run.strategy)
    if found is None:
        raise UserError(f"Run {run.id} was started with the {run.strategy!r} strategy, which this version does not "
                        "know: nothing was changed; finish it with the version that started it.", EXIT_USAGE)
    return found


def strategy_of_targets(targets: tuple[Target, ...]) -> Strategy:
    """The strategy a deploy of ``targets`` runs: theirs when they share one; else the first that is not the drain
    (which refuses more than its one worker pool in its own words)."""
    names = [t.strategy for t in targets]
    chosen = next((n for n in names if n != "drain"), "drain")
    return strategy_named(chosen)


__all__ = ["STRATEGIES", "Choice", "Strategy", "strategy_named", "strategy_of_run", "strategy_of_targets"]
