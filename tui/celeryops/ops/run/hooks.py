"""The journal's write-ahead hooks for a drain (the drain engine knows no journal), a restore's settle record and
the sentence for consumers that did not come back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from celeryops.core.events import ConsumersRestored
from celeryops.ops.journal import Journal, consumers_text


@dataclass
class JournalHooks:
    """Write-ahead records of a drain's side effects in the run journal."""

    journal: Journal
    run_id: str
    on_first_stop: Callable[[tuple[str, ...]], Awaitable[None]] | None = None
    _restore_intent: int | None = None

    async def before_stop(self, stops: dict[str, tuple[str, ...]], before: dict[str, tuple[str, ...]]) -> None:
        await self.journal.aio.intend_cancel_consumers(self.run_id, stops, before)
        if self.on_first_stop is not None:
            first, self.on_first_stop = self.on_first_stop, None
            await first(tuple(sorted({q for qs in stops.values() for q in qs})))

    async def before_restore(self, restore: dict[str, tuple[str, ...]]) -> None:
        self._restore_intent = await self.journal.aio.intend_add_consumers(self.run_id, restore)

    async def member_changed(self, name: str, change: Literal["gone", "rejoined"], evidence: str) -> None:
        await self.journal.aio.note(self.run_id, {"member": name, "change": change, "evidence": evidence})

    async def after_restore(self, event: ConsumersRestored) -> None:
        if self._restore_intent is not None:
            await self.journal.aio.settle(self._restore_intent, restore_settlement(event))


def restore_settlement(event: ConsumersRestored) -> dict[str, Any]:
    """How a restore went, as its intent's settle record (``ok`` only when every consumer was confirmed back)."""
    return {"ok": event.verified, "restored": {w: list(q) for w, q in event.restored.items()},
            "missing": {w: list(q) for w, q in event.missing.items()}}


def unverified(event: ConsumersRestored) -> str:
    who = consumers_text(event.missing)
    return (f"Could not confirm that these consumers are back: {who}; they may be busy (a solo-pool worker "
            "answers when its task ends) — check with `celeryops status` and run `celeryops abort` again if needed.")
