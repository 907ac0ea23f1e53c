"""The instances of the Cloud Run stand-in: how many each revision runs, and the processes that are those instances.

How many (:func:`instance_count`, :func:`allocate`): a worker pool runs ``scaling.manual_instance_count`` instances
(1 when it is unset, Cloud Run's default; 0 disables the pool); a service runs the instances it was seeded or
scaled to, at least ``scaling.min_instance_count`` and at most ``max_instance_count`` (exactly
``manual_instance_count`` in manual mode). They are divided among the revisions of the split (``instance_splits`` /
``traffic``) in proportion to their percent, as Cloud Run documents for manual scaling: the total stays the count,
so with fewer instances than revisions some revisions get none.

What an instance is: an :data:`InstanceLauncher` (the demo, tests and the chaos harness pass one) starts one for
an :class:`InstanceSpec` (the resource and its kind, the revision, the image, and the environment Cloud Run sets
for that kind: :func:`cloud_run_env`) and returns a handle that can be signalled, e.g. a real Celery worker process.
It may block until the instance is up; a batch is started concurrently. If it raises, the instance failed to start
(the stand-in fails the revision). Without a launcher (or when it returns None) an instance is bookkeeping only.

Which instances go when a revision's count drops (:meth:`InstanceSet.shrink`): any of them, drawn at random. Cloud
Run documents no order and offers no way to name the instance that goes, so a busy instance may be the one: the
stand-in is as dangerous as Cloud Run. The draw comes from an injected ``random.Random`` (seed it for reproducible
tests and benchmarks). Taking an instance away (:meth:`InstanceSet.take_away`): SIGTERM, then SIGKILL ``grace``
seconds later (Cloud Run's 10 s) if it still runs, so a task still running then is lost. An instance that dies by
itself (OOM, a SIGKILL) is not replaced.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from google.cloud.run_v2 import ServiceScaling

from celeryops.core.splits import counts_of

GRACE_SECONDS = 10.0
"""Cloud Run sends SIGKILL this long after the SIGTERM that takes an instance away."""

InstanceKind = Literal["service", "worker-pool"]


def cloud_run_env(kind: InstanceKind, name: str, revision: str) -> dict[str, str]:
    """What Cloud Run sets in the containers of an instance (container runtime contract): a worker pool's
    ``CLOUD_RUN_WORKER_POOL`` and ``CLOUD_RUN_WORKER_POOL_REVISION``; a service's ``K_SERVICE``, ``K_REVISION``,
    ``K_CONFIGURATION`` (named after the service) and ``PORT``. ``revision`` is the short name."""
    if kind == "worker-pool":
        return {"CLOUD_RUN_WORKER_POOL": name, "CLOUD_RUN_WORKER_POOL_REVISION": revision}
    return {"K_SERVICE": name, "K_REVISION": revision, "K_CONFIGURATION": name, "PORT": "8080"}


@dataclass(frozen=True)
class InstanceSpec:
    """One instance to start: of ``revision`` (short name) of the resource ``resource`` (full name), running
    ``image``; ``number`` counts the resource's instances from 1."""

    resource: str
    kind: InstanceKind
    revision: str
    image: str
    number: int

    @property
    def name(self) -> str:
        """The service's or worker pool's short name."""
        return self.resource.rsplit("/", 1)[-1]

    @property
    def env(self) -> dict[str, str]:
        """What Cloud Run sets in this instance's containers."""
        return cloud_run_env(self.kind, self.name, self.revision)


class InstanceHandle(Protocol):
    """What the stand-in needs of a started instance (a WorkerProcess is one)."""

    def signal(self, sig: int) -> None: ...

    def alive(self) -> bool: ...


InstanceLauncher = Callable[[InstanceSpec], "InstanceHandle | None"]


@dataclass(eq=False)
class Instance:
    """A started instance; ``started``: when it was up (monotonic), ``taken_away``: when it was sent SIGTERM (None
    while it serves)."""

    spec: InstanceSpec
    handle: InstanceHandle | None = None
    taken_away: float | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def revision(self) -> str:
        return self.spec.revision

    def alive(self) -> bool:
        if self.handle is None:
            return self.taken_away is None
        return bool(self.handle.alive())

    @property
    def running(self) -> bool:
        """Alive and not taken away."""
        return self.taken_away is None and self.alive()

    @property
    def leaving(self) -> bool:
        """Taken away (SIGTERM sent) and still alive."""
        return self.taken_away is not None and self.alive()


def instance_count(message: Any, seeded: int) -> int:
    """How many instances the resource runs: a WorkerPool's ``scaling.manual_instance_count`` (1 when unset); a
    Service's ``manual_instance_count`` in manual mode, else ``seeded`` (what it was seeded or scaled to) kept
    between its ``min_instance_count`` and ``max_instance_count`` (0: no maximum)."""
    scaling = message.scaling
    if not hasattr(scaling, "scaling_mode"):  # WorkerPoolScaling
        return int(scaling.manual_instance_count) if "manual_instance_count" in scaling else 1
    if scaling.scaling_mode == ServiceScaling.ScalingMode.MANUAL and "manual_instance_count" in scaling:
        return int(scaling.manual_instance_count)
    count = max(seeded, int(scaling.min_instance_count))
    return min(count, int(scaling.max_instance_count)) if scaling.max_instance_count else count


