"""How deploy facts are worded for the operator: revision names and splits, a resource's logs link, Cloud Run's
failure messages condensed to one line, and the role that grants a missing permission (no Google libraries)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import quote

__all__ = ["PERMISSION_ROLES", "REASON_LIMIT", "REVISION_PERMISSIONS", "condense", "describe_split", "logs_link",
           "role_for", "short_revision"]

#: What an overlap deploy and a rollback read besides the resource: its revisions (which exist, which are ready,
#: how many instances each runs). Granted by roles/run.viewer (read only) and by roles/run.developer.
REVISION_PERMISSIONS: tuple[str, ...] = ("run.revisions.get", "run.revisions.list")

#: The role that grants each permission a deploy needs (``iam.serviceAccounts.actAs`` is granted on the runtime
#: service account itself, not on the project or the Cloud Run resource).
PERMISSION_ROLES: dict[str, str] = {
    "run.services.get": "roles/run.developer",
    "run.services.update": "roles/run.developer",
    "run.workerpools.get": "roles/run.developer",
    "run.workerpools.update": "roles/run.developer",
    "run.operations.get": "roles/run.developer",
    "run.revisions.get": "roles/run.viewer or roles/run.developer",
    "run.revisions.list": "roles/run.viewer or roles/run.developer",
    "iam.serviceAccounts.actAs": "roles/iam.serviceAccountUser",
}


def role_for(permission: str, service_account: str = "") -> str:
    """How to grant ``permission``: ``roles/run.developer``, or ``roles/iam.serviceAccountUser on the runtime
    service account X`` for actAs (an unknown permission: a role that contains it)."""
    role = PERMISSION_ROLES.get(permission, "")
    if permission == "iam.serviceAccounts.actAs":
        account = f"the runtime service account {service_account}" if service_account else \
            "the runtime service account (the default compute service account when none is set)"
        return f"{role} on {account}"
    return role or f"a role that contains {permission}"


_LOGS_URL = re.compile(r"Logs URL:\s*(\S+)", re.I)
_BOILERPLATE = re.compile(
    r"(For more troubleshooting guidance, see \S+|Logs for this revision might contain more information\.?"
    r"|Logs URL:\s*\S+)", re.I)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
REASON_LIMIT = 300


def condense(message: str) -> tuple[str, str]:
    """A Cloud Run failure message (several lines: a sentence or two, a Logs URL, a troubleshooting link) as
    ``(reason, logs_url)``: the reason is one line without the links (a "Revision X is not ready" preamble is
    dropped when a cause follows), shortened to about ``REASON_LIMIT`` characters, without a final period."""
    found = _LOGS_URL.search(message)
    logs_url = found.group(1).rstrip(".,;") if found else ""
    text = " ".join(_BOILERPLATE.sub(" ", message).split())
    sentences = [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]
    if len(sentences) > 1 and re.match(r"Revision '?[\w-]+'? is not ready", sentences[0]):
        sentences = sentences[1:]
    reason = ""
    for sentence in sentences:
        candidate = f"{reason} {sentence}".strip()
        if reason and len(candidate) > REASON_LIMIT:
            break
        reason = candidate
    if len(reason) > REASON_LIMIT:
        reason = reason[:REASON_LIMIT - 1].rsplit(" ", 1)[0] + "…"
    return reason.rstrip(". ") or "no message", logs_url


def describe_split(split: Sequence[tuple[str, int]], latest: str = "") -> str:
    """``worker-00001-abc 100%`` / ``latest (worker-00002-def) 90%, worker-00001-abc 10%``."""
    named = [f"{rev or ('latest (' + short_revision(latest) + ')' if latest else 'latest')} {pct}%"
             for rev, pct in split if pct > 0]
    return ", ".join(named) or "no revision"


def short_revision(name: str) -> str:
    """``projects/.../revisions/worker-00002-abc`` -> ``worker-00002-abc``."""
    return name.rsplit("/", 1)[-1]


def logs_link(kind: str, project: str, region: str, resource: str, revision: str = "") -> str:
    """The Logs Explorer page of a Cloud Run resource (or one of its revisions): a service's logs are on
    ``resource.type = "cloud_run_revision"`` by ``service_name``, a worker pool's on ``"cloud_run_worker_pool"`` by
    ``worker_pool_name``. Used when Cloud Run gave no ``log_uri``."""
    if kind == "cloudrun-worker-pool":
        lines = ['resource.type="cloud_run_worker_pool"', f'resource.labels.worker_pool_name="{resource}"']
    else:
        lines = ['resource.type="cloud_run_revision"', f'resource.labels.service_name="{resource}"']
    lines.append(f'resource.labels.location="{region}"')
    if revision:
        lines.append(f'resource.labels.revision_name="{short_revision(revision)}"')
    return f"https://console.cloud.google.com/logs/query;query={quote(chr(10).join(lines), safe='')}?project={project}"
