"""One seam for an open run's life (issue 35, for runs that no strategy owns): the session resumes and aborts every
run through :func:`celeryops.ops.run.kinds.owner_of`, which gives a kind registered in ``RUN_KINDS`` (a drain alone,
a step of the autoscaler) to its own module and every other run to its strategy; the session and the pure recovery
rules compare no run kind (found by reading them as Python)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.ops.journal import CANCEL_CONSUMERS, SCALE_POOL, Phase, Record, Run
from celeryops.ops.run.kinds import RUN_KINDS, DrainAlone, Strategic, owner_of, planner_of
from celeryops.ops.run.recovery import plan
from celeryops.ops.run.scaling import ScalingSteps
from celeryops.ops.run.strategies import STRATEGIES

RUN = Path(__file__).resolve().parents[1] / "tui" / "celeryops" / "ops" / "run"


def run_of(settings: dict[str, Any], *, release: str | None = None, phase: Phase = "draining",
           records: tuple[Record, ...] = ()) -> Run:
    return Run(id="r1", fleet="f", broker="redis://x", user="u", host="h", pid=1, release=release,
               settings=settings, created=0.0, updated=0.0, phase=phase, outcome=None, records=records)


def kind_comparisons(source: str) -> list[int]:
    """The lines of comparisons whose one side reads a ``kind`` (``run.kind == "autoscale"``, ``kind in (...)``)."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Compare)
            and any(ast.unparse(side).rsplit(".", 1)[-1] == "kind" for side in [node.left, *node.comparators])]


@pytest.mark.parametrize("module", ["session.py", "recovery.py"])
def test_the_session_and_the_recovery_rules_compare_no_run_kind(module: str) -> None:
    assert kind_comparisons((RUN / module).read_text()) == []


def test_the_scan_finds_what_it_looks_for() -> None:
    source = "if run.kind == 'autoscale': pass\nif kind in ('a', 'b'): pass\nif run.phase == 'x': pass\n"
    assert kind_comparisons(source) == [1, 2]


def test_each_run_kind_is_owned_by_its_module_and_the_rest_by_their_strategy() -> None:
    assert isinstance(owner_of(run_of({"kind": "autoscale", "strategy": "drain"})), ScalingSteps)
    alone = owner_of(run_of({}))  # a drain with no release
    assert isinstance(alone, DrainAlone) and alone.strategy is STRATEGIES["drain"]
    for name in STRATEGIES:
        owner = owner_of(run_of({"strategy": name}, release="demo-2"))
        assert isinstance(owner, Strategic) and owner.strategy is STRATEGIES[name]
        assert owner_of(run_of({"strategy": name, "kind": "rollback"}, release="r")) == owner
    for owner in RUN_KINDS.values():
        for method in ("resume", "abort", "recovery_plan", "choices"):
            assert callable(getattr(owner, method))


def test_an_unknown_strategy_is_refused_to_resume_but_planned_as_the_default() -> None:
    run = run_of({"strategy": "bluegreen"}, release="demo-2", phase="overlapping")
    with pytest.raises(UserError) as err:
        owner_of(run)
    assert err.value.exit_code == EXIT_USAGE
    assert planner_of(run).recovery_plan(run).action == "nothing"


def test_an_interrupted_autoscale_step_is_planned_and_offered_by_its_own_module() -> None:
    stop = Record(seq=1, at=1.0, kind="intent", intent=CANCEL_CONSUMERS,
                  payload={"stop": {"celery@w1": ["q"]}, "before": {"celery@w1": ["q"]}, "revision": "worker-as01"})
    sent = Record(seq=2, at=2.0, kind="intent", intent=SCALE_POOL, payload={"after": {}})
    run = run_of({"kind": "autoscale", "strategy": "drain", "revision": "worker-as01", "targets": ["worker"]},
                 phase="scaling", records=(stop, sent))
    owner = planner_of(run)
    decided = owner.recovery_plan(run)
    assert decided.action == "restore" and decided.restore == {"celery@w1": ["q"]}
    assert decided.explanation.startswith(f"Autoscale step {run.id} was interrupted in scaling")
    assert "its pool update was sent" in decided.explanation
    assert [c.action for c in owner.choices(run, decided)] == ["abort", "resume"]
    ended = run_of({"kind": "autoscale"}, phase="done")
    assert owner.recovery_plan(ended) == plan(ended, None)  # an ended step: the runner's rules, like any run
