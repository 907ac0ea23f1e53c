"""How a :class:`~celeryops.adapters.deploy.cloudrun.CloudRunDeployer` reaches Cloud Run, and follows a rollout.

:class:`CloudRunCalls` holds what the deployer's public operations share: one set of clients per target for the
deployer's life (credentials resolved once, off the event loop), reads that retry UNAVAILABLE briefly, the update
sent whole (read again when the etag moved, three times at most) and its refusals in one sentence, and the rollout
followed in our own polling loop (never ``result()``): the operation's metadata become typed progress events, a
brief outage and an exhausted quota are retried within ``poll_grace``, and a failed revision is named with Cloud
Run's reason and its logs link.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.retry import AsyncRetry, if_exception_type
from google.cloud.run_v2 import Service, UpdateServiceRequest, UpdateWorkerPoolRequest, WorkerPool
from google.longrunning import operations_pb2

from celeryops.adapters.deploy.base import (
    DeployError,
    DeployResult,
    PollTrouble,
    ProgressCallback,
    RevisionInfo,
    RolloutReady,
    RolloutState,
    condense,
    describe_split,
    logs_link,
    role_for,
    short_revision,
)
from celeryops.adapters.deploy.cloudrun_api import (
    AUTH_PLUGIN_FAILURE,
    QUOTA,
    TRANSIENT,
    ClientFactory,
    CloudRunClients,
    api_error,
    default_clients,
    error_code,
    error_message,
    named_permission,
    permission_for,
    quota_url,
    resolve_credentials,
    unavailable_error,
)
from celeryops.adapters.deploy.cloudrun_state import (
    ProgressTracker,
    revision_info,
    rollout_failed,
    state_of,
    traffic_pinned,
)
from celeryops.core.config import Target
from celeryops.core.errors import EXIT_TIMEOUT

__all__ = ["CloudRunCalls"]


class CloudRunCalls:
    """The Cloud Run calls a deployer's operations share (the deployer's settings are set here).

    ``clients``: the client factory (default :func:`default_clients`). Clients are made once per target and kept
    until :meth:`close`. ``poll_interval``: seconds between operation polls. ``rpc_timeout``: per-call timeout.
    ``outcome_timeout``: how long :meth:`rollout_outcome` waits before answering ``unknown``.
    ``poll_grace``: how long polling may fail transiently (or on an exhausted quota) before the deploy gives up.
    ``read_retry``: how long reads retry UNAVAILABLE (instead of the library's ~10 s default).
    ``credentials``: a callable returning credentials (default :func:`resolve_credentials`), run in a thread once."""

    QUOTA_BACKOFF_MAX = 30.0  # seconds between polls at most while a quota is exhausted

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


    async def close(self) -> None:
        """Close every channel this deployer opened (it opens new ones if it is used again)."""
        cached, self._cache = list(self._cache.values()), {}
        if self._loop is not asyncio.get_running_loop():
            return  # channels of another (closed) loop cannot be closed from here
        for clients in cached:
            await clients.close()

    async def _send(self, clients: CloudRunClients, target: Target, prepare: Callable[[Any, RolloutState], None],
                    *, force_new_revision: bool = True) -> tuple[RolloutState, RolloutState, str]:
        """Read the resource, let ``prepare(resource, before)`` refuse or change it, send it whole; read again when
        someone else changed it in between (ABORTED: the etag), three times at most. Returns the state before, the
        state asked for, and the operation's name."""
        for _attempt in range(3):
            resource = await self._get(clients, target, self._read_retry(), self.rpc_timeout)
            before = state_of(target, resource)
            prepare(resource, before)
            try:
                operation = await self._update(clients, target, resource, force_new_revision=force_new_revision)
            except DeployError as err:
                if err.code == "ABORTED":
                    continue
                raise
            return before, state_of(target, resource), operation
        raise DeployError(f"{target.display} kept being changed by someone else while celeryops updated it (etag "
                          "mismatch three times): nothing was changed by this deploy; find out who else deploys it "
                          "and deploy again.", code="ABORTED")

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

    async def _get(self, clients: CloudRunClients, target: Target, retry: AsyncRetry | None,
                   timeout: float) -> Any:
        try:
            if target.kind == "cloudrun-service":
                return await clients.services.get_service(name=target.resource_path, retry=retry, timeout=timeout)
            return await clients.worker_pools.get_worker_pool(name=target.resource_path, retry=retry,
                                                              timeout=timeout)
        except gexc.GoogleAPICallError as exc:
            raise api_error(target, exc, "read", permission_for(target, "get")) from None
        except gexc.RetryError as exc:
            raise unavailable_error(target, exc, "read") from None

    async def _revision(self, clients: CloudRunClients, name: str) -> RevisionInfo | None:
        """One revision (full name), or None when it cannot be read (no permission, not found, no answer)."""
        if not name:
            return None
        try:
            return revision_info(await clients.revisions.get_revision(name=name, retry=None,
                                                                      timeout=self.rpc_timeout))
        except (gexc.GoogleAPICallError, gexc.RetryError):
            return None

    async def _logs_url(self, clients: CloudRunClients, target: Target, revision: str) -> str:
        """The revision's logs: its ``log_uri``, else the Logs page with the target kind's own filter."""
        found = await self._revision(clients, revision)
        return (found.log_uri if found is not None else "") or logs_link(
            target.kind, target.project, target.region, target.resource, revision)

    async def _update(self, clients: CloudRunClients, target: Target, resource: Any, *,
                      validate_only: bool = False, force_new_revision: bool = True) -> str:
        doing = "validate an update of" if validate_only else "update"
        try:
            if target.kind == "cloudrun-service":
                op = await clients.services.update_service(
                    request=UpdateServiceRequest(service=resource, validate_only=validate_only), retry=None,
                    timeout=self.rpc_timeout)
            else:  # a deploy gives a worker pool a new revision (fresh workers) even when nothing else changed
                op = await clients.worker_pools.update_worker_pool(
                    request=UpdateWorkerPoolRequest(worker_pool=resource, validate_only=validate_only,
                                                    force_new_revision=force_new_revision),
                    retry=None, timeout=self.rpc_timeout)
        except gexc.Aborted as exc:
            raise DeployError(f"{target.display} was changed by someone else while celeryops updated it "
                              f"({error_message(exc)}): nothing was changed by this deploy; deploy again.",
                              code="ABORTED") from None
        except (gexc.ServiceUnavailable, gexc.DeadlineExceeded) as exc:
            if AUTH_PLUGIN_FAILURE.search(str(exc.message)):
                raise api_error(target, exc, doing, permission_for(target, "update")) from None
            if validate_only:
                raise unavailable_error(target, exc, doing) from None
            raise DeployError(f"The Cloud Run API did not answer the update of {target.display} "
                              f"({error_message(exc)}): the new image may or may not have been accepted; check the "
                              "service before deploying again.", code=error_code(exc)) from None
        except gexc.GoogleAPICallError as exc:
            raise api_error(target, exc, doing, permission_for(target, "update"),
                            service_account=resource.template.service_account) from None
        if validate_only and op.operation.done and op.operation.HasField("error"):
            reason, logs_url = condense(op.operation.error.message)
            raise DeployError(f"Cloud Run refused the update of {target.display} (validate only): {reason}: nothing "
                              "was changed; fix the cause and try again.", code="INVALID", logs_url=logs_url)
        return str(op.operation.name)

    async def _failed(self, clients: CloudRunClients, target: Target, image: str, before: RolloutState,
                      revision: str, message: str) -> DeployError:
        """The failure sentence of revision ``revision`` (full name): its name, Cloud Run's reason, its logs."""
        found = await self._revision(clients, revision)
        if found is None and revision:
            found = RevisionInfo(name=short_revision(revision))
        logs = (found.log_uri if found is not None else "") or condense(message)[1] or logs_link(
            target.kind, target.project, target.region, target.resource, revision)
        return rollout_failed(target, image, before, message, revision=found, logs_url=logs)

    async def _watch(self, clients: CloudRunClients, target: Target, image: str, operation: str,
                     before: RolloutState, on_progress: ProgressCallback, *,
                     split: tuple[tuple[str, int], ...] | None = None, new_revision: bool = True,
                     route: bool = False, count: int | None = None) -> DeployResult:
        """Poll the operation, then the resource, until it succeeded and serves what was asked: all traffic
        (instances) on the latest revision, or exactly ``split`` (``route``: an update that makes no revision is done
        once Cloud Run caught up and serves the split, and ``count`` instances when given, whatever the latest
        created revision's state: a failed one keeps the resource not Ready, and is not this update's failure).
        Transient errors and an exhausted quota are retried (the quota with backoff) for ``poll_grace`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + target.timeout
        tracker = ProgressTracker(target.name, before, on_progress)
        ops = clients.services if target.kind == "cloudrun-service" else clients.worker_pools
        message_type: Any = Service if target.kind == "cloudrun-service" else WorkerPool
        trouble_since: float | None = None
        quota_polls = 0
        op_done = False
        created = before.latest_created_revision
        while True:
            pause = self.poll_interval
            try:
                if not op_done:
                    raw = await ops.get_operation(operations_pb2.GetOperationRequest(name=operation), retry=None,
                                                  timeout=self.rpc_timeout)
                    if raw.HasField("metadata"):
                        meta = message_type.deserialize(raw.metadata.value)
                        tracker.observe(meta)
                        created = meta.latest_created_revision or created
                    if raw.done and raw.HasField("error"):
                        raise await self._failed(clients, target, image, before, created,
                                                 raw.error.message or "no message")
                    op_done = bool(raw.done)
                    resource = message_type.deserialize(raw.response.value) if op_done else None
                else:  # the operation finished; wait for the resource itself to settle
                    resource = await self._get(clients, target, None, self.rpc_timeout)
                trouble_since, quota_polls = None, 0
            except (*TRANSIENT, *QUOTA, DeployError, gexc.GoogleAPICallError) as exc:
                quota = isinstance(exc, QUOTA) or (isinstance(exc, DeployError) and exc.code == "RESOURCE_EXHAUSTED")
                if isinstance(exc, DeployError) and not quota and exc.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    raise
                if isinstance(exc, gexc.GoogleAPICallError) and not isinstance(exc, (*TRANSIENT, *QUOTA)):
                    if exc.reason == "SERVICE_DISABLED":
                        raise api_error(target, exc, "follow the rollout of", "run.operations.get") from None
                    named = named_permission(str(exc.message))
                    raise DeployError(f"Could not follow the rollout of {image} to {target.display} "
                                      f"({error_code(exc)}: {error_message(exc)}): the update was sent and may still "
                                      "be rolling out (nothing was rolled back); check the service and run recovery.",
                                      code=error_code(exc),
                                      permission=named, role=role_for(named) if named else "") from None
                now = loop.time()
                trouble_since = trouble_since or now
                if now - trouble_since > self.poll_grace:
                    if quota:
                        raise DeployError(f"Cloud Run kept answering that a quota of project {target.project} is "
                                          f"exhausted ({error_message(exc)}) while {target.display} was rolling out "
                                          f"{image}: the rollout may still be going on (nothing was rolled back); "
                                          f"watch it at {target.console_url}, run recovery, and raise the quota at "
                                          f"{quota_url(target.project)}.", code="RESOURCE_EXHAUSTED") from None
                    raise DeployError(f"Cloud Run stopped answering while {target.display} was rolling out {image}: "
                                      "the rollout may still be going on (nothing was rolled back); check the "
                                      "service and run recovery.", code="UNAVAILABLE") from None
                if quota:  # back off: a quota per minute refills slowly
                    quota_polls += 1
                    pause = min(self.QUOTA_BACKOFF_MAX, self.poll_interval * 2 ** quota_polls)
                    on_progress(PollTrouble(target.name, f"a quota is exhausted ({error_message(exc)}); retrying "
                                                         f"in {pause:.3g} s"))
                else:
                    on_progress(PollTrouble(target.name, f"polling failed ({error_message(exc)}); retrying"))
                resource = None
            if resource is not None:
                tracker.observe(resource)
                state = state_of(target, resource)
                created = state.latest_created_revision or created
                if state.succeeded or (route and state.caught_up):
                    served = state.serves(split) if split is not None else state.ready
                    if served and (count is None or state.instance_count == count):
                        on_progress(RolloutReady(target.name, state.latest_ready_revision if new_revision else ""))
                        revision = state.latest_ready_revision
                        return DeployResult(target.name, image=image, revision=revision,
                                            previous_revision=before.latest_ready_revision, operation=operation,
                                            url=state.uri, console_url=target.console_url,
                                            logs_url=await self._logs_url(clients, target, revision))
                    if split is None and state.pinned:  # pinned meanwhile (someone else's update)
                        raise traffic_pinned(target, state, image=image)
                    # the split asked for is not reported as served yet: keep polling
                # A route's update is judged once Cloud Run acted on it: until then a failure it reports is an
                # earlier revision's (which keeps the resource not Ready), not this update's.
                if not state.reconciling and state.terminal_state == "failed" and (not route or state.caught_up):
                    raise await self._failed(clients, target, image, before, state.latest_created_revision,
                                             resource.terminal_condition.message or "no message")
            if loop.time() > deadline:
                wanted = f" with the split {describe_split(split)}" if split is not None else ""
                raise DeployError(f"{target.display} did not become ready with {image}{wanted} within "
                                  f"{target.timeout:g} s: it was left rolling out (nothing was rolled back); watch it "
                                  f"at {target.console_url} and run recovery.", code="TIMEOUT",
                                  exit_code=EXIT_TIMEOUT)
            await asyncio.sleep(pause)
