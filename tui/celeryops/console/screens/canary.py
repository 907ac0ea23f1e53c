"""Canary deploy: the canary revision judged against the baseline, look by look. The verdict so far, its reason and
what would decide it; the statistic (the failure rate's increase with its bounds, the Fisher p-value against this
look's alpha); one row per revision and, under them, per task name: completed and failed tasks, the failure rate
with its interval, runtime p50/p95, the exception types; then the event log. Everything comes from the run's
``canary_look`` events (one event vocabulary).

Keys (dangerous: uppercase, each asks first, none registered in watch mode): P promote now, B roll back now, Z pause
or resume the automatic verdicts. They send typed decisions (``celeryops.ops.run.decisions``) that the run's
canary strategy takes between looks."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import DataTable, Sparkline, Static
from textual.widgets.data_table import ColumnKey

from celeryops.console.fmt import left
from celeryops.console.model import RunModel
from celeryops.console.screens.base import Row, refill
from celeryops.console.screens.running import RunScreen, run_nav_bindings
from celeryops.console.stylesheets import screen_css
from celeryops.core.canarylook import CanaryLook, RevisionStats, percent

if TYPE_CHECKING:
    from celeryops.ops.run.decisions import Decision

VERDICT_STYLE = {"continue": "bold black on cyan", "promote": "bold black on green",
                 "rollback": "bold white on red", "inconclusive": "bold black on yellow"}
END_BADGE = {"done": ("DONE", "bold black on green"), "failed": ("FAILED", "bold white on red"),
             "aborted": ("ABORTED", "bold black on yellow")}


def seconds(value: float | None) -> str:
    """A task's runtime, short enough for a table cell: ``0.42s``, ``3.1s``, ``12m``."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2g}s" if value < 1 else f"{value:.1f}s"
    if value < 600:
        return f"{value:.0f}s"
    return f"{value / 60:.0f}m"


def stat_cells(stats: RevisionStats) -> tuple[object, ...]:
    """completed, failed, rate, interval, p50, p95, exceptions (retries too, when there were)."""
    rate = Text(percent(stats.rate) if stats.completed else "-",
                style="bold red" if stats.failed and stats.rate >= 0.1 else "bold" if stats.failed else "")
    interval = f"{percent(stats.low)}-{percent(stats.high)}" if stats.completed else "-"
    failed = Text(str(stats.failed), style="bold red" if stats.failed else "dim")
    exceptions = [f"{name} ({n})" for name, n in sorted(stats.exceptions.items(), key=lambda kv: (-kv[1], kv[0]))]
    if stats.retried:
        exceptions.append(f"{stats.retried} retried")
    return (str(stats.completed), failed, rate, interval, seconds(stats.p50), seconds(stats.p95),
            ", ".join(exceptions) or "-")


def side_rows(look: CanaryLook, narrow: bool = False) -> list[Row]:
    """Both revisions (by name; ``narrow``: "all tasks", the title names them), then each task name's two sides, the
    canary's first (what is judged); ``narrow``: task names cut to 12 columns, "base" for the baseline."""
    rows: list[Row] = []
    sides = (("canary", look.canary), ("baseline", look.baseline))

    def side(role: str, style: str) -> Text:
        return Text("base" if narrow and role == "baseline" else role, style=style)

    for role, revision in sides:
        rows.append((role, (Text("all tasks" if narrow else revision or "-", style="bold"),
                            side(role, "bold cyan" if role == "canary" else "bold"), *stat_cells(look.side(role)))))
    for name, by_role in look.tasks.items():
        name_or = name or "(name unseen)"  # its task-received event came before the canary began
        shown = name_or if not narrow or len(name_or) <= 12 else name_or[:11] + "…"
        for role, _ in sides:
            stats = by_role.get(role) or RevisionStats()
            rows.append((f"{name}\x00{role}", (Text(shown if role == "canary" else ""), side(role, "dim"),
                                                *stat_cells(stats))))
    return rows


