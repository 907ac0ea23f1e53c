"""Journal the intent, act, settle: the one write-ahead pattern of a run (:func:`written_ahead`).

Every side effect of a run that recovery must know about is recorded before it happens: the intent is durable in the
local journal and in the fleet's copy (a fleet copy that refuses it raises
:class:`~celeryops.ops.journal.FleetStoreDown` before anything was done), then the side effect runs, then its
settle record says how it went. A failure the caller expects (``failed``: a deploy error by default) settles the
intent ``{"ok": False, "error": ...}`` and is raised again; anything else (a cancellation, a crash, a killed
process) leaves the intent unsettled, which recovery reads as "begun, outcome unknown: ask the target".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from celeryops.adapters.deploy.base import DeployError
from celeryops.ops.journal import Journal

T = TypeVar("T")


def _ok(_result: object) -> Mapping[str, Any]:
    return {}


async def written_ahead(journal: Journal, run_id: str, intent: str, payload: Mapping[str, Any],
                        act: Callable[[], Awaitable[T]], *, settle: Callable[[T], Mapping[str, Any]] = _ok,
                        failed: tuple[type[Exception], ...] = (DeployError,)) -> T:
    """Write ``intent`` (with ``payload``) ahead for run ``run_id``, then ``act``, then settle the intent:
    ``{"ok": True, **settle(result)}`` when ``act`` returns (``settle`` may say ``"ok": False`` itself), ``{"ok":
    False, "error": str(err)}`` when it raises one of ``failed`` (raised again). Returns what ``act`` returned."""
    seq = await journal.aio.intend(run_id, intent, payload)
    try:
        result = await act()
    except failed as err:
        await journal.aio.settle(seq, {"ok": False, "error": str(err)})
        raise
    await journal.aio.settle(seq, {"ok": True, **settle(result)})
    return result


__all__ = ["written_ahead"]
