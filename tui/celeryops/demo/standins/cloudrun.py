"""A local stand-in for the Cloud Run Admin API (v2), served over real gRPC on 127.0.0.1.

The real ``google-cloud-run`` client talks to it through an insecure channel, so tests and the demo exercise the
same client code as production. It implements:

- ``google.cloud.run.v2.Services``: GetService, UpdateService, TestIamPermissions
- ``google.cloud.run.v2.WorkerPools``: GetWorkerPool, UpdateWorkerPool, TestIamPermissions
- ``google.cloud.run.v2.Revisions``: GetRevision, ListRevisions
- ``google.longrunning.Operations``: GetOperation

This module is the service: what each RPC checks before the resources change (permissions, faults, unknown
resources answer NOT_FOUND, ``allow_missing`` creates a missing resource and needs ``run.*.create``) and the
server; the gRPC method handlers that call it are :mod:`celeryops.demo.standins.cloudrun_grpc`. How updates,
rollouts and splits behave is :mod:`celeryops.demo.standins.cloudrun_model`; names and texts derived as Cloud Run
derives them, and :func:`standin_config`, are :mod:`celeryops.demo.standins.cloudrun_support` (importable from here
too).

Instances: ``launcher`` says what an instance is (e.g. a real Celery worker of the revision, with the environment
Cloud Run sets for the resource's kind); :meth:`~CloudRunStandIn.instances` shows the running ones by revision,
:meth:`~CloudRunStandIn.scale` is a service's autoscaler. When a revision's count drops, the instances taken away are
drawn at random (``rng``), busy or not, SIGTERM then SIGKILL ``grace`` later, as on Cloud Run. See
:mod:`celeryops.demo.standins.cloudrun_instances`.

Faults: :meth:`CloudRunStandIn.grant` limits the permissions (RPCs needing a missing one answer
PERMISSION_DENIED, TestIamPermissions returns only the granted ones); :meth:`~CloudRunStandIn.act_as` limits the
service accounts the caller may act as (an update whose runtime service account is not among them is refused as
Cloud Run refuses a missing ``iam.serviceAccounts.actAs``); :meth:`~CloudRunStandIn.fail_next_rollout` (with
Cloud Run's reason on the revision), :meth:`~CloudRunStandIn.slow_next_rollout`,
:meth:`~CloudRunStandIn.delay_retirement` (old instances taken away later), :meth:`~CloudRunStandIn.race_next_update`
(someone else changes the resource between a read and the next update); :attr:`~CloudRunStandIn.unavailable` makes
every RPC answer UNAVAILABLE, :attr:`~CloudRunStandIn.refusal` makes every RPC answer the given status and message
(e.g. insufficient scopes); :meth:`~CloudRunStandIn.refuse` makes chosen RPCs answer a status, with a
``google.rpc.ErrorInfo`` in its details, for a number of calls (quota: RESOURCE_EXHAUSTED while a rollout is
followed); :meth:`~CloudRunStandIn.disable_api` answers as Cloud Run does when its API is disabled in the project.

Run standalone: ``python -m celeryops.demo.standins.cloudrun --port 8089 --seed-service p/europe-west1/worker=img:1``.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
from google.cloud.run_v2 import (
    GetRevisionRequest,
    GetServiceRequest,
    GetWorkerPoolRequest,
    ListRevisionsRequest,
    ListRevisionsResponse,
    Revision,
    Service,
    UpdateServiceRequest,
    UpdateWorkerPoolRequest,
    WorkerPool,
)
from google.iam.v1 import iam_policy_pb2
from google.longrunning import operations_pb2
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from celeryops.demo.standins.cloudrun_grpc import grpc_handlers
from celeryops.demo.standins.cloudrun_instances import (
    GRACE_SECONDS,
    Instance,
    InstanceLauncher,
    InstanceSpec,
    allocate,
    cloud_run_env,
)
from celeryops.demo.standins.cloudrun_model import CloudRunModel, Refusal, new_resource
from celeryops.demo.standins.cloudrun_running import OnUpdate
from celeryops.demo.standins.cloudrun_support import (
    Failure,
    ResourceRecord,
    default_service_account,
    failure_message,
    iter_conditions,
    project_number,
    project_of,
    region_of,
    standin_config,
)
from celeryops.demo.stopsignal import until_signalled

__all__ = [
    "ALL_PERMISSIONS",
    "CloudRunStandIn",
    "Instance",
    "InstanceLauncher",
    "InstanceSpec",
    "OnUpdate",
    "allocate",
    "cloud_run_env",
    "default_service_account",
    "failure_message",
    "iter_conditions",
    "project_number",
    "standin_config",
]

ALL_PERMISSIONS = frozenset({
    "run.services.get", "run.services.update", "run.services.create",
    "run.workerpools.get", "run.workerpools.update", "run.workerpools.create",
    "run.revisions.get", "run.revisions.list",
    "run.operations.get",
})


@dataclass
class Fault:
    """RPCs (method names, e.g. ``GetOperation``; empty: every one) answer ``code`` and ``message``, with an
    ``ErrorInfo(reason, domain, metadata)`` in the status details when ``reason`` is set, ``times`` more times
    (None: until cleared)."""

    code: grpc.StatusCode
    message: str
    rpcs: frozenset[str] = frozenset()
    times: int | None = None
    reason: str = ""
    domain: str = "googleapis.com"
    metadata: Mapping[str, str] = field(default_factory=dict)

    def status(self) -> status_pb2.Status:
        status = status_pb2.Status(code=self.code.value[0], message=self.message)
        if self.reason:
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.ErrorInfo(reason=self.reason, domain=self.domain, metadata=self.metadata))
            status.details.append(detail)
        return status


class CloudRunStandIn(CloudRunModel):
    """The stand-in server. ``start()`` returns ``127.0.0.1:PORT``; use as a context manager or call ``stop()``.
    ``launcher`` starts an instance (None: instances are bookkeeping only); ``grace``: SIGTERM to SIGKILL; ``rng``
    draws the instances taken away when a revision's count drops (default: unseeded, as unpredictable as Cloud
    Run; pass ``random.Random(seed)`` to replay the same draws)."""

    def __init__(self, *, rollout_seconds: float = 0.3, on_update: OnUpdate | None = None, port: int = 0,
                 host: str = "127.0.0.1", launcher: InstanceLauncher | None = None,
                 grace: float = GRACE_SECONDS, rng: random.Random | None = None) -> None:
        super().__init__(rollout_seconds=rollout_seconds, on_update=on_update, launcher=launcher, grace=grace,
                         rng=rng)
        self.unavailable = False
        self.refusal: tuple[grpc.StatusCode, str] | None = None  # every RPC answers this (e.g. missing scopes)
        self.faults: list[Fault] = []
        self._granted: frozenset[str] = ALL_PERMISSIONS
        self._host = host
        self._port = port
        self._server: grpc.Server | None = None
        self.address = ""

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> str:
        if self._server is not None:
            return self.address
        self._stopping.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="cloudrun-standin"))
        server.add_generic_rpc_handlers(grpc_handlers(self))
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
        self._join_rollouts()

    @property
    def running(self) -> bool:
        return self._server is not None

    def __enter__(self) -> CloudRunStandIn:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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

    def fail_next_rollout(self, resource: str, message: str | None = None, *, reason: str = "",
                          revision_reason: str = "HEALTH_CHECK_CONTAINER_ERROR") -> None:
        """The next update of ``resource`` (full or short name) that makes a revision fails: the revision never
        becomes ready (default message: Cloud Run's own, several lines with a Logs URL). Its Ready condition
        carries ``reason`` (a ``Condition.CommonReason`` name, e.g. ``CONTAINER_MISSING``) or else
        ``revision_reason`` (a ``Condition.RevisionReason`` name)."""
        with self._lock:
            res = self._find(resource)
            res.fail_next = Failure(message or "", reason, "" if reason else revision_reason)

    def delay_retirement(self, resource: str, seconds: float) -> None:
        """From now on, the instances a rollout no longer needs are taken away ``seconds`` after it finished."""
        with self._lock:
            self._find(resource).retire_delay = seconds

    def refuse(self, code: grpc.StatusCode, message: str, *, rpcs: Iterable[str] = (), times: int | None = None,
               reason: str = "", metadata: Mapping[str, str] | None = None) -> Fault:
        """RPCs named in ``rpcs`` (every one when empty) answer ``code`` and ``message`` ``times`` more times (None:
        until :meth:`clear_faults`), with ``ErrorInfo(reason, metadata)`` in the details when ``reason`` is set."""
        fault = Fault(code, message, frozenset(rpcs), times, reason, metadata=dict(metadata or {}))
        with self._lock:
            self.faults.append(fault)
        return fault

    def disable_api(self, project: str) -> Fault:
        """Answer every RPC as Cloud Run does when its Admin API is disabled in ``project``: PERMISSION_DENIED with
        ``ErrorInfo(reason=SERVICE_DISABLED)`` naming the service ``run.googleapis.com``."""
        number = project_number(project)
        url = f"https://console.developers.google.com/apis/api/run.googleapis.com/overview?project={number}"
        return self.refuse(grpc.StatusCode.PERMISSION_DENIED,
                           f"Cloud Run Admin API has not been used in project {number} before or it is disabled. "
                           f"Enable it by visiting {url} then retry. If you enabled this API recently, wait a few "
                           "minutes for the action to propagate to our systems and retry.",
                           reason="SERVICE_DISABLED",
                           metadata={"service": "run.googleapis.com", "consumer": f"projects/{number}",
                                     "serviceTitle": "Cloud Run Admin API", "activationUrl": url,
                                     "containerInfo": str(number)})

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def fault_for(self, rpc: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.rpcs and rpc not in fault.rpcs:
                    continue
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                return fault
        return None

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

    # ------------------------------------------------------------------------------------------ RPC handlers

    def _refused(self) -> None:
        if self.unavailable:
            raise Refusal(grpc.StatusCode.UNAVAILABLE, "The service is currently unavailable.")
        if self.refusal is not None:
            raise Refusal(*self.refusal)

    def _check(self, permission: str, resource: str) -> None:
        self._refused()
        if permission not in self._granted:
            raise Refusal(grpc.StatusCode.PERMISSION_DENIED,
                          f"Permission '{permission}' denied on resource '{resource}' (or it may not exist).")

    def _get(self, name: str, is_service: bool) -> ResourceRecord:
        res = self._resources.get(name)
        if res is None or res.is_service != is_service:
            kind = "Service" if is_service else "WorkerPool"
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"Resource '{name.rsplit('/', 1)[-1]}' of kind "
                          f"'{kind.upper()}' in region '{region_of(name)}' in project '{project_of(name)}' does not "
                          "exist.")
        return res

    def get_service(self, request: GetServiceRequest) -> Service:
        self._check("run.services.get", request.name)
        with self._lock:
            return cast(Service, self._get(request.name, True).snapshot())

    def update_service(self, request: UpdateServiceRequest) -> operations_pb2.Operation:
        return self._update_request(request.service, True, request.allow_missing, request.validate_only)

    def update_worker_pool(self, request: UpdateWorkerPoolRequest) -> operations_pb2.Operation:
        return self._update_request(request.worker_pool, False, request.allow_missing, request.validate_only,
                                    force_new_revision=request.force_new_revision)

    def _update_request(self, new: Any, is_service: bool, allow_missing: bool, validate_only: bool, *,
                        force_new_revision: bool = False) -> operations_pb2.Operation:
        self._check(f"{'run.services' if is_service else 'run.workerpools'}.update", new.name)
        res, created = self._target_of(new.name, is_service, allow_missing)
        op = self._update(res, new, validate_only=validate_only, force_new_revision=force_new_revision,
                          created=created)
        if created and not validate_only:
            with self._lock:
                self._resources[res.name] = res
        return op

    def _target_of(self, name: str, is_service: bool, allow_missing: bool) -> tuple[ResourceRecord, bool]:
        """The resource an update names; with ``allow_missing`` a missing one is made (``True``: kept once the
        update was accepted, unless it was ``validate_only``)."""
        with self._lock:
            if name in self._resources or not allow_missing:
                return self._get(name, is_service), False
            self._check(f"{'run.services' if is_service else 'run.workerpools'}.create", name)
            return new_resource(is_service, name), True

    def get_worker_pool(self, request: GetWorkerPoolRequest) -> WorkerPool:
        self._check("run.workerpools.get", request.name)
        with self._lock:
            return cast(WorkerPool, self._get(request.name, False).snapshot())

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
        raise Refusal(grpc.StatusCode.NOT_FOUND, f"Revision '{request.name.rsplit('/', 1)[-1]}' does not exist.")

    def list_revisions(self, request: ListRevisionsRequest) -> ListRevisionsResponse:
        self._check("run.revisions.list", request.parent)
        with self._lock:
            res = self._resources.get(request.parent)
            if res is None:
                raise Refusal(grpc.StatusCode.NOT_FOUND, f"Resource '{request.parent}' does not exist.")
            newest_first = list(reversed(res.revisions))
            return ListRevisionsResponse(revisions=[Revision.deserialize(Revision.serialize(r))
                                                    for r in newest_first])

    def get_operation(self, request: operations_pb2.GetOperationRequest) -> operations_pb2.Operation:
        self._check("run.operations.get", request.name)
        with self._lock:
            op = self._operations.get(request.name)
            if op is None:
                raise Refusal(grpc.StatusCode.NOT_FOUND, f"Operation '{request.name}' does not exist.")
            return self._operation_pb(op)


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
    stop = until_signalled()
    address = standin.start()
    print(f"Cloud Run stand-in listening on {address} (Ctrl-C to stop)", flush=True)
    try:
        stop()
    finally:
        standin.stop()


if __name__ == "__main__":
    _serve()
