"""An overlap or canary deploy of a pool split between celeryops' own cohorts (issue 36 item 4), pure: the plan from
several old revisions (each kept at its exact count until they are drained, then every instance on the new one),
its journal record, and the rule that tells the autoscaler's cohorts apart from a split pinned by hand (the Cloud
console, gcloud): the split celeryops recorded on the resource, and the counts the fleet's journal or the
autoscaler's published status say celeryops set last. No I/O."""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from celeryops.adapters.deploy.base import RolloutState
from celeryops.core.splits import counts_of, exact_split
from celeryops.ops.fleetwide.scalestatus import ScaleStatus
from celeryops.ops.journal import DEPLOY_START, OVERLAP_CUTOVER, OVERLAP_REVERT, OVERLAP_UP, SCALE_POOL, Phase, Run
from celeryops.ops.run.pool.cohorts import counts_left, own_cohorts
from celeryops.ops.run.pool.rules import Plan, PoolNow, decide, progress_of
from test_overlap_rules import Records

OLD, COHORT, NEW = "worker-00001-old", "worker-as0101-beef", "worker-abc1234-cafe"
COHORTS = ((OLD, 2), (COHORT, 1))
PLAN = Plan(target="worker", old=OLD, new=NEW, count=3, image="img:new", cohorts=COHORTS)


def state(counts: dict[str, int], *, owned: bool = True, count: int | None = None) -> RolloutState:
    """The pool asking for (and serving) the exact split of ``counts``, recorded as celeryops' own or not."""
    split = exact_split(counts)
    return RolloutState(resource="worker", traffic=split, traffic_statuses=split,
                        instance_count=sum(counts.values()) if count is None else count,
                        owned_split=split if owned else ())


def run_of(rec: Records, phase: Phase, *, kind: str = "", target: str = "worker") -> Run:
    made = rec.run(phase)
    settings: dict[str, Any] = {**made.settings, "targets": [target]}
    if kind:
        settings["kind"] = kind
    return Run(**{**made.__dict__, "settings": settings, "id": f"r-{kind or 'deploy'}-{phase}"})


def step(after: dict[str, int], *, settled: bool | None = True, phase: Phase = "done") -> Run:
    """An autoscale step that set the pool to ``after``."""
    rec = Records()
    seq = rec.intent(SCALE_POOL, {"target": "worker", "after": after, "before": {}, "count": sum(after.values())})
    if settled is not None:
        rec.settle(seq, settled)
    return run_of(rec, phase, kind="autoscale")


# -- the plan ------------------------------------------------------------------------------------------------------


def test_a_plan_from_cohorts_keeps_each_old_revision_at_its_count_beside_the_new_one() -> None:
    assert PLAN.olds == {OLD: 2, COHORT: 1} and PLAN.revisions == (OLD, COHORT, NEW)
    assert PLAN.up_counts == {OLD: 2, COHORT: 1, NEW: 3} and PLAN.peak == 6
    assert counts_of(PLAN.peak, PLAN.up_split) == PLAN.up_counts  # Cloud Run's division gives them back exactly
    assert counts_of(PLAN.count, PLAN.back_split) == PLAN.olds
    assert PLAN.old_names == f"{OLD} and {COHORT}"
    canary = Plan(target="worker", old=OLD, new=NEW, count=3, image="img:new", cohorts=COHORTS, beside=1)
    assert canary.up_counts == {OLD: 2, COHORT: 1, NEW: 1} and canary.promoted().up_counts == PLAN.up_counts


def test_the_journal_record_brings_the_cohorts_back_and_leaves_a_plan_of_one_revision_as_it_was() -> None:
    assert Plan.from_payload(PLAN.payload()) == PLAN
    one = Plan(target="worker", old=OLD, new=NEW, count=2, image="img:new")
    assert "cohorts" not in one.payload()  # a journal of one old revision is written as before
    assert one.up_split == ((OLD, 50), (NEW, 50)) and one.back_split == ((OLD, 100),)
    assert Plan.from_payload(one.payload()) == one


@given(st.lists(st.integers(1, 20), min_size=2, max_size=5), st.integers(0, 3))
def test_every_plan_from_cohorts_is_exact_at_the_peak_and_on_the_way_back(sizes: list[int], beside: int) -> None:
    assume(2 * sum(sizes) <= 100)
    cohorts = tuple((f"worker-as{i:04d}-beef", n) for i, n in enumerate(sizes))
    plan = Plan(target="worker", old=cohorts[0][0], new=NEW, count=sum(sizes), cohorts=cohorts, beside=beside)
    assert counts_of(plan.peak, plan.up_split) == plan.up_counts
    promoted = plan.promoted()
    assert counts_of(promoted.peak, promoted.up_split) == promoted.up_counts
    assert plan.highest == max(plan.peak, promoted.peak)  # a canary of more instances than the pool peaks first
    assert counts_of(plan.count, plan.back_split) == plan.olds


