"""The autoscaler's vocabulary: its settings (the ``[autoscale]`` table of celeryops.toml, read by
:mod:`celeryops.core.configautoscale`). Pure data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from celeryops.core.settingsrecord import SettingsRecord

#: The settings of the ``[autoscale]`` table, in the order the README documents them.
AUTOSCALE_KEYS = ("target", "min_instances", "max_instances", "interval", "idle_after", "tasks_per_instance",
                  "queues", "max_step", "drain_timeout", "slot_resource")
#: The most instances one worker pool can be given: exact counts per revision come from an instance split in whole
#: percents, which Cloud Run's division turns back into those counts only up to 100 instances in all.
MAX_INSTANCES_LIMIT = 100


@dataclass(frozen=True)
class AutoscaleSettings(SettingsRecord):
    """How ``celeryops autoscale`` sizes a Cloud Run worker pool (defaults documented in the README's
    "Autoscaling"); journaled with an autoscale step and published with its status (:meth:`to_dict`).

    ``target``: the ``[[targets]]`` entry to scale ("": the only one). ``min_instances`` / ``max_instances``: the
    bounds of the pool's instance count (0 lets an idle pool go to zero). ``interval``: seconds between looks.
    ``idle_after``: seconds of surplus capacity before an instance is taken away. ``tasks_per_instance``: tasks
    one instance runs at once (0: from the workers' concurrency, or their slot totals of ``slot_resource``).
    ``queues``: the queues whose demand sizes the pool (empty: those its workers consume). ``max_step``: the most
    instances one scale-out adds (0: as many as the demand needs). ``drain_timeout``: seconds the fence gives an
    idle cohort to confirm it is idle before a scale-in is given up (nothing is removed, its workers consume
    again). ``slot_resource``: a slot type (``gpu``) that gates the tasks: an instance runs at most its slot total
    of it at once."""

    target: str = ""
    min_instances: int = 1
    max_instances: int = 10
    interval: float = 5.0
    idle_after: float = 60.0
    tasks_per_instance: int = 0
    queues: tuple[str, ...] = ()
    max_step: int = 0
    drain_timeout: float = 120.0
    slot_resource: str = ""

    LIST_FIELDS: ClassVar[tuple[str, ...]] = ("queues",)


__all__ = ["AUTOSCALE_KEYS", "MAX_INSTANCES_LIMIT", "AutoscaleSettings"]
