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
:mod:`celeryops.adapters.deploy.cloudrun_state`; the calls every operation shares (clients, reads, the update sent,
the rollout followed), in :mod:`celeryops.adapters.deploy.cloudrun_calls`. Their public names are importable from
here too.
"""

from __future__ import annotations

from typing import Any

from google.api_core import exceptions as gexc

from celeryops.adapters.deploy.base import (
    REVISION_PERMISSIONS,
    DeployError,
    DeployResult,
    Outcome,
    PoolUpdate,
    ProgressCallback,
    RevisionInfo,
    RolloutStarted,
    RolloutState,
    RouteStarted,
    describe_split,
    logs_link,
    short_revision,
)
from celeryops.adapters.deploy.cloudrun_api import (
    DEFAULT_ENDPOINT,
    SCOPES,
    ClientFactory,
    CloudRunClients,
    api_error,
    default_clients,
    permission_for,
    resolve_credentials,
    unavailable_error,
)
from celeryops.adapters.deploy.cloudrun_calls import CloudRunCalls
from celeryops.adapters.deploy.cloudrun_state import (
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


class CloudRunDeployer(CloudRunCalls):
    """Deployer for ``cloudrun-service`` and ``cloudrun-worker-pool`` targets. Its settings (the client factory,
    the poll interval, the timeouts, the poll grace, the credentials) are those of :class:`CloudRunCalls`."""

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
        refuse_unready(target, state_of(target, resource), traffic=False, count=change.instance_count)
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
            refuse_unready(target, before, traffic=False, count=change.instance_count)
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
        return DeployResult(target.name, image=found.image if found is not None else "", revision=full,
                            previous_revision=previous, operation=operation, url=watched.url,
                            console_url=target.console_url,
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

