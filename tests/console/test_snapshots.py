"""SVG snapshots of every screen in its main states (fixed size, theme, clock; no animations).
Update with ``pytest tests/console --snapshot-update`` after looking at the change."""

from __future__ import annotations

import time
from typing import Any

from pilothelp import type_filter
from textual.widgets import DataTable

from celeryops.console import sample
from celeryops.console.static import StaticBackend
from celeryops.core.events import DrainFinished, FleetBack, PhaseChanged

SIZE = (100, 30)
SMALL = (80, 24)


async def tables_settled(pilot: Any, timeout: float = 30.0) -> None:
    """Wait until every DataTable on screen has measured its new rows and cells (DataTable does it when its message
    queue is empty: on a loaded machine the screenshot could come first and show header-wide columns)."""
    deadline = time.monotonic() + timeout
    last: tuple[int, int] | None = None
    while True:  # settled, and still the same screen with the same rows one pause later (a push may be pending)
        await pilot.pause()
        screen = pilot.app.screen
        tables = list(screen.query(DataTable))
        busy = not screen.is_mounted or any(t._require_update_dimensions or t._updated_cells for t in tables)
        seen = (id(screen), sum(t.row_count for t in tables))
        if not busy and seen == last:
            return
        last = None if busy else seen
        assert time.monotonic() < deadline, "the screen's tables never settled"


def keys(*names: str) -> Any:
    """Press keys one at a time, letting the app settle (workers, messages, table widths) before each."""

    async def run_before(pilot: Any) -> None:
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        for name in names:
            await pilot.press(name)
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()
        await tables_settled(pilot)

    return run_before


def deploy_backend(**kwargs: Any) -> StaticBackend:
    kwargs.setdefault("preflight_script", sample.preflight_script())
    kwargs.setdefault("proceed_script", sample.drain_script())
    return StaticBackend(fleet=sample.fleet(), slots=sample.slots(), **kwargs)


def test_home(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(), run_before=keys(), terminal_size=SIZE)


def test_home_read_only(snap_compare: Any, app_factory: Any) -> None:
    backend = StaticBackend(fleet=sample.fleet(with_run=False), slots=None, read_only=True)
    assert snap_compare(app_factory(backend), run_before=keys(), terminal_size=SMALL)


def test_preflight_running(snap_compare: Any, app_factory: Any) -> None:
    backend = deploy_backend(preflight_script=sample.preflight_script(done=False))
    assert snap_compare(app_factory(backend, start="deploy", release="v2.14.0"), terminal_size=SMALL)


def test_preflight_warning(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(deploy_backend(), start="deploy", release="v2.14.0"), terminal_size=SMALL)


def test_preflight_failed(snap_compare: Any, app_factory: Any) -> None:
    from celeryops.core.events import PreflightDone
    backend = deploy_backend(preflight_script=[*sample.failed_checks(), PreflightDone(failed=1, warnings=1)])
    assert snap_compare(app_factory(backend, start="deploy", release="v2.14.0"), terminal_size=SIZE)


def test_confirm_warnings(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(deploy_backend(), start="deploy", release="v2.14.0"), run_before=keys("G"),
                        terminal_size=SIZE)


def test_drain(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(deploy_backend(), start="deploy", release="v2.14.0"), run_before=keys("G", "y"),
                        terminal_size=SIZE)


def test_drain_small(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(deploy_backend(), start="deploy", release="v2.14.0"), run_before=keys("G", "y"),
                        terminal_size=SMALL)


def test_quit_mid_drain(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(deploy_backend(), start="deploy", release="v2.14.0"),
                        run_before=keys("G", "y", "q"),
                        terminal_size=SIZE)


def test_drain_timeout(snap_compare: Any, app_factory: Any) -> None:
    """Max wait reached with a task still running: the clock stops on the outcome, consumers come back."""
    script = [*sample.drain_script(), sample.progress(2, 0, 1200.0),
              DrainFinished("timeout", 1200.0, "Timed out after 20 minutes: consumers restored, nothing was killed."),
              PhaseChanged("aborted", "timeout: consumers restored")]
    app = app_factory(deploy_backend(proceed_script=script), start="deploy", release="v2.14.0")
    assert snap_compare(app, run_before=keys("G", "y"), terminal_size=SIZE)


