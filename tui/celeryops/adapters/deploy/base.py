"""What every deployer shares: the Deployer protocol, rollout state, typed progress events, results and errors."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal, Protocol

from celeryops.core.config import Target
from celeryops.core.errors import EXIT_DEPLOY, UserError
from celeryops.core.events import Event

Outcome = Literal["ready", "failed", "in_progress", "unknown"]
"""What :meth:`Deployer.rollout_outcome` found: the new image serves (``ready``), it does not and nothing is
rolling out (``failed``: the rollout failed or never took effect), a rollout is still going on (``in_progress``),
or the target could not be asked (``unknown``)."""


class DeployError(UserError):
    """A deploy step failed; ``str()`` is one sentence. ``code`` is the API status name (``NOT_FOUND``,
    ``PERMISSION_DENIED``, ``UNAVAILABLE``, ``ROLLOUT_FAILED``, ``TIMEOUT``, ``EXIT_STATUS`` ...),
    ``permission`` the missing IAM permission when there is one."""

    def __init__(self, message: str, *, code: str = "", permission: str = "", exit_code: int = EXIT_DEPLOY) -> None:
        super().__init__(message, exit_code)
        self.code = code
        self.permission = permission


@dataclass(frozen=True)
class RolloutState:
    """A target's rollout as Cloud Run reports it (for a command target only ``resource`` is known)."""

    resource: str
    generation: int = 0
    observed_generation: int = 0
    reconciling: bool = False
    latest_created_revision: str = ""
    latest_ready_revision: str = ""
    image: str = ""
    terminal_state: str = ""  # "succeeded" | "failed" | "reconciling" | "pending" | ""
    terminal_message: str = ""

    @property
    def settled(self) -> bool:
        """Cloud Run's own "done": not reconciling, the newest generation observed, the newest revision ready."""
        return (not self.reconciling and self.observed_generation == self.generation
                and self.latest_ready_revision == self.latest_created_revision)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, e.g. for the run journal."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutState:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def short_revision(name: str) -> str:
    """``projects/.../revisions/worker-00002-abc`` -> ``worker-00002-abc``."""
    return name.rsplit("/", 1)[-1]


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
    message: str = ""

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


ProgressEvent = RolloutStarted | RevisionCreated | ConditionChanged | RolloutReady | PollTrouble | CommandOutput
ProgressCallback = Callable[[ProgressEvent], None]


@dataclass(frozen=True)
class DeployResult:
    """A finished deploy: the image now serves as ``revision`` (Cloud Run) on target ``target``."""

    target: str
    image: str
    revision: str = ""
    previous_revision: str = ""
    operation: str = ""


class Deployer(Protocol):
    """Rolls an image out to a target. Implementations: CloudRunDeployer, CommandDeployer."""

    async def current(self, target: Target) -> RolloutState:
        """The target's rollout state now (raises DeployError when it cannot be read)."""
        ...

    async def deploy(self, target: Target, image: str, on_progress: ProgressCallback, *, sha: str = "",
                     release: str = "") -> DeployResult:
        """Roll ``image`` out and wait until it serves; raises DeployError with the platform's own message."""
        ...

    async def missing_permissions(self, target: Target) -> list[str]:
        """IAM permissions the deploy needs and the caller lacks (empty: all granted)."""
        ...

    async def rollout_outcome(self, target: Target, started: RolloutState, image: str) -> Outcome:
        """After an interruption: did the rollout of ``image`` begun from state ``started`` take effect?"""
        ...
