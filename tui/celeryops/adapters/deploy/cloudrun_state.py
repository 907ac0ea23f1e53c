"""What a Cloud Run service or worker pool says about a rollout, and the rules of the update celeryops sends.

:func:`state_of` reads a Service / WorkerPool message as a
:class:`~celeryops.adapters.deploy.base.RolloutState`: the image of the target's container, generation and
reconciling, the latest created and ready revisions, the terminal condition condensed to one line, and the split
(``traffic`` / ``instance_splits``) as asked and as served, so readiness and pinned splits are judged on the
same terms for services and worker pools. :class:`ProgressTracker` turns successive snapshots into typed progress
events (only what changed).

The update: :func:`refuse_unready` refuses a resource that is still rolling out, or whose split pins older
revisions unless the target says ``traffic = "latest"``, or a worker pool whose update would leave no instance
(``manual_instance_count`` 0); :func:`prepare_update` puts the image into the chosen container, routes everything
to the new revision when asked, and forces a new revision when the image is unchanged; :func:`prepare_pool_update`
sets a worker pool's count, split and new revision's name in one update. :func:`traffic_pinned` and
:func:`rollout_failed` are the sentences for a split that keeps the new revision from serving and for a revision
that failed (its name, Cloud Run's reason and a remedy that fits it).
"""

from __future__ import annotations

import uuid
from typing import Any

from google.cloud.run_v2 import (
    Condition,
    InstanceSplit,
    InstanceSplitAllocationType,
    Revision,
    Service,
    ServiceScaling,
    TrafficTarget,
    TrafficTargetAllocationType,
)

from celeryops.adapters.deploy.base import (
    ConditionChanged,
    DeployError,
    PoolUpdate,
    ProgressCallback,
    RevisionCreated,
    RevisionInfo,
    RolloutState,
    condense,
    describe_split,
    short_revision,
)
from celeryops.core.config import Target
from celeryops.core.masking import mask_text

_STATE_NAMES = {
    Condition.State.CONDITION_SUCCEEDED: "succeeded",
    Condition.State.CONDITION_FAILED: "failed",
    Condition.State.CONDITION_RECONCILING: "reconciling",
    Condition.State.CONDITION_PENDING: "pending",
}
_LATEST_TRAFFIC = TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST
_LATEST_SPLIT = InstanceSplitAllocationType.INSTANCE_SPLIT_ALLOCATION_TYPE_LATEST
_BY_NAME_TRAFFIC = TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_REVISION
_BY_NAME_SPLIT = InstanceSplitAllocationType.INSTANCE_SPLIT_ALLOCATION_TYPE_REVISION
_REDEPLOY_LABEL = "celeryops-redeploy"
#: The resource annotation in which celeryops records the split it left itself (a rollback's: ``rev=100``), and the
#: one that says who left it (``rollback run <id>``): a later deploy routes everything to its new revision when the
#: split is still that one (:attr:`RolloutState.owned`). Annotations are for "external tools" (Cloud Run API v2).
SPLIT_ANNOTATION = "celeryops/split"
SPLIT_BY_ANNOTATION = "celeryops/split-by"


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
        instance_count=instance_count(resource),
        instance_count_set=isinstance(resource, Service) or "manual_instance_count" in resource.scaling,
        scaling_mode="manual" if isinstance(resource, Service) else pool_scaling_mode(resource.scaling),
        owned_split=parse_split(resource.annotations.get(SPLIT_ANNOTATION, "")),
        tagged=tuple((t.tag, short_revision(t.revision)) for t in resource.traffic
                     if t.tag and t.revision and t.type_ != _LATEST_TRAFFIC) if isinstance(resource, Service) else (),
    )


def format_split(split: tuple[tuple[str, int], ...]) -> str:
    """``worker-00001-abc=100`` (``,`` between entries): a split as the ``celeryops/split`` annotation holds it."""
    return ",".join(f"{short_revision(rev)}={pct}" for rev, pct in split)


