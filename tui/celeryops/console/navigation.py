"""Which screen the console shows, and what its command palette offers (the keys of the screen on show).

The run screens are imported when first shown: the home view's first frame does not wait for them (nor for the
events and views of the ops layer they read).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from textual.app import App, SystemCommand
from textual.screen import Screen

from celeryops.console.model import View
from celeryops.console.screens.base import ConsoleScreen

RUN_VIEWS: tuple[View, ...] = ("preflight", "drain", "deploy", "overlap", "canary")


def run_screen(view: View) -> type[ConsoleScreen]:
    """The screen that shows a run in this phase."""
    if view == "preflight":
        from celeryops.console.screens.preflight import PreflightScreen

        return PreflightScreen
    if view == "drain":
        from celeryops.console.screens.drain import DrainScreen

        return DrainScreen
    if view == "overlap":
        from celeryops.console.screens.overlap import OverlapScreen

        return OverlapScreen
    if view == "canary":
        from celeryops.console.screens.canary import CanaryScreen

        return CanaryScreen
    from celeryops.console.screens.deploy import DeployScreen

    return DeployScreen


def showing(screen: Screen, module: str, name: str) -> bool:
    """Whether ``screen`` is a ``celeryops.console.screens.<module>.<name>``: a screen module not imported yet has
    no screen on show."""
    loaded = sys.modules.get(f"celeryops.console.screens.{module}")
    return loaded is not None and isinstance(screen, getattr(loaded, name))


def key_commands(app: App[int], screen: Screen) -> Iterator[SystemCommand]:
    """What the console's keys do on ``screen``, as palette commands (only what is allowed; not Textual's cursor and
    focus keys): one entry per action, under the key the footer shows."""
    commands: dict[str, tuple[bool, SystemCommand]] = {}
    for active in screen.active_bindings.values():
        binding, node = active.binding, active.node
        if binding.id is None or not binding.description or not active.enabled:
            continue  # every binding of the console has an id; Textual's own have none
        if binding.action in commands and (commands[binding.action][0] or not binding.show):
            continue  # one entry per action, under the key the footer shows
        commands[binding.action] = (binding.show, SystemCommand(
            f"{binding.description} ({app.get_key_display(binding)})", binding.tooltip or binding.description,
            lambda node=node, action=binding.action: app.run_action(action, node)))
    yield from (command for _, command in commands.values())
