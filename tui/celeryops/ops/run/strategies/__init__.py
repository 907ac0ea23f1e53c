"""The deploy strategies, by name: :data:`STRATEGIES` is the only switch between them (a target's ``strategy``,
``celeryops deploy`` / ``rollback --strategy``, a run's recorded ``strategy``), and this package is the only way in:
nothing outside it imports a strategy module (an import-linter contract). Each is a module of its own implementing
:class:`~celeryops.ops.run.strategies.base.Strategy`, its deploys, rollbacks and recovery and what the CLI and the
console say about them; adding one is a module and a line here (and its name and target kinds in
:data:`celeryops.core.config.STRATEGY_KINDS`, the config schema, which a test keeps equal to this registry)."""

from __future__ import annotations

from celeryops.core.config import DEFAULT_STRATEGY, Target
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.events import RunKind
from celeryops.ops.journal import Run
from celeryops.ops.run.strategies.base import Choice, Said, Strategy
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
    chosen = next((n for n in names if n != DEFAULT_STRATEGY), DEFAULT_STRATEGY)
    return strategy_named(chosen)


def said_of(name: str, kind: RunKind, release: str | None) -> Said:
    """What the console says before a ``kind`` run of strategy ``name`` starts (a drain-only run names none: the
    default strategy's words; so does a name this version does not know)."""
    return (STRATEGIES.get(name) or STRATEGIES[DEFAULT_STRATEGY]).said(kind, release)


__all__ = ["STRATEGIES", "Choice", "Said", "Strategy", "said_of", "strategy_named", "strategy_of_run",
           "strategy_of_targets"]
