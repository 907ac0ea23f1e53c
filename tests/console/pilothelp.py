"""Typing into a screen's filter box the way an operator does, and waiting until the screen has applied it.

A key reaches the box through several messages (app, screen, the box), and the box tells its screen through one
more (``Input.Changed``): one ``pilot.pause()`` after the last key is not enough on a loaded machine, so the
helper waits on the conditions it needs, each with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual.widgets import Input

from celeryops.console.widgets.task_table import TaskTable


async def until_true(pilot: Any, cond: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await pilot.pause(0.02)


def filter_applied(screen: Any, text: str) -> bool:
    """Whether ``screen`` shows what it shows under the filter ``text`` (the fleet and release lists keep it as
    ``needle``, the task tables as their ``filter``)."""
    needle = getattr(screen, "needle", None)
    if needle is not None:
        return bool(needle == text)
    return any(table.filter == text for table in screen.query(TaskTable))


async def type_filter(pilot: Any, text: str, timeout: float = 30.0) -> None:
    """``/``, then ``text`` key by key; returns once the screen's rows are chosen by ``text``."""
    app = pilot.app
    await pilot.press("slash")
    await until_true(pilot, lambda: isinstance(app.focused, Input), "the filter box to take the focus", timeout)
    box = app.focused
    for char in text:
        await pilot.press(char)
    await until_true(pilot, lambda: box.value == text, f"the filter box to read {text!r}", timeout)
    await until_true(pilot, lambda: filter_applied(app.screen, text.strip()), f"the filter {text!r} applied",
                     timeout)
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
