"""Issue 30: the home view shows the broker's safety: a few words on the hint line always, and the banner says
that a drain or deploy is refused while the broker may evict keys."""

from __future__ import annotations

import dataclasses
from typing import Any

from textual.widgets import Static

from celeryops.console import sample
from celeryops.console.static import StaticBackend
from celeryops.ops.backend.views import BrokerSafetyView


async def _home_texts(app_factory: Any, safety: BrokerSafetyView | None) -> tuple[str, str]:
    fleet = dataclasses.replace(sample.fleet(with_run=False), broker_safety=safety)
    app = app_factory(StaticBackend(fleet=fleet, slots=sample.slots()))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        screen = app.screen_stack[0]
        hint = screen.query_one("#hint", Static).render()
        banner = screen.query_one("#run-banner", Static).render()
        return str(getattr(hint, "plain", hint)), str(getattr(banner, "plain", banner))


async def test_home_shows_an_evicting_broker_and_that_runs_are_refused(app_factory: Any) -> None:
    hint, banner = await _home_texts(app_factory, BrokerSafetyView("fail", "evicts keys (allkeys-lru, maxmemory "
                                                                           "512.0 MiB)"))
    assert "broker evicts keys (allkeys-lru, maxmemory 512.0 MiB)" in hint
    assert "a drain or deploy is refused until its maxmemory-policy is noeviction" in banner


async def test_home_shows_a_safe_broker_quietly(app_factory: Any) -> None:
    hint, banner = await _home_texts(app_factory, BrokerSafetyView("ok", "noeviction, AOF"))
    assert "broker noeviction, AOF" in hint and "refused" not in banner
    hint, _ = await _home_texts(app_factory, None)  # not read (yet): nothing is claimed
    assert "broker" not in hint
