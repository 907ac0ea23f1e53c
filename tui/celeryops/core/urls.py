"""Which URLs name a Redis: the one test for the broker, the fleet's coordination Redis and the slot pools' Redis.
Worker-side safe: imports nothing but the standard library."""

from __future__ import annotations

from typing import Final, TypeGuard

REDIS_SCHEMES: Final = ("redis://", "rediss://", "unix://")


def is_redis_url(url: str | None) -> TypeGuard[str]:
    """``redis://``, ``rediss://`` or ``unix://`` (a socket): a URL redis-py connects to. A broker URL of this kind
    is a Redis broker (Celery spells its Redis brokers ``redis://`` or ``rediss://``)."""
    return bool(url) and str(url).startswith(REDIS_SCHEMES)
