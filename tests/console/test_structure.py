"""Static rules of the console: every binding has an id and a tooltip, dangerous actions sit on uppercase keys,
every screen has its stylesheet, and the styles are found from the checkout."""

from __future__ import annotations

import inspect

from textual.binding import Binding
from textual.screen import Screen

from celeryops.console import app as app_module
from celeryops.console.screens import (
    autoscale,
    base,
    canary,
    confirm,
    deploy,
    drain,
    home,
    overlap,
    preflight,
    quit,
    releases,
    resume,
    runs,
    slots,
)
from celeryops.console.stylesheets import styles_dir, stylesheets

SCREEN_MODULES = (home, drain, preflight, deploy, overlap, canary, slots, resume, autoscale)
STYLED_MODULES = (*SCREEN_MODULES, releases, runs)  # the screens with a stylesheet of their own


def screen_classes() -> list[type[Screen]]:
    found: list[type[Screen]] = [app_module.ConsoleApp]  # type: ignore[list-item]
    for module in (*SCREEN_MODULES, confirm, quit):
        found += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, Screen) and cls.__module__ == module.__name__]
    return found


def test_every_binding_has_id_and_tooltip() -> None:
    for cls in screen_classes():
        for binding in cls.BINDINGS:
            assert isinstance(binding, Binding), (cls, binding)
            assert binding.id and binding.tooltip, (cls.__name__, binding.key)


def test_dangerous_actions_use_uppercase_keys() -> None:
    for cls in screen_classes():
        dangerous = getattr(cls, "DANGEROUS", frozenset())
        for binding in cls.BINDINGS:
            assert isinstance(binding, Binding)
            if binding.action.split("(")[0] in dangerous:
                assert all(k.isupper() and len(k) == 1 for k in binding.key.split(",")), (cls.__name__, binding)
        assert issubclass(cls, base.ConsoleScreen) or not dangerous


def test_each_screen_has_its_stylesheet() -> None:
    """The application loads base.tcss; each screen brings its own file (read when it is first shown), and every
    file in styles/ is some screen's."""
    names = {path.name for path in stylesheets()}
    assert stylesheets()[0].name == "base.tcss"
    # the default screen's stylesheet is the application's: Textual does not read a default screen's CSS_PATH
    assert [path.name for path in app_module.ConsoleApp.CSS_PATH] == ["base.tcss", "home.tcss"]  # type: ignore[union-attr]
    used = {"base.tcss"}
    for module in STYLED_MODULES:
        name = f"{module.__name__.rsplit('.', 1)[1]}.tcss"
        assert name in names
        screen = next(cls for _, cls in inspect.getmembers(module, inspect.isclass)
                      if cls.__module__ == module.__name__ and issubclass(cls, base.ConsoleScreen))
        paths = [path.name for path in screen.CSS_PATH]  # type: ignore[union-attr]
        assert name in paths, (screen.__name__, paths)
        used.update(paths)
    assert used == names, f"stylesheets no screen loads: {sorted(names - used)}"
    assert styles_dir().is_dir()