def verdict_text(look: CanaryLook | None, phase: str | None, narrow: bool = False) -> Text:
    """``CONTINUE`` (its badge), the look and the time, the reason; below: what would decide it (``narrow``: the
    first line shorter)."""
    if look is None:
        return Text("waiting for the first look: the canary's tasks are being counted", style="dim")
    text = Text()
    text.append(f" {look.verdict.upper()} ", style=VERDICT_STYLE.get(look.verdict, "bold"))
    if look.paused:
        text.append(" PAUSED ", style="bold black on yellow")
        text.append(" ")
    text.append(f" look {look.look}/{look.max_looks} · ", style="bold")
    remaining = look.max_duration - look.elapsed
    of = "" if narrow else f" of {left(look.max_duration)}"
    text.append(f"{left(remaining)} left{of}" if remaining > 0 else
                f"past max duration ({left(look.max_duration)})", style="dim" if remaining > 0 else "bold yellow")
    canary = look.side("canary").completed
    needs = f"{canary}/{look.min_tasks} canary tasks" if narrow else \
        f"{canary} of {look.min_tasks} canary tasks a promotion needs"
    text.append(f" · {needs}" if look.min_tasks else "", style="dim")
    text.append("\n")
    text.append(look.reason or "-")
    if look.decide:
        text.append("\nDecides it: ", style="bold")
        text.append(look.decide)
    elif look.verdict in ("promote", "rollback") and phase not in ("done", "failed", "aborted"):
        text.append(f"\n{'Promoting' if look.verdict == 'promote' else 'Rolling back'}: the run does it now.",
                    style="bold")
    return text


def statistic_text(look: CanaryLook | None) -> Text:
    """The increase of the failure rate with its bounds, the Fisher p-value and this look's alpha."""
    if look is None:
        return Text("")
    sign = "+" if look.increase >= 0 else ""
    text = Text("Increase ", style="bold")
    text.append(f"{sign}{percent(look.increase)}", style="bold red" if look.increase > 0 else "bold green")
    text.append(f" [{percent(look.increase_low)}, {percent(look.increase_high)}]")
    text.append("  ·  Fisher p ", style="bold")
    text.append(f"{look.p_value:.3g}", style="bold red" if look.p_value <= look.alpha_look else "")
    text.append(f" (rolls back at ≤ {look.alpha_look:.2g} this look)")
    text.append("  ·  crashes ", style="bold")
    text.append(str(look.crashes), style="bold red" if look.crashes else "")
    if look.new_exceptions:
        text.append("  ·  new on the canary: ", style="bold")
        text.append(", ".join(look.new_exceptions), style="bold red")
    return text


