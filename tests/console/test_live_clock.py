"""The drain's live clock: between polls, elapsed time and the countdown to max wait move every second, to the
second, from the console's (injected) clock alone (no poll, no backend call); when the drain ends, the clock stops
and says how it ended."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from test_snapshots import deploy_backend
from textual.widgets import Static

from celeryops.console import sample
from celeryops.console.screens.drain import DrainScreen
from celeryops.console.screens.home import HomeScreen
from celeryops.console.static import StaticBackend
from celeryops.console.widgets.meters import Countdown
from celeryops.core.events import DrainFinished, PhaseChanged


class Clock:
    def __init__(self) -> None:
        self.now = sample.NOW

    def __call__(self) -> float:
        return self.now


async def until(pilot: Any, cond: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


async def drain_on_screen(pilot: Any) -> Countdown:
    for key in ("G", "y"):
        await pilot.app.workers.wait_for_complete()
        await pilot.press(key)
    await until(pilot, lambda: isinstance(pilot.app.screen, DrainScreen) and pilot.app.model.progress is not None,
                "the drain screen")
    return pilot.app.screen.query_one(Countdown)


class Counting(StaticBackend):
    """Counts the fleet polls: the clock must not cause any."""

    polls = 0

    async def fleet_snapshot(self) -> Any:
        self.polls += 1
        return await super().fleet_snapshot()


async def test_the_countdown_ticks_every_second_between_polls_and_stops_when_the_drain_ends(app_factory: Any) -> None:
    clock = Clock()
    backend = deploy_backend()
    counting = Counting(**{f: getattr(backend, f) for f in ("fleet", "slots", "preflight_script", "proceed_script")})
    app = app_factory(counting, start="deploy", release="v2.14.0", clock=clock)
    async with app.run_test(size=(100, 30)) as pilot:
        countdown = await drain_on_screen(pilot)
        last = app.model.progress
        assert last is not None and (last.elapsed, last.remaining) == (420.0, 780.0)
        await until(pilot, lambda: countdown.remaining == 780.0, "the last poll's countdown")
        polls = counting.polls
        for seconds in (1, 2, 3, 65):  # the console's clock moves; no poll arrives
            clock.now = sample.NOW + seconds
            await until(pilot, lambda s=seconds: countdown.remaining == 780.0 - s, f"the clock at +{seconds} s")
            assert countdown.elapsed == 420.0 + seconds
        text = countdown.render_countdown(100).plain
        assert "11 minutes and 55 seconds left" in text and "8m 05s in" in text, text
        assert counting.polls == polls, "the clock polled the fleet"
        counting.emit(sample.progress(2, 0, 540.0))  # a poll arrives: the clock restarts from it
        await until(pilot, lambda: countdown.elapsed == 540.0, "the new poll")
        counting.emit(DrainFinished("timeout", 1200.0, "Timed out: consumers restored, nothing was killed."))
        counting.emit(PhaseChanged("aborted", "timeout: consumers restored"))
        await until(pilot, lambda: countdown.outcome == "timeout", "the drain's end")
        stopped = (countdown.elapsed, countdown.remaining)
        clock.now += 30
        await pilot.pause(1.5)
        assert (countdown.elapsed, countdown.remaining) == stopped == (1200.0, 0.0)
        assert countdown.render_countdown(100).plain.endswith("timeout after 20m 00s")


async def test_the_home_banner_counts_down_between_polls_and_holds_once_the_drain_is_over(app_factory: Any) -> None:
    """A run seen on the home view (this console's or a teammate's, from the published status) shows its time to
    max wait from the last poll less the time since, every second, without polling."""
    clock = Clock()
    fleet = sample.fleet()
    assert fleet.run is not None
    run = dataclasses.replace(fleet.run, remaining=300.0, measured_at=sample.NOW)
    backend = Counting(fleet=dataclasses.replace(fleet, run=run), slots=sample.slots())
    app = app_factory(backend, clock=clock)

    def banner() -> str:
        screen = app.screen
        return str(screen.query_one("#run-banner", Static).render()) if isinstance(screen, HomeScreen) else ""

    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: "5 minutes to max wait" in banner(), "the first poll's banner")
        polls = backend.polls
        clock.now = sample.NOW + 7
        await until(pilot, lambda: "4 minutes and 53 seconds to max wait" in banner(), "the banner at +7 s")
        clock.now = sample.NOW + 400  # past max wait: it reads zero, never negative
        await until(pilot, lambda: "0 seconds to max wait" in banner(), "the banner past max wait")
        assert backend.polls == polls, "the banner's clock polled the fleet"
        backend.fleet = dataclasses.replace(fleet, run=dataclasses.replace(run, phase="drained", remaining=120.0))
        app.poll_now()
        await until(pilot, lambda: "drained" in banner(), "the drained run")
        clock.now += 60
        await pilot.pause(1.5)
        assert "2 minutes to max wait" in banner(), "a drain that is over does not count down"
