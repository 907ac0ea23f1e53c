"""The ``/`` filter box (``#filter``) of the home, drain, overlap and release screens: ``/`` opens it, typing
filters, Enter leaves it for the filtered widget, Esc clears it (and hides it again)."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding
from textual.widgets import Input

from celeryops.console.screens.base import ConsoleScreen


def filter_bindings(screen: str, filter_tip: str, clear_tip: str) -> list[Binding]:
    """``/`` filter and ``Esc`` clear filter (in the footer only while a filter is set)."""
    return [
        Binding("slash", "filter", "Filter", id=f"{screen}.filter", key_display="/", tooltip=filter_tip),
        Binding("escape", "clear_filter", "Clear filter", id=f"{screen}.clear_filter", tooltip=clear_tip),
    ]


class FilteredScreen(ConsoleScreen):
    """A screen with the filter box; ``FILTERED``: the widget it filters (it gets the focus back)."""

    FILTERED: ClassVar[str] = ""

    def apply_filter(self, needle: str) -> None:
        """Show what matches ``needle`` (empty: everything)."""
        raise NotImplementedError

    def hide_filter_box(self) -> None:
        """On mount: the box is hidden until ``/``."""
        box = self.query_one("#filter", Input)
        box.display = False
        box.cursor_blink = self.console.motion

    def typing_filter(self) -> bool:
        """The box has the focus: keys go into it ("/" and Enter do not act)."""
        box = next(iter(self.query("#filter").results(Input)), None)
        return box is not None and box.has_focus

    def filter_refuses(self, action: str) -> bool:
        """Esc while no filter is shown (it is in the footer only while one is), and ``/`` while typing in it."""
        if action == "clear_filter":
            box = next(iter(self.query("#filter").results(Input)), None)
            return not (box is not None and box.display)
        return action == "filter" and self.typing_filter()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()
        self.refresh_bindings()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.display = False
        self.apply_filter("")
        self.query_one(self.FILTERED).focus()
        self.refresh_bindings()

    def filter_left(self) -> None:
        """Enter in the box: the focus goes back to the filtered widget."""
        self.query_one(self.FILTERED).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.apply_filter(event.value.strip())

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.filter_left()
