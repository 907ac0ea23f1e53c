"""``Journal.aio``: the journal's calls as coroutines (SQLite and the fleet's Redis run in a worker thread, so the
event loop never blocks)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from celeryops.ops.journal.model import Phase, Run, RunLine

if TYPE_CHECKING:
    from celeryops.ops.journal.journal import Journal


class AsyncJournal:
    """The same journal calls as coroutines (SQLite runs in a worker thread, the event loop never blocks)."""

    def __init__(self, journal: Journal) -> None:
        self._j = journal

    async def create_run(self, **kwargs: Any) -> Run:
        return await asyncio.to_thread(lambda: self._j.create_run(**kwargs))

    async def advance(self, run_id: str, phase: Phase, *, reason: str | None = None,
                      outcome: str | None = None) -> Run:
        return await asyncio.to_thread(self._j.advance, run_id, phase, reason=reason, outcome=outcome)

    async def intend(self, run_id: str, kind: str, payload: Mapping[str, Any]) -> int:
        return await asyncio.to_thread(self._j.intend, run_id, kind, payload)

    async def intend_cancel_consumers(self, run_id: str, stop: Mapping[str, Iterable[str]],
                                      before: Mapping[str, Iterable[str]] | None = None) -> int:
        return await asyncio.to_thread(self._j.intend_cancel_consumers, run_id, stop, before)

    async def intend_add_consumers(self, run_id: str, add: Mapping[str, Iterable[str]]) -> int:
        return await asyncio.to_thread(self._j.intend_add_consumers, run_id, add)

    async def intend_deploy(self, run_id: str, *, target: str, image: str, previous: Mapping[str, Any]) -> int:
        return await asyncio.to_thread(lambda: self._j.intend_deploy(run_id, target=target, image=image,
                                                                     previous=previous))

    async def settle(self, intent_id: int, result: Mapping[str, Any] | None = None) -> None:
        await asyncio.to_thread(self._j.settle, intent_id, result)

    async def note(self, run_id: str, payload: Mapping[str, Any]) -> int:
        return await asyncio.to_thread(self._j.note, run_id, payload)

    async def get(self, run_id: str) -> Run:
        return await asyncio.to_thread(self._j.get, run_id)

    async def stopped_consumers(self, run_id: str) -> dict[str, set[str]]:
        return await asyncio.to_thread(self._j.stopped_consumers, run_id)

    async def unfinished_runs(self, fleet: str | None = None) -> list[Run]:
        return await asyncio.to_thread(self._j.unfinished_runs, fleet)

    async def history(self, limit: int = 20, fleet: str | None = None) -> list[RunLine]:
        return await asyncio.to_thread(self._j.history, limit, fleet)
