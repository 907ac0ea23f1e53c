"""The overlap deploy's recovery rules (issue 19), pure: each row of the README's table, from a run's records and
what the pool reports, for ``abort`` and ``resume``. No I/O."""

from __future__ import annotations

from typing import Any

import pytest

from celeryops.fence import FenceRecord
from celeryops.ops.journal import (
    ADD_CONSUMERS,
    CANCEL_CONSUMERS,
    OVERLAP_CUTOVER,
    OVERLAP_REVERT,
    OVERLAP_UP,
    Phase,
    Record,
    Run,
)
from celeryops.ops.run.pool.rules import Plan, PoolNow, decide, progress_of, recovery_plan
from celeryops.ops.run.recovery import plan as recovery

PLAN = Plan(target="worker", old="worker-00001-old", new="worker-abc1234-beef", count=2, image="img:new")
OLD, NEW = PLAN.old, PLAN.new
BEFORE = PoolNow(reconciling=False, count=2, served={OLD: 100}, revisions={OLD: "succeeded"})
UP = PoolNow(reconciling=False, count=4, served={OLD: 50, NEW: 50}, revisions={OLD: "succeeded", NEW: "succeeded"})
ROLLING = PoolNow(reconciling=True, count=4, served={OLD: 100}, revisions={OLD: "succeeded", NEW: "reconciling"})
FAILED = PoolNow(reconciling=False, count=4, served={OLD: 100}, revisions={OLD: "succeeded", NEW: "failed"})


