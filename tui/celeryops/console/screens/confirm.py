"""The confirmation every dangerous action goes through: says what will happen; Enter/y confirms, Esc/n cancels."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Label, Static


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True only when the operator confirms."""

    BINDINGS = [
        Binding("y", "answer(True)", "Confirm", id="confirm.yes", tooltip="Do what the dialog says."),
        Binding("n,escape", "answer(False)", "Cancel", id="confirm.no", tooltip="Close the dialog; nothing changes."),
    ]

    def __init__(self, title: str, what_happens: str, confirm_label: str = "Confirm") -> None:
        super().__init__(classes="dialog")
        self.title_text = title
        self.what_happens = what_happens
        self.confirm_label = confirm_label

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.title_text, id="dialog-title")
            with VerticalScroll(id="dialog-scroll"):  # a long list of warnings scrolls; the buttons stay
                yield Static(self.what_happens, id="dialog-body")
            with Horizontal(id="dialog-buttons"):
                yield Button(f"{self.confirm_label} \\[y]", variant="error", id="yes")
                yield Button("Cancel \\[n]", variant="primary", id="no")
        yield Footer()  # this dialog's keys, over the screen's footer (whose keys wait until it closes)

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
