"""``celeryops drain`` and ``celeryops abort`` (headless; the console opens on top of them in a terminal)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from celeryops.commands.common import FleetSpec, fleet_options, state_dir_option
from celeryops.commands.headless import RECOVERED, RESTORED, flag_operator, open_wiring, run_headless
from celeryops.commands.output import Printer
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.ops.run.session import DrainRequest


def _positive(name: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None and value <= 0:
            raise click.BadParameter(f"{name} must be greater than 0")
        return value

    return check



@click.command()
@fleet_options
@click.option("--queue", "-Q", "queues", multiple=True, metavar="Q",
              help="Queue to drain (repeatable; default: every queue the workers consume).")
@click.option("--interval", type=float, default=None, callback=_positive("--interval"),
              help="Seconds between polls (default 15, or the config's drain.interval).")
@click.option("--streak", type=int, default=None, callback=_positive("--streak"),
              help="Empty polls in a row that mean drained (default 2).")
@click.option("--max-wait", type=float, default=None, callback=_positive("--max-wait"),
              help="Give up (restore consumers, kill nothing) after this many seconds (default 1200).")
@click.option("--forget", multiple=True, metavar="WORKER",
              help="Treat this registered worker as gone (known dead; recorded with the run).")
@click.option("--take-over", is_flag=True, help="Take over an orphaned run of this fleet (recovers it first).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before forgetting workers.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--headless", is_flag=True, help="Plain output even in a terminal (no console).")
@state_dir_option()
def drain(fleet: FleetSpec, queues: tuple[str, ...], interval: float | None, streak: int | None,
          max_wait: float | None, forget: tuple[str, ...], take_over: bool, yes: bool, as_json: bool,
          headless: bool, state_dir: str | None) -> None:
    """Stop consumers and wait until no task runs (exit 0: drained, consumers stay stopped).
    In a terminal (without --json or --headless) it opens the console on the drain's preflight."""
    printer = Printer(as_json)
    if forget and not yes and not as_json:
        if not sys.stdin.isatty():
            raise UserError("--forget needs a confirmation: nothing was changed; add --yes to confirm that "
                            f"{', '.join(forget)} is gone.", EXIT_USAGE)
        click.confirm(f"Treat {', '.join(forget)} as gone (its tasks will not be waited for)?", abort=True)
    cfg = fleet.config({"state_dir": state_dir, "drain.interval": interval, "drain.streak": streak,
                        "drain.max_wait": max_wait})
    request = DrainRequest(queues, cfg.drain, forget, take_over)  # the flags are in cfg.drain already
    from celeryops.commands.console import open_console, wants_console

    if wants_console(as_json, headless):
        open_console(fleet, start="drain", config=cfg, drain=request)
    wiring = open_wiring(fleet, cfg)
    # A drain asks nothing: the drain itself waits for silent workers, so its preflight warnings are shown, not asked.
    session = wiring.session(flag_operator(yes=True), printer, accept_all=True)
    sys.exit(run_headless(wiring, session, printer, lambda s: s.drain(request), RESTORED))


@click.command()
@fleet_options
@click.option("--restore", "force_restore", is_flag=True,
              help="The deploy's outcome is unknown but the old revision still serves: restore the consumers.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@state_dir_option()
def abort(fleet: FleetSpec, force_restore: bool, as_json: bool, state_dir: str | None) -> None:
    """Restore the consumers stopped by the current run (recovery rules), and end it."""
    printer = Printer(as_json)
    wiring = open_wiring(fleet, fleet.config({"state_dir": state_dir}))
    session = wiring.session(flag_operator(yes=True), printer)
    decided = run_headless(wiring, session, printer, lambda s: s.abort(force_restore=force_restore), RECOVERED)
    if as_json:
        printer.json({"event": "abort", "action": decided.action, "message": decided.explanation,
                      "next": decided.next_commands})
    else:
        click.echo(decided.explanation)
    sys.exit(decided.exit_code)


@click.command()
@fleet_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@state_dir_option()
def resume(fleet: FleetSpec, as_json: bool, state_dir: str | None) -> None:
    """Continue the fleet's interrupted run from its phase (same settings): drain again, then deploy if it is a
    deploy run; a deploy already started finishes by the rollout's outcome."""
    printer = Printer(as_json)
    wiring = open_wiring(fleet, fleet.config({"state_dir": state_dir}))
    session = wiring.session(flag_operator(yes=True), printer, accept_all=True)
    sys.exit(run_headless(wiring, session, printer, lambda s: s.resume(), RECOVERED))


COMMANDS = [drain, abort, resume]
