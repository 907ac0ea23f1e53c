"""Small asyncio helpers the layers share."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to stop) and wait until it has ended; its cancellation is not raised here."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set, at most ``timeout`` seconds (None: no limit); True if it was set. Unlike
    ``asyncio.wait_for`` on Python 3.11, a cancellation that comes as the event is set is never swallowed (the
    waiting task would otherwise go on as if it had not been cancelled: a writer stopped at close ran on, a Ctrl-C was
    lost): :func:`asyncio.timeout` counts the task's cancellations."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
