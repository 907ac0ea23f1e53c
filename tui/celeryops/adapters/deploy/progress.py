"""The typed progress events of a rollout (``--json`` event ``deploy``), one class per step: started, routing,
revision, condition, ready, trouble, output. A deployer reports them through a :data:`ProgressCallback`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from celeryops.adapters.deploy.wording import short_revision
from celeryops.core.events import Event

__all__ = ["CommandOutput", "ConditionChanged", "PollTrouble", "ProgressCallback", "ProgressEvent", "RevisionCreated",
           "RolloutEvent", "RolloutReady", "RolloutStarted", "RouteStarted"]


@dataclass(frozen=True)
class RolloutEvent(Event):
    """Rollout progress of one target (``--json`` event ``deploy``): ``step`` names the type (``started``,
    ``revision``, ``condition``, ``ready``, ``trouble``, ``output``); ``text`` is the line a person reads, and
    the typed fields are what programs use."""

    target: str
    step: ClassVar[str] = ""
    kind: str = field(init=False, default="deploy")

    @property
    def text(self) -> str:
        return f"{self.target}: {self.detail}"

    @property
    def detail(self) -> str:
        """What happened, without the target's name (a screen shows it in the target's row)."""
        return ""

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data.update(step=self.step, text=self.text)
        return data


@dataclass(frozen=True)
class RolloutStarted(RolloutEvent):
    """The update was accepted; ``operation`` is Cloud Run's long-running operation (empty for commands)."""

    target: str
    image: str
    operation: str = ""
    previous_revision: str = ""

    step: ClassVar[str] = "started"

    @property
    def detail(self) -> str:
        return f"rolling out {self.image}"


@dataclass(frozen=True)
class RouteStarted(RolloutEvent):
    """An update that routes traffic (a worker pool's instances) to existing revisions was accepted: no new
    revision, no image (a rollback). ``revision``: the revision that gets the largest share (short name);
    ``split``: the whole split in words; ``operation``: Cloud Run's long-running operation."""

    target: str
    revision: str
    split: str = ""
    operation: str = ""
    previous_revision: str = ""

    step: ClassVar[str] = "routing"

    @property
    def detail(self) -> str:
        return f"routing to {self.split or self.revision}" + (
            f" (from {self.previous_revision})" if self.previous_revision else "")


@dataclass(frozen=True)
class RevisionCreated(RolloutEvent):
    target: str
    revision: str

    step: ClassVar[str] = "revision"

    @property
    def detail(self) -> str:
        return f"revision {short_revision(self.revision)} created"


@dataclass(frozen=True)
class ConditionChanged(RolloutEvent):
    """A Cloud Run condition (``Ready``, ``ConfigurationsReady``, ``RoutesReady``) changed state or message."""

    target: str
    condition: str
    state: str  # "succeeded" | "failed" | "reconciling" | "pending" | ""
    message: str = ""  # condensed to one line (see :func:`condense`)
    logs_url: str = ""  # the Logs URL Cloud Run attached to the message, if any

    step: ClassVar[str] = "condition"

    @property
    def detail(self) -> str:
        return f"{self.condition} {self.state}" + (f": {self.message}" if self.message else "")


@dataclass(frozen=True)
class RolloutReady(RolloutEvent):
    target: str
    revision: str

    step: ClassVar[str] = "ready"

    @property
    def detail(self) -> str:
        return f"revision {short_revision(self.revision)} is ready" if self.revision else "done"


@dataclass(frozen=True)
class PollTrouble(RolloutEvent):
    """Polling failed transiently; the deployer keeps trying until its grace period ends."""

    target: str
    message: str

    step: ClassVar[str] = "trouble"

    @property
    def detail(self) -> str:
        return self.message


@dataclass(frozen=True)
class CommandOutput(RolloutEvent):
    """One output line of a command target (passwords in URLs masked)."""

    target: str
    line: str

    step: ClassVar[str] = "output"

    @property
    def detail(self) -> str:
        return self.line


ProgressEvent = (RolloutStarted | RouteStarted | RevisionCreated | ConditionChanged | RolloutReady | PollTrouble
                 | CommandOutput)
ProgressCallback = Callable[[ProgressEvent], None]
