"""Which URLs name a Redis: the one test for the broker, the fleet's coordination Redis and the slot pools' Redis;
and which hosts are this machine's loopback interface. Worker-side safe: imports nothing but the standard library."""

from __future__ import annotations

import ipaddress
from typing import Final, TypeGuard

REDIS_SCHEMES: Final = ("redis://", "rediss://", "unix://")


def is_redis_url(url: str | None) -> TypeGuard[str]:
    """``redis://``, ``rediss://`` or ``unix://`` (a socket): a URL redis-py connects to. A broker URL of this kind
    is a Redis broker (Celery spells its Redis brokers ``redis://`` or ``rediss://``)."""
    return bool(url) and str(url).startswith(REDIS_SCHEMES)


def is_loopback(hostname: str) -> bool:
    """``localhost``, 127.0.0.0/8 and ``::1`` (a bare host: no port, no brackets). Docker talks plain HTTP to a
    registry there, and a Cloud Run API endpoint there (a local stand-in) may be plaintext."""
    if hostname.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False
