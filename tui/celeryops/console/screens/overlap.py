"""Overlap deploy: both revisions of the worker pool side by side. The steps so far; one row per revision (instances,
share of the split, workers, what it does now: the new revision's completed tasks per second); then, as on the drain
screen, the old revision's drain (empty-streak meter, countdown to max wait, the tasks its workers still run) and
the event log. Everything comes from the run's ``overlap`` events and the drain's polls (one event vocabulary)."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Sparkline, Static

from celeryops.console.model import OverlapState, RunModel
from celeryops.console.screens.base import Row, refill
from celeryops.console.screens.drain import DrainScreen
from celeryops.console.screens.filtering import filter_bindings
from celeryops.console.screens.running import run_nav_bindings
from celeryops.console.stylesheets import screen_css
from celeryops.console.widgets.task_table import TaskTable

#: The deploy's steps as the operator follows them: (label, the step that begins it, the step that ends it).
FLOW = (("new revision up", "scaling_up", "scaled_up"), ("new consumes", "scaled_up", "consuming"),
        ("old drains", "stopping_old", "old_idle"), ("cut over", "cutting_over", "cut_over"))
RETIRE_FLOW = (("old consumes again", "retiring", "old_restored"), ("new drains", "holding_new", "retired"),
               ("new retired", "holding_new", "retired"))
END_BADGE = {"done": ("DONE", "bold black on green"), "failed": ("FAILED", "bold white on red"),
             "aborted": ("ABORTED", "bold black on yellow")}


#: A rollback's words for the two revisions: the one routed back to comes up "new", the deployed one drains.
ROLLBACK_WORDS = (("new revision", "previous revision"), ("new ", "previous "), ("old ", "deployed "))


def rollback_words(label: str) -> str:
    for deploy, rollback in ROLLBACK_WORDS:
        label = label.replace(deploy, rollback)
    return label


def steps_text(overlap: OverlapState | None, phase: str | None, *, rollback: bool = False) -> Text:
    """``✔ new revision up → ✔ new consumes → … old drains → · cut over`` (the retirement's steps once it began;
    ``rollback``: the previous revision comes up, the deployed one drains)."""
    text = Text()
    if overlap is None:
        return Text("waiting for the pool update to be sent", style="dim")
    flow = FLOW if not overlap.retiring else RETIRE_FLOW[:1] + RETIRE_FLOW[2:]
    for i, (label, begins, ends) in enumerate(flow):
        label = rollback_words(label + " ").strip() if rollback else label
        if i:
            text.append(" → ", style="dim")
        if overlap.seen(ends):
            text.append(f"✔ {label}", style="green")
        elif overlap.seen(begins) and phase not in ("failed", "aborted"):
            text.append(f"… {label}", style="bold cyan")
        elif overlap.seen(begins):
            text.append(f"✘ {label}", style="bold red")
        else:
            text.append(f"· {label}", style="dim")
    if overlap.step == "kept_both":
        text.append("  both revisions keep consuming", style="bold yellow")
    return text


def old_doing(overlap: OverlapState, model: RunModel) -> Text:
    """What the old revision does now."""
    step, progress = overlap.step, model.progress
    if overlap.seen("cut_over"):
        return Text("retired: its instances were taken away once idle", style="dim")
    if step == "cutting_over":
        return Text("idle and held: its instances are being taken away", style="yellow")
    if overlap.retiring:
        return Text("consuming again", style="green")
    if step == "old_idle" or (model.finished is not None and model.finished.outcome == "drained"):
        return Text("idle and held (drained)", style="bold green")
    if step == "stopping_old":
        if progress is None:
            return Text("told to stop taking tasks", style="yellow")
        text = Text("stopped · ", style="yellow")
        text.append(f"{progress.active} running", style="bold cyan" if progress.active else "dim")
        text.append(" · ")
        text.append(f"{progress.reserved} prefetched", style="bold cyan" if progress.reserved else "dim")
        return text
    return Text("consuming (keeps consuming until the new revision does)", style="green")


def new_doing(overlap: OverlapState) -> Text:
    """What the new revision does now: its completed tasks and their rate once it consumes."""
    step = overlap.step
    if overlap.seen("cut_over"):
        done = f" · {overlap.completed} done during the overlap" if overlap.completed is not None else ""
        return Text(f"serves every instance{done}", style="bold green")
    if step == "retired":
        return Text("retired: the pool is back on the old revision", style="dim")
    if step == "holding_new":
        return Text("held: finishing its tasks before it is taken away", style="yellow")
    if step == "planned":
        return Text("named up front; the update is sent next", style="dim")
    if step == "scaling_up":
        return Text("starting beside the old revision", style="cyan")
    if step == "scaled_up" and not overlap.consuming:
        return Text("started; waiting until its workers consume", style="cyan")
    workers = overlap.workers.get(overlap.new)
    consuming = sum(1 for name in workers if name in overlap.consuming) if workers else len(overlap.consuming)
    text = Text(f"{consuming} consume" if consuming else "consuming", style="green")
    if overlap.completed is not None:
        text.append(f" · {overlap.completed} done", style="bold")
    if overlap.rate is not None:
        text.append(f" · {overlap.rate:.1f}/s", style="bold cyan")
    return text


def revision_rows(overlap: OverlapState, model: RunModel) -> list[Row]:
    """One row per revision (every old cohort of a pool the autoscaler split: one row each, drained as one); on a
    rollback, ``from`` the deployed one ``to`` the previous one."""
    rows: list[Row] = []
    back = model.kind == "rollback"
    cohorts = [rev for rev in overlap.instances if rev not in (overlap.old, overlap.new)]
    was = old_doing(overlap, model)
    for role, revision, doing in (*(("old", rev, was) for rev in (overlap.old, *cohorts)),
                                  ("new", overlap.new, new_doing(overlap))):
        instances = overlap.instances.get(revision)
        share = overlap.split.get(revision)
        workers = overlap.workers.get(revision)
        gone = overlap.seen("cut_over") if role == "old" else overlap.seen("retired")
        # Once its instances were taken away, the workers the last progress named are gone.
        who = "gone" if gone else "-" if workers is None else str(len(workers))
        shown = {"old": "from", "new": "to"}[role] if back else role
        key = role if revision in (overlap.old, overlap.new) else f"old:{revision}"
        rows.append((key, (Text(shown, style="bold"), revision or "-", "-" if instances is None else str(instances),
                            "-" if share is None else f"{share}%", who, doing)))
    return rows


class OverlapScreen(DrainScreen):
    CSS_PATH = screen_css("drain", "overlap")
    VIEW_TITLE = "overlap deploy"
    BINDINGS = [
        *filter_bindings("overlap", "Filter the old revision's tasks by worker, task name or id.",
                         "Show every task again."),
        *run_nav_bindings("overlap", "the deploy"),
        Binding("X", "abort", "Abort", id="overlap.abort",
                tooltip="Abort the overlap: the old revision consumes again and the new one is retired once idle "
                        "(once the cutover began: it is finished). Asks first."),
        Binding("F", "forget_unknown", "Forget unknown", id="overlap.forget",
                tooltip="Stop waiting for old workers that do not reply (they are gone)."),
    ]

    def compose_head(self) -> ComposeResult:
        yield Static("", id="overlap-title")
        yield Static("", id="overlap-steps")
        yield DataTable(id="revisions", cursor_type="none", show_cursor=False)

    def compose_inflight(self) -> ComposeResult:
        yield Static("Old running ", id="inflight-label")
        yield Sparkline([], id="inflight")
        yield Static("New done/s ", id="rate-label")
        yield Sparkline([], id="rate")

    def on_mount(self) -> None:
        table = self.query_one("#revisions", DataTable)
        table.border_title = "Revisions side by side"
        for key, label in (("role", "Role"), ("revision", "Revision"), ("instances", "Inst."),
                           ("split", "Split"), ("workers", "Workers"), ("doing", "Now")):
            table.add_column(label, key=key)
        super().on_mount()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        allowed = super().check_action(action, parameters)
        overlap = self.console.model.overlap
        if action == "abort" and allowed and overlap is not None and (
                overlap.retiring or self.console.model.operator_aborted):
            return None  # the run already does what X would: the old revision back, the new one retired
        return allowed

    def _show_title(self, model: RunModel) -> None:
        overlap = model.overlap
        title = Text(" ".join(part for part in ("deploy" if model.kind != "rollback" else "rollback", model.release)
                              if part), style="bold")
        title.append(" · overlap" + (f" on {overlap.target}" if overlap and overlap.target else ""))
        title.append(f" · phase {model.phase or '-'}")
        if model.phase in END_BADGE:
            word, style = END_BADGE[model.phase]
            title.append(f"  {word} ", style=style)
        if overlap is not None and overlap.peak:
            title.append(f" · peak {overlap.peak} instances", style="dim")
        self.query_one("#overlap-title", Static).update(title)

    def render_model(self, model: RunModel) -> None:
        if not self.is_mounted:
            return
        super().render_model(model)
        overlap = model.overlap
        steps = steps_text(overlap, model.phase, rollback=model.kind == "rollback")
        self.query_one("#overlap-steps", Static).update(steps)
        table = self.query_one("#revisions", DataTable)
        if overlap is not None:
            refill(table, revision_rows(overlap, model), fit="doing")
        whose = "New" if overlap is not None and overlap.drained_revision == overlap.new else "Old"
        self.query_one("#inflight-label", Static).update(Text.assemble((f"{whose} running ", "bold"),
                                                                       _last(model.inflight)))
        rates = list(overlap.rates) if overlap is not None else []
        spark = self.query_one("#rate", Sparkline)
        spark.styles.width = max(2, len(rates))
        spark.data = rates or [0]
        self.query_one("#rate-label", Static).update(Text.assemble(
            (" New done/s ", "bold"), (f"{rates[-1]:.1f}" if rates else "-", "bold cyan")))
        tasks = self.query_one(TaskTable)
        if overlap is not None:
            tasks.border_title = f"Tasks still running on {overlap.drained_revision}"
        if model.started is None and overlap is not None and not overlap.retiring:
            self.query_one("#counts", Static).update(Text(
                f"{overlap.old} keeps consuming until the workers of {overlap.new or 'the new revision'} consume; "
                "then only its workers stop taking tasks and finish what they hold. Nothing is killed.",
                style="dim"))


def _last(values: Iterable[int]) -> Text:
    seen = list(values)
    return Text(str(seen[-1]) if seen else "-", style="bold cyan")
