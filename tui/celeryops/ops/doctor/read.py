"""Reading the fleet for the doctor: one round of inspect commands to every known worker (``conf``, ``stats``
with what the fence plugin reports from inside, ``registered`` with each task's options, ``scheduled``,
``active``), the fence registry for what busy plugin workers report, and the eviction policy of the Redis that
holds the results. Read-only: inspect commands only (no consumer or shutdown command), no key written; ``CONFIG
GET`` and ``INFO`` read the policy (:mod:`celeryops.ops.fleetwide.brokersafety`)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import redis

from celeryops.adapters.fleet import Fleet
from celeryops.fence.registry import PluginWorkerInfo, listed_workers, redis_now
from celeryops.fence.selfreport import STATS_KEY, WorkerReport
from celeryops.ops.doctor.facts import (
    REDIS_BACKENDS,
    TASK_ITEMS,
    FleetFacts,
    Held,
    WorkerFacts,
    eta_of,
    parse_registered,
    seconds,
)
from celeryops.ops.fleetwide.brokersafety import read_safety

COMMANDS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("conf", {"with_defaults": True}), ("stats", {}), ("registered", {"taskinfoitems": list(TASK_ITEMS)}),
    ("scheduled", {}), ("active", {}))


def _registry(coord: redis.Redis | None, fleet_name: str) -> tuple[dict[str, PluginWorkerInfo], set[str]]:
    """The fence registry by node name: the live entries, and the node names whose heartbeat expired."""
    if coord is None:
        return {}, set()
    try:
        now = redis_now(coord)
        entries = listed_workers(coord, fleet_name)
    except redis.RedisError:
        return {}, set()
    live = {i.hostname: i for i in entries.values() if i.expires_at > now}
    expired = {i.hostname for i in entries.values() if i.expires_at <= now} - set(live)
    return live, expired


def _held(worker: str, scheduled: object, active: object, now: float) -> tuple[tuple[Held, ...], tuple[Held, ...]]:
    later = []
    for entry in scheduled if isinstance(scheduled, list) else []:
        request = entry.get("request") or {} if isinstance(entry, Mapping) else {}
        later.append(Held(str(request.get("id")), str(request.get("name") or request.get("type")), eta=eta_of(entry)))
    running = []
    for task in active if isinstance(active, list) else []:
        if isinstance(task, Mapping):
            start = seconds(task.get("time_start"))
            running.append(Held(str(task.get("id")), str(task.get("name") or task.get("type")),
                                runtime=max(0.0, now - start) if start else None))
    return tuple(later), tuple(running)


def _report(stats: object, listed: PluginWorkerInfo | None) -> WorkerReport | None:
    """What the worker's fence plugin reports from inside: in its ``stats`` reply, else its registry entry."""
    if isinstance(stats, Mapping):
        found = WorkerReport.from_json(stats.get(STATS_KEY))
        if found is not None:
            return found
    return listed.report if listed is not None else None


async def read_fleet(fleet: Fleet, coord: redis.Redis | None, fleet_name: str, *,
                     app_backend: str | None = None) -> FleetFacts:
    """Everything the doctor judges, read now. ``app_backend``: the result backend of the app the operator gave
    (``-A``), whose Redis is asked its eviction policy; else the one the workers name, when it is the broker's."""
    (live, expired), members = await asyncio.gather(asyncio.to_thread(_registry, coord, fleet_name), fleet.members())
    names = (members | set(live)) - (expired - members)
    replies = await fleet.inspect(COMMANDS, names)
    conf, stats, registered, scheduled, active = replies
    now = time.time()
    workers: dict[str, WorkerFacts] = {}
    gone: list[str] = []
    for name in sorted(names | set().union(*(r.keys() for r in replies))):
        answered = any(name in r for r in replies)
        report = _report(stats.get(name), live.get(name))
        if not answered and report is None and name in expired:
            gone.append(name)
            continue
        later, running = _held(name, scheduled.get(name), active.get(name), now)
        workers[name] = WorkerFacts(
            name=name, conf=conf.get(name) if isinstance(conf.get(name), dict) else None,
            stats=stats.get(name) if isinstance(stats.get(name), dict) else None,
            registered=parse_registered(registered.get(name)), report=report, scheduled=later, active=running)
    transport = urlsplit(fleet.broker_url).scheme or "redis"
    facts = FleetFacts(workers=workers, now=now, transport=transport, gone=tuple(gone))
    return await _with_policy(fleet, facts, app_backend)


async def _with_policy(fleet: Fleet, facts: FleetFacts, app_backend: str | None) -> FleetFacts:
    """The eviction policy of the Redis holding the results, when a worker stores them there without expiry."""
    backends = {w.result_backend for w in facts.checked
                if w.result_backend.split(":", 1)[0] in REDIS_BACKENDS and not w.result_expires}
    if not backends:
        return facts
    client, where, own = None, "", False
    if app_backend and app_backend.split(":", 1)[0] in REDIS_BACKENDS:
        try:
            client, where, own = redis.Redis.from_url(app_backend, socket_connect_timeout=3, socket_timeout=5), \
                f"the result backend's Redis at {_host(app_backend)}", True
        except ValueError:
            client = None
    broker = fleet.redis()
    if client is None and broker is not None and any(_same_server(b, fleet.broker_url) for b in backends):
        client, where = broker, f"the broker's Redis at {_host(fleet.broker_url)} (it holds the results too)"
    if client is None:
        return facts
    try:
        safety = await asyncio.to_thread(read_safety, client)
    except redis.RedisError:
        return dataclasses.replace(facts, backend=where)
    finally:
        if own:
            client.close()
    return dataclasses.replace(facts, policy=safety.policy, maxmemory=safety.maxmemory, backend=where)


def _host(url: str) -> str:
    try:
        parts = urlsplit(url)
        return f"{parts.hostname or parts.path}:{parts.port or 6379}" if parts.hostname else (parts.path or url)
    except ValueError:
        return "?"


def _same_server(a: str, b: str) -> bool:
    """Two Redis URLs (one may have its password masked) on the same server (the database does not matter: the
    maxmemory-policy is the server's)."""
    try:
        x, y = urlsplit(a), urlsplit(b)
        if x.hostname or y.hostname:
            return (x.hostname, x.port or 6379) == (y.hostname, y.port or 6379)
        return bool(x.path) and x.path.split("?")[0] == y.path.split("?")[0]  # unix sockets
    except ValueError:
        return False


def registry_facts(coord: redis.Redis | None, fleet_name: str, broker_url: str) -> FleetFacts:
    """Watch mode: what the plugin workers report from inside, from the fence registry alone (reads only: no
    inspect command). Workers without the plugin are not in it."""
    live, expired = _registry(coord, fleet_name)
    workers = {n: WorkerFacts(n, report=i.report) for n, i in live.items() if i.report is not None}
    return FleetFacts(workers=workers, now=time.time(), transport=urlsplit(broker_url).scheme or "redis",
                      gone=tuple(sorted(expired)))
