"""Typed messages the console posts to itself. Ops events arrive from any thread through the app's event sink
and become one of these; bursts of the same kind collapse (``can_replace``) so the UI never falls behind."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:  # loaded with the first event or snapshot, after the console's first frame
    from celeryops.core.events import DrainProgress, Event
    from celeryops.ops.backend.views import FleetView, SlotsView


class OpsEvent(Message):
    """A run event that must not be dropped (started, cancelled, restored, finished, notices, checks, phases)."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class DrainUpdated(Message):
    """One drain poll. A newer poll replaces a pending one, unless the pending one announced joins/leaves."""

    def __init__(self, progress: DrainProgress) -> None:
        super().__init__()
        self.progress = progress

    def can_replace(self, message: Message) -> bool:
        return (isinstance(message, DrainUpdated) and not message.progress.joined
                and not message.progress.left)


class FleetUpdated(Message):
    """A fresh fleet snapshot; only the latest matters."""

    def __init__(self, view: FleetView) -> None:
        super().__init__()
        self.view = view

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FleetUpdated)


class SlotsUpdated(Message):
    """A fresh slot pool snapshot (None: no pool); only the latest matters."""

    def __init__(self, view: SlotsView | None) -> None:
        super().__init__()
        self.view = view

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SlotsUpdated)


def to_message(event: Event) -> Message:
    """The message an ops event becomes."""
    from celeryops.core.events import DrainProgress

    if isinstance(event, DrainProgress):
        return DrainUpdated(event)
    return OpsEvent(event)
