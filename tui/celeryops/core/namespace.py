"""Names shared by the operator side (lease, status, fence writer, fleet observation) and the worker side (fence
plugin): Redis keys, and the remote-control command the plugin answers observations with.

A fleet is named by ``$CELERYOPS_FLEET`` (default ``default``); one Redis database usually serves one fleet.
All keys of a fleet carry the same hash tag, so they share one Redis Cluster slot.
Worker-side safe: imports nothing but the standard library.
"""

from __future__ import annotations

import os

DEFAULT_FLEET = "default"
# The remote-control command the worker plugin answers with a whole observation (active, reserved, scheduled
# tasks and the queues consumed) in one reply.
OBSERVE_COMMAND = "celeryops_observe"


def fleet_name(explicit: str | None = None) -> str:
    return explicit or os.environ.get("CELERYOPS_FLEET") or DEFAULT_FLEET


def fleet_key(fleet: str, *parts: str) -> str:
    """``celeryops:{<fleet>}:part:part`` (the braces are the Cluster hash tag)."""
    return ":".join(["celeryops", "{" + fleet + "}", *parts])