def allocate(count: int, shares: Sequence[tuple[str, int]]) -> dict[str, int]:
    """Divide ``count`` instances among revisions by percent: each gets its share rounded down, and the instances
    left over go one each to the largest remainders (a tie: the revision listed first), so the total is ``count``
    (4 at 50/50: 2 and 2; 3 at 50/50: 2 and 1; 1 at 50/50: 1 and 0). A revision listed twice adds up. The division
    celeryops reads a pool by (:func:`celeryops.core.splits.counts_of`)."""
    return counts_of(count, shares)


@dataclass
class InstanceSet:
    """Every instance the stand-in started, by resource. Thread-safe; the launcher runs without any lock held.
    ``rng`` draws the instances taken away when a count drops (seed it to replay the same draws)."""

    launcher: InstanceLauncher | None = None
    grace: float = GRACE_SECONDS
    rng: random.Random = field(default_factory=random.Random)
    _instances: dict[str, list[Instance]] = field(default_factory=dict)
    _numbers: dict[str, itertools.count[int]] = field(default_factory=dict)
    _timers: list[threading.Timer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, resource: str) -> list[Instance]:
        """Every instance of ``resource`` ever started (oldest first)."""
        with self._lock:
            return list(self._instances.get(resource, ()))

    def running(self, resource: str) -> dict[str, list[Instance]]:
        """The running instances of ``resource`` by revision (oldest first)."""
        out: dict[str, list[Instance]] = {}
        for instance in self.of(resource):
            if instance.running:
                out.setdefault(instance.revision, []).append(instance)
        return out

    def counts(self, resource: str) -> dict[str, int]:
        return {rev: len(found) for rev, found in self.running(resource).items()}

    def peak(self, resource: str) -> int:
        """The most instances of ``resource`` that served at once (up and not yet taken away), over its history."""
        changes = sorted([(i.started, 1) for i in self.of(resource)]
                         + [(i.taken_away, -1) for i in self.of(resource) if i.taken_away is not None])
        most = now = 0
        for _, change in changes:  # at the same moment a take-away counts first
            now += change
            most = max(most, now)
        return most

    def grow(self, resource: str, kind: InstanceKind, wanted: Mapping[str, int],
             image_of: Callable[[str], str]) -> list[Instance]:
        """Start the instances ``wanted`` (revision -> count) has beyond those running, concurrently; returns them.
        If the launcher raises for one, the others still start and are recorded; the first error is raised."""
        have = self.counts(resource)
        specs: list[InstanceSpec] = []
        with self._lock:
            numbers = self._numbers.setdefault(resource, itertools.count(1))
            for revision, count in wanted.items():
                specs += [InstanceSpec(resource, kind, revision, image_of(revision), next(numbers))
                          for _ in range(count - have.get(revision, 0))]
        if not specs:
            return []
        started: list[Instance] = []
        errors: list[BaseException] = []

        def launch(spec: InstanceSpec) -> None:
            try:
                handle = self.launcher(spec) if self.launcher is not None else None
            except Exception as exc:  # the instance failed to start
                errors.append(exc)
                return
            instance = Instance(spec, handle)
            with self._lock:
                self._instances.setdefault(resource, []).append(instance)
                started.append(instance)

        if len(specs) == 1:
            launch(specs[0])
        else:
            with ThreadPoolExecutor(max_workers=len(specs), thread_name_prefix="cloudrun-instance") as pool:
                list(pool.map(launch, specs))
        if errors:
            raise errors[0]
        return started

    def shrink(self, resource: str, wanted: Mapping[str, int]) -> list[Instance]:
        """Take away the running instances beyond ``wanted`` (a revision not in it keeps none): of a revision that
        keeps some, those that go are drawn at random (``rng``), busy or not, as Cloud Run does."""
        excess: list[Instance] = []
        for revision, running in self.running(resource).items():
            keep = max(0, wanted.get(revision, 0))
            if keep < len(running):
                with self._lock:  # one draw at a time: the same seed replays the same victims
                    excess += self.rng.sample(running, len(running) - keep)
        self.take_away(excess)
        return excess

    def take_away(self, instances: Iterable[Instance]) -> None:
        """SIGTERM now, SIGKILL ``grace`` seconds later for those still alive (as Cloud Run does)."""
        chosen = [i for i in instances if i.taken_away is None]
        now = time.monotonic()
        for instance in chosen:
            instance.taken_away = now
            if instance.handle is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    instance.handle.signal(signal.SIGTERM)
        if any(i.handle is not None for i in chosen):
            timer = threading.Timer(self.grace, self._kill, (chosen,))
            timer.daemon = True
            with self._lock:
                self._timers = [t for t in self._timers if t.is_alive()]
                self._timers.append(timer)
            timer.start()

    @staticmethod
    def _kill(instances: list[Instance]) -> None:
        for instance in instances:
            if instance.handle is not None and instance.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    instance.handle.signal(signal.SIGKILL)

    def stop(self) -> None:
        """Cancel the pending SIGKILLs (the processes belong to whoever launched them: they stop them)."""
        with self._lock:
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()
