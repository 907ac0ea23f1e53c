"""Quitting mid-run asks what to do with the run: abort and restore consumers, detach, or stay (also on Ctrl-C)."""

from __future__ import annotations

from typing import Literal

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Label, Static

QuitChoice = Literal["abort", "detach", "stay"]


class QuitScreen(ModalScreen[QuitChoice]):
    """Dismisses with the operator's choice."""

    BINDINGS = [
        Binding("A", "choose('abort')", "Abort run", id="quit.abort",
                tooltip="Abort the run as `celeryops abort` would (a drain: consumers restored exactly as they were; "
                        "an overlap: the new revision retired), then quit."),
        Binding("d", "choose('detach')", "Detach", id="quit.detach",
                tooltip="Quit and leave the run for `celeryops resume`; the fence expires if nobody resumes."),
        Binding("s,escape", "choose('stay')", "Stay", id="quit.stay", tooltip="Close this dialog and keep watching."),
    ]

    def __init__(self, phase: str, abort_label: str = "Abort and restore consumers") -> None:
        super().__init__(classes="dialog")
        self.phase = phase
        self.abort_label = abort_label  # what A does to this run (an overlap deploy: its new revision is retired)

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(f"A run is in progress ({self.phase})", id="dialog-title")
            yield Static("Quitting does not stop it by itself. What should happen to the run?", id="dialog-body")
            yield Button(f"{self.abort_label} \\[A]", variant="error", id="abort", compact=True)
            yield Button("Detach: leave it for `celeryops resume` \\[d]", variant="warning", id="detach", compact=True)
            yield Button("Stay \\[s]", variant="primary", id="stay", compact=True)
        yield Footer()  # this dialog's keys, over the screen's footer (whose keys wait until it closes)

    def on_mount(self) -> None:
        self.query_one("#stay", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id)  # type: ignore[arg-type]

    def action_choose(self, choice: QuitChoice) -> None:
        self.dismiss(choice)
