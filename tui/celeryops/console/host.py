"""What a screen may ask of the console application it runs in (``ConsoleHost``): the run model, the backend, the
injected clock and the console's actions. Screens depend on this protocol, not on the app module, so the app
imports its screens and no screen imports the app."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel

    from celeryops.console.model import RunModel
    from celeryops.console.ports import ConsoleBackend
    from celeryops.ops.backend.views import RecoveryChoice, RunRecordView, RunView, StrandedWorker


class ConsoleHost(Protocol):
    backend: ConsoleBackend
    model: RunModel
    clock: Callable[[], float]
    motion: bool  # spinners and animations (off in snapshots)
    hint: str  # a line under the home view's tables

    def sync_view(self) -> None: ...

    def poll_now(self) -> None: ...

    def call_backend(self, what: str, *calls: Awaitable[None]) -> None: ...

    def confirm(self, title: str, what_happens: str, label: str, then: Callable[[], None]) -> None: ...

    def begin_run(self, kind: Literal["deploy", "drain", "rollback"], release: str | None, *,
                  rollback_of: str | None = None) -> None: ...

    def confirm_proceed(self) -> None: ...

    def confirm_abort(self) -> None: ...

    def confirm_rollback(self, run: RunRecordView) -> None: ...

    def confirm_recovery(self, choice: RecoveryChoice, run: RunView | None = None) -> None: ...

    def confirm_restore_again(self, stranded: tuple[StrandedWorker, ...]) -> None: ...

    def action_pick_release(self) -> None: ...

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None: ...
