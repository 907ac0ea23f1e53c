"""How the Cloud Run stand-in's services and worker pools behave: seeding, revisions, rollouts and splits.

An update whose template changed (or, for a worker pool, with ``force_new_revision``) creates a revision named
``<resource>-0000N-abc``; an unchanged template makes none (only the split changes). The resource is marked as
reconciling and a long-running operation is returned whose metadata is the resource being reconciled; after
``rollout_seconds`` (per rollout adjustable) the operation finishes with the resource as response, or, for an
injected failure, with an error while ``latest_ready_revision`` stays the old revision and the terminal condition
carries the message (several lines with a Logs URL, as Cloud Run writes it). As on Cloud Run, after a failed
revision ``latest_created_revision`` is the failed one and ``latest_ready_revision`` the last serving one, and the
resource stays not Ready until a revision that becomes ready comes: an update that changes only the split or the
count is applied (``observed_generation``, the split statuses and the count follow it) and Ready stays False.

An update keeps the resource's ``annotations`` as sent (tools record their own data there). Like Cloud Run, it
keeps the split of a service's ``traffic`` (a worker pool's ``instance_splits``) on every
update that sends it back (an empty one means all to the latest revision), checks it (percentages add up to 100,
named revisions exist) and reports what serves in ``traffic_statuses`` / ``instance_split_statuses``: a split
pinned to a named revision keeps the new revision at 0%. ``validate_only`` checks an update (actAs on the
runtime service account, etag, split) and changes nothing; a stale ``etag`` answers ABORTED.

Instances (:mod:`celeryops.demo.standins.cloudrun_instances`, kept by
:mod:`celeryops.demo.standins.cloudrun_running`): every resource runs its instance count divided
among the revisions of its split. A rollout starts the new revision's instances first (through the launcher, e.g.
real Celery workers), and only once the revision is ready takes away the instances the new split no longer needs
(SIGTERM, SIGKILL 10 s later); if the new revision fails, its instances are taken away and the old ones stay. An
update that changes only the count or the split starts what it adds, then takes away what it removes.

``on_update(resource, revision, image)`` is called (on a background thread) when a rollout that will succeed
starts, once the new revision's instances started and before the revision becomes ready. If the hook (or starting
an instance) raises, the rollout fails with the exception's text.

An update Cloud Run would refuse raises :class:`Refusal` (a gRPC status and message). Permissions, faults and
serving over gRPC are the stand-in's (:mod:`celeryops.demo.standins.cloudrun`).
"""

from __future__ import annotations

import random
import string
import threading
import uuid
from collections.abc import Iterable
from typing import Any

import grpc
from google.cloud.run_v2 import (
    Condition,
    Container,
    InstanceSplit,
    InstanceSplitStatus,
    Revision,
    RevisionTemplate,
    Service,
    TrafficTarget,
    TrafficTargetStatus,
    WorkerPool,
    WorkerPoolRevisionTemplate,
)
from google.longrunning import operations_pb2
from google.rpc import code_pb2, status_pb2

from celeryops.demo.standins.cloudrun_running import (
    LATEST_SPLIT,
    LATEST_TRAFFIC,
    RunningResources,
    split_of,
)
from celeryops.demo.standins.cloudrun_support import (
    Failure,
    OperationRecord,
    ResourceRecord,
    condition,
    default_service_account,
    failure_message,
    log_uri,
    service_uri,
    timestamp_now,
)

_State = Condition.State
_SERVICE_CONDITIONS = ("ConfigurationsReady", "RoutesReady")
_POOL_CONDITIONS = ("ConfigurationsReady",)


