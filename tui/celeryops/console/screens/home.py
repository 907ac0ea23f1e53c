"""Home: the fleet at a glance. Workers (state, queues, active/reserved/scheduled), queue depths, slot gauges,
the current run, and a ``/`` filter over workers, queues and task names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Input, Static

from celeryops.console.fmt import gauge, left, since, state_text
from celeryops.console.screens.base import Row, refill
from celeryops.console.screens.filtering import FilteredScreen, filter_bindings
from celeryops.console.stylesheets import screen_css

if TYPE_CHECKING:  # annotations only: the first frame does not wait for the ops layer's views
    from celeryops.ops.backend.views import FleetView, RunSummary, SlotsView


def _worker_matches(worker, needle: str, view: FleetView) -> bool:
    if not needle:
        return True
    if needle in worker.name.lower() or any(needle in q.lower() for q in worker.queues):
        return True
    return any(t.worker == worker.name and needle in t.name.lower() for t in view.tasks)


# Counts before queues: on a narrow terminal the queue list (last) is the one shortened, and Fence (which
# workers run the plugin; the preflight lists them too) makes room for it.
WORKER_COLUMNS = (("name", "Worker"), ("state", "State"), ("active", "Active"), ("reserved", "Reserved"),
                  ("scheduled", "ETA"), ("fence", "Fence"), ("queues", "Consuming"))


class HomeScreen(FilteredScreen):
    CSS_PATH = screen_css("home")
    VIEW_TITLE = "home"
    DANGEROUS = frozenset({"start_drain", "start_deploy", "restore_again"})
    FILTERED = "#workers"
    BINDINGS = [
        *filter_bindings("home", "Filter workers and queues by worker, queue or task name.",
                         "Show every worker and queue again."),
        Binding("ctrl+r", "refresh", "Refresh", id="home.refresh", show=False, tooltip="Poll the fleet now."),
        Binding("r", "app.show_runs", "Runs", id="home.runs",
                tooltip="Run history: the fleet's recent runs; Enter opens one's event timeline."),
        Binding("s", "app.show_slots", "Slots", id="home.slots", tooltip="Slot pool: gauges, holders, waiters."),
        Binding("a", "app.show_autoscale", "Autoscaler", id="home.autoscale", show=False,
                tooltip="The fleet's autoscaler: demand against capacity, cohorts, decisions and their reasons."),
        Binding("w", "app.show_run", "Run", id="home.run", tooltip="Show the current run."),
        Binding("S", "start_drain", "Start drain", id="home.start_drain",
                tooltip="Run preflight for a drain; nothing changes until you confirm on the checklist."),
        Binding("D", "start_deploy", "Deploy", id="home.start_deploy",
                tooltip="Pick a release branch, then run its preflight; nothing changes until you confirm."),
        Binding("X", "restore_again", "Restore again", id="home.restore_again",
                tooltip="Workers a broker reconnect left consuming nothing after the last run's restore: send the "
                        "restore again (asks first; what `celeryops abort` does)."),
    ]

    def __init__(self, read_only: bool) -> None:
        super().__init__(read_only)
        self.fleet: FleetView | None = None
        self.slots: SlotsView | None = None
        self.needle = ""

    def compose(self) -> ComposeResult:
        yield self.status_bar()
        yield Static("", id="run-banner")
        yield DataTable(id="workers", cursor_type="row", zebra_stripes=True)
        yield Static("", id="findings")
        with Horizontal(id="home-bottom"):
            yield DataTable(id="queues", cursor_type="row")
            with Vertical(id="gauges"):
                yield Static("", id="slot-gauges")
        yield Static("", id="hint")
        hint = Static(self.console.hint, id="demo-hint")
        hint.display = bool(self.console.hint)
        yield hint
        yield Input(placeholder="filter: worker, queue or task name (Esc clears)", id="filter")
        yield self.footer()

    def on_mount(self) -> None:
        workers = self.query_one("#workers", DataTable)
        workers.border_title = "Workers"
        queues = self.query_one("#queues", DataTable)
        queues.border_title = "Queue depths"
        for key, label in (("name", "Queue"), ("depth", "Waiting"), ("consumers", "Consumers")):
            queues.add_column(Text(label), key=key)  # as a str would be, without loading Rich's emoji table
        self.query_one("#gauges").border_title = "Slots"
        self.query_one("#findings").display = False
        self.hide_filter_box()
        self.set_interval(1.0, self._tick)  # the run's countdown and age move between polls
        self.console.poll_now()

    def show_fleet(self, view: FleetView) -> None:
        if view == self.fleet:
            return  # nothing changed since the last poll: no repaint
        self.fleet = view
        self._render_fleet()
        self.refresh_bindings()  # X (restore again) shows while a worker is stranded

    def show_slots(self, view: SlotsView | None) -> None:
        if view == self.slots and self.slots is not None:
            return
        self.slots = view
        gauges = self.query_one("#slot-gauges", Static)
        self.query_one("#gauges").border_title = f"Slots · {view.pool}" if view is not None and view.pools else "Slots"
        if view is None or not view.pools:
            gauges.update(Text("no slot pool", style="dim"))
            return
        text = Text()
        for res in view.resources:
            text.append_text(gauge(res.name, res.used, res.total, 12, name_width=5))
            text.append("\n")
        expired = sum(1 for h in view.holders if h.expired)
        text.append(f"{len(view.waiting)} waiting", style="yellow" if view.waiting else "dim")
        if len(view.pools) > 1:
            text.append(f" · {len(view.pools) - 1} more pool{'s' if len(view.pools) > 2 else ''}", style="dim")
        if expired:
            text.append(f" · {expired} expired", style="bold red")
        gauges.update(text)

    def _render_banner(self) -> None:
        """The run line; called on every poll and every second (its countdown and age move between polls)."""
        view = self.fleet
        if view is None or not self.is_mounted:
            return
        banner = self.query_one("#run-banner", Static)
        run = view.run
        if run is None:
            banner_text = Text(" No run in progress.", style="dim")
            lost = {s.name for s in view.stranded}
            idle = sum(1 for w in view.workers if w.name not in lost and (
                w.state == "stopped" or (w.state == "consuming" and not w.queues)))
            if view.stranded:  # a restore a broker reconnect undid (Celery forgets restored queues)
                names = ", ".join(f"{s.name} ({', '.join(s.queues)})" for s in view.stranded)
                runs = ", ".join(sorted({s.run_id for s in view.stranded}))
                banner_text = Text(f" Stranded by a broker reconnect: {names}, idle since run {runs}'s restore.",
                                   style="bold yellow")
            if idle:  # e.g. stopped by hand
                banner_text.append(f" {idle} worker(s) consume nothing (see Consuming).", style="bold yellow")
            if view.stranded:
                banner_text.append("  X restore again", style="bold")
            if view.broker_safety is not None and view.broker_safety.status == "fail":
                banner_text.append(f" The broker {view.broker_safety.short}: a drain or deploy is refused until its "
                                   "maxmemory-policy is noeviction.", style="bold red")
            banner.update(banner_text)
        elif run.interrupted:
            banner.update(interrupted_text(run, self.console.clock()))
        else:
            age = since(self.console.clock() - run.started_at)
            text = Text(" RUN ", style="bold black on cyan")
            text.append(f" {run.kind} {run.release or ''} · {run.phase}")
            if run.required:
                text.append(f" · streak {run.streak}/{run.required}")
            remaining = remaining_now(run, self.console.clock())
            if remaining is not None:
                text.append(f" · {left(remaining)} to max wait")
            text.append(f" · {run.owner}, {age} ago")
            if run.phase == "drained":
                text.append("  consumers stopped until a deploy or an abort", style="bold yellow")
            if self.console.model.view is not None:  # this console runs or follows it: w shows it
                text.append("  (w to watch)", style="dim")
            banner.update(text)

    def _tick(self) -> None:
        if self.fleet is not None and self.fleet.run is not None:
            self._render_banner()

    def _render_fleet(self) -> None:
        view = self.fleet
        if view is None:
            return
        needle = self.needle.lower()
        shown = [w for w in view.workers if _worker_matches(w, needle, view)]
        workers = self.query_one("#workers", DataTable)
        columns = [c for c in WORKER_COLUMNS if c[0] != "fence" or not self.has_class("-narrow")]
        if [k.value for k in workers.columns] != [key for key, _ in columns]:
            workers.clear(columns=True)
            for key, label in columns:
                workers.add_column(label, key=key)
        rows: list[Row] = []
        for w in shown:
            if not w.observed:  # watch mode between runs: listed only, nobody was asked
                dash = Text("-", style="dim")
                cells = {"name": w.name, "state": Text("listed", style="dim"), "active": dash, "reserved": dash,
                         "scheduled": dash, "fence": "yes" if w.plugin else dash, "queues": dash}
                rows.append((w.name, [cells[key] for key, _ in columns]))
                continue
            cells = {"name": w.name, "state": state_text(w.state), "active": w.active, "reserved": w.reserved,
                     "scheduled": Text(str(w.scheduled), style="yellow") if w.scheduled else "0",
                     "fence": "yes" if w.plugin else Text("no", style="dim"),
                     "queues": ", ".join(w.queues) or Text("none", style="dim")}
            rows.append((w.name, [cells[key] for key, _ in columns]))
        refill(workers, rows, fit="queues")
        rows = []
        for q in view.queues:
            if needle and needle not in q.name.lower():
                continue
            depth = Text("?", style="dim") if q.depth is None else Text(
                f"{q.depth:,}", style="bold yellow" if q.depth > 1000 else "")
            rows.append((q.name, (q.name, depth, q.consumers)))
        refill(self.query_one("#queues", DataTable), rows)
        self._render_findings()
        self._render_banner()
        unknown = sum(1 for w in view.workers if w.state == "unknown" and w.observed)
        waiting = sum(q.depth or 0 for q in view.queues)
        hint = Text(f" {len(view.workers)} workers", style="bold")
        if unknown:
            hint.append(f" · {unknown} unknown", style="bold red")
        if any(not w.observed for w in view.workers):
            hint.append(" · watch mode: workers listed, not asked, until a run is live", style="dim")
        hint.append(f" · {waiting:,} message{'' if waiting == 1 else 's'} waiting · {len(view.tasks)} task"
                    f"{'' if len(view.tasks) == 1 else 's'} held")
        if view.findings:
            hint.append(f" · {len(view.findings)} finding{'' if len(view.findings) == 1 else 's'}", style="yellow")
        safety = view.broker_safety
        if safety is not None:  # may the broker drop tasks (evicting policy) or lose them on a restart?
            style = {"ok": "dim", "warn": "yellow", "fail": "bold red"}.get(safety.status, "")
            hint.append(f" · broker {safety.short}", style=style)
        if needle:
            hint.append(f" · filter '{self.needle}': {len(shown)} shown", style="cyan")
        self.query_one("#hint", Static).update(hint)

    def _render_findings(self) -> None:
        """The doctor's findings and the live ones, one line each (the fix and the docs: `celeryops doctor`)."""
        view = self.fleet
        panel = self.query_one("#findings", Static)
        panel.display = bool(view is not None and view.findings)
        if view is None or not view.findings:
            return
        room = FINDING_LINES if not self.has_class("-short") else 2
        shown = room if len(view.findings) <= room else room - 1  # the last line says how many more
        panel.border_title = f"Findings ({len(view.findings)})"
        panel.border_subtitle = view.findings_note or "the fixes: celeryops doctor"
        lines = [finding_line(f) for f in view.findings[:shown]]
        if len(view.findings) > shown:
            lines.append(Text(f"… {len(view.findings) - shown} more: celeryops doctor", style="dim"))
        panel.update(Text("\n").join(lines))  # one line each (home.tcss): the rest is `celeryops doctor`'s

    def on_resize(self) -> None:
        self.call_after_refresh(self._render_fleet)  # the queue column is fitted to the new width

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "restore_again" and not (self.fleet is not None and self.fleet.stranded):
            return False  # in the footer only while a worker is stranded
        if self.filter_refuses(action):
            return False
        return super().check_action(action, parameters)

    def apply_filter(self, needle: str) -> None:
        self.needle = needle
        self._render_fleet()

    def action_refresh(self) -> None:
        self.console.poll_now()

    def action_start_drain(self) -> None:
        self.console.begin_run("drain", None)

    def action_start_deploy(self) -> None:
        self.console.action_pick_release()

    def action_restore_again(self) -> None:
        if self.fleet is not None and self.fleet.stranded:
            self.console.confirm_restore_again(self.fleet.stranded)


