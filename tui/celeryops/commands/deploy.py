"""``celeryops deploy RELEASE``: preflight -> stop consumers -> drain -> deploy -> done (headless mode)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import click

from celeryops.commands.common import FleetSpec, fleet_options, state_dir_option
from celeryops.commands.headless import RECOVERED, flag_operator, open_wiring, run_headless
from celeryops.commands.output import Printer
from celeryops.core.config import STRATEGY_NAMES
from celeryops.core.errors import EXIT_USAGE, UserError


@click.command()
@click.argument("release")
@fleet_options
@click.option("--target", "targets", multiple=True, metavar="NAME", help="Deploy only this target (repeatable).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before stopping consumers and before deploying.")
@click.option("--accept-warnings", is_flag=True, help="Go ahead although preflight checks warned (all of them).")
@click.option("--accept-warning", "accept", multiple=True, metavar="ID",
              help="Accept the warnings of this check (repeatable): branch, freshness, traffic, workers, lease, "
                   "fence or mixed_versions.")
@click.option("--strategy", type=click.Choice(STRATEGY_NAMES), default=None,
              help="How the workers are replaced (wins over the targets' strategy): drain (stop every consumer, "
                   "wait until nothing runs, deploy; the default), overlap (a Cloud Run worker pool: the new "
                   "revision consumes beside the old one, whose instances go once idle; no pause) or canary (a "
                   "worker pool: a few new instances judged by their task outcomes, then promoted or rolled back; "
                   "exit 7 rolled back, 8 no verdict).")
@click.option("--repo", type=click.Path(file_okay=False, exists=True), default=".",
              help="The git checkout of the release (default: the current directory).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--headless", is_flag=True, help="Plain output even in a terminal (no console).")
@state_dir_option()
def deploy(release: str, fleet: FleetSpec, targets: tuple[str, ...], yes: bool, accept_warnings: bool,
           accept: tuple[str, ...], strategy: str | None, repo: str, as_json: bool, headless: bool,
           state_dir: str | None) -> None:
    """Deploy RELEASE (a branch pushed to the release remote): preflight, drain, deploy, verify.
    In a terminal (without --json or --headless) it opens the console on the deploy's preflight."""
    from celeryops.ops.preflight.accept import check_accept_ids

    accept = check_accept_ids(accept)
    config = fleet.config({"state_dir": state_dir})
    if not config.targets:
        raise UserError("No deploy target is configured: nothing was changed; add a [[targets]] table to "
                        "celeryops.toml (see the README).", EXIT_USAGE)
    chosen = tuple(config.target(name) for name in targets) if targets else config.targets
    if strategy is not None:
        chosen = tuple(replace(t, strategy=strategy) for t in chosen)  # type: ignore[arg-type]
    from celeryops.ops.run.strategies import strategy_of_targets

    strategy_of_targets(chosen).check_targets(chosen)  # e.g. one worker pool, or one sentence (exit 2) before anything
    #                                                     is contacted
    from celeryops.commands.console import open_console, wants_console

    if wants_console(as_json, headless):
        open_console(fleet, start="deploy", config=config, release=release, targets=chosen, repo=repo)
    if not yes and not sys.stdin.isatty():
        raise UserError("celeryops deploy asks before stopping consumers and before deploying, but there is no "
                        "terminal to ask on: nothing was changed; add --yes to run it unattended.", EXIT_USAGE)
    printer = Printer(as_json)
    wiring = open_wiring(fleet, config)
    session = wiring.session(flag_operator(yes=yes), printer, repo=Path(repo), accept_all=accept_warnings,
                             accept=accept)
    sys.exit(run_headless(wiring, session, printer, lambda s: s.deploy(release, chosen), RECOVERED).exit_code)


COMMANDS = [deploy]
