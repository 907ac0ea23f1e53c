"""``celeryops autoscale [TARGET]``: the autoscaler of a Cloud Run worker pool, headless, until a signal.

SIGINT, SIGTERM or SIGHUP stop it: the step in progress is completed or undone (a cohort's drain given back, a pool
update followed to its end) and the command exits 0 with every worker consuming. Bad input exits 2 in one sentence
before anything changes; ``--json`` prints one event per line (``autoscale`` per look, ``autoscale_step`` per step,
the drain's events of a cohort taken away, ``autoscale_stopped`` at the end).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable

import click

from celeryops.commands.common import FleetSpec, fleet_options, state_dir_option
from celeryops.commands.headless import SIGNALS, flag_operator, open_wiring
from celeryops.commands.output import Printer
from celeryops.commands.signals import loop_signals
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.events import Event
from celeryops.core.scaleevents import AutoscaleLook


@click.command()
@click.argument("target", required=False)
@fleet_options
@click.option("--dry-run", is_flag=True, help="Look and print each decision with its reason; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@state_dir_option()
def autoscale(target: str | None, fleet: FleetSpec, dry_run: bool, as_json: bool, state_dir: str | None) -> None:
    """Size a Cloud Run worker pool by what Celery holds (ready + reserved + active per queue) and scale it in
    without killing a task, until SIGINT or SIGTERM (exit 0, every worker consuming). TARGET may be left out when
    the configuration has one worker pool; `--dry-run` changes nothing.

    Capacity is added as cohorts (revisions of the same image with exact instance counts); a cohort goes only once
    every instance of it is idle, drained through the journal first. Settings: [autoscale] in celeryops.toml."""
    from celeryops.ops.autoscale.loop import autoscale as run_autoscaler
    from celeryops.ops.autoscale.refusals import pick_target, target_refusal

    config = fleet.config({"state_dir": state_dir})
    chosen = pick_target(config.targets, target, config.autoscale.target)
    if isinstance(chosen, str):
        raise UserError(chosen, EXIT_USAGE)
    refused = target_refusal(chosen)
    if refused is not None:
        raise UserError(refused, EXIT_USAGE)
    printer = Printer(as_json)
    wiring = open_wiring(fleet, config)
    session = wiring.session(flag_operator(yes=True), printer if as_json else news_only(printer))

    async def main() -> int:
        stop = asyncio.Event()

        def on_signal(sig: signal.Signals) -> None:
            if not stop.is_set():
                sys.stderr.write(f"\n{sig.name}: finishing or undoing the step in progress, then exiting...\n")
                stop.set()

        with loop_signals(SIGNALS, on_signal):
            return await run_autoscaler(session, chosen, config.autoscale, stop, dry_run=dry_run)

    try:
        code = asyncio.run(main())
    except UserError as err:
        printer.error(err)
        raise
    finally:
        wiring.close()
    sys.exit(code)


def news_only(printer: Printer) -> Callable[[Event], None]:
    """Text output: a look is printed when its decision is news (another action, another count needed or run), not
    every interval; ``--json`` prints every look."""
    last: list[tuple[object, ...]] = []

    def sink(event: Event) -> None:
        if isinstance(event, AutoscaleLook):
            gist = (event.action, event.desired, event.instances, event.reason if event.action == "wait" else "")
            if last and last[-1] == gist:
                return
            last[:] = [gist]
        printer(event)

    return sink


COMMANDS = [autoscale]
