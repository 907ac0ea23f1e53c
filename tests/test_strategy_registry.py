"""The strategy registry is the only switch: every strategy the config accepts is registered, each implements the
protocol, and a run's recorded strategy finds its implementation (or one clear sentence)."""

from __future__ import annotations

import pytest

from celeryops.core.config import STRATEGY_KINDS, STRATEGY_NAMES
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.ops.journal import Run
from celeryops.ops.run.strategies import STRATEGIES, strategy_named, strategy_of_run
from celeryops.ops.run.strategies.base import Strategy


def test_every_configurable_strategy_is_registered_and_nothing_else() -> None:
    assert tuple(STRATEGIES) == STRATEGY_NAMES == tuple(STRATEGY_KINDS)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_each_strategy_implements_the_protocol(name: str) -> None:
    strategy: Strategy = STRATEGIES[name]
    assert strategy.name == name
    for method in ("check_targets", "deploy", "check_rollback", "rollback_checks", "rollback", "resume", "abort",
                   "recovery_plan", "choices", "said", "peak"):
        assert callable(getattr(strategy, method))
    assert isinstance(strategy.decisions, tuple) and isinstance(strategy.demo, str)


def test_an_unknown_strategy_is_one_sentence_exit_2() -> None:
    with pytest.raises(UserError) as err:
        strategy_named("bluegreen")
    assert err.value.exit_code == EXIT_USAGE and "nothing was changed" in str(err.value)


def test_a_run_of_an_unknown_strategy_is_refused_in_one_sentence() -> None:
    run = Run(id="r1", fleet="f", broker="redis://x", user="u", host="h", pid=1, release="release/1",
              settings={"strategy": "bluegreen"}, created=0.0, updated=0.0, phase="overlapping", outcome=None)
    with pytest.raises(UserError) as err:
        strategy_of_run(run)
    assert "bluegreen" in str(err.value) and err.value.exit_code == EXIT_USAGE


@pytest.mark.parametrize("name", ["overlap", "canary"])
def test_a_pool_rollback_run_is_offered_as_a_rollback(name: str) -> None:
    """An interrupted rollback of a pool (the overlap's way back, whatever the target's strategy) is told as one in
    the recovery view, not as its strategy's deploy."""
    run = Run(id="r2", fleet="f", broker="redis://x", user="u", host="h", pid=1, release="worker-00001-abc",
              settings={"strategy": name, "kind": "rollback", "targets": ["worker"]}, created=0.0, updated=0.0,
              phase="overlapping", outcome=None)
    strategy = strategy_of_run(run)
    decided = strategy.recovery_plan(run)
    labels = [c.label for c in strategy.choices(run, decided)]
    assert labels[0] == "Resume the rollback" and strategy.said("rollback", None).question == "Start the overlap " \
        "rollback?", labels
