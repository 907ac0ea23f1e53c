"""``celeryops rollback``: preflight -> stop consumers -> drain -> route each target back -> done (headless mode);
with the overlap strategy, one worker pool: the previous revision beside the deployed one -> drain the deployed one
-> every instance back."""

from __future__ import annotations

import sys

import click

from celeryops.commands.common import FleetSpec, fleet_options, state_dir_option
from celeryops.commands.headless import RECOVERED, flag_operator, open_wiring, run_headless
from celeryops.commands.output import Printer
from celeryops.core.config import STRATEGY_NAMES
from celeryops.core.errors import EXIT_USAGE, UserError


@click.command()
@fleet_options
@click.option("--target", "targets", multiple=True, metavar="NAME", help="Roll back only this target (repeatable).")
@click.option("--to", "to", default="", metavar="REVISION",
              help="Go back to this revision of the one target (default: what its last deploy replaced).")
@click.option("--strategy", type=click.Choice(STRATEGY_NAMES), default=None,
              help="How the revision is brought to serve: drain (stop everything, wait, route back), overlap or "
                   "canary (one Cloud Run worker pool: the previous revision comes up beside the deployed one, which "
                   "stops once idle; no pause). Default: the target's strategy, else drain.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before stopping consumers and before routing back.")
@click.option("--accept-warnings", is_flag=True, help="Go ahead although preflight checks warned (all of them).")
@click.option("--accept-warning", "accept", multiple=True, metavar="ID",
              help="Accept the warnings of this check (repeatable): workers, lease or fence.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--headless", is_flag=True, help="Plain output even in a terminal (no console).")
@state_dir_option()
def rollback(fleet: FleetSpec, targets: tuple[str, ...], to: str, strategy: str | None, yes: bool,
             accept_warnings: bool, accept: tuple[str, ...], as_json: bool, headless: bool,
             state_dir: str | None) -> None:
    """Route each target back to the revision its last deploy replaced (or --to REVISION): preflight, drain (or
    overlap), route back, verify; no new image. In a terminal (without --json or --headless) it opens the console on
    its preflight."""
    from celeryops.ops.preflight.accept import check_accept_ids
    from celeryops.ops.run.rollback import chosen
    from celeryops.ops.run.rollback_plan import RollbackRequest

    accept = check_accept_ids(accept)
    config = fleet.config({"state_dir": state_dir})
    request = RollbackRequest(targets=tuple(config.target(name) for name in targets), to=to, strategy=strategy or "")
    chosen(config, request, None)  # refused before anything is contacted
    from celeryops.commands.console import open_console, wants_console

    if wants_console(as_json, headless):
        open_console(fleet, start="rollback", config=config, rollback=request)
    if not yes and not sys.stdin.isatty():
        raise UserError("celeryops rollback asks before stopping consumers and before routing back, but there is no "
                        "terminal to ask on: nothing was changed; add --yes to run it unattended.", EXIT_USAGE)
    printer = Printer(as_json)
    wiring = open_wiring(fleet, config)
    session = wiring.session(flag_operator(yes=yes), printer, accept_all=accept_warnings, accept=accept)
    sys.exit(run_headless(wiring, session, printer, lambda s: s.rollback(request), RECOVERED).exit_code)


COMMANDS = [rollback]