def parse_split(text: str) -> tuple[tuple[str, int], ...]:
    """The inverse of :func:`format_split`; anything malformed reads as no split (never celeryops' own)."""
    entries: list[tuple[str, int]] = []
    for part in text.split(","):
        rev, sep, pct = part.strip().rpartition("=")
        if not sep or not rev or not pct.isdigit():
            return ()
        entries.append((rev, int(pct)))
    return tuple(entries)


def pool_scaling_mode(scaling: Any) -> str:
    """A worker pool's scaling mode: ``automatic`` when Cloud Run sizes it itself, else ``manual``. Read from
    ``scaling_mode`` where the client knows the field; this client (0.16) knows only ``manual_instance_count``, so a
    scaling message that carries settings it cannot read (the API's scaling mode, min and max) and no manual count
    is an automatically scaled pool."""
    if "scaling_mode" in type(scaling).meta.fields:
        return "automatic" if "AUTOMATIC" in str(scaling.scaling_mode).upper() else "manual"
    from google.protobuf.unknown_fields import UnknownFieldSet

    unread = len(UnknownFieldSet(type(scaling).pb(scaling)))
    return "automatic" if unread and "manual_instance_count" not in scaling else "manual"


def instance_count(resource: Any) -> int | None:
    """A WorkerPool's ``scaling.manual_instance_count`` (1 when unset: Cloud Run's default), a Service's in manual
    scaling mode; None for an autoscaled service."""
    scaling = resource.scaling
    if isinstance(resource, Service):
        manual = scaling.scaling_mode == ServiceScaling.ScalingMode.MANUAL and "manual_instance_count" in scaling
        return int(scaling.manual_instance_count) if manual else None
    return int(scaling.manual_instance_count) if "manual_instance_count" in scaling else 1


def revision_info(revision: Revision) -> RevisionInfo:
    """A Revision message as a RevisionInfo (its Ready condition, logs link and desired instances)."""
    ready = next((c for c in revision.conditions if c.type_ == "Ready"), None)
    reason = ""
    if ready is not None:
        for value in (ready.reason, ready.revision_reason):
            if value:
                reason = value.name
    created = revision.create_time
    return RevisionInfo(
        name=short_revision(revision.name),
        image=revision.containers[0].image if revision.containers else "",
        state=_STATE_NAMES.get(ready.state, "") if ready is not None else "",
        reason=reason,
        message=mask_text(condense(ready.message)[0]) if ready is not None and ready.message else "",
        log_uri=revision.log_uri,
        instances=int(revision.scaling_status.desired_min_instance_count),
        created=created.isoformat() if created else "",
        min_instances=int(revision.scaling.min_instance_count),
    )


def _split_entry(entry: Any, latest_type: Any) -> tuple[str, int]:
    """A TrafficTarget(Status) / InstanceSplit(Status) as ``(short revision, percent)``, ``""`` for the entry
    that follows the latest ready revision (its status may name that revision too)."""
    if entry.type_ == latest_type:
        return "", int(entry.percent)
    return short_revision(entry.revision), int(entry.percent)


class ProgressTracker:
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


def refuse_unready(target: Target, before: RolloutState, *, traffic: bool = True, count: int | None = None) -> None:
    """Raise DeployError when ``before`` is still rolling out, when it is a worker pool that runs no instance
    (the new revision would run none either) and the update gives it none (``count``: the instance count it sets),
    or (``traffic``) when its split pins older revisions and the target does not ask for ``traffic = "latest"``:
    nothing is changed then."""
    if before.reconciling:
        raise DeployError(f"{target.display} is still rolling out revision "
                          f"{short_revision(before.latest_created_revision)}: nothing was changed; wait "
                          "until it finished and deploy again.", code="BUSY")
    if target.kind == "cloudrun-worker-pool" and before.instance_count == 0 and count is None:
        raise no_instances(target)
    if traffic and before.pinned and target.traffic != "latest" and not before.owned:
        raise traffic_pinned(target, before)


def no_instances(target: Target) -> DeployError:
    """A worker pool whose update would leave no instance: its new revision would run no worker."""
    return DeployError(f"{target.display} has scaling.manual_instance_count = 0, so its new revision would run no "
                       "instance and no worker would consume: nothing was changed; give it instances (`gcloud run "
                       f"worker-pools update {target.resource} --instances N --project {target.project} --region "
                       f"{target.region}`) and deploy again.", code="NO_INSTANCES")


