"""What the Cloud Run stand-in keeps about a resource, what it derives as Cloud Run does, and helpers for its users.

:class:`ResourceRecord` is one service or worker pool (its proto-plus message is the stored state) with its
revisions and pending faults; :class:`OperationRecord` is the long-running operation of an update. Derived as
Cloud Run derives them: a project's number and default compute service account, a service's URL, the project
and region in a resource name, a revision's logs link (a service's or a worker pool's log filter), the text of a
failed rollout. For the tests, chaos trials and demo that use the
stand-in: a resource's conditions as plain tuples (:func:`iter_conditions`) and the ``celeryops.toml`` whose
target is a service of the stand-in (:func:`standin_config`).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from google.cloud.run_v2 import Condition, Revision, Service, WorkerPool
from google.protobuf import any_pb2, timestamp_pb2
from google.rpc import status_pb2


def timestamp_now() -> timestamp_pb2.Timestamp:
    """Now, as the timestamps in Cloud Run's messages."""
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


def condition(type_: str, state: Any, message: str = "") -> Condition:
    """A condition of ``type_`` in ``state`` that changed just now."""
    return Condition(type_=type_, state=state, message=message, last_transition_time=timestamp_now())


def project_number(project: str) -> int:
    """A stable 12-digit stand-in for the project's number."""
    return 100000000000 + int(hashlib.sha256(project.encode()).hexdigest()[:12], 16) % 900000000000


def default_service_account(project: str) -> str:
    """The account a revision runs as when its template names none (the default compute service account)."""
    return f"{project_number(project)}-compute@developer.gserviceaccount.com"


def log_uri(name: str, revision: str) -> str:
    """A revision's ``log_uri`` as Cloud Run gives it: the Logs page with the revision's filter, a service's on
    ``cloud_run_revision``, a worker pool's on ``cloud_run_worker_pool`` (``name``: the resource's full name)."""
    short = name.rsplit("/", 1)[-1]
    if "/workerPools/" in name:
        rtype, label = "cloud_run_worker_pool", "worker_pool_name"
    else:
        rtype, label = "cloud_run_revision", "service_name"
    query = "\n".join((f'resource.type="{rtype}"', f'resource.labels.{label}="{short}"',
                       f'resource.labels.location="{region_of(name)}"', f'resource.labels.revision_name="{revision}"'))
    return ("https://console.cloud.google.com/logs/viewer?"
            + urlencode({"project": project_of(name), "resource": f"{rtype}/{label}/{short}/revision_name/{revision}"},
                        safe="/")
            + "&advancedFilter=" + quote(query, safe=""))


def failure_message(short: str, logs: str) -> str:
    """A rollout failure as Cloud Run writes it: sentences, a Logs URL (``logs``, the revision's log_uri), a
    troubleshooting link, on several lines."""
    return (f"Revision '{short}' is not ready and cannot serve traffic. The user-provided container failed to start "
            "and listen on the port defined provided by the PORT=8080 environment variable within the allocated "
            "timeout. This can happen when the container port is misconfigured or if the timeout is too short. "
            "Logs for this revision might contain more information.\n\n"
            f"Logs URL: {logs}\n"
            "For more troubleshooting guidance, see https://cloud.google.com/run/docs/troubleshooting"
            "#container-failed-to-start")


def service_uri(name: str) -> str:
    """The URL Cloud Run gives the service ``name`` (``projects/P/locations/R/services/S``)."""
    return f"https://{name.rsplit('/', 1)[-1]}-{project_number(project_of(name))}.{region_of(name)}.run.app"


def project_of(name: str) -> str:
    """The project of a resource name (``projects/P/...``), ``""`` when it has none."""
    parts = name.split("/")
    return parts[1] if len(parts) > 1 else ""


def region_of(name: str) -> str:
    """The region of a resource name (``projects/P/locations/R/...``), ``""`` when it has none."""
    parts = name.split("/")
    return parts[3] if len(parts) > 3 else ""


@dataclass(frozen=True)
class Failure:
    """How an injected rollout failure reads: the message (``""``: Cloud Run's own, with a Logs URL) and the
    reason on the revision's Ready condition: a ``Condition.CommonReason`` or a ``Condition.RevisionReason`` name."""

    message: str = ""
    reason: str = ""
    revision_reason: str = "HEALTH_CHECK_CONTAINER_ERROR"


@dataclass
class ResourceRecord:
    """One service or worker pool and its revisions (the proto-plus message is the stored state). ``instances``: a
    service's instance total (seeded, or scaled by its autoscaler); ``retire_delay``: how long after a rollout the
    instances it no longer needs are taken away."""

    name: str
    is_service: bool
    message: Any  # Service | WorkerPool
    revisions: list[Revision] = field(default_factory=list)
    counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    fail_next: Failure | None = None
    next_delay: float | None = None
    busy: bool = False
    race_next: bool = False
    instances: int = 1
    retire_delay: float = 0.0

    @property
    def short(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def kind(self) -> str:
        return "service" if self.is_service else "worker pool"

    @property
    def instance_kind(self) -> Any:  # cloudrun_instances.InstanceKind
        return "service" if self.is_service else "worker-pool"

    def snapshot(self) -> Any:
        cls = Service if self.is_service else WorkerPool
        return cls.deserialize(cls.serialize(self.message))

    def pack(self, message: Any = None) -> any_pb2.Any:
        cls = Service if self.is_service else WorkerPool
        packed = any_pb2.Any()
        packed.Pack(cls.pb(message if message is not None else self.snapshot()))
        return packed

    @property
    def project(self) -> str:
        return project_of(self.name)

    @property
    def region(self) -> str:
        return region_of(self.name)


@dataclass
class OperationRecord:
    """A long-running operation of an update (``preview``: the validate_only answer)."""

    name: str
    resource: ResourceRecord
    done: bool = False
    error: status_pb2.Status | None = None
    preview: Any = None  # validate_only: the resource as the update would make it (nothing was changed)


def iter_conditions(message: Any) -> Iterator[tuple[str, str, str]]:
    """``(type, state name, message)`` of a resource's conditions (a small helper for tests and the demo)."""
    for cond in message.conditions:
        yield cond.type_, Condition.State(cond.state).name, cond.message


def standin_config(*, broker: str, endpoint: str, image: str, interval: float = 0.4, max_wait: float = 60,
                   project: str = "proj", region: str = "europe-west1", resource: str = "worker",
                   name: str = "worker", state_dir: str | None = None, comment: str = "",
                   branches: str | None = None, kind: str = "cloudrun-service") -> str:
    """A ``celeryops.toml`` whose one target is a Cloud Run service (``kind``: or worker pool) of this stand-in at
    ``endpoint`` (tests, chaos trials, the demo). ``image`` is the template, e.g.
    ``127.0.0.1:5000/proj/worker:{sha}``."""
    head = f"# {comment}\n" if comment else ""
    state = f'state_dir = "{state_dir}"\n' if state_dir else ""
    pattern = f'branches = "{branches}"\n' if branches else ""
    return f"""{head}broker = "{broker}"
{state}
[drain]
interval = {interval:g}
streak = 2
max_wait = {max_wait:g}

[release]
remote = "origin"
max_age_days = 14
{pattern}
[[targets]]
name = "{name}"
kind = "{kind}"
project = "{project}"
region = "{region}"
resource = "{resource}"
image = "{image}"
api_endpoint = "{endpoint}"
insecure = true
"""
