"""Registry of workers that run the fence plugin: an extra membership source for the drain.

Each plugin worker writes one field of the hash ``celeryops:{<fleet>}:fence:workers`` (hostname -> JSON) from a
daemon thread, so it keeps beating while a solo-pool worker is busy with a task and answers no control command.
An entry counts while ``expires_at`` (Redis TIME) is in the future; readers only read (watch mode writes nothing),
workers prune entries that expired long ago. Each entry records the worker's Cloud Run revision and where it runs
(a worker pool or a service, and its name), so the operator's side tells an old revision's workers from a new
one's (:func:`by_revision`), the container instance it runs in (``instance_id``), and what it tells
``celeryops doctor`` about itself (``report``: :mod:`celeryops.fence.selfreport`).

Two instances that share a node name (plain ``celery@localhost`` on Cloud Run with a plugin too old to rename it,
or one ``-n`` given to several workers) do not collapse into one entry: the second one writes its entry under
``<node name>#<8 hex of its instance id>`` (:func:`claim_field`) and says its node name inside the entry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import redis

from celeryops.core.namespace import fleet_key, fleet_name
from celeryops.fence.record import CloudRunKind, decode
from celeryops.fence.selfreport import WorkerReport

PluginState = Literal["consuming", "held", "unknown"]


SHARED_MARK = "#"  # <node name>#<instance>: the field of an instance whose node name another live instance holds


def registry_key(fleet: str) -> str:
    return fleet_key(fleet, "fence", "workers")


@dataclass(frozen=True)
class PluginWorkerInfo:
    """What a plugin worker last reported about itself. ``state``: ``held`` (a fence stops some of its queues),
    ``unknown`` (it could never read the fence, so it holds every queue), ``consuming``. ``revision``: its Cloud Run
    revision; ``cloudrun_kind`` / ``cloudrun_name``: the worker pool or service it runs in (empty outside Cloud Run
    and from older plugins)."""

    hostname: str
    version: str = ""
    revision: str = ""
    cloudrun_kind: CloudRunKind = ""
    cloudrun_name: str = ""
    queues: tuple[str, ...] = ()
    held_queues: tuple[str, ...] = ()
    state: PluginState = "consuming"
    fence_run_id: str = ""
    fence_readable: bool = True
    pid: int = 0
    last_seen: float = 0.0
    expires_at: float = 0.0
    beats: int = 0
    consumer_starts: int = 0
    features: tuple[str, ...] = ()  # what its plugin understands beyond the first fence record (record.FEATURES)
    instance_id: str = ""  # the container instance it runs in (Cloud Run's metadata id, else random per start)
    report: WorkerReport | None = None  # what it tells `celeryops doctor` about itself (None from older plugins)

    @property
    def held(self) -> bool:
        return self.state != "consuming"

    @classmethod
    def from_json(cls, field: str, raw: str) -> PluginWorkerInfo | None:
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        try:  # a malformed entry (a number that is not one, a list that is not one) is not a worker's word
            return cls._build(field, data)
        except (ValueError, TypeError):
            return None

    @classmethod
    def _build(cls, field: str, data: dict[str, Any]) -> PluginWorkerInfo:
        state = data.get("state")
        kind = data.get("cloudrun_kind")
        return cls(
            hostname=str(data.get("hostname") or field.split(SHARED_MARK, 1)[0]),
            version=str(data.get("version") or ""),
            revision=str(data.get("revision") or ""),
            cloudrun_kind=kind if kind in ("worker-pool", "service") else "",
            cloudrun_name=str(data.get("cloudrun_name") or ""),
            queues=tuple(str(q) for q in data.get("queues") or ()),
            held_queues=tuple(str(q) for q in data.get("held_queues") or ()),
            state=state if state in ("consuming", "held", "unknown") else "unknown",
            fence_run_id=str(data.get("fence_run_id") or ""),
            fence_readable=bool(data.get("fence_readable", True)),
            pid=int(data.get("pid") or 0),
            last_seen=float(data.get("last_seen") or 0.0),
            expires_at=float(data.get("expires_at") or 0.0),
            beats=int(data.get("beats") or 0),
            consumer_starts=int(data.get("consumer_starts") or 0),
            features=tuple(str(f) for f in data.get("features") or ()),
            instance_id=str(data.get("instance_id") or ""),
            report=WorkerReport.from_json(data.get("doctor")),
        )


def redis_now(client: redis.Redis) -> float:
    sec, usec = client.time()
    return float(sec) + float(usec) / 1e6


def write_heartbeat(client: redis.Redis, fleet: str, hostname: str, info: Mapping[str, Any], ttl: float) -> float:
    """Record ``hostname`` as a live plugin worker for ``ttl`` seconds from now (Redis TIME); returns that now."""
    now = redis_now(client)
    entry = {**info, "last_seen": now, "expires_at": now + ttl}
    client.hset(registry_key(fleet), hostname, json.dumps(entry))
    return now


def claim_field(client: redis.Redis, fleet: str, hostname: str, instance_id: str, ttl_grace: float = 0.0) -> str:
    """The registry field this worker writes: its node name, unless another instance's live entry holds that field
    (a node name shared between instances): then ``<node name>#<8 hex of instance_id>``."""
    if not instance_id:
        return hostname
    raw = client.hget(registry_key(fleet), hostname)
    info = PluginWorkerInfo.from_json(hostname, decode(raw) or "") if raw is not None else None
    if info is None or not info.instance_id or info.instance_id == instance_id:
        return hostname
    if info.expires_at + ttl_grace < redis_now(client):
        return hostname
    return f"{hostname}{SHARED_MARK}{hashlib.sha1(instance_id.encode()).hexdigest()[:8]}"


