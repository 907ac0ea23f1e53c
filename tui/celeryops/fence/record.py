"""The fence record (what the operator's run wrote) and the pure decision a worker takes from it.

A fence holds a set of queues (``()`` or ``("*",)`` = every queue a worker consumes) for every worker that is not
exempt by its Cloud Run revision or its configured version; a fence that lists ``only_revisions`` (an overlap deploy:
the old revision's workers stop while the new one's consume) holds only the workers of those revisions, and a record
without that field keeps that meaning: everyone not exempt. No I/O here: the decision is a function of the record
and the worker's identity (:func:`cloud_run_identity` reads it from the environment Cloud Run sets), so it is tested
without Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

ALL_QUEUES = "*"

# What Cloud Run sets in a container (container runtime contract): a worker pool's instances get the pool and its
# revision; a service's get K_SERVICE, K_REVISION and K_CONFIGURATION (services only).
ENV_POOL = "CLOUD_RUN_WORKER_POOL"
ENV_POOL_REVISION = "CLOUD_RUN_WORKER_POOL_REVISION"
ENV_SERVICE = "K_SERVICE"
ENV_REVISION = "K_REVISION"

CloudRunKind = Literal["worker-pool", "service", ""]

#: What this plugin understands beyond the first fence record, reported in its status and registry entry, so the
#: operator's side can tell whether a worker would follow a fence scoped to revisions (``only_revisions``).
FEATURES: tuple[str, ...] = ("only_revisions",)


@dataclass(frozen=True)
class CloudRunIdentity:
    """Where a worker runs on Cloud Run: ``kind`` (``worker-pool``, ``service``, ``""`` outside Cloud Run), the
    pool's or service's ``name`` and the ``revision`` (short name) of the instance."""

    kind: CloudRunKind = ""
    name: str = ""
    revision: str = ""


def cloud_run_identity(environ: Mapping[str, str]) -> CloudRunIdentity:
    """The Cloud Run identity the environment gives: ``CLOUD_RUN_WORKER_POOL_REVISION`` (worker pools) first, else
    ``K_REVISION`` (services); nothing when neither is set."""
    if environ.get(ENV_POOL_REVISION):
        return CloudRunIdentity("worker-pool", environ.get(ENV_POOL) or "", environ[ENV_POOL_REVISION])
    if environ.get(ENV_REVISION):
        return CloudRunIdentity("service", environ.get(ENV_SERVICE) or "", environ[ENV_REVISION])
    return CloudRunIdentity()


#: Where a worker runs, as the doctor needs it (each has its own grace between SIGTERM and SIGKILL): a Cloud Run
#: service or worker pool (10 s), Kubernetes (the pod's terminationGracePeriodSeconds), or ``""``: not recognised.
Platform = Literal["cloudrun-service", "cloudrun-worker-pool", "kubernetes", ""]
ENV_KUBERNETES = "KUBERNETES_SERVICE_HOST"


def platform_of(environ: Mapping[str, str]) -> Platform:
    """The platform the environment says: ``CLOUD_RUN_WORKER_POOL`` (a worker pool), ``K_SERVICE`` (a service),
    ``KUBERNETES_SERVICE_HOST`` (any pod); ``""`` when none is set."""
    if environ.get(ENV_POOL):
        return "cloudrun-worker-pool"
    if environ.get(ENV_SERVICE):
        return "cloudrun-service"
    if environ.get(ENV_KUBERNETES):
        return "kubernetes"
    return ""


@dataclass(frozen=True)
class FenceRecord:
    """One fence as stored in Redis. Timestamps are Redis TIME (seconds); ``ttl`` is the remaining life in seconds
    when it was read (None: unknown or no expiry)."""

    run_id: str
    queues: tuple[str, ...] = ()
    exempt_revisions: tuple[str, ...] = ()
    exempt_versions: tuple[str, ...] = ()
    only_revisions: tuple[str, ...] = ()  # non-empty: only workers of these Cloud Run revisions are held
    owner: str = ""
    created: float = 0.0
    renewed: float = 0.0
    ttl: float | None = None

    @property
    def holds_all(self) -> bool:
        return not self.queues or ALL_QUEUES in self.queues

    def exempts(self, revision: str | None, version: str | None) -> bool:
        return bool((revision and revision in self.exempt_revisions) or (version and version in self.exempt_versions))

    def holds_revision(self, revision: str | None) -> bool:
        """Whether the fence's scope takes in a worker of ``revision`` (every worker when it lists no revision)."""
        return not self.only_revisions or bool(revision and revision in self.only_revisions)

    def hold_for(self, revision: str | None, version: str | None) -> Hold | None:
        """What a worker with this identity must hold (None: it consumes normally)."""
        if self.exempts(revision, version) or not self.holds_revision(revision):
            return None
        return Hold(run_id=self.run_id, queues=None if self.holds_all else frozenset(self.queues))

    def to_dict(self) -> dict[str, object]:
        return {
            "run_id": self.run_id, "queues": list(self.queues), "exempt_revisions": list(self.exempt_revisions),
            "exempt_versions": list(self.exempt_versions), "only_revisions": list(self.only_revisions),
            "owner": self.owner, "created": self.created,
            "renewed": self.renewed, "ttl": self.ttl,
        }

    @classmethod
    def from_hash(cls, fields: Mapping[str, str], pttl_ms: int | None) -> FenceRecord:
        """Build from the Redis hash (values already decoded to ``str``) and its PTTL."""
        return cls(
            run_id=fields.get("run_id", ""),
            queues=_str_tuple(fields.get("queues")),
            exempt_revisions=_str_tuple(fields.get("exempt_revisions")),
            exempt_versions=_str_tuple(fields.get("exempt_versions")),
            only_revisions=_str_tuple(fields.get("only_revisions")),
            owner=fields.get("owner", ""),
            created=_float(fields.get("created")),
            renewed=_float(fields.get("renewed")),
            ttl=pttl_ms / 1000.0 if pttl_ms is not None and pttl_ms >= 0 else None,
        )


@dataclass(frozen=True)
class Hold:
    """A worker's duty under a fence: stop ``queues`` (None: every queue it consumes). ``run_id`` is empty when the
    hold comes from not being able to read the fence at all (fail closed)."""

    run_id: str
    queues: frozenset[str] | None

    def selects(self, consumed: Iterable[str]) -> set[str]:
        """The queues, among those the worker consumes now, that this hold stops."""
        names = set(consumed)
        return names if self.queues is None else names & self.queues


UNKNOWN_HOLD = Hold(run_id="", queues=None)


def _str_tuple(raw: str | None) -> tuple[str, ...]:
    if not raw:
        return ()
    try:
        value = json.loads(raw)
    except ValueError:
        return ()
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return ()


def _float(raw: str | None) -> float:
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        return 0.0


def decode(value: bytes | str | None) -> str | None:
    """Redis replies as text whatever ``decode_responses`` the caller's client uses."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
