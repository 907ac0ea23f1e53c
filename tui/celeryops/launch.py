"""The ``celeryops`` command's entry point (``[project.scripts]``, ``python -m celeryops``).

It turns the cyclic garbage collector off before the command line loads: what a start imports (click, then Textual
or Celery) lives as long as the process, and the collector's passes over it found nothing while costing ~5-15 ms of
the console's ~0.3 s to its first frame. :func:`celeryops.cli.main` turns it back on before any subcommand runs; the
console (no subcommand) keeps it off until its first poll is done (``ConsoleApp._poll``). Importing
:mod:`celeryops.cli` (tests, tools) changes nothing."""

from __future__ import annotations

import gc


def main() -> None:
    gc.disable()
    from celeryops.cli import main as cli

    cli()
