"""Running a run session without the console: signals interrupt it (so it applies the recovery rules before the
process ends), and user errors and interruptions end the ``--json`` stream with a final event."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click

from celeryops.commands.common import FleetSpec
from celeryops.commands.output import Printer
from celeryops.commands.signals import loop_signals
from celeryops.core.config import Config
from celeryops.core.errors import EXIT_INTERRUPTED, UserError
from celeryops.ops.run.operator import FlagOperator
from celeryops.ops.run.session import RunSession
from celeryops.ops.run.wiring import Wiring, wire

T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
RESTORED = "Interrupted: consumers restored, nothing was killed."
RECOVERED = "Interrupted: the recovery rules were applied."


def run_interruptibly(main: Callable[[], Awaitable[T]]) -> tuple[T | None, bool]:
    """Run ``main`` in a fresh loop; SIGINT/SIGTERM/SIGHUP cancel it (so it can restore consumers before it ends),
    and get their previous handlers back after. Returns (result, interrupted)."""
    interrupted = False

    async def runner() -> T | None:
        nonlocal interrupted
        task = asyncio.ensure_future(main())

        def on_signal(sig: signal.Signals) -> None:
            nonlocal interrupted
            if not interrupted:
                interrupted = True
                sys.stderr.write(f"\n{sig.name}: applying the recovery rules before exiting...\n")
                task.cancel()

        with loop_signals(SIGNALS, on_signal):
            try:
                return await task
            except asyncio.CancelledError:
                if interrupted:
                    return None
                raise

    result = asyncio.run(runner())
    return result, interrupted


def open_wiring(fleet: FleetSpec, config: Config) -> Wiring:
    """Journal first (a bad state dir stops us before the fleet is touched), then the fleet."""
    return wire(fleet.celery_app(), config)


def run_headless(wiring: Wiring, session: RunSession, printer: Printer,
                 main: Callable[[RunSession], Awaitable[T]], interrupted: str) -> T:
    """Run ``main(session)`` interruptibly (the session's events go to ``printer``); errors and interruptions end the
    --json stream with a final event. Exits 130 when interrupted (after ``main`` applied the recovery rules). The
    wiring is closed before this returns. A Redis that refuses the login of the URL's user (a wrong password in
    --broker) stops it before anything is read."""
    stuck = None
    try:
        wiring.require_login()
        result, was_interrupted = run_interruptibly(lambda: main(session))
        if was_interrupted or result is None:
            stuck = session.runner.left_stopped()  # the recovery could not finish (the broker stayed down)
    except UserError as err:
        printer.error(err)
        raise
    finally:
        wiring.close()
    if was_interrupted or result is None:
        if stuck is not None:
            interrupted = (f"Interrupted, but the recovery could not finish: run {stuck.id} still has consumers "
                           "stopped; run `celeryops abort` once the broker answers (`celeryops status` shows it).")
            sys.stderr.write(f"celeryops: {interrupted}\n")
        if printer.as_json and not printer.finished:
            printer.json({"event": "interrupted", "message": interrupted, "recovered": stuck is None})
        sys.exit(EXIT_INTERRUPTED)
    return result


def terminal_ask() -> Callable[[str], Awaitable[bool]]:
    async def ask(question: str) -> bool:
        return await asyncio.to_thread(click.confirm, question, default=False)

    return ask


def flag_operator(*, yes: bool) -> FlagOperator:
    return FlagOperator(ask=None if yes else terminal_ask())
