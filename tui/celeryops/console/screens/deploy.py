"""Deploy: per target, the revision being created, the rollout state from the operation metadata and its
conditions; then the fleet coming back (workers consuming again)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from celeryops.console.fmt import ROLLOUT_STYLE, state_text
from celeryops.console.model import RunModel
from celeryops.console.screens.base import Row, refill
from celeryops.console.screens.running import RunScreen, run_nav_bindings
from celeryops.console.stylesheets import screen_css

# Cloud Run condition states, as the ops layer names them (succeeded, ...) or as the API does (CONDITION_...).
COND_ICON = {"succeeded": ("✔", "green"), "failed": ("✘", "bold red"), "pending": ("…", "cyan"),
             "reconciling": ("…", "cyan")}


def conditions_text(conditions) -> Text:
    text = Text()
    for cond in conditions:
        icon, style = COND_ICON.get(cond.state.lower().removeprefix("condition_"), ("?", "dim"))
        name = cond.name if cond.name == "Ready" else cond.name.removesuffix("Ready").replace("Configurations",
                                                                                             "Config")
        text.append(f"{icon} {name} ", style=style)
    text.rstrip()
    return text


class DeployScreen(RunScreen):
    CSS_PATH = screen_css("deploy")
    VIEW_TITLE = "deploy"
    BINDINGS = [*run_nav_bindings("deploy", "the rollout")]

    def compose(self) -> ComposeResult:
        yield self.status_bar()
        yield Static("", id="deploy-title")
        yield DataTable(id="targets", cursor_type="row")
        yield DataTable(id="fleet-back", cursor_type="row", zebra_stripes=True)
        yield self.event_log()
        yield self.footer()

    def on_mount(self) -> None:
        targets = self.query_one("#targets", DataTable)
        targets.border_title = "Targets"
        # Free text last: on a narrow terminal the detail is the one shortened (the event log has it whole).
        for key, label in (("target", "Target"), ("state", "Rollout"), ("revision", "Revision"),
                           ("conditions", "Conditions"), ("message", "Detail")):
            targets.add_column(label, key=key)
        back = self.query_one("#fleet-back", DataTable)
        back.border_title = "Fleet coming back"
        for key, label in (("name", "Worker"), ("state", "State"), ("queues", "Consuming")):
            back.add_column(label, key=key)
        self.query_one("#log").border_title = "Events"
        self.render_model(self.console.model)

    def on_resize(self) -> None:
        self.call_after_refresh(self.render_model, self.console.model)  # the last columns fit the new width

    def render_model(self, model: RunModel) -> None:
        if not self.is_mounted:
            return
        word = "rollback" if model.kind == "rollback" else "deploy"
        title = Text(" ".join(part for part in (word, model.release) if part), style="bold")
        title.append(f" · phase {model.phase or '-'}")
        if model.phase == "done":
            title.append("  DONE ", style="bold black on green")
        elif model.phase == "failed":
            title.append("  FAILED ", style="bold white on red")
        self.query_one("#deploy-title", Static).update(title)
        refill(self.query_one("#targets", DataTable), [(t.target, (
            t.target, Text(t.state, style=ROLLOUT_STYLE.get(t.state, "")), t.revision or "-",
            conditions_text(t.conditions), t.message)) for t in model.targets],
            fit="message")
        rows: list[Row] = [(w.name, (w.name, state_text(w.state), ", ".join(w.queues) or "-"))
                           for w in model.fleet_back]
        refill(self.query_one("#fleet-back", DataTable),
               rows or [(None, (Text("waiting for the rollout", style="dim"), "", ""))], fit="queues")
        self.show_new_log_lines(model)