def test_the_old_cohorts_workers_stopped_are_the_old_ones_and_recovery_names_them() -> None:
    rec = Records()
    rec.settle(rec.intent(OVERLAP_UP, PLAN.payload()))
    rec.intent("cancel_consumers", {"stop": {"celery@a": ["q"], "celery@b": ["q"]}, "before": {},
                                    "revision": OLD, "revisions": [OLD, COHORT]})
    run = rec.run("draining")
    assert set(progress_of(run).old_stopped) == {"celery@a", "celery@b"}
    up = PoolNow(reconciling=False, count=6, served=dict(PLAN.up_split), revisions={NEW: "succeeded"})
    decided = decide(run, up, resume=False)
    assert decided.step == "retire" and f"{OLD} and {COHORT}" in decided.explanation
    assert decide(run, up, resume=True).step == "drain_old"
    assert PoolNow(reconciling=False, count=3, served=dict(PLAN.back_split)).serves_exactly(PLAN.olds)


# -- celeryops' own cohorts, or a split pinned by hand --------------------------------------------------------------


def test_the_autoscalers_last_step_makes_the_split_celeryops_own_cohorts() -> None:
    counts = {OLD: 2, COHORT: 1}
    assert own_cohorts(state(counts), "worker", [step(counts)]) == counts


def test_a_split_edited_by_hand_is_not_celeryops_own_even_with_the_same_journal() -> None:
    """The Cloud console or gcloud changed the split: it is no longer the one celeryops recorded on the resource."""
    counts = {OLD: 2, COHORT: 1}
    assert own_cohorts(state(counts, owned=False), "worker", [step(counts)]) is None


def test_counts_that_differ_from_what_celeryops_set_last_are_not_its_cohorts() -> None:
    """Someone else resized the pool (3 -> 4 with the same split): the counts are not the autoscaler's."""
    counts = {OLD: 2, COHORT: 1}
    resized = state(counts, count=4)
    assert own_cohorts(resized, "worker", [step(counts)]) is None


def test_the_newest_run_that_set_the_pools_counts_decides() -> None:
    counts = {OLD: 2, COHORT: 1}
    rec = Records()
    rec.settle(rec.intent(DEPLOY_START, {"target": "worker"}))
    drain_deploy = run_of(rec, "done")
    assert own_cohorts(state(counts), "worker", [drain_deploy, step(counts)]) is None  # newest first
    assert own_cohorts(state(counts), "worker", [step(counts), drain_deploy]) == counts
    other = run_of(Records(), "done", target="other")  # another target's run, or a run that changed nothing
    assert own_cohorts(state(counts), "worker", [other, step(counts)]) == counts
    failed = step({OLD: 1, COHORT: 1, "worker-as0202-dead": 1}, settled=False, phase="aborted")
    assert own_cohorts(state(counts), "worker", [failed, step(counts)]) == counts


def test_a_retirement_back_to_the_cohorts_leaves_them_celeryops_own() -> None:
    rec = Records()
    rec.settle(rec.intent(OVERLAP_UP, PLAN.payload()))
    rec.settle(rec.intent(OVERLAP_REVERT, PLAN.payload(split=[list(e) for e in PLAN.back_split])))
    retired = run_of(rec, "aborted")
    assert counts_left(retired, "worker") == PLAN.olds
    assert own_cohorts(state(PLAN.olds), "worker", [retired]) == PLAN.olds
    rec.settle(rec.intent(OVERLAP_CUTOVER, PLAN.payload()))
    assert counts_left(run_of(rec, "done"), "worker") == {NEW: 3}


def test_a_step_followed_to_its_end_by_recovery_counts_without_a_settle() -> None:
    counts = {OLD: 2, COHORT: 1}
    assert counts_left(step(counts, settled=None, phase="done"), "worker") == counts
    assert counts_left(step(counts, settled=None, phase="aborted"), "worker") is None


def test_the_published_status_of_a_running_autoscaler_is_evidence_when_the_journal_has_none() -> None:
    counts = {OLD: 2, COHORT: 1}
    cohorts = tuple({"revision": rev, "count": n} for rev, n in counts.items())
    published = ScaleStatus(fleet="f", target="worker", state="running", cohorts=cohorts)
    assert own_cohorts(state(counts), "worker", [], published) == counts
    left_alone = ScaleStatus(fleet="f", target="worker", state="running", cohorts=cohorts,
                             message="Someone else changed the pool")
    assert own_cohorts(state(counts), "worker", [], left_alone) is None
    assert own_cohorts(state(counts), "worker", [], None) is None
    assert own_cohorts(state({OLD: 3}), "worker", [step({OLD: 3})]) is None  # one revision: no cohorts to move
