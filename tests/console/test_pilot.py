"""Pilot tests: keys do what the footer says, confirmations guard dangerous actions, read-only mode neither
offers nor performs them, quitting mid-run asks, the task table updates rows in place, bursts collapse."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from pilothelp import type_filter, until_true
from textual.widgets import DataTable

from celeryops.console import sample
from celeryops.console.messages import DrainUpdated
from celeryops.console.screens.confirm import ConfirmScreen
from celeryops.console.screens.drain import DrainScreen
from celeryops.console.screens.home import HomeScreen
from celeryops.console.screens.preflight import PreflightScreen
from celeryops.console.screens.quit import QuitScreen
from celeryops.console.screens.resume import ResumeScreen
from celeryops.console.static import StaticBackend
from celeryops.console.widgets.task_table import TaskTable
from celeryops.core.errors import EXIT_INTERRUPTED, ReadOnlyRefused, UserError
from celeryops.core.events import DrainFinished, Notice, PhaseChanged, PreflightDone

SIZE = (100, 30)
DANGEROUS_KEYS = {"S", "G", "X", "F", "R"}


def deploy_backend(**kwargs: Any) -> StaticBackend:
    kwargs.setdefault("preflight_script", sample.preflight_script())
    kwargs.setdefault("proceed_script", sample.drain_script())
    return StaticBackend(fleet=sample.fleet(), slots=sample.slots(), **kwargs)


async def settle(pilot: Any) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def press(pilot: Any, *keys: str) -> None:
    for key in keys:
        await pilot.press(key)
        await settle(pilot)


def shown_keys(app: Any) -> set[str]:
    return {key for key, active in app.screen.active_bindings.items() if active.binding.show}


async def test_deploy_flow_confirms_warnings_then_proceeds(app_factory: Any) -> None:
    backend = deploy_backend()
    app = app_factory(backend, start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, PreflightScreen)
        assert backend.calls == [("start deploy", "v2.14.0")]
        await press(pilot, "G")
        assert isinstance(app.screen, ConfirmScreen)
        assert "did not reply" in str(app.screen.what_happens)
        await press(pilot, "n")  # cancel: nothing sent
        assert backend.calls == [("start deploy", "v2.14.0")]
        await press(pilot, "G", "y")
        assert backend.calls[1:] == [("accept warnings",), ("stop consumers",)]
        assert isinstance(app.screen, DrainScreen)
        assert app.model.progress is not None and app.model.progress.streak == 1


async def test_failed_preflight_cannot_proceed(app_factory: Any) -> None:
    backend = deploy_backend(preflight_script=[*sample.failed_checks(), PreflightDone(failed=1, warnings=1)])
    app = app_factory(backend, start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.screen.check_action("proceed", ()) is None
        await press(pilot, "G")
        assert not isinstance(app.screen, ConfirmScreen)
        assert all(call[0] != "stop consumers" for call in backend.calls)
        await press(pilot, "q")  # no run active: quits with the preflight exit code
    assert app.return_value == 5


async def test_read_only_offers_and_performs_no_dangerous_action(app_factory: Any) -> None:
    backend = StaticBackend(fleet=sample.fleet(), slots=sample.slots(), read_only=True,
                            follow_script=sample.drain_script(), run=sample.unfinished_run())
    app = app_factory(backend)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.read_only
        screens = list(app.screen_stack)
        assert any(isinstance(s, ResumeScreen) for s in screens)
        for screen in screens:
            registered = {binding.key for _, binding in screen._bindings}
            assert not registered & DANGEROUS_KEYS, registered
            for action in screen.DANGEROUS:
                assert screen.check_action(action, ("abort",)) is False
        await press(pilot, "escape")  # leave the resume panel
        await settle(pilot)
        assert isinstance(app.screen, DrainScreen)  # the live run from the published status
        assert not shown_keys(app) & DANGEROUS_KEYS
        await press(pilot, "X", "F", "S", "G", "R")
        assert not isinstance(app.screen, ConfirmScreen)
        assert backend.calls == [("follow",)]
        with pytest.raises(ReadOnlyRefused):  # and the backend refuses on its own
            await backend.abort_run()
        await press(pilot, "q")  # read-only quits without asking
    assert app.return_value == 0


async def test_quit_mid_drain_asks_and_detach_leaves_the_run(app_factory: Any) -> None:
    backend = deploy_backend()
    app = app_factory(backend, start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y")
        await press(pilot, "ctrl+c")
        assert isinstance(app.screen, QuitScreen)
        await press(pilot, "s")  # stay
        assert isinstance(app.screen, DrainScreen)
        await press(pilot, "q")
        assert isinstance(app.screen, QuitScreen)
        await press(pilot, "d")
        await settle(pilot)
    assert backend.calls[-1] == ("detach from the run",)
    assert app.return_value == EXIT_INTERRUPTED


async def test_quit_mid_drain_abort_restores_then_exits(app_factory: Any) -> None:
    backend = deploy_backend()
    app = app_factory(backend, start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y", "q", "A")
        assert backend.calls[-1] == ("abort the run",)
        assert app.is_running  # waits for the restore
        backend.emit(PhaseChanged("aborted", "consumers restored"))
        await settle(pilot)
    assert app.return_value == EXIT_INTERRUPTED


async def test_resume_panel_can_be_left_and_found_again_and_abort_is_confirmed(app_factory: Any) -> None:
    backend = StaticBackend(fleet=sample.fleet(), run=sample.unfinished_run())
    app = app_factory(backend)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, ResumeScreen)
        await press(pilot, "escape")  # leave it for now...
        assert isinstance(app.screen, HomeScreen) and backend.calls == []
        await press(pilot, "w")  # ...the footer's Run key brings the journalled run back
        assert isinstance(app.screen, ResumeScreen)
        await press(pilot, "X")
        assert isinstance(app.screen, ConfirmScreen)
        assert "restore" in app.screen.title_text.lower()
        await press(pilot, "escape")
        assert backend.calls == []
        await press(pilot, "X", "y")
        assert backend.calls == [("abort the run",)]
        assert isinstance(app.screen, HomeScreen)
        await press(pilot, "w")  # nothing left to resume: a note, no panel
        assert isinstance(app.screen, HomeScreen)


async def test_x_aborts_a_drained_run_that_keeps_its_consumers_stopped(app_factory: Any) -> None:
    """A drain-only run that ended drained leaves the consumers stopped: the footer's X (abort) still works."""
    script = [*sample.drain_script(), sample.progress(0, 3, 450.0),
              DrainFinished("drained", 450.0, "Drained: no task is running and the consumers stay stopped."),
              PhaseChanged("drained")]
    backend = deploy_backend(proceed_script=script)
    app = app_factory(backend, start="drain")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y")
        assert isinstance(app.screen, DrainScreen) and app.model.parked
        assert "X" in shown_keys(app) and app.screen.check_action("abort", ()) is True
        await press(pilot, "X")
        assert isinstance(app.screen, ConfirmScreen)
        await press(pilot, "y")
        assert backend.calls[-1] == ("abort the run",)
        assert app.screen.check_action("abort", ()) is None  # done: X is shown disabled, not offered twice


