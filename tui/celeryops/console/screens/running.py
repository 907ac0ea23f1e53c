"""What the screens of a run in progress share (drain, overlap, deploy, canary): the keys back to the fleet and to
the slot pool, and the run's event log, to which each render appends the lines it has not shown yet."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widgets import RichLog

from celeryops.console.model import LEVEL_STYLE, RunModel
from celeryops.console.screens.base import ConsoleScreen, home_binding


def run_nav_bindings(screen: str, goes_on: str) -> list[Binding]:
    """``h`` home and ``s`` slots of a run's screen (``goes_on``: what goes on meanwhile, "the run")."""
    return [
        home_binding(screen, "h", f"Back to the fleet; {goes_on} goes on."),
        Binding("s", "app.show_slots", "Slots", id=f"{screen}.slots", tooltip="Slot pool: gauges, holders, waiters."),
    ]


class RunScreen(ConsoleScreen):
    """A screen of the run in progress, with its event log (``#log``)."""

    def __init__(self, read_only: bool) -> None:
        super().__init__(read_only)
        self._log_shown = 0

    def event_log(self) -> RichLog:
        return RichLog(id="log", markup=False, wrap=True, max_lines=500, min_width=20)  # wraps at 80 columns

    def show_new_log_lines(self, model: RunModel) -> None:
        """Append the lines logged since the last render (those the model still keeps)."""
        log = self.query_one(RichLog)
        lines = list(model.log)
        new = model.log_total - self._log_shown
        for line in lines[max(0, len(lines) - new):]:
            log.write(Text(line.text, style=LEVEL_STYLE.get(line.level, "")))
        self._log_shown = model.log_total
