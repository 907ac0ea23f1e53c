"""Release picker (D on the home view): the remote's release branches, newest first, with the tip commit, its age
and whether the image of every target exists; ``/`` filters; Enter runs the preflight checklist for the chosen
release, then the same flow as ``celeryops deploy`` (nothing changes until the operator confirms there)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Input, Static

from celeryops.console.fmt import shorten, since
from celeryops.console.screens.base import Row, refill
from celeryops.console.screens.filtering import FilteredScreen
from celeryops.console.stylesheets import screen_css
from celeryops.ops.backend.views import ReleasesView, ReleaseView

IMAGE_TEXT = {"exists": ("✔ exists", "green"), "missing": ("✘ missing", "bold red"),
              "unknown": ("? unknown", "yellow"), "none": ("-", "dim")}
COLUMNS = (("name", "Release"), ("sha", "Commit"), ("age", "Age"), ("image", "Image"), ("subject", "Subject"))


class ReleasesScreen(FilteredScreen):
    CSS_PATH = screen_css("releases")
    VIEW_TITLE = "deploy: pick a release"
    DANGEROUS = frozenset({"deploy"})
    FILTERED = "#releases"
    BINDINGS = [
        Binding("enter", "deploy", "Preflight", id="releases.deploy", priority=True,
                tooltip="Run the preflight checklist for this release; nothing changes until you confirm there."),
        Binding("slash", "filter", "Filter", id="releases.filter", key_display="/",
                tooltip="Filter releases by branch name, commit or subject."),
        Binding("escape", "back", "Back", id="releases.back", tooltip="Clear the filter, or back to the fleet."),
        Binding("ctrl+r", "reload", "Reload", id="releases.reload", tooltip="List the remote's branches again."),
    ]

    def __init__(self, read_only: bool, preselect: str | None = None) -> None:
        super().__init__(read_only)
        self.preselect = preselect
        self.view: ReleasesView | None = None
        self.needle = ""
        self.error = ""

    def compose(self) -> ComposeResult:
        yield self.status_bar()
        yield Static(Text(" Reading the remote's release branches…", style="dim"), id="releases-title")
        yield DataTable(id="releases", cursor_type="row", zebra_stripes=True)
        yield Static("", id="release-detail")
        yield Input(placeholder="filter: branch, commit or subject (Esc clears)", id="filter")
        yield self.footer()

    def on_mount(self) -> None:
        table = self.query_one("#releases", DataTable)
        table.border_title = "Release branches"
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        self.hide_filter_box()
        self.action_reload()

    def action_reload(self) -> None:
        self.load("releases", self.console.backend.releases, self._show)

    def _show(self, view: ReleasesView | None, error: str) -> None:
        self.view, self.error = view, error
        self._fill()

    def _shown(self) -> list[ReleaseView]:
        if self.view is None:
            return []
        needle = self.needle.lower()
        return [r for r in self.view.releases
                if not needle or needle in r.name.lower() or r.sha.startswith(needle) or needle in r.subject.lower()]

    def _fill(self) -> None:
        if not self.is_mounted:
            return
        title = self.query_one("#releases-title", Static)
        table = self.query_one("#releases", DataTable)
        if self.view is None:
            title.update(Text(f" {self.error}", style="bold red") if self.error else
                         Text(" Reading the remote's release branches…", style="dim"))
            refill(table, [])
            return
        shown = self._shown()
        text = Text(f" {len(self.view.releases)} release(s) on {self.view.remote}", style="bold")
        text.append(f" · {self.view.pattern}, newest first", style="dim")
        if self.needle:
            text.append(f" · filter '{self.needle}': {len(shown)} shown", style="cyan")
        title.update(text)
        now = self.console.clock()
        rows: list[Row] = []
        for r in shown:
            label, style = IMAGE_TEXT[r.image]
            age = since(now - r.committed_at) if r.committed_at is not None else "?"
            rows.append((r.name, (Text(r.name, style="bold"), r.sha[:7], age, Text(label, style=style),
                                  shorten(r.subject, 60))))
        if not rows:
            rows.append((None, (Text("no release branch" + (" matches the filter" if self.needle else ""),
                                     style="dim"), "", "", "", "")))
        refill(table, rows, fit="subject")
        if self.preselect is not None and self.preselect in table.rows:
            table.move_cursor(row=table.get_row_index(self.preselect))
            self.preselect = None
        self._show_detail()
        self.refresh_bindings()

    def _current(self) -> ReleaseView | None:
        table = self.query_one("#releases", DataTable)
        if not table.row_count or self.view is None:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((r for r in self.view.releases if r.name == key), None)

    def _show_detail(self) -> None:
        release = self._current()
        detail = Text()
        if release is not None:
            detail.append(f" {release.name}", style="bold")
            detail.append(f" at {release.sha[:12]}: ")
            label, style = IMAGE_TEXT[release.image]
            detail.append(release.image_detail or label, style=style if release.image != "exists" else "")
            detail.append("\n Enter runs the preflight checklist; nothing changes until you confirm there.",
                          style="dim")
        self.query_one("#release-detail", Static).update(detail)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_deploy()

    def on_resize(self) -> None:
        self.call_after_refresh(self._fill)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        allowed = super().check_action(action, parameters)
        if not allowed:
            return allowed
        if action in ("filter", "deploy") and self.typing_filter():
            return False  # typing in the filter: "/" goes into it, Enter leaves it
        if action == "deploy":
            return True if self.view is not None and self._current() is not None else None
        return True

    def action_deploy(self) -> None:
        release = self._current()
        if release is None or self.read_only:
            return
        self.app.pop_screen()
        self.console.begin_run("deploy", release.name)

    def action_back(self) -> None:
        if self.query_one("#filter", Input).display:
            self.action_clear_filter()
            return
        self.app.pop_screen()

    def apply_filter(self, needle: str) -> None:
        self.needle = needle
        self._fill()

    def filter_left(self) -> None:
        super().filter_left()
        self.refresh_bindings()
