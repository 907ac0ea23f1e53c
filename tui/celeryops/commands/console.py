"""Opening the console: bare ``celeryops`` (home view), ``celeryops watch`` (read-only), and ``deploy`` / ``drain`` /
``rollback`` in a terminal (the preflight screen of that run, with the command's settings)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NoReturn

import click

from celeryops.commands.common import FleetSpec, fleet_options, state_dir_option
from celeryops.core.config import Config, Target
from celeryops.core.errors import EXIT_INTERRUPTED, EXIT_USAGE, UserError

if TYPE_CHECKING:
    from textual.app import App

    from celeryops.ops.backend.console import OpsBackend
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
                 rollback: RollbackRequest | None = None) -> NoReturn:
    """Run the console until the operator quits; exits with the run's exit code."""
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise UserError("The console needs a terminal and this is not one: nothing was contacted; use "
                        "`celeryops status` (or a command with --json) in scripts.", EXIT_USAGE)
    from celeryops.console.app import make_app
    from celeryops.ops.backend.console import open_backend  # Textual and the ops layer load only when needed

    cfg = config or fleet.config({"state_dir": state_dir})
    app = fleet.celery_app()
    backend = open_backend(app, cfg, read_only=read_only, fleet_display=fleet.app_path or "",
                           state_dir=cfg.state_dir, drain=drain,
                           targets=targets, repo=Path(repo) if repo else None, rollback=rollback)
    console = make_app(backend, read_only=read_only, start=start, release=release)
    sys.exit(run_surviving_terminal(console, backend))


def run_surviving_terminal(console: App[int], backend: OpsBackend) -> int:
    """Run the console so that its run outlives the console itself: SIGHUP (the terminal closed, an SSH drop) and
    SIGTERM cancel the live run at once, which applies the recovery rules (a drain short of drained restores its
    consumers; a deploy follows the recovery rules), while the console closes (its terminal may be gone: nothing
    more is drawn); the process exits 130 once both are done. The recovery never waits on the console's shutdown:
    should that hang once the recovery is done, the process still exits after :data:`SHUTDOWN_GRACE` seconds. A
    crash of the console (an exception out of it) and a plain exit also cancel whatever still runs, and wait for
    it. The backend is closed after; returns the exit code."""
    interrupted: list[signal.Signals] = []

    async def main() -> int | None:
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            if interrupted:
                return
            interrupted.append(sig)
            recovery = asyncio.ensure_future(backend.close())  # cancels the live run: its recovery runs now
            recovery.add_done_callback(lambda _: _exit_after_grace())
            console.exit(EXIT_INTERRUPTED)

        previous = {sig: signal.getsignal(sig) for sig in CONSOLE_SIGNALS}
        for sig in CONSOLE_SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await console.run_async()
        finally:
            if interrupted:
                _say(f"{interrupted[0].name}: applying the recovery rules before exiting...")
            await backend.close()  # waits for the recovery begun at the signal, or cancels what still runs
            for sig, handler in previous.items():  # the caller's own (the demo's: tear the sandbox down)
                loop.remove_signal_handler(sig)
                if handler is not None:
                    signal.signal(sig, handler)

    try:
        code = asyncio.run(main())
    finally:
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
