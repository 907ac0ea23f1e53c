"""Autoscaler (a on the home view): what the fleet's autoscaler (``celeryops autoscale``, on any machine) last
published: who runs it and its bounds, demand against capacity over its last looks (a plot), the cohorts (revisions)
of the pool with their instances and state, the demand per queue (ETA tasks apart), and each decision with its
reason. It only reads: the same in ``celeryops watch``; it refreshes every look."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from celeryops.console.fmt import since
from celeryops.console.screens.base import ConsoleScreen, Row, home_binding, refill
from celeryops.console.stylesheets import screen_css
from celeryops.console.widgets.scaleplot import ScalePlot
from celeryops.ops.fleetwide.scalestatus import ScaleStatus

STATE_STYLE = {"idle": "dim", "busy": "green", "starting": "cyan", "draining": "yellow"}
ACTION_STYLE = {"out": "bold green", "in": "bold yellow", "hold": "dim", "wait": "yellow"}


def summary(status: ScaleStatus | None, now: float) -> Text:
    """The header line: who runs it, the pool's size, demand against capacity, the bounds; or why there is none."""
    if status is None:
        return Text("No autoscaler has published on this fleet: start one with `celeryops autoscale` (it sizes a "
                    "Cloud Run worker pool by what Celery holds).", style="dim")
    point = status.points[-1] if status.points else (0.0, 0, 0)
    text = Text(f"{status.target}", style="bold cyan")
    if status.alive(now):
        text.append(f" · running on {status.host} (pid {status.pid})", style="green")
    else:
        word = "stopped" if status.state == "stopped" else "silent"
        text.append(f" · {word} {since(now - status.updated_at)} ago", style="yellow")
    settings = status.settings
    text.append(f" · {status.instances} instance(s), needs {status.desired}", style="bold")
    text.append(f" · demand {point[1]} / capacity {point[2]} ({status.per_instance or 1} per instance)")
    every = settings.get("interval")
    text.append(f" · min {settings.get('min_instances', '?')} max {settings.get('max_instances', '?')}"
                f" · every {every:.3g} s" if isinstance(every, int | float) else "", style="dim")
    if status.message:
        text.append(f"\n{status.message}", style="bold yellow")
    return text


def cohort_rows(status: ScaleStatus) -> list[Row]:
    return [(str(c.get("revision")), [
        Text(str(c.get("state", "")), style=STATE_STYLE.get(str(c.get("state")), "")),
        f"{c.get('live', 0)}/{c.get('count', 0)}", str(c.get("busy", 0)), str(c.get("revision", ""))])
        for c in status.cohorts]


def queue_rows(status: ScaleStatus) -> list[Row]:
    def n(value: object) -> str:
        return "?" if value is None else str(value)

    return [(str(q.get("queue")), [str(q.get("queue", "")), n(q.get("ready")), n(q.get("reserved")),
                                   n(q.get("active")), n(q.get("scheduled"))]) for q in status.demand]


def decision_lines(status: ScaleStatus | None, now: float) -> Text:
    """Each decision, newest first: how long ago, the action, its reason (wrapped, never cut)."""
    if status is None or not status.decisions:
        return Text("no decision yet", style="dim")
    lines = []
    for d in reversed(status.decisions):
        action = str(d.get("action", ""))
        line = Text(f"{since(now - float(d.get('at') or now)) + ' ago':<16}", style="dim")
        line.append(f"{action:<5}", style=ACTION_STYLE.get(action, ""))
        line.append(str(d.get("reason", "")))
        lines.append(line)
    return Text("\n").join(lines)


class AutoscaleScreen(ConsoleScreen):
    CSS_PATH = screen_css("autoscale")
    VIEW_TITLE = "autoscaler"
    BINDINGS = [
        home_binding("autoscale"),
        Binding("ctrl+r", "reload", "Refresh", id="autoscale.reload", tooltip="Read the autoscaler's status now."),
    ]

    def __init__(self, read_only: bool) -> None:
        super().__init__(read_only)
        self.status: ScaleStatus | None = None
        self._read = False

    def compose(self) -> ComposeResult:
        yield self.status_bar()
        yield Static(id="summary")
        yield ScalePlot(id="plot")
        with Horizontal(id="tables"):
            yield DataTable(id="cohorts", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="queues", cursor_type="row")
        with VerticalScroll(id="decisions"):
            yield Static(id="decision-lines")
        yield self.footer()

    def on_mount(self) -> None:
        self.query_one("#plot").border_title = "Demand (bars) against capacity (line)"
        self.query_one("#decisions").border_title = "Decisions (newest first)"
        for table_id, title, columns in (
                ("cohorts", "Cohorts", (("state", "State"), ("live", "Live/asked"), ("busy", "Busy"),
                                        ("revision", "Revision"))),
                ("queues", "Demand by queue", (("queue", "Queue"), ("ready", "Ready"), ("reserved", "Reserved"),
                                               ("active", "Active"), ("scheduled", "ETA")))):
            table = self.query_one(f"#{table_id}", DataTable)
            table.border_title = title
            for key, label in columns:
                table.add_column(label, key=key)
        self.action_reload()
        self.set_interval(2.0, self.action_reload)

    def action_reload(self) -> None:
        self.load("autoscale", self.console.backend.autoscaler, self._show)

    def _show(self, status: ScaleStatus | None, error: str) -> None:
        if error:
            self.console.notify(error, severity="error", timeout=10)
            return
        if self._read and status == self.status:
            return
        self.status, self._read = status, True
        self._fill()
        self.call_after_refresh(self._fill)  # once the tables have their width: the last columns fit

    def on_resize(self) -> None:
        self.call_after_refresh(self._fill)

    def _fill(self) -> None:
        if not self.is_mounted:
            return
        now = self.console.clock()
        status = self.status
        self.query_one("#summary", Static).update(summary(status, now))
        self.query_one("#plot", ScalePlot).show(status.points if status else ())
        refill(self.query_one("#cohorts", DataTable), cohort_rows(status) if status else [], fit="revision")
        refill(self.query_one("#queues", DataTable), queue_rows(status) if status else [])
        self.query_one("#decision-lines", Static).update(decision_lines(status, now))


__all__ = ["AutoscaleScreen"]
