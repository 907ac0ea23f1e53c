"""Deploy to Cloud Run services and worker pools with the async google-cloud-run clients.

The image of one container (``container`` in the target, default the first) is replaced, the resource is
updated, and the long-running operation is polled in our own loop (never ``result()``), so every poll becomes
typed progress events from the operation's metadata. The rollout is done when Cloud Run says so: not reconciling,
``observed_generation == generation`` and ``latest_ready_revision == latest_created_revision``.

Clients are made by a factory called inside the running event loop: production uses application default
credentials; a target with ``api_endpoint`` and ``insecure = true`` (loopback only) gets a plaintext channel to a
local stand-in.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.api_core.retry import AsyncRetry, if_exception_type
from google.cloud.run_v2 import (
    Condition,
    RevisionsAsyncClient,
    Service,
    ServicesAsyncClient,
    WorkerPool,
    WorkerPoolsAsyncClient,
)
from google.cloud.run_v2.services.revisions.transports import RevisionsGrpcAsyncIOTransport
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
    short_revision,
)
from celeryops.core.config import Target, is_loopback_endpoint
from celeryops.core.errors import EXIT_TIMEOUT
from celeryops.core.masking import mask_text

_STATE_NAMES = {
    Condition.State.CONDITION_SUCCEEDED: "succeeded",
    Condition.State.CONDITION_FAILED: "failed",
    Condition.State.CONDITION_RECONCILING: "reconciling",
    Condition.State.CONDITION_PENDING: "pending",
}
_TRANSIENT = (gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.RetryError)


@dataclass
class CloudRunClients:
    """The three async clients a deploy uses; ``channel`` is set when they share one (the stand-in)."""

    services: ServicesAsyncClient
    worker_pools: WorkerPoolsAsyncClient
    revisions: RevisionsAsyncClient
    channel: Any = None

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            return
        for client in (self.services, self.worker_pools, self.revisions):
            await client.transport.close()  # type: ignore[no-untyped-call]


ClientFactory = Callable[[Target], CloudRunClients]


def default_clients(target: Target) -> CloudRunClients:
    """Clients for ``target``; call inside the running event loop (grpc.aio channels bind to it)."""
    if target.insecure:
        if not target.api_endpoint or not is_loopback_endpoint(target.api_endpoint):
            raise DeployError(f"Target {target.name!r} asks for a plaintext connection to "
                              f"{target.api_endpoint or 'Google'}, which is not a loopback address: nothing was "
                              "contacted; insecure = true is only for a local stand-in.", code="INSECURE")
        channel = grpc.aio.insecure_channel(target.api_endpoint)
        return CloudRunClients(
            services=ServicesAsyncClient(transport=ServicesGrpcAsyncIOTransport(channel=channel)),
            worker_pools=WorkerPoolsAsyncClient(transport=WorkerPoolsGrpcAsyncIOTransport(channel=channel)),
            revisions=RevisionsAsyncClient(transport=RevisionsGrpcAsyncIOTransport(channel=channel)),
            channel=channel,
        )
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except DefaultCredentialsError:
        raise DeployError("No Google credentials were found: nothing was deployed; run `gcloud auth "
                          "application-default login` or set GOOGLE_APPLICATION_CREDENTIALS.",
                          code="UNAUTHENTICATED") from None
    options = ClientOptions(api_endpoint=target.api_endpoint) if target.api_endpoint else None
    return CloudRunClients(
        services=ServicesAsyncClient(credentials=credentials, client_options=options),
        worker_pools=WorkerPoolsAsyncClient(credentials=credentials, client_options=options),
        revisions=RevisionsAsyncClient(credentials=credentials, client_options=options),
    )


def state_of(target: Target, resource: Any) -> RolloutState:
    """A Service / WorkerPool message as a RolloutState (image: the target's container)."""
    containers = list(resource.template.containers)
    image = ""
    if containers:
        chosen = [c for c in containers if c.name == target.container] if target.container else containers[:1]
        image = chosen[0].image if chosen else ""
    cond = resource.terminal_condition
    return RolloutState(
        resource=resource.name or target.resource_path,
        generation=int(resource.generation),
        observed_generation=int(resource.observed_generation),
        reconciling=bool(resource.reconciling),
        latest_created_revision=resource.latest_created_revision,
        latest_ready_revision=resource.latest_ready_revision,
        image=image,
        terminal_state=_STATE_NAMES.get(cond.state, ""),
        terminal_message=cond.message,
    )


class CloudRunDeployer:
    """Deployer for ``cloudrun-service`` and ``cloudrun-worker-pool`` targets.

    ``clients``: the client factory (default :func:`default_clients`); clients it makes are closed after each
    call. ``poll_interval``: seconds between operation polls. ``rpc_timeout``: per-call timeout.
    ``outcome_timeout``: how long :meth:`rollout_outcome` waits before answering ``unknown``.
    ``poll_grace``: how long polling may fail transiently before the deploy gives up.
    ``read_retry``: how long reads retry UNAVAILABLE (instead of the library's ~10 s default)."""

    def __init__(self, clients: ClientFactory | None = None, *, poll_interval: float = 2.0,
                 rpc_timeout: float = 15.0, outcome_timeout: float = 5.0, poll_grace: float = 60.0,
                 read_retry: float = 5.0) -> None:
        self._factory = clients or default_clients
        self.poll_interval = poll_interval
        self.rpc_timeout = rpc_timeout
        self.outcome_timeout = outcome_timeout
        self.poll_grace = poll_grace
        self.read_retry = read_retry

    # ------------------------------------------------------------------------------------------ public API

    async def current(self, target: Target) -> RolloutState:
        async with self._clients(target) as clients:
            return state_of(target, await self._get(clients, target, self._read_retry(), self.rpc_timeout))

    async def missing_permissions(self, target: Target) -> list[str]:
        prefix = "run.services" if target.kind == "cloudrun-service" else "run.workerpools"
        wanted = [f"{prefix}.get", f"{prefix}.update"]
        async with self._clients(target) as clients:
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

    async def rollout_outcome(self, target: Target, started: RolloutState, image: str) -> Outcome:
        """Judged on the target's state now: reconciling -> ``in_progress``; settled with ``image`` in the chosen
        container -> ``ready``; anything else (failed revision, or the update never took effect so ``started``'s
        revision still serves the old image) -> ``failed``; no answer within ``outcome_timeout`` (no retries),
        not found or denied -> ``unknown``."""
        try:
            async with self._clients(target) as clients:
                resource = await self._get(clients, target, None, self.outcome_timeout)
        except DeployError:
            return "unknown"
        now = state_of(target, resource)
        if now.reconciling:
            return "in_progress"
        if now.image == image and now.settled and now.terminal_state != "failed":
            return "ready"
        return "failed"

    async def deploy(self, target: Target, image: str, on_progress: ProgressCallback, *, sha: str = "",
                     release: str = "") -> DeployResult:
        async with self._clients(target) as clients:
            resource = await self._get(clients, target, self._read_retry(), self.rpc_timeout)
            before = state_of(target, resource)
            if before.reconciling:
                raise DeployError(f"{target.display} is still rolling out revision "
                                  f"{short_revision(before.latest_created_revision)}: nothing was changed; wait "
                                  "until it finished and deploy again.", code="BUSY")
            _set_image(target, resource, image)
            operation = await self._update(clients, target, resource)
            on_progress(RolloutStarted(target.name, image, operation, before.latest_ready_revision))
            return await self._watch(clients, target, image, operation, before, on_progress)

    # ------------------------------------------------------------------------------------------ internals

    @asynccontextmanager
    async def _clients(self, target: Target) -> AsyncIterator[CloudRunClients]:
        if not target.is_cloudrun:
            raise DeployError(f"Target {target.name!r} is a {target.kind} target, not a Cloud Run one: nothing was "
                              "deployed.", code="KIND")
        clients = self._factory(target)
        try:
            yield clients
        finally:
            if self._factory is default_clients:
                await clients.close()

    def _read_retry(self) -> AsyncRetry:
        """Reads retry UNAVAILABLE briefly (not the library's ~10 s default ladder)."""
        return AsyncRetry(predicate=if_exception_type(gexc.ServiceUnavailable), initial=0.2, maximum=1.0,
                          multiplier=2.0, timeout=self.read_retry)

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

    async def _update(self, clients: CloudRunClients, target: Target, resource: Any) -> str:
        try:
            if target.kind == "cloudrun-service":
                op = await clients.services.update_service(service=resource, retry=None, timeout=self.rpc_timeout)
            else:
                op = await clients.worker_pools.update_worker_pool(worker_pool=resource, retry=None,
                                                                   timeout=self.rpc_timeout)
        except (gexc.ServiceUnavailable, gexc.DeadlineExceeded) as exc:
            raise DeployError(f"The Cloud Run API did not answer the update of {target.display} ({exc.message}): "
                              "the new image may or may not have been accepted; check the service before "
                              "deploying again.", code=_code(exc)) from None
        except gexc.GoogleAPICallError as exc:
            raise api_error(target, exc, "update", _permission(target, "update")) from None
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
                    raise DeployError(f"Could not follow the rollout of {image} to {target.display} ({_code(exc)}: "
                                      f"{_message(exc)}): the update was sent and may still be rolling out (nothing "
                                      "was rolled back); check the service and run recovery.", code=_code(exc),
                                      permission=_named_permission(str(exc.message))) from None
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
                    on_progress(RolloutReady(target.name, state.latest_ready_revision))
                    return DeployResult(target.name, image, state.latest_ready_revision,
                                        before.latest_ready_revision, operation)
                if not state.reconciling and state.terminal_state == "failed":
                    raise rollout_failed(target, image, before, state.terminal_message or "no message")
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
                self.emit(ConditionChanged(self.target, cond.type_, seen[0], seen[1]))


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
    if isinstance(exc, gexc.GoogleAPICallError):
        return mask_text(str(exc.message))
    return mask_text(str(exc))


def rollout_failed(target: Target, image: str, before: RolloutState, message: str) -> DeployError:
    """Cloud Run's own failure message, and what kept serving."""
    previous = short_revision(before.latest_ready_revision) or "(none)"
    reason = mask_text(message).rstrip(".")
    return DeployError(f"Cloud Run could not roll out {image} to {target.display}: {reason}; the "
                       f"previous revision {previous} keeps serving; fix the image and deploy again.",
                       code="ROLLOUT_FAILED")


def unavailable_error(target: Target, exc: BaseException, doing: str) -> DeployError:
    return DeployError(f"The Cloud Run API did not answer when asked to {doing} {target.display} "
                       f"({_message(exc)}): nothing was changed; check the network or api_endpoint and try again.",
                       code="UNAVAILABLE")


def api_error(target: Target, exc: gexc.GoogleAPICallError, doing: str, permission: str) -> DeployError:
    """One sentence for an API error while doing ``doing`` (read, update, ...) on the target."""
    if isinstance(exc, gexc.NotFound):
        return DeployError(f"{target.display} was not found: nothing was changed; check project, region and "
                           f"resource of target {target.name!r}.", code="NOT_FOUND")
    if isinstance(exc, gexc.PermissionDenied):
        named = _named_permission(str(exc.message)) or permission
        return DeployError(f"The permission {named} is missing on {target.display}: nothing was changed; grant it "
                           "(for example with roles/run.developer) to the account celeryops runs as.",
                           code="PERMISSION_DENIED", permission=named)
    if isinstance(exc, gexc.Unauthenticated):
        return DeployError(f"Google refused the credentials when asked to {doing} {target.display}: nothing was "
                           "changed; refresh them with `gcloud auth application-default login`.",
                           code="UNAUTHENTICATED")
    if isinstance(exc, gexc.ServiceUnavailable | gexc.DeadlineExceeded):
        err = unavailable_error(target, exc, doing)
        err.code = _code(exc)
        return err
    return DeployError(f"Cloud Run refused to {doing} {target.display} ({_code(exc)}: {_message(exc)}): nothing was "
                       "changed; fix the cause and try again.", code=_code(exc))


def _named_permission(message: str) -> str:
    start = message.find("Permission '")
    if start < 0:
        return ""
    rest = message[start + len("Permission '"):]
    return rest.split("'", 1)[0]
