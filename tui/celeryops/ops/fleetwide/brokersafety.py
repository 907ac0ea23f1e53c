"""Is the Redis that holds the fleet's tasks (and celeryops' own fence, lease and journal copy) safe to run on?

Celery's documentation requires ``maxmemory-policy noeviction`` for a Redis broker: any other policy with a
``maxmemory`` set lets Redis drop queued task messages under memory pressure, and a ``volatile-*`` policy may drop
the fence, the lease and the journal's fleet copy, which all carry TTLs, in the middle of a run. So:

- an evicting policy (``allkeys-*`` or ``volatile-*``) with a ``maxmemory`` set fails the ``broker_safety`` check
  before anything stops;
- persistence off (no AOF and no RDB save point) is a warning: a Redis restart then loses every queued task and
  the fleet's journal copy.

The settings are read with ``CONFIG GET``; a managed Redis (or an ACL user without ``config|get``, which celeryops'
roles are not given: it would show ``requirepass``) refuses it, and then ``INFO memory`` and ``INFO persistence``
tell the same (``maxmemory``, ``maxmemory_policy``, ``aof_enabled``; the RDB save points are not in INFO, so an RDB
snapshot taken since the start, ``rdb_saves``, stands for them). Reads only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import humanize
import redis

from celeryops.core.masking import mask_text, mask_url

NOEVICTION = "noeviction"
Source = Literal["config", "info"]
Status = Literal["ok", "warn", "fail"]  # as a preflight check's


@dataclass(frozen=True)
class RedisSafety:
    """What one Redis says about eviction and persistence. ``None``: not known (refused or not reported)."""

    maxmemory: int | None
    policy: str | None
    aof: bool | None
    rdb: bool | None  # save points configured (CONFIG); INFO: True once a snapshot was taken, else unknown
    source: Source
    rdb_saves: int | None = None

    @property
    def evicts(self) -> bool:
        """True when the policy may evict keys: any allkeys-* or volatile-* with a maxmemory set."""
        return bool(self.maxmemory) and self.policy is not None and self.policy != NOEVICTION

    @property
    def persistent(self) -> bool | None:
        if self.aof or self.rdb:
            return True
        if self.aof is None or self.rdb is None:
            return None
        return False


@dataclass(frozen=True)
class SafetyVerdict:
    """The verdict on one Redis: ``status`` as a preflight check's, ``detail`` and ``remedy`` one line each."""

    status: Status
    detail: str
    remedy: str = ""
    short: str = ""  # a few words for the console's home view and `status`

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "remedy": self.remedy, "short": self.short}


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _config(client: redis.Redis) -> RedisSafety:
    raw: dict[str, Any] = {}
    for name in ("maxmemory", "maxmemory-policy", "appendonly", "save"):
        for k, v in dict(client.config_get(name)).items():  # type: ignore[union-attr]
            raw[k.decode() if isinstance(k, bytes) else str(k)] = v
    text = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in raw.items()}
    policy = text.get("maxmemory-policy")
    return RedisSafety(maxmemory=_int(text.get("maxmemory")), policy=policy or None,
                       aof=(text["appendonly"].lower() == "yes") if "appendonly" in text else None,
                       rdb=bool(text["save"].strip()) if "save" in text else None, source="config")


def _info(client: redis.Redis) -> RedisSafety:
    memory: dict[str, Any] = dict(client.info("memory"))
    persistence: dict[str, Any] = dict(client.info("persistence"))
    policy = memory.get("maxmemory_policy")
    aof = _int(persistence.get("aof_enabled"))
    saves = _int(persistence.get("rdb_saves"))
    return RedisSafety(maxmemory=_int(memory.get("maxmemory")), policy=str(policy) if policy else None,
                       aof=None if aof is None else aof == 1, rdb=True if saves else None,
                       source="info", rdb_saves=saves)


def read_safety(client: redis.Redis, *, config: bool = True) -> RedisSafety:
    """``CONFIG GET`` (maxmemory, maxmemory-policy, appendonly, save); ``INFO`` when CONFIG is refused (an ACL user
    without it: NOPERM; a managed Redis: an unknown or renamed command), or always (``config=False``: watch mode
    sends INFO only). Raises ``redis.RedisError`` when both are refused or Redis does not answer."""
    if not config:
        return _info(client)
    try:
        found = _config(client)
    except redis.ResponseError:
        return _info(client)
    if found.policy is None and found.maxmemory is None:  # CONFIG answered nothing (a stand-in): ask INFO
        try:
            return _info(client)
        except redis.ResponseError:
            return found
    return found


