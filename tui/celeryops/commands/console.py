"""Opening the console: bare ``celeryops`` (home view), ``celeryops watch`` (read-only), and ``deploy`` / ``drain`` /
``rollback`` in a terminal (the preflight screen of that run, with the command's settings)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NoReturn, cast

import click

from celeryops.commands.common import FleetSpec, fleet_options, state_dir_option
from celeryops.commands.signals import loop_signals
from celeryops.core.errors import EXIT_INTERRUPTED, EXIT_USAGE, UserError

if TYPE_CHECKING:
    from textual.app import App

    from celeryops.commands.firstlook import FirstLook, Taken
    from celeryops.core.config import Config, Target
    from celeryops.ops.backend import views
    from celeryops.ops.backend.console import OpsBackend
    from celeryops.ops.backend.snapshots import Seen
    from celeryops.ops.fleetwide.scalestatus import ScaleStatus
    from celeryops.ops.run.decisions import Decision
    from celeryops.ops.run.rollback_plan import RollbackRequest
    from celeryops.ops.run.session import DrainRequest

Start = Literal["home", "deploy", "drain", "rollback"]
CONSOLE_SIGNALS = (signal.SIGHUP, signal.SIGTERM)


def wants_console(as_json: bool, headless: bool) -> bool:
    """The console opens when standard output (and input) is a terminal and neither --json nor --headless is given."""
    return not as_json and not headless and sys.stdout.isatty() and sys.stdin.isatty()


def open_console(fleet: FleetSpec, *, start: Start = "home", read_only: bool = False, state_dir: str | None = None,
                 config: Config | None = None, release: str | None = None, drain: DrainRequest | None = None,
                 targets: tuple[Target, ...] | None = None, repo: str | None = None,
                 rollback: RollbackRequest | None = None, first_look: FirstLook | None = None) -> NoReturn:
    """Run the console until the operator quits; exits with the run's exit code.

    Given a broker URL (no Celery app to import), the console paints its first frame before Celery, kombu,
    redis-py and the ops layer are loaded (:class:`LateBackend`); with ``-A`` (or the config's app) the app's
    module is imported first, so that a module that does not import is reported before the console opens.
    ``first_look``: the home view's first look at the fleet, read by a child process started before
    (:func:`celeryops.commands.firstlook.first_look_for_home`)."""
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise UserError("The console needs a terminal and this is not one: nothing was contacted; use "
                        "`celeryops status` (or a command with --json) in scripts.", EXIT_USAGE)
    # Starting allocates mostly what lives as long as the process (modules, classes, widgets): the cyclic GC's
    # passes meanwhile find next to nothing and cost ~7 % of the start's CPU (~18 % of loading the ops layer after
    # the first frame). Back on once the first poll is done (ConsoleApp._poll), or when the console ends before.
    gc.disable()
    # Textual writes each frame to the terminal from a thread of its own: with Python's default switch interval it
    # waited up to 5 ms, often 10, for the interpreter while the event loop went on with the start (the first frame
    # reached the terminal ~11 ms after it was ready). The console's threads hand over in 1 ms.
    sys.setswitchinterval(0.001)
    def configured() -> Config:
        return config or fleet.config({"state_dir": state_dir})

    if first_look is None:  # a configuration that does not load is reported before Textual loads
        config = configured()
    from celeryops.console.app import make_app  # Textual loads only for the console
    # The first look's child loaded the configuration meanwhile (commands.firstlook; raises the UserError its load
    # ended with): this process then loads its own when the backend opens, after the first frame.
    settings = first_look.settings() if first_look is not None and config is None else None
    if settings is None:
        config = configured()
        settings = config.run.fleet, fleet.plain_broker_url()
    fleet_name, url = settings

    def opened() -> OpsBackend:
        from celeryops.ops.backend.console import open_backend

        cfg = configured()
        return open_backend(fleet.celery_app(), cfg, read_only=read_only, fleet_display=fleet.app_path or "",
                            state_dir=cfg.state_dir, drain=drain, targets=targets, repo=Path(repo) if repo else None,
                            rollback=rollback)

    backend: OpsBackend | LateBackend
    if url is None:  # a Celery app to import (or no fleet given: its error now)
        backend = opened()
    else:
        from celeryops.core.masking import mask_url

        backend = LateBackend(opened, imports=("celeryops.ops.backend.console",), read_only=read_only,
                              fleet_display=f"{fleet_name} @ {mask_url(url)}", first_look=first_look)
    console = make_app(backend, read_only=read_only, start=start, release=release)
    if isinstance(backend, LateBackend):
        backend.on_failure = lambda err: console.exit(err.exit_code)
        backend.on_opened = console.poll_now
    code = run_surviving_terminal(console, backend)
    if isinstance(backend, LateBackend) and backend.failure is not None:
        raise backend.failure
    sys.exit(code)


class LateBackend:
    """The console's backend, opened when the console first calls it: after its first frame, since the console
    makes no backend call before. ``imports`` (Celery, kombu, redis-py and the ops layer: ~0.35 s of CPU) are
    imported on the event loop where nothing else could show the fleet (the same imports in a thread cost ~20 % more
    CPU), in a thread where a first look may (a child's fleet that came while they loaded on the event loop waited
    for them: ~0.4 s late, in 3 traced starts of 8 once the console's first frame came sooner); then ``opener`` (the
    journal, the Redis clients: it may wait on a disk) runs in a thread. A failure to open (a
    :class:`UserError`: say, the broker URL names an unknown transport) is kept in :attr:`failure` and handed to
    :attr:`on_failure` (the console exits; the caller reports it); every call then raises it.

    With a ``first_look`` (:mod:`celeryops.commands.firstlook`: read by a child process while the console started),
    the first call for the fleet, the slot pool and the unfinished run each gets the child's part, as the backend's
    first poll would have returned it (or raised), but for the doctor's findings; the backend is then opened in the
    background (its imports in a thread: the fleet is on screen, the console stays responsive), goes on from what
    the child saw, and :attr:`on_opened` has the console poll it at once (the findings, seconds before the next
    poll)."""

    def __init__(self, opener: Callable[[], OpsBackend], *, imports: tuple[str, ...] = (), read_only: bool,
                 fleet_display: str, first_look: FirstLook | None = None,
                 patience: float | None = None) -> None:
        self.read_only = read_only
        self.fleet_display = fleet_display
        self.failure: UserError | None = None
        self.on_failure: Callable[[UserError], object] = lambda err: None
        self.on_opened: Callable[[], object] = lambda: None  # after a first look: the console polls again at once
        self._opener = opener
        self._imports = imports
        self._look = first_look
        self._patience = FIRST_LOOK_PATIENCE if patience is None else patience
        self._backend: OpsBackend | None = None
        self._opening: asyncio.Future[OpsBackend] | None = None
        self._closing = False

    async def _opened(self) -> OpsBackend:
        if self._backend is None:
            if self._opening is None:
                self._opening = asyncio.ensure_future(self._open())
            try:
                self._backend = await asyncio.shield(self._opening)
            except UserError as err:
                if self.failure is None:
                    self.failure = err
                    self.on_failure(err)
                raise
        return self._backend

    async def _open(self) -> OpsBackend:
        look = self._look
        try:
            for name in self._imports:
                if look is not None:  # a child's part may come (or is on screen): the event loop stays free for it
                    await asyncio.to_thread(importlib.import_module, name)
                else:  # the fleet waits for them: on the event loop, where they cost least
                    importlib.import_module(name)
            backend = await asyncio.to_thread(self._opener)
        finally:
            if look is not None:  # its parts not taken by now would be older than what the backend reads
                self._look = None
                look.close()
        seen = look.seen if look is not None else None  # unpickled here, once (the backend's modules are loaded)
        if seen is not None:
            backend.snapshots.go_on_from(cast("Seen", seen))
        if look is not None and look.taken_any and not self._closing:  # the doctor's findings were not in it
            asyncio.get_running_loop().call_soon(self.on_opened)
        return backend

    async def _first(self, part: str) -> Taken | None:
        """The first look's ``part``, the first time it is asked for (None: read it from the backend). On a busy
        machine, where the child's part is not in within ``patience`` seconds, the backend opens meanwhile
        and whichever reads it first is shown. Once every part was asked for, the backend opens in the background,
        after the console has drawn them."""
        look = self._look
        if look is None:
            return None
        importlib.import_module("celeryops.ops.backend.views")  # the parts' types, while the child still reads
        taking = asyncio.ensure_future(look.take(part))
        if not (await asyncio.wait({taking}, timeout=self._patience))[0]:
            self._warm()
        found = await taking
        if look.asked(PARTS) and self._opening is None:
            asyncio.get_running_loop().call_later(WARM_AFTER, self._warm)
        return found

    def _warm(self) -> None:
        if self._opening is None and not self._closing:
            self._opening = asyncio.ensure_future(self._open())
            self._opening.add_done_callback(lambda f: f.cancelled() or f.exception())  # raised at the next call

    async def fleet_snapshot(self) -> views.FleetView:
        if (first := await self._first("fleet")) is not None:
            return cast("views.FleetView", first.get())
        return await (await self._opened()).fleet_snapshot()

    async def slots_snapshot(self) -> views.SlotsView | None:
        if (first := await self._first("slots")) is not None:
            return cast("views.SlotsView | None", first.get())
        return await (await self._opened()).slots_snapshot()

    async def autoscaler(self) -> ScaleStatus | None:
        return await (await self._opened()).autoscaler()

    async def unfinished_run(self) -> views.RunView | None:
        if (first := await self._first("unfinished")) is not None:
            return cast("views.RunView | None", first.get())
        return await (await self._opened()).unfinished_run()

    async def releases(self) -> views.ReleasesView:
        return await (await self._opened()).releases()

    async def run_history(self, limit: int = 50) -> tuple[views.RunRecordView, ...]:
        return await (await self._opened()).run_history(limit)

    async def run_timeline(self, run_id: str) -> tuple[views.TimelineEntry, ...]:
        return await (await self._opened()).run_timeline(run_id)

    async def start_deploy(self, release: str, on_event: views.EventSink) -> None:
        await (await self._opened()).start_deploy(release, on_event)

    async def start_drain(self, on_event: views.EventSink) -> None:
        await (await self._opened()).start_drain(on_event)

    async def start_rollback(self, run_id: str | None, on_event: views.EventSink) -> None:
        await (await self._opened()).start_rollback(run_id, on_event)

    async def accept_warnings(self) -> None:
        await (await self._opened()).accept_warnings()

    async def proceed(self) -> None:
        await (await self._opened()).proceed()

    async def canary_decision(self, decision: Decision) -> None:
        await (await self._opened()).canary_decision(decision)

    async def abort_run(self, on_event: views.EventSink | None = None) -> None:
        await (await self._opened()).abort_run(on_event)

    async def detach(self) -> None:
        await (await self._opened()).detach()

    async def resume_run(self, on_event: views.EventSink) -> None:
        await (await self._opened()).resume_run(on_event)

    async def forget_worker(self, name: str) -> None:
        await (await self._opened()).forget_worker(name)

    async def follow_run(self, on_event: views.EventSink) -> None:
        await (await self._opened()).follow_run(on_event)

    async def close(self) -> None:
        """As the backend's; an opening still under way is waited for first (its thread cannot be stopped)."""
        self._closing = True
        if self._look is not None:
            self._look.close()
        if self._opening is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._opening)
            if self._opening.done() and not self._opening.cancelled() and self._opening.exception() is None:
                self._backend = self._opening.result()
        if self._backend is not None:
            await self._backend.close()

    def close_sync(self) -> None:
        if self._look is not None:
            self._look.close()
        if self._backend is not None:
            self._backend.close_sync()


