"""A Celery app that connects to the broker celeryops was told to use, whatever the environment says.

Celery's settings prefer the environment to the app's configuration: ``Settings.broker_url`` answers
``$CELERY_BROKER_URL`` before ``app.conf.broker_url``, and ``broker_read_url`` / ``broker_write_url`` answer
``$CELERY_BROKER_READ_URL`` / ``$CELERY_BROKER_WRITE_URL`` first (``celery/app/utils.py``). Every connection Celery
opens for an app (remote-control and inspect broadcasts, the event receiver, the producer pool) takes its URL from
those properties, so ``app.conf.broker_url = url`` loses to a variable that a Django ``.env`` or a tutorial left in
the shell. :func:`pin_broker` makes the URL stick: the app's settings then answer with it for the broker, and the
environment is no longer asked (the result backend and every other setting stay as Celery reads them).
"""

from __future__ import annotations

from celery import Celery
from celery.app.utils import Settings


class PinnedSettings(Settings):  # type: ignore[misc]  # celery ships no types
    """Celery's settings, but every broker URL is the pinned one (see :func:`pin_broker`)."""

    @property
    def broker_url(self) -> str:
        return str(self.__dict__[_PINNED])

    @property
    def broker_read_url(self) -> str:
        return self.broker_url

    @property
    def broker_write_url(self) -> str:
        return self.broker_url


_PINNED = "celeryops_pinned_broker"


def pin_broker(app: Celery, url: str) -> Celery:
    """Make ``url`` the broker of every connection ``app`` opens (reading and writing), over ``$CELERY_BROKER_URL``,
    ``$CELERY_BROKER_READ_URL``, ``$CELERY_BROKER_WRITE_URL`` and the app's own broker settings (namespaced ones,
    ``CELERY_BROKER_URL`` in Django's settings, included); returns ``app``.

    The settings object stays the same one (Celery swaps a pending configuration into it in place, and code may
    hold it): its class is changed and the URL kept in its ``__dict__``, which that swap leaves alone; through
    ``object.__setattr__``, as the settings' own ``__setattr__`` stores attributes as configuration keys. The keys
    are set too, so that the configuration read as a mapping says the same."""
    conf = app.conf
    conf.update(broker_url=url, broker_read_url=url, broker_write_url=url)
    conf.__dict__[_PINNED] = url
    if not isinstance(conf, PinnedSettings):
        object.__setattr__(conf, "__class__", PinnedSettings)
    return app


def broker_app(url: str) -> Celery:
    """A bare Celery app on the broker ``url`` (no task module: remote control, inspect, queue depths)."""
    app = Celery("celeryops", broker=url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = False
    return pin_broker(app, url)
