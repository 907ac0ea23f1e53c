"""Resume/abort panel: an unfinished run from the journal (phase, age, owner, release) and what each choice will
do, per the recovery rules. Every choice is confirmed first; leaving changes nothing."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from celeryops.console.fmt import since
from celeryops.console.screens.base import ConsoleScreen
from celeryops.console.stylesheets import screen_css
from celeryops.ops.backend.views import RunView

CHOICE_KEYS = {"resume": "R", "abort": "X", "detach": "D"}


class ResumeScreen(ConsoleScreen):
    CSS_PATH = screen_css("resume")
    VIEW_TITLE = "unfinished run"
    DANGEROUS = frozenset({"choose"})
    BINDINGS = [
        Binding("R", "choose('resume')", "Resume", id="resume.resume",
                tooltip="Take over the run and continue it (asks first)."),
        Binding("X", "choose('abort')", "Abort", id="resume.abort",
                tooltip="Abort the run and restore consumers as journalled (asks first)."),
        Binding("escape,l", "leave", "Leave it", id="resume.leave",
                tooltip="Go to the fleet; the run stays as it is for later."),
    ]

    def __init__(self, read_only: bool, run: RunView) -> None:
        super().__init__(read_only)
        self.run = run

    def compose(self) -> ComposeResult:
        run = self.run
        facts = Text()
        for label, value in (("Run", f"{run.run_id} ({run.kind})"), ("Release", run.release or "-"),
                             ("Phase", run.phase), ("Started", f"{since(self.console.clock() - run.started_at)} ago"),
                             ("Owner", run.owner)):
            facts.append(f"{label:<9}", style="bold")
            facts.append(f"{value}\n")
        if run.interrupted_at is not None:
            facts.append(f"{'Stopped':<9}", style="bold")
            facts.append(f"{since(self.console.clock() - run.interrupted_at)} ago: {run.interrupted_why}\n",
                         style="bold red")
        if run.detail:
            facts.append(run.detail, style="italic")
        facts.rstrip()
        yield self.status_bar()
        with VerticalScroll(id="resume-panel"):
            intro = ("An earlier run was interrupted: nobody runs it now. Nothing has been changed since it stopped."
                     if run.interrupted_at is not None else
                     "An earlier run did not finish. Nothing has been changed since it stopped.")
            yield Static(Text(intro, style="bold yellow"), id="resume-intro")
            yield Static(facts, id="run-facts")
            for choice in run.choices:
                key = CHOICE_KEYS.get(choice.kind, "?")
                text = Text()
                if self.read_only:
                    text.append(f"{choice.label}", style="bold dim")
                    text.append("  (from `celeryops resume`, not in watch mode)\n", style="dim")
                else:
                    text.append(f"[{key}] {choice.label}\n", style="bold red" if choice.dangerous else "bold")
                text.append(choice.plan)
                yield Static(text, classes="choice", id=f"choice-{choice.kind}")
            leave = Text("[Esc] Leave it\n", style="bold")
            leave.append("Go to the fleet view; the run stays journalled for later (w brings you back here).")
            yield Static(leave, classes="choice", id="choice-leave")
        yield self.footer()

    def on_mount(self) -> None:
        self.query_one("#run-facts").border_title = "Interrupted run"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        allowed = super().check_action(action, parameters)
        if action == "choose" and allowed:
            return any(c.kind == parameters[0] for c in self.run.choices)
        return allowed

    def action_choose(self, kind: str) -> None:
        choice = next(c for c in self.run.choices if c.kind == kind)
        self.console.confirm_recovery(choice, self.run)

    def action_leave(self) -> None:
        self.dismiss_panel()

    def dismiss_panel(self) -> None:
        self.app.pop_screen()
