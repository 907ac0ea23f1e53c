"""The ``celeryops`` command line (click). Subcommands live in ``celeryops.commands.*`` (``COMMANDS`` lists)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

import click

from celeryops import __version__, commands
from celeryops.errors import UserError
from celeryops.masking import mask_text


class _Main(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as err:
            click.echo(f"celeryops: {mask_text(str(err))}", err=True)
            sys.exit(err.exit_code)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="celeryops")
def main() -> None:
    """Drain, deploy and recover Celery fleets safely."""


def _register() -> None:
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        for command in getattr(module, "COMMANDS", []):
            main.add_command(command)


_register()
