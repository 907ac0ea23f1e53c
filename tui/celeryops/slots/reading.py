"""Reading a slot pool: the snapshot a pool's keys make (what :meth:`SlotStore.snapshot
<celeryops.slots.store.SlotStore.snapshot>` returns), and a pool in the seed's schema (``read_legacy``).

A snapshot is built from one consistent read (Redis TIME with the pool's keys): the totals the next acquire sees
(explicit ones win over the sum of the live hosts' contributions), the holders with their devices, the requests
that wait (and whether they reserve), and each host's contribution.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal

import redis
from redis.cluster import RedisCluster

from celeryops.slots.codec import device_id, device_order, parse_devices, parse_needs
from celeryops.slots.snapshot import DeviceId, DeviceUsage, Holder, HostContribution, PoolSnapshot, TypeUsage, Waiting

Scope = Literal["global", "host"]
Client = redis.Redis | RedisCluster  # a pool's keys share one hash tag, so a cluster client works too
DEFAULT_PREFIX = "resource"  # every key of the slot pools starts with it


def build_pool_snapshot(pool_name: str, scope: Scope, now_raw: Any, pool: dict[str, str],
                        expiries: list[tuple[str, float]], host_expiries: list[tuple[str, float]],
                        hostinfo: dict[str, str], starvation_after: float | None) -> PoolSnapshot:
    """Pool ``pool_name``'s snapshot from one consistent read: Redis TIME, the pool hash, the lease expiries, the
    contributions' expiries and the hostinfo hash (``starvation_after``: when a waiting request reserves)."""
    now_ms = int(now_raw[0]) * 1000 + int(now_raw[1]) // 1000
    exp = dict(expiries)
    fields, info = by_kind(pool), by_kind(hostinfo)
    totals = {t: int(v) for t, v in fields["total"].items()}
    used = {t: int(v) for t, v in fields["used"].items()}
    leases, waits = fields["lease"], fields["wait"]
    devs = {t: [device_id(d) for d in v.split(",") if d] for t, v in fields["devs"].items()}
    fixed = {t: int(v) for t, v in info["fixed"].items()}
    records, host_devs = info["host"], info["hdev"]
    hosts = _host_contributions(records, dict(host_expiries), now_ms, host_devs)
    # the totals the next acquire sees: it reaps contributions that expired since the last count first
    live: dict[str, int] = {}
    for hc in hosts:
        if not hc.expired:
            for typ, n in hc.totals.items():
                live[typ] = live.get(typ, 0) + n
    counted = {t for t in hostinfo.get("ctypes", "").split(",") if t} | {t for hc in hosts for t in hc.totals}
    for typ in counted | set(fixed):
        totals[typ] = fixed[typ] if typ in fixed else live.get(typ, 0)
    holders = []
    for lid, raw in sorted(leases.items()):
        ns, token, started, _ttl, adopted, worker, host, name = raw.split("|", 7)
        adopted, _, held_devices = adopted.partition(" ")
        remaining = (exp.get(lid, now_ms) - now_ms) / 1000
        holders.append(Holder(
            task_id=lid, task_name=name, worker=worker, host=host, slots=parse_needs(ns), token=int(token),
            age=(now_ms - int(started)) / 1000, lease_remaining=max(0.0, remaining),
            expired=remaining <= 0, adopted=adopted == "1", devices=parse_devices(held_devices)))
    by_device = {(typ, d): h for h in holders for typ, ds in h.devices.items() for d in ds}
    devices = []
    for typ in sorted(devs):
        held_here = [d for (t, d) in by_device if t == typ and d not in devs[typ]]  # the host no longer lists
        for d in [*devs[typ], *sorted(held_here, key=device_order)]:
            h = by_device.get((typ, d))
            devices.append(DeviceUsage(typ, d) if h is None else DeviceUsage(
                typ, d, h.task_id, h.task_name, h.worker, h.age))
    waiting = []
    for wid, raw in sorted(waits.items()):
        ns, since, until, worker, name = raw.split("|", 4)
        if int(until) <= now_ms:
            continue
        waited = (now_ms - int(since)) / 1000
        needs = parse_needs(ns)
        possible = all(n <= totals.get(t, 0) for t, n in needs.items())  # else listed, never reserving
        waiting.append(Waiting(
            task_id=wid, task_name=name, worker=worker, slots=needs, waited=waited,
            reserved=possible and starvation_after is not None and waited >= starvation_after))
    return PoolSnapshot(
        pool=pool_name, scope=scope, host=pool_name[len("host:"):] if scope == "host" else None,
        types=[TypeUsage(t, totals.get(t, 0), used.get(t, 0), t in fixed) for t in sorted(set(totals) | set(used))],
        holders=holders, waiting=waiting, hosts=hosts, devices=devices)


