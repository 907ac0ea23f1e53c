"""While two revisions run on the pool: a ``progress`` step every interval (:func:`ticking`), with the instances and
workers of each, the new revision's consuming workers and its completed tasks and rate. Shown, never decided on."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from celeryops.ops.run.pool.pool import Pool
from celeryops.ops.run.pool.rules import Plan


@contextlib.asynccontextmanager
async def ticking(pool: Pool, plan: Plan) -> AsyncIterator[None]:
    """A ``progress`` step every interval (at least a second) while the body runs."""
    every = max(pool.settings.interval, 1.0)

    async def tick() -> None:
        while True:
            with contextlib.suppress(Exception):  # progress is shown, never decided on
                await progress(pool, plan)
            await asyncio.sleep(every)

    task = asyncio.ensure_future(tick())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def progress(pool: Pool, plan: Plan) -> None:
    """One ``progress`` step of ``plan``'s two revisions."""
    fleet = pool.runner.fleet
    registry, instances, state = await asyncio.gather(pool.registry(), pool.instances(*plan.revisions),
                                                      pool.state())
    new = registry.get(plan.new, ())
    observed, processed = await asyncio.gather(fleet.observe(new), fleet.processed(new)) if new else (None, {})
    consuming = tuple(sorted(n for n, w in observed.workers.items() if w.queues)) if observed else ()
    completed = max(0, sum(processed.values()) - (observed.active if observed else 0))
    now = time.monotonic()
    rate = None
    if pool.completed is not None and now > pool.completed[0]:
        rate = round(max(0, completed - pool.completed[1]) / (now - pool.completed[0]), 2)
    pool.completed = (now, completed)
    pool.step("progress", plan, instances=instances, split=state.served,
              workers={rev: registry.get(rev, ()) for rev in plan.revisions}, consuming=consuming,
              completed=completed, rate=rate)


__all__ = ["progress", "ticking"]
