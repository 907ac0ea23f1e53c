"""The console application and its one factory, :func:`make_app`, used by the CLI, the preview and the tests.

The app owns the run model (folded from ops events that arrive through :meth:`ConsoleApp.sink` from any thread),
polls the fleet without overlapping polls, shows the screen that fits the run's phase, and sends the operator's
decisions to the backend, each dangerous one after a confirmation that says what will happen.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import PurePath
from typing import TYPE_CHECKING, ClassVar, Literal

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import ModalScreen, Screen
from textual.timer import Timer

from celeryops.console.confirmations import (
    abort_question,
    proceed_question,
    quit_abort_label,
    restore_again_question,
    rollback_question,
)
from celeryops.console.csscache import load_parsed_css
from celeryops.console.messages import DrainUpdated, FleetUpdated, OpsEvent, SlotsUpdated, to_message
from celeryops.console.model import RunModel, View
from celeryops.console.navigation import RUN_VIEWS, key_commands, run_screen, showing
from celeryops.console.ports import ConsoleBackend
from celeryops.console.screens.base import ConsoleScreen
from celeryops.console.screens.home import HomeScreen
from celeryops.console.stylesheets import screen_css
from celeryops.console.terminal import driver_class
from celeryops.core.errors import EXIT_INTERRUPTED, UserError
from celeryops.core.masking import mask_text

# The other screens are imported when first shown: the home view's first frame does not wait for them (nor for the
# events and views of the ops layer they read).
if TYPE_CHECKING:
    from celeryops.console.screens.quit import QuitChoice
    from celeryops.core.events import Event, RunKind
    from celeryops.ops.backend.views import RecoveryChoice, RunRecordView, RunView, StrandedWorker

Start = Literal["home", "deploy", "drain", "rollback"]


class ConsoleApp(App[int]):
    """celeryops console. Returns the run's exit code (``errors.EXIT_*``) from ``run()``."""

    TITLE = "celeryops"
    # Each screen brings its own stylesheet (read when it is first shown), but Textual does not read the default
    # screen's (get_default_screen): the home view's is the application's, with the shared base.
    CSS_PATH: ClassVar[list[str | PurePath]] = screen_css("base", "home")
    # Every screen gets -narrow or -wide, and -short or -tall: the .tcss files give 80x24 a compact layout.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]
    BINDINGS = [
        Binding("q", "request_quit", "Quit", id="app.quit",
                tooltip="Quit; during a run, asks whether to abort, detach or stay."),
        Binding("ctrl+c,ctrl+q", "request_quit", "Quit", id="app.interrupt", show=False, priority=True,
                tooltip="Same as q: during a run, asks whether to abort, detach or stay."),
        Binding("question_mark", "command_palette", "Actions", id="app.palette", key_display="?",
                tooltip="List every action available here."),
    ]

    def __init__(self, backend: ConsoleBackend, *, read_only: bool, clock: Callable[[], float], start: Start,
                 release: str | None, animate: bool, poll_interval: float) -> None:
        super().__init__(driver_class=driver_class())  # survives its terminal hanging up (console/terminal.py)
        self.backend = backend
        self.read_only = read_only
        self.clock = clock
        self.motion = animate
        self.poll_interval = poll_interval
        self.start = start
        self.release = release
        self.hint = ""  # a line under the home view's tables (the demo's "press D to deploy ...")
        self.model = RunModel()
        self._wanted: View | None = None
        self._polling = False
        self._poll_timer: Timer | None = None
        self._quit_when_settled = False
        self._offered: set[str] = set()  # interrupted runs whose resume/abort panel opened by itself once
        # Set once the first frame is on screen (Textual's Ready): backend calls wait for it, so that the first
        # frame never waits for the backend (which may still be loading: commands.console.LateBackend).
        self._painted = asyncio.Event()
        self.size_hint: tuple[int, int] | None = None
        self.theme = "textual-dark"
        load_parsed_css(self.stylesheet)  # the rules an earlier start parsed (console/csscache.py)
        if not animate:
            self.animation_level = "none"

    # -- screens -----------------------------------------------------------------------------------------------

    def get_default_screen(self) -> Screen:
        return HomeScreen(self.read_only)

    def on_mount(self) -> None:
        if self.start == "home":  # read off the event loop: a slow journal or Redis never freezes the screen
            self.run_worker(self._offer_unfinished(on_start=True), group="backend")
        if self.read_only:
            self.call_backend("follow the live run", self.backend.follow_run(self.sink))
        elif self.start in ("deploy", "drain", "rollback"):
            self.begin_run(self.start, self.release)

    def on_ready(self) -> None:
        self._painted.set()

    def sync_view(self) -> None:
        """Show the screen that fits the run's phase, once per phase change (the operator may navigate away)."""
        want = self.model.view
        if (want is None or want == self._wanted or isinstance(self.screen, ModalScreen)
                or showing(self.screen, "resume", "ResumeScreen")):
            return
        self._wanted = want
        screen = run_screen(want)(self.read_only)
        if isinstance(self.screen, tuple(map(run_screen, RUN_VIEWS))):
            self.switch_screen(screen)
        else:
            self.push_screen(screen)

    def _render_run(self) -> None:
        # The app is shutting down (Textual clears is_running first, then takes the screens' widgets down before
        # the stack): late run events update the model only.
        if not self.screen_stack or not self.is_running:
            return
        self.sync_view()
        if isinstance(self.screen, ConsoleScreen):
            self.screen.render_model(self.model)
            self.screen.refresh_footer()
        if self._quit_when_settled and not self.model.active:
            self.exit(self.model.exit_code())

    def action_show_home(self) -> None:
        while len(self.screen_stack) > 1:
            self.pop_screen()

    def action_show_slots(self) -> None:
        from celeryops.console.screens.slots import SlotsScreen

        if not isinstance(self.screen, SlotsScreen):
            self.push_screen(SlotsScreen(self.read_only))

    def action_show_autoscale(self) -> None:
        from celeryops.console.screens.autoscale import AutoscaleScreen

        if not isinstance(self.screen, AutoscaleScreen):
            self.push_screen(AutoscaleScreen(self.read_only))

    async def _offer_unfinished(self, on_start: bool = False) -> None:
        """The resume/abort panel for an unfinished run in the journal (on start, or when w finds no run here)."""
        await self._painted.wait()
        try:
            unfinished = await self.backend.unfinished_run()
        except UserError as err:
            self._report(err)
            return
        if unfinished is not None and self.model.view is None:
            self._offered.add(unfinished.run_id)
            from celeryops.console.screens.resume import ResumeScreen

            if not isinstance(self.screen, ResumeScreen):
                self.push_screen(ResumeScreen(self.read_only, unfinished))
        elif not on_start and self.model.view is None:
            self.notify("No run in progress in this console; `celeryops watch` follows a run started elsewhere.",
                        severity="information")

    def action_pick_release(self) -> None:
        """D on the home view: the release picker (its Enter starts the deploy's preflight)."""
        from celeryops.console.screens.releases import ReleasesScreen

        if not self.read_only and not isinstance(self.screen, ReleasesScreen):
            self.push_screen(ReleasesScreen(self.read_only, preselect=self.release))

    def action_show_runs(self) -> None:
        from celeryops.console.screens.runs import RunsScreen

        if not isinstance(self.screen, RunsScreen):
            self.push_screen(RunsScreen(self.read_only))

    def action_show_run(self) -> None:
        view = self.model.view
        if view is None:  # maybe the resume/abort panel was left earlier: the run is still journalled
            self.run_worker(self._offer_unfinished(), group="backend")
            return
        if type(self.screen) is not run_screen(view):  # exactly: an overlap screen is a drain screen too
            self._wanted = view
            self.push_screen(run_screen(view)(self.read_only))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The command palette lists what the console's keys do here, then Textual's own commands but its Quit (ours
        asks first during a run)."""
        yield from key_commands(self, screen)
        yield from (command for command in super().get_system_commands(screen) if command.title != "Quit")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # In a dialog, its own keys answer the question: q is not offered there.
        return not (action == "request_quit" and self._in_dialog())

    def _in_dialog(self) -> bool:
        """The quit question or a confirmation is on show."""
        return showing(self.screen, "quit", "QuitScreen") or showing(self.screen, "confirm", "ConfirmScreen")

    # -- events from ops ---------------------------------------------------------------------------------------

    def sink(self, event: Event) -> None:
        """Where ops sends run events; thread-safe."""
        self.post_message(to_message(event))

    def on_ops_event(self, message: OpsEvent) -> None:
        self.model.apply(message.event)
        self._render_run()

    def on_drain_updated(self, message: DrainUpdated) -> None:
        self.model.apply(message.progress)
        self._render_run()

    # -- fleet polling (one at a time; the next is scheduled when the previous finished) -------------------------

    def poll_now(self) -> None:
        if self._polling or not self.is_running:  # not running: the console is closing (or not open yet)
            return
        self._polling = True
        if self._poll_timer is not None:
            self._poll_timer.stop()
        self.run_worker(self._poll(), group="poll")

    async def _poll(self) -> None:
        await self._painted.wait()
        try:
            self.post_message(FleetUpdated(await self.backend.fleet_snapshot()))
            self.post_message(SlotsUpdated(await self.backend.slots_snapshot()))
        except UserError as err:
            self._report(err)
        finally:
            # Off while the console starts (commands.console.open_console), its first poll included: loading the
            # ops layer under a GC that walks Textual's fresh objects costs ~18 % more. Back on once it is done, what
            # the start allocated (modules, classes, widgets: it lives as long as the console) moved out of the
            # collector's sight first: its first full pass would otherwise walk all of it (~30 ms) just as the
            # fleet is drawn, and every full pass after it again.
            if not gc.isenabled():
                gc.freeze()
                gc.enable()
            self._polling = False
            self._poll_timer = self.set_timer(self.poll_interval, self.poll_now)

    def on_fleet_updated(self, message: FleetUpdated) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, HomeScreen) and screen.is_mounted:
                screen.show_fleet(message.view)
        self._offer_interrupted(message.view.interrupted)

    def _offer_interrupted(self, run: RunView | None) -> None:
        """A run seen interrupted at a poll (its owner died since the console started, or its lease just expired)
        opens the resume/abort panel by itself, once per run (w opens it again). Not over a run this console drives,
        nor over a dialog: the next poll offers it then."""
        if run is None or run.run_id in self._offered or (self.model.active and not self.read_only):
            return
        from celeryops.console.screens.resume import ResumeScreen

        if isinstance(self.screen, ModalScreen | ResumeScreen):
            return
        self._offered.add(run.run_id)
        if self.read_only and self.model.view is not None:  # the run a watcher followed: nobody runs it any more
            self.model = RunModel()
            self._wanted = None
            self.action_show_home()
        self.push_screen(ResumeScreen(self.read_only, run))

    async def on_slots_updated(self, message: SlotsUpdated) -> None:
        from celeryops.console.screens.slots import SlotsScreen

        for screen in self.screen_stack:
            if isinstance(screen, HomeScreen | SlotsScreen) and screen.is_mounted:
                await screen.show_slots(message.view) if isinstance(screen, SlotsScreen) else \
                    screen.show_slots(message.view)

    # -- decisions to ops --------------------------------------------------------------------------------------

    def call_backend(self, what: str, *calls: Awaitable[None]) -> None:
        """Run backend calls in order in a worker; a UserError reaches the operator as one sentence."""
        self.run_worker(self._call(what, calls), group="backend")

    async def _call(self, what: str, calls: Iterable[Awaitable[None]]) -> None:
        try:
            await self._painted.wait()
            for call in calls:
                await call
        except UserError as err:
            self._report(err)
            _close(calls)
        except asyncio.CancelledError:
            _close(calls)
            raise
        except Exception as exc:  # never swallowed, never a crash: one sentence like the others
            self._report(UserError(f"Could not {what}: {type(exc).__name__}: {exc}"))
            _close(calls)

    def _report(self, err: UserError) -> None:
        text = mask_text(str(err))
        if self.model.phase in ("preflight", "ready") and self.model.preflight is None and self.model.kind:
            # A run that could not start shows why on its checklist, never "Checking… 0 check(s) left".
            from celeryops.core.events import CheckUpdate, PreflightDone

            self.model.apply(CheckUpdate("preflight", "Preflight could not finish", "fail", text))
            self.model.apply(PreflightDone(failed=1, warnings=0))
        self.model.say("error", text)
        if not self.screen_stack:
            return
        self.notify(text, severity="error", timeout=10)
        if isinstance(self.screen, ConsoleScreen):
            self.screen.render_model(self.model)

    def confirm(self, title: str, what_happens: str, label: str, then: Callable[[], None]) -> None:
        from celeryops.console.screens.confirm import ConfirmScreen

        def done(ok: bool | None) -> None:
            if ok:
                then()

        self.push_screen(ConfirmScreen(title, what_happens, label), done)

    def begin_run(self, kind: RunKind, release: str | None, *, rollback_of: str | None = None) -> None:
        if self.read_only:
            return
        self.model = RunModel(kind=kind, release=release, phase="preflight")
        self._wanted = None
        self._render_run()
        if kind == "deploy":
            self.call_backend("start the deploy", self.backend.start_deploy(release or "", self.sink))
        elif kind == "rollback":
            self.call_backend("start the rollback", self.backend.start_rollback(rollback_of, self.sink))
        else:
            self.call_backend("start the drain", self.backend.start_drain(self.sink))

    def confirm_rollback(self, run: RunRecordView) -> None:
        """B in the run history: undo that deploy. The preflight comes first; nothing changes until G."""
        self.confirm(*rollback_question(run), lambda: self.begin_run("rollback", None, rollback_of=run.run_id))

    def confirm_proceed(self) -> None:
        if self.model.warned_checks:
            self.confirm(*proceed_question(self.model),
                         lambda: self.call_backend("proceed", self.backend.accept_warnings(), self.backend.proceed()))
        else:
            self.confirm(*proceed_question(self.model), lambda: self.call_backend("proceed", self.backend.proceed()))

    def confirm_abort(self) -> None:
        self.confirm(*abort_question(self.model), self._abort)

    def _abort(self) -> None:
        self.model.operator_aborted = True
        self.call_backend("abort the run", self.backend.abort_run())

    def confirm_recovery(self, choice: RecoveryChoice, run: RunView | None = None) -> None:
        def act() -> None:
            if showing(self.screen, "resume", "ResumeScreen"):
                self.pop_screen()
            if choice.kind == "resume":
                self.model = RunModel(kind=run.kind if run else None, release=run.release if run else None,
                                      phase="draining")
                self._wanted = None
                self.call_backend("resume the run", self.backend.resume_run(self.sink))
            elif choice.kind == "abort":
                self.call_backend("abort the run", self.backend.abort_run())
            else:
                self.call_backend("detach from the run", self.backend.detach())

        self.confirm(f"{choice.label}?", choice.plan, choice.label, act)

    def confirm_restore_again(self, stranded: tuple[StrandedWorker, ...]) -> None:
        """X on the home view: the last run's restore again, for workers a broker reconnect left consuming nothing."""
        self.confirm(*restore_again_question(stranded),
                     lambda: self.call_backend("restore again", self.backend.abort_run(self._told)))

    def _told(self, event: Event) -> None:
        """How an action without a run screen went: its notices as notifications, then a fresh poll."""
        from celeryops.core.events import Notice

        if isinstance(event, Notice):
            self.notify(mask_text(event.message), severity="information" if event.level == "info" else "warning",
                        timeout=15)
            self.poll_now()

    # -- quitting ----------------------------------------------------------------------------------------------

    async def action_quit(self) -> None:
        """Textual's quit (its palette command, ctrl+q) asks like q does."""
        self.action_request_quit()

    def action_request_quit(self) -> None:
        from celeryops.console.screens.quit import QuitScreen

        if self._in_dialog():
            return
        if self.read_only:  # a watcher owns no run: leaving it changes nothing
            self.exit(0)
            return
        if not self.model.active:
            self.exit(self.model.exit_code())
            return
        self.push_screen(QuitScreen(self.model.phase or "running", quit_abort_label(self.model)), self._quit_choice)

    def _quit_choice(self, choice: QuitChoice | None) -> None:
        if choice == "abort":
            self._quit_when_settled = True
            self._abort()
        elif choice == "detach":
            self.run_worker(self._detach_and_exit(), group="backend")

    async def _detach_and_exit(self) -> None:
        try:
            await self.backend.detach()
        except UserError as err:
            self._report(err)
            return
        self.exit(EXIT_INTERRUPTED)


