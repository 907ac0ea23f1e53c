"""The autoscaler's live status, mirrored to Redis so ``celeryops watch`` and ``status`` on any machine show it.

One hash ``fleet_key(fleet, "autoscale")`` holds one JSON document (field ``status``): the pool, who runs the
autoscaler, its settings, the last look (demand per queue, capacity, the cohorts and their state), the history of
demand against capacity, and the last decisions with their reasons. It is rewritten at every look (one HSET and an
EXPIRE) and expires ``ttl`` seconds after the last one; ``state`` says ``stopped`` once the autoscaler ended.

Reading (:func:`read_scale_status`) is one HGET: a read-only Redis user may watch.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Final

import redis

from celeryops.core.masking import mask_text
from celeryops.core.namespace import fleet_key
from celeryops.core.untrusted import MalformedRecord

DEFAULT_TTL: Final = 24 * 3600.0


def scale_key(fleet: str) -> str:
    return fleet_key(fleet, "autoscale")


@dataclass(frozen=True)
class ScaleStatus:
    """What the autoscaler of a fleet last published (see the module). ``points``: ``(at, demand, capacity)``
    oldest first (``at``: epoch seconds); ``decisions``: the last ones, oldest first, each a
    :meth:`~celeryops.ops.autoscale.policy.Decision.to_json` dict; ``cohorts``: revision, count, live, busy,
    state; ``demand``: queue, ready, reserved, active, scheduled."""

    fleet: str
    target: str
    state: str  # running | stopped
    owner: str = ""
    host: str = ""
    pid: int = 0
    started_at: float = 0.0
    updated_at: float = 0.0
    interval: float = 5.0
    per_instance: int = 0
    queues: tuple[str, ...] = ()
    instances: int = 0
    desired: int = 0
    cohorts: tuple[dict[str, Any], ...] = ()
    demand: tuple[dict[str, Any], ...] = ()
    points: tuple[tuple[float, int, int], ...] = ()
    decisions: tuple[dict[str, Any], ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    message: str = ""  # why the autoscaler stopped, or leaves the pool alone

    def as_dict(self) -> dict[str, Any]:
        return {"fleet": self.fleet, "target": self.target, "state": self.state, "owner": self.owner,
                "host": self.host, "pid": self.pid, "started_at": self.started_at, "updated_at": self.updated_at,
                "interval": self.interval, "per_instance": self.per_instance, "queues": list(self.queues),
                "instances": self.instances, "desired": self.desired, "cohorts": list(self.cohorts),
                "demand": list(self.demand), "points": [list(p) for p in self.points],
                "decisions": list(self.decisions), "settings": self.settings, "message": self.message}

    def stale(self, now: float | None = None) -> bool:
        """A running autoscaler that has not looked for three intervals (and 30 s): its process is gone."""
        now = time.time() if now is None else now
        return self.state == "running" and now - self.updated_at > max(30.0, 3 * self.interval)

    def alive(self, now: float | None = None) -> bool:
        """An autoscaler runs: it said ``running``, has looked lately, and its process is not known dead (it ran on
        this host and is gone)."""
        from celeryops.ops.fleetwide.lease import process_gone

        return self.state == "running" and not self.stale(now) and not process_gone(self.host, self.pid)

    @property
    def last(self) -> dict[str, Any] | None:
        return self.decisions[-1] if self.decisions else None


def publish_scale_status(client: redis.Redis, status: ScaleStatus, ttl: float = DEFAULT_TTL) -> None:
    """Write ``status`` (passwords masked); raises redis errors to the caller (which goes on without)."""
    pipe = client.pipeline(transaction=True)
    pipe.hset(scale_key(status.fleet), "status", mask_text(json.dumps(status.as_dict(), default=str)))
    pipe.expire(scale_key(status.fleet), int(ttl))
    pipe.execute()


def _tuple_of_dicts(value: Any) -> tuple[dict[str, Any], ...]:
    return tuple(v for v in value or () if isinstance(v, dict))


def read_scale_status(client: redis.Redis, fleet: str) -> ScaleStatus | None:
    """The fleet's published autoscaler status, or None. One HGET: nothing is written."""
    raw = client.hget(scale_key(fleet), "status")
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return ScaleStatus(
            fleet=fleet, target=str(data.get("target", "")), state=str(data.get("state", "")),
            owner=str(data.get("owner", "")), host=str(data.get("host", "")), pid=int(data.get("pid") or 0),
            started_at=float(data.get("started_at") or 0), updated_at=float(data.get("updated_at") or 0),
            interval=float(data.get("interval") or 5.0), per_instance=int(data.get("per_instance") or 0),
            queues=tuple(str(q) for q in data.get("queues") or ()), instances=int(data.get("instances") or 0),
            desired=int(data.get("desired") or 0), cohorts=_tuple_of_dicts(data.get("cohorts")),
            demand=_tuple_of_dicts(data.get("demand")),
            points=tuple((float(p[0]), int(p[1]), int(p[2])) for p in data.get("points") or ()),
            decisions=_tuple_of_dicts(data.get("decisions")),
            settings=dict(data.get("settings") or {}),
            message=str(data.get("message", "")))
    except (ValueError, TypeError, IndexError) as exc:  # input: any client of the fleet's Redis may have written it
        raise MalformedRecord(scale_key(fleet), str(exc), what="autoscaler status") from None


__all__ = ["ScaleStatus", "publish_scale_status", "read_scale_status", "scale_key"]
