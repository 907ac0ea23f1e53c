"""The console as an operator sees it at 80x24: nothing important cut off or pushed off-screen, footers (dialogs
too) show the keys that work, the palette's Quit asks like q, tables keep the cursor across polls."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from pilothelp import type_filter, until_true
from test_pilot import deploy_backend, press, settle  # the Pilot tests' helpers (tests/console is on sys.path)
from test_snapshots import autoscale_backend, keys, tables_settled
from textual.widgets import DataTable, Footer, Static
from textual.widgets._footer import FooterKey

from celeryops.console import sample
from celeryops.console.screens.confirm import ConfirmScreen
from celeryops.console.screens.deploy import conditions_text
from celeryops.console.screens.drain import DrainScreen
from celeryops.console.screens.home import HomeScreen
from celeryops.console.screens.preflight import PreflightScreen
from celeryops.console.screens.quit import QuitScreen
from celeryops.console.static import StaticBackend
from celeryops.console.widgets.meters import Countdown, WorkerBadges, compact_left
from celeryops.console.widgets.status_bar import StatusBar
from celeryops.ops.backend.views import Condition

SMALL = (80, 24)


def footer_keys(app: Any) -> set[str]:
    """The keys the footer on top shows (a dialog's own footer covers the screen's)."""
    footer = app.screen.query_one(Footer)
    return {key.key_display for key in footer.query(FooterKey)}


async def footer_shows(pilot: Any, cond: Any, timeout: float = 30.0) -> bool:
    """Whether the footer comes to satisfy ``cond`` (it recomposes a few messages after the bindings change)."""
    deadline = time.monotonic() + timeout
    while not cond(footer_keys(pilot.app)):
        if time.monotonic() > deadline:
            return False
        await pilot.pause()
    return True


async def test_dialog_footer_shows_the_dialog_keys(app_factory: Any) -> None:
    app = app_factory(deploy_backend(), start="deploy", release="v2.14.0")
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        assert await footer_shows(pilot, lambda k: {"G", "h", "q"} <= k), footer_keys(app)
        await press(pilot, "G")
        assert isinstance(app.screen, ConfirmScreen)
        # not G/h (inactive under the dialog), not q (does nothing there)
        assert await footer_shows(pilot, lambda k: k == {"y", "n"}), footer_keys(app)
        await press(pilot, "n", "q")
        assert isinstance(app.screen, QuitScreen)
        assert await footer_shows(pilot, lambda k: k == {"A", "d", "s"}), footer_keys(app)


async def test_textual_quit_asks_during_a_run(app_factory: Any) -> None:
    app = app_factory(deploy_backend(), start="deploy", release="v2.14.0")
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        titles = [cmd.title for cmd in app.get_system_commands(app.screen)]
        assert titles.count("Quit (q)") == 1 and "Quit" not in titles  # Textual's own Quit would not ask
        assert not any(t.startswith(("Cursor", "Focus", "Copy")) for t in titles)  # widget keys are not actions
        await app.action_quit()  # what Textual's Quit command and ctrl+q call
        await settle(pilot)
        assert isinstance(app.screen, QuitScreen) and app.is_running


async def test_status_bar_keeps_the_mode_on_a_narrow_terminal(app_factory: Any) -> None:
    backend = StaticBackend(fleet=sample.fleet(), read_only=True,
                            fleet_display="redis://:***@a-very-long-broker-hostname.internal.example.com:6379/0 · "
                                          "fakeredis (no redis-server on PATH): state is lost at exit")
    app = app_factory(backend)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        line = app.screen.query_one(StatusBar).render().plain
        assert len(line) == 80 and line.endswith(" READ-ONLY ") and "…" in line


async def test_home_fits_80_columns_and_keeps_the_cursor(app_factory: Any) -> None:
    app = app_factory()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, HomeScreen) and screen.has_class("-narrow", "-short")
        workers = screen.query_one("#workers", DataTable)
        assert workers.max_scroll_x == 0  # every column in view: no horizontal scrolling
        await press(pilot, "down", "down")
        assert workers.cursor_row == 2
        fleet = sample.fleet()
        screen.show_fleet(replace(fleet, workers=(*fleet.workers, replace(fleet.workers[0], name="celery@new"))))
        await settle(pilot)
        assert workers.row_count == 6 and workers.cursor_row == 2  # a poll does not move the cursor


async def test_filter_clear_key_shows_only_while_filtering(app_factory: Any) -> None:
    app = app_factory()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        assert await footer_shows(pilot, lambda k: "esc" not in k and "/" in k), footer_keys(app)
        await type_filter(pilot, "gpu")
        # typing: / goes into the box
        assert await footer_shows(pilot, lambda k: "esc" in k and "/" not in k), footer_keys(app)
        await press(pilot, "escape")
        assert app.screen.needle == ""
        assert await footer_shows(pilot, lambda k: "esc" not in k), footer_keys(app)


async def test_preflight_wraps_under_the_title_not_the_icon(app_factory: Any) -> None:
    app = app_factory(deploy_backend(), start="deploy", release="v2.14.0")
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, PreflightScreen)
        check = app.screen.query_one("#check-workers")
        lines = [strip.text for strip in check.render_lines(check.region.reset_offset)]
        assert lines[0].lstrip().startswith("▲ warn") and lines[1].startswith(" " * 7)


def test_conditions_from_ops_and_from_the_api_get_icons() -> None:
    for state in ("succeeded", "CONDITION_SUCCEEDED"):
        assert conditions_text([Condition("RoutesReady", state)]).plain == "✔ Routes"
    assert conditions_text([Condition("Ready", "failed"), Condition("ConfigurationsReady", "pending")]).plain == \
        "✘ Ready … Config"


def test_badges_put_unknown_first_and_sum_up_what_does_not_fit() -> None:
    badges = WorkerBadges()
    badges.states = {f"celery@worker-{i:02d}.example": "stopped" for i in range(30)} | {"celery@z": "unknown"}
    lines = badges.render_badges(78).plain.split("\n")
    assert len(lines) == 3 and all(len(line) <= 78 for line in lines)
    assert lines[0].startswith("Workers  celery@z ")  # the worker that blocks the drain stays in view
    assert "more (" in lines[-1] and "stopped)" in lines[-1]


def test_countdown_shortens_the_time_rather_than_cutting_it() -> None:
    countdown = Countdown()
    countdown.elapsed, countdown.remaining = 60.0, 3 * 3600 + 5 * 60
    assert countdown.render_countdown(100).plain.endswith(" 3 hours and 5 minutes left · 1m 00s in")
    medium = countdown.render_countdown(50).plain  # the elapsed time stays while it fits
    assert medium.endswith(" 3h 05m left · 1m 00s in") and len(medium) <= 50
    narrow = countdown.render_countdown(30).plain
    assert narrow.endswith(" 3h 05m left") and len(narrow) <= 30
    assert compact_left(59.6) == "1m 00s" and compact_left(42) == "42s"


async def test_watch_says_when_the_published_status_stops(app_factory: Any) -> None:
    now = [sample.NOW]
    backend = StaticBackend(fleet=sample.fleet(), read_only=True, follow_script=sample.drain_script())
    app = app_factory(backend, clock=lambda: now[0])
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, DrainScreen)
        title = screen.query_one("#drain-title", Static)
        assert "no update" not in str(title.render())
        now[0] += 125  # the operator's console died: nothing more is published
        screen._show_title(app.model)
        await settle(pilot)
        assert "no update for 2 minutes" in str(title.render())


async def test_a_table_refitted_to_a_narrower_terminal_drops_the_scrollbar_it_no_longer_needs(
        app_factory: Any) -> None:
    """The autoscaler's cohorts at 140 columns, then 100: the revision column is cut to the narrower table, which
    then needs no horizontal scrollbar, and the table (``height: auto``) is as tall as its header and rows again.
    Textual left the scrollbar of the wider rows in place, one line more, until the next resize."""
    app = app_factory(autoscale_backend())
    async with app.run_test(size=(140, 30)) as pilot:
        await keys("a")(pilot)
        cohorts = app.screen.query_one("#cohorts", DataTable)
        wide = cohorts.virtual_size.width
        await pilot.resize_terminal(100, 30)
        await until_true(pilot, lambda: cohorts.virtual_size.width < wide, "the cohorts refitted to 100 columns")
        await tables_settled(pilot)
        assert cohorts.virtual_size.width <= cohorts.scrollable_content_region.width, "the refitted rows overflow"
        assert not cohorts.show_horizontal_scrollbar
        rows = cohorts.row_count + 1  # and the header
        await until_true(pilot, lambda: cohorts.size.height == rows, f"the cohorts {rows} lines high")
