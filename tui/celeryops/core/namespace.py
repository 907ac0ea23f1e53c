"""Redis key names shared by the operator side (lease, status, fence writer) and the worker side (fence plugin).

A fleet is named by ``$CELERYOPS_FLEET`` (default ``default``); one Redis database usually serves one fleet.
All keys of a fleet carry the same hash tag, so they share one Redis Cluster slot.
Worker-side safe: imports nothing but the standard library.
"""

from __future__ import annotations

import os

DEFAULT_FLEET = "default"


def fleet_name(explicit: str | None = None) -> str:
    return explicit or os.environ.get("CELERYOPS_FLEET") or DEFAULT_FLEET


def fleet_key(fleet: str, *parts: str) -> str:
    """``celeryops:{<fleet>}:part:part`` (the braces are the Cluster hash tag)."""
    return ":".join(["celeryops", "{" + fleet + "}", *parts])
