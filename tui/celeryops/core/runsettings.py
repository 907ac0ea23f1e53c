"""The operator-side settings that come only from the environment (``CELERYOPS_*``), read in one place: the run's
lease and fence timing, task events, and which Redis coordinates the fleet when the broker is not Redis.
The worker side (``celeryops.fence``, ``celeryops.slots``) reads its own variables; see the README."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.namespace import DEFAULT_FLEET
from celeryops.core.urls import is_redis_url

#: Environment variable -> RunSettings field.
RUN_ENV: dict[str, str] = {
    "CELERYOPS_FLEET": "fleet",
    "CELERYOPS_REDIS_URL": "redis_url",
    "CELERYOPS_SLOTS_REDIS_URL": "slots_redis_url",
    "CELERYOPS_LEASE_TTL": "lease_ttl",
    "CELERYOPS_FENCE_TTL": "fence_ttl",
    "CELERYOPS_FENCE_PARKED_TTL": "fence_parked_ttl",
    "CELERYOPS_TASK_EVENTS": "task_events",
    "CELERYOPS_RECOVERY_PATIENCE": "recovery_patience",
}


@dataclass(frozen=True)
class RunSettings:
    fleet: str = DEFAULT_FLEET  # the fleet's name: its lease, fence and published status
    redis_url: str | None = None  # coordination Redis when the broker is not Redis
    slots_redis_url: str | None = None  # where the slot pools are (default: the broker)
    lease_ttl: float = 30.0  # seconds without a heartbeat before a run's lease is orphaned
    fence_ttl: float = 30.0  # seconds the drain fence outlives its renewals
    fence_parked_ttl: float = 7 * 24 * 3600.0  # the fence of a drained run that stays open after its process
    task_events: bool = True  # re-poll as soon as task events say the in-flight tasks ended (workers with -E)
    recovery_patience: float = 30.0  # seconds a restore (and the fence's lift) retries: broker away, worker slow

    def coordination_url(self, broker_url: str | None) -> str | None:
        """The Redis holding the fleet's lease, fence, published status and the journal's fleet copy:
        ``$CELERYOPS_REDIS_URL``, else the broker when it is Redis, else None."""
        return self.redis_url or (broker_url if is_redis_url(broker_url) else None)

    def slots_url(self, broker_url: str | None) -> str | None:
        """The Redis holding the slot pools: ``$CELERYOPS_SLOTS_REDIS_URL``, else the broker when it is Redis."""
        return self.slots_redis_url or (broker_url if is_redis_url(broker_url) else None)


def run_settings(env: Mapping[str, str]) -> RunSettings:
    """The settings from ``env``; a malformed number is a UserError naming the variable (exit 2)."""
    values: dict[str, object] = {}
    for var, name in RUN_ENV.items():
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        if name in ("lease_ttl", "fence_ttl", "fence_parked_ttl", "recovery_patience"):
            try:
                number = float(raw)
            except ValueError:
                number = -1.0
            if not number > 0:
                raise UserError(f"${var} must be a number of seconds greater than 0, not {raw!r}: nothing was run; "
                                "fix the variable.", EXIT_USAGE)
            values[name] = number
        elif name == "task_events":
            values[name] = raw != "0"
        else:
            values[name] = raw
    return RunSettings(**values)  # type: ignore[arg-type]
