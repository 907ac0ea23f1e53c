"""What every console screen shares: the status bar, the footer, and the read-only rule for dangerous actions
(in watch mode they are not registered at all, and ``check_action`` refuses them as a second lock)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.binding import BindingsMap
from textual.screen import Screen
from textual.widgets import Footer

from celeryops.console.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    from celeryops.console.app import ConsoleApp
    from celeryops.console.model import RunModel


class ConsoleScreen(Screen):
    """A full screen of the console."""

    VIEW_TITLE: ClassVar[str] = ""
    DANGEROUS: ClassVar[frozenset[str]] = frozenset()  # actions that change the fleet

    def __init__(self, read_only: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self.read_only = read_only
        if read_only and self.DANGEROUS:
            self._bindings = BindingsMap(b for _, b in self._bindings if b.action.split("(")[0] not in self.DANGEROUS)

    @property
    def console(self) -> ConsoleApp:
        return self.app  # type: ignore[return-value]

    def status_bar(self) -> StatusBar:
        return StatusBar(self.console.backend.fleet_display, self.read_only, self.VIEW_TITLE)

    def footer(self) -> Footer:
        return Footer(show_command_palette=True)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action in self.DANGEROUS and self.read_only)

    def render_model(self, model: RunModel) -> None:
        """Show the run as the model has it now (called on every run event while this screen is on top)."""

    def on_screen_resume(self) -> None:
        self.render_model(self.console.model)
        self.console.sync_view()
