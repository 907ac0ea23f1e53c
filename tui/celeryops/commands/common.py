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
from celeryops.core.masking import mask_url
from celeryops.core.urls import is_redis_url

if TYPE_CHECKING:  # imported where used: `celeryops --help` and `--version` load neither Celery nor the config
    from celery import Celery

    from celeryops.core.config import Config

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class FleetSpec:
    """Which fleet a command talks to: a Celery app (``-A``) or a bare broker URL; flags win over
    ``CELERYOPS_*`` env vars, which win over the config file (``--config``, ./celeryops.toml, pyproject.toml)."""

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

    def resolve_broker_url(self) -> str:
        """The broker URL. A Redis URL given as such (flag, config, $CELERY_BROKER_URL; no app to load) is returned
        as given, without loading Celery (``celeryops status`` and ``slots`` start faster); anything else as the
        Celery app's connection spells it."""
        url = self.plain_broker_url()
        if is_redis_url(url):
            return url
        return str(self.celery_app().connection_for_write().as_uri(include_password=True))

    def plain_broker_url(self) -> str | None:
        """The broker URL when no Celery app is involved (no -A, no ``app`` in the config), else None."""
        cfg = self.config()
        if self.app_path or (not self.broker and cfg.app):
            return None
        return self.broker or cfg.broker or os.environ.get("CELERY_BROKER_URL") or None

    def celery_app(self) -> Celery:
        from celery import Celery

        cfg = self.config()
        app_path = self.app_path or (None if self.broker else cfg.app)
        if app_path:
            return load_celery_app(app_path, self.broker)
        broker = self.broker or cfg.broker or os.environ.get("CELERY_BROKER_URL")
        if not broker:
            raise UserError(
                "No fleet given: nothing was contacted; pass --broker URL or -A MODULE, "
                "or set CELERY_BROKER_URL.", EXIT_USAGE)
        app = Celery("celeryops", broker=broker, set_as_current=False)
        app.conf.broker_connection_retry_on_startup = False
        return app

    @property
    def display(self) -> str:
        if self.broker:
            return mask_url(self.broker)
        if self.app_path:
            return self.app_path
        return mask_url(os.environ.get("CELERY_BROKER_URL", "?"))


def load_celery_app(path: str, broker: str | None = None) -> Celery:
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
    if broker:
        app.conf.broker_url = broker
    return app


def state_dir_option(read_only: bool = False) -> Callable[[F], F]:
    """``--state-dir DIR``: where the run journal lives (``read_only``: the command only reads it there)."""
    note = "read only here; " if read_only else ""
    return click.option("--state-dir", type=click.Path(file_okay=False), default=None,
                        help=f"Where the run journal lives ({note}default: the user state dir).")


def fleet_options(func: F) -> F:
    """Adds ``-A/--app`` and ``--broker`` and passes a ``fleet: FleetSpec`` keyword to the command."""

    @click.option("-A", "--app", "app_path", metavar="MODULE", help="Celery app to load, as for `celery -A`.")
    @click.option("--broker", metavar="URL", help="Broker URL (else -A's, else the config's, else $CELERY_BROKER_URL).")
    @click.option("--config", "config_path", metavar="PATH",
                  help="celeryops.toml to use (default: ./celeryops.toml or [tool.celeryops] in ./pyproject.toml).")
    @functools.wraps(func)
    def wrapper(*args: Any, app_path: str | None, broker: str | None, config_path: str | None, **kwargs: Any) -> Any:
        return func(*args, fleet=FleetSpec(app_path=app_path, broker=broker, config_path=config_path), **kwargs)

    return wrapper  # type: ignore[return-value]