def by_kind(fields: dict[str, str]) -> defaultdict[str, dict[str, str]]:
    """A hash's fields grouped by their kind: ``{"total:gpu": "2"}`` -> ``{"total": {"gpu": "2"}}`` (a kind without
    fields reads as empty)."""
    out: defaultdict[str, dict[str, str]] = defaultdict(dict)
    for name, value in fields.items():
        kind, _, rest = name.partition(":")
        out[kind][rest] = value
    return out


def _host_contributions(records: dict[str, str], expiries: dict[str, float], now_ms: int,
                        host_devs: dict[str, str]) -> list[HostContribution]:
    """One entry per host: the largest number per type of its live workers (all of them if none is live), and the
    devices they list."""
    by_host: dict[str, list[tuple[str, dict[str, int], int, float, dict[str, list[DeviceId]]]]] = {}
    for member, raw in records.items():
        host, _, worker = member.partition("|")
        ns, since, _ttl = [*raw.split("|", 2), "", ""][:3]
        by_host.setdefault(host, []).append(
            (worker, parse_needs(ns), int(since or now_ms), expiries.get(member, float(now_ms)),
             parse_devices(host_devs.get(member, ""))))
    out = []
    for host, members in sorted(by_host.items()):
        live = [m for m in members if m[3] > now_ms]
        counted = live or members
        totals: dict[str, int] = {}
        devices: dict[str, list[DeviceId]] = {}
        for _w, needs, _since, _exp, devs in counted:
            for typ, n in needs.items():
                totals[typ] = max(totals.get(typ, 0), n)
            for typ, ds in devs.items():
                devices[typ] = sorted({*devices.get(typ, []), *ds}, key=device_order)
        out.append(HostContribution(
            host=host, totals=dict(sorted(totals.items())), workers=sorted(m[0] for m in counted),
            age=(now_ms - min(m[2] for m in counted)) / 1000,
            expires_in=max(0.0, (max(m[3] for m in members) - now_ms) / 1000), expired=not live,
            devices=devices))
    return out


def read_legacy(client: Client, prefix: str = DEFAULT_PREFIX) -> PoolSnapshot | None:
    """The seed's schema: ``<prefix>:<type>:total|used`` strings and ``<prefix>:task:<id>`` hashes
    (type, slots, plugin_name, started_at). Returns None when no such keys exist."""
    types: dict[str, TypeUsage] = {}
    for key in client.scan_iter(match=f"{prefix}:*:total", count=500):
        typ = str(key)[len(prefix) + 1:-len(":total")]
        if "{" in typ or ":" in typ or client.type(key) != "string":
            continue
        total = int(client.get(key) or 0)  # type: ignore[arg-type]
        used = int(client.get(f"{prefix}:{typ}:used") or 0)  # type: ignore[arg-type]
        types[typ] = TypeUsage(typ, total, max(0, used), fixed=True)
    holders = []
    sec, usec = client.time()  # type: ignore[misc]
    now = float(sec) + float(usec) / 1e6
    for key in client.scan_iter(match=f"{prefix}:task:*", count=500):
        if client.type(key) != "hash":
            continue
        h: dict[str, str] = client.hgetall(key)  # type: ignore[assignment]
        task_id = str(key)[len(f"{prefix}:task:"):]
        try:
            started = float(h.get("started_at", "") or "nan")
        except ValueError:
            started = float("nan")
        holders.append(Holder(
            task_id=task_id, task_name=h.get("plugin_name", ""), worker="", host="",
            slots={h.get("type", "?"): int(h.get("slots", 0) or 0)}, token=None,
            age=None if started != started else max(0.0, now - started), lease_remaining=None))
    if not types and not holders:
        return None
    return PoolSnapshot(pool="legacy", scope="legacy", host=None, types=sorted(types.values(), key=lambda t: t.type),
                        holders=sorted(holders, key=lambda x: x.task_id))
