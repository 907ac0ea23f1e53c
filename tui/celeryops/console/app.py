"""The console application and its one factory, :func:`make_app`, used by the CLI, the preview and the tests.

The app owns the run model (folded from ops events that arrive through :meth:`ConsoleApp.sink` from any thread),
polls the fleet without overlapping polls, shows the screen that fits the run's phase, and sends the operator's
decisions to the backend, each dangerous one after a confirmation that says what will happen.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import PurePath
from typing import TYPE_CHECKING, ClassVar, Literal

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import ModalScreen, Screen
from textual.timer import Timer

from celeryops.console.messages import DrainUpdated, FleetUpdated, OpsEvent, SlotsUpdated, to_message
from celeryops.console.model import RunModel, View
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


RUN_VIEWS: tuple[View, ...] = ("preflight", "drain", "deploy", "overlap", "canary")


def run_screen(view: View) -> type[ConsoleScreen]:
    """The screen that shows a run in this phase."""
    if view == "preflight":
        from celeryops.console.screens.preflight import PreflightScreen

        return PreflightScreen
    if view == "drain":
        from celeryops.console.screens.drain import DrainScreen

        return DrainScreen
    if view == "overlap":
        from celeryops.console.screens.overlap import OverlapScreen

        return OverlapScreen
    if view == "canary":
        from celeryops.console.screens.canary import CanaryScreen

        return CanaryScreen
    from celeryops.console.screens.deploy import DeployScreen

    return DeployScreen


def _showing(screen: Screen, module: str, name: str) -> bool:
    """Whether ``screen`` is a ``celeryops.console.screens.<module>.<name>``: a screen module not imported yet has
    no screen on show."""
    loaded = sys.modules.get(f"celeryops.console.screens.{module}")
    return loaded is not None and isinstance(screen, getattr(loaded, name))


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
        gc.enable()  # off while the console starts (commands.console.open_console)

    def sync_view(self) -> None:
        """Show the screen that fits the run's phase, once per phase change (the operator may navigate away)."""
        want = self.model.view
        if (want is None or want == self._wanted or isinstance(self.screen, ModalScreen)
                or _showing(self.screen, "resume", "ResumeScreen")):
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
        """The command palette lists what the console's keys do here (only what is allowed; not Textual's cursor
        and focus keys), then Textual's own commands but its Quit (ours asks first during a run)."""
        commands: dict[str, tuple[bool, SystemCommand]] = {}
        for active in screen.active_bindings.values():
            binding, node = active.binding, active.node
            if binding.id is None or not binding.description or not active.enabled:
                continue  # every binding of the console has an id; Textual's own have none
            if binding.action in commands and (commands[binding.action][0] or not binding.show):
                continue  # one entry per action, under the key the footer shows
            commands[binding.action] = (binding.show, SystemCommand(
                f"{binding.description} ({self.get_key_display(binding)})", binding.tooltip or binding.description,
                lambda node=node, action=binding.action: self.run_action(action, node)))
        yield from (command for _, command in commands.values())
        yield from (command for command in super().get_system_commands(screen) if command.title != "Quit")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # In a dialog, its own keys answer the question: q is not offered there.
        return not (action == "request_quit" and self._in_dialog())

    def _in_dialog(self) -> bool:
        """The quit question or a confirmation is on show."""
        return _showing(self.screen, "quit", "QuitScreen") or _showing(self.screen, "confirm", "ConfirmScreen")

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
        if self._polling:
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

    def _report(self, err: UserError) -> None:
        text = mask_text(str(err))
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

    def _stop_plan(self) -> str:
        if self.model.kind == "rollback":
            return ("Consumers are cancelled on every worker (running and prefetched tasks finish), the fleet is "
                    "drained, then each target is routed back to its earlier revision (no new image, no new "
                    "revision). A timeout restores consumers and changes nothing.")
        deploy = f" then deploy {self.model.release}" if self.model.kind == "deploy" else ""
        return ("Consumers are cancelled on every worker (running and prefetched tasks finish), the fleet is "
                f"drained{deploy}. A timeout restores consumers and deploys nothing.")

    def confirm_rollback(self, run: RunRecordView) -> None:
        """B in the run history: undo that deploy. The preflight comes first; nothing changes until G."""
        release = f" (release {run.release})" if run.release else ""
        self.confirm(f"Roll back run {run.run_id}?",
                     f"Each target of run {run.run_id}{release} goes back to the revision that deploy replaced: "
                     "no new image, no new revision. The preflight checklist runs first and names the revisions; "
                     "nothing changes until you press G there, then, as for a deploy, the fleet is drained (or, "
                     "on a worker pool whose strategy is overlap, the previous revision comes up beside the current "
                     "one first) and the targets are routed back.", "Start the rollback's preflight",
                     lambda: self.begin_run("rollback", None, rollback_of=run.run_id))

    def _overlap_plan(self) -> str:
        """What G starts on an overlap deploy: the peak (the ``traffic`` check's finding names it), then the steps."""
        traffic = self.model.checks.get("traffic")
        peak = f"Instances: {traffic.detail}.\n" if traffic is not None and traffic.status == "ok" else ""
        release = f" {self.model.release}" if self.model.release else ""
        if self.model.kind == "rollback":  # the "new" revision is the previous one, routed back to
            return (f"{peak}The previous revision{release} comes up beside the current one (no instance is taken "
                    "away) and starts consuming. Only then do the current revision's workers stop taking new "
                    "tasks: their running and prefetched tasks finish while the previous revision consumes, so "
                    "processing never pauses. Once they are idle, every instance moves back to the previous "
                    "revision at the original count. Nothing is killed: if the current revision is not idle "
                    "within max wait, it consumes again and the previous one is retired.")
        return (f"{peak}The new revision of{release} comes up beside the old one (no old instance is taken away) "
                "and starts consuming. Only then do the old revision's workers stop taking new tasks: their running "
                "and prefetched tasks finish while the new revision consumes, so processing never pauses. Once the "
                "old revision is idle (the drain's empty streak), every instance moves to the new revision, back "
                "to the original count. Nothing is killed: if the old revision is not idle within max wait, or the "
                "new one does not consume, the old revision consumes again and the new one is retired.")

    def confirm_proceed(self) -> None:
        warned = self.model.warned_checks
        overlap = self.model.is_overlap and self.model.kind != "drain"
        plan = self._overlap_plan() if overlap else self._stop_plan()
        if warned:
            listing = "\n".join(f"▲ {c.title}: {c.detail}" for c in warned)
            self.confirm(f"Proceed despite {len(warned)} warning(s)?", f"{listing}\n\n{plan}",
                         "Accept warnings and start the overlap" if overlap else "Accept warnings and stop consumers",
                         lambda: self.call_backend("proceed", self.backend.accept_warnings(), self.backend.proceed()))
        elif overlap:
            self.confirm(f"Start the overlap {self._overlap_word()}?", plan, "Start the overlap",
                         lambda: self.call_backend("proceed", self.backend.proceed()))
        else:
            self.confirm("Stop consumers and drain?", plan, "Stop consumers",
                         lambda: self.call_backend("proceed", self.backend.proceed()))

    def _overlap_word(self) -> str:
        return "rollback" if self.model.kind == "rollback" else "deploy"

    def confirm_abort(self) -> None:
        overlap = self.model.overlap
        if overlap is not None and self.model.phase in ("cutting_over", "deployed"):
            self.confirm(f"Abort the overlap {self._overlap_word()}?",
                         f"The cutover has begun: the old revision {overlap.old} is idle and its instances are "
                         f"being taken away, so the abort finishes it and {overlap.new} serves every instance. "
                         "Nothing is killed.", "Abort (finish the cutover)", self._abort)
            return
        if overlap is not None:
            self.confirm(f"Abort the overlap {self._overlap_word()}?",
                         f"The workers of the old revision {overlap.old} consume again first; then the workers of "
                         f"{overlap.new} stop taking tasks and finish what they run, and every instance goes back "
                         f"to {overlap.old} at the original count. Nothing is killed; if {overlap.new} stays busy "
                         "past max wait, both revisions keep consuming and the run stays open.",
                         "Abort and retire the new revision", self._abort)
            return
        self.confirm("Abort the run?", "Consumers are added back exactly as they were before the drain and the "
                     "run is marked aborted; nothing is deployed. Tasks already running keep running.",
                     "Abort and restore", self._abort)

    def _abort(self) -> None:
        self.model.operator_aborted = True
        self.call_backend("abort the run", self.backend.abort_run())

    def confirm_recovery(self, choice: RecoveryChoice, run: RunView | None = None) -> None:
        def act() -> None:
            if _showing(self.screen, "resume", "ResumeScreen"):
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
        names = ", ".join(f"{s.name} ({', '.join(s.queues)})" for s in stranded)
        runs = ", ".join(sorted({s.run_id for s in stranded}))
        self.confirm("Restore again?", f"{names} consume nothing since the restore of run {runs}: a broker reconnect "
                     "made Celery forget the restored queues. The restore is sent again to them and checked (what "
                     "`celeryops abort` does). A worker that drops back at the next reconnect needs a restart; "
                     "celeryops.fence in the worker app puts the queues back by itself.", "Restore again",
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
        overlap = self.model.overlap
        label = "Abort and restore consumers"
        if overlap is not None:
            label = ("Abort: finish the cutover" if self.model.phase in ("cutting_over", "deployed") else
                     "Abort: the old revision consumes again, the new one is retired")
        self.push_screen(QuitScreen(self.model.phase or "running", label), self._quit_choice)

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
