"""How the operator's decisions reach a run: the :class:`Operator` protocol the run session asks, and the two
operators there are: one that answers from a command's flags (and a terminal prompt), one that waits for the
console's keys (:class:`ConsoleOperator`, with the operator's decisions mid-run). The session holds the flow; an
operator only answers its questions."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.ops.preflight import PreflightReport
from celeryops.ops.run.decisions import Decisions


@dataclass(frozen=True)
class Review:
    """The operator's answer after preflight: go ahead (stop the consumers) or not, and which warnings are accepted
    (``accept_all``, or by check id)."""

    proceed: bool
    accepted: frozenset[str] = frozenset()
    accept_all: bool = False


class Operator(Protocol):
    async def review(self, report: PreflightReport, accepted: frozenset[str]) -> Review:
        """Preflight found nothing failing (``accepted``: warnings the config accepts up front): go ahead?"""
        ...

    async def confirm_deploy(self, release: str, targets: tuple[str, ...]) -> bool:
        """The fleet is drained: deploy ``release`` to ``targets`` now?"""
        ...

    async def confirm_rollback(self, what: str) -> bool:
        """The fleet is drained: route the targets back now (``what``: each target's way back, in words)?"""
        ...


Ask = Callable[[str], Awaitable[bool]]


@dataclass
class FlagOperator:
    """A command without the console: the warnings accepted up front (``--accept-warning(s)``, the config) are all
    it accepts, and ``--yes`` answers the questions (else ``ask``, a terminal prompt). A warning left unaccepted
    fails the preflight; nothing is asked then."""

    ask: Ask | None = None  # None: --yes

    async def review(self, report: PreflightReport, accepted: frozenset[str]) -> Review:
        if any(w.id not in accepted for w in report.warnings):
            return Review(False, accepted)
        if self.ask is not None and not await self.ask("Stop the consumers of the fleet and drain it?"):
            return Review(False, accepted)
        return Review(True, accepted)

    async def confirm_deploy(self, release: str, targets: tuple[str, ...]) -> bool:
        if self.ask is None:
            return True
        return await self.ask(f"Drained. Deploy release {release} to {', '.join(targets)} now?")

    async def confirm_rollback(self, what: str) -> bool:
        if self.ask is None:
            return True
        return await self.ask(f"Drained. Roll back now ({what})?")


@dataclass
class ConsoleOperator:
    """Waits for the console: :meth:`proceed` (after the operator confirmed, warnings included) answers the review;
    the operator's one confirmation covers the deploy that follows the drain. :attr:`decisions`: what the operator
    decides mid-run (a strategy that takes decisions reads them; the others never look)."""

    _waiting: asyncio.Future[Review] | None = field(default=None, init=False)
    _report: PreflightReport | None = field(default=None, init=False)
    _accepted: frozenset[str] = field(default=frozenset(), init=False)
    accept_all: bool = False
    decisions: Decisions = field(default_factory=Decisions)

    @property
    def waiting(self) -> bool:
        return self._waiting is not None and not self._waiting.done()

    async def review(self, report: PreflightReport, accepted: frozenset[str]) -> Review:
        self._report, self._accepted = report, accepted
        self._waiting = asyncio.get_running_loop().create_future()
        try:
            return await self._waiting
        finally:
            self._waiting = None

    def accept_warnings(self) -> None:
        self.accept_all = True

    def proceed(self) -> None:
        """The operator pressed the key that stops the consumers (UserError if the run is not waiting for it)."""
        if self._waiting is None or self._waiting.done() or self._report is None:
            raise UserError("There is no run waiting to proceed: nothing was changed.", EXIT_USAGE)
        if any(w.id not in self._accepted for w in self._report.warnings) and not self.accept_all:
            raise UserError("Preflight warned and the warnings were not accepted: nothing was stopped; review "
                            "them and confirm.", EXIT_USAGE)
        self._waiting.set_result(Review(True, self._accepted, accept_all=self.accept_all))

    async def confirm_deploy(self, release: str, targets: tuple[str, ...]) -> bool:
        return True

    async def confirm_rollback(self, what: str) -> bool:
        return True
