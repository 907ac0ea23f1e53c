"""Slots: every slot pool, each host first (a gauge and a usage strip per resource type, a type with no capacity
reading ``none``, and under a device-bound type one row per device: free, or held by which task for how long), then
the global pool of the shared types with the hosts that contribute to it; the leases held (pool, task, worker, slots
and devices, age, lease time left; expired leases flagged) and the reservations waiting (a request no live host
could serve reads "no capacity anywhere" with the hosts' totals)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from celeryops.console.fmt import gauge, left, shorten, since, slots_text
from celeryops.console.screens.base import ConsoleScreen, Row, home_binding, refill
from celeryops.console.stylesheets import screen_css
from celeryops.console.widgets.usage import UsageStrip
from celeryops.ops.backend.views import DeviceView, PoolView, SlotHolder, SlotsView, SlotWaiter


def pool_title(pool: PoolView) -> Text:
    """``host gpu-node-a · celery@gpu-1, celery@gpu-2`` for a host; ``pool global · shared · 2 hosts: gpu-node-a
    licence:2, cpu-node-b licence:2`` for the global pool."""
    if pool.scope == "host":
        text = Text(f"host {pool.host or pool.name}", style="bold cyan")
        workers = sorted({w for share in pool.hosts if not share.expired for w in share.workers})
        if workers:
            text.append(" · " + ", ".join(workers), style="dim")
        else:
            text.append(" · no live worker: its totals are 0 until one starts", style="yellow")
        return text
    text = Text(f"pool {pool.name}", style="bold cyan")
    if pool.scope == "global":
        text.append(" · shared", style="dim")
    elif pool.scope != pool.name:
        text.append(f" · {pool.scope}", style="dim")
    if pool.hosts:
        text.append(f" · {len(pool.hosts)} host{'s' if len(pool.hosts) != 1 else ''}: ", style="dim")
        for i, share in enumerate(pool.hosts):
            text.append(", " if i else "")
            text.append(share.host, style="dim strike" if share.expired else "")
            text.append(f" {slots_text(share.totals)}", style="dim")
    return text


def device_line(dev: DeviceView, width: int = 1) -> Text:
    """``  gpu 0 ■ ml.train_adapter · celery@gpu-1 · 30 minutes`` or ``  gpu 1 □ free`` (ids padded to ``width``)."""
    text = Text(f"  {dev.type} {shorten(dev.device, 14):<{width}} ", style="bold")
    if dev.free:
        text.append("□ free", style="green")
        return text
    text.append("■ ", style="red" if dev.expired else "yellow")
    text.append(dev.task or dev.lease_id, style="")
    text.append(f" · {dev.worker}" if dev.worker else "", style="dim")
    text.append(f" · {since(dev.held_for)}", style="dim")
    if dev.expired:
        text.append(" · lease EXPIRED", style="bold red")
    return text


def holder_slots(h: SlotHolder) -> str:
    """``cpu:4 gpu:2 → gpu 0,1``: the slots and the devices they are."""
    devices = " ".join(f"{t} {','.join(ds)}" for t, ds in sorted(h.devices.items()) if ds)
    return slots_text(h.slots) + (f" → {devices}" if devices else "")


def capacity_line(w: SlotWaiter) -> Text:
    """``▲ ml.finetune_large wants gpu:8: no capacity anywhere (cpu-node-b gpu:0, gpu-node-a gpu:4)``."""
    hosts = ", ".join(f"{host} {slots_text(totals)}" for host, totals in w.capacity.items())
    text = Text("▲ ", style="bold yellow")
    text.append(f"{w.task} wants {slots_text(w.slots)}: ")
    text.append("no capacity anywhere", style="bold yellow")
    text.append(f" ({hosts or 'no live host'}); it waits until a host with that much starts", style="dim")
    return text


class SlotsScreen(ConsoleScreen):
    CSS_PATH = screen_css("slots")
    VIEW_TITLE = "slots"
    BINDINGS = [
        home_binding("slots"),
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
        yield Static(id="capacity")
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
                           ("pool", "Pool"), ("note", "")):
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
            self.query_one("#capacity", Static).display = False
            await box.mount(Static(Text("This fleet has no slot pool.", style="dim")))
            return
        hosts = sum(1 for p in view.pools if p.scope == "host")
        others = len(view.pools) - hosts
        box.border_title = "Resources · " + " · ".join(
            ([f"{hosts} host{'s' if hosts != 1 else ''}"] if hosts else [])
            + ([f"{others} shared pool{'s' if others != 1 else ''}"] if others else []))
        rows: list[Static | Horizontal] = []
        name_width = min(10, max([6, *(len(r.name) + 1 for p in view.pools for r in p.resources)]))
        for pool in view.pools:
            rows.append(Static(pool_title(pool), classes="pool-title"))
            width = max((len(shorten(d.device, 14)) for d in pool.devices), default=1)
            for res in pool.resources:
                span = since(view.sample_interval * max(len(res.history) - 1, 0))
                rows.append(Horizontal(Static(gauge(res.name, res.used, res.total, 26 - name_width, name_width),
                                              classes="gauge"),
                                       UsageStrip(res.history, res.total, classes="usage"),
                                       Static(Text(f" last {span}", style="dim"), classes="span"),
                                       classes="resource"))
                rows += [Static(device_line(d, width), classes="device") for d in pool.devices if d.type == res.name]
            typed = {r.name for r in pool.resources}  # devices of a type without a gauge (none in practice)
            rows += [Static(device_line(d, width), classes="device") for d in pool.devices if d.type not in typed]
        await box.mount_all(rows)
        held: list[Row] = []
        for h in sorted(view.holders, key=lambda h: h.ttl_left):
            ttl = Text("EXPIRED", style="bold white on red") if h.expired else Text(
                left(h.ttl_left), style="yellow" if h.ttl_left < 30 else "")
            held.append((f"{h.pool}\0{h.lease_id}", [h.task, h.worker, holder_slots(h), since(h.age), ttl, h.pool]))
        refill(holders, held)
        wanting: list[Row] = [(str(i), [w.task, w.worker, slots_text(w.slots), since(w.waiting), w.pool,
                                        Text("no capacity anywhere", style="bold yellow") if w.no_capacity else ""])
                              for i, w in enumerate(view.waiting)]
        refill(waiting, wanting or [(None, [Text("nobody is waiting", style="dim"), "", "", "", "", ""])])
        nowhere = [capacity_line(w) for w in view.waiting if w.no_capacity]
        capacity = self.query_one("#capacity", Static)
        capacity.update(Text("\n").join(nowhere))
        capacity.display = bool(nowhere)
