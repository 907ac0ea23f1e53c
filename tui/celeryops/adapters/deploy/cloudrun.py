"""Deploy to Cloud Run services and worker pools with the async google-cloud-run clients.

The image of one container (``container`` in the target, default the first) is replaced, the resource is
updated, and the long-running operation is polled in our own loop (never ``result()``), so every poll becomes
typed progress events from the operation's metadata. The rollout is done when Cloud Run says so (not
reconciling, ``observed_generation == generation``, ``latest_ready_revision == latest_created_revision``) **and**
the new revision serves what the operator expects: all traffic (a worker pool: all instances) goes to the latest
revision, compared on ``traffic_statuses`` / ``instance_split_statuses``. A split that pins older revisions (a
rollback in the console) is refused before anything changes unless the target says ``traffic = "latest"``, which
routes everything to the new revision in the same update.

:meth:`CloudRunDeployer.validate` sends that exact update with ``validate_only=True``: Cloud Run checks it
(permissions such as actAs on the runtime service account included) and changes nothing.

Credentials (application default credentials) are resolved once per deployer, off the event loop, and refreshed
once there so that missing, expired or revoked credentials are one sentence; each target gets one channel for
the deployer's life (:meth:`CloudRunDeployer.close` closes them). A target with ``api_endpoint`` and
``insecure = true`` (loopback only) gets a plaintext channel to a local stand-in and no credentials.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.api_core import exceptions as gexc
from google.api_core.retry import AsyncRetry, if_exception_type
from google.cloud.run_v2 import (
    Condition,
    InstanceSplit,
    InstanceSplitAllocationType,
    Service,
    ServicesAsyncClient,
    TrafficTarget,
    TrafficTargetAllocationType,
    UpdateServiceRequest,
    UpdateWorkerPoolRequest,
    WorkerPool,
    WorkerPoolsAsyncClient,
)
from google.cloud.run_v2.services.services.transports import ServicesGrpcAsyncIOTransport
from google.cloud.run_v2.services.worker_pools.transports import WorkerPoolsGrpcAsyncIOTransport
from google.longrunning import operations_pb2

from celeryops.adapters.deploy.base import (
    ConditionChanged,
    DeployError,
    DeployResult,
    Outcome,
    PollTrouble,
    ProgressCallback,
    RevisionCreated,
    RolloutReady,
    RolloutStarted,
    RolloutState,
    condense,
    describe_split,
    role_for,
    short_revision,
)
from celeryops.core.config import Target, is_loopback_endpoint
from celeryops.core.errors import EXIT_TIMEOUT
from celeryops.core.masking import mask_text

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
DEFAULT_ENDPOINT = "run.googleapis.com"
_STATE_NAMES = {
    Condition.State.CONDITION_SUCCEEDED: "succeeded",
    Condition.State.CONDITION_FAILED: "failed",
    Condition.State.CONDITION_RECONCILING: "reconciling",
    Condition.State.CONDITION_PENDING: "pending",
}
_TRANSIENT = (gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.RetryError)
_LATEST_TRAFFIC = TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST
_LATEST_SPLIT = InstanceSplitAllocationType.INSTANCE_SPLIT_ALLOCATION_TYPE_LATEST
_REDEPLOY_LABEL = "celeryops-redeploy"
_AUTH_PLUGIN_FAILURE = re.compile(r"Getting metadata from plugin failed|invalid_grant|RefreshError", re.I)
_SCOPES_FAILURE = re.compile(r"insufficient authentication scopes|ACCESS_TOKEN_SCOPE_INSUFFICIENT", re.I)
_ACCOUNT = re.compile(r"service ?account[: ]+'?([\w.@-]+@[\w.-]+?)'?(?:[\s,;)]|\.?$)", re.I)


@dataclass
class CloudRunClients:
    """The two async clients a deploy uses, sharing one channel (``channel``)."""

    services: ServicesAsyncClient
    worker_pools: WorkerPoolsAsyncClient
    channel: Any = None

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            return
        for client in (self.services, self.worker_pools):
            await client.transport.close()  # type: ignore[no-untyped-call]


ClientFactory = Callable[[Target, Any], CloudRunClients]
"""``(target, credentials) -> clients``; called inside the running event loop (``credentials`` is None for a
loopback stand-in)."""


def default_clients(target: Target, credentials: Any = None) -> CloudRunClients:
    """Clients for ``target`` on one channel; call inside the running event loop (grpc.aio channels bind to it)."""
    if target.insecure:
        if not target.api_endpoint or not is_loopback_endpoint(target.api_endpoint):
            raise DeployError(f"Target {target.name!r} asks for a plaintext connection to "
                              f"{target.api_endpoint or 'Google'}, which is not a loopback address: nothing was "
                              "contacted; insecure = true is only for a local stand-in.", code="INSECURE")
        channel = grpc.aio.insecure_channel(target.api_endpoint)
    else:
        channel = ServicesGrpcAsyncIOTransport.create_channel(target.api_endpoint or DEFAULT_ENDPOINT,
                                                              credentials=credentials, scopes=SCOPES)
    return CloudRunClients(
        services=ServicesAsyncClient(transport=ServicesGrpcAsyncIOTransport(channel=channel)),
        worker_pools=WorkerPoolsAsyncClient(transport=WorkerPoolsGrpcAsyncIOTransport(channel=channel)),
        channel=channel,
    )


def resolve_credentials() -> Any:
    """Application default credentials, refreshed once (blocking: run it in a thread). Raises DeployError with
    one sentence when there are none, when they are expired or revoked, or when the token endpoint is
    unreachable."""
    import google.auth
    from google.auth import exceptions as auth_exc
    from google.auth.transport.requests import Request

    try:
        credentials, _project = google.auth.default(scopes=list(SCOPES))
    except auth_exc.DefaultCredentialsError:
        raise DeployError("No Google credentials were found: nothing was deployed; run `gcloud auth "
                          "application-default login` (or, in CI, set up workload identity federation or "
                          "GOOGLE_APPLICATION_CREDENTIALS).", code="UNAUTHENTICATED") from None
    try:
        credentials.refresh(Request())  # type: ignore[no-untyped-call]
    except auth_exc.RefreshError as exc:
        reason = _refresh_reason(exc)
        raise DeployError(f"Google refused to refresh the credentials ({reason}): nothing was deployed; they are "
                          "expired or revoked, so log in again with `gcloud auth application-default login` (in CI: "
                          "check the workload identity provider and service account).",
                          code="UNAUTHENTICATED") from None
    except auth_exc.TransportError as exc:
        raise DeployError(f"Google's token endpoint could not be reached to refresh the credentials "
                          f"({mask_text(' '.join(str(exc).split()))[:200]}): nothing was deployed; check the network "
                          "and try again.", code="UNAVAILABLE") from None
    return credentials


def _refresh_reason(exc: BaseException) -> str:
    args = exc.args
    text = str(args[0]) if args else str(exc)
    return mask_text(" ".join(text.split()))[:200].rstrip(".:; ") or type(exc).__name__


def state_of(target: Target, resource: Any) -> RolloutState:
    """A Service / WorkerPool message as a RolloutState (image: the target's container)."""
    containers = list(resource.template.containers)
    image = ""
    if containers:
        chosen = [c for c in containers if c.name == target.container] if target.container else containers[:1]
        image = chosen[0].image if chosen else ""
    cond = resource.terminal_condition
    if isinstance(resource, Service):
        asked, seen, uri = resource.traffic, resource.traffic_statuses, resource.uri
        latest_type: Any = _LATEST_TRAFFIC
    else:
        asked, seen, uri = resource.instance_splits, resource.instance_split_statuses, ""
        latest_type = _LATEST_SPLIT
    return RolloutState(
        resource=resource.name or target.resource_path,
        generation=int(resource.generation),
        observed_generation=int(resource.observed_generation),
        reconciling=bool(resource.reconciling),
        latest_created_revision=resource.latest_created_revision,
        latest_ready_revision=resource.latest_ready_revision,
        image=image,
        terminal_state=_STATE_NAMES.get(cond.state, ""),
        terminal_message=condense(cond.message)[0] if cond.message else "",
        traffic=tuple(_split_entry(e, latest_type) for e in asked),
        traffic_statuses=tuple(_split_entry(e, latest_type) for e in seen),
        uri=uri,
        service_account=resource.template.service_account,
    )


def _split_entry(entry: Any, latest_type: Any) -> tuple[str, int]:
    """A TrafficTarget(Status) / InstanceSplit(Status) as ``(short revision, percent)``, ``""`` for the entry
    that follows the latest ready revision (its status may name that revision too)."""
    if entry.type_ == latest_type:
        return "", int(entry.percent)
    return short_revision(entry.revision), int(entry.percent)


class CloudRunDeployer:
    """Deployer for ``cloudrun-service`` and ``cloudrun-worker-pool`` targets.

    ``clients``: the client factory (default :func:`default_clients`). Clients are made once per target and kept
    until :meth:`close`. ``poll_interval``: seconds between operation polls. ``rpc_timeout``: per-call timeout.
    ``outcome_timeout``: how long :meth:`rollout_outcome` waits before answering ``unknown``.
    ``poll_grace``: how long polling may fail transiently before the deploy gives up.
    ``read_retry``: how long reads retry UNAVAILABLE (instead of the library's ~10 s default).
    ``credentials``: a callable returning credentials (default :func:`resolve_credentials`), run in a thread once."""

    def __init__(self, clients: ClientFactory | None = None, *, poll_interval: float = 2.0,
                 rpc_timeout: float = 15.0, outcome_timeout: float = 5.0, poll_grace: float = 60.0,
                 read_retry: float = 5.0, credentials: Callable[[], Any] | None = None) -> None:
        self._factory = clients or default_clients
        self._resolve = credentials or resolve_credentials
        self.poll_interval = poll_interval
        self.rpc_timeout = rpc_timeout
        self.outcome_timeout = outcome_timeout
        self.poll_grace = poll_grace
        self.read_retry = read_retry
        self.credential_lookups = 0  # how often credentials were resolved (once per deployer)
        self._credentials: Any = None
        self._credentials_lock: asyncio.Lock | None = None
        self._cache: dict[tuple[str, str, bool], CloudRunClients] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------------------------------ public API

    async def current(self, target: Target) -> RolloutState:
        clients = await self._clients(target)
        return state_of(target, await self._get(clients, target, self._read_retry(), self.rpc_timeout))

    async def missing_permissions(self, target: Target) -> list[str]:
        """Of ``run.services.get/update`` (worker pools: ``run.workerpools.*``) and ``run.operations.get``, those
        the caller lacks on the resource (actAs on the runtime service account is found by :meth:`validate`)."""
        prefix = "run.services" if target.kind == "cloudrun-service" else "run.workerpools"
        wanted = [f"{prefix}.get", f"{prefix}.update", "run.operations.get"]
        clients = await self._clients(target)
        client = clients.services if target.kind == "cloudrun-service" else clients.worker_pools
        try:
            reply = await client.test_iam_permissions(
                request={"resource": target.resource_path, "permissions": wanted},
                retry=self._read_retry(), timeout=self.rpc_timeout)
        except gexc.GoogleAPICallError as exc:
            raise api_error(target, exc, "check permissions on", f"{prefix}.get") from None
        except gexc.RetryError as exc:
            raise unavailable_error(target, exc, "check permissions on") from None
        granted = set(reply.permissions)
        return [p for p in wanted if p not in granted]

    async def validate(self, target: Target, image: str) -> None:
        """Send the update :meth:`deploy` would send with ``validate_only=True``: Cloud Run checks it (actAs on
        the runtime service account included) and changes nothing. Raises DeployError with its refusal, or when
        a rollout is in progress (a pinned split is not refused here: see ``traffic_check``)."""
        clients = await self._clients(target)
        resource = await self._get(clients, target, self._read_retry(), self.rpc_timeout)
        before = state_of(target, resource)
        self._refuse_unready(target, before, traffic=False)  # a pinned split is the traffic check's finding
        self._prepare(target, resource, image, before)
        await self._update(clients, target, resource, validate_only=True)

    async def rollout_outcome(self, target: Target, started: RolloutState, image: str) -> Outcome:
        """Judged on the target's state now: reconciling -> ``in_progress``; settled with ``image`` in the chosen
        container and all traffic (instances) on the latest revision -> ``ready``; anything else (failed revision,
        the update never took effect, or the new revision is ready but a pinned split keeps the old one serving)
        -> ``failed``; no answer within ``outcome_timeout`` (no retries), not found or denied -> ``unknown``."""
        try:
            clients = await self._clients(target)
            resource = await self._get(clients, target, None, self.outcome_timeout)
        except DeployError:
            return "unknown"
        now = state_of(target, resource)
        if now.reconciling:
            return "in_progress"
        if now.image == image and now.ready:
            return "ready"
        return "failed"

    async def deploy(self, target: Target, image: str, on_progress: ProgressCallback, *, sha: str = "",
                     release: str = "") -> DeployResult:
        clients = await self._clients(target)
        for _attempt in range(3):  # ABORTED: changed by someone else between read and update; read again
            resource = await self._get(clients, target, self._read_retry(), self.rpc_timeout)
            before = state_of(target, resource)
            self._refuse_unready(target, before)
            self._prepare(target, resource, image, before)
            try:
                operation = await self._update(clients, target, resource)
            except DeployError as err:
                if err.code == "ABORTED":
                    continue
                raise
            break
        else:
            raise DeployError(f"{target.display} kept being changed by someone else while celeryops updated it "
                              "(etag mismatch three times): nothing was changed by this deploy; find out who else "
                              "deploys it and deploy again.", code="ABORTED")
        on_progress(RolloutStarted(target.name, image, operation, before.latest_ready_revision))
        return await self._watch(clients, target, image, operation, before, on_progress)

    async def close(self) -> None:
        """Close every channel this deployer opened (it opens new ones if it is used again)."""
        cached, self._cache = list(self._cache.values()), {}
        if self._loop is not asyncio.get_running_loop():
            return  # channels of another (closed) loop cannot be closed from here
        for clients in cached:
            await clients.close()

    # ------------------------------------------------------------------------------------------ internals

    async def _clients(self, target: Target) -> CloudRunClients:
        if not target.is_cloudrun:
            raise DeployError(f"Target {target.name!r} is a {target.kind} target, not a Cloud Run one: nothing was "
                              "deployed.", code="KIND")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # grpc.aio channels belong to one loop
            self._cache, self._loop, self._credentials_lock = {}, loop, None
        key = (target.name, target.api_endpoint, target.insecure)
        if key not in self._cache:
            credentials = None if target.insecure else await self._credentials_once()
            self._cache[key] = self._factory(target, credentials)
        return self._cache[key]

    async def _credentials_once(self) -> Any:
        if self._credentials_lock is None:
            self._credentials_lock = asyncio.Lock()
        async with self._credentials_lock:
            if self._credentials is None:
                self.credential_lookups += 1
                self._credentials = await asyncio.to_thread(self._resolve)
            return self._credentials

    def _read_retry(self) -> AsyncRetry:
        """Reads retry UNAVAILABLE briefly (not the library's ~10 s default ladder)."""
        return AsyncRetry(predicate=if_exception_type(gexc.ServiceUnavailable), initial=0.2, maximum=1.0,
                          multiplier=2.0, timeout=self.read_retry)

    def _refuse_unready(self, target: Target, before: RolloutState, *, traffic: bool = True) -> None:
        if before.reconciling:
            raise DeployError(f"{target.display} is still rolling out revision "
                              f"{short_revision(before.latest_created_revision)}: nothing was changed; wait "
                              "until it finished and deploy again.", code="BUSY")
        if traffic and before.pinned and target.traffic != "latest":
            raise traffic_pinned(target, before)

    def _prepare(self, target: Target, resource: Any, image: str, before: RolloutState) -> None:
        """The update: the image; all traffic to the latest revision when the target asks for it (tagged
        revisions keep their tags at 0%); a label that forces a new revision when the image is unchanged (a
        service has no force_new_revision, and Cloud Run makes no revision for an unchanged template)."""
        unchanged = before.image == image
        _set_image(target, resource, image)
        if target.traffic == "latest":
            if isinstance(resource, Service):
                tagged = [TrafficTarget(type_=t.type_, revision=t.revision, percent=0, tag=t.tag)
                          for t in resource.traffic if t.tag and t.revision and t.type_ != _LATEST_TRAFFIC]
                latest_tag = next((t.tag for t in resource.traffic if t.type_ == _LATEST_TRAFFIC and t.tag), "")
                resource.traffic = [TrafficTarget(type_=_LATEST_TRAFFIC, percent=100, tag=latest_tag), *tagged]
            else:
                resource.instance_splits = [InstanceSplit(type_=_LATEST_SPLIT, percent=100)]
        if unchanged and isinstance(resource, Service):
            resource.template.labels[_REDEPLOY_LABEL] = uuid.uuid4().hex[:12]

    async def _get(self, clients: CloudRunClients, target: Target, retry: AsyncRetry | None,
                   timeout: float) -> Any:
        try:
            if target.kind == "cloudrun-service":
                return await clients.services.get_service(name=target.resource_path, retry=retry, timeout=timeout)
            return await clients.worker_pools.get_worker_pool(name=target.resource_path, retry=retry,
                                                              timeout=timeout)
        except gexc.GoogleAPICallError as exc:
            raise api_error(target, exc, "read", _permission(target, "get")) from None
        except gexc.RetryError as exc:
            raise unavailable_error(target, exc, "read") from None

    async def _update(self, clients: CloudRunClients, target: Target, resource: Any, *,
                      validate_only: bool = False) -> str:
        doing = "validate an update of" if validate_only else "update"
        try:
            if target.kind == "cloudrun-service":
                op = await clients.services.update_service(
                    request=UpdateServiceRequest(service=resource, validate_only=validate_only), retry=None,
                    timeout=self.rpc_timeout)
            else:  # a worker pool gets a new revision (fresh workers) even when nothing else changed
                op = await clients.worker_pools.update_worker_pool(
                    request=UpdateWorkerPoolRequest(worker_pool=resource, validate_only=validate_only,
                                                    force_new_revision=True), retry=None, timeout=self.rpc_timeout)
        except gexc.Aborted as exc:
            raise DeployError(f"{target.display} was changed by someone else while celeryops updated it "
                              f"({_message(exc)}): nothing was changed by this deploy; deploy again.",
                              code="ABORTED") from None
        except (gexc.ServiceUnavailable, gexc.DeadlineExceeded) as exc:
            if _AUTH_PLUGIN_FAILURE.search(str(exc.message)):
                raise api_error(target, exc, doing, _permission(target, "update")) from None
            if validate_only:
                raise unavailable_error(target, exc, doing) from None
            raise DeployError(f"The Cloud Run API did not answer the update of {target.display} ({_message(exc)}): "
                              "the new image may or may not have been accepted; check the service before "
                              "deploying again.", code=_code(exc)) from None
        except gexc.GoogleAPICallError as exc:
            raise api_error(target, exc, doing, _permission(target, "update"),
                            service_account=resource.template.service_account) from None
        if validate_only and op.operation.done and op.operation.HasField("error"):
            reason, logs_url = condense(op.operation.error.message)
            raise DeployError(f"Cloud Run refused the update of {target.display} (validate only): {reason}: nothing "
                              "was changed; fix the cause and try again.", code="INVALID", logs_url=logs_url)
        return str(op.operation.name)

    async def _watch(self, clients: CloudRunClients, target: Target, image: str, operation: str,
                     before: RolloutState, on_progress: ProgressCallback) -> DeployResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + target.timeout
        tracker = _Tracker(target.name, before, on_progress)
        ops = clients.services if target.kind == "cloudrun-service" else clients.worker_pools
        message_type: Any = Service if target.kind == "cloudrun-service" else WorkerPool
        trouble_since: float | None = None
        op_done = False
        while True:
            try:
                if not op_done:
                    raw = await ops.get_operation(operations_pb2.GetOperationRequest(name=operation), retry=None,
                                                  timeout=self.rpc_timeout)
                    if raw.HasField("metadata"):
                        tracker.observe(message_type.deserialize(raw.metadata.value))
                    if raw.done and raw.HasField("error"):
                        raise rollout_failed(target, image, before, raw.error.message or "no message")
                    op_done = bool(raw.done)
                    resource = message_type.deserialize(raw.response.value) if op_done else None
                else:  # the operation finished; wait for the resource itself to settle
                    resource = await self._get(clients, target, None, self.rpc_timeout)
                trouble_since = None
            except (*_TRANSIENT, DeployError, gexc.GoogleAPICallError) as exc:
                if isinstance(exc, DeployError) and exc.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    raise
                if isinstance(exc, gexc.GoogleAPICallError) and not isinstance(exc, _TRANSIENT):
                    named = _named_permission(str(exc.message))
                    raise DeployError(f"Could not follow the rollout of {image} to {target.display} ({_code(exc)}: "
                                      f"{_message(exc)}): the update was sent and may still be rolling out (nothing "
                                      "was rolled back); check the service and run recovery.", code=_code(exc),
                                      permission=named, role=role_for(named) if named else "") from None
                now = loop.time()
                trouble_since = trouble_since or now
                if now - trouble_since > self.poll_grace:
                    raise DeployError(f"Cloud Run stopped answering while {target.display} was rolling out {image}: "
                                      "the rollout may still be going on (nothing was rolled back); check the "
                                      "service and run recovery.", code="UNAVAILABLE") from None
                on_progress(PollTrouble(target.name, f"polling failed ({_message(exc)}); retrying"))
                resource = None
            if resource is not None:
                tracker.observe(resource)
                state = state_of(target, resource)
                if state.settled and state.terminal_state != "failed":
                    if state.ready:
                        on_progress(RolloutReady(target.name, state.latest_ready_revision))
                        return DeployResult(target.name, image, state.latest_ready_revision,
                                            before.latest_ready_revision, operation, url=state.uri,
                                            console_url=target.console_url)
                    if state.pinned:  # pinned meanwhile (someone else's update): the new revision gets too little
                        raise traffic_pinned(target, state, image=image)
                    # asked for everything on the latest revision, routing not reported yet: keep polling
                if not state.reconciling and state.terminal_state == "failed":
                    raise rollout_failed(target, image, before, resource.terminal_condition.message or "no message")
            if loop.time() > deadline:
                raise DeployError(f"{target.display} did not become ready with {image} within "
                                  f"{target.timeout:g} s: it was left rolling out (nothing was rolled back); watch it "
                                  "in the Cloud console and run recovery.", code="TIMEOUT", exit_code=EXIT_TIMEOUT)
            await asyncio.sleep(self.poll_interval)


class _Tracker:
    """Turns successive snapshots of the resource into progress events (only what changed)."""

    def __init__(self, target: str, before: RolloutState, emit: ProgressCallback) -> None:
        self.target = target
        self.emit = emit
        self.revision = before.latest_created_revision
        self.conditions: dict[str, tuple[str, str]] = {}

    def observe(self, resource: Any) -> None:
        created = resource.latest_created_revision
        if created and created != self.revision:
            self.revision = created
            self.emit(RevisionCreated(self.target, created))
        for cond in [resource.terminal_condition, *resource.conditions]:
            if not cond.type_:
                continue
            seen = (_STATE_NAMES.get(cond.state, ""), cond.message)
            if self.conditions.get(cond.type_) != seen:
                self.conditions[cond.type_] = seen
                reason, logs_url = condense(cond.message) if cond.message else ("", "")
                self.emit(ConditionChanged(self.target, cond.type_, seen[0], mask_text(reason), logs_url))


def _set_image(target: Target, resource: Any, image: str) -> None:
    """Put ``image`` into the chosen container; a fixed revision name is cleared so Cloud Run names the new one
    (reusing it would be refused as "already exists")."""
    resource.template.revision = ""
    containers = list(resource.template.containers)
    if not containers:
        raise DeployError(f"{target.display} has no container: nothing was changed; deploy it once with gcloud "
                          "first.", code="NO_CONTAINER")
    if target.container:
        chosen = [c for c in containers if c.name == target.container]
        if not chosen:
            names = ", ".join(c.name or "(unnamed)" for c in containers)
            raise DeployError(f"{target.display} has no container named {target.container!r} (it has {names}): "
                              "nothing was changed; fix container in the target's configuration.",
                              code="NO_CONTAINER")
        chosen[0].image = image
    else:
        resource.template.containers[0].image = image


def _permission(target: Target, verb: str) -> str:
    return f"{'run.services' if target.kind == 'cloudrun-service' else 'run.workerpools'}.{verb}"


def _code(exc: gexc.GoogleAPICallError) -> str:
    code = exc.grpc_status_code
    return code.name if code is not None else "UNKNOWN"


def _message(exc: BaseException) -> str:
    text = str(exc.message) if isinstance(exc, gexc.GoogleAPICallError) else str(exc)
    return mask_text(condense(text)[0]) if text else type(exc).__name__


def traffic_pinned(target: Target, state: RolloutState, *, image: str = "") -> DeployError:
    """The split pins older revisions: the new revision would get (or got) less than everything."""
    what = "instances" if target.kind == "cloudrun-worker-pool" else "traffic"
    key = "instance_splits" if target.kind == "cloudrun-worker-pool" else "traffic"
    split = describe_split(state.traffic, state.latest_ready_revision)
    if image:
        return DeployError(f"{target.display} made revision {short_revision(state.latest_ready_revision)} with "
                           f"{image} ready, but its {key} pins {split}, so it serves {state.latest_share}% of the "
                           f"{what}: the pinned revisions keep serving; route all {what} to the latest revision "
                           f"(or set traffic = \"latest\" on target {target.name!r}) and deploy again.",
                           code="TRAFFIC_PINNED")
    return DeployError(f"{target.display} has its {key} pinned to {split} (a rollback in the console?), so a new "
                       f"revision would get only what is left: nothing was changed; set traffic = \"latest\" on "
                       f"target {target.name!r} to route all {what} to the new revision in the same update, or "
                       f"route them to the latest revision in the console first.", code="TRAFFIC_PINNED")


def rollout_failed(target: Target, image: str, before: RolloutState, message: str) -> DeployError:
    """Cloud Run's own failure reason (condensed to one line; the Logs URL apart), and what kept serving."""
    previous = short_revision(before.latest_ready_revision) or "(none)"
    reason, logs_url = condense(message)
    return DeployError(f"Cloud Run could not roll out {image} to {target.display}: {mask_text(reason)}; the "
                       f"previous revision {previous} keeps serving; fix the image and deploy again.",
                       code="ROLLOUT_FAILED", logs_url=logs_url)


def unavailable_error(target: Target, exc: BaseException, doing: str) -> DeployError:
    return DeployError(f"The Cloud Run API did not answer when asked to {doing} {target.display} "
                       f"({_message(exc)}): nothing was changed; check the network or api_endpoint and try again.",
                       code="UNAVAILABLE")


def api_error(target: Target, exc: gexc.GoogleAPICallError, doing: str, permission: str, *,
              service_account: str = "") -> DeployError:
    """One sentence for an API error while doing ``doing`` (read, update, ...) on the target."""
    text = str(exc.message)
    if _AUTH_PLUGIN_FAILURE.search(text) or isinstance(exc, gexc.Unauthenticated):
        return DeployError(f"Google refused the credentials when asked to {doing} {target.display}: nothing was "
                           "changed; they are missing, expired or revoked: refresh them with `gcloud auth "
                           "application-default login` (in CI: check the workload identity setup).",
                           code="UNAUTHENTICATED")
    if isinstance(exc, gexc.NotFound):
        return DeployError(f"{target.display} was not found: nothing was changed; check project, region and "
                           f"resource of target {target.name!r}.", code="NOT_FOUND")
    if isinstance(exc, gexc.PermissionDenied) and _SCOPES_FAILURE.search(text):
        return DeployError(f"The Google credentials lack the cloud-platform scope needed to {doing} "
                           f"{target.display}: nothing was changed; use credentials with the "
                           f"{SCOPES[0]} scope (e.g. `gcloud auth application-default login`, or a VM or runner "
                           "whose service account has that scope).", code="PERMISSION_DENIED")
    if isinstance(exc, gexc.PermissionDenied):
        named = _named_permission(text) or permission
        if named == "iam.serviceAccounts.actAs":
            found = _ACCOUNT.search(text)
            account = found.group(1) if found else service_account
            role = role_for(named, account)
            on = f"service account {account}" if account else "the runtime service account"
            return DeployError(f"The permission {named} is missing on {on}, which {target.display} runs as: "
                               f"nothing was changed; grant {role} to the account celeryops runs as.",
                               code="PERMISSION_DENIED", permission=named, role=role)
        role = role_for(named)
        return DeployError(f"The permission {named} is missing on {target.display}: nothing was changed; grant it "
                           f"(with {role}) to the account celeryops runs as.",
                           code="PERMISSION_DENIED", permission=named, role=role)
    if isinstance(exc, gexc.ServiceUnavailable | gexc.DeadlineExceeded):
        err = unavailable_error(target, exc, doing)
        err.code = _code(exc)
        return err
    reason, logs_url = condense(text)
    return DeployError(f"Cloud Run refused to {doing} {target.display} ({_code(exc)}: {mask_text(reason)}): nothing "
                       "was changed; fix the cause and try again.", code=_code(exc), logs_url=logs_url)


def _named_permission(message: str) -> str:
    start = message.find("Permission '")
    if start < 0:
        return ""
    rest = message[start + len("Permission '"):]
    return rest.split("'", 1)[0]
