"""The canary strategy's pure parts (issue 28): the split that gives exact instance counts, the plan it journals,
what a resume reads back from the journal, and the refusals before anything is contacted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from celeryops.core.canary import CanarySettings, RevisionCounts, canary_split
from celeryops.core.config import Target
from celeryops.core.configload import load_config
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.demo.standins.cloudrun_instances import allocate
from celeryops.ops.journal import Record, Run
from celeryops.ops.run.pool.rules import Plan, pool_target
from celeryops.ops.run.strategies.canary import LOOK, VERDICT, Analysis, analysis_of


@given(st.integers(1, 99), st.integers(1, 99))
def test_the_canary_split_gives_exactly_the_counts(count: int, canary: int) -> None:
    """Cloud Run divides a worker pool's instances by percent (each its share rounded down, the rest to the largest
    remainders, as the stand-in does): the canary's split must come back as exactly N old + k new."""
    assume(count + canary <= 100)
    split = canary_split("old", "new", count, canary)
    assert sum(p for _, p in split) == 100 and all(0 < p < 100 for _, p in split)
    assert allocate(count + canary, split) == {"old": count, "new": canary}


def test_a_canary_plan_round_trips_through_the_journal_and_promotes_to_the_overlaps() -> None:
    plan = Plan(target="worker", old="w-1", new="w-2", count=4, image="img", beside=1)
    assert (plan.peak, plan.new_count, dict(plan.up_split)) == (5, 1, {"w-1": 80, "w-2": 20})
    assert Plan.from_payload(plan.payload()) == plan
    full = plan.promoted()
    assert (full.peak, full.new_count, dict(full.up_split)) == (8, 4, {"w-1": 50, "w-2": 50})
    # the peak named up front is the most the run can reach: the promotion's, or the canary's if it is larger
    assert plan.highest == full.highest == full.peak == 8
    assert replace(plan, beside=6).highest == 10 and Plan("worker", "w-1", "w-2", count=3).highest == 6
    overlap = Plan(target="worker", old="w-1", new="w-2", count=3)
    assert Plan.from_payload({k: v for k, v in overlap.payload().items() if k != "canary"}) == overlap  # older runs


def _run(*notes: dict[str, object]) -> Run:
    records = tuple(Record(seq=i, at=float(i), kind="note", payload=dict(n)) for i, n in enumerate(notes, 1))
    return Run(id="r1", fleet="f", broker="redis://x", user="u", host="h", pid=1, release="release/2",
               settings={"strategy": "canary"}, created=0.0, updated=0.0, phase="overlapping", outcome=None,
               records=records)


def test_a_resume_reads_the_last_looks_counts_and_the_verdict_written_ahead() -> None:
    first = Analysis(look=1, elapsed=30.0, by_revision={"w-1": RevisionCounts(succeeded=9),
                                                        "w-2": RevisionCounts(succeeded=2, failed={"KeyError": 1})})
    second = Analysis(look=2, elapsed=60.5, crashed={"celery@w-2.ab12cd34"},
                      by_revision={"w-1": RevisionCounts(succeeded=20), "w-2": RevisionCounts(succeeded=5)},
                      by_task={("w-2", "app.export"): RevisionCounts(succeeded=5)})
    found = analysis_of(_run({**first.note(), "verdict": "continue"}, {"resumed_by": "ana"},
                             {**second.note(), "verdict": "continue"}))
    assert (found.look, found.elapsed, found.crashed, found.verdict) == (2, 60.5, {"celery@w-2.ab12cd34"}, None)
    assert found.by_revision == second.by_revision and found.by_task == second.by_task
    decided = analysis_of(_run({**second.note(), "verdict": "rollback"}, {VERDICT: "rollback", "rule": "crashes"}))
    assert decided.verdict == "rollback"
    assert analysis_of(_run({"resumes": "x"})) == Analysis()


def test_a_resumed_inconclusive_canary_is_judged_for_another_max_duration() -> None:
    settings = CanarySettings(max_duration=600.0, look_interval=30.0)
    stopped = analysis_of(_run({LOOK: 20, "elapsed": 601.0, "counts": {}, "verdict": "inconclusive"}))
    assert stopped.budget(settings).max_duration == 1201.0
    going = analysis_of(_run({LOOK: 3, "elapsed": 90.0, "counts": {}, "verdict": "continue"}))
    assert going.budget(settings) == settings


def test_canary_settings_round_trip_as_journaled() -> None:
    settings = CanarySettings(min_tasks=7, max_duration=60.0, ignore_exceptions=("Reject",))
    assert CanarySettings.from_dict(settings.to_dict()) == settings
    assert CanarySettings.from_dict({"min_tasks": 3, "unknown": 1}) == CanarySettings(min_tasks=3)


def test_a_canary_on_a_service_is_refused_in_one_sentence(tmp_path: Path) -> None:
    service = Target(name="web", kind="cloudrun-service", project="p", region="r", resource="web", image="i")
    with pytest.raises(UserError) as err:
        pool_target((service,), "canary")
    assert err.value.exit_code == EXIT_USAGE
    assert str(err.value).startswith("The canary strategy is refused: target 'web' is a Cloud Run service")
    pool = Target(name="pool", kind="cloudrun-worker-pool", project="p", region="r", resource="pool", image="i")
    with pytest.raises(UserError) as err:
        pool_target((pool, pool), "canary")
    assert str(err.value).startswith("A canary deploy moves one worker pool at a time")
    (tmp_path / "celeryops.toml").write_text('[[targets]]\nname = "web"\nkind = "cloudrun-service"\nproject = "p"\n'
                                             'region = "r"\nresource = "web"\nimage = "i:{sha}"\n'
                                             'strategy = "canary"\n', encoding="utf-8")
    with pytest.raises(UserError) as err:
        load_config(None, tmp_path, {}, {})
    assert 'strategy = "canary" is refused' in str(err.value) and err.value.exit_code == EXIT_USAGE
