"""Slots: a gauge and a usage sparkline per resource type (CPU, GPU, any other), the leases held
(task, worker, slots, age, lease time left; expired leases flagged) and the reservations waiting."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Sparkline, Static

from celeryops.console.fmt import bar, left, since, slots_text
from celeryops.console.screens.base import ConsoleScreen
from celeryops.ops.views import SlotsView


class SlotsScreen(ConsoleScreen):
    VIEW_TITLE = "slots"
    BINDINGS = [
        Binding("h,escape", "app.show_home", "Home", id="slots.home", tooltip="Back to the fleet."),
        Binding("r", "refresh", "Refresh", id="slots.refresh", tooltip="Read the slot pool now."),
    ]

    def __init__(self, read_only: bool) -> None:
        super().__init__(read_only)
        self.view: SlotsView | None = None

    def compose(self) -> ComposeResult:
        yield self.status_bar()
        yield Vertical(id="resources")
        yield DataTable(id="holders", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="waiting", cursor_type="row")
        yield self.footer()

    def on_mount(self) -> None:
        self.query_one("#resources").border_title = "Resources"
        holders = self.query_one("#holders", DataTable)
        holders.border_title = "Leases held"
        for key, label in (("task", "Task"), ("worker", "Worker"), ("slots", "Slots"), ("age", "Held for"),
                           ("ttl", "Lease left")):
            holders.add_column(label, key=key)
        waiting = self.query_one("#waiting", DataTable)
        waiting.border_title = "Waiting for slots"
        for key, label in (("task", "Task"), ("worker", "Worker"), ("slots", "Wants"), ("waiting", "Waiting for")):
            waiting.add_column(label, key=key)
        self.console.poll_now()

    def action_refresh(self) -> None:
        self.console.poll_now()

    async def show_slots(self, view: SlotsView | None) -> None:
        if view == self.view and self.view is not None:
            return
        self.view = view
        box = self.query_one("#resources", Vertical)
        await box.remove_children()
        holders = self.query_one("#holders", DataTable)
        waiting = self.query_one("#waiting", DataTable)
        holders.clear()
        waiting.clear()
        if view is None:
            await box.mount(Static(Text("This fleet has no slot pool.", style="dim")))
            return
        box.border_title = f"Resources · pool {view.pool}"
        rows = []
        for res in view.resources:
            full = res.used >= res.total
            gauge = Text(f"{res.name:<6}", style="bold")
            gauge.append(bar(res.used, res.total, 20), style="red" if full else "green")
            gauge.append(f" {res.used:>3}/{res.total:<3}", style="bold red" if full else "bold")
            span = since(view.sample_interval * max(len(res.history) - 1, 0))
            rows.append(Horizontal(Static(gauge, classes="gauge"),
                                   Sparkline(list(res.history) or [0], classes="usage"),
                                   Static(Text(f" last {span}", style="dim"), classes="span"),
                                   classes="resource"))
        await box.mount_all(rows)
        for h in sorted(view.holders, key=lambda h: h.ttl_left):
            ttl = Text("EXPIRED", style="bold white on red") if h.expired else Text(
                left(h.ttl_left), style="yellow" if h.ttl_left < 30 else "")
            holders.add_row(h.task, h.worker, slots_text(h.slots), since(h.age), ttl, key=h.lease_id)
        for i, w in enumerate(view.waiting):
            waiting.add_row(w.task, w.worker, slots_text(w.slots), since(w.waiting), key=str(i))
        if not view.waiting:
            waiting.add_row(Text("nobody is waiting", style="dim"), "", "", "")
