"""The console's first look at its fleet: what the home view shows first (the fleet, the slot pool, an unfinished
run), read by :class:`~celeryops.ops.backend.snapshots.Snapshots` as the console backend's first poll reads it, over
a wiring of its own, then what its next polls go on from (:class:`~celeryops.ops.backend.snapshots.Seen`). All but
the doctor's findings: reading the workers' settings takes an inspect round of its own and the doctor's modules, and
the fleet is what the operator waits for; the console polls again as soon as its own backend is open, findings
included (:class:`~celeryops.commands.console.LateBackend`).

``celeryops`` reads it in a process of its own while Textual starts (``commands.console.FirstLook``), on another
core: the console's first frame does not wait for it, and the fleet does not wait for the ops layer to load in the
console's process. It needs only the fleet's reads: no run session, no deploy adapter is imported on this path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from celeryops.core.errors import UserError
from celeryops.ops.backend.snapshots import Snapshots
from celeryops.ops.run.wiring import CONSOLE_CLIENT_NAME, wire

if TYPE_CHECKING:
    from celery import Celery

    from celeryops.core.config import Config

#: The parts, in the order they are read and sent; then ``seen`` (what the next polls go on from).
Part = Literal["fleet", "slots", "unfinished", "seen"]
PARTS: tuple[Part, ...] = ("fleet", "slots", "unfinished")
#: ``send(part, value, error)``: one part as soon as it is read, or the error it ended with (value None).
Send = Callable[[Part, object, BaseException | None], None]


def read_first_look(app: Celery, config: Config, send: Send) -> None:
    """Read the console's first look at the fleet of ``app`` and ``send`` each part as soon as it is read: the fleet
    (what ``fleet_snapshot`` returns), the slot pool (``slots_snapshot``), the unfinished run (``unfinished_run``),
    then ``seen``. A part that ends with a :class:`UserError` (the broker is unreachable, say) is sent as that error,
    as the console backend would raise it; anything else propagates (the console then reads that part itself)."""
    wiring = wire(app, config, client_name=CONSOLE_CLIENT_NAME)  # as the console backend's (open_backend)
    try:
        snapshots = Snapshots(wiring, doctor=False)
        reads: tuple[tuple[Part, Callable[[], Awaitable[object]]], ...] = (
            ("fleet", lambda: snapshots.fleet(None, None)),
            ("slots", snapshots.slots),
            ("unfinished", lambda: asyncio.to_thread(snapshots.unfinished_run)))

        async def parts() -> None:
            for part, read in reads:
                try:
                    value = await read()
                except UserError as err:
                    send(part, None, err)
                else:
                    send(part, value, None)

        asyncio.run(parts())
        send("seen", snapshots.seen(), None)
    finally:
        wiring.close()


__all__ = ["PARTS", "Part", "Send", "read_first_look"]
