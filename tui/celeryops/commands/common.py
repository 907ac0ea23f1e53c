"""Options every fleet command shares (``-A MODULE | --broker URL``) and how the fleet is resolved."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.urls import is_redis_url

if TYPE_CHECKING:  # imported where used: `celeryops --help` and `--version` load neither Celery nor the config
    from celery import Celery

    from celeryops.core.config import Config

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class FleetSpec:
    """Which fleet a command talks to: a Celery app (``-A``) and/or a broker URL.

    A flag wins over the environment, which wins over the config file (``--config``, ./celeryops.toml,
    pyproject.toml). Given ``-A`` or ``--broker``, the flags alone name the fleet: ``--broker URL`` is the broker of
    every connection (with ``-A``: that app's settings on that broker, as ``celery -A M --broker URL``), and ``-A``
    alone reads the broker as ``celery -A`` does (``$CELERY_BROKER_URL``, else the app's ``broker_url``), which is
    what the app's workers use. Without either, the configuration's ``app`` and ``broker`` (each from
    ``$CELERYOPS_APP`` / ``$CELERYOPS_BROKER``, else ``$CELERY_BROKER_URL`` for the broker, else the file)."""

    app_path: str | None = None
    broker: str | None = None
    config_path: str | None = None
    _config: Config | None = field(default=None, init=False, repr=False)

    def config(self, overrides: dict[str, Any] | None = None) -> Config:
        """The validated configuration with this command's flags applied (None values: flag not given)."""
        from celeryops.core.configload import load_config

        if self._config is None or overrides:
            merged = {"broker": self.broker, "app": self.app_path, **(overrides or {})}
            self._config = load_config(self.config_path, Path.cwd(), os.environ, merged)
        return self._config

    def chosen(self) -> tuple[str | None, str | None]:
        """(the Celery app to load or None, the broker URL that every connection uses or None: the app's own, as
        ``celery -A`` reads it)."""
        if self.app_path or self.broker:
            return self.app_path, self.broker
        cfg = self.config()
        return cfg.app, cfg.broker

    @property
    def given(self) -> bool:
        """Whether a fleet is named at all (flag, environment or config file)."""
        return any(self.chosen())

    def resolve_broker_url(self) -> str:
        """The broker URL. A Redis URL given as such (no app to load) is returned as given, without loading Celery
        (``celeryops status`` and ``slots`` start faster); anything else as the Celery app's connection spells it."""
        url = self.plain_broker_url()
        if is_redis_url(url):
            return url
        return str(self.celery_app().connection_for_write().as_uri(include_password=True))

    def plain_broker_url(self) -> str | None:
        """The broker URL when no Celery app is involved (no -A, no ``app`` in the configuration), else None."""
        app_path, url = self.chosen()
        return None if app_path else url

    def celery_app(self) -> Celery:
        """The fleet's Celery app, on the chosen broker (:func:`celeryops.adapters.celeryapp.pin_broker`: Celery's
        own ``$CELERY_BROKER_URL`` no longer wins over it)."""
        from celeryops.adapters.celeryapp import broker_app, pin_broker

        app_path, url = self.chosen()
        if app_path:
            app = load_celery_app(app_path)
            return pin_broker(app, url) if url else app
        if not url:
            raise UserError(
                "No fleet given: nothing was contacted; pass --broker URL or -A MODULE, "
                "or set CELERY_BROKER_URL.", EXIT_USAGE)
        return broker_app(url)


def load_celery_app(path: str) -> Celery:
    """Import the app the way ``celery -A`` does (the current directory is importable)."""
    from celery import Celery
    from celery.app.utils import find_app

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        app = find_app(path)
    except Exception as exc:  # the user's module may raise anything on import
        raise UserError(
            f"Could not load the Celery app {path!r} ({type(exc).__name__}: {exc}): nothing was contacted; "
            "check -A (e.g. proj.celery:app) and that the module imports.", EXIT_USAGE) from None
    if not isinstance(app, Celery):
        raise UserError(f"{path!r} is not a Celery app: nothing was contacted; point -A at the app instance.",
                        EXIT_USAGE)
    return app


def state_dir_option(read_only: bool = False) -> Callable[[F], F]:
    """``--state-dir DIR``: where the run journal lives (``read_only``: the command only reads it there)."""
    note = "read only here; " if read_only else ""
    return click.option("--state-dir", type=click.Path(file_okay=False), default=None,
                        help=f"Where the run journal lives ({note}default: the user state dir).")


def fleet_options(func: F) -> F:
    """Adds ``-A/--app`` and ``--broker`` and passes a ``fleet: FleetSpec`` keyword to the command."""

    @click.option("-A", "--app", "app_path", metavar="MODULE",
                  help="Celery app to load, as for `celery -A` (its broker too: $CELERY_BROKER_URL, else the app's).")
    @click.option("--broker", metavar="URL",
                  help="Broker URL of every connection (wins over $CELERY_BROKER_URL, -A's and the config's).")
    @click.option("--config", "config_path", metavar="PATH",
                  help="celeryops.toml to use (default: ./celeryops.toml or [tool.celeryops] in ./pyproject.toml).")
    @functools.wraps(func)
    def wrapper(*args: Any, app_path: str | None, broker: str | None, config_path: str | None, **kwargs: Any) -> Any:
        return func(*args, fleet=FleetSpec(app_path=app_path, broker=broker, config_path=config_path), **kwargs)

    return wrapper  # type: ignore[return-value]
