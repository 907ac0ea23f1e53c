"""``celeryops demo``: the whole product on a throwaway sandbox (see :mod:`celeryops.demo.sandbox`).

``--headless`` runs a full deploy of release ``demo-2`` without the console (``--yes --accept-warnings``
semantics) and prints the same events as ``celeryops deploy`` (``--json``: one JSON object per line); CI uses it as a
smoke test. Without ``--headless`` the console opens on the sandbox through :func:`open_console`.

Whatever happens (success, a user error, Ctrl-C, SIGTERM/SIGHUP, a crash) the sandbox is torn down before the
command exits; a second signal during the teardown is ignored (the reaper process covers a SIGKILL).
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING

import click

from celeryops.commands.common import FleetSpec
from celeryops.commands.headless import flag_operator, open_wiring, run_interruptibly
from celeryops.commands.output import Printer
from celeryops.core.errors import EXIT_INTERRUPTED, EXIT_USAGE, UserError
from celeryops.core.events import Notice
from celeryops.demo.timing import Timing

if TYPE_CHECKING:
    from textual.app import App

    from celeryops.demo.sandbox import DemoHandoff, Sandbox
    from celeryops.ops.backend.console import OpsBackend

CONSOLE_HOOK = ("celeryops.console.app", "demo_console")
_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP interrupt like Ctrl-C (so the sandbox is torn down), outside the deploy's own handlers."""
    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    for sig in _SIGNALS:
        signal.signal(sig, _raise_interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """The teardown must not be cut short by a second Ctrl-C."""
    sigs = (signal.SIGINT, *_SIGNALS)
    previous = {sig: signal.getsignal(sig) for sig in sigs}
    for sig in sigs:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_headless(sandbox: Sandbox, printer: Printer) -> int:
    """Deploy ``demo-2`` to the sandbox exactly as ``celeryops deploy demo-2 --yes --accept-warnings`` would."""
    from celeryops.demo.sandbox import RELEASE

    sandbox.wait_busy(tasks=2, timeout=60)
    config = sandbox.config
    wiring = open_wiring(FleetSpec(broker=sandbox.url), config)
    session = wiring.session(flag_operator(yes=True), printer, repo=sandbox.repo, accept_all=True)
    try:
        with _signals_interrupt():  # run_interruptibly installs its own handlers while the flow runs
            result, interrupted = run_interruptibly(lambda: session.deploy(RELEASE, config.targets))
    finally:
        wiring.close()
    if interrupted or result is None:
        if printer.as_json and not printer.finished:
            printer.json({"event": "interrupted", "message": "Interrupted: the recovery rules were applied."})
        return EXIT_INTERRUPTED
    return result.exit_code


ConsoleHook = Callable[["DemoHandoff"], "tuple[App[int], OpsBackend]"]


def console_hook() -> ConsoleHook:
    """The console's entry for the demo: ``celeryops.console.app.demo_console(handoff) -> (app, backend)``, the
    console built on the sandbox (the backend from ``handoff.config`` / ``handoff.repo``, ``handoff.notice`` in the
    header, ``handoff.hint`` on the home view). Checked before anything starts."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError("celeryops demo opens the console, but there is no terminal: nothing was started; run it "
                        "in a terminal, or use celeryops demo --headless for a deploy without the console.",
                        EXIT_USAGE)
    module_name, attr = CONSOLE_HOOK
    hook: ConsoleHook | None = getattr(importlib.import_module(module_name), attr, None)
    if hook is None:
        raise UserError(f"This build's console cannot open the demo yet ({module_name}.{attr} is missing): nothing "
                        "was started; run celeryops demo --headless to watch a full deploy.", EXIT_USAGE)
    return hook


def open_console(sandbox: Sandbox, hook: ConsoleHook) -> int:
    """Run the console on the started sandbox as every console runs (SIGHUP and SIGTERM apply the recovery rules
    to its run before it exits 130); returns its exit code."""
    from celeryops.commands.console import run_surviving_terminal

    return run_surviving_terminal(*hook(sandbox.handoff()))


def _progress(printer: Printer) -> Callable[[str], None]:
    def show(line: str) -> None:
        # The final JSON event stays the last line of stdout: what the sandbox reports after it (the autoscaler's
        # thread, the teardown, --keep) goes to stderr.
        with printer.lock:
            if printer.as_json and not printer.finished:
                printer(Notice(level="info", message=f"demo: {line}"))
                return
        click.echo(f"demo: {line}", err=True)

    return show


@click.command()
@click.option("--speed", type=float, default=1.0, show_default=True,
              help="Scale task durations and drain settings (1: a full deploy takes about a minute; 10: seconds).")
@click.option("--headless", is_flag=True, help="Run a full deploy of demo-2 without the console, then exit.")
@click.option("--json", "as_json", is_flag=True, help="With --headless: one JSON object per line.")
@click.option("--workers", type=click.IntRange(1, 4), default=2, show_default=True,
              help="Workers of each revision (the autoscaler adds one more at most).")
@click.option("--keep", is_flag=True, help="Keep the sandbox directory (worker logs, journal) after exit.")
def demo(speed: float, headless: bool, as_json: bool, workers: int, keep: bool) -> None:
    """Run celeryops on a local sandbox: Redis, Celery workers, Cloud Run and registry stand-ins, a git remote."""
    if as_json and not headless:
        raise UserError("--json only applies to celeryops demo --headless: nothing was started; add --headless.",
                        EXIT_USAGE)
    from celeryops.demo.sandbox import Sandbox  # the stand-ins (google-cloud-run) load only for the demo

    timing = Timing(speed)
    hook = None if headless else console_hook()
    printer = Printer(as_json)
    sandbox = Sandbox(timing, workers=workers, cap=workers + 1, keep=keep, progress=_progress(printer))
    code = EXIT_INTERRUPTED
    try:
        with _signals_interrupt():
            sandbox.start()
            if sandbox.notice:
                printer(Notice(level="warning", message=sandbox.notice))
            code = run_headless(sandbox, printer) if hook is None else open_console(sandbox, hook)
    except KeyboardInterrupt:
        if as_json and not printer.finished:
            printer.json({"event": "interrupted", "message": "Interrupted: the demo sandbox was torn down."})
        code = EXIT_INTERRUPTED
    except UserError as err:
        if as_json and not printer.finished:
            printer.json({"event": "error", "message": str(err), "exit_code": err.exit_code})
        raise
    finally:
        with _signals_ignored():
            sandbox.stop()
        if keep and sandbox.directory is not None:
            _progress(printer)(f"kept the sandbox directory {sandbox.directory}")
    sys.exit(code)


COMMANDS = [demo]
