"""A local stand-in for the Cloud Run Admin API (v2), served over real gRPC on 127.0.0.1.

The real ``google-cloud-run`` client talks to it through an insecure channel, so tests and the demo exercise the
same client code as production. It implements:

- ``google.cloud.run.v2.Services``: GetService, UpdateService, TestIamPermissions
- ``google.cloud.run.v2.WorkerPools``: GetWorkerPool, UpdateWorkerPool, TestIamPermissions
- ``google.cloud.run.v2.Revisions``: GetRevision, ListRevisions
- ``google.longrunning.Operations``: GetOperation

An update whose template changed (or, for a worker pool, with ``force_new_revision``) creates a revision named
``<resource>-0000N-abc``; an unchanged template makes none (only the split changes). The resource is marked as
reconciling and a long-running operation is returned whose metadata is the resource being reconciled; after
``rollout_seconds`` (per rollout adjustable) the operation finishes with the resource as response, or, for an
injected failure, with an error while ``latest_ready_revision`` stays the old revision and the terminal condition
carries the message (several lines with a Logs URL, as Cloud Run writes it).

Like Cloud Run, it keeps the split of a service's ``traffic`` (a worker pool's ``instance_splits``) on every
update that sends it back (an empty one means all to the latest revision), checks it (percentages add up to 100,
named revisions exist) and reports what serves in ``traffic_statuses`` / ``instance_split_statuses``: a split
pinned to a named revision keeps the new revision at 0%. ``validate_only`` checks an update (permissions, actAs
on the runtime service account, etag, split) and changes nothing; ``allow_missing`` creates a missing resource
(needs ``run.*.create``); a stale ``etag`` answers ABORTED.

Faults: unknown resources answer NOT_FOUND; :meth:`CloudRunStandIn.grant` limits the permissions (RPCs needing a
missing one answer PERMISSION_DENIED, TestIamPermissions returns only the granted ones);
:meth:`~CloudRunStandIn.act_as` limits the service accounts the caller may act as (an update whose runtime service
account is not among them is refused as Cloud Run refuses a missing ``iam.serviceAccounts.actAs``);
:meth:`~CloudRunStandIn.fail_next_rollout`, :meth:`~CloudRunStandIn.slow_next_rollout`,
:meth:`~CloudRunStandIn.race_next_update` (someone else changes the resource between a read and the next update);
:attr:`~CloudRunStandIn.unavailable` makes every RPC answer UNAVAILABLE, :attr:`~CloudRunStandIn.refusal` makes
every RPC answer the given status and message (e.g. insufficient scopes).

``on_update(resource, revision, image)`` is called (on a background thread) when a rollout that will succeed
starts, before the revision becomes ready: the demo restarts its workers there as "the new revision". If the hook
raises, the rollout fails with the exception's text.

Run standalone: ``python -m celeryops.demo.standins.cloudrun --port 8089 --seed-service p/europe-west1/worker=img:1``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import random
import signal
import string
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast

import grpc
from google.cloud.run_v2 import (
    Condition,
    Container,
    GetRevisionRequest,
    GetServiceRequest,
    GetWorkerPoolRequest,
    InstanceSplit,
    InstanceSplitAllocationType,
    InstanceSplitStatus,
    ListRevisionsRequest,
    ListRevisionsResponse,
    Revision,
    RevisionTemplate,
    Service,
    TrafficTarget,
    TrafficTargetAllocationType,
    TrafficTargetStatus,
    UpdateServiceRequest,
    UpdateWorkerPoolRequest,
    WorkerPool,
    WorkerPoolRevisionTemplate,
)
from google.iam.v1 import iam_policy_pb2
from google.longrunning import operations_pb2
from google.protobuf import any_pb2, timestamp_pb2
from google.rpc import code_pb2, status_pb2

OnUpdate = Callable[[str, str, str], None]

ALL_PERMISSIONS = frozenset({
    "run.services.get", "run.services.update", "run.services.create",
    "run.workerpools.get", "run.workerpools.update", "run.workerpools.create",
    "run.revisions.get", "run.revisions.list",
    "run.operations.get",
})

_State = Condition.State
_LATEST_TRAFFIC = TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST
_LATEST_SPLIT = InstanceSplitAllocationType.INSTANCE_SPLIT_ALLOCATION_TYPE_LATEST
_SERVICE_CONDITIONS = ("ConfigurationsReady", "RoutesReady")
_POOL_CONDITIONS = ("ConfigurationsReady",)


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


def _condition(type_: str, state: Any, message: str = "") -> Condition:
    return Condition(type_=type_, state=state, message=message, last_transition_time=_now())


def project_number(project: str) -> int:
    """A stable 12-digit stand-in for the project's number."""
    return 100000000000 + int(hashlib.sha256(project.encode()).hexdigest()[:12], 16) % 900000000000


