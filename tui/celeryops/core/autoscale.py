"""The autoscaler's vocabulary: its settings (the ``[autoscale]`` table of celeryops.toml, read by
:mod:`celeryops.core.configautoscale`). Pure data, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

#: The settings of the ``[autoscale]`` table, in the order the README documents them.
AUTOSCALE_KEYS = ("target", "min_instances", "max_instances", "interval", "idle_after", "tasks_per_instance",
                  "queues", "max_step", "drain_timeout", "slot_resource")
#: The most instances one worker pool can be given: exact counts per revision come from an instance split in whole
#: percents, which Cloud Run's division turns back into those counts only up to 100 instances in all.
MAX_INSTANCES_LIMIT = 100


@dataclass(frozen=True)
class AutoscaleSettings:
    """How ``celeryops autoscale`` sizes a Cloud Run worker pool (defaults documented in the README's
    "Autoscaling").

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

    def to_dict(self) -> dict[str, object]:
        """As journaled with an autoscale step and published with its status."""
        return {f.name: list(getattr(self, f.name)) if f.name == "queues" else getattr(self, f.name)
                for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> AutoscaleSettings:
        """The settings :meth:`to_dict` wrote (unknown keys left out, missing ones at their defaults)."""
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: v for k, v in data.items() if k in known}
        if "queues" in values:
            values["queues"] = tuple(str(q) for q in values["queues"] or ())
        return cls(**values)


__all__ = ["AUTOSCALE_KEYS", "MAX_INSTANCES_LIMIT", "AutoscaleSettings"]
