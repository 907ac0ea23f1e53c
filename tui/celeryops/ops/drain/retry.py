"""Trying an operation again while a broker or Redis does not answer (a restart, a failover), for a bounded time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

RETRY_FIRST, RETRY_MAX = 0.5, 4.0  # the pause between tries, doubling


async def keep_trying(work: Callable[[], Awaitable[T]], error: type[E], patience: float,
                      on_first_failure: Callable[[E], None] | None = None) -> T:
    """``work()``, tried again on ``error`` for ``patience`` seconds (then that error is raised). One try against a
    dead broker can itself take seconds (connection retries), so the first failure may already end it.
    ``on_first_failure`` hears the first error (to tell the operator why this takes longer)."""
    deadline = time.monotonic() + patience
    pause = RETRY_FIRST
    told = False
    while True:
        try:
            return await work()
        except error as exc:
            if on_first_failure is not None and not told:
                told = True
                on_first_failure(exc)
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, RETRY_MAX)
