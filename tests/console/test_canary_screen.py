"""The canary screen over scripted ``canary_look`` events (a StaticBackend): it opens by itself with the first
look, shows both revisions and each task name, and its keys send typed decisions after a confirmation; a watcher
sees the same screen without them."""

from __future__ import annotations

from typing import Any

from test_pilot import press, settle  # the Pilot tests' helpers (tests/console is on sys.path)
from textual.widgets import DataTable

from celeryops.console import sample
from celeryops.console.samplecanary import canary_look, canary_script
from celeryops.console.screens.canary import CanaryScreen
from celeryops.console.screens.confirm import ConfirmScreen
from celeryops.console.static import StaticBackend
from celeryops.core.events import PhaseChanged
from celeryops.ops.run.decisions import PauseCanary, PromoteNow, RollbackNow

SIZE = (140, 45)


def backend(**kw: Any) -> StaticBackend:
    kw.setdefault("preflight_script", sample.overlap_preflight_script("canary"))
    kw.setdefault("proceed_script", canary_script())
    return StaticBackend(fleet=sample.fleet(), slots=sample.slots(), **kw)


def cells(app: Any, key: str) -> list[str]:
    return [str(cell) for cell in app.screen.query_one("#sides", DataTable).get_row(key)]


async def test_the_screen_opens_with_the_first_look_and_shows_both_sides(app_factory: Any) -> None:
    app = app_factory(backend(), start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y")
        assert isinstance(app.screen, CanaryScreen)
        assert cells(app, "canary")[:5] == [sample.NEW_REV, "canary", "38", "2", "5.3%"]
        assert cells(app, "baseline")[:5] == [sample.OLD_REV, "baseline", "412", "5", "1.2%"]
        assert cells(app, "media.transcode\x00canary")[0].strip() == "media.transcode"
        verdict = str(app.screen.query_one("#canary-verdict").render())
        assert "CONTINUE" in verdict and "look 4/30" in verdict and "Decides it: promote after 57" in verdict
        assert "Fisher p 0.111" in str(app.screen.query_one("#statistic").render())


async def test_keys_send_the_decisions_after_a_confirmation(app_factory: Any) -> None:
    app = app_factory(backend(), start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y")
        await press(pilot, "P")
        assert isinstance(app.screen, ConfirmScreen)
        assert "the overlap's cutover" in str(app.screen.query_one("#dialog-body").render())
        await press(pilot, "escape")  # declined: nothing sent
        assert app.backend.decisions == [] and isinstance(app.screen, CanaryScreen)
        await press(pilot, "P", "y")
        await press(pilot, "B", "y")
        await press(pilot, "Z", "y")
        assert app.backend.decisions == [PromoteNow(), RollbackNow(), PauseCanary(paused=True)]
        assert ("canary", "pause") in app.backend.calls
        app.backend.emit(canary_look(5, (500, 6), (45, 2), paused=True))  # the run says it is paused now
        await settle(pilot)
        await press(pilot, "Z")
        assert "Resume the canary's verdicts?" in str(app.screen.query_one("#dialog-title").render())
        await press(pilot, "y")
        assert app.backend.decisions[-1] == PauseCanary(paused=False)


async def test_keys_are_disabled_once_the_run_decided_or_ended(app_factory: Any) -> None:
    app = app_factory(backend(), start="deploy", release="v2.14.0")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "G", "y")
        app.backend.emit(canary_look(6, (600, 6), (180, 60)))
        await settle(pilot)
        assert app.model.canary is not None and app.model.canary.verdict == "rollback"
        await press(pilot, "P", "B")
        assert app.backend.decisions == [] and isinstance(app.screen, CanaryScreen)
        app.backend.emit(PhaseChanged("done"))
        await settle(pilot)
        await press(pilot, "Z")
        assert app.backend.decisions == []


async def test_a_watcher_sees_the_canary_without_its_keys(app_factory: Any) -> None:
    watched = StaticBackend(fleet=sample.fleet(), slots=sample.slots(), read_only=True, follow_script=canary_script())
    app = app_factory(watched)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "w")
        assert isinstance(app.screen, CanaryScreen)
        keys = {b.key for _, b in app.screen._bindings}
        assert not keys & {"P", "B", "Z"} and "h" in keys
        await press(pilot, "P", "B", "Z")
        assert watched.decisions == [] and not any(call[0] == "refused" for call in watched.calls)
        assert isinstance(app.screen, CanaryScreen) and cells(app, "canary")[2] == "38"
