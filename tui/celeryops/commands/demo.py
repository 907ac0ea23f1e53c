"""``celeryops demo``: the whole product on a throwaway sandbox (see :mod:`celeryops.demo.sandbox`).

``--headless`` runs a full deploy of release ``demo-2`` without the console (``--yes --accept-warnings``
semantics) and prints the same events as ``celeryops deploy`` (``--json``: one JSON object per line); CI uses it as a
smoke test: both go through the same :func:`~celeryops.commands.headless.run_headless` as the command. Without
``--headless`` the console opens on the sandbox through :func:`open_console`.

Whatever happens (success, a user error, Ctrl-C, SIGTERM/SIGHUP, a crash) the sandbox is torn down before the
command exits; a second signal during the teardown is ignored (the reaper process covers a SIGKILL).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import click

from celeryops.commands.common import FleetSpec
from celeryops.commands.headless import RECOVERED, flag_operator, open_wiring, run_headless
from celeryops.commands.output import Printer
from celeryops.commands.signals import process_signals
from celeryops.core.config import DEFAULT_STRATEGY, STRATEGY_NAMES
from celeryops.core.errors import EXIT_INTERRUPTED, EXIT_USAGE, UserError
from celeryops.core.events import Notice
from celeryops.core.masking import mask_url
from celeryops.demo.timing import Timing

if TYPE_CHECKING:
    from celeryops.demo.sandbox import Sandbox

_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _signals_interrupt() -> contextlib.AbstractContextManager[None]:
    """SIGTERM and SIGHUP interrupt like Ctrl-C (so the sandbox is torn down), outside the deploy's own handlers."""
    return process_signals(_SIGNALS, _raise_interrupt)


def _signals_ignored() -> contextlib.AbstractContextManager[None]:
    """The teardown must not be cut short by a second Ctrl-C."""
    return process_signals((signal.SIGINT, *_SIGNALS), signal.SIG_IGN)


def deploy_headless(sandbox: Sandbox, printer: Printer) -> int:
    """Deploy ``demo-2`` to the sandbox exactly as ``celeryops deploy demo-2 --yes --accept-warnings`` would
    (interrupted: the recovery rules are applied and the process exits 130 once the sandbox is torn down)."""
    from celeryops.demo.sandbox import RELEASE

    sandbox.wait_busy(tasks=2, timeout=60)
    config = sandbox.config
    wiring = open_wiring(FleetSpec(broker=sandbox.url), config)
    session = wiring.session(flag_operator(yes=True), printer, repo=sandbox.repo, accept_all=True)
    return run_headless(wiring, session, printer, lambda s: s.deploy(RELEASE, config.targets), RECOVERED).exit_code


def require_terminal() -> None:
    """The demo's console needs a terminal: checked before anything starts."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError("celeryops demo opens the console, but there is no terminal: nothing was started; run it "
                        "in a terminal, or use celeryops demo --headless for a deploy without the console.",
                        EXIT_USAGE)


def open_console(sandbox: Sandbox) -> int:
    """Run the console on the started sandbox (its :class:`~celeryops.demo.sandbox.DemoHandoff`: the backend from
    its config and repo, its notice in the header, its hint on the home view, D opening the release picker on its
    release) as every console runs (SIGHUP and SIGTERM apply the recovery rules to its run before it exits 130);
    returns its exit code."""
    from celery import Celery

    from celeryops.commands.console import run_surviving_terminal
    from celeryops.console.app import make_app
    from celeryops.ops.backend.console import open_backend

    handoff = sandbox.handoff()
    celery_app = Celery("celeryops", broker=handoff.broker_url, set_as_current=False)
    display = mask_url(handoff.broker_url) + (f" · {handoff.notice}" if handoff.notice else "")
    backend = open_backend(celery_app, handoff.config, read_only=False, fleet_display=display,
                           state_dir=str(handoff.state_dir), repo=handoff.repo)
    console = make_app(backend, start="home", release=handoff.release)
    console.hint = handoff.hint
    return run_surviving_terminal(console, backend)


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
@click.option("--strategy", type=click.Choice(STRATEGY_NAMES), default=DEFAULT_STRATEGY, show_default=True,
              help="drain: a Cloud Run service, the fence plugin on some workers, the fleet drained before the "
                   "deploy; overlap: a Cloud Run worker pool, the fence plugin on every worker, the new revision "
                   "consuming beside the old one while it drains (no pause); canary: the same pool, one instance "
                   "of the new revision judged by its task outcomes, then promoted or rolled back.")
@click.option("--autoscale", is_flag=True,
              help="A Cloud Run worker pool sized by `celeryops autoscale` (demand from Celery, idle cohorts drained "
                   "before they are taken away; a in the console shows it), deployed with --strategy: every "
                   "strategy deploys its cohorts.")
def demo(speed: float, headless: bool, as_json: bool, workers: int, keep: bool, strategy: str,
         autoscale: bool) -> None:
    """Run celeryops on a local sandbox: Redis, Celery workers, Cloud Run and registry stand-ins, a git remote."""
    if as_json and not headless:
        raise UserError("--json only applies to celeryops demo --headless: nothing was started; add --headless.",
                        EXIT_USAGE)
    from celeryops.demo.sandbox import Sandbox  # the stand-ins (google-cloud-run) load only for the demo

    timing = Timing(speed)
    if not headless:
        require_terminal()
    printer = Printer(as_json)
    sandbox = Sandbox(timing, workers=workers, cap=workers + (3 if autoscale else 1), keep=keep,
                      progress=_progress(printer), strategy=strategy, autoscale=autoscale)
    code = EXIT_INTERRUPTED
    try:
        with _signals_interrupt():
            sandbox.start()
            if sandbox.notice:
                printer(Notice(level="warning", message=sandbox.notice))
            code = deploy_headless(sandbox, printer) if headless else open_console(sandbox)
    except KeyboardInterrupt:
        if as_json and not printer.finished:
            printer.json({"event": "interrupted", "message": "Interrupted: the demo sandbox was torn down."})
        code = EXIT_INTERRUPTED
    except UserError as err:
        printer.error(err)
        raise
    finally:
        with _signals_ignored():
            sandbox.stop()
        if keep and sandbox.directory is not None:
            _progress(printer)(f"kept the sandbox directory {sandbox.directory}")
    sys.exit(code)


COMMANDS = [demo]