def judge(safety: RedisSafety, where: str) -> SafetyVerdict:
    """The verdict on ``safety``, read from the Redis named ``where`` (e.g. "the broker at redis://host:6379/0")."""
    how = " (read from INFO: CONFIG GET was refused)" if safety.source == "info" else ""
    if safety.evicts:
        size = humanize.naturalsize(safety.maxmemory or 0, binary=True)
        return SafetyVerdict(
            "fail",
            f"{where} has maxmemory {size} with maxmemory-policy {safety.policy}{how}: under memory pressure Redis "
            "evicts keys, queued tasks and celeryops' fence, lease and journal copy among them, so nothing may be "
            "stopped on it",
            "run `CONFIG SET maxmemory-policy noeviction` on that Redis (and put `maxmemory-policy noeviction` in "
            "its redis.conf), or on a managed Redis set its eviction policy to noeviction (Memorystore: the "
            "maxmemory-policy configuration; ElastiCache: the maxmemory-policy parameter group setting), then run "
            "preflight again",
            short=f"evicts keys ({safety.policy}, maxmemory {size})")
    if safety.policy is None and safety.maxmemory is None:
        return SafetyVerdict("warn", f"{where} did not report its eviction policy{how}",
                             "make sure its maxmemory-policy is noeviction, then accept the warning",
                             short="eviction policy unknown")
    policy = safety.policy or NOEVICTION
    kept = f"maxmemory-policy {policy}" + ("" if safety.maxmemory else ", no maxmemory")
    persistent = safety.persistent
    if persistent is False:
        return SafetyVerdict(
            "warn", f"{where} keeps no data across a restart, with no AOF and no RDB save point ({kept}): a Redis "
                    "restart loses every queued task and the fleet's journal copy",
            "turn persistence on (`CONFIG SET appendonly yes`, or RDB save points), or accept the warning "
            "(--accept-warning broker_safety) if losing the queues on a restart is acceptable",
            short=f"{policy}, no persistence")
    if persistent is None:
        why = ("has no AOF and took no RDB snapshot since it started, and its save points are not in INFO"
               if safety.source == "info" and safety.aof is False else "did not say whether it persists its data")
        return SafetyVerdict("warn", f"{where} {why}{how} ({kept}): if it keeps nothing, a Redis restart loses every "
                                     "queued task and the fleet's journal copy",
                             "make sure AOF or RDB snapshots are on, then accept the warning (--accept-warning "
                             "broker_safety)", short=f"{policy}, persistence unconfirmed")
    kinds = [k for k, on in (("AOF", safety.aof), ("RDB", safety.rdb)) if on]
    return SafetyVerdict("ok", f"{where}: {kept}, persistence {' + '.join(kinds)}",
                         short=f"{policy}, {' + '.join(kinds)}")


def assess(client: redis.Redis, where: str, *, config: bool = True) -> SafetyVerdict:
    """``read_safety`` + ``judge``; a Redis that refuses both CONFIG and INFO is a warning that names the
    permission, one that does not answer a failure."""
    try:
        return judge(read_safety(client, config=config), where)
    except redis.ResponseError as exc:
        return SafetyVerdict("warn", mask_text(f"{where} refused both CONFIG GET and INFO ({exc})"),
                             "allow INFO to the Redis user celeryops connects as (the roles of `celeryops acl` have "
                             "it), or make sure its maxmemory-policy is noeviction and accept the warning",
                             short="unknown (INFO refused)")
    except redis.RedisError as exc:
        return SafetyVerdict("fail", mask_text(f"{where} did not answer ({exc})"),
                             "check that Redis is up, then run preflight again", short="unreachable")


def combine(verdicts: Sequence[SafetyVerdict]) -> SafetyVerdict:
    """Several Redis (the broker, the coordination Redis): the worst status, every detail that is not ok."""
    if not verdicts:
        return SafetyVerdict("ok", "no Redis to check (the broker is not Redis)", short="not Redis")
    rank = {"ok": 0, "warn": 1, "fail": 2}
    worst = max(verdicts, key=lambda v: rank[v.status])
    if worst.status == "ok":
        return SafetyVerdict("ok", "; ".join(v.detail for v in verdicts), short=worst.short)
    bad = [v for v in verdicts if v.status != "ok"]
    return SafetyVerdict(worst.status, "; ".join(v.detail for v in bad),
                         "; ".join(dict.fromkeys(v.remedy for v in bad if v.remedy)), short=worst.short)


Target = tuple[str, redis.Redis]  # (how to name it, a client)


def safety_targets(broker: redis.Redis | None, broker_display: str, coord: redis.Redis | None) -> list[Target]:
    """The fleet's Redis to judge: the broker (if it is Redis) and the coordination Redis (fence, lease, journal
    copy), named for the operator (passwords masked)."""
    found: list[Target] = []
    if broker is not None:
        found.append((f"the broker at {broker_display}", broker))
    if coord is not None:
        kw = coord.connection_pool.connection_kwargs
        where = kw.get("path") or f"{kw.get('host')}:{kw.get('port')}/{kw.get('db', 0)}"
        found.append((f"the fleet's Redis at {mask_url(str(where))}", coord))
    return found


async def assess_all(targets: Sequence[Target], *, config: bool = True) -> SafetyVerdict:
    """Each distinct Redis once (same connection parameters: one read)."""
    seen: dict[str, Target] = {}
    for where, client in targets:
        kw = client.connection_pool.connection_kwargs
        seen.setdefault(f"{kw.get('host')}:{kw.get('port')}:{kw.get('path')}", (where, client))
    verdicts = await asyncio.gather(*(asyncio.to_thread(assess, c, w, config=config) for w, c in seen.values()))
    return combine(list(verdicts))
