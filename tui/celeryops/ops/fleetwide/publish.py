"""The running run's live status, mirrored to Redis so ``celeryops watch``/``status`` on any machine can follow it.

Writer side (``Publisher``, used by the run on the operator's machine):

- one hash ``fleet_key(fleet, "status")``: run id, kind (deploy, drain, rollback), phase, owner, host, release,
  started_at, updated_at and the latest progress (JSON);
- one capped stream ``fleet_key(fleet, "events")`` (``XADD MAXLEN ~ 1000``): phase changes, notes and progress
  snapshots, in order.

Both keys get their TTL refreshed on every write (and periodically while nothing changes). The publisher never blocks
its caller: calls only update memory; a background task writes at most ``max_writes_per_second`` times a second (the
latest progress always wins, older progress in between is dropped), and when Redis is down it keeps what is pending,
logs once and retries.

Reader side (``read_status``, ``read_events``): reads only (HGETALL, XRANGE), so a read-only Redis user may watch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

import redis

from celeryops.core.aio import cancel_and_wait, wait_event
from celeryops.core.events import RunKind
from celeryops.core.masking import mask_text
from celeryops.core.namespace import fleet_key
from celeryops.core.untrusted import MalformedRecord

log = logging.getLogger(__name__)

DEFAULT_TTL: Final = 24 * 3600.0
STREAM_MAXLEN: Final = 1000


def status_key(fleet: str) -> str:
    return fleet_key(fleet, "status")


def events_key(fleet: str) -> str:
    return fleet_key(fleet, "events")


@dataclass(frozen=True)
class PublishedStatus:
    """What the running (or last) run of a fleet published."""

    fleet: str
    run_id: str
    phase: str
    owner: str
    host: str
    release: str | None
    started_at: float
    updated_at: float
    progress: dict[str, Any] = field(default_factory=dict)
    kind: str = ""  # deploy | drain | rollback | autoscale ("": published by an older version: tell it by the release)

    def as_dict(self) -> dict[str, Any]:
        return {"fleet": self.fleet, "run_id": self.run_id, "phase": self.phase, "owner": self.owner,
                "host": self.host, "release": self.release, "started_at": self.started_at,
                "updated_at": self.updated_at, "progress": self.progress, "kind": self.run_kind}

    @property
    def run_kind(self) -> RunKind:
        if self.kind in ("deploy", "drain", "rollback", "autoscale"):
            return cast(RunKind, self.kind)
        return "deploy" if self.release else "drain"


@dataclass(frozen=True)
class PublishedEvent:
    """One stream entry: ``kind`` is ``phase``, ``progress``, ``note`` or what the run chose."""

    id: str
    kind: str
    run_id: str
    at: float
    data: dict[str, Any]


def _dumps(value: object) -> str:
    return mask_text(json.dumps(value, sort_keys=True, default=str))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _loads(value: str) -> dict[str, Any]:
    try:
        loaded = json.loads(value)
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {"value": loaded}


def read_status(client: redis.Redis, fleet: str) -> PublishedStatus | None:
    """The fleet's published status, or None. One HGETALL: nothing is written."""
    raw = client.hgetall(status_key(fleet))
    if not raw:
        return None
    f = {_text(k): _text(v) for k, v in raw.items()}
    try:
        started_at, updated_at = float(f.get("started_at") or 0), float(f.get("updated_at") or 0)
    except ValueError as exc:  # input: any client of the fleet's Redis may have written it
        raise MalformedRecord(status_key(fleet), str(exc), what="published status") from None
    return PublishedStatus(fleet=fleet, run_id=f.get("run_id", "?"), phase=f.get("phase", "?"),
                           owner=f.get("owner", "?"), host=f.get("host", "?"), release=f.get("release") or None,
                           started_at=started_at, updated_at=updated_at,
                           progress=_loads(f.get("progress", "{}")), kind=f.get("kind", ""))