FINDING_LINES = 4  # findings listed on the home view (the rest: `celeryops doctor`)
LIVE_FINDINGS = frozenset({"redelivered", "hoarding", "orphaned_task"})


def finding_line(finding) -> Text:
    """``shutdown_grace  w1, w2  on Cloud Run (service), a worker is SIGKILLed...`` on one line."""
    text = Text()
    text.append(f"{finding.id} ", style="bold red" if finding.id in LIVE_FINDINGS else "bold yellow")
    who = ", ".join(finding.workers[:2]) + (" …" if len(finding.workers) > 2 else "")
    if who:
        text.append(f"{who}  ", style="cyan")
    text.append(finding.what)
    return text


def interrupted_text(run: RunSummary, now: float) -> Text:
    """The header of a run whose owner is gone: what it is, the phase it reached, whose it was, since when and why,
    and what it still holds stopped."""
    text = Text(" INTERRUPTED ", style="bold white on red")
    text.append(f" {run.kind} {run.release or ''} · reached {run.phase} · {run.owner}: {run.interrupted_why} "
                f"{since(max(0.0, now - (run.interrupted_at or now)))} ago")
    if run.stopped_workers:
        text.append(f" · {run.stopped_workers} worker(s) stopped", style="bold yellow")
    text.append("  w resume/abort", style="bold")
    return text


def remaining_now(run: RunSummary, now: float) -> float | None:
    """Time to max wait at ``now``: the last measure less the time since it (only while the drain runs)."""
    if run.remaining is None or run.measured_at is None or run.phase not in ("stopping", "draining"):
        return run.remaining
    return max(0.0, run.remaining - max(0.0, now - run.measured_at))
