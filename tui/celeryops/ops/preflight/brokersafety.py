"""The ``broker_safety`` preflight check: no Redis of the fleet may evict keys, and one that keeps nothing across a
restart is a warning (the reading and the verdict: ``celeryops.ops.fleetwide.brokersafety``)."""

from __future__ import annotations

from collections.abc import Sequence

from celeryops.ops.fleetwide.brokersafety import Target, assess_all, safety_targets
from celeryops.ops.preflight.framework import Check, CheckResult

CHECK_ID = "broker_safety"
TITLE = "Broker keeps every task"

__all__ = ["CHECK_ID", "TITLE", "broker_safety_check", "safety_targets"]


def broker_safety_check(targets: Sequence[Target], *, check_id: str = CHECK_ID, title: str = TITLE) -> Check:
    """fail: a Redis of the fleet may evict keys (any allkeys-* or volatile-* policy with a maxmemory set); warn:
    it keeps no data across a restart (no AOF, no RDB), or did not say; ok: noeviction (or no maxmemory) and
    persistence on. No Redis (RabbitMQ and no coordination Redis): ok."""
    chosen = list(targets)

    async def run() -> CheckResult:
        verdict = await assess_all(chosen)
        return CheckResult(check_id, title, verdict.status, verdict.detail, verdict.remedy)

    return Check(check_id, title, run, timeout=10)
