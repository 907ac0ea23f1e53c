"""The console's B (issue 20): the run history offers a rollback on a deployed run only, asks first, then runs the
rollback through the same preflight and screens as a deploy; watch mode neither offers nor performs it."""

from __future__ import annotations

from typing import Any

from test_pilot import press, settle

from celeryops.console import sample
from celeryops.console.screens.confirm import ConfirmScreen
from celeryops.console.screens.deploy import DeployScreen
from celeryops.console.screens.drain import DrainScreen
from celeryops.console.screens.preflight import PreflightScreen
from celeryops.console.screens.runs import RunsScreen
from celeryops.console.static import StaticBackend
from celeryops.core.events import PhaseChanged, RunFinished, TargetRolledBack
from celeryops.ops.backend.views import RunRecordView

SIZE = (120, 36)
DEPLOYED = sample.history()[1]  # release/2.13, done


def shown_keys(app: Any) -> set[str]:
    return {key for key, active in app.screen.active_bindings.items() if active.binding.show and active.enabled}


def highlighted(app: Any) -> RunRecordView:
    screen = app.screen
    assert isinstance(screen, RunsScreen) and screen.runs is not None
    return screen.runs[screen.query_one("#runs").cursor_row]


def backend(**kwargs: Any) -> StaticBackend:
    return StaticBackend(fleet=sample.fleet(with_run=False), slots=sample.slots(), history=sample.history(),
                         preflight_script=sample.preflight_script(), proceed_script=sample.drain_script(), **kwargs)


async def test_b_rolls_a_deployed_run_back_after_a_confirmation(app_factory: Any) -> None:
    static = backend()
    app = app_factory(static)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "r")
        assert isinstance(app.screen, RunsScreen)
        offered = {}
        for _row in sample.history():  # only the finished deploy can be rolled back
            offered[highlighted(app).run_id] = "B" in shown_keys(app)
            await press(pilot, "down")
        assert offered == {r.run_id: r.run_id == DEPLOYED.run_id for r in sample.history()}
        await press(pilot, *["up"] * len(sample.history()))
        assert highlighted(app).phase == "draining"
        await press(pilot, "B")  # the deploy in progress: nothing happens
        assert isinstance(app.screen, RunsScreen) and static.calls == []

        await press(pilot, "down", "B")
        assert isinstance(app.screen, ConfirmScreen)
        assert DEPLOYED.run_id in str(app.screen.what_happens) and "nothing changes until" in str(
            app.screen.what_happens)
        await press(pilot, "n")  # declined: nothing sent
        assert isinstance(app.screen, RunsScreen) and static.calls == []

        await press(pilot, "B", "y")
        assert static.calls == [("start rollback", DEPLOYED.run_id)]
        assert isinstance(app.screen, PreflightScreen) and app.model.kind == "rollback"
        title = str(app.screen.query_one("#preflight-title").render())
        assert "Before the rollback" in title, title
        await press(pilot, "G")
        assert isinstance(app.screen, ConfirmScreen) and "routed back to its earlier revision" in str(
            app.screen.what_happens)
        await press(pilot, "y")
        assert static.calls[1:] == [("accept warnings",), ("stop consumers",)]
        assert isinstance(app.screen, DrainScreen)

        # The same screens as a deploy: the route, then the end with the revision that serves now.
        static.emit(PhaseChanged("deploying"))
        static.emit(PhaseChanged("done"))
        static.emit(RunFinished("rolled_back", 0, "Rolled back (worker serves revision worker-00041-kqz): 3 "
                                "worker(s) consume again.", targets=(TargetRolledBack(
                                    "worker", "worker-00041-kqz", previous_revision="worker-00042-abc"),)))
        await settle(pilot)
        assert isinstance(app.screen, DeployScreen)
        assert "rollback" in str(app.screen.query_one("#deploy-title").render())
        assert any("worker-00041-kqz" in line.text for line in app.model.log)
        await press(pilot, "q")
    assert app.return_value == 0


async def test_watch_mode_neither_offers_nor_performs_a_rollback(app_factory: Any) -> None:
    static = backend(read_only=True)
    app = app_factory(static)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "r", "down")
        assert highlighted(app).run_id == DEPLOYED.run_id
        registered = {binding.key for _, binding in app.screen._bindings}
        assert "B" not in registered and app.screen.check_action("rollback", ()) is False
        await press(pilot, "B")
        assert isinstance(app.screen, RunsScreen) and not any(c[0] == "start rollback" for c in static.calls)
