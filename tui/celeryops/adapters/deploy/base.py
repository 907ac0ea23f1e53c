"""What every deployer shares: the Deployer protocol, rollout state, results and errors.

The typed progress events live in :mod:`celeryops.adapters.deploy.progress`, and how revisions, splits, logs links,
failure messages and roles are worded in :mod:`celeryops.adapters.deploy.wording`; both are importable from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, Protocol

from celeryops.adapters.deploy.progress import (
    CommandOutput,
    ConditionChanged,
    PollTrouble,
    ProgressCallback,
    ProgressEvent,
    RevisionCreated,
    RolloutEvent,
    RolloutReady,
    RolloutStarted,
    RouteStarted,
)
from celeryops.adapters.deploy.wording import (
    PERMISSION_ROLES,
    REASON_LIMIT,
    REVISION_PERMISSIONS,
    condense,
    describe_split,
    logs_link,
    role_for,
    short_revision,
)
from celeryops.core.config import Target
from celeryops.core.errors import EXIT_DEPLOY, UserError
from celeryops.core.events import DeployedRevision

__all__ = ["PERMISSION_ROLES", "REASON_LIMIT", "REVISION_PERMISSIONS", "CommandOutput", "ConditionChanged",
           "DeployError", "DeployResult", "Deployer", "Outcome", "PollTrouble", "PoolDeployer", "PoolUpdate",
           "ProgressCallback", "ProgressEvent", "RevisionCreated", "RevisionInfo", "RolloutEvent", "RolloutReady",
           "RolloutStarted", "RolloutState", "RouteStarted", "Router", "condense", "describe_split", "logs_link",
           "role_for", "short_revision"]

Outcome = Literal["ready", "failed", "in_progress", "unknown"]
"""What :meth:`Deployer.rollout_outcome` found: the new image serves (``ready``), it does not and nothing is
rolling out (``failed``: the rollout failed or never took effect), a rollout is still going on (``in_progress``),
or the target could not be asked (``unknown``)."""


class DeployError(UserError):
    """A deploy step failed; ``str()`` is one sentence. ``code`` is the API status name (``NOT_FOUND``,
    ``PERMISSION_DENIED``, ``SERVICE_DISABLED``, ``RESOURCE_EXHAUSTED``, ``UNAVAILABLE``, ``ROLLOUT_FAILED``,
    ``TRAFFIC_PINNED``, ``NO_INSTANCES``, ``TIMEOUT``, ``EXIT_STATUS`` ...), ``permission`` the missing IAM permission
    when there is one, ``role`` the role that grants it (with where to grant it), ``logs_url`` the logs link of the
    failure (a failed revision's ``log_uri``; kept out of the sentence)."""

    def __init__(self, message: str, *, code: str = "", permission: str = "", exit_code: int = EXIT_DEPLOY,
                 role: str = "", logs_url: str = "") -> None:
        super().__init__(message, exit_code)
        self.code = code
        self.permission = permission
        self.role = role
        self.logs_url = logs_url


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
    #: The split asked for (a service's ``traffic``, a worker pool's ``instance_splits``) and the split Cloud Run
    #: reports (``traffic_statuses`` / ``instance_split_statuses``): ``(revision, percent)`` pairs, the revision
    #: as its short name, ``""`` for "the latest ready revision". Both empty: not reported (all to the latest).
    traffic: tuple[tuple[str, int], ...] = ()
    traffic_statuses: tuple[tuple[str, int], ...] = ()
    uri: str = ""  # a service's URL
    service_account: str = ""  # the runtime service account of the template ("" = the default one)
    #: How many instances run: a worker pool's ``scaling.manual_instance_count`` (1 when unset, Cloud Run's
    #: default), a service's in manual scaling; None for an autoscaled service (or a state from an older journal).
    instance_count: int | None = None
    #: A worker pool's ``scaling.manual_instance_count`` is set (False: unset, read as Cloud Run's default of 1).
    instance_count_set: bool = True
    #: The split celeryops itself left on the resource (a rollback's, recorded in its ``celeryops/split``
    #: annotation); empty: none. See :attr:`owned`.
    owned_split: tuple[tuple[str, int], ...] = ()
    #: How Cloud Run sizes a worker pool: ``manual`` (``manual_instance_count``, what celeryops sets) or
    #: ``automatic`` (Cloud Run scales it itself: celeryops' autoscaler leaves it alone).
    scaling_mode: str = "manual"
    #: A service's tagged revisions (``(tag, revision short name)``; not the tag of the latest entry): Cloud Run
    #: keeps their revision-level min instances running even at 0% of the traffic.
    tagged: tuple[tuple[str, str], ...] = ()

    @property
    def settled(self) -> bool:
        """Cloud Run's own "done": not reconciling, the newest generation observed, the newest revision ready."""
        return (not self.reconciling and self.observed_generation == self.generation
                and self.latest_ready_revision == self.latest_created_revision)

    @property
    def pinned(self) -> tuple[tuple[str, int], ...]:
        """Entries of the asked-for split that send a share to a named revision instead of the latest: a service
        rolled back in the console keeps them on every update, and the new revision gets what is left."""
        return tuple((rev, pct) for rev, pct in self.traffic if rev and pct > 0)

    @property
    def owned(self) -> bool:
        """The split pins named revisions and is the one celeryops left there itself (a rollback): a deploy may
        route everything to its new revision without ``traffic = "latest"``. A split changed since (in the console,
        by gcloud) is not celeryops' any more."""
        return bool(self.pinned) and _shares(self.owned_split, "") == _shares(self.traffic, "")

    @property
    def caught_up(self) -> bool:
        """Cloud Run has acted on the newest generation (not reconciling): an update that makes no revision (a
        split routed to existing revisions) is done then, whatever the latest created revision's state."""
        return not self.reconciling and self.observed_generation == self.generation

    @property
    def served_split(self) -> tuple[tuple[str, int], ...]:
        """What serves now as Cloud Run reports it: ``(revision, percent)``, the revision by its short name (the
        latest ready one named), largest share first, zero shares left out (:attr:`served` as a split)."""
        return tuple(sorted(self.served.items(), key=lambda entry: (-entry[1], entry[0])))

    @property
    def latest_share(self) -> int:
        """Percent of traffic (a worker pool: of instances) the latest ready revision serves now."""
        if not self.traffic and not self.traffic_statuses:
            return 100
        latest = short_revision(self.latest_ready_revision)
        return sum(pct for rev, pct in self.traffic_statuses if not rev or rev == latest)

    @property
    def served(self) -> dict[str, int]:
        """Revision (short name) -> percent of the traffic (a worker pool: of the instances) served now, the latest
        entry resolved to its revision (all to the latest ready revision when nothing is reported)."""
        latest = short_revision(self.latest_ready_revision)
        out: dict[str, int] = {}
        for rev, pct in self.traffic_statuses or (("", 100),):
            if pct > 0:
                name = short_revision(rev) or latest
                out[name] = out.get(name, 0) + pct
        return out

    @property
    def succeeded(self) -> bool:
        """Settled, and Cloud Run's terminal condition says it succeeded (not merely "not failed")."""
        return self.settled and self.terminal_state == "succeeded"

    @property
    def ready(self) -> bool:
        """Succeeded, and the latest revision serves everything (what the operator expects)."""
        return self.succeeded and self.latest_share == 100

    def serves(self, split: Sequence[tuple[str, int]]) -> bool:
        """Cloud Run reports exactly ``split`` (``(revision, percent)``, ``""`` = the latest ready revision) as
        served, zero shares aside."""
        latest = short_revision(self.latest_ready_revision)
        return _shares(self.traffic_statuses or (("", 100),), latest) == _shares(split or (("", 100),), latest)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, e.g. for the run journal."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutState:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("traffic", "traffic_statuses", "owned_split", "tagged"):
            if key in values and values[key] is not None:
                values[key] = tuple((str(rev), int(pct)) for rev, pct in values[key])
        return cls(**values)


def _shares(split: Sequence[tuple[str, int]], latest: str) -> dict[str, int]:
    """A split as ``{revision: percent}`` (``""`` entries as ``latest``), zero shares left out."""
    out: dict[str, int] = {}
    for rev, pct in split:
        if pct > 0:
            out[rev or latest] = out.get(rev or latest, 0) + pct
    return out


@dataclass(frozen=True)
class RevisionInfo:
    """One revision as Cloud Run reports it: ``name`` (short), its first container's ``image``, its Ready
    condition (``state``, Cloud Run's ``reason`` — a ``CommonReason`` or ``RevisionReason`` name — and ``message``
    condensed to one line), ``log_uri`` (its logs page), ``instances`` (the instances Cloud Run wants it to run,
    0 when not reported) and ``created`` (RFC 3339)."""

    name: str
    image: str = ""
    state: str = ""
    reason: str = ""
    message: str = ""
    log_uri: str = ""
    instances: int = 0
    created: str = ""
    min_instances: int = 0  # the revision's own min instances (a tagged revision keeps them at 0% of the traffic)


@dataclass(frozen=True)
class PoolUpdate:
    """One update of a worker pool, sent whole: a new ``image`` (None: unchanged), the new revision's name named up
    front (``revision``; empty: Cloud Run names it, or no new revision without an image),
    ``instance_count`` (``scaling.manual_instance_count``; None: unchanged) and ``split`` (``(revision, percent)``
    pairs, ``""`` = the latest ready revision, which the new one becomes once ready; None: unchanged).
    ``owned_by``: the split is recorded as celeryops' own, left by ``owned_by`` (``celeryops/split``, as a rollback's
    route does), so a later deploy moves everything to its new revision; empty: a split this update sets is not
    celeryops' own (a recorded one is dropped)."""

    image: str | None = None
    revision: str = ""
    instance_count: int | None = None
    split: tuple[tuple[str, int], ...] | None = None
    owned_by: str = ""


@dataclass(frozen=True)
class DeployResult(DeployedRevision):
    """A finished deploy: ``image`` now serves as ``revision`` (Cloud Run, its full name) on target ``target``;
    ``url`` is a service's URL, ``console_url`` the Cloud console page of the target's revisions, ``logs_url`` the
    revision's logs (all empty for commands); ``operation``: Cloud Run's long-running operation. The same fields as
    the ``target`` event (:meth:`summary`), plus the operation."""

    operation: str = ""

    def summary(self) -> dict[str, str]:
        """What the operator needs at the end of a deploy (the ``targets`` of the final JSON event)."""
        return {"target": self.target, "image": self.image, "revision": short_revision(self.revision),
                "previous_revision": short_revision(self.previous_revision), "url": self.url,
                "console_url": self.console_url, "logs_url": self.logs_url}

    @property
    def text(self) -> str:
        parts = [f"{self.target}: {self.image}"]
        if self.revision:
            parts.append(f"revision {short_revision(self.revision)}")
        if self.url:
            parts.append(self.url)
        if self.console_url:
            parts.append(f"console {self.console_url}")
        if self.logs_url:
            parts.append(f"logs {self.logs_url}")
        return "  ".join(parts)


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

    async def validate(self, target: Target, image: str) -> None:
        """Ask the platform to check the exact update that :meth:`deploy` would send, changing nothing; raises
        DeployError with its refusal (a no-op where the platform cannot check in advance)."""
        ...

    async def close(self) -> None:
        """Release connections held for the run (the deployer can still be used: it reconnects)."""
        ...

    async def rollout_outcome(self, target: Target, started: RolloutState, image: str) -> Outcome:
        """After an interruption: did the rollout of ``image`` begun from state ``started`` take effect?"""
        ...


class Router(Deployer, Protocol):
    """A deployer that can also route a target back to revisions it already has (a rollback): Cloud Run's.
    Implementation: CloudRunDeployer."""

    async def revisions(self, target: Target) -> list[RevisionInfo]:
        """The target's revisions, newest first (raises DeployError when they cannot be listed)."""
        ...

    async def route(self, target: Target, split: tuple[tuple[str, int], ...], on_progress: ProgressCallback, *,
                    by: str = "") -> DeployResult:
        """Route the target to existing revisions (``(short name, percent)``), recorded as celeryops' own split,
        and wait until it serves exactly that; raises DeployError."""
        ...

    async def validate_route(self, target: Target, split: tuple[tuple[str, int], ...]) -> None:
        """Ask the platform to check the update :meth:`route` would send, changing nothing."""
        ...

    async def route_outcome(self, target: Target, split: tuple[tuple[str, int], ...]) -> Outcome:
        """After an interruption: did routing to ``split`` take effect?"""
        ...

    async def missing_revision_permissions(self, target: Target) -> list[str]:
        """Of :data:`REVISION_PERMISSIONS`, those the caller lacks on the target (empty: it may read revisions)."""
        ...


class PoolDeployer(Deployer, Protocol):
    """A deployer that runs a worker pool's revisions side by side (CloudRunDeployer): an overlap deploy's."""

    async def update_worker_pool(self, target: Target, change: PoolUpdate,
                                 on_progress: ProgressCallback) -> DeployResult:
        """One update of the pool (image, the new revision's name, instance count, split), followed until Cloud Run
        serves exactly that split."""
        ...

    async def validate_pool_update(self, target: Target, change: PoolUpdate) -> None:
        """That update with validate_only (nothing changes); raises DeployError with Cloud Run's refusal."""
        ...

    async def revisions(self, target: Target) -> list[RevisionInfo]:
        """The pool's revisions, newest first, with the instances Cloud Run wants each to run."""
        ...

    async def missing_revision_permissions(self, target: Target) -> list[str]:
        """Of :data:`REVISION_PERMISSIONS`, those the caller lacks on the pool (empty: it may read revisions)."""
        ...
