"""Slots: every slot pool (global pools with the hosts that contribute to them, per-host pools), a gauge and a
usage sparkline per resource type (a type with no capacity reads ``none``), the leases held (pool, task, worker,
slots, age, lease time left; expired leases flagged) and the reservations waiting."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Sparkline, Static

from celeryops.console.fmt import gauge, left, since, slots_text
from celeryops.console.screens.base import ConsoleScreen, Row, refill
from celeryops.ops.backend.views import PoolView, SlotsView


def pool_title(pool: PoolView) -> Text:
    """``pool default · global · 2 hosts: gpu-node-a cpu:8 gpu:4, cpu-node-b cpu:8``."""
    text = Text(f"pool {pool.name}", style="bold cyan")
    if pool.scope != pool.name:
        text.append(f" · {pool.scope}" + (f" {pool.host}" if pool.host and pool.host not in pool.name else ""),
                    style="dim")
    if pool.hosts:
        text.append(f" · {len(pool.hosts)} host{'s' if len(pool.hosts) != 1 else ''}: ", style="dim")
        for i, share in enumerate(pool.hosts):
            text.append(", " if i else "")
            text.append(share.host, style="dim strike" if share.expired else "")
            text.append(f" {slots_text(share.totals)}", style="dim")
    return text


class SlotsScreen(ConsoleScreen):
    VIEW_TITLE = "slots"
    BINDINGS = [
        Binding("h,escape", "app.show_home", "Home", id="slots.home", tooltip="Back to the fleet."),
        Binding("r", "refresh", "Refresh", id="slots.refresh", tooltip="Read the slot pools now."),
    ]

    def __init__(self, read_only: bool) -> None:
        super().__init__(read_only)
        self.view: SlotsView | None = None

    def compose(self) -> ComposeResult:
        yield self.status_bar()
        yield VerticalScroll(id="resources")
        yield DataTable(id="holders", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="waiting", cursor_type="row")
        yield self.footer()

    def on_mount(self) -> None:
        self.query_one("#resources").border_title = "Resources"
        holders = self.query_one("#holders", DataTable)
        holders.border_title = "Leases held"
        for key, label in (("task", "Task"), ("worker", "Worker"), ("slots", "Slots"), ("age", "Held for"),
                           ("ttl", "Lease left"), ("pool", "Pool")):
            holders.add_column(label, key=key)
        waiting = self.query_one("#waiting", DataTable)
        waiting.border_title = "Waiting for slots"
        for key, label in (("task", "Task"), ("worker", "Worker"), ("slots", "Wants"), ("waiting", "Waiting for"),
                           ("pool", "Pool")):
            waiting.add_column(label, key=key)
        self.console.poll_now()

    def action_refresh(self) -> None:
        self.console.poll_now()

    async def show_slots(self, view: SlotsView | None) -> None:
        if view == self.view and self.view is not None:
            return
        self.view = view
        box = self.query_one("#resources", VerticalScroll)
        await box.remove_children()
        holders = self.query_one("#holders", DataTable)
        waiting = self.query_one("#waiting", DataTable)
        if view is None or not view.pools:
            refill(holders, [])
            refill(waiting, [])
            await box.mount(Static(Text("This fleet has no slot pool.", style="dim")))
            return
        box.border_title = f"Resources · {len(view.pools)} pool{'s' if len(view.pools) != 1 else ''}"
        rows: list[Static | Horizontal] = []
        for pool in view.pools:
            rows.append(Static(pool_title(pool), classes="pool-title"))
            for res in pool.resources:
                span = since(view.sample_interval * max(len(res.history) - 1, 0))
                rows.append(Horizontal(Static(gauge(res.name, res.used, res.total, 20), classes="gauge"),
                                       Sparkline(list(res.history) or [0], classes="usage"),
                                       Static(Text(f" last {span}", style="dim"), classes="span"),
                                       classes="resource"))
        await box.mount_all(rows)
        held: list[Row] = []
        for h in sorted(view.holders, key=lambda h: h.ttl_left):
            ttl = Text("EXPIRED", style="bold white on red") if h.expired else Text(
                left(h.ttl_left), style="yellow" if h.ttl_left < 30 else "")
            held.append((f"{h.pool}\0{h.lease_id}", [h.task, h.worker, slots_text(h.slots), since(h.age), ttl, h.pool]))
        refill(holders, held)
        wanting: list[Row] = [(str(i), [w.task, w.worker, slots_text(w.slots), since(w.waiting), w.pool])
                              for i, w in enumerate(view.waiting)]
        refill(waiting, wanting or [(None, [Text("nobody is waiting", style="dim"), "", "", "", ""])])
