"""Deploy to Cloud Run services and worker pools with the async google-cloud-run clients.

The image of one container (``container`` in the target, default the first) is replaced, the resource is
updated, and the long-running operation is polled in our own loop (never ``result()``), so every poll becomes
typed progress events from the operation's metadata. The rollout is done when Cloud Run says so (not
reconciling, ``observed_generation == generation``, ``latest_ready_revision == latest_created_revision``, the
terminal condition SUCCEEDED) **and** the new revision serves what the operator expects: all traffic (a worker
pool: all instances) goes to the latest revision, compared on ``traffic_statuses`` / ``instance_split_statuses``.
A split that pins older revisions (a rollback in the console) is refused before anything changes unless the target
says ``traffic = "latest"``, which routes everything to the new revision in the same update; so is a worker pool
that runs no instance. While a rollout is followed, a brief outage (UNAVAILABLE) and an exhausted quota
(RESOURCE_EXHAUSTED, with backoff) are retried within ``poll_grace``; a revision that fails is named with Cloud
Run's reason and its logs link (``Revision.log_uri``). The result names the revision, URL, console and logs links.

For a worker pool, :meth:`CloudRunDeployer.update_worker_pool` sends one update with any of: a new image, the new
revision's name up front, the instance count and the instance split, and follows it until Cloud Run serves that
split; :meth:`CloudRunDeployer.revisions` lists the revisions with their state and the instances Cloud Run wants
each to run.

:meth:`CloudRunDeployer.validate` sends that exact update with ``validate_only=True``: Cloud Run checks it
(permissions such as actAs on the runtime service account included) and changes nothing.

Credentials are resolved once per deployer, off the event loop; each target gets one channel for the deployer's
life (:meth:`CloudRunDeployer.close` closes them). How the API is reached and what its refusals mean is in
:mod:`celeryops.adapters.deploy.cloudrun_api`; how a resource's state is read and the update is prepared, in
:mod:`celeryops.adapters.deploy.cloudrun_state`. Their public names are importable from here too.
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
    REVISION_PERMISSIONS,
    DeployError,
    DeployResult,
    Outcome,
    PollTrouble,
    PoolUpdate,
    ProgressCallback,
    RevisionInfo,
    RolloutReady,
    RolloutStarted,
    RolloutState,
    RouteStarted,
    condense,
    describe_split,
    logs_link,
    role_for,
    short_revision,
)
from celeryops.adapters.deploy.cloudrun_api import (
    AUTH_PLUGIN_FAILURE,
    DEFAULT_ENDPOINT,
    QUOTA,
    SCOPES,
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
    prepare_pool_update,
    prepare_route,
    prepare_update,
    refuse_unready,
    revision_info,
    rollout_failed,
    state_of,
    traffic_pinned,
)
from celeryops.core.config import Target
from celeryops.core.errors import EXIT_TIMEOUT

__all__ = [
    "DEFAULT_ENDPOINT",
    "SCOPES",
    "ClientFactory",
    "CloudRunClients",
    "CloudRunDeployer",
    "api_error",
    "default_clients",
    "resolve_credentials",
    "revision_info",
    "rollout_failed",
    "state_of",
    "traffic_pinned",
    "unavailable_error",
]


class CloudRunDeployer:
    """Deployer for ``cloudrun-service`` and ``cloudrun-worker-pool`` targets.

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

    # ------------------------------------------------------------------------------------------ public API

    async def current(self, target: Target) -> RolloutState:
        clients = await self._clients(target)
        return state_of(target, await self._get(clients, target, self._read_retry(), self.rpc_timeout))

    async def revisions(self, target: Target) -> list[RevisionInfo]:
        """The target's revisions, newest first, each with its Ready state, Cloud Run's reason, its logs link and
        the instances Cloud Run wants it to run. Raises DeployError when they cannot be listed."""
        clients = await self._clients(target)
        try:
            pager = await clients.revisions.list_revisions(parent=target.resource_path, retry=self._read_retry(),
                                                           timeout=self.rpc_timeout)
            return [revision_info(r) async for r in pager]
        except gexc.GoogleAPICallError as exc:
            raise api_error(target, exc, "list the revisions of", "run.revisions.list") from None
        except gexc.RetryError as exc:
            raise unavailable_error(target, exc, "list the revisions of") from None

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

    async def missing_revision_permissions(self, target: Target) -> list[str]:
        """Of ``run.revisions.get`` and ``run.revisions.list`` (what an overlap deploy and a rollback read), those the
        caller lacks: asked with ``test_iam_permissions`` on the resource; where Cloud Run does not take revision
        permissions there (INVALID_ARGUMENT), found by reading one revision and listing them."""
        clients = await self._clients(target)
        client = clients.services if target.kind == "cloudrun-service" else clients.worker_pools
        wanted = list(REVISION_PERMISSIONS)
        try:
            reply = await client.test_iam_permissions(
                request={"resource": target.resource_path, "permissions": wanted},
                retry=self._read_retry(), timeout=self.rpc_timeout)
        except gexc.InvalidArgument:
            return await self._probe_revisions(clients, target)
        except gexc.GoogleAPICallError as exc:
            raise api_error(target, exc, "check permissions on", permission_for(target, "get")) from None
        except gexc.RetryError as exc:
            raise unavailable_error(target, exc, "check permissions on") from None
        granted = set(reply.permissions)
        return [p for p in wanted if p not in granted]

    async def _probe_revisions(self, clients: CloudRunClients, target: Target) -> list[str]:
        """The revision permissions found missing by using them: a listing of one revision, a read of the latest."""
        missing: list[str] = []
        try:
            pager = await clients.revisions.list_revisions(
                request={"parent": target.resource_path, "page_size": 1}, retry=self._read_retry(),
                timeout=self.rpc_timeout)
            latest = next(iter(pager.revisions), None)
        except gexc.PermissionDenied:
            missing.append("run.revisions.list")
            latest = None
        except gexc.GoogleAPICallError as exc:
            raise api_error(target, exc, "list the revisions of", "run.revisions.list") from None
        name = latest.name if latest is not None else (await self.current(target)).latest_created_revision
        if name:
            try:
                await clients.revisions.get_revision(name=name, retry=self._read_retry(), timeout=self.rpc_timeout)
            except gexc.PermissionDenied:
                missing.append("run.revisions.get")
            except gexc.NotFound:
                pass
            except gexc.GoogleAPICallError as exc:
                raise api_error(target, exc, "read a revision of", "run.revisions.get") from None
        return sorted(missing)

    async def validate(self, target: Target, image: str) -> None:
        """Send the update :meth:`deploy` would send with ``validate_only=True``: Cloud Run checks it (actAs on
        the runtime service account included) and changes nothing. Raises DeployError with its refusal, when a
        rollout is in progress, or when a worker pool runs no instance (a pinned split is not refused here: see
        ``traffic_check``)."""
        clients = await self._clients(target)
        resource = await self._get(clients, target, self._read_retry(), self.rpc_timeout)
        before = state_of(target, resource)
        refuse_unready(target, before, traffic=False)  # a pinned split is the traffic check's finding
        prepare_update(target, resource, image, before)
        await self._update(clients, target, resource, validate_only=True)

    async def validate_pool_update(self, target: Target, change: PoolUpdate) -> None:
        """Send the update :meth:`update_worker_pool` would send for ``change`` with ``validate_only=True``: Cloud
        Run checks it (the image, the named revision, the split, actAs on the runtime service account) and changes
        nothing. Raises DeployError with its refusal, when a rollout is in progress or the pool runs no instance."""
        if target.kind != "cloudrun-worker-pool":
            raise DeployError(f"{target.display} is not a Cloud Run worker pool: instance counts and splits are a "
                              "worker pool's; nothing was changed.", code="KIND")
        clients = await self._clients(target)
        resource = await self._get(clients, target, self._read_retry(), self.rpc_timeout)
        refuse_unready(target, state_of(target, resource), traffic=False)
        prepare_pool_update(target, resource, change)
        await self._update(clients, target, resource, validate_only=True,
                           force_new_revision=change.image is not None or bool(change.revision))

    async def rollout_outcome(self, target: Target, started: RolloutState, image: str) -> Outcome:
        """Judged on the target's state now: reconciling -> ``in_progress``; settled and succeeded with ``image`` in
        the chosen container and all traffic (instances) on the latest revision -> ``ready``; anything else (failed
        revision, the update never took effect, or the new revision is ready but a pinned split keeps the old one
        serving) -> ``failed``; no answer within ``outcome_timeout`` (no retries), not found or denied ->
        ``unknown``."""
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

        def prepare(resource: Any, before: RolloutState) -> None:
            refuse_unready(target, before)
            prepare_update(target, resource, image, before)

        before, _asked, operation = await self._send(clients, target, prepare)
        on_progress(RolloutStarted(target.name, image, operation, before.latest_ready_revision))
        return await self._watch(clients, target, image, operation, before, on_progress)

    async def update_worker_pool(self, target: Target, change: PoolUpdate,
                                 on_progress: ProgressCallback) -> DeployResult:
        """One update of a worker pool with what ``change`` sets (image, the new revision's name, instance count,
        split), followed until Cloud Run serves exactly the split asked for (a new revision: until it is ready).
        Unlike :meth:`deploy` a split that names older revisions is what is asked, not refused; a rollout in
        progress is. Raises DeployError with one sentence; the result's ``image`` is the chosen container's."""
        if target.kind != "cloudrun-worker-pool":
            raise DeployError(f"{target.display} is not a Cloud Run worker pool: instance counts and splits are a "
                              "worker pool's; nothing was changed.", code="KIND")
        clients = await self._clients(target)
        new_revision = change.image is not None or bool(change.revision)

        def prepare(resource: Any, before: RolloutState) -> None:
            refuse_unready(target, before, traffic=False)
            prepare_pool_update(target, resource, change)

        before, asked, operation = await self._send(clients, target, prepare, force_new_revision=new_revision)
        if not new_revision and change.split and all(rev for rev, _pct in change.split):
            # Existing revisions by name (an overlap rollback, a retirement): routed, not rolled out (no image).
            main = short_revision(max(change.split, key=lambda entry: entry[1])[0])
            previous = before.served_split[0][0] if before.served_split else ""
            on_progress(RouteStarted(target.name, main, describe_split(change.split), operation, previous))
        else:
            on_progress(RolloutStarted(target.name, asked.image, operation, before.latest_ready_revision))
        # No new revision: done once Cloud Run caught up and serves the split at the count asked, whatever the
        # latest created revision's state (after a failed revision the pool stays not Ready until a good one comes).
        return await self._watch(clients, target, asked.image, operation, before, on_progress,
                                 split=asked.traffic or (("", 100),), new_revision=new_revision,
                                 route=not new_revision,
                                 count=asked.instance_count if change.instance_count is not None else None)

    async def route(self, target: Target, split: tuple[tuple[str, int], ...], on_progress: ProgressCallback, *,
                    by: str = "") -> DeployResult:
        """Route a service's traffic (a worker pool's instances) to existing revisions, ``split`` naming each
        (``(short name, percent)``; a rollback: ``((revision, 100),)``): no image, no new revision. The split is
        recorded on the resource as celeryops' own (``by``: who left it), so a later deploy routes everything to its
        new revision. Followed until Cloud Run serves exactly that split; a rollout in progress is refused. The
        result names the revision with the largest share, its image and logs, and what served most before."""
        clients = await self._clients(target)
        main = short_revision(max(split, key=lambda entry: entry[1])[0]) if split else ""

        def prepare(resource: Any, before: RolloutState) -> None:
            refuse_unready(target, before, traffic=False)
            prepare_route(target, resource, split, by)

        before, _asked, operation = await self._send(clients, target, prepare, force_new_revision=False)
        previous = before.served_split[0][0] if before.served_split else ""
        on_progress(RouteStarted(target.name, main, describe_split(split), operation, previous))
        watched = await self._watch(clients, target, f"revision {main}", operation, before, on_progress,
                                    split=split, new_revision=False, route=True)
        full = f"{target.resource_path}/revisions/{main}"
        found = await self._revision(clients, full)
        return DeployResult(target.name, found.image if found is not None else "", full, previous, operation,
                            url=watched.url, console_url=target.console_url,
                            logs_url=(found.log_uri if found is not None else "") or logs_link(
                                target.kind, target.project, target.region, target.resource, full))

    async def validate_route(self, target: Target, split: tuple[tuple[str, int], ...]) -> None:
        """Send the update :meth:`route` would send with ``validate_only=True`` (Cloud Run checks that the
        revisions exist, and actAs, changing nothing). Raises DeployError with its refusal, or when a rollout is in
        progress."""
        clients = await self._clients(target)
        resource = await self._get(clients, target, self._read_retry(), self.rpc_timeout)
        refuse_unready(target, state_of(target, resource), traffic=False)
        prepare_route(target, resource, split)
        await self._update(clients, target, resource, validate_only=True, force_new_revision=False)

    async def route_outcome(self, target: Target, split: tuple[tuple[str, int], ...]) -> Outcome:
        """After an interruption: did routing to ``split`` take effect? Reconciling -> ``in_progress``; caught up
        and serving exactly ``split`` -> ``ready``; anything else -> ``failed`` (what served before still serves);
        no answer within ``outcome_timeout`` (no retries), not found or denied -> ``unknown``."""
        try:
            clients = await self._clients(target)
            now = state_of(target, await self._get(clients, target, None, self.outcome_timeout))
        except DeployError:
            return "unknown"
        if now.reconciling:
            return "in_progress"
        return "ready" if now.caught_up and now.serves(split) else "failed"

    async def close(self) -> None:
        """Close every channel this deployer opened (it opens new ones if it is used again)."""
        cached, self._cache = list(self._cache.values()), {}
        if self._loop is not asyncio.get_running_loop():
            return  # channels of another (closed) loop cannot be closed from here
        for clients in cached:
            await clients.close()

    # ------------------------------------------------------------------------------------------ internals

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
                        return DeployResult(target.name, image, revision, before.latest_ready_revision, operation,
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