def prepare_pool_update(target: Target, pool: Any, change: PoolUpdate) -> None:
    """``change`` written into the WorkerPool message ``pool`` (sent whole by the update): the image into the
    chosen container, the new revision's name, the instance count, the split (``""`` entries follow the latest
    revision; recorded as celeryops' own with ``owned_by``, else any such record dropped). Raises DeployError (nothing
    sent) for a negative count or a split that does not add up to 100."""
    if change.image is not None:
        _set_image(target, pool, change.image)  # clears the template's revision name: Cloud Run names the new one
    if change.revision:
        pool.template.revision = change.revision
    if change.instance_count is not None:
        if change.instance_count < 0:
            raise DeployError(f"An instance count of {change.instance_count} for {target.display} is not possible: "
                              "nothing was changed.", code="INVALID")
        pool.scaling.manual_instance_count = change.instance_count
    if change.split is not None:
        total = sum(pct for _rev, pct in change.split)
        if total != 100:
            raise DeployError(f"The instance split {describe_split(change.split)} for {target.display} adds up to "
                              f"{total}%, not 100%: nothing was changed.", code="INVALID")
        pool.instance_splits = [
            InstanceSplit(type_=_LATEST_SPLIT, percent=pct) if not rev
            else InstanceSplit(type_=InstanceSplitAllocationType.INSTANCE_SPLIT_ALLOCATION_TYPE_REVISION,
                               revision=short_revision(rev), percent=pct)
            for rev, pct in change.split]
        if change.owned_by:
            pool.annotations[SPLIT_ANNOTATION] = format_split(change.split)
            pool.annotations[SPLIT_BY_ANNOTATION] = change.owned_by
        else:
            for key in (SPLIT_ANNOTATION, SPLIT_BY_ANNOTATION):
                pool.annotations.pop(key, None)


def prepare_update(target: Target, resource: Any, image: str, before: RolloutState) -> None:
    """The update: the image; all traffic to the latest revision when the target asks for it, or when the split
    that pins older revisions is the one celeryops left (a rollback's: its annotation goes too); tagged revisions
    keep their tags at 0%; a label that forces a new revision when the image is unchanged (a service has no
    force_new_revision, and Cloud Run makes no revision for an unchanged template)."""
    unchanged = before.image == image
    _set_image(target, resource, image)
    if target.traffic == "latest" or before.owned:
        for key in (SPLIT_ANNOTATION, SPLIT_BY_ANNOTATION):
            resource.annotations.pop(key, None)
        if isinstance(resource, Service):
            tagged = [TrafficTarget(type_=t.type_, revision=t.revision, percent=0, tag=t.tag)
                      for t in resource.traffic if t.tag and t.revision and t.type_ != _LATEST_TRAFFIC]
            latest_tag = next((t.tag for t in resource.traffic if t.type_ == _LATEST_TRAFFIC and t.tag), "")
            resource.traffic = [TrafficTarget(type_=_LATEST_TRAFFIC, percent=100, tag=latest_tag), *tagged]
        else:
            resource.instance_splits = [InstanceSplit(type_=_LATEST_SPLIT, percent=100)]
    if unchanged and isinstance(resource, Service):
        resource.template.labels[_REDEPLOY_LABEL] = uuid.uuid4().hex[:12]