class Refusal(Exception):
    """A request Cloud Run would refuse: the gRPC status and message the RPC answers."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def new_resource(is_service: bool, name: str) -> ResourceRecord:
    """A service or worker pool as Cloud Run creates it (uid, create time, a service's URL), before its template."""
    cls: Any = Service if is_service else WorkerPool
    message = cls(name=name, uid=str(uuid.uuid4()), create_time=timestamp_now())
    if is_service:
        message.uri = service_uri(name)
    return ResourceRecord(name=name, is_service=is_service, message=message)


class CloudRunModel(RunningResources):
    """The stand-in's resources and operations, and how updates change them (thread-safe: one lock; the
    resource table and the instances are :class:`RunningResources`')."""

    # ------------------------------------------------------------------------------------------ seeding

    def add_service(self, project: str, region: str, name: str, image: str | Iterable[tuple[str, str]], *,
                    instances: int = 1) -> str:
        """Create a ready service with one revision running ``instances`` instances (started through the launcher
        before this returns); ``image`` is an image (one container named ``worker``) or ``(container, image)``
        pairs. Returns its full resource name."""
        return self._add(True, f"projects/{project}/locations/{region}/services/{name}", image, instances)

    def add_worker_pool(self, project: str, region: str, name: str, image: str | Iterable[tuple[str, str]], *,
                        instances: int | None = None) -> str:
        """Like :meth:`add_service`, for a worker pool; ``instances`` is its ``scaling.manual_instance_count``
        (None: unset, which Cloud Run runs as 1)."""
        return self._add(False, f"projects/{project}/locations/{region}/workerPools/{name}", image, instances)

    def _add(self, is_service: bool, name: str, image: str | Iterable[tuple[str, str]], instances: int | None) -> str:
        pairs = [("worker", image)] if isinstance(image, str) else list(image)
        containers = [Container(name=c, image=i) for c, i in pairs]
        res = new_resource(is_service, name)
        message = res.message
        if is_service:
            message.template = RevisionTemplate(containers=containers)
            message.traffic = [TrafficTarget(type_=LATEST_TRAFFIC, percent=100)]
            res.instances = 1 if instances is None else instances
        else:
            message.template = WorkerPoolRevisionTemplate(containers=containers)
            message.instance_splits = [InstanceSplit(type_=LATEST_SPLIT, percent=100)]
            if instances is not None:
                message.scaling.manual_instance_count = instances
        with self._lock:
            self._resources[name] = res
            revision = self._new_revision(res)
            revision.reconciling = False
            revision.conditions = [condition("Ready", _State.CONDITION_SUCCEEDED)]
            message.generation = 1
            message.observed_generation = 1
            message.latest_created_revision = revision.name
            message.latest_ready_revision = revision.name
            self._settle(res, ok=True, message="")
            wanted = self._wanted(res)
        self.instance_set.grow(name, res.instance_kind, wanted, self._image_of(res))
        return name

    # ------------------------------------------------------------------------------------------ state machine

    def _new_revision(self, res: ResourceRecord) -> Revision:
        number = next(res.counter)
        short = res.message.template.revision
        if not short:
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=3))
            short = f"{res.short}-{number:05d}-{suffix}"
        template = res.message.template
        revision = Revision(
            name=f"{res.name}/revisions/{short}",
            uid=str(uuid.uuid4()),
            generation=1,
            create_time=timestamp_now(),
            containers=[Container(name=c.name, image=c.image) for c in template.containers],
            reconciling=True,
            conditions=[condition("Ready", _State.CONDITION_RECONCILING, "Deploying revision.")],
            log_uri=log_uri(res.name, short),
        )
        if res.is_service:
            revision.service = res.short
            revision.scaling = template.scaling  # revision-level min / max instances
        res.revisions.append(revision)
        return revision

    def _settle(self, res: ResourceRecord, *, ok: bool, message: str) -> None:
        msg = res.message
        names = _SERVICE_CONDITIONS if res.is_service else _POOL_CONDITIONS
        msg.reconciling = False
        msg.observed_generation = msg.generation  # a failed generation was observed too
        if ok and not self._failed_latest(res):
            msg.latest_ready_revision = msg.latest_created_revision
            msg.terminal_condition = condition("Ready", _State.CONDITION_SUCCEEDED)
            msg.conditions = [condition(n, _State.CONDITION_SUCCEEDED) for n in names]
            self._route(res)
        elif ok:  # a split or count alone, while the latest created revision failed: applied, and still not Ready
            self._route(res)
        else:
            msg.terminal_condition = condition("Ready", _State.CONDITION_FAILED, message)
            msg.conditions = [condition("ConfigurationsReady", _State.CONDITION_FAILED, message)] + [
                condition(n, _State.CONDITION_SUCCEEDED) for n in names[1:]]
        msg.etag = f'"{uuid.uuid4().hex[:12]}"'
        msg.update_time = timestamp_now()

    @staticmethod
    def _failed_latest(res: ResourceRecord) -> bool:
        """The latest created revision failed: Cloud Run keeps ``latest_ready_revision`` on the last good one, and
        the resource not Ready (its failure kept), until a revision that becomes ready comes."""
        latest = next((r for r in res.revisions if r.name == res.message.latest_created_revision), None)
        return latest is not None and any(c.type_ == "Ready" and c.state == _State.CONDITION_FAILED
                                          for c in latest.conditions)

    # -- splits: a service's traffic, a worker pool's instance_splits ---------------------------------------------

    def _checked_split(self, res: ResourceRecord, new: Any) -> list[Any]:
        """The split an update asks for (empty: all to the latest revision), refused like Cloud Run refuses it; it
        may name the revision the same update names up front (``template.revision``)."""
        latest_type = LATEST_TRAFFIC if res.is_service else LATEST_SPLIT
        entries = list(split_of(res, new))
        if not entries:
            entry_type: Any = TrafficTarget if res.is_service else InstanceSplit
            entries = [entry_type(type_=latest_type, percent=100)]
        field_name = "traffic" if res.is_service else "instance_splits"
        total = sum(e.percent for e in entries)
        if total != 100:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                          f"The percentages in {field_name} of {res.kind} {res.short} add up to {total}, not 100.")
        existing = {r.name.rsplit("/", 1)[-1] for r in res.revisions} | {new.template.revision} - {""}
        for entry in entries:
            if entry.type_ != latest_type and entry.revision.rsplit("/", 1)[-1] not in existing:
                raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                              f"Revision '{entry.revision}' named in {field_name} of {res.kind} {res.short} does not "
                              "exist.")
        return entries

    def _route(self, res: ResourceRecord) -> None:
        """Statuses follow the asked-for split once the resource is ready (the latest entry names its revision)."""
        msg = res.message
        latest = msg.latest_ready_revision.rsplit("/", 1)[-1]
        if res.is_service:
            msg.traffic_statuses = [
                TrafficTargetStatus(type_=e.type_, revision=latest if e.type_ == LATEST_TRAFFIC else e.revision,
                                    percent=e.percent, tag=e.tag,
                                    uri=msg.uri.replace("https://", f"https://{e.tag}---") if e.tag else "")
                for e in msg.traffic]
        else:
            msg.instance_split_statuses = [
                InstanceSplitStatus(type_=e.type_, revision=latest if e.type_ == LATEST_SPLIT else e.revision,
                                    percent=e.percent)
                for e in msg.instance_splits]

    def _update(self, res: ResourceRecord, new: Any, *, validate_only: bool = False, force_new_revision: bool = False,
                created: bool = False) -> operations_pb2.Operation:
        with self._lock:
            msg = res.message
            if res.busy:
                raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                              f"A rollout of {res.kind} {res.short} is still in progress; retry when it finished.")
            if res.race_next:  # someone else's update lands between the caller's read and this update
                res.race_next = False
                msg.etag = f'"{uuid.uuid4().hex[:12]}"'
            if new.etag and new.etag != msg.etag:
                raise Refusal(grpc.StatusCode.ABORTED,
                              f"The {res.kind} {res.short} was modified since it was read (etag mismatch).")
            account = new.template.service_account or default_service_account(res.project)
            if self._act_as is not None and account not in self._act_as:
                raise Refusal(grpc.StatusCode.PERMISSION_DENIED,
                              f"Permission 'iam.serviceAccounts.actAs' denied on service account {account} (or it may "
                              "not exist).")
            split = self._checked_split(res, new)
            if not res.is_service and "manual_instance_count" in new.scaling and new.scaling.manual_instance_count < 0:
                raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                              f"scaling.manual_instance_count of worker pool {res.short} must not be negative.")
            template_type: Any = RevisionTemplate if res.is_service else WorkerPoolRevisionTemplate
            changed_template = template_type.serialize(new.template) != template_type.serialize(msg.template)
            makes_revision = created or changed_template or force_new_revision
            fixed = new.template.revision  # a revision named up front cannot be made twice
            if makes_revision and fixed and any(r.name.rsplit("/", 1)[-1] == fixed for r in res.revisions):
                raise Refusal(grpc.StatusCode.ALREADY_EXISTS,
                              f"Revision named '{fixed}' with different configuration already exists.")
            region, project = res.region, res.project
            op = OperationRecord(name=f"projects/{project}/locations/{region}/operations/{uuid.uuid4()}", resource=res)
            if validate_only:  # checked; nothing changes
                preview = res.snapshot()
                preview.template = new.template
                preview.scaling = new.scaling
                preview.annotations = dict(new.annotations)
                if res.is_service:
                    preview.traffic = split
                else:
                    preview.instance_splits = split
                op.done, op.preview = True, preview
                self._operations[op.name] = op
                self.validations.append(res.name)
                return self._operation_pb(op)
            old_images = {c.name: c.image for c in msg.template.containers}
            msg.template = new.template
            msg.scaling = new.scaling
            msg.annotations = dict(new.annotations)  # the resource's own (not the template's): no new revision
            if res.is_service:
                msg.traffic = split
            else:
                msg.instance_splits = split
            changed = [c.image for c in msg.template.containers if old_images.get(c.name) != c.image]
            image = changed[0] if changed else (msg.template.containers[0].image if msg.template.containers else "")
            msg.generation = msg.generation + 1
            msg.reconciling = True
            revision = self._new_revision(res) if makes_revision else None
            names = _SERVICE_CONDITIONS if res.is_service else _POOL_CONDITIONS
            short = revision.name.rsplit("/", 1)[-1] if revision else msg.latest_ready_revision.rsplit("/", 1)[-1]
            if revision is not None:
                msg.latest_created_revision = revision.name
                msg.terminal_condition = condition("Ready", _State.CONDITION_RECONCILING,
                                                    f"Deploying revision {short}.")
                msg.conditions = [condition("ConfigurationsReady", _State.CONDITION_RECONCILING,
                                             f"Creating revision {short}.")] + [
                    condition(n, _State.CONDITION_RECONCILING, f"Waiting for revision {short}.") for n in names[1:]]
            elif not self._failed_latest(res):  # else the failure stays the resource's Ready until a good revision
                msg.terminal_condition = condition("Ready", _State.CONDITION_RECONCILING, "Routing traffic.")
            msg.etag = f'"{uuid.uuid4().hex[:12]}"'
            msg.update_time = timestamp_now()
            res.busy = True
            failure = res.fail_next if revision is not None else None  # a split alone cannot fail
            delay = res.next_delay if res.next_delay is not None else self.rollout_seconds
            if revision is not None:
                res.fail_next = None
            res.next_delay = None
            self._operations[op.name] = op
            if revision is not None:
                self.updates.append((res.name, revision.name, image))
            thread = threading.Thread(target=self._rollout, args=(op, revision, image, failure, delay),
                                      name=f"rollout-{short}", daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
            thread.start()
            return self._operation_pb(op)

    def _rollout(self, op: OperationRecord, revision: Revision | None, image: str, failure: Failure | None,
                 delay: float) -> None:
        """The rollout, on its own thread: the new revision's instances start first; once it is ready, the
        instances the new split no longer needs are taken away (after ``retire_delay``). A failed revision's
        instances are taken away and the serving ones stay."""
        res = op.resource
        short = revision.name.rsplit("/", 1)[-1] if revision is not None else ""
        with self._lock:
            after = self._wanted(res, latest=short)
        images = self._image_of(res)
        if revision is not None and failure is None:
            try:
                self.instance_set.grow(res.name, res.instance_kind, {short: after.get(short, 0)}, images)
                if self.on_update is not None:
                    self.on_update(res.name, revision.name, image)
            except Exception as exc:  # an instance that cannot start, or the hook: the revision's failure
                failure = Failure(f"Revision '{short}' is not ready and cannot serve traffic: {exc}")
        self._stopping.wait(delay)
        if failure is None:
            try:  # what the new split adds for the other revisions (a count raised, a split changed)
                self.instance_set.grow(res.name, res.instance_kind, after, images)
            except Exception as exc:
                failure = Failure(f"An instance of {res.kind} {res.short} failed to start: {exc}")
        if failure is not None and revision is not None:
            self.instance_set.shrink(res.name, {r: n for r, n in self.instance_set.counts(res.name).items()
                                                if r != short})
        with self._lock:
            if failure is not None:
                message = failure.message or failure_message(short, revision.log_uri if revision else "")
                if revision is not None:
                    revision.reconciling = False
                    failed = condition("Ready", _State.CONDITION_FAILED, message)
                    if failure.reason:
                        failed.reason = getattr(Condition.CommonReason, failure.reason)
                    elif failure.revision_reason:
                        failed.revision_reason = getattr(Condition.RevisionReason, failure.revision_reason)
                    revision.conditions = [failed]
                self._settle(res, ok=False, message=message)
                op.error = status_pb2.Status(code=code_pb2.FAILED_PRECONDITION, message=message)
            else:
                if revision is not None:
                    revision.reconciling = False
                    revision.observed_generation = revision.generation
                    revision.conditions = [condition("Ready", _State.CONDITION_SUCCEEDED)]
                self._settle(res, ok=True, message="")
            self._wanted(res)  # the revisions' desired instances, as served now
            op.done = True
            res.busy = False
            retire_delay = res.retire_delay
        if failure is None:
            if retire_delay:
                self._stopping.wait(retire_delay)
            self.instance_set.shrink(res.name, after)

    def _operation_pb(self, op: OperationRecord) -> operations_pb2.Operation:
        result = operations_pb2.Operation(name=op.name, done=op.done, metadata=op.resource.pack(op.preview))
        if op.done:
            if op.error is not None:
                result.error.CopyFrom(op.error)
            else:
                result.response.CopyFrom(op.resource.pack(op.preview))
        return result
