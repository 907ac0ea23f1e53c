"""The Cloud Run stand-in's resources and what runs for them: the resource table (found by full or short name), the
instances each revision runs under the split that serves (a tagged service revision keeps its min instances), a
service's autoscaler (:meth:`RunningResources.scale`), and the rollout threads that
:meth:`~RunningResources.wait_rollouts` waits for. How updates change the resources is
:mod:`celeryops.demo.standins.cloudrun_model`'s.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from google.cloud.run_v2 import InstanceSplitAllocationType, TrafficTargetAllocationType

from celeryops.demo.standins.cloudrun_instances import (
    GRACE_SECONDS,
    Instance,
    InstanceLauncher,
    InstanceSet,
    allocate,
    instance_count,
)
from celeryops.demo.standins.cloudrun_support import OperationRecord, ResourceRecord

__all__ = ["LATEST_SPLIT", "LATEST_TRAFFIC", "OnUpdate", "RunningResources", "split_of"]

#: ``on_update(resource, revision, image)``: a rollout that will succeed starts (see the model's docstring)
OnUpdate = Callable[[str, str, str], None]

LATEST_TRAFFIC = TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST
LATEST_SPLIT = InstanceSplitAllocationType.INSTANCE_SPLIT_ALLOCATION_TYPE_LATEST


def split_of(res: ResourceRecord, message: Any) -> Any:
    """The split of ``message``: a service's ``traffic``, a worker pool's ``instance_splits``."""
    return message.traffic if res.is_service else message.instance_splits


class RunningResources:
    """The resources, their operations and the instances they run (thread-safe: one lock)."""

    def __init__(self, *, rollout_seconds: float = 0.3, on_update: OnUpdate | None = None,
                 launcher: InstanceLauncher | None = None, grace: float = GRACE_SECONDS,
                 rng: random.Random | None = None) -> None:
        self.rollout_seconds = rollout_seconds
        self.on_update = on_update
        self.instance_set = InstanceSet(launcher, grace, rng if rng is not None else random.Random())
        self.updates: list[tuple[str, str, str]] = []  # (resource, revision, image) of every accepted update
        self.validations: list[str] = []  # resource names of every validate_only update that passed
        self._lock = threading.RLock()
        self._resources: dict[str, ResourceRecord] = {}
        self._operations: dict[str, OperationRecord] = {}
        self._act_as: frozenset[str] | None = None  # the service accounts the caller may act as (None: any)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def _join_rollouts(self) -> None:
        """Wait for the rollout threads (set ``_stopping`` first: they stop waiting at once)."""
        for thread in self._threads:
            thread.join(5)
        self._threads.clear()
        self.instance_set.stop()

    def _wanted(self, res: ResourceRecord, latest: str = "") -> dict[str, int]:
        """Instances per revision (short names) under the split asked for, the latest entry resolved to ``latest``
        (default: the latest ready revision). Call with the lock held."""
        msg = res.message
        latest = latest or msg.latest_ready_revision.rsplit("/", 1)[-1]
        latest_type = LATEST_TRAFFIC if res.is_service else LATEST_SPLIT
        shares = [(latest if e.type_ == latest_type else e.revision.rsplit("/", 1)[-1], e.percent)
                  for e in split_of(res, msg)] or [(latest, 100)]
        wanted = allocate(instance_count(msg, res.instances), shares)
        if res.is_service:  # a tagged revision keeps its revision-level min instances, even at 0% of the traffic
            minimum = {r.name.rsplit("/", 1)[-1]: int(r.scaling.min_instance_count) for r in res.revisions}
            for entry in msg.traffic:
                name = entry.revision.rsplit("/", 1)[-1]
                if entry.tag and entry.type_ != latest_type and minimum.get(name):
                    wanted[name] = max(wanted.get(name, 0), minimum[name])
        for revision in res.revisions:
            revision.scaling_status.desired_min_instance_count = wanted.get(revision.name.rsplit("/", 1)[-1], 0)
        return wanted

    def _image_of(self, res: ResourceRecord) -> Callable[[str], str]:
        """A revision's image (its first container's), by short name."""
        with self._lock:
            images = {r.name.rsplit("/", 1)[-1]: (r.containers[0].image if r.containers else "")
                      for r in res.revisions}
        return lambda short: images.get(short, "")

    def instances(self, name: str) -> dict[str, list[Instance]]:
        """The running instances of a resource (full or short name) by revision (short name), oldest first."""
        with self._lock:
            full = self._find(name).name
        return self.instance_set.running(full)

    def peak(self, name: str) -> int:
        """The most instances of a resource (full or short name) that served at once, since it was created."""
        with self._lock:
            full = self._find(name).name
        return self.instance_set.peak(full)

    def leaving(self, name: str) -> list[Instance]:
        """The resource's instances that were taken away (SIGTERM sent) and still run."""
        with self._lock:
            full = self._find(name).name
        return [i for i in self.instance_set.of(full) if i.leaving]

    def scale(self, name: str, instances: int) -> list[Instance]:
        """A service's autoscaler: run ``instances`` instances in total (kept within the service's min and max
        instances), divided by the split that serves now; starts what is missing first, then takes away the excess
        (a revision still rolling out keeps its instances). Returns the instances it started. A worker pool is
        scaled through its ``manual_instance_count`` instead."""
        with self._lock:
            res = self._find(name)
            if not res.is_service:
                raise ValueError(f"{res.short} is a worker pool: change scaling.manual_instance_count with an update")
            res.instances = max(0, instances)
            wanted = self._wanted(res)
        started = self.instance_set.grow(res.name, res.instance_kind, wanted, self._image_of(res))
        others = {rev: n for rev, n in self.instance_set.counts(res.name).items() if rev not in wanted}
        self.instance_set.shrink(res.name, {**others, **wanted})
        return started

    def scale_out(self, name: str, more: int = 1) -> list[Instance]:
        """A service's autoscaler adds ``more`` instances to its total (see :meth:`scale`)."""
        with self._lock:
            total = self._find(name).instances
        return self.scale(name, total + more)

    def wait_rollouts(self, timeout: float = 30.0) -> bool:
        """Wait until every rollout finished, old instances taken away included; False at the deadline."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _find(self, name: str) -> ResourceRecord:
        if name in self._resources:
            return self._resources[name]
        matches = [r for r in self._resources.values() if r.short == name]
        if len(matches) != 1:
            raise KeyError(f"no single resource called {name!r}")
        return matches[0]
