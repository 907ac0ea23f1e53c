"""Opening the console: bare ``celeryops`` (home view), ``celeryops watch`` (read-only), and ``deploy`` / ``drain``
in a terminal (the preflight screen of that run, with the command's settings)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NoReturn

import click

from celeryops.commands.common import FleetSpec, fleet_options
from celeryops.core.config import Config, Target
from celeryops.core.errors import EXIT_USAGE, UserError

if TYPE_CHECKING:
    from celeryops.ops.session import DrainRequest

Start = Literal["home", "deploy", "drain"]


def wants_console(as_json: bool, headless: bool) -> bool:
    """The console opens when standard output (and input) is a terminal and neither --json nor --headless is given."""
    return not as_json and not headless and sys.stdout.isatty() and sys.stdin.isatty()


def open_console(fleet: FleetSpec, *, start: Start = "home", read_only: bool = False, state_dir: str | None = None,
                 config: Config | None = None, release: str | None = None, drain: DrainRequest | None = None,
                 targets: tuple[Target, ...] | None = None, repo: str | None = None) -> NoReturn:
    """Run the console until the operator quits; exits with the run's exit code."""
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise UserError("The console needs a terminal and this is not one: nothing was contacted; use "
                        "`celeryops status` (or a command with --json) in scripts.", EXIT_USAGE)
    from celeryops.console.app import make_app
    from celeryops.ops.console_backend import open_backend  # Textual and the ops layer load only when needed

    cfg = config or fleet.config({"state_dir": state_dir})
    app = fleet.celery_app()
    backend = open_backend(app, cfg, read_only=read_only, fleet_display=fleet.app_path or "",
                           state_dir=cfg.state_dir, drain=drain,
                           targets=targets, repo=Path(repo) if repo else None)
    console = make_app(backend, read_only=read_only, start=start, release=release)
    try:
        code = console.run()
    finally:
        backend.close_sync()
    sys.exit(code if isinstance(code, int) else 0)


@click.command()
@fleet_options
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="Where the run journal lives (read only here; default: the user state dir).")
def watch(fleet: FleetSpec, state_dir: str | None) -> None:
    """Follow the fleet and its live run, read-only: nothing is stopped, started or written."""
    open_console(fleet, start="home", read_only=True, state_dir=state_dir)


COMMANDS = [watch]