def prepare_route(target: Target, resource: Any, split: tuple[tuple[str, int], ...], by: str = "") -> None:
    """Route the resource's traffic (a worker pool's instances) to existing revisions, ``split`` naming each
    (``(short name, percent)``), and record the split as celeryops' own in the resource's annotations (``by``: who
    left it). The template is untouched: no new revision. A service's tagged revisions keep their tags at 0%.
    Raises DeployError (nothing sent) for a split that does not add up to 100% or names no revision."""
    total = sum(pct for _rev, pct in split)
    if total != 100 or any(not rev for rev, _pct in split):
        raise DeployError(f"The split {describe_split(split)} for {target.display} must name revisions and add up "
                          f"to 100%, not {total}%: nothing was changed.", code="INVALID")
    if isinstance(resource, Service):
        kept = {short_revision(t.revision): t.tag for t in resource.traffic if t.tag and t.revision}
        named = [TrafficTarget(type_=_BY_NAME_TRAFFIC, revision=short_revision(rev), percent=pct,
                               tag=kept.pop(short_revision(rev), "")) for rev, pct in split]
        tagged = [TrafficTarget(type_=_BY_NAME_TRAFFIC, revision=rev, percent=0, tag=tag) for rev, tag in kept.items()]
        latest_tag = next((t.tag for t in resource.traffic if t.type_ == _LATEST_TRAFFIC and t.tag), "")
        latest = [TrafficTarget(type_=_LATEST_TRAFFIC, percent=0, tag=latest_tag)] if latest_tag else []
        resource.traffic = [*named, *tagged, *latest]
    else:
        resource.instance_splits = [InstanceSplit(type_=_BY_NAME_SPLIT, revision=short_revision(rev), percent=pct)
                                    for rev, pct in split]
    resource.annotations[SPLIT_ANNOTATION] = format_split(split)
    resource.annotations[SPLIT_BY_ANNOTATION] = by or "celeryops"


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


_SERVICE_AGENT = "the Cloud Run service agent (service-PROJECT_NUMBER@serverless-robot-prod.iam.gserviceaccount.com)"
#: The remedy for a revision that failed, by Cloud Run's reason (``Condition.CommonReason`` / ``RevisionReason``).
FAILURE_REMEDIES: dict[str, str] = {
    "CONTAINER_MISSING": "the image does not exist: push {image} (or fix the target's image) and deploy again",
    "CONTAINER_PERMISSION_DENIED": f"Cloud Run may not pull the image: grant roles/artifactregistry.reader on its "
                                   f"repository to {_SERVICE_AGENT}, then deploy again",
    "CONTAINER_IMAGE_UNAUTHORIZED": "Binary Authorization refused the image: attest it or change the policy, then "
                                    "deploy again",
    "CONTAINER_IMAGE_AUTHORIZATION_CHECK_FAILED": "Binary Authorization could not check the image: read the "
                                                  "revision's logs and deploy again",
    "SECRETS_ACCESS_CHECK_FAILED": "the runtime service account may not read a secret the revision uses: grant it "
                                   "roles/secretmanager.secretAccessor on that secret, then deploy again",
    "ENCRYPTION_KEY_PERMISSION_DENIED": f"grant roles/cloudkms.cryptoKeyEncrypterDecrypter on the key to "
                                        f"{_SERVICE_AGENT}, then deploy again",
    "VPC_NETWORK_NOT_FOUND": "fix the revision's VPC network (or connector) and deploy again",
    "MIN_INSTANCES_NOT_PROVISIONED": "Cloud Run could not start enough instances (capacity or quota in the region): "
                                     "deploy again later, or with fewer instances",
}
DEFAULT_REMEDY = "read the revision's logs, fix the image and deploy again"


def rollout_failed(target: Target, image: str, before: RolloutState, message: str, *,
                   revision: RevisionInfo | None = None, logs_url: str = "") -> DeployError:
    """The revision that failed, by name, with Cloud Run's reason (the revision's Ready condition: its reason code
    and message, else the operation's message, condensed to one line), what kept serving, and the remedy that fits
    the reason. ``logs_url`` (else the revision's ``log_uri``, else a Logs URL in the message) is kept apart."""
    previous = short_revision(before.latest_ready_revision) or "(none)"
    reason, url = condense(message)
    if revision is not None and revision.message:
        reason = revision.message
    code = revision.reason if revision is not None else ""
    why = f"{code}: {mask_text(reason)}" if code else mask_text(reason)
    which = f"revision {revision.name}" if revision is not None and revision.name else "the new revision"
    remedy = FAILURE_REMEDIES.get(code, DEFAULT_REMEDY).format(image=image)
    return DeployError(f"Cloud Run could not roll out {image} to {target.display}: {which} failed ({why}); the "
                       f"previous revision {previous} keeps serving; {remedy}.", code="ROLLOUT_FAILED",
                       logs_url=logs_url or (revision.log_uri if revision is not None else "") or url)