def default_service_account(project: str) -> str:
    """The account a revision runs as when its template names none (the default compute service account)."""
    return f"{project_number(project)}-compute@developer.gserviceaccount.com"


def failure_message(short: str, project: str, region: str, resource: str) -> str:
    """A rollout failure as Cloud Run writes it: sentences, a Logs URL, a troubleshooting link, on several lines."""
    return (f"Revision '{short}' is not ready and cannot serve traffic. The user-provided container failed to start "
            "and listen on the port defined provided by the PORT=8080 environment variable within the allocated "
            "timeout. This can happen when the container port is misconfigured or if the timeout is too short. "
            "Logs for this revision might contain more information.\n\n"
            f"Logs URL: https://console.cloud.google.com/logs/viewer?project={project}&resource=cloud_run_revision"
            f"/service_name/{resource}/revision_name/{short}\n"
            "For more troubleshooting guidance, see https://cloud.google.com/run/docs/troubleshooting"
            "#container-failed-to-start")


@dataclass
class _Resource:
    """One service or worker pool and its revisions (the proto-plus message is the stored state)."""

    name: str
    is_service: bool
    message: Any  # Service | WorkerPool
    revisions: list[Revision] = field(default_factory=list)
    counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    fail_next: str | None = None
    next_delay: float | None = None
    busy: bool = False
    race_next: bool = False

    @property
    def short(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def kind(self) -> str:
        return "service" if self.is_service else "worker pool"

    @property
    def permission_prefix(self) -> str:
        return "run.services" if self.is_service else "run.workerpools"

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
        return _project(self.name)

    @property
    def region(self) -> str:
        return _region(self.name)


@dataclass
class _Operation:
    name: str
    resource: _Resource
    done: bool = False
    error: status_pb2.Status | None = None
    preview: Any = None  # validate_only: the resource as the update would make it (nothing was changed)


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class CloudRunStandIn:
    """The stand-in server. ``start()`` returns ``127.0.0.1:PORT``; use as a context manager or call ``stop()``."""

    def __init__(self, *, rollout_seconds: float = 0.3, on_update: OnUpdate | None = None, port: int = 0,
                 host: str = "127.0.0.1") -> None:
        self.rollout_seconds = rollout_seconds
        self.on_update = on_update
        self.unavailable = False
        self.refusal: tuple[grpc.StatusCode, str] | None = None  # every RPC answers this (e.g. missing scopes)
        self.updates: list[tuple[str, str, str]] = []  # (resource, revision, image) of every accepted update
        self.validations: list[str] = []  # resource names of every validate_only update that passed
        self._host = host
        self._port = port
        self._lock = threading.RLock()
        self._resources: dict[str, _Resource] = {}
        self._operations: dict[str, _Operation] = {}
        self._granted: frozenset[str] = ALL_PERMISSIONS
        self._act_as: frozenset[str] | None = None
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: grpc.Server | None = None
        self.address = ""

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> str:
        if self._server is not None:
            return self.address
        self._stopping.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="cloudrun-standin"))
        server.add_generic_rpc_handlers(self._handlers())
        port = server.add_insecure_port(f"{self._host}:{self._port}")
        server.start()
        self._server = server
        self._port = port  # a restart keeps the same port
        self.address = f"{self._host}:{port}"
        return self.address

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        for thread in self._threads:
            thread.join(5)
        self._threads.clear()

    @property
    def running(self) -> bool:
        return self._server is not None

    def __enter__(self) -> CloudRunStandIn:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------ seeding

    def add_service(self, project: str, region: str, name: str, image: str | Iterable[tuple[str, str]]) -> str:
        """Create a ready service with one revision; ``image`` is an image (one container named ``worker``) or
        ``(container, image)`` pairs. Returns its full resource name."""
        return self._add(True, f"projects/{project}/locations/{region}/services/{name}", image)

    def add_worker_pool(self, project: str, region: str, name: str,
                        image: str | Iterable[tuple[str, str]]) -> str:
        """Like :meth:`add_service`, for a worker pool."""
        return self._add(False, f"projects/{project}/locations/{region}/workerPools/{name}", image)

    def _add(self, is_service: bool, name: str, image: str | Iterable[tuple[str, str]]) -> str:
        pairs = [("worker", image)] if isinstance(image, str) else list(image)
        containers = [Container(name=c, image=i) for c, i in pairs]
        if is_service:
            message: Any = Service(name=name, template=RevisionTemplate(containers=containers))
        else:
            message = WorkerPool(name=name, template=WorkerPoolRevisionTemplate(containers=containers))
        message.uid = str(uuid.uuid4())
        message.create_time = _now()
        if is_service:
            message.traffic = [TrafficTarget(type_=_LATEST_TRAFFIC, percent=100)]
            message.uri = f"https://{name.rsplit('/', 1)[-1]}-{project_number(_project(name))}.{_region(name)}.run.app"
        else:
            message.instance_splits = [InstanceSplit(type_=_LATEST_SPLIT, percent=100)]
        res = _Resource(name=name, is_service=is_service, message=message)
        with self._lock:
            self._resources[name] = res
            revision = self._new_revision(res)
            revision.reconciling = False
            revision.conditions = [_condition("Ready", _State.CONDITION_SUCCEEDED)]
            message.generation = 1
            message.observed_generation = 1
            message.latest_created_revision = revision.name
            message.latest_ready_revision = revision.name
            self._settle(res, ok=True, message="")
        return name

    # ------------------------------------------------------------------------------------------ faults and views

    def grant(self, permissions: Iterable[str] | None) -> None:
        """Grant only ``permissions`` from now on (``None``: all of them again)."""
        with self._lock:
            self._granted = ALL_PERMISSIONS if permissions is None else frozenset(permissions)

    def act_as(self, accounts: Iterable[str] | None) -> None:
        """The caller may act as only these service accounts from now on (``None``: as any); an update whose
        runtime service account is not among them answers PERMISSION_DENIED for iam.serviceAccounts.actAs."""
        with self._lock:
            self._act_as = None if accounts is None else frozenset(accounts)

    def race_next_update(self, resource: str) -> None:
        """Someone else changes ``resource`` right before the next update arrives: it carries a stale etag."""
        with self._lock:
            self._find(resource).race_next = True

    def fail_next_rollout(self, resource: str, message: str | None = None) -> None:
        """The next update of ``resource`` (full or short name) fails: its revision never becomes ready (default
        message: Cloud Run's own, several lines with a Logs URL)."""
        with self._lock:
            res = self._find(resource)
            res.fail_next = message or ""

    def slow_next_rollout(self, resource: str, seconds: float) -> None:
        """The next update of ``resource`` takes ``seconds`` to finish instead of ``rollout_seconds``."""
        with self._lock:
            self._find(resource).next_delay = seconds

    def resource(self, name: str) -> Any:
        """A copy of the current Service / WorkerPool (full or short name)."""
        with self._lock:
            return self._find(name).snapshot()

    def revisions(self, name: str) -> list[Revision]:
        """Copies of the resource's revisions, oldest first."""
        with self._lock:
            return [Revision.deserialize(Revision.serialize(r)) for r in self._find(name).revisions]

    def _find(self, name: str) -> _Resource:
        if name in self._resources:
            return self._resources[name]
        matches = [r for r in self._resources.values() if r.short == name]
        if len(matches) != 1:
            raise KeyError(f"no single resource called {name!r}")
        return matches[0]

    # ------------------------------------------------------------------------------------------ state machine

    def _new_revision(self, res: _Resource) -> Revision:
        number = next(res.counter)
        short = res.message.template.revision
        if not short:
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=3))
            short = f"{res.short}-{number:05d}-{suffix}"
        template = res.message.template
        revision = Revision(
            name=f"{res.name}/revisions/{short}",
            uid=str(uuid.uuid4()),
            generation=1,
            create_time=_now(),
            containers=[Container(name=c.name, image=c.image) for c in template.containers],
            reconciling=True,
            conditions=[_condition("Ready", _State.CONDITION_RECONCILING, "Deploying revision.")],
        )
        if res.is_service:
            revision.service = res.short
        res.revisions.append(revision)
        return revision

    def _settle(self, res: _Resource, *, ok: bool, message: str) -> None:
        msg = res.message
        names = _SERVICE_CONDITIONS if res.is_service else _POOL_CONDITIONS
        msg.reconciling = False
        if ok:
            msg.observed_generation = msg.generation
            msg.latest_ready_revision = msg.latest_created_revision
            msg.terminal_condition = _condition("Ready", _State.CONDITION_SUCCEEDED)
            msg.conditions = [_condition(n, _State.CONDITION_SUCCEEDED) for n in names]
            self._route(res)
        else:
            msg.terminal_condition = _condition("Ready", _State.CONDITION_FAILED, message)
            msg.conditions = [_condition("ConfigurationsReady", _State.CONDITION_FAILED, message)] + [
                _condition(n, _State.CONDITION_SUCCEEDED) for n in names[1:]]
        msg.etag = f'"{uuid.uuid4().hex[:12]}"'
        msg.update_time = _now()

    # -- splits: a service's traffic, a worker pool's instance_splits ---------------------------------------------

    @staticmethod
    def _split(res: _Resource, message: Any) -> Any:
        return message.traffic if res.is_service else message.instance_splits

    def _checked_split(self, res: _Resource, new: Any) -> list[Any]:
        """The split an update asks for (empty: all to the latest revision), refused like Cloud Run refuses it."""
        latest_type = _LATEST_TRAFFIC if res.is_service else _LATEST_SPLIT
        entries = list(self._split(res, new))
        if not entries:
            entry_type: Any = TrafficTarget if res.is_service else InstanceSplit
            entries = [entry_type(type_=latest_type, percent=100)]
        field_name = "traffic" if res.is_service else "instance_splits"
        total = sum(e.percent for e in entries)
        if total != 100:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                         f"The percentages in {field_name} of {res.kind} {res.short} add up to {total}, not 100.")
        existing = {r.name.rsplit("/", 1)[-1] for r in res.revisions}
        for entry in entries:
            if entry.type_ != latest_type and entry.revision.rsplit("/", 1)[-1] not in existing:
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                             f"Revision '{entry.revision}' named in {field_name} of {res.kind} {res.short} does not "
                             "exist.")
        return entries

    def _route(self, res: _Resource) -> None:
        """Statuses follow the asked-for split once the resource is ready (the latest entry names its revision)."""
        msg = res.message
        latest = msg.latest_ready_revision.rsplit("/", 1)[-1]
        if res.is_service:
            msg.traffic_statuses = [
                TrafficTargetStatus(type_=e.type_, revision=latest if e.type_ == _LATEST_TRAFFIC else e.revision,
                                    percent=e.percent, tag=e.tag,
                                    uri=msg.uri.replace("https://", f"https://{e.tag}---") if e.tag else "")
                for e in msg.traffic]
        else:
            msg.instance_split_statuses = [
                InstanceSplitStatus(type_=e.type_, revision=latest if e.type_ == _LATEST_SPLIT else e.revision,
                                    percent=e.percent)
                for e in msg.instance_splits]

    def _update(self, res: _Resource, new: Any, *, validate_only: bool = False, force_new_revision: bool = False,
                created: bool = False) -> operations_pb2.Operation:
        with self._lock:
            msg = res.message
            if res.busy:
                raise _Abort(grpc.StatusCode.FAILED_PRECONDITION,
                             f"A rollout of {res.kind} {res.short} is still in progress; retry when it finished.")
            if res.race_next:  # someone else's update lands between the caller's read and this update
                res.race_next = False
                msg.etag = f'"{uuid.uuid4().hex[:12]}"'
            if new.etag and new.etag != msg.etag:
                raise _Abort(grpc.StatusCode.ABORTED,
                             f"The {res.kind} {res.short} was modified since it was read (etag mismatch).")
            fixed = new.template.revision
            if fixed and any(r.name.rsplit("/", 1)[-1] == fixed for r in res.revisions):
                raise _Abort(grpc.StatusCode.ALREADY_EXISTS,
                             f"Revision named '{fixed}' with different configuration already exists.")
            account = new.template.service_account or default_service_account(res.project)
            if self._act_as is not None and account not in self._act_as:
                raise _Abort(grpc.StatusCode.PERMISSION_DENIED,
                             f"Permission 'iam.serviceAccounts.actAs' denied on service account {account} (or it may "
                             "not exist).")
            split = self._checked_split(res, new)
            template_type: Any = RevisionTemplate if res.is_service else WorkerPoolRevisionTemplate
            changed_template = template_type.serialize(new.template) != template_type.serialize(msg.template)
            makes_revision = created or changed_template or force_new_revision
            region, project = res.region, res.project
            op = _Operation(name=f"projects/{project}/locations/{region}/operations/{uuid.uuid4()}", resource=res)
            if validate_only:  # checked; nothing changes
                preview = res.snapshot()
                preview.template = new.template
                if res.is_service:
                    preview.traffic = split
                else:
                    preview.instance_splits = split
                op.done, op.preview = True, preview
                self._operations[op.name] = op
                self.validations.append(res.name)
                return self._operation_pb(op)
            old_images = {c.name: c.image for c in msg.template.containers}
            msg.template = new.template
            if res.is_service:
                msg.traffic = split
            else:
                msg.instance_splits = split
            changed = [c.image for c in msg.template.containers if old_images.get(c.name) != c.image]
            image = changed[0] if changed else (msg.template.containers[0].image if msg.template.containers else "")
            msg.generation = msg.generation + 1
            msg.reconciling = True
            revision = self._new_revision(res) if makes_revision else None
            names = _SERVICE_CONDITIONS if res.is_service else _POOL_CONDITIONS
            short = revision.name.rsplit("/", 1)[-1] if revision else msg.latest_ready_revision.rsplit("/", 1)[-1]
            if revision is not None:
                msg.latest_created_revision = revision.name
                msg.terminal_condition = _condition("Ready", _State.CONDITION_RECONCILING,
                                                    f"Deploying revision {short}.")
                msg.conditions = [_condition("ConfigurationsReady", _State.CONDITION_RECONCILING,
                                             f"Creating revision {short}.")] + [
                    _condition(n, _State.CONDITION_RECONCILING, f"Waiting for revision {short}.") for n in names[1:]]
            else:
                msg.terminal_condition = _condition("Ready", _State.CONDITION_RECONCILING, "Routing traffic.")
            msg.etag = f'"{uuid.uuid4().hex[:12]}"'
            msg.update_time = _now()
            res.busy = True
            failure = res.fail_next if revision is not None else None
            delay = res.next_delay if res.next_delay is not None else self.rollout_seconds
            if revision is not None:
                res.fail_next = None
            res.next_delay = None
            self._operations[op.name] = op
            if revision is not None:
                self.updates.append((res.name, revision.name, image))
            thread = threading.Thread(target=self._rollout, args=(op, revision, image, failure, delay),
                                      name=f"rollout-{short}", daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
            thread.start()
            return self._operation_pb(op)

    def _rollout(self, op: _Operation, revision: Revision | None, image: str, failure: str | None,
                 delay: float) -> None:
        res = op.resource
        if revision is None:  # nothing new to start: only the split changes
            self._stopping.wait(delay)
            with self._lock:
                self._settle(res, ok=True, message="")
                op.done = True
                res.busy = False
            return
        short = revision.name.rsplit("/", 1)[-1]
        if failure is None and self.on_update is not None:
            try:
                self.on_update(op.resource.name, revision.name, image)
            except Exception as exc:  # the hook's failure is the revision's failure
                failure = f"Revision '{short}' is not ready: {exc}"
        self._stopping.wait(delay)
        with self._lock:
            if failure is not None:
                message = failure or failure_message(short, res.project, res.region, res.short)
                revision.reconciling = False
                revision.conditions = [_condition("Ready", _State.CONDITION_FAILED, message)]
                self._settle(res, ok=False, message=message)
                op.error = status_pb2.Status(code=code_pb2.FAILED_PRECONDITION, message=message)
            else:
                revision.reconciling = False
                revision.observed_generation = revision.generation
                revision.conditions = [_condition("Ready", _State.CONDITION_SUCCEEDED)]
                self._settle(res, ok=True, message="")
            op.done = True
            res.busy = False

    def _operation_pb(self, op: _Operation) -> operations_pb2.Operation:
        result = operations_pb2.Operation(name=op.name, done=op.done, metadata=op.resource.pack(op.preview))
        if op.done:
            if op.error is not None:
                result.error.CopyFrom(op.error)
            else:
                result.response.CopyFrom(op.resource.pack(op.preview))
        return result

    # ------------------------------------------------------------------------------------------ RPC handlers

    def _refused(self) -> None:
        if self.unavailable:
            raise _Abort(grpc.StatusCode.UNAVAILABLE, "The service is currently unavailable.")
        if self.refusal is not None:
            raise _Abort(*self.refusal)

    def _check(self, permission: str, resource: str) -> None:
        self._refused()
        if permission not in self._granted:
            raise _Abort(grpc.StatusCode.PERMISSION_DENIED,
                         f"Permission '{permission}' denied on resource '{resource}' (or it may not exist).")

    def _get(self, name: str, is_service: bool) -> _Resource:
        res = self._resources.get(name)
        if res is None or res.is_service != is_service:
            kind = "Service" if is_service else "WorkerPool"
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"Resource '{name.rsplit('/', 1)[-1]}' of kind "
                         f"'{kind.upper()}' in region '{_region(name)}' in project '{_project(name)}' does not exist.")
        return res

    def get_service(self, request: GetServiceRequest) -> Service:
        self._check("run.services.get", request.name)
        with self._lock:
            return cast(Service, self._get(request.name, True).snapshot())

    def update_service(self, request: UpdateServiceRequest) -> operations_pb2.Operation:
        self._check("run.services.update", request.service.name)
        res, created = self._target_of(request.service.name, True, request.allow_missing)
        op = self._update(res, request.service, validate_only=request.validate_only, created=created)
        self._keep(res, created and not request.validate_only)
        return op

    def _keep(self, res: _Resource, created: bool) -> None:
        if created:
            with self._lock:
                self._resources[res.name] = res

    def _target_of(self, name: str, is_service: bool, allow_missing: bool) -> tuple[_Resource, bool]:
        """The resource an update names; with ``allow_missing`` a missing one is made (``True``: kept once the
        update was accepted, unless it was ``validate_only``)."""
        with self._lock:
            if name in self._resources or not allow_missing:
                return self._get(name, is_service), False
            self._check(f"{'run.services' if is_service else 'run.workerpools'}.create", name)
            cls: Any = Service if is_service else WorkerPool
            message = cls(name=name, uid=str(uuid.uuid4()), create_time=_now())
            if is_service:
                message.uri = f"https://{name.rsplit('/', 1)[-1]}-{project_number(_project(name))}.{_region(name)}" \
                              ".run.app"
            return _Resource(name=name, is_service=is_service, message=message), True

    def get_worker_pool(self, request: GetWorkerPoolRequest) -> WorkerPool:
        self._check("run.workerpools.get", request.name)
        with self._lock:
            return cast(WorkerPool, self._get(request.name, False).snapshot())

    def update_worker_pool(self, request: UpdateWorkerPoolRequest) -> operations_pb2.Operation:
        self._check("run.workerpools.update", request.worker_pool.name)
        res, created = self._target_of(request.worker_pool.name, False, request.allow_missing)
        op = self._update(res, request.worker_pool, validate_only=request.validate_only,
                          force_new_revision=request.force_new_revision, created=created)
        self._keep(res, created and not request.validate_only)
        return op

    def test_iam_permissions(self, request: iam_policy_pb2.TestIamPermissionsRequest,
                             is_service: bool) -> iam_policy_pb2.TestIamPermissionsResponse:
        self._refused()
        with self._lock:
            self._get(request.resource, is_service)
            granted = [p for p in request.permissions if p in self._granted]
        return iam_policy_pb2.TestIamPermissionsResponse(permissions=granted)

    def get_revision(self, request: GetRevisionRequest) -> Revision:
        self._check("run.revisions.get", request.name)
        with self._lock:
            for res in self._resources.values():
                for revision in res.revisions:
                    if revision.name == request.name:
                        return cast(Revision, Revision.deserialize(Revision.serialize(revision)))
        raise _Abort(grpc.StatusCode.NOT_FOUND, f"Revision '{request.name.rsplit('/', 1)[-1]}' does not exist.")

    def list_revisions(self, request: ListRevisionsRequest) -> ListRevisionsResponse:
        self._check("run.revisions.list", request.parent)
        with self._lock:
            res = self._resources.get(request.parent)
            if res is None:
                raise _Abort(grpc.StatusCode.NOT_FOUND, f"Resource '{request.parent}' does not exist.")
            newest_first = list(reversed(res.revisions))
            return ListRevisionsResponse(revisions=[Revision.deserialize(Revision.serialize(r))
                                                    for r in newest_first])

    def get_operation(self, request: operations_pb2.GetOperationRequest) -> operations_pb2.Operation:
        self._check("run.operations.get", request.name)
        with self._lock:
            op = self._operations.get(request.name)
            if op is None:
                raise _Abort(grpc.StatusCode.NOT_FOUND, f"Operation '{request.name}' does not exist.")
            return self._operation_pb(op)

    def _handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        def wrap(fn: Callable[[Any], Any]) -> Callable[[Any, grpc.ServicerContext], Any]:
            def handler(request: Any, context: grpc.ServicerContext) -> Any:
                try:
                    return fn(request)
                except _Abort as exc:
                    _abort(context, exc)
            return handler

        def unary(fn: Callable[[Any], Any], request_type: Any, serialize: Callable[[Any], bytes]) -> Any:
            return grpc.unary_unary_rpc_method_handler(wrap(fn), request_deserializer=request_type,
                                                       response_serializer=serialize)

        def pb(message: Any) -> bytes:
            return bytes(message.SerializeToString())

        iam_request = iam_policy_pb2.TestIamPermissionsRequest.FromString
        return (
            grpc.method_handlers_generic_handler("google.cloud.run.v2.Services", {
                "GetService": unary(self.get_service, GetServiceRequest.deserialize, Service.serialize),
                "UpdateService": unary(self.update_service, UpdateServiceRequest.deserialize, pb),
                "TestIamPermissions": unary(lambda r: self.test_iam_permissions(r, True), iam_request, pb),
            }),
            grpc.method_handlers_generic_handler("google.cloud.run.v2.WorkerPools", {
                "GetWorkerPool": unary(self.get_worker_pool, GetWorkerPoolRequest.deserialize, WorkerPool.serialize),
                "UpdateWorkerPool": unary(self.update_worker_pool, UpdateWorkerPoolRequest.deserialize, pb),
                "TestIamPermissions": unary(lambda r: self.test_iam_permissions(r, False), iam_request, pb),
            }),
            grpc.method_handlers_generic_handler("google.cloud.run.v2.Revisions", {
                "GetRevision": unary(self.get_revision, GetRevisionRequest.deserialize, Revision.serialize),
                "ListRevisions": unary(self.list_revisions, ListRevisionsRequest.deserialize,
                                       ListRevisionsResponse.serialize),
            }),
            grpc.method_handlers_generic_handler("google.longrunning.Operations", {
                "GetOperation": unary(self.get_operation, operations_pb2.GetOperationRequest.FromString, pb),
            }),
        )


