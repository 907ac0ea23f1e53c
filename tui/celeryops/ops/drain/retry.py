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
                      on_first_failure: Callable[[E], None] | None = None, *,
                      until: Callable[[T], bool] | None = None,
                      on_first_miss: Callable[[T], None] | None = None) -> T:
    """``work()``, tried again on ``error`` for ``patience`` seconds (then that error is raised). One try against a
    dead broker can itself take seconds (connection retries), so the first failure may already end it.
    ``on_first_failure`` hears the first error (to tell the operator why this takes longer).

    With ``until``, a result it rejects is tried again too (a slow machine's late answer is not a final one), and
    returned as it is once the patience is spent; ``on_first_miss`` hears the first rejected result."""
    deadline = time.monotonic() + patience
    pause = RETRY_FIRST
    told = missed = False
    while True:
        try:
            result = await work()
        except error as exc:
            if on_first_failure is not None and not told:
                told = True
                on_first_failure(exc)
            if deadline - time.monotonic() <= 0:
                raise
        else:
            if until is None or until(result) or deadline - time.monotonic() <= 0:
                return result
            if on_first_miss is not None and not missed:
                missed = True
                on_first_miss(result)
        await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, RETRY_MAX)