def _close(calls: Iterable[Awaitable[None]]) -> None:
    """Close the coroutines among ``calls`` that were not awaited (closing an awaited one does nothing)."""
    for call in calls:
        close = getattr(call, "close", None)
        if close is not None:
            close()


def make_app(backend: ConsoleBackend, *, read_only: bool = False, clock: Callable[[], float] = time.time,
             start: Start = "home", release: str | None = None, animate: bool = True,
             poll_interval: float = 5.0, size: tuple[int, int] | None = None) -> ConsoleApp:
    """The console for ``backend``.

    ``read_only`` (watch mode) is also taken from the backend; ``clock`` gives epoch seconds for ages;
    ``start`` opens the preflight of a deploy (needs ``release``) or a drain; ``animate`` False freezes spinners
    and cursor blink (snapshots); ``size`` is the terminal size to use with ``app.run(size=app.size_hint)``
    or ``run_test`` (None: the real terminal's)."""
    app = ConsoleApp(backend, read_only=read_only or backend.read_only, clock=clock, start=start,
                     release=release, animate=animate, poll_interval=poll_interval)
    app.size_hint = size
    return app


if TYPE_CHECKING:
    from celeryops.console.host import ConsoleHost

    def _screens_can_host_in(app: ConsoleApp) -> ConsoleHost:
        return app  # mypy proves the app is what screens expect of it