class Records:
    """A run's records, written in order (seq from 1)."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def add(self, kind: str, payload: dict[str, Any], intent: str | None = None, settles: int | None = None) -> int:
        seq = len(self.records) + 1
        self.records.append(Record(seq=seq, at=float(seq), kind=kind, payload=payload, intent=intent,  # type: ignore[arg-type]
                                   settles=settles))
        return seq

    def intent(self, kind: str, payload: dict[str, Any]) -> int:
        return self.add("intent", payload, intent=kind)

    def settle(self, seq: int, ok: bool = True) -> None:
        intent = next(r.intent for r in self.records if r.seq == seq)
        self.add("settle", {"ok": ok}, intent=intent, settles=seq)

    def run(self, phase: Phase, strategy: str = "overlap") -> Run:
        return Run(id="r1", fleet="f", broker="redis://h", user="u", host="h", pid=1, release="demo-2",
                   settings={"strategy": strategy, "targets": ["worker"]}, created=0.0, updated=0.0, phase=phase,
                   outcome=None, records=tuple(self.records))


def up(settled: bool | None = True) -> Records:
    rec = Records()
    seq = rec.intent(OVERLAP_UP, PLAN.payload())
    if settled is not None:
        rec.settle(seq, settled)
    return rec


def stop(rec: Records, revision: str, workers: tuple[str, ...] = ("celery@old.i1",)) -> int:
    return rec.intent(CANCEL_CONSUMERS, {"stop": {w: ["q"] for w in workers}, "before": {w: ["q"] for w in workers},
                                         "revision": revision})


@pytest.mark.parametrize("resume", [False, True])
def test_nothing_sent_abort_has_nothing_to_undo_resume_starts_over(resume: bool) -> None:
    run = Records().run("preflight")
    assert decide(run, None, resume=resume).step == ("start" if resume else "nothing")


@pytest.mark.parametrize(("pool", "abort", "resume"), [
    (BEFORE, "nothing", "start"),  # the update was written ahead but never took effect
    (ROLLING, "retire", "wait_new"),  # it is rolling out: the new revision is coming
    (UP, "retire", "wait_new"),
    (FAILED, "retire", "retire"),  # the new revision failed to start: the deploy cannot go on
])
def test_unsettled_scale_up_is_judged_by_the_pool(pool: PoolNow, abort: str, resume: str) -> None:
    run = up(settled=None).run("overlapping")
    assert decide(run, pool, resume=False).step == abort
    assert decide(run, pool, resume=True).step == resume


def test_scale_up_refused_outright_left_nothing_to_undo() -> None:
    run = up(settled=False).run("overlapping")
    assert decide(run, BEFORE, resume=False).step == "nothing"
    assert decide(run, FAILED, resume=False).step == "retire"
    assert decide(run, FAILED, resume=True).step == "retire"


def test_old_revision_stopped_abort_restores_it_and_retires_resume_drains_it_again() -> None:
    rec = up()
    stop(rec, OLD)
    run = rec.run("draining")
    progress = progress_of(run)
    assert progress.old_stopped == {"celery@old.i1": {"q"}} and not progress.new_stopped
    abort = decide(run, UP, resume=False)
    assert abort.step == "retire" and "consumers are restored" in abort.explanation
    assert decide(run, UP, resume=True).step == "drain_old"


def test_old_revision_restored_counts_as_not_stopped() -> None:
    rec = up()
    stop(rec, OLD)
    seq = rec.intent(ADD_CONSUMERS, {"add": {"celery@old.i1": ["q"]}})
    rec.settle(seq)
    run = rec.run("overlapping")
    assert not progress_of(run).old_stopped
    assert decide(run, UP, resume=True).step == "wait_new"


@pytest.mark.parametrize("pool", [UP, ROLLING, PoolNow(False, 2, {NEW: 100}, {OLD: "succeeded", NEW: "succeeded"})])
@pytest.mark.parametrize("resume", [False, True])
def test_a_cutover_begun_is_finished_never_undone(pool: PoolNow, resume: bool) -> None:
    rec = up()
    stop(rec, OLD)
    rec.intent(OVERLAP_CUTOVER, PLAN.payload())
    assert decide(rec.run("cutting_over"), pool, resume=resume).step == "cutover"


@pytest.mark.parametrize("resume", [False, True])
def test_an_unfinished_retirement_is_finished(resume: bool) -> None:
    rec = up()
    stop(rec, OLD)
    rec.intent(OVERLAP_REVERT, PLAN.payload())
    stop(rec, NEW, ("celery@new.i3",))
    run = rec.run("retiring")
    progress = progress_of(run)
    assert progress.new_stopped == {"celery@new.i3": {"q"}} and progress.old_stopped == {"celery@old.i1": {"q"}}
    assert decide(run, UP, resume=resume).step == "retire"


def test_a_retirement_given_up_is_like_both_revisions_consuming() -> None:
    rec = up()
    seq = rec.intent(OVERLAP_REVERT, PLAN.payload())
    rec.settle(seq, ok=False)
    run = rec.run("overlapping")
    assert decide(run, UP, resume=False).step == "retire"
    assert decide(run, UP, resume=True).step == "wait_new"


def test_cloud_run_silent_decides_nothing_about_the_pool() -> None:
    rec = up()
    stop(rec, OLD)
    for resume in (False, True):
        decided = decide(rec.run("draining"), None, resume=resume)
        assert decided.step == "ask" and "Cloud Run does not answer" in decided.explanation


def test_revisions_that_may_not_be_read_are_named_with_their_role() -> None:
    """Cloud Run refused to show the pool's revisions for want of a permission: one sentence names it and the role
    that grants it (asking again would get the same refusal), instead of "Cloud Run does not answer"."""
    from celeryops.adapters.deploy.base import DeployError

    rec = up()
    stop(rec, OLD)
    denied = DeployError("The permission run.revisions.list is missing on Cloud Run worker pool worker.",
                         code="PERMISSION_DENIED", permission="run.revisions.list",
                         role="roles/run.viewer or roles/run.developer")
    for resume in (False, True):
        decided = decide(rec.run("draining"), None, resume=resume, denied=denied)
        assert decided.step == "ask", decided
        assert decided.explanation == (
            "Run r1 changed worker pool worker, and celeryops may not read it or its revisions (run.revisions.list is "
            "missing), so it cannot tell how far the run got and changed nothing on the pool (stopped consumers are "
            "given back): grant roles/run.viewer or roles/run.developer to the account celeryops runs as, then run "
            "`celeryops resume` or `celeryops abort` again.")


def test_a_finished_run_has_nothing_left() -> None:
    assert decide(up().run("done"), UP, resume=True).step == "done"


def test_an_existing_revision_as_destination_is_judged_by_count_and_split() -> None:
    """A rollback's destination exists before the update: the update took effect only once the count or the split
    changed."""
    rollback = Plan(target="worker", old=OLD, new="worker-00000-prev", count=2, image=None)
    rec = Records()
    rec.intent(OVERLAP_UP, rollback.payload())
    run = rec.run("overlapping")
    existing = {OLD: "succeeded", rollback.new: "succeeded"}
    assert decide(run, PoolNow(False, 2, {OLD: 100}, existing), resume=False).step == "nothing"
    assert decide(run, PoolNow(False, 4, {OLD: 50, rollback.new: 50}, existing), resume=False).step == "retire"


def test_status_and_the_console_read_the_rules_from_the_journal() -> None:
    """``recovery.plan`` (status, the console's panel) gives an overlap run its own rules: what abort would do."""
    rec = up()
    stop(rec, OLD)
    decided = recovery(rec.run("draining"), None)
    assert decided.action == "retire" and decided.restore == {"celery@old.i1": ["q"]}
    assert decided.mark_as is None and decided.exit_code == 0
    assert recovery_plan(Records().run("preflight")).action == "nothing"
    cut = up()
    cut.intent(OVERLAP_CUTOVER, PLAN.payload())
    assert recovery(cut.run("cutting_over"), None).action == "cutover"
    # A drain run's rules are untouched: an intent-less drain run stopped nothing.
    assert recovery(Records().run("draining", strategy="drain"), None).action == "nothing"


def test_plan_payload_round_trips() -> None:
    payload = PLAN.payload()
    assert Plan.from_payload(payload) == PLAN
    assert payload["split"] == [[OLD, 50], [NEW, 50]] and payload["peak"] == 4


@pytest.mark.parametrize(("record", "revision", "held"), [
    (FenceRecord(run_id="r"), "any", True),  # an older record: everyone not exempt is held
    (FenceRecord(run_id="r", only_revisions=(OLD,)), OLD, True),
    (FenceRecord(run_id="r", only_revisions=(OLD,)), NEW, False),
    (FenceRecord(run_id="r", only_revisions=(OLD,)), "", False),  # outside Cloud Run: not the old revision's
    (FenceRecord(run_id="r", only_revisions=(OLD,), exempt_revisions=(OLD,)), OLD, False),  # exempt wins
])
def test_a_fence_scoped_to_revisions_holds_only_their_workers(record: FenceRecord, revision: str,
                                                               held: bool) -> None:
    assert (record.hold_for(revision, "") is not None) == held


def test_fence_record_without_the_scope_field_reads_as_before() -> None:
    old = FenceRecord.from_hash({"run_id": "r", "queues": '["q"]'}, 5000)
    assert old.only_revisions == () and old.hold_for("rev", "") is not None
    scoped = FenceRecord.from_hash({"run_id": "r", "queues": "[]", "only_revisions": f'["{OLD}"]'}, 5000)
    assert scoped.only_revisions == (OLD,) and scoped.hold_for(NEW, "") is None


@pytest.mark.parametrize("resume", [False, True])
def test_stopped_between_the_cutover_phase_and_its_intent_finishes_the_cutover(resume: bool) -> None:
    """The run entered cutting_over (a phase it cannot leave but to deployed) and stopped before the cutover's intent
    was written (an error, a SIGKILL): abort and resume finish the cutover, never retire (chaos overlap seed 51:
    every abort exited 1, "cannot go from cutting_over to retiring")."""
    rec = up()
    stop(rec, OLD)
    run = rec.run("cutting_over")
    assert decide(run, UP, resume=resume).step == "cutover"
    assert recovery_plan(run).action == "cutover"