def read_events(client: redis.Redis, fleet: str, last_id: str | None = None, count: int = 500) -> list[PublishedEvent]:
    """Events after ``last_id`` (exclusive; None = from the oldest kept), oldest first. One XRANGE."""
    start = "-" if not last_id or last_id == "0-0" else f"({last_id}"
    entries = client.xrange(events_key(fleet), min=start, max="+", count=count)
    out: list[PublishedEvent] = []
    for entry_id, raw in entries or []:
        f = {_text(k): _text(v) for k, v in (raw or {}).items()}
        try:
            at = float(f.get("at") or 0)
        except ValueError:  # a malformed entry is not an event of the run: skipped
            continue
        out.append(PublishedEvent(id=_text(entry_id), kind=f.get("kind", "?"), run_id=f.get("run_id", "?"),
                                  at=at, data=_loads(f.get("data", "{}"))))
    return out


class Publisher:
    """Mirrors one run to Redis without ever blocking the run. Call ``start()`` inside the event loop (or
    ``flush()`` yourself from sync code); ``await close()`` writes what is pending before the run exits."""

    def __init__(
        self,
        client: redis.Redis,
        fleet: str,
        *,
        run_id: str,
        owner: str,
        host: str,
        release: str | None = None,
        started_at: float | None = None,
        phase: str = "preflight",
        kind: str = "",
        max_writes_per_second: float = 4.0,
        ttl: float = DEFAULT_TTL,
        maxlen: int = STREAM_MAXLEN,
        max_pending_events: int = 1000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_writes_per_second <= 0:
            raise ValueError("max_writes_per_second must be positive")
        self.client = client
        self.fleet = fleet
        self.ttl = ttl
        self.maxlen = maxlen
        self.interval = 1.0 / max_writes_per_second
        self._clock = clock
        now = clock()
        self._status: dict[str, str] = {
            "fleet": fleet, "run_id": run_id, "phase": phase, "owner": owner, "host": host,
            "release": release or "", "started_at": repr(started_at if started_at is not None else now),
            "updated_at": repr(now), "progress": "{}", "kind": kind,
        }
        self._lock = threading.Lock()
        # One flush at a time: a flush begun later (close's last one) writes its newer state after an earlier one,
        # which may still be in its thread (the writer cancelled mid-flush), instead of that one's older state last.
        self._flushing = threading.Lock()
        self._events: deque[dict[str, str]] = deque(maxlen=max_pending_events)
        self._progress: str | None = None  # pending progress JSON (latest wins)
        self._dirty_status = True
        self._failing = False
        self._inflight = False  # a write is on its way to Redis
        self.writes = 0  # successful Redis round trips (for tests and benchmarks)
        self._wake: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None  # a phase is pending: no pause before the next write
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def run_id(self) -> str:
        return self._status["run_id"]

    # -- what the run calls (never blocks, never raises on Redis) ---------------------------------------------
    def phase(self, phase: str, **data: Any) -> None:
        """The run moved to ``phase``: updates the status and appends a ``phase`` event (never coalesced)."""
        with self._lock:
            self._status["phase"] = phase
            self._touch()
            self._queue_event("phase", {"phase": phase, **data})
        self._notify(urgent=True)

    def progress(self, data: Mapping[str, Any]) -> None:
        """Latest progress (e.g. in-flight counts, streak): coalesced, the latest always wins."""
        text = _dumps(dict(data))
        with self._lock:
            self._status["progress"] = text
            self._progress = text
            self._touch()
        self._notify()

    def event(self, kind: str, data: Mapping[str, Any] | None = None) -> None:
        """Any other event (note, warning, operator decision): appended in order, never coalesced."""
        with self._lock:
            self._touch()
            self._queue_event(kind, dict(data or {}))
        self._notify()

    def _touch(self) -> None:
        self._status["updated_at"] = repr(self._clock())
        self._dirty_status = True

    def _queue_event(self, kind: str, data: dict[str, Any]) -> None:
        self._events.append({"kind": kind, "run_id": self.run_id, "at": repr(self._clock()), "data": _dumps(data)})

    def _notify(self, urgent: bool = False) -> None:
        """Wake the writer; ``urgent`` (a phase): also cut its pause between writes short."""
        loop, wake, hurry = self._loop, self._wake, self._hurry
        if loop is None or wake is None or hurry is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for event in (wake, hurry) if urgent else (wake,):
            if running is loop:
                event.set()
            else:
                loop.call_soon_threadsafe(event.set)

    # -- writing -----------------------------------------------------------------------------------------------
    def flush(self, touch: bool = False) -> bool:
        """Write what is pending now (sync). False if Redis failed: nothing pending is lost, try again later."""
        with self._flushing:
            return self._flush(touch)

    def _flush(self, touch: bool) -> bool:
        with self._lock:
            if not (self._dirty_status or self._events or self._progress is not None or touch):
                return True
            status = dict(self._status)
            events = list(self._events)
            progress = self._progress
            self._events.clear()
            self._progress = None
            self._dirty_status = False
            self._inflight = True
        if progress is not None:
            events.append({"kind": "progress", "run_id": status["run_id"], "at": status["updated_at"],
                           "data": progress})
        skey, ekey = status_key(self.fleet), events_key(self.fleet)
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.hset(skey, mapping=status)  # type: ignore[arg-type]
            pipe.expire(skey, int(self.ttl))
            for ev in events:
                pipe.xadd(ekey, ev, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
            if events or touch:
                pipe.expire(ekey, int(self.ttl))
            pipe.execute()
        except redis.RedisError as exc:
            with self._lock:
                self._inflight = False
                self._dirty_status = True
                pending = list(self._events)
                self._events.clear()
                self._events.extend([ev for ev in events if ev["kind"] != "progress"] + pending)
                if self._progress is None and progress is not None:
                    self._progress = progress
            if not self._failing:
                log.warning("could not publish the run status to Redis (%s); the run goes on, retrying", exc)
            self._failing = True
            return False
        with self._lock:
            self._inflight = False
        if self._failing:
            log.info("publishing the run status to Redis again")
        self._failing = False
        self.writes += 1
        return True

    async def _run(self) -> None:
        assert self._wake is not None
        keepalive = max(self.interval, self.ttl / 3)
        backoff = self.interval
        while True:
            touch = not await wait_event(self._wake, keepalive)
            self._wake.clear()
            ok = await asyncio.to_thread(self.flush, touch)
            if self._closing:
                return
            if ok:
                backoff = self.interval
                assert self._hurry is not None
                await wait_event(self._hurry, self.interval)
                self._hurry.clear()
            else:
                self._wake.set()  # retry what is pending
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def caught_up(self, timeout: float = 1.0) -> bool:
        """Wait (at most ``timeout`` s) until everything pending is in Redis, e.g. a phase before the step it
        announces: a run killed right after would otherwise leave its published phase behind the journal's. False
        when Redis did not take it in time (the run goes on; the writer keeps trying)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            with self._lock:
                pending = self._dirty_status or bool(self._events) or self._progress is not None or self._inflight
            if not pending:
                return True
            if loop.time() >= deadline or self._task is None or self._task.done():
                return False
            await asyncio.sleep(0.01)

    def start(self) -> asyncio.Task[None]:
        """Start the background writer in the running loop (idempotent)."""
        if self._task is None or self._task.done():
            self._loop = asyncio.get_running_loop()
            self._wake = asyncio.Event()
            self._wake.set()
            self._hurry = asyncio.Event()
            self._closing = False
            self._task = self._loop.create_task(self._run(), name=f"publish-{self.fleet}")
        return self._task

    async def close(self, timeout: float = 2.0) -> bool:
        """Stop the writer and try one last flush (at most ``timeout`` s). True if everything was written."""
        self._closing = True
        task, self._task = self._task, None
        await cancel_and_wait(task)
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.flush), timeout=timeout)
        except TimeoutError:
            return False
