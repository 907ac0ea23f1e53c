"""The operator's decisions during a run, as typed values a strategy that takes them (its ``decisions``) polls or
awaits between its own steps: :class:`PromoteNow`, :class:`RollbackNow`, :class:`PauseCanary` (pause or resume the
automatic verdicts): a canary's today.

The console's keys (the canary screen's) send them through ``ConsoleBackend.canary_decision`` to the run's operator
(the console's :class:`~celeryops.ops.run.operator.ConsoleOperator`, whose :class:`Decisions` mailbox every console
run has); :func:`decisions_of` gives a strategy that mailbox, or None for an operator that sends none (a headless
command: its strategy decides by itself, and an inconclusive canary ends as the rules say). No Textual; the mailbox
may be fed from any thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

DecisionAction = Literal["promote", "rollback", "pause", "resume"]


@dataclass(frozen=True)
class PromoteNow:
    """Promote the canary now, whatever the verdict so far: the overlap's cutover (the old revision drained by the
    drain's rules, no busy instance taken away)."""

    @property
    def action(self) -> DecisionAction:
        return "promote"


@dataclass(frozen=True)
class RollbackNow:
    """Roll the canary back now: its workers stop consuming at once (the fence scoped to its revision), finish what
    they run, then the split goes back to the old revision at the original count."""

    @property
    def action(self) -> DecisionAction:
        return "rollback"


@dataclass(frozen=True)
class PauseCanary:
    """``paused`` True: hold every automatic verdict (both revisions keep consuming; the looks go on and are shown)
    until resumed; False: resume the automatic verdicts."""

    paused: bool = True

    @property
    def action(self) -> DecisionAction:
        return "pause" if self.paused else "resume"


Decision = PromoteNow | RollbackNow | PauseCanary


@dataclass
class Decisions:
    """The operator's decisions, in the order sent. :meth:`send` from any thread; a strategy
    :meth:`poll` s between looks or awaits :meth:`next` (with a timeout: its next look)."""

    _queue: deque[Decision] = field(default_factory=deque, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = field(default_factory=list, init=False)

    def send(self, decision: Decision) -> None:
        with self._lock:
            self._queue.append(decision)
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            loop.call_soon_threadsafe(_wake, waiter)

    def poll(self) -> Decision | None:
        """The oldest decision not taken yet, or None."""
        with self._lock:
            return self._queue.popleft() if self._queue else None

    async def next(self, timeout: float | None = None) -> Decision | None:
        """The oldest decision not taken yet, waiting up to ``timeout`` seconds (None: as long as it takes) for
        one; None when none came."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            with self._lock:
                if self._queue:
                    return self._queue.popleft()
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, waiter))
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                self._forget(waiter)
                return None
            try:
                async with asyncio.timeout(left):  # not wait_for: on 3.11 it may swallow a cancellation (a Ctrl-C)
                    await waiter
            except TimeoutError:
                self._forget(waiter)
                return self.poll()

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        with self._lock:
            self._waiters = [(lp, w) for lp, w in self._waiters if w is not waiter]


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def decisions_of(operator: object) -> Decisions | None:
    """The decisions ``operator`` sends mid-run, or None when it sends none (a command's flags)."""
    decisions = getattr(operator, "decisions", None)
    return decisions if isinstance(decisions, Decisions) else None


__all__ = ["Decision", "DecisionAction", "Decisions", "PauseCanary", "PromoteNow", "RollbackNow", "decisions_of"]
