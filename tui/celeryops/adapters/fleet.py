"""The fleet adapter: an async API over Celery remote control (no Textual).

Blocking Celery/kombu calls run in threads (``asyncio.to_thread``) so the event loop never stalls.

Membership comes from every source the broker offers, not only ping replies: a solo-pool worker that is busy
answers no control command at all, yet it is running a task. On Redis, kombu keeps each worker's pidbox queue
in the fanout binding set ``_kombu.binding.<control_exchange>.pidbox`` (also while the worker is busy); extra
sources (the fence plugin's registry) can be plugged in. What the broker itself says (its connection, queue depths,
the listeners and consumers that show a silent worker still connected) is :mod:`celeryops.adapters.brokerlink`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from celery import Celery

from celeryops.adapters.brokerlink import RECONNECT_GRACE, BrokerLink, QueueDepth, management_uptime, reason
from celeryops.adapters.pidround import RedisRound, Request
from celeryops.core.errors import BrokerUnreachable
from celeryops.core.events import Observation, TaskInfo, WorkerObs
from celeryops.core.masking import mask_text
from celeryops.core.namespace import OBSERVE_COMMAND

__all__ = ["OBSERVE_PARTS", "PIDBOX_SEP", "RECONNECT_GRACE", "Fleet", "HeartbeatSource", "MemberSource", "QueueDepth",
           "management_uptime", "short_args"]

PIDBOX_SEP = "\x06\x16"
# The parts of one observation: OBSERVE_COMMAND, answered by workers running the worker plugin (celeryops.fence),
# sends them all in one reply.
OBSERVE_PARTS = ("active", "reserved", "scheduled", "active_queues")
MemberSource = Callable[[], Awaitable[set[str]]]
#: Worker name -> True (its heartbeat is live) / False (its heartbeat expired): evidence of life or departure.
HeartbeatSource = Callable[[], Awaitable[dict[str, bool]]]


def short_args(args: Any, kwargs: Any = None, width: int = 60) -> str:
    a, k = _text(args), _text(kwargs)
    text = f"{a}, {k}" if a and k else a or k
    return text if len(text) <= width else text[: width - 1] + "…"


_EMPTY = ("", "()", "{}", "[]")


def _queue_of(request: Any) -> str:
    """The queue a task a worker holds came from: its delivery's routing key (Celery routes to a queue of that
    name by default)."""
    info = request.get("delivery_info") if isinstance(request, dict) else None
    return str((info or {}).get("routing_key") or "")


def _text(value: Any) -> str:
    if not value and (value is None or isinstance(value, (str, tuple, list, dict))):
        return ""
    text = str(value)
    return "" if text in _EMPTY else text


class Fleet(BrokerLink):
    """Celery remote control for one fleet (the broker's own readings: :class:`BrokerLink`).

    ``timeout`` is the reply window of one broadcast round; with ``destination`` + ``limit`` a round returns as
    soon as every addressed worker has replied.
    """

    def __init__(self, app: Celery, *, timeout: float = 1.0, extra_members: Iterable[MemberSource] = ()) -> None:
        super().__init__(app)
        self.timeout = timeout
        self.extra_members = list(extra_members)
        self._round: RedisRound | None = None
        self._plain: set[str] = set()  # workers known to answer without the celeryops plugin
        self._rich: set[str] = set()  # workers known to answer celeryops_observe
        self._registered: set[str] = set()  # workers a plugged-in registry listed (the fence plugin's)
        self.heartbeat_sources: list[HeartbeatSource] = []  # the fence plugin's registry (see ``heartbeats``)

    def close(self) -> None:
        if self._round is not None:
            self._round.close()
            self._round = None
        super().close()


    # -- membership ---------------------------------------------------------------------------------------------

    async def ping(self, destination: Iterable[str] | None = None, timeout: float | None = None,
                   limit: int | None = None) -> set[str]:
        """Workers that answer ping. Without ``destination``, waits the whole timeout unless ``limit`` replies
        came first (a broadcast cannot know how many workers exist)."""
        dest = list(destination) if destination is not None else None
        replies = await self._broadcast("ping", destination=dest, timeout=timeout, limit=limit)
        return set(replies)

    def _pidbox_key(self) -> str:
        opts = self.app.conf.broker_transport_options or {}
        prefix = str(opts.get("global_keyprefix", ""))
        return f"{prefix}_kombu.binding.{self.app.conf.control_exchange}.pidbox"

    async def pidbox_members(self) -> set[str] | None:
        """Workers whose pidbox queue is bound on the Redis broker (None when the broker is not Redis)."""
        client = self.redis()
        if client is None:
            return None
        suffix = f".{self.app.conf.control_exchange}.pidbox"
        raw = await asyncio.to_thread(client.smembers, self._pidbox_key())
        members: set[str] = set()
        for entry in raw:  # type: ignore[union-attr]
            queue = str(entry).split(PIDBOX_SEP)[-1]
            if queue.endswith(suffix):
                members.add(queue[: -len(suffix)])
        return members

    async def members(self) -> set[str]:
        """Every worker any source knows of: on Redis the pidbox bindings (cheap, include busy workers), else ping
        replies; plus plugged-in registries (the fence plugin's)."""
        sources: list[Awaitable[set[str] | None]] = [self.pidbox_members() if self.is_redis else self.ping()]
        results = await asyncio.gather(*sources, *(src() for src in self.extra_members), return_exceptions=True)
        found: set[str] = set()
        for i, result in enumerate(results):
            if isinstance(result, set):
                found |= result
                if i:  # a registry's (the fence plugin's): these run the plugin
                    self._registered |= result
        return found

    # -- liveness evidence --------------------------------------------------------------------------------------

    async def heartbeats(self) -> dict[str, bool]:
        """Workers with a heartbeat somewhere (the fence plugin's registry): True while it is live, False once it
        expired (the worker stopped beating: dead, or cut off from Redis). Live wins over expired."""
        results = await asyncio.gather(*(src() for src in self.heartbeat_sources), return_exceptions=True)
        found: dict[str, bool] = {}
        for result in results:
            if isinstance(result, dict):
                for name, live in result.items():
                    found[name] = found.get(name, False) or bool(live)
        return found

    # -- queues -------------------------------------------------------------------------------------------------

    async def active_queues(self, destination: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
        dest = list(destination) if destination is not None else None
        replies = await self._broadcast("active_queues", destination=dest)
        return {w: tuple(sorted(q["name"] for q in (qs or []))) for w, qs in replies.items()}

    async def cancel_consumer(self, queue: str, destination: Iterable[str] | None = None, *,
                              reply: bool = True, expect: int | None = None) -> set[str]:
        """Stop fetching from ``queue`` (running and prefetched tasks still run). Returns the workers that
        confirmed (empty when ``reply`` is False). A broadcast returns early once ``expect`` workers replied."""
        dest = list(destination) if destination is not None else None
        replies = await self._broadcast("cancel_consumer", {"queue": queue}, destination=dest, reply=reply,
                                        limit=expect)
        return {w for w, r in replies.items() if isinstance(r, dict) and "ok" in r}

    async def add_consumer(self, queue: str, destination: Iterable[str] | None = None, *,
                           reply: bool = True) -> set[str]:
        dest = list(destination) if destination is not None else None
        replies = await self._broadcast("add_consumer", {"queue": queue}, destination=dest, reply=reply)
        return {w for w, r in replies.items() if isinstance(r, dict) and "ok" in r}

    async def processed(self, destination: Iterable[str]) -> dict[str, int]:
        """Tasks each worker of ``destination`` accepted since it started (``inspect stats``: the sum of its
        ``total``), by worker; a worker that did not answer is left out."""
        dest = sorted(set(destination))
        if not dest:
            return {}
        replies = await self._broadcast("stats", destination=dest)
        return {w: sum(int(n) for n in (r.get("total") or {}).values())
                for w, r in replies.items() if isinstance(r, dict)}

    async def inspect(self, commands: Iterable[tuple[str, dict[str, Any]]],
                      destination: Iterable[str]) -> list[dict[str, Any]]:
        """Read-only inspect ``commands`` (name, arguments) to ``destination``, in one round that returns as soon as
        every addressed worker answered each (on Redis one publish and one collection): per command, worker ->
        reply; a worker that did not answer is left out."""
        dest = tuple(sorted(set(destination)))
        if not dest:
            return [{} for _ in commands]
        return await self._rounds([Request(name, dest, tuple(sorted(args.items()))) for name, args in commands])

    async def concurrency(self, destination: Iterable[str]) -> dict[str, int]:
        """How many tasks each worker of ``destination`` runs at once (``inspect stats``: its pool's
        ``max-concurrency``; 1 when its pool does not say, a solo pool), by worker; a worker that did not answer is
        left out."""
        dest = sorted(set(destination))
        if not dest:
            return {}
        replies = await self._broadcast("stats", destination=dest)
        return {w: int((r.get("pool") or {}).get("max-concurrency") or 1)
                for w, r in replies.items() if isinstance(r, dict)}

    # -- observation --------------------------------------------------------------------------------------------

    async def observe(self, known: Iterable[str], queues: Iterable[str] = (), *,
                      now: Callable[[], float] = time.time) -> Observation:
        """One observation: active + reserved + scheduled + active_queues of every known worker, in one parallel
        round that returns as soon as every known worker has replied. Workers that reply without being known are
        included (they join the known set)."""
        known_list = sorted(set(known))
        drained = set(queues)
        active, reserved, scheduled, consuming = await self._observe_round(known_list)
        names = set(known_list) | set(active) | set(reserved) | set(scheduled) | set(consuming)
        clock = now()
        tasks: list[TaskInfo] = []
        workers: dict[str, WorkerObs] = {}
        for name in sorted(names):
            replied = all(name in r for r in (active, reserved, scheduled, consuming))
            acts = active.get(name) or []
            ress = reserved.get(name) or []
            schs = scheduled.get(name) or []
            qs = tuple(sorted(q["name"] for q in (consuming.get(name) or [])))
            for t in acts:
                start = t.get("time_start")
                tasks.append(TaskInfo(worker=name, id=str(t.get("id")), name=str(t.get("name") or t.get("type")),
                                      state="active", args=short_args(t.get("args"), t.get("kwargs")),
                                      runtime=max(0.0, clock - float(start)) if start else None,
                                      queue=_queue_of(t)))
            for t in ress:
                tasks.append(TaskInfo(worker=name, id=str(t.get("id")), name=str(t.get("name") or t.get("type")),
                                      state="reserved", args=short_args(t.get("args"), t.get("kwargs")),
                                      queue=_queue_of(t)))
            for entry in schs:
                req = entry.get("request") or {}
                tasks.append(TaskInfo(worker=name, id=str(req.get("id")), name=str(req.get("name") or req.get("type")),
                                      state="scheduled", args=short_args(req.get("args"), req.get("kwargs")),
                                      eta=entry.get("eta"), queue=_queue_of(req)))
            if not replied:
                state = "unknown"
            elif (drained and not (set(qs) & drained)) or (not drained and not qs):
                state = "stopped"
            else:
                state = "consuming"
            workers[name] = WorkerObs(name=name, replied=replied, active=len(acts), reserved=len(ress),
                                      scheduled=len(schs), queues=qs, state=state,  # type: ignore[arg-type]
                                      plugin=replied and name not in self._plain)
        return Observation(workers=workers, tasks=tuple(tasks))

    async def _observe_round(self, known: list[str]) -> tuple[dict[str, Any], ...]:
        """Plugin workers answer one ``celeryops_observe``; the others (learned from their "unknown command"
        reply) get the four standard inspect commands, in the same round. A worker not known either way (not yet
        observed, and no registry lists it as a plugin worker) is asked both ways in that round, so a fleet of plain
        workers is observed in one round from the first. On Redis a round is one publish of every command and one
        collection of every reply (``RedisRound``); elsewhere parallel broadcasts."""
        plain = [w for w in known if w in self._plain]
        rich = [w for w in known if w not in self._plain]
        unsure = {w for w in rich if w not in self._rich and w not in self._registered}
        standard = [*plain, *sorted(unsure)]
        requests: list[Request] = []
        if rich:
            requests.append(Request(OBSERVE_COMMAND, tuple(rich)))
        if standard or not known:
            dest = tuple(standard) if standard else None
            requests += [Request(c, dest) for c in OBSERVE_PARTS]
        replies = await self._rounds(requests)
        out: tuple[dict[str, Any], ...] = ({}, {}, {}, {})
        fallback: list[str] = []
        answered: set[str] = set()  # by celeryops_observe
        if rich:
            for worker, reply in replies.pop(0).items():
                if isinstance(reply, dict) and "active_queues" in reply:
                    self._rich.add(worker)
                    answered.add(worker)
                    for part, key in zip(out, OBSERVE_PARTS, strict=True):
                        part[worker] = reply.get(key)
                else:  # answered, but without the plugin: remember, and ask it the standard way (now, unless done)
                    self._plain.add(worker)
                    self._rich.discard(worker)
                    if worker not in unsure:
                        fallback.append(worker)
        if replies:  # the four standard commands' replies (a plugin worker asked both ways: its own reply wins)
            for part, more in zip(out, replies, strict=True):
                part.update({w: r for w, r in more.items() if w not in answered})
        if fallback:
            extra = await self._rounds([Request(c, tuple(fallback)) for c in OBSERVE_PARTS])
            for part, more in zip(out, extra, strict=True):
                part.update(more)
        return out

    async def _rounds(self, requests: list[Request]) -> list[dict[str, Any]]:
        """Every request's replies (worker -> reply), in order: one ``RedisRound`` on Redis, else one parallel
        broadcast per request."""
        if not requests:
            return []
        if not self.is_redis:
            return list(await asyncio.gather(*(
                self._broadcast(r.command, dict(r.arguments), destination=list(r.destination)
                                if r.destination is not None else None) for r in requests)))
        if self._round is None:
            opts = self.app.conf.broker_transport_options or {}
            self._round = RedisRound(self.app, self.broker_url, keyprefix=str(opts.get("global_keyprefix", "")))
        rounds = self._round
        try:
            return await asyncio.to_thread(rounds.round, requests, self.timeout)
        except Exception as exc:
            raise BrokerUnreachable(
                f"Lost the broker at {self.display_url} while observing the workers ({mask_text(reason(exc))}): "
                "check that the broker is up, then run `celeryops status` to see what state the fleet is in."
            ) from None

    # -- plumbing -----------------------------------------------------------------------------------------------

    async def _broadcast(self, command: str, arguments: dict[str, Any] | None = None, *,
                         destination: list[str] | None = None, reply: bool = True,
                         timeout: float | None = None, limit: int | None = None) -> dict[str, Any]:
        wait = self.timeout if timeout is None else timeout
        if destination:
            limit = len(destination)

        def call() -> dict[str, Any]:
            replies = self.app.control.broadcast(command, arguments=arguments or {}, destination=destination,
                                                 reply=reply, timeout=wait, limit=limit)
            merged: dict[str, Any] = {}
            for item in replies or []:
                merged.update(item)
            return merged

        try:
            return await asyncio.to_thread(call)
        except Exception as exc:
            raise BrokerUnreachable(
                f"Lost the broker at {self.display_url} while sending {command!r} ({mask_text(reason(exc))}): "
                "check that the broker is up, then run `celeryops status` to see what state the fleet is in."
            ) from None
