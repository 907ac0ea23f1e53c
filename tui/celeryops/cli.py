"""The ``celeryops`` command line (click). Subcommands live in ``celeryops.commands.*`` (``COMMANDS`` lists).

Start-up imports only what the command line needs (click and this module): a subcommand's module (and with it
Celery, Redis, the ops layer, Textual...) is imported when that subcommand runs. ``--help`` lists the subcommands
from ``COMMAND_TABLE`` (module and the first paragraph of the help, from which click makes the short help), which
``tests/test_cli_startup.py`` checks against the modules themselves.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
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

from celeryops import __version__
from celeryops.commands.common import FleetSpec, fleet_options, state_dir_option
from celeryops.core.errors import UserError
from celeryops.core.masking import mask_text

# name -> (module in celeryops.commands, first paragraph of the command's help). Kept equal to the modules by
# tests/test_cli_startup.py (which prints the table to paste when it is not).
COMMAND_TABLE: dict[str, tuple[str, str]] = {
    "acl": ("acl", "Print the Redis ACL rules of ROLE (watcher, operator, worker) on one line, to put after `ACL "
                   "SETUSER <name> on ><password>` (Redis 7.0 or later), as in `redis-cli ACL SETUSER NAME on "
                   "'>PASSWORD' $(celeryops acl ROLE)` (bash, zsh) or in redis-cli; --json gives the exact rules as "
                   "`args`. Reads nothing from Redis."),
    "abort": ("drain", "Restore the consumers stopped by the current run (recovery rules), and end it."),
    "autoscale": ("autoscale", "Size a Cloud Run worker pool by what Celery holds (ready + reserved + active per "
                               "queue) and scale it in without killing a task, until SIGINT or SIGTERM (exit 0, every "
                               "worker consuming). TARGET may be left out when the configuration has one worker pool; "
                               "`--dry-run` changes nothing."),
    "demo": ("demo", "Run celeryops on a local sandbox: Redis, Celery workers, Cloud Run and registry stand-ins, a "
                     "git remote."),
    "deploy": ("deploy", "Deploy RELEASE (a branch pushed to the release remote): preflight, drain, deploy, verify. "
                         "In a terminal (without --json or --headless) it opens the console on the deploy's "
                         "preflight."),
    "doctor": ("doctor", "Name the worker settings that lose or duplicate work on the platform the fleet runs on, "
                         "read from the live workers (exit 0: nothing found, 1: findings). Reads only."),
    "drain": ("drain", "Stop consumers and wait until no task runs (exit 0: drained, consumers stay stopped). In a "
                       "terminal (without --json or --headless) it opens the console on the drain's preflight."),
    "resume": ("drain", "Continue the fleet's interrupted run from its phase (same settings): drain again, then "
                        "deploy if it is a deploy run; a deploy already started finishes by the rollout's outcome."),
    "rollback": ("rollback", "Route each target back to the revision its last deploy replaced (or --to REVISION): "
                             "preflight, drain (or overlap), route back, verify; no new image. In a terminal "
                             "(without --json or --headless) it opens the console on its preflight."),
    "runs": ("runs", "List the runs recorded in the local journal, newest first. Reads only."),
    "slots": ("slots", "Show CPU/GPU slot pools per host: totals, used, free, each GPU device (free or held by which "
                       "task), the hosts adding to the global pool of shared types, holders and their leases, "
                       "waiting requests."),
    "status": ("runs", "Show the fleet's current run (phase, age, owner) and what recovery would do. Reads only."),
    "watch": ("console", "Follow the fleet and its live run, read-only: nothing is stopped, started or written."),
}


class _Main(click.Group):
    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """Click's own errors (bad flag or value, unknown command, missing argument) as one sentence, exit 2."""
        try:
            rv = super().main(args, prog_name or "celeryops", complete_var, standalone_mode=False, **extra)
        except click.UsageError as err:
            path = err.ctx.command_path if err.ctx is not None else "celeryops"
            said = " ".join(err.format_message().split()).rstrip(".")  # click lists choices on lines of their own
            click.echo(f"celeryops: {mask_text(said)}: nothing was run; "
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

    # -- lazy subcommands ---------------------------------------------------------------------------------------

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMAND_TABLE) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The subcommand, its module imported now (the first time it is asked for)."""
        if cmd_name not in self.commands and cmd_name in COMMAND_TABLE:
            module = importlib.import_module(f"celeryops.commands.{COMMAND_TABLE[cmd_name][0]}")
            for command in getattr(module, "COMMANDS", []):
                self.commands.setdefault(str(command.name), command)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, with each short help made from the table (no subcommand module is imported)."""
        names = [n for n in self.list_commands(ctx) if n in COMMAND_TABLE or not self.commands[n].hidden]
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            command = self.commands.get(name) or click.Command(name, help=COMMAND_TABLE[name][1])
            rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_Main, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="celeryops")
@fleet_options
@state_dir_option()
@click.pass_context
def main(ctx: click.Context, fleet: FleetSpec, state_dir: str | None) -> None:
    """Drain, deploy and recover Celery fleets safely. Without a command: the console's home view."""
    if ctx.invoked_subcommand is not None:
        gc.enable()  # off while the command line loaded (celeryops.launch); the console keeps it off for its start
        # `celeryops --broker URL status`: the flags given before the command are its defaults (its own win), so a
        # flag is never dropped in favour of $CELERY_BROKER_URL or the config.
        given = {"app_path": fleet.app_path, "broker": fleet.broker, "config_path": fleet.config_path,
                 "state_dir": state_dir}
        ctx.default_map = {ctx.invoked_subcommand: {k: v for k, v in given.items() if v is not None}}
        return
    from celeryops.commands.firstlook import first_look_for_home

    look = first_look_for_home(fleet, state_dir)  # read on another core from now on
    from celeryops.commands.console import open_console

    open_console(fleet, start="home", state_dir=state_dir, first_look=look)

