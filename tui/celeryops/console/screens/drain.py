"""Drain: the live drain. Counts with the ETA warning, per-worker state badges, the empty-streak meter,
the countdown to max wait, a sparkline of in-flight tasks, the task table (updated in place) and the event log."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Input, Sparkline, Static

from celeryops.console.fmt import since
from celeryops.console.model import RunModel
from celeryops.console.screens.filtering import FilteredScreen, filter_bindings
from celeryops.console.screens.running import RunScreen, run_nav_bindings
from celeryops.console.stylesheets import screen_css
from celeryops.console.widgets.meters import Countdown, StreakMeter, WorkerBadges
from celeryops.console.widgets.task_table import TaskTable
from celeryops.core.events import DrainProgress


class DrainScreen(RunScreen, FilteredScreen):
    CSS_PATH = screen_css("drain")
    VIEW_TITLE = "drain"
    DANGEROUS = frozenset({"abort", "forget_unknown"})
    FILTERED = "#tasks"
    BINDINGS = [
        *filter_bindings("drain", "Filter tasks by worker, task name or id.", "Show every task again."),
        *run_nav_bindings("drain", "the run"),
        Binding("X", "abort", "Abort", id="drain.abort",
                tooltip="Abort the run and restore consumers exactly as they were."),
        Binding("F", "forget_unknown", "Forget unknown", id="drain.forget",
                tooltip="Stop waiting for workers that do not reply (they are gone)."),
    ]

    def __init__(self, read_only: bool) -> None:
        super().__init__(read_only)
        self._progress_seen: object = None
        self._progress_at = 0.0  # console clock when the last poll result arrived

    def compose(self) -> ComposeResult:
        yield self.status_bar()
        yield from self.compose_head()
        with Horizontal(id="meters"):  # one above the other; side by side on a short terminal
            yield StreakMeter(id="streak")
            yield Countdown(id="countdown")
        yield Static("", id="counts")
        yield WorkerBadges(id="badges")
        with Horizontal(id="inflight-row"):
            yield from self.compose_inflight()
        yield TaskTable(id="tasks")
        yield self.event_log()
        yield Input(placeholder="filter: worker, task name or id (Esc clears)", id="filter")
        yield self.footer()

    def compose_head(self) -> ComposeResult:
        """What stands above the meters."""
        yield Static("", id="drain-title")

    def compose_inflight(self) -> ComposeResult:
        """The sparkline row: its label, then the line."""
        yield Static("In flight ", id="inflight-label")
        yield Sparkline([], id="inflight")

    def on_mount(self) -> None:
        self.query_one("#tasks").border_title = "Tasks held by workers"
        self.query_one("#log").border_title = "Events"
        self.hide_filter_box()
        # The live clock: elapsed and time to max wait move every second between polls, from the last poll and the
        # console's clock (no broker or Redis traffic); paused while no drain is running.
        self._clock = self.set_interval(1.0, self._tick, pause=True)
        self.render_model(self.console.model)
        if self.read_only:  # a watcher only sees what the operator's console publishes: say when that stops
            self.set_interval(5.0, lambda: self._show_title(self.console.model))

    def _show_title(self, model: RunModel) -> None:
        """Kind, release, phase and the outcome or staleness badge first; the queues (longest) last."""
        title = Text(" ".join(part for part in (model.kind or "run", model.release) if part), style="bold")
        title.append(f" · phase {model.phase or '-'}")
        if model.finished is not None:
            ok = model.finished.outcome == "drained"
            title.append(f"  {model.finished.outcome.upper()} ", style="bold black on green" if ok else
                         "bold white on red")
        quiet = self.console.clock() - self._progress_at
        interval = model.started.interval if model.started is not None else 15.0
        if self.read_only and model.active and model.progress is not None and quiet > max(30.0, 3 * interval):
            title.append(f"  no update for {since(quiet)} ", style="bold black on yellow")
        if model.started is not None:
            title.append(f" · queues {', '.join(model.started.queues)}", style="dim")
        self.query_one("#drain-title", Static).update(title)

    def render_model(self, model: RunModel) -> None:
        if not self.is_mounted:
            return
        progress = model.progress
        if progress is not self._progress_seen:
            self._progress_seen, self._progress_at = progress, self.console.clock()
        self._show_title(model)
        if progress is not None:
            self.query_one(StreakMeter).set_streak(progress.streak, progress.required)
            self._tick()
            counts = Text("Held ", style="bold")
            counts.append(f"{progress.active} active", style="bold cyan" if progress.active else "dim")
            counts.append(" · ")
            counts.append(f"{progress.reserved} reserved", style="bold cyan" if progress.reserved else "dim")
            counts.append(" · ")
            counts.append(f"{progress.scheduled} scheduled (ETA)", style="bold yellow" if progress.scheduled
                          else "dim")
            if progress.unknown:
                counts.append(f" · {len(progress.unknown)} unknown", style="bold red")
            if progress.scheduled:
                counts.append("\n▲ ETA tasks are not counted: they run later on their worker, even stopped",
                              style="yellow")
            for name, quiet in progress.silent.items():  # never assumed dead: named, with the remedy
                busy = name in progress.alive
                counts.append(f"\n▲ {name} silent for {since(quiet)}: " + (
                    "busy (its plugin heartbeat is live), waited for" if busy else
                    f"if it is dead, F forgets it (headless: --forget {name})"), style="yellow" if busy else "red")
            self.query_one("#counts", Static).update(counts)
            self.query_one(WorkerBadges).set_workers({n: w.state for n, w in progress.workers.items()})
            self.query_one(TaskTable).apply(progress.tasks)
        elif model.started is not None:
            self.query_one(StreakMeter).set_streak(0, model.started.streak)
            self.query_one(WorkerBadges).set_workers({n: "consuming" for n in model.started.workers})
        history = list(model.inflight)
        spark = self.query_one("#inflight", Sparkline)
        spark.styles.width = max(2, len(history))  # one column per poll: the line grows as the drain goes on
        spark.data = history or [0]
        label = Text("In flight ", style="bold")
        label.append(str(history[-1]) if history else "-", style="bold cyan")
        self.query_one("#inflight-label", Static).update(label)
        self.show_new_log_lines(model)

    def _tick(self) -> None:
        """Move the countdown to now: the last poll's elapsed/remaining plus the time since it arrived; once the
        drain ended (or the run did), the clock stops on how it ended."""
        model = self.console.model
        progress = model.progress
        if progress is None or not self.is_mounted:
            return
        countdown = self.query_one(Countdown)
        finished = model.finished
        if finished is not None:
            countdown.set_time(finished.elapsed, max(0.0, progress.remaining - (finished.elapsed - progress.elapsed)),
                               finished.outcome)
            self._clock.pause()
            return
        if not model.active:  # the run ended without a drain outcome (aborted, failed): freeze at the last poll
            countdown.set_time(progress.elapsed, progress.remaining, model.phase)
            self._clock.pause()
            return
        since_poll = max(0.0, self.console.clock() - self._progress_at)
        countdown.set_time(progress.elapsed + since_poll, max(0.0, progress.remaining - since_poll))
        self._clock.resume()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        allowed = super().check_action(action, parameters)
        if not allowed:
            return allowed
        model = self.console.model
        if self.filter_refuses(action):
            return False
        if action == "abort":  # a live run, or a drain-only run that ended drained and keeps consumers stopped
            return True if model.active or model.parked else None
        if action == "forget_unknown":
            return True if model.progress is not None and forgettable(model.progress) else None
        return True

    def apply_filter(self, needle: str) -> None:
        table = self.query_one(TaskTable)
        table.filter = needle
        progress = self.console.model.progress
        table.apply(progress.tasks if progress else ())

    def action_abort(self) -> None:
        self.console.confirm_abort()

    def action_forget_unknown(self) -> None:
        progress = self.console.model.progress
        names = forgettable(progress) if progress is not None else []
        if not names:
            return
        busy = [n for n in progress.unknown if n in progress.alive] if progress is not None else []
        kept = (f" {', '.join(busy)} {'is' if len(busy) == 1 else 'are'} busy (live plugin heartbeat) and stay "
                "waited for." if busy else "")
        self.console.confirm(
            "Forget workers that do not reply?",
            f"The drain stops waiting for {', '.join(names)}: they are treated as gone. If one is only slow, "
            f"its tasks are no longer counted and may be cut by the deploy.{kept}",
            "Forget", lambda: self.console.call_backend("forget a worker", *[
                self.console.backend.forget_worker(n) for n in names]))


def forgettable(progress: DrainProgress) -> list[str]:
    """The unknown workers F may forget: not those a live plugin heartbeat shows busy (forgetting one would stop
    waiting for the tasks it runs, which a deploy would then cut)."""
    return [name for name in progress.unknown if name not in progress.alive]
