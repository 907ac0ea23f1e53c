"""core.aio: waiting on an event without losing a cancellation.

On Python 3.11, ``asyncio.wait_for(event.wait(), t)`` returns normally when the task is cancelled in the same loop
step as the event is set: the cancellation is swallowed and the task goes on (a writer asked to stop at close runs
on, a Ctrl-C is lost). ``wait_event`` must raise the cancellation in that case too.
"""

from __future__ import annotations

import asyncio

import pytest

from celeryops.core.aio import cancel_and_wait, wait_event


async def test_a_cancellation_that_comes_as_the_event_is_set_is_raised() -> None:
    event = asyncio.Event()
    woke: list[bool] = []

    async def waiter() -> None:
        while True:  # as the status writer's loop: it would go round again if the cancellation were swallowed
            woke.append(await wait_event(event, 10))
            event.clear()

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # the task waits on the event now
    event.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), 5)  # TimeoutError here: it swallowed the cancellation
    assert task.cancelled() and woke == []


async def test_it_says_whether_the_event_came_within_the_timeout() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, 10) is True
    assert await wait_event(event, None) is True  # already set: at once, with no limit


async def test_cancel_and_wait_ends_a_task_waiting_on_an_event() -> None:
    event = asyncio.Event()
    task = asyncio.create_task(wait_event(event, None))
    await asyncio.sleep(0)
    event.set()
    await asyncio.wait_for(cancel_and_wait(task), 5)
    assert task.done()
