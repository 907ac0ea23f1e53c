"""The ``celeryops`` command line (click). Subcommands live in ``celeryops.commands.*`` (``COMMANDS`` lists)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from typing import Any

# A worker image installs plain `celeryops` (celery + redis, for celeryops.fence / celeryops.slots); the commands
# need the console extra. Checked before anything of it is imported, so the message is all the operator sees.
_CONSOLE_EXTRA = ("textual", "humanize", "platformdirs", "grpc")


def _require_console_extra() -> None:
    missing = [name for name in _CONSOLE_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        sys.stderr.write(f"celeryops: the command line needs the console extra ({', '.join(missing)} not installed): "
                         "nothing was run; install it with: pip install 'celeryops[console]'\n")
        sys.exit(2)


_require_console_extra()

import click

from celeryops import __version__, commands
from celeryops.commands.common import FleetSpec, fleet_options
from celeryops.core.errors import UserError
from celeryops.core.masking import mask_text


class _Main(click.Group):
    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """Click's own errors (bad flag or value, unknown command, missing argument) as one sentence, exit 2."""
        try:
            rv = super().main(args, prog_name or "celeryops", complete_var, standalone_mode=False, **extra)
        except click.UsageError as err:
            path = err.ctx.command_path if err.ctx is not None else "celeryops"
            click.echo(f"celeryops: {mask_text(err.format_message().rstrip('.'))}: nothing was run; "
                       f"see `{path} --help`.", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            click.echo(f"celeryops: {mask_text(err.format_message())}", err=True)
            sys.exit(err.exit_code)
        except click.exceptions.Abort:
            click.echo("celeryops: aborted: nothing was changed.", err=True)
            sys.exit(1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as err:
            click.echo(f"celeryops: {mask_text(str(err))}", err=True)
            sys.exit(err.exit_code)


@click.group(cls=_Main, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="celeryops")
@fleet_options
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="Where the run journal lives (default: the user state dir).")
@click.pass_context
def main(ctx: click.Context, fleet: FleetSpec, state_dir: str | None) -> None:
    """Drain, deploy and recover Celery fleets safely. Without a command: the console's home view."""
    if ctx.invoked_subcommand is None:
        from celeryops.commands.console import open_console

        open_console(fleet, start="home", state_dir=state_dir)


def _register() -> None:
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        for command in getattr(module, "COMMANDS", []):
            main.add_command(command)


_register()
