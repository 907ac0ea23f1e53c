"""Issue 34 (the console's start): Textual's parsed stylesheets kept from one start to the next
(``console/csscache.py``).

- a first start writes them (0600, in the user's cache folder) once its screen is shown; the next start is handed
  every one of them before it runs, parses none, and paints exactly what a start without them paints;
- a file written for other theme variables, or for another Textual, or that is not a pickle of rules, is not used
  (the CSS is parsed as always); a cache folder that cannot be written costs only the parse.
"""

from __future__ import annotations

import pickle
import stat
from pathlib import Path

import pytest
from tests.console.conftest import build_app

from celeryops.console import csscache
from celeryops.console.app import ConsoleApp

SIZE = (120, 40)


async def screen_of(app: ConsoleApp) -> tuple[str, int]:
    """The console's home screen as text (its first poll shown), and how many stylesheets its start parsed."""
    parsed = 0
    parse = app.stylesheet._parse_rules

    def counting(*args: object, **kwargs: object) -> object:
        nonlocal parsed
        if args[0] not in {key[0] for key in app.stylesheet._parse_cache.keys()}:  # noqa: SIM118 (no __iter__)
            parsed += 1
        return parse(*args, **kwargs)  # type: ignore[arg-type]

    app.stylesheet._parse_rules = counting  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
        return app.export_screenshot(), parsed


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(csscache, "_kept", {})  # what this process wrote, as a fresh process
    return csscache.cache_file()


async def test_the_next_start_parses_nothing_and_paints_the_same(cache: Path) -> None:
    cold, parsed_cold = await screen_of(build_app())
    assert parsed_cold > 5 and cache.is_file()  # App, Screen, DataTable, Footer, ..., base.tcss, home.tcss
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600

    csscache._kept.clear()
    warm_app = build_app()
    handed = len(warm_app.stylesheet._parse_cache)
    warm, parsed_warm = await screen_of(warm_app)
    assert handed >= parsed_cold and parsed_warm == 0
    assert warm == cold


async def test_rules_of_other_variables_another_textual_or_not_rules_are_not_used(cache: Path) -> None:
    await screen_of(build_app())
    kept = pickle.loads(cache.read_bytes())
    reference, _ = await screen_of(build_app())

    for changed in ({**kept, "variables": {**kept["variables"], "primary": "#ff0000"}},
                    {**kept, "textual": ("/elsewhere/textual",)},
                    {**kept, "rules": {key: ["not a rule"] for key in kept["rules"]}}):
        cache.write_bytes(pickle.dumps(changed))
        app = build_app()
        assert len(app.stylesheet._parse_cache) == 0
        screen, parsed = await screen_of(app)
        assert parsed > 5 and screen == reference

    cache.write_bytes(b"\x80\x05 not a pickle")
    app = build_app()
    assert len(app.stylesheet._parse_cache) == 0
    screen, _ = await screen_of(app)
    assert screen == reference


async def test_a_cache_folder_that_cannot_be_made_costs_only_the_parse(cache: Path) -> None:
    cache.parent.parent.mkdir(parents=True)
    cache.parent.write_text("a file where the cache folder would be\n")  # no folder can be made there, root or not
    for _ in range(2):
        _, parsed = await screen_of(build_app())
        assert parsed > 5 and cache.parent.is_file()