class CanaryScreen(RunScreen):
    CSS_PATH = screen_css("canary")
    VIEW_TITLE = "canary deploy"
    DANGEROUS = frozenset({"promote_now", "rollback_now", "pause"})
    BINDINGS = [
        *run_nav_bindings("canary", "the canary"),
        Binding("P", "promote_now", "Promote now", id="canary.promote",
                tooltip="Promote the canary now, whatever the verdict so far: the old revision drains by the "
                        "drain's rules and every instance moves to the canary's revision. Asks first."),
        Binding("B", "rollback_now", "Roll back now", id="canary.rollback",
                tooltip="Roll the canary back now: its workers stop taking tasks at once, finish what they run, and "
                        "every instance goes back to the old revision. Asks first."),
        Binding("Z", "pause", "Pause/resume", id="canary.pause",
                tooltip="Pause the automatic verdicts (the looks go on; both revisions keep consuming), or resume "
                        "them. Asks first."),
    ]

    def compose(self) -> ComposeResult:
        yield self.status_bar()
        yield Static("", id="canary-title")
        yield Static("", id="canary-verdict")
        with Horizontal(id="statistic-row"):
            yield Static("", id="statistic")
            yield Static(" · upper bound by look ", id="bound-label")
            yield Sparkline([], id="bound")
        yield DataTable(id="sides", cursor_type="none", show_cursor=False)
        yield self.event_log()
        yield self.footer()

    def on_mount(self) -> None:
        self.query_one("#canary-verdict").border_title = "Verdict so far"
        self.query_one("#log").border_title = "Events"
        table = self.query_one("#sides", DataTable)
        table.border_title = "Task outcomes per revision and task name"
        for key, label in (("task", "Revision / task"), ("side", "Side"), ("completed", "Done"),
                           ("failed", "Failed"), ("rate", "Rate"), ("interval", "Interval"), ("p50", "p50"),
                           ("p95", "p95"), ("exceptions", "Errors")):
            table.add_column(label, key=key)
        self.render_model(self.console.model)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        allowed = super().check_action(action, parameters)
        if not allowed or action not in self.DANGEROUS:
            return allowed
        model = self.console.model
        look = model.canary
        if look is None or not model.active or (look.verdict in ("promote", "rollback") and not look.paused):
            return None  # no canary to decide on, or the run already promotes or rolls back: shown, disabled
        return True

    def _send(self, what: str, decision: Decision) -> None:
        self.console.call_backend(what, self.console.backend.canary_decision(decision))

    def _decide_now(self, verb: str, effect: Callable[[CanaryLook], str], what: str,
                    decision: Callable[[], Decision]) -> None:
        """Ask, then send ``decision``: ``verb`` ("Promote") titles the dialog and names its button, ``effect``
        says what follows (after the verdict so far)."""
        look = self.console.model.canary
        if look is None:
            return
        self.console.confirm(f"{verb} {look.canary} now?",
                             f"The verdict so far is {look.verdict}: {look.reason}\n\n{effect(look)}", f"{verb} now",
                             lambda: self._send(what, decision()))

    def action_promote_now(self) -> None:
        from celeryops.ops.run.decisions import PromoteNow

        self._decide_now("Promote", lambda look: (
            f"Promoting now is the overlap's cutover: the workers of {look.baseline} stop taking new tasks and finish "
            f"what they run (the drain's rules), then every instance moves to {look.canary} at the original count. "
            "No busy instance is taken away and nothing is killed."), "promote the canary", PromoteNow)

    def action_rollback_now(self) -> None:
        from celeryops.ops.run.decisions import RollbackNow

        self._decide_now("Roll back", lambda look: (
            f"The workers of {look.canary} stop taking new tasks at once and finish what they run; then every "
            f"instance goes back to {look.baseline} at the original count. {look.baseline} keeps consuming "
            "throughout; nothing is killed."), "roll back the canary", RollbackNow)

    def action_pause(self) -> None:
        from celeryops.ops.run.decisions import PauseCanary

        look = self.console.model.canary
        if look is None:
            return
        if look.paused:
            self.console.confirm("Resume the canary's verdicts?", "The looks may promote or roll back by themselves "
                                 "again, from the next one on.", "Resume",
                                 lambda: self._send("resume the canary", PauseCanary(paused=False)))
            return
        self.console.confirm("Pause the canary's verdicts?", "The looks go on and are shown here, but none promotes "
                             "or rolls back by itself until you resume (Z again); P and B still decide at once. Both "
                             "revisions keep consuming.", "Pause",
                             lambda: self._send("pause the canary", PauseCanary(paused=True)))

    def _show_title(self, model: RunModel, narrow: bool) -> None:
        """Release, target, phase, the end's badge, then both revisions; ``narrow``: the revisions first (its table
        does not name them), then the phase."""
        look = model.canary
        names = f"{look.canary} vs {look.baseline}" if look is not None else ""
        if narrow:
            title = Text(f"canary {names}" if names else "canary", style="bold")
            title.append(f" · {model.phase or '-'}")
        else:
            title = Text(" ".join(part for part in ("deploy", model.release) if part), style="bold")
            title.append(" · canary" + (f" on {look.target}" if look is not None and look.target else ""))
            title.append(f" · phase {model.phase or '-'}")
        if model.phase in END_BADGE:
            word, style = END_BADGE[model.phase]
            title.append(f"  {word} ", style=style)
        if names and not narrow:
            title.append(f" · {names}", style="dim")
        self.query_one("#canary-title", Static).update(title)

    def render_model(self, model: RunModel) -> None:
        if not self.is_mounted:
            return
        narrow = 0 < self.size.width < 100
        self._show_title(model, narrow)
        look = model.canary
        self.query_one("#canary-verdict", Static).update(verdict_text(look, model.phase, narrow))
        self.query_one("#statistic", Static).update(statistic_text(look))
        bounds = [max(0.0, b) for b in model.canary_history]
        spark = self.query_one("#bound", Sparkline)
        spark.display = self.query_one("#bound-label").display = len(bounds) > 1
        spark.styles.width = max(2, len(bounds))
        spark.data = bounds or [0.0]
        table = self.query_one("#sides", DataTable)
        if look is not None:
            table.columns[ColumnKey("task")].label = Text("Task" if narrow else "Revision / task")
            refill(table, side_rows(look, narrow), fit="exceptions")
        self.show_new_log_lines(model)
