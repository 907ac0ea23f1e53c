"""Preflight checklist: one row per check (spinner while running, then ok/warn/fail with detail and remedy).
Proceeding is possible only when nothing failed; warnings need an explicit confirmation."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from celeryops.console.fmt import CHECK_ICON, CHECK_STYLE
from celeryops.console.model import RunModel
from celeryops.console.screens.base import ConsoleScreen, home_binding
from celeryops.console.stylesheets import screen_css

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class PreflightScreen(ConsoleScreen):
    CSS_PATH = screen_css("preflight")
    VIEW_TITLE = "preflight"
    DANGEROUS = frozenset({"proceed"})
    BINDINGS = [
        Binding("G", "proceed", "Go", id="preflight.go",
                tooltip="Go ahead: stop consumers and drain, then deploy (an overlap deploy brings the new revision up "
                        "first); asks for confirmation first."),
        home_binding("preflight", "h"),
    ]

    def __init__(self, read_only: bool) -> None:
        super().__init__(read_only)
        self._frame = 0
        self._rows: dict[str, tuple[str, str, str, str]] = {}

    def compose(self) -> ComposeResult:
        yield self.status_bar()
        yield Static("", id="preflight-title")
        yield VerticalScroll(id="checks")
        yield Static("", id="verdict")
        yield self.footer()

    def on_mount(self) -> None:
        self.query_one("#checks").border_title = "Checks"
        if self.console.motion:
            self.set_interval(0.1, self._spin)
        self.render_model(self.console.model)

    def _spin(self) -> None:
        model = self.console.model
        if any(c.status == "running" for c in model.checks.values()):
            self._frame = (self._frame + 1) % len(SPINNER)
            self.render_model(model)

    def _status(self, status: str) -> Text:
        if status == "running":
            return Text(f"{SPINNER[self._frame]} run", style=CHECK_STYLE["running"])
        return Text(CHECK_ICON[status], style=CHECK_STYLE[status])

    def _row(self, check) -> Table:
        """Status in its own column, so a long detail or remedy wraps under the title, not under the icon."""
        body = Text(check.title, style="bold")
        if check.detail:
            body.append(f"  {check.detail}", style="" if check.status != "fail" else "red")
        if check.remedy and check.status in ("warn", "fail"):
            body.append("\n→ ", style="dim")
            body.append(check.remedy, style="italic")
        row = Table.grid(padding=(0, 1))
        row.add_column(width=6, no_wrap=True)
        row.add_column(ratio=1)
        row.add_row(self._status(check.status), body)
        return row

    def render_model(self, model: RunModel) -> None:
        if not self.is_mounted:
            return
        what = {"deploy": "deploy " + (model.release or ""), "rollback": "rollback"}.get(model.kind or "", "drain")
        said = model.said
        what += said.aside
        self.query_one("#preflight-title", Static).update(
            Text.assemble((f"Before the {what}", "bold"), ": nothing has changed yet."))
        box = self.query_one("#checks", VerticalScroll)
        for check in model.checks.values():
            shown = (self._status(check.status).plain, check.title, check.detail, check.remedy)
            old = self._rows.get(check.id)
            if old is None:
                box.mount(Static(self._row(check), classes=f"check {check.status}", id=f"check-{check.id}"))
            elif old != shown:
                widget = box.query_one(f"#check-{check.id}", Static)
                widget.update(self._row(check))
                widget.set_classes(f"check {check.status}")
            self._rows[check.id] = shown
        verdict = Text()
        failed, warned = model.failed_checks, model.warned_checks
        if model.preflight is None:
            running = sum(1 for c in model.checks.values() if c.status in ("running", "pending"))
            verdict.append(f"Checking… {running} check(s) left.", style="cyan")
        elif failed:
            verdict.append(f"{len(failed)} check(s) failed: nothing was changed. ", style="bold red")
            verdict.append("Fix them (each → line says how) and run again; q quits.")
        elif model.phase not in ("preflight", "ready"):
            verdict.append(f"Proceeding: {model.phase}.", style="bold")
        elif warned:
            verdict.append(f"{len(warned)} warning(s). ", style="bold yellow")
            verdict.append("Press G to review them and proceed, or q to quit without changing anything.")
        else:
            verdict.append("All checks passed. ", style="bold green")
            verdict.append(said.go)
        self.query_one("#verdict", Static).update(verdict)
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        allowed = super().check_action(action, parameters)
        if action == "proceed" and allowed:
            return True if self.console.model.may_proceed else None
        return allowed

    def action_proceed(self) -> None:
        self.console.confirm_proceed()
