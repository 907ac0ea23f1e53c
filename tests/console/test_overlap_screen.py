"""The overlap deploy's screen over scripted events (a StaticBackend): what G and X say, the retirement's rows, the
watcher's read-only view. The same screen against real workers: test_overlap_console.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from test_pilot import press, settle  # the Pilot tests' helpers (tests/console is on sys.path)
from textual.widgets import DataTable

from celeryops.console import sample
from celeryops.console.screens.confirm import ConfirmScreen
from celeryops.console.screens.overlap import OverlapScreen
from celeryops.console.screens.quit import QuitScreen
from celeryops.console.static import StaticBackend
from celeryops.console.widgets.task_table import TaskTable
from celeryops.core.events import (
    ConsumersRestored,
    DrainFinished,
    DrainStarted,
    PhaseChanged,
    PoolStep,
    PreflightDone,
    RunFinished,
    StageStarted,
)

SIZE = (120, 40)


def backend(proceed: list[object] | None = None, **kw: Any) -> StaticBackend:
    kw.setdefault("preflight_script", sample.overlap_preflight_script())
    return StaticBackend(fleet=sample.fleet(), slots=sample.slots(),
                         proceed_script=sample.overlap_script() if proceed is None else proceed, **kw)


def body(app: Any) -> str:
    return str(app.screen.query_one("#dialog-body").render())


def row(app: Any, role: str) -> list[str]:
    return [str(cell) for cell in app.screen.query_one("#revisions", DataTable).get_row(role)]


async def test_g_says_what_the_overlap_does_and_lists_the_warning(app_factory: Any) -> None:
    app = app_factory(backend(), start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "overlap: the new revision consumes beside the old one" in str(
            app.screen.query_one("#preflight-title").render())
        await press(pilot, "G")
        assert isinstance(app.screen, ConfirmScreen)
        said = body(app)
        assert "Old and new code side by side" in said  # mixed_versions: accepted like any warning
        assert "6 instances at the peak" in said and "Nothing is killed" in said
        assert "only then do the old revision's workers stop" in said.lower()
        await press(pilot, "y")
        assert ("accept warnings",) in app.backend.calls and ("stop consumers",) in app.backend.calls
        assert isinstance(app.screen, OverlapScreen)


async def test_accepted_warning_leaves_a_plain_start(app_factory: Any) -> None:
    checks = [replace(c, accepted=True) if c.id == "mixed_versions" else c for c in sample.overlap_checks()]
    script = [StageStarted(stage="preflight", strategy="overlap"), PhaseChanged("preflight"), *checks,
              PreflightDone(failed=0, warnings=1, accepted=("mixed_versions",))]
    app = app_factory(backend(preflight_script=script), start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "start the overlap" in str(app.screen.query_one("#verdict").render())
        await press(pilot, "G")
        assert app.screen.query_one("#dialog-title").render().plain == "Start the overlap deploy?"  # type: ignore[attr-defined]
        assert "6 instances at the peak" in body(app)


async def test_x_mid_overlap_says_the_new_revision_is_retired(app_factory: Any) -> None:
    app = app_factory(backend(), start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y")
        await press(pilot, "X")
        assert isinstance(app.screen, ConfirmScreen)
        assert "consume again first" in body(app) and sample.NEW_REV in body(app)
        await press(pilot, "y")
        assert ("abort the run",) in app.backend.calls
        assert app.model.operator_aborted


async def test_x_during_the_cutover_says_it_is_finished(app_factory: Any) -> None:
    cut = [*sample.overlap_script(), sample.overlap_step("old_idle"), PhaseChanged("drained"),
           sample.overlap_step("cutting_over", instances={sample.OLD_REV: 3, sample.NEW_REV: 3}),
           PhaseChanged("cutting_over")]
    app = app_factory(backend(cut), start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y")
        assert "idle and held" in row(app, "old")[5]
        await press(pilot, "X")
        assert "cutover has begun" in body(app) and "finishes it" in body(app)
        await press(pilot, "n", "q")
        assert isinstance(app.screen, QuitScreen)
        assert "finish the cutover" in str(app.screen.query_one("#abort").render())


async def test_retiring_shows_the_old_revision_back_and_the_new_one_drained(app_factory: Any) -> None:
    """The old revision was not idle in time: it consumes again, the new revision is held and drained (the task
    table now shows the new revision's tasks), then retired; the run ends aborted."""
    new_drain = DrainStarted(queues=("default", "render"), workers={w: ("default",) for w in sample.NEW_WORKERS},
                             interval=15.0, streak=2, max_wait=1200.0)
    script = [*sample.overlap_script(),
              DrainFinished("timeout", 1200.0, "The old revision was not idle within 1200 s."),
              ConsumersRestored({w: ("default", "render") for w in sample.OLD_WORKERS}, verified=True),
              PhaseChanged("retiring"), sample.overlap_step("retiring", "retired next"),
              sample.overlap_step("old_restored", "the old revision consumes again"),
              sample.overlap_step("holding_new", "the new revision is drained"), new_drain]
    app = app_factory(backend(script), start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y")
        assert "consuming again" in row(app, "old")[5]
        assert "held" in row(app, "new")[5]
        assert app.screen.query_one(TaskTable).border_title == f"Tasks still running on {sample.NEW_REV}"
        assert app.model.finished is None  # the new revision's drain has just begun: its clock runs
        assert "old consumes again" in str(app.screen.query_one("#overlap-steps").render())
        assert "New running" in str(app.screen.query_one("#inflight-label").render())
        await press(pilot, "X")  # the run already retires the new revision: X asks nothing
        assert isinstance(app.screen, OverlapScreen) and ("abort the run",) not in app.backend.calls
        app.backend.emit(sample.overlap_step("retired", "retired", instances={sample.OLD_REV: 3},
                                             split={sample.OLD_REV: 100}))
        app.backend.emit(PhaseChanged("aborted", "retired"))
        app.backend.emit(RunFinished("timeout", 3, "The old revision was not idle within 1200 s: retired."))
        await settle(pilot)
        assert row(app, "new")[4] == "gone" and row(app, "old")[2:4] == ["3", "100%"]
        assert "ABORTED" in str(app.screen.query_one("#overlap-title").render())
        assert app.model.exit_code() == 3


async def test_watcher_sees_the_overlap_without_its_dangerous_keys(app_factory: Any) -> None:
    watched = StaticBackend(fleet=sample.fleet(), slots=sample.slots(), read_only=True,
                            follow_script=sample.overlap_script())
    app = app_factory(watched)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "w")
        assert isinstance(app.screen, OverlapScreen)
        keys = {b.key for _, b in app.screen._bindings}
        assert "X" not in keys and "F" not in keys
        await press(pilot, "X")
        assert not any(call[0] == "refused" for call in watched.calls) and isinstance(app.screen, OverlapScreen)
        assert row(app, "new")[2:4] == ["3", "50%"]


def test_a_rollback_names_the_revisions_for_what_they_are() -> None:
    """On an overlap rollback the revision that comes up is the previous one and the one that drains is the one
    deployed: the rows read from/to and the steps say so (the screen is the deploy's)."""
    from celeryops.console.model import RunModel
    from celeryops.console.screens.overlap import revision_rows, steps_text

    rows = {}
    for kind in ("deploy", "rollback"):
        model = RunModel(kind=kind)  # type: ignore[arg-type]
        for event in sample.overlap_script():
            model.apply(event)  # type: ignore[arg-type]
        assert model.overlap is not None
        rows[kind] = [str(cells[0]) for _, cells in revision_rows(model.overlap, model)]
        steps = steps_text(model.overlap, model.phase, rollback=kind == "rollback").plain
        if kind == "rollback":
            assert "previous revision up" in steps and "deployed drains" in steps and "new" not in steps, steps
        else:
            assert "new revision up" in steps and "old drains" in steps, steps
    assert rows == {"deploy": ["old", "new"], "rollback": ["from", "to"]}


def test_a_deploy_of_cohorts_shows_one_row_per_old_cohort() -> None:
    """A pool the autoscaler split into cohorts: every old cohort has its row (its instances, share, workers), the
    new revision one; the cohorts are drained as one, so they say the same."""
    from celeryops.console.model import RunModel
    from celeryops.console.screens.overlap import revision_rows

    old, cohort, new = "worker-00001-old", "worker-as0101-beef", "worker-abc1234-cafe"
    model = RunModel(kind="deploy")
    model.apply(PoolStep(step="planned", target="worker", old_revision=old, new_revision=new, peak=6,
                         instances={old: 2, cohort: 1}, split={old: 67, cohort: 33}))
    model.apply(PoolStep(step="progress", target="worker", old_revision=old, new_revision=new, peak=6,
                         instances={old: 2, cohort: 1, new: 3}, split={old: 34, cohort: 16, new: 50},
                         workers={old: ("a", "b"), cohort: ("c",), new: ("d", "e", "f")}))
    assert model.overlap is not None and model.overlap.count == 3
    rows = {key: [str(c) for c in cells] for key, cells in revision_rows(model.overlap, model)}
    assert list(rows) == ["old", f"old:{cohort}", "new"]
    assert rows["old"][1:5] == [old, "2", "34%", "2"] and rows[f"old:{cohort}"][1:5] == [cohort, "1", "16%", "1"]
    assert rows["new"][1:5] == [new, "3", "50%", "3"]
    assert rows["old"][5] == rows[f"old:{cohort}"][5]
