"""Run history (r on the home view, or the command palette): the fleet's recent runs, newest first (phase, kind,
release, who, started, duration, outcome) from the local journal and the fleet-held store; Enter opens the
highlighted run's event timeline below the table. B rolls a deployed run back (after a confirmation, through the
same preflight and screens as a deploy); everything else here only reads."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, RichLog

from celeryops.console.fmt import since
from celeryops.console.model import LEVEL_STYLE
from celeryops.console.screens.base import ConsoleScreen, Row, refill
from celeryops.console.stylesheets import screen_css
from celeryops.console.widgets.meters import compact_left
from celeryops.core.errors import UserError
from celeryops.core.masking import mask_text
from celeryops.ops.backend.views import RunRecordView

PHASE_STYLE = {"done": "green", "drained": "green", "aborted": "yellow", "failed": "bold red"}
COLUMNS = (("started", "Started"), ("kind", "Kind"), ("release", "Release"), ("phase", "Phase"),
           ("duration", "Took"), ("outcome", "Outcome"), ("owner", "Who"), ("run", "Run"))


class RunsScreen(ConsoleScreen):
    CSS_PATH = screen_css("runs")
    VIEW_TITLE = "runs"
    DANGEROUS = frozenset({"rollback"})
    BINDINGS = [
        Binding("enter", "open_run", "Timeline", id="runs.open", tooltip="Show the highlighted run's events."),
        Binding("B", "rollback", "Roll back", id="runs.rollback",
                tooltip="Roll the highlighted deploy back: its targets return to the revisions it replaced "
                        "(preflight and a drain first; asks before anything changes)."),
        Binding("h,escape", "app.show_home", "Home", id="runs.home", tooltip="Back to the fleet."),
        Binding("ctrl+r", "reload", "Reload", id="runs.reload", tooltip="Read the run history again."),
    ]

    def __init__(self, read_only: bool) -> None:
        super().__init__(read_only)
        self.runs: tuple[RunRecordView, ...] | None = None
        self.opened: str | None = None

    def compose(self) -> ComposeResult:
        yield self.status_bar()
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield RichLog(id="timeline", markup=False, wrap=True, max_lines=2000, min_width=20)
        yield self.footer()

    def on_mount(self) -> None:
        self.query_one("#runs", DataTable).border_title = "Recent runs"
        self.query_one("#timeline").border_title = "Timeline (Enter on a run)"
        self.action_reload()

    def action_reload(self) -> None:
        self.load("runs", self.console.backend.run_history, self._show)

    def _show(self, runs: tuple[RunRecordView, ...] | None, error: str) -> None:
        self.runs = runs or ()
        if error:
            self.console.notify(error, severity="error", timeout=10)
        self._fill()

    def _fill(self) -> None:
        if not self.is_mounted or self.runs is None:
            return
        now = self.console.clock()
        table = self.query_one("#runs", DataTable)
        columns = [c for c in COLUMNS if c[0] != "run" or not self.has_class("-narrow")]  # 80 columns: no run id
        if [k.value for k in table.columns] != [key for key, _ in columns]:
            table.clear(columns=True)
            for key, label in columns:
                table.add_column(label, key=key)
        rows: list[Row] = []
        for r in self.runs:
            took = since(r.duration) if r.duration is not None else Text(since(now - r.started_at), style="cyan")
            cells = {"started": f"{since(now - r.started_at)} ago", "kind": r.kind,
                     "release": r.release or Text("-", style="dim"),
                     "phase": Text(r.phase, style=PHASE_STYLE.get(r.phase, "bold cyan")), "duration": took,
                     "outcome": r.outcome or Text("open", style="cyan"), "owner": r.owner, "run": r.run_id}
            rows.append((r.run_id, [cells[key] for key, _ in columns]))
        if not rows:
            rows.append((None, [Text("no run recorded for this fleet", style="dim"), *[""] * (len(columns) - 1)]))
        refill(table, rows, fit=columns[-1][0])
        self.refresh_bindings()

    def on_resize(self) -> None:
        self.call_after_refresh(self._fill)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_run()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "open_run":
            return True if self._current() is not None else None
        allowed = super().check_action(action, parameters)
        if action == "rollback" and allowed:
            return self._deployed() is not None  # offered (in the footer too) on a deployed run only
        return allowed

    def _current(self) -> str | None:
        if not self.is_mounted:
            return None
        table = self.query_one("#runs", DataTable)
        if not table.row_count or not self.runs:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return key if isinstance(key, str) else None

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.refresh_bindings()  # B is offered on a deployed run only

    def _deployed(self) -> RunRecordView | None:
        """The highlighted run if it is a deploy that finished (one that can be rolled back)."""
        run_id = self._current()
        run = next((r for r in self.runs or () if r.run_id == run_id), None)
        return run if run is not None and run.kind == "deploy" and run.phase == "done" else None

    def action_rollback(self) -> None:
        run = self._deployed()
        if run is not None and not self.read_only:
            self.console.confirm_rollback(run)

    def action_open_run(self) -> None:
        run_id = self._current()
        if run_id is not None:
            self.run_worker(self._open(run_id), group="timeline", exclusive=True)

    async def _open(self, run_id: str) -> None:
        log = self.query_one("#timeline", RichLog)
        try:
            entries = await self.console.backend.run_timeline(run_id)
        except UserError as err:
            log.clear()
            log.write(Text(mask_text(str(err)), style="bold red"))
            return
        self.opened = run_id
        log.clear()
        log.border_title = f"Timeline of {run_id}"
        start = entries[0].at if entries else 0.0
        for entry in entries:
            line = Text(f"+{compact_left(entry.at - start):<7} ", style="dim")
            line.append(entry.text, style=LEVEL_STYLE.get(entry.level, ""))
            log.write(line)
        if not entries:
            log.write(Text("this run recorded no events", style="dim"))