WARM_AFTER = 0.25  # seconds from the first look's last part to opening the backend: the console draws them first
FIRST_LOOK_PATIENCE = 0.3  # seconds a first call waits for the first look's part before the backend opens too
PARTS = ("fleet", "slots", "unfinished")  # the first look's parts (celeryops.ops.backend.firstlook.PARTS)



def run_surviving_terminal(console: App[int], backend: OpsBackend | LateBackend) -> int:
    """Run the console so that its run outlives the console itself: SIGHUP (the terminal closed, an SSH drop) and
    SIGTERM cancel the live run at once, which applies the recovery rules (a drain short of drained restores its
    consumers; a deploy follows the recovery rules), while the console closes (its terminal may be gone: nothing
    more is drawn); the process exits 130 once both are done. The recovery never waits on the console's shutdown:
    should that hang once the recovery is done, the process still exits after :data:`SHUTDOWN_GRACE` seconds. A
    crash of the console (an exception out of it) and a plain exit also cancel whatever still runs, and wait for
    it. The backend is closed after; returns the exit code."""
    interrupted: list[signal.Signals] = []

    async def main() -> int | None:
        def on_signal(sig: signal.Signals) -> None:
            if interrupted:
                return
            interrupted.append(sig)
            recovery = asyncio.ensure_future(backend.close())  # cancels the live run: its recovery runs now
            recovery.add_done_callback(lambda _: _exit_after_grace())
            console.exit(EXIT_INTERRUPTED)

        with loop_signals(CONSOLE_SIGNALS, on_signal):
            try:
                return await console.run_async()
            finally:
                if interrupted:
                    _say(f"{interrupted[0].name}: applying the recovery rules before exiting...")
                await backend.close()  # waits for the recovery begun at the signal, or cancels what still runs

    try:
        code = asyncio.run(main())
    finally:
        gc.enable()
        backend.close_sync()
    if interrupted:
        _say(f"{interrupted[0].name}: the recovery rules were applied.")
        return EXIT_INTERRUPTED
    return code if isinstance(code, int) else 0


SHUTDOWN_GRACE = 15.0


def _exit_after_grace() -> None:
    """The recovery is done: if the console's own shutdown has not ended the process in SHUTDOWN_GRACE seconds,
    end it (a daemon thread, so a stuck event loop cannot hold it back)."""

    def watchdog() -> None:
        time.sleep(SHUTDOWN_GRACE)
        _say("The recovery rules were applied but the console did not close; exiting.")
        os._exit(EXIT_INTERRUPTED)

    threading.Thread(target=watchdog, name="celeryops-exit-watchdog", daemon=True).start()


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # the terminal may be gone
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


@click.command()
@fleet_options
@state_dir_option(read_only=True)
def watch(fleet: FleetSpec, state_dir: str | None) -> None:
    """Follow the fleet and its live run, read-only: nothing is stopped, started or written."""
    open_console(fleet, start="home", read_only=True, state_dir=state_dir)


COMMANDS = [watch]
