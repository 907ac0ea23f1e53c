"""What a Cloud Run service or worker pool says about a rollout, and the rules of the update celeryops sends.

:func:`state_of` reads a Service / WorkerPool message as a
:class:`~celeryops.adapters.deploy.base.RolloutState`: the image of the target's container, generation and
reconciling, the latest created and ready revisions, the terminal condition condensed to one line, and the split
(``traffic`` / ``instance_splits``) as asked and as served, so readiness and pinned splits are judged on the
same terms for services and worker pools. :class:`ProgressTracker` turns successive snapshots into typed progress
events (only what changed).

The update: :func:`refuse_unready` refuses a resource that is still rolling out, or whose split pins older
revisions unless the target says ``traffic = "latest"``; :func:`prepare_update` puts the image into the chosen
container, routes everything to the new revision when asked, and forces a new revision when the image is
unchanged. :func:`traffic_pinned` and :func:`rollout_failed` are the sentences for a split that keeps the new
revision from serving and for Cloud Run's own failure reason.
"""

from __future__ import annotations

import uuid
from typing import Any

from google.cloud.run_v2 import (
    Condition,
    InstanceSplit,
    InstanceSplitAllocationType,
    Service,
    TrafficTarget,
    TrafficTargetAllocationType,
)

from celeryops.adapters.deploy.base import (
    ConditionChanged,
    DeployError,
    ProgressCallback,
    RevisionCreated,
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
_REDEPLOY_LABEL = "celeryops-redeploy"


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


def refuse_unready(target: Target, before: RolloutState, *, traffic: bool = True) -> None:
    """Raise DeployError when ``before`` is still rolling out, or (``traffic``) when its split pins older
    revisions and the target does not ask for ``traffic = "latest"``: nothing is changed then."""
    if before.reconciling:
        raise DeployError(f"{target.display} is still rolling out revision "
                          f"{short_revision(before.latest_created_revision)}: nothing was changed; wait "
                          "until it finished and deploy again.", code="BUSY")
    if traffic and before.pinned and target.traffic != "latest":
        raise traffic_pinned(target, before)


def prepare_update(target: Target, resource: Any, image: str, before: RolloutState) -> None:
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