def _abort(context: grpc.ServicerContext, exc: _Abort) -> NoReturn:
    context.abort(exc.code, exc.message)
    raise AssertionError("unreachable")  # context.abort raises


def _project(name: str) -> str:
    parts = name.split("/")
    return parts[1] if len(parts) > 1 else ""


def _region(name: str) -> str:
    parts = name.split("/")
    return parts[3] if len(parts) > 3 else ""


@dataclass
class _Seed:
    project: str
    region: str
    name: str
    image: str


def _parse_seed(text: str) -> _Seed:
    try:
        path, image = text.split("=", 1)
        project, region, name = path.split("/")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not project/region/name=image") from None
    return _Seed(project, region, name, image)


def _serve(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m celeryops.demo.standins.cloudrun",
                                     description="Local Cloud Run Admin API stand-in (plaintext gRPC, loopback).")
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--rollout-seconds", type=float, default=3.0)
    parser.add_argument("--seed-service", type=_parse_seed, action="append", default=[],
                        metavar="PROJECT/REGION/NAME=IMAGE")
    parser.add_argument("--seed-worker-pool", type=_parse_seed, action="append", default=[],
                        metavar="PROJECT/REGION/NAME=IMAGE")
    args = parser.parse_args(argv)
    standin = CloudRunStandIn(rollout_seconds=args.rollout_seconds, port=args.port)
    for seed in args.seed_service:
        standin.add_service(seed.project, seed.region, seed.name, seed.image)
    for seed in args.seed_worker_pool:
        standin.add_worker_pool(seed.project, seed.region, seed.name, seed.image)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    address = standin.start()
    print(f"Cloud Run stand-in listening on {address} (Ctrl-C to stop)", flush=True)
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        standin.stop()


def iter_conditions(message: Any) -> Iterator[tuple[str, str, str]]:
    """``(type, state name, message)`` of a resource's conditions (a small helper for tests and the demo)."""
    for cond in message.conditions:
        yield cond.type_, Condition.State(cond.state).name, cond.message


if __name__ == "__main__":
    _serve()


def standin_config(*, broker: str, endpoint: str, image: str, interval: float = 0.4, max_wait: float = 60,
                   project: str = "proj", region: str = "europe-west1", resource: str = "worker",
                   name: str = "worker", state_dir: str | None = None, comment: str = "",
                   branches: str | None = None) -> str:
    """A ``celeryops.toml`` whose one target is a Cloud Run service of this stand-in at ``endpoint`` (tests, chaos
    trials, the demo). ``image`` is the template, e.g. ``127.0.0.1:5000/proj/worker:{sha}``."""
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
kind = "cloudrun-service"
project = "{project}"
region = "{region}"
resource = "{resource}"
image = "{image}"
api_endpoint = "{endpoint}"
insecure = true
"""
