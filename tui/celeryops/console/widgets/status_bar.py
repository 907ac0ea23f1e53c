"""The one-line header: product, fleet (masked), current view, and the mode (LIVE or READ-ONLY)."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from celeryops.core.masking import mask_url


class StatusBar(Static):
    """Docked at the top of every screen."""

    view_title: reactive[str] = reactive("")

    def __init__(self, fleet: str, read_only: bool, view_title: str = "") -> None:
        super().__init__(id="status-bar")
        self.fleet = mask_url(fleet)  # the backend should pass it masked already; never show a password
        self.read_only = read_only
        self.set_reactive(StatusBar.view_title, view_title)

    def render(self) -> Text:
        """The mode badge always shows: the fleet is shortened (…) when the line is too narrow for all of it."""
        mode = Text(" READ-ONLY ", style="bold black on yellow") if self.read_only else Text(" LIVE ",
                                                                                            style="bold black on green")
        text = Text()
        text.append(" celeryops ", style="bold reverse")
        text.append(f" {self.view_title} ", style="bold")
        room = self.size.width - text.cell_len - mode.cell_len - 1
        label = " fleet " if room >= len(self.fleet) + 7 or room >= 30 else " "
        fleet = Text(self.fleet, no_wrap=True, overflow="ellipsis")
        fleet.truncate(max(0, room - len(label)), overflow="ellipsis")
        if fleet.cell_len:
            text.append(label, style="dim")
            text.append_text(fleet)
        text.append(" " * max(1, self.size.width - text.cell_len - mode.cell_len))
        text.append_text(mode)
        return text