def remove(client: redis.Redis, fleet: str, hostname: str) -> None:
    client.hdel(registry_key(fleet), hostname)


def prune(client: redis.Redis, fleet: str, grace: float) -> int:
    """Delete entries that expired more than ``grace`` seconds ago; returns how many."""
    now = redis_now(client)
    stale = [
        host for host, info in _entries(client, fleet).items()
        if info is None or info.expires_at + grace < now
    ]
    if stale:
        client.hdel(registry_key(fleet), *stale)
    return len(stale)


def _entries(client: redis.Redis, fleet: str) -> dict[str, PluginWorkerInfo | None]:
    raw = client.hgetall(registry_key(fleet))
    out: dict[str, PluginWorkerInfo | None] = {}
    for k, v in raw.items():
        host = decode(k) or ""
        out[host] = PluginWorkerInfo.from_json(host, decode(v) or "")
    return out


def _listed(client: redis.Redis, fleet: str | None) -> tuple[float, dict[str, PluginWorkerInfo]]:
    """Redis TIME and every readable registry entry of the fleet, by hostname (one atomic read)."""
    pipe = client.pipeline(transaction=True)
    pipe.time()
    pipe.hgetall(registry_key(fleet_name(fleet)))
    (sec, usec), raw = pipe.execute()
    entries: dict[str, PluginWorkerInfo] = {}
    for k, v in raw.items():
        host = decode(k) or ""
        info = PluginWorkerInfo.from_json(host, decode(v) or "")
        if info is not None:
            entries[host] = info
    return float(sec) + float(usec) / 1e6, entries


def plugin_workers(client: redis.Redis, fleet: str | None = None) -> dict[str, PluginWorkerInfo]:
    """Live plugin workers of the fleet (entry not expired by Redis TIME), by hostname. Read-only."""
    now, entries = _listed(client, fleet)
    return {host: info for host, info in entries.items() if info.expires_at > now}


def listed_workers(client: redis.Redis, fleet: str | None = None) -> dict[str, PluginWorkerInfo]:
    """Every readable registry entry of the fleet, live or expired (workers prune those long expired), by hostname:
    what each worker last said about itself, e.g. its revision, also once it stopped beating. Read-only."""
    return _listed(client, fleet)[1]


def heartbeat_states(client: redis.Redis, fleet: str | None = None) -> dict[str, bool]:
    """Every listed plugin worker of the fleet: True while its heartbeat is live, False once it expired (by Redis
    TIME). An expired entry is evidence that the worker stopped beating (its beats come from a daemon thread, also
    while a solo pool is busy). Read-only; workers prune entries long expired."""
    now, entries = _listed(client, fleet)
    return {host: info.expires_at > now for host, info in entries.items()}


def by_revision(workers: Mapping[str, PluginWorkerInfo]) -> dict[str, tuple[str, ...]]:
    """Plugin workers (e.g. :func:`plugin_workers`) grouped by their Cloud Run revision, hostnames sorted
    (``""``: workers that run outside Cloud Run or whose plugin does not say). Pure."""
    grouped: dict[str, list[str]] = {}
    for host, info in workers.items():
        grouped.setdefault(info.revision, []).append(host)
    return {revision: tuple(sorted(hosts)) for revision, hosts in sorted(grouped.items())}


def instances_by_revision(workers: Mapping[str, PluginWorkerInfo]) -> dict[str, int]:
    """How many container instances of each revision the plugin workers (e.g. :func:`plugin_workers`) run in: one
    per instance id (an entry without one, from an older plugin, counts as its own instance). Pure."""
    seen: dict[str, set[str]] = {}
    for field, info in workers.items():
        seen.setdefault(info.revision, set()).add(info.instance_id or field)
    return {revision: len(ids) for revision, ids in sorted(seen.items())}
