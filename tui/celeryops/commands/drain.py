"""``celeryops drain`` and ``celeryops abort`` (headless; the console opens on top of them in a terminal)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import click
import redis

from celeryops.adapters.fleet import Fleet
from celeryops.commands.common import FleetSpec, fleet_options
from celeryops.commands.output import Printer
from celeryops.core.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, UserError
from celeryops.core.namespace import fleet_name
from celeryops.ops.drain import DrainSettings
from celeryops.ops.journal import Journal, Run
from celeryops.ops.runner import Runner

T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_interruptibly(main: Callable[[], Awaitable[T]]) -> tuple[T | None, bool]:
    """Run ``main`` in a fresh loop; SIGINT/SIGTERM/SIGHUP cancel it (so it can restore consumers before it ends).
    Returns (result, interrupted)."""
    interrupted = False

    async def runner() -> T | None:
        nonlocal interrupted
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(main())

        def on_signal(signum: int) -> None:
            nonlocal interrupted
            if not interrupted:
                interrupted = True
                sys.stderr.write(f"\n{signal.Signals(signum).name}: restoring consumers before exiting...\n")
                task.cancel()

        for sig in SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await task
        except asyncio.CancelledError:
            if interrupted:
                return None
            raise
        finally:
            for sig in SIGNALS:
                loop.remove_signal_handler(sig)

    result = asyncio.run(runner())
    return result, interrupted


def open_runner(fleet_spec: FleetSpec, state_dir: str | None, printer: Printer, **kw: Any) -> Runner:
    """Journal first (a bad state dir stops us before the fleet is touched), then the fleet."""
    journal = Journal(state_dir=state_dir)
    app = fleet_spec.celery_app()
    fleet = Fleet(app)
    coord = Runner.coordination_redis(fleet)
    name = fleet_name()
    if coord is not None:
        # The fence plugin's registry is a membership source: it lists plugin workers even while they are busy.
        fleet.extra_members.append(lambda: plugin_members(coord, name))
    return Runner(fleet=fleet, journal=journal, fleet_name=name, on_event=printer, coord=coord, **kw)


async def plugin_members(coord: redis.Redis, name: str) -> set[str]:
    from celeryops.fence import plugin_workers

    return set(await asyncio.to_thread(plugin_workers, coord, name))


RESTORED = "Interrupted: consumers restored, nothing was killed."
RECOVERED = "Interrupted: the recovery rules were applied."


def run_headless(runner: Runner, printer: Printer, main: Callable[[], Awaitable[T]], interrupted: str) -> T:
    """Run ``main`` interruptibly; errors and interruptions end the --json stream with a final event. Exits 130 when
    interrupted (after ``main`` applied the recovery rules)."""
    try:
        result, was_interrupted = run_interruptibly(main)
    except UserError as err:
        if printer.as_json and not printer.finished:
            printer.json({"event": "error", "message": str(err), "exit_code": err.exit_code})
        raise
    finally:
        runner.fleet.close()
    if was_interrupted or result is None:
        if printer.as_json and not printer.finished:
            printer.json({"event": "interrupted", "message": interrupted})
        sys.exit(EXIT_INTERRUPTED)
    return result


def _positive(name: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None and value <= 0:
            raise click.BadParameter(f"{name} must be greater than 0")
        return value

    return check


state_dir_option = click.option("--state-dir", type=click.Path(file_okay=False), default=None,
                                help="Where the run journal lives (default: the user state dir).")


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
@state_dir_option
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
    settings = DrainSettings(interval=cfg.drain.interval, streak=cfg.drain.streak, max_wait=cfg.drain.max_wait)
    from celeryops.commands.console import open_console, wants_console

    if wants_console(as_json, headless):
        from celeryops.ops.backend import DrainRequest

        open_console(fleet, start="drain", config=cfg, drain=DrainRequest(queues, settings, forget, take_over))
    runner = open_runner(fleet, cfg.state_dir, printer)
    outcome, _run = run_headless(
        runner, printer, lambda: runner.drain(queues=queues, settings=settings, forget=forget, take_over=take_over),
        RESTORED)
    sys.exit(EXIT_OK if outcome == "drained" else EXIT_TIMEOUT)


@click.command()
@fleet_options
@click.option("--restore", "force_restore", is_flag=True,
              help="The deploy's outcome is unknown but the old revision still serves: restore the consumers.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@state_dir_option
def abort(fleet: FleetSpec, force_restore: bool, as_json: bool, state_dir: str | None) -> None:
    """Restore the consumers stopped by the current run (recovery rules), and end it."""
    printer = Printer(as_json)
    runner = open_runner(fleet, state_dir, printer)
    try:
        result, _ = run_interruptibly(lambda: runner.abort(force_restore=force_restore))
    finally:
        runner.fleet.close()
    if result is None:
        sys.exit(EXIT_INTERRUPTED)
    decided, _restored = result
    if as_json:
        printer.json({"event": "abort", "action": decided.action, "message": decided.explanation,
                      "next": decided.next_commands})
    else:
        click.echo(decided.explanation)
    sys.exit(decided.exit_code)


@click.command()
@fleet_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@state_dir_option
def resume(fleet: FleetSpec, as_json: bool, state_dir: str | None) -> None:
    """Continue the fleet's interrupted run from its phase (same settings)."""
    printer = Printer(as_json)
    runner = open_runner(fleet, state_dir, printer)
    open_run = runner.unfinished()
    if open_run is not None and open_run.release:
        _resume_release(fleet, runner, open_run, printer)
    outcome, _run = run_headless(runner, printer, lambda: runner.resume(), RESTORED)
    sys.exit(EXIT_OK if outcome == "drained" else EXIT_TIMEOUT)


def _resume_release(fleet: FleetSpec, runner: Runner, run: Run, printer: Printer) -> NoReturn:
    """A deploy run: finish it with the release flow (drain -> deploy, or the rollout's outcome)."""
    from celeryops.ops.release import ReleaseFlow

    config = fleet.config()
    names = list(run.settings.get("targets") or [t.name for t in config.targets])
    targets = tuple(config.target(name) for name in names)
    flow = ReleaseFlow(runner, config, run.release or "", targets, sha=str(run.settings.get("sha") or ""))
    sys.exit(run_headless(runner, printer, lambda: flow.resume(run), RECOVERED).exit_code)


COMMANDS = [drain, abort, resume]
