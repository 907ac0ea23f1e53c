"""Recovery rules (pure): the documented cases, and the property that no path leaves workers stopped."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from celeryops.core.errors import EXIT_DEPLOY, EXIT_OK
from celeryops.ops.journal import PHASES, TERMINAL_PHASES, Phase, Record, Run
from celeryops.ops.run.recovery import ABORT, ABORT_RESTORE, RESUME, ROLLOUTS, Rollout, deploy_state, plan


class Builder:
    """Builds a Run with records exactly as the journal stores them (no I/O)."""

    def __init__(self, phase: Phase = "preflight") -> None:
        self.phase = phase
        self.records: list[Record] = []

    def _add(self, kind: Any, payload: dict[str, Any], intent: str | None = None, settles: int | None = None) -> int:
        seq = len(self.records) + 1
        self.records.append(Record(seq=seq, at=float(seq), kind=kind, payload=payload, intent=intent,
                                   settles=settles))
        return seq

    def cancel(self, stop: dict[str, list[str]], settled: bool = True) -> Builder:
        seq = self._add("intent", {"stop": stop, "before": {}}, "cancel_consumers")
        if settled:
            self._add("settle", {"ok": True}, "cancel_consumers", seq)
        return self

    def restore(self, add: dict[str, list[str]], settled: bool | None = True) -> Builder:
        seq = self._add("intent", {"add": add}, "add_consumers")
        if settled is not None:
            self._add("settle", {"ok": settled}, "add_consumers", seq)
        return self

    def deploy(self, settled: bool | None = None) -> Builder:
        seq = self._add("intent", {"target": "svc-a", "image": "img:2", "previous": {"revision": "r1"}},
                        "deploy_start")
        if settled is not None:
            self._add("settle", {"ok": settled}, "deploy_start", seq)
        return self

    def run(self) -> Run:
        outcome = {"done": "succeeded", "aborted": "aborted", "failed": "failed"}.get(self.phase)
        return Run(id="r1", fleet="f", broker="redis://h", user="u", host="h", pid=1, release="v2", settings={},
                   created=0.0, updated=1.0, phase=self.phase, outcome=outcome, records=tuple(self.records))


STOPPED = {"w1": ["a", "b"], "*": ["a"]}


def test_interrupted_before_anything_was_stopped() -> None:
    p = plan(Builder("stopping").run(), None)
    assert (p.action, p.restore, p.mark_as, p.next_commands) == ("nothing", {}, "aborted", [ABORT])
    assert "nothing to undo" in p.explanation


def test_consumers_stopped_and_no_deploy_restores_exactly() -> None:
    for phase in ("stopping", "draining", "drained"):
        p = plan(Builder(phase).cancel(STOPPED).run(), "unknown")
        assert p.action == "restore" and p.mark_as == "aborted" and p.next_commands == [ABORT]
        assert p.restore == {"*": ["a"], "w1": ["a", "b"]}
        assert p.exit_code == EXIT_OK


def test_unsettled_cancel_still_counts_and_partial_restores_are_subtracted() -> None:
    run = Builder("draining").cancel({"w1": ["a", "b"]}, settled=False).restore({"w1": ["a"]}).run()
    assert plan(run, None).restore == {"w1": ["b"]}
    run = Builder("draining").cancel({"w1": ["a"]}).restore({"w1": ["a"]}, settled=None).run()
    assert plan(run, None).restore == {"w1": ["a"]}


def test_deploy_started_and_new_revision_ready_leaves_consumers() -> None:
    p = plan(Builder("deploying").cancel(STOPPED).deploy().run(), "ready")
    assert (p.action, p.restore, p.next_commands, p.mark_as) == ("leave", {}, [RESUME], None)
    assert "svc-a" in p.explanation


def test_deploy_failed_or_never_took_effect_restores() -> None:
    for rollout in ("failed", "not_started"):
        p = plan(Builder("deploying").cancel(STOPPED).deploy().run(), rollout)  # type: ignore[arg-type]
        assert p.action == "restore" and p.restore == {"*": ["a"], "w1": ["a", "b"]}
        assert "old revision still serves" in p.explanation
    # The journal alone (a settled failed deploy) is enough when the rollout was not checked.
    assert plan(Builder("deploying").cancel(STOPPED).deploy(settled=False).run(), None).action == "restore"


def test_deploy_outcome_unknown_asks_and_touches_nothing() -> None:
    for rollout in (None, "unknown", "in_progress"):
        p = plan(Builder("deploying").cancel(STOPPED).deploy().run(), rollout)  # type: ignore[arg-type]
        assert (p.action, p.restore, p.mark_as) == ("ask", {}, None)
        assert p.next_commands == [RESUME, ABORT_RESTORE]
        assert p.exit_code == EXIT_DEPLOY
        assert RESUME in p.explanation and ABORT_RESTORE in p.explanation


def test_journal_says_deployed_when_rollout_not_checked() -> None:
    assert plan(Builder("deployed").cancel(STOPPED).deploy(settled=True).run(), None).action == "leave"
    # An observed rollout overrides the journal (e.g. the new revision was rolled back since).
    assert plan(Builder("deployed").cancel(STOPPED).deploy(settled=True).run(), "failed").action == "restore"


def test_finished_runs() -> None:
    p = plan(Builder("done").cancel(STOPPED).restore(STOPPED).run(), None)
    assert (p.action, p.mark_as) == ("nothing", None)
    # An aborted run whose restore never settled still has its consumers restored.
    p = plan(Builder("aborted").cancel(STOPPED).restore(STOPPED, settled=None).run(), None)
    assert p.action == "restore" and p.mark_as is None


queues = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3)
queue_maps = st.dictionaries(st.sampled_from(["w1", "w2", "*"]), queues, min_size=1, max_size=3)
steps = st.lists(st.one_of(
    st.tuples(st.just("cancel"), queue_maps, st.booleans()),
    st.tuples(st.just("restore"), queue_maps, st.sampled_from([True, False, None])),
    st.tuples(st.just("deploy"), st.just({}), st.sampled_from([True, False, None])),
), max_size=6)


@settings(max_examples=200, deadline=None)
@given(phase=st.sampled_from(PHASES), actions=steps, rollout=st.sampled_from([*ROLLOUTS, None]))
def test_no_path_leaves_workers_stopped(phase: Phase, actions: list[tuple[str, Any, Any]],
                                        rollout: Rollout | None) -> None:
    b = Builder(phase)
    for kind, arg, flag in actions:
        if kind == "cancel":
            b.cancel(arg, flag)
        elif kind == "restore":
            b.restore(arg, flag)
        else:
            b.deploy(flag)
    run = b.run()
    stopped = run.stopped_consumers()
    p = plan(run, rollout)

    assert "\n" not in p.explanation and p.explanation.endswith(".")
    if p.action == "restore":
        assert p.restore == {w: sorted(q) for w, q in stopped.items()} and stopped
    else:
        assert p.restore == {}
    if p.action == "leave":
        assert deploy_state(run, rollout) == "ready"
        assert rollout not in ("failed", "not_started", "in_progress")
    if p.action == "nothing":
        assert not stopped
    if p.action == "ask":
        assert p.next_commands == [RESUME, ABORT_RESTORE] and p.exit_code != EXIT_OK
    # The property: stopped workers are restored, or the new revision is ready, or a person decides.
    if stopped:
        assert p.action == "restore" or (p.action == "leave" and deploy_state(run, rollout) == "ready") \
            or p.action == "ask"
    # An unfinished run is never left open unless someone decides.
    if run.phase not in TERMINAL_PHASES and p.action in ("nothing", "restore"):
        assert p.mark_as == "aborted"
