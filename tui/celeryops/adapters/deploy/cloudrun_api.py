"""Reaching the Cloud Run Admin API: credentials, the async clients and their channel, and what the API's
refusals mean.

Credentials are application default credentials, refreshed once so that missing, expired or revoked ones are
one sentence (:func:`resolve_credentials`). :func:`default_clients` opens one gRPC channel for a target and the
async clients on it; a target with ``api_endpoint`` and ``insecure = true`` (loopback only) gets a plaintext
channel to a local stand-in and no credentials. :func:`api_error` and :func:`unavailable_error` turn an API error
into one :class:`~celeryops.adapters.deploy.base.DeployError` sentence with its remedy: the Cloud Run Admin API
disabled in the project (the error's ``ErrorInfo`` reason ``SERVICE_DISABLED``: the ``gcloud services enable``
command), the missing permission and the role that grants it, a missing scope, refused credentials, an exhausted
quota, or the resource that was not found.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.api_core import exceptions as gexc
from google.cloud.run_v2 import RevisionsAsyncClient, ServicesAsyncClient, WorkerPoolsAsyncClient
from google.cloud.run_v2.services.revisions.transports import RevisionsGrpcAsyncIOTransport
from google.cloud.run_v2.services.services.transports import ServicesGrpcAsyncIOTransport
from google.cloud.run_v2.services.worker_pools.transports import WorkerPoolsGrpcAsyncIOTransport

from celeryops.adapters.deploy.base import DeployError, condense, role_for
from celeryops.core.config import Target, is_loopback_endpoint
from celeryops.core.masking import mask_text

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
DEFAULT_ENDPOINT = "run.googleapis.com"
API_NAME = "run.googleapis.com"  # the Cloud Run Admin API, as `gcloud services enable` names it
TRANSIENT = (gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.RetryError)
"""Errors a poll may see while Cloud Run is briefly unreachable (retried within the deployer's grace)."""
QUOTA = (gexc.ResourceExhausted, gexc.TooManyRequests)
"""A quota (or a rate limit) is exhausted: retried with backoff while a rollout is followed, then named."""
AUTH_PLUGIN_FAILURE = re.compile(r"Getting metadata from plugin failed|invalid_grant|RefreshError", re.I)
"""The credentials failed inside the channel (grpc reports it as UNAVAILABLE): an authentication problem."""
_SCOPES_FAILURE = re.compile(r"insufficient authentication scopes|ACCESS_TOKEN_SCOPE_INSUFFICIENT", re.I)
_ACCOUNT = re.compile(r"service ?account[: ]+'?([\w.@-]+@[\w.-]+?)'?(?:[\s,;)]|\.?$)", re.I)


@dataclass
class CloudRunClients:
    """The async clients a deploy uses, sharing one channel (``channel``)."""

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
        revisions=RevisionsAsyncClient(transport=RevisionsGrpcAsyncIOTransport(channel=channel)),
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


def permission_for(target: Target, verb: str) -> str:
    """``run.services.<verb>`` or ``run.workerpools.<verb>``, by the target's kind."""
    return f"{'run.services' if target.kind == 'cloudrun-service' else 'run.workerpools'}.{verb}"


def error_code(exc: gexc.GoogleAPICallError) -> str:
    """The gRPC status name of ``exc`` (``UNKNOWN`` when it has none)."""
    code = exc.grpc_status_code
    return code.name if code is not None else "UNKNOWN"


def error_message(exc: BaseException) -> str:
    """The error's message condensed to one masked line (its type's name when it has none)."""
    text = str(exc.message) if isinstance(exc, gexc.GoogleAPICallError) else str(exc)
    return mask_text(condense(text)[0]) if text else type(exc).__name__


def unavailable_error(target: Target, exc: BaseException, doing: str) -> DeployError:
    """The API did not answer while doing ``doing`` on the target (nothing was changed)."""
    return DeployError(f"The Cloud Run API did not answer when asked to {doing} {target.display} "
                       f"({error_message(exc)}): nothing was changed; check the network or api_endpoint and try again.",
                       code="UNAVAILABLE")


def quota_url(project: str) -> str:
    """The Cloud console page where a project's Cloud Run quotas are read and raised."""
    return f"https://console.cloud.google.com/iam-admin/quotas?project={project}&service={API_NAME}"


def api_disabled(target: Target, exc: gexc.GoogleAPICallError, doing: str) -> DeployError:
    """The Cloud Run Admin API is disabled in the target's project (the ``SERVICE_DISABLED`` error reason)."""
    api = str((exc.metadata or {}).get("service") or API_NAME)
    return DeployError(f"The Cloud Run Admin API ({api}) is disabled in project {target.project}, so celeryops "
                       f"could not {doing} {target.display}: nothing was changed; enable it with `gcloud services "
                       f"enable {api} --project {target.project}`, wait a minute, and try again.",
                       code="SERVICE_DISABLED")


def quota_error(target: Target, exc: gexc.GoogleAPICallError, doing: str) -> DeployError:
    """A quota (or rate limit) of the project is exhausted (RESOURCE_EXHAUSTED)."""
    return DeployError(f"Cloud Run refused to {doing} {target.display} because a quota of project {target.project} "
                       f"is exhausted ({error_message(exc)}): nothing was changed; wait a minute and try again, or "
                       f"raise the quota at {quota_url(target.project)}.", code="RESOURCE_EXHAUSTED")


def api_error(target: Target, exc: gexc.GoogleAPICallError, doing: str, permission: str, *,
              service_account: str = "") -> DeployError:
    """One sentence for an API error while doing ``doing`` (read, update, ...) on the target."""
    text = str(exc.message)
    if exc.reason == "SERVICE_DISABLED":  # PERMISSION_DENIED, but no role would help: the API is off
        return api_disabled(target, exc, doing)
    if isinstance(exc, QUOTA):
        return quota_error(target, exc, doing)
    if AUTH_PLUGIN_FAILURE.search(text) or isinstance(exc, gexc.Unauthenticated):
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
        named = named_permission(text) or permission
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
        err.code = error_code(exc)
        return err
    reason, logs_url = condense(text)
    return DeployError(f"Cloud Run refused to {doing} {target.display} ({error_code(exc)}: {mask_text(reason)}): "
                       "nothing was changed; fix the cause and try again.", code=error_code(exc), logs_url=logs_url)


def named_permission(message: str) -> str:
    """The permission an error message names (``Permission 'x' denied ...``), ``""`` when it names none."""
    start = message.find("Permission '")
    if start < 0:
        return ""
    rest = message[start + len("Permission '"):]
    return rest.split("'", 1)[0]