def deploy_app(app_factory: Any, *after_drain: object) -> Any:
    """A deploy that drained and then sees ``after_drain`` (rollout updates, fleet back, phases)."""
    script = [*sample.drain_script(), sample.progress(0, 3, 630.0), PhaseChanged("deploying"), *after_drain]
    return app_factory(deploy_backend(proceed_script=script), start="deploy", release="v2.14.0")


def resume_app(app_factory: Any) -> Any:
    return app_factory(StaticBackend(fleet=sample.fleet(), slots=sample.slots(), run=sample.unfinished_run()))


def test_deploy_rolling(snap_compare: Any, app_factory: Any) -> None:
    app = deploy_app(app_factory, *sample.deploy_events("rolling"))
    assert snap_compare(app, run_before=keys("G", "y"), terminal_size=SIZE)


def test_deploy_done(snap_compare: Any, app_factory: Any) -> None:
    app = deploy_app(app_factory, *sample.deploy_events("ready"), FleetBack(sample.fleet_back()),
                     PhaseChanged("done", "v2.14.0 is live"))
    assert snap_compare(app, run_before=keys("G", "y"), terminal_size=SIZE)


def test_slots(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(), run_before=keys("s"), terminal_size=SIZE)


def test_resume_panel(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(resume_app(app_factory), terminal_size=SIZE)


def test_home_interrupted(snap_compare: Any, app_factory: Any) -> None:
    """Issue 22: a run whose owner died; its panel opened by itself at the poll, Esc shows the home view's header
    (interrupted, the phase it reached, whose, since when) and the drained queues at 0 consumers."""
    backend = StaticBackend(fleet=sample.interrupted_fleet(), slots=sample.slots())
    assert snap_compare(app_factory(backend), run_before=keys("escape"), terminal_size=SIZE)


def test_home_stranded(snap_compare: Any, app_factory: Any) -> None:
    """Issue 22: a plain worker a broker reconnect left consuming nothing after the last restore; X restores again."""
    backend = StaticBackend(fleet=sample.stranded_fleet(), slots=sample.slots())
    assert snap_compare(app_factory(backend), run_before=keys(), terminal_size=SIZE)


def test_home_findings(snap_compare: Any, app_factory: Any) -> None:
    """Issue 37: `celeryops doctor`'s findings and a live one (a redelivery) in their panel above the queues."""
    backend = StaticBackend(fleet=sample.findings_fleet(), slots=sample.slots())
    assert snap_compare(app_factory(backend), run_before=keys(), terminal_size=SIZE)


def test_home_findings_small(snap_compare: Any, app_factory: Any) -> None:
    backend = StaticBackend(fleet=sample.findings_fleet(), slots=sample.slots())
    assert snap_compare(app_factory(backend), run_before=keys(), terminal_size=SMALL)


# The main screens at 80x24 (compact layout: -narrow -short) and the drain at 200x50 (-wide -tall).
WIDE = (200, 50)


def test_home_small(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(), run_before=keys(), terminal_size=SMALL)


def test_deploy_rolling_small(snap_compare: Any, app_factory: Any) -> None:
    app = deploy_app(app_factory, *sample.deploy_events("rolling"))
    assert snap_compare(app, run_before=keys("G", "y"), terminal_size=SMALL)


def test_slots_small(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(), run_before=keys("s"), terminal_size=SMALL)


def test_resume_panel_small(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(resume_app(app_factory), terminal_size=SMALL)


def test_quit_mid_drain_small(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(deploy_backend(), start="deploy", release="v2.14.0"),
                        run_before=keys("G", "y", "q"), terminal_size=SMALL)


def test_confirm_warnings_small(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(deploy_backend(), start="deploy", release="v2.14.0"), run_before=keys("G"),
                        terminal_size=SMALL)


def test_drain_wide(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(deploy_backend(), start="deploy", release="v2.14.0"), run_before=keys("G", "y"),
                        terminal_size=WIDE)


# Issue 15's views at 80x24 and 120x40: the release picker, the run history with a timeline open, every slot pool,
# and the watcher's home between runs (workers listed, not asked).
LARGE = (120, 40)


def picker_backend() -> StaticBackend:
    return StaticBackend(fleet=sample.fleet(with_run=False), slots=sample.slots(), releases_view=sample.releases(),
                         history=sample.history(), timelines={sample.history()[1].run_id: sample.timeline()})


def test_releases(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(picker_backend()), run_before=keys("D", "down"), terminal_size=LARGE)


def test_releases_small(snap_compare: Any, app_factory: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await keys("D")(pilot)
        await type_filter(pilot, "13")
        await tables_settled(pilot)

    assert snap_compare(app_factory(picker_backend()), run_before=run_before, terminal_size=SMALL)


def test_runs(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(picker_backend()), run_before=keys("r", "down", "enter"), terminal_size=LARGE)


def test_runs_small(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(picker_backend()), run_before=keys("r", "down", "enter"), terminal_size=SMALL)


def test_slots_large(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(), run_before=keys("s"), terminal_size=LARGE)


def test_drain_large(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(deploy_backend(), start="deploy", release="v2.14.0"), run_before=keys("G", "y"),
                        terminal_size=LARGE)


def watch_idle_backend() -> StaticBackend:
    from dataclasses import replace

    listed = tuple(replace(w, state="unknown", active=0, reserved=0, scheduled=0, queues=(), observed=False)
                   for w in sample.workers())
    return StaticBackend(fleet=sample.FleetView(workers=listed, queues=sample.fleet().queues), slots=sample.slots(),
                         read_only=True)


def test_home_watch_idle(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(watch_idle_backend()), run_before=keys(), terminal_size=LARGE)


def test_home_watch_idle_small(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(watch_idle_backend()), run_before=keys(), terminal_size=SMALL)


def overlap_backend() -> StaticBackend:
    return StaticBackend(fleet=sample.fleet(), slots=sample.slots(), preflight_script=sample.overlap_preflight_script(),
                         proceed_script=sample.overlap_script())


def test_overlap_confirm(snap_compare: Any, app_factory: Any) -> None:
    """G on an overlap deploy's checklist: the peak instance count, the old revision drained while the new one
    consumes, nothing killed; the mixed_versions warning listed like any warning."""
    assert snap_compare(app_factory(overlap_backend(), start="deploy", release="v2.14.0"), run_before=keys("G"),
                        terminal_size=SIZE)


def test_overlap_deploy(snap_compare: Any, app_factory: Any) -> None:
    """An overlap deploy mid-run: both revisions side by side (instances, split, the new one's tasks per second),
    the old revision's drain below (streak, countdown, the tasks it still runs)."""
    assert snap_compare(app_factory(overlap_backend(), start="deploy", release="v2.14.0"), run_before=keys("G", "y"),
                        terminal_size=SIZE)


def canary_backend() -> StaticBackend:
    from celeryops.console.samplecanary import canary_script

    return StaticBackend(fleet=sample.fleet(), slots=sample.slots(),
                         preflight_script=sample.overlap_preflight_script("canary"), proceed_script=canary_script())


def test_canary(snap_compare: Any, app_factory: Any) -> None:
    """A canary four looks in: the verdict so far and what would decide it, the statistic, both revisions and each
    task name (completed, failed, rate with its interval, p50/p95), the keys P, B and Z."""
    assert snap_compare(app_factory(canary_backend(), start="deploy", release="v2.14.0"), run_before=keys("G", "y"),
                        terminal_size=(140, 45))


def test_canary_small(snap_compare: Any, app_factory: Any) -> None:
    assert snap_compare(app_factory(canary_backend(), start="deploy", release="v2.14.0"), run_before=keys("G", "y"),
                        terminal_size=SMALL)


def autoscale_backend(read_only: bool = False) -> StaticBackend:
    from celeryops.console import samplescale

    return StaticBackend(fleet=sample.fleet(with_run=False), slots=sample.slots(), scale=samplescale.status(),
                         read_only=read_only)


def test_autoscale(snap_compare: Any, app_factory: Any) -> None:
    """a on the home view: the autoscaler's plot of demand against capacity, its cohorts (one draining), the demand
    per queue (ETA apart) and its decisions with their reasons."""
    assert snap_compare(app_factory(autoscale_backend()), run_before=keys("a"), terminal_size=SIZE)


def test_autoscale_watch_small(snap_compare: Any, app_factory: Any) -> None:
    """The same in ``celeryops watch`` (read-only), at 80x24."""
    assert snap_compare(app_factory(autoscale_backend(read_only=True)), run_before=keys("a"), terminal_size=SMALL)


def test_autoscale_none(snap_compare: Any, app_factory: Any) -> None:
    """No autoscaler has published on this fleet: one sentence says how to start one."""
    backend = StaticBackend(fleet=sample.fleet(with_run=False), slots=sample.slots())
    assert snap_compare(app_factory(backend), run_before=keys("a"), terminal_size=SMALL)