async def test_home_filter_by_queue_and_task(app_factory: Any) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.screen.query_one("#workers", DataTable)
        assert table.row_count == 5
        await type_filter(pilot, "gpu")
        assert {str(k.value) for k in table.rows} == {"celery@gpu-1", "celery@gpu-2"}
        await press(pilot, "escape")
        await until_true(pilot, lambda: table.row_count == 5, "Esc to clear the filter")
        await type_filter(pilot, "train")  # a task name held by a worker
        assert {str(k.value) for k in table.rows} == {"celery@worker-2", "celery@worker-3"}


async def test_task_table_updates_rows_in_place(app_factory: Any) -> None:
    app = app_factory(deploy_backend(), start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y")
        table = app.screen.query_one(TaskTable)
        first = sample.progress(12)
        app.sink(first)
        await settle(pilot)
        keys_before = dict(table.rows)
        tasks = list(first.tasks[1:])  # one finished
        from dataclasses import replace
        tasks[0] = replace(tasks[0], state="active", runtime=999.0)  # one changed
        app.sink(replace(first, tasks=tuple(tasks)))
        await settle(pilot)
        assert first.tasks[0].id not in {k.value for k in table.rows}
        for key in table.rows:  # the surviving rows are the same row objects, not rebuilt
            assert table.rows[key] is keys_before[key]
        assert table.get_cell(tasks[0].id, "running") == "17 minutes"


async def test_drain_bursts_collapse_but_log_lines_survive(app_factory: Any) -> None:
    older, newer = DrainUpdated(sample.progress(3, 1)), DrainUpdated(sample.progress(2, 2))
    assert newer.can_replace(older)
    from dataclasses import replace
    joined = DrainUpdated(replace(sample.progress(3, 1), joined=("celery@new",)))
    assert not newer.can_replace(joined)
    app = app_factory(deploy_backend(), start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for streak in range(50):
            app.sink(sample.progress(5, streak % 3))
        app.sink(Notice("error", "broker redis://:hunter2@x:6379 lost"))
        await settle(pilot)
        assert app.model.progress is not None
        assert app.model.log[-1].text == "broker redis://:***@x:6379 lost"
        assert len(app.model.inflight) <= 50


async def test_palette_lists_only_allowed_actions(app_factory: Any) -> None:
    app = app_factory(deploy_backend(read_only=True))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        titles = [cmd.title for cmd in app.get_system_commands(app.screen)]
        assert any(t.startswith("Filter") for t in titles)
        assert not any(t.startswith("Start drain") for t in titles)
    app = app_factory(deploy_backend())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        titles = [cmd.title for cmd in app.get_system_commands(app.screen)]
        assert any(t.startswith("Start drain") for t in titles)


async def test_typing_in_the_filter_does_not_trigger_keys(app_factory: Any) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_filter(pilot, "sqS")  # slots / quit / start drain keys, typed as text
        assert isinstance(app.screen, HomeScreen) and app.is_running
        assert app.screen.needle == "sqS"
        assert app.backend.calls == []


async def test_drain_filter_keeps_only_matching_tasks(app_factory: Any) -> None:
    app = app_factory(deploy_backend(), start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y")
        table = app.screen.query_one(TaskTable)
        assert table.row_count == 12
        await type_filter(pilot, "embed")
        names = {table.get_cell(key, "name") for key in table.rows}
        assert names == {"ml.embed_batch"}
        app.sink(sample.progress(20))  # a new poll keeps the filter
        await settle(pilot)
        assert {table.get_cell(key, "name") for key in table.rows} == {"ml.embed_batch"}
        assert table.row_count == 4
        await press(pilot, "escape")
        assert table.row_count == 20


class SlowFleet(StaticBackend):
    """Snapshots that take as long as the test says, to prove polls never overlap."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.running = 0
        self.most = 0
        self.done = 0
        self.release_poll = asyncio.Event()

    async def fleet_snapshot(self) -> Any:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release_poll.wait()
            return await super().fleet_snapshot()
        finally:
            self.running -= 1
            self.done += 1


async def test_polls_never_overlap(app_factory: Any) -> None:
    backend = SlowFleet(fleet=sample.fleet())
    app = app_factory(backend, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        for _ in range(5):
            await pilot.press("r")
        assert backend.running == 1
        backend.release_poll.set()
        deadline = asyncio.get_running_loop().time() + 30
        while backend.done < 4 and asyncio.get_running_loop().time() < deadline:
            await pilot.pause(0.05)
        assert backend.done >= 4  # the next poll is scheduled after the previous one finished
        assert backend.most == 1


class RefusingBackend(StaticBackend):
    async def proceed(self) -> None:
        raise UserError("Could not cancel consumers: the broker at redis://:s3cret@h:6379/0 refused; "
                        "nothing was changed; check the broker and press G again.")


async def test_backend_error_is_one_masked_sentence(app_factory: Any) -> None:
    backend = RefusingBackend(fleet=sample.fleet(), preflight_script=sample.preflight_script())
    app = app_factory(backend, start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y")
        assert app.is_running and isinstance(app.screen, PreflightScreen)
        last = app.model.log[-1]
        assert last.level == "error" and "s3cret" not in last.text and ":***@h" in last.text


def test_run_events_and_errors_arriving_while_the_console_shuts_down_update_the_model_only() -> None:
    """A run's events can still arrive once the console has torn its screens down (quitting mid-preflight): the
    model takes them, nothing is drawn and nothing raises (CI once saw 'No screens on stack' here)."""
    from celeryops.console.app import make_app
    from celeryops.console.messages import OpsEvent

    app = make_app(deploy_backend(), animate=False)
    assert not app.screen_stack
    app.on_ops_event(OpsEvent(PhaseChanged("draining")))
    assert app.model.phase == "draining"
    app._report(UserError("the broker went away"))
    assert any("the broker went away" in line.text for line in app.model.log)


async def test_f_forgets_silent_workers_but_never_one_a_live_heartbeat_shows_busy(app_factory: Any) -> None:
    """F stops waiting for unknown workers that may be dead; a silent worker whose plugin heartbeat is live is busy
    (its tasks would be cut by the deploy): it is named as kept and never forgotten; with only such workers, F is
    shown disabled."""
    backend = deploy_backend()
    app = app_factory(backend, start="drain")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y")
        assert isinstance(app.screen, DrainScreen)
        base = sample.progress()
        both = dataclasses.replace(base, unknown=("celery@gpu-2", "celery@busy-1"),
                                   silent={"celery@gpu-2": 40.0, "celery@busy-1": 40.0}, alive=("celery@busy-1",))
        backend.emit(both)
        await settle(pilot)
        assert app.screen.check_action("forget_unknown", ()) is True
        await press(pilot, "F")
        assert isinstance(app.screen, ConfirmScreen)
        assert "celery@busy-1 is busy" in str(app.screen.what_happens)
        await press(pilot, "y")
        await settle(pilot)
        forgotten = [call for call in backend.calls if call[0] == "forget a worker"]
        assert forgotten == [("forget a worker", "celery@gpu-2")]
        only_busy = dataclasses.replace(both, unknown=("celery@busy-1",), silent={"celery@busy-1": 50.0})
        backend.emit(only_busy)
        await settle(pilot)
        assert isinstance(app.screen, DrainScreen)
        assert app.screen.check_action("forget_unknown", ()) is None  # shown disabled: nothing to forget
        await press(pilot, "F")
        assert not isinstance(app.screen, ConfirmScreen)
        assert [call for call in backend.calls if call[0] == "forget a worker"] == forgotten
