"""Where the canary's collector and judge get what the fence registry knows: each worker's revision (to credit its
task outcomes) and the canary instances that crashed (their heartbeat expired: a worker that stops cleanly removes
its entry). Reads only."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import redis

from celeryops.fence import registry
from celeryops.fence.registry import PluginWorkerInfo


def registry_revisions(client: redis.Redis, fleet: str | None = None) -> Callable[[], dict[str, str]]:
    """For :class:`celeryops.adapters.canaryevents.OutcomeCollector`: hostname -> Cloud Run revision of every
    worker the registry lists, live or expired (a worker that just died still gets its last tasks credited)."""
    def revisions() -> dict[str, str]:
        return {host: info.revision for host, info in registry.listed_workers(client, fleet).items() if info.revision}
    return revisions


def expired_of(entries: Mapping[str, PluginWorkerInfo], now: float, revision: str) -> tuple[str, ...]:
    """The workers of ``revision`` whose registry heartbeat expired by ``now`` (Redis TIME), sorted. Pure."""
    return tuple(sorted(h for h, info in entries.items() if info.revision == revision and info.expires_at <= now))


def crashed_workers(client: redis.Redis, revision: str, fleet: str | None = None) -> tuple[str, ...]:
    """The canary ``revision``'s workers that stopped beating without leaving the registry: each is a crash (OOM,
    SIGKILL, a lost instance) for the judge's ``crashes`` count."""
    return expired_of(registry.listed_workers(client, fleet), registry.redis_now(client), revision)


__all__ = ["crashed_workers", "expired_of", "registry_revisions"]
