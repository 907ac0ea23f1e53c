"""The fleet adapter: an async API over Celery remote control (no Textual).

Blocking Celery/kombu calls run in threads (``asyncio.to_thread``) so the event loop never stalls.

Membership comes from every source the broker offers, not only ping replies: a solo-pool worker that is busy
answers no control command at all, yet it is running a task. On Redis, kombu keeps each worker's pidbox queue
in the fanout binding set ``_kombu.binding.<control_exchange>.pidbox`` (also while the worker is busy); extra
sources (the fence plugin's registry) can be plugged in.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery

from celeryops.adapters.pidround import RedisRound, Request
from celeryops.core.errors import EXIT_USAGE, BrokerUnreachable, UserError
from celeryops.core.events import Observation, TaskInfo, WorkerObs
from celeryops.core.masking import mask_text, mask_url
from celeryops.core.namespace import OBSERVE_COMMAND
from celeryops.core.urls import is_redis_url

PIDBOX_SEP = "\x06\x16"
# The parts of one observation: OBSERVE_COMMAND, answered by workers running the worker plugin (celeryops.fence),
# sends them all in one reply.
OBSERVE_PARTS = ("active", "reserved", "scheduled", "active_queues")
#: Seconds after a Redis restart during which a worker without a control subscription may still be reconnecting
#: (kombu's reconnect pauses grow to 30 s, and its consumer restarts after): no listener evidence meanwhile.
RECONNECT_GRACE = 60.0
MemberSource = Callable[[], Awaitable[set[str]]]
#: Worker name -> True (its heartbeat is live) / False (its heartbeat expired): evidence of life or departure.
HeartbeatSource = Callable[[], Awaitable[dict[str, bool]]]


def short_args(args: Any, kwargs: Any = None, width: int = 60) -> str:
    a, k = _text(args), _text(kwargs)
    text = f"{a}, {k}" if a and k else a or k
    return text if len(text) <= width else text[: width - 1] + "…"


_EMPTY = ("", "()", "{}", "[]")


def _text(value: Any) -> str:
    if not value and (value is None or isinstance(value, (str, tuple, list, dict))):
        return ""
    text = str(value)
    return "" if text in _EMPTY else text


@dataclass(frozen=True)
class QueueDepth:
    queue: str
    messages: int | None  # None: the broker could not tell


class Fleet:
    """Celery remote control for one fleet.

    ``timeout`` is the reply window of one broadcast round; with ``destination`` + ``limit`` a round returns as
    soon as every addressed worker has replied.
    """

    def __init__(self, app: Celery, *, timeout: float = 1.0, extra_members: Iterable[MemberSource] = ()) -> None:
        self.app = app
        self.timeout = timeout
        self.extra_members = list(extra_members)
        try:
            self.broker_url: str = app.connection_for_write().as_uri(include_password=True)
        except KeyError as exc:  # kombu: "No such transport: htp"
            raise UserError(f"The broker URL names an unknown transport ({exc.args[0]}): nothing was contacted; "
                            "use redis://, rediss:// or amqp:// in --broker, -A or the config.", EXIT_USAGE) from None
        self._redis: redis.Redis | None = None
        self._round: RedisRound | None = None
        self._plain: set[str] = set()  # workers known to answer without the celeryops plugin
        self.heartbeat_sources: list[HeartbeatSource] = []  # the fence plugin's registry (see ``heartbeats``)
        self._first_listeners_at: float | None = None  # see ``pidbox_listeners``
        self._first_pidbox_at: float | None = None  # see ``pidbox_consumers``
        self._sentinel: Any = None  # AMQP: our own connection, to notice the broker going away (a restart)
        self._lost_at: float | None = None  # when that connection was last seen broken
        self._management_quiet_until = 0.0  # the management API did not answer: not asked again before this

    # -- connection ---------------------------------------------------------------------------------------------

    @property
    def display_url(self) -> str:
        return mask_url(self.broker_url)

    @property
    def is_redis(self) -> bool:
        return is_redis_url(self.broker_url)

    def redis(self) -> redis.Redis | None:
        """A client for the broker's Redis (None for other brokers)."""
        if not self.is_redis:
            return None
        if self._redis is None:
            self._redis = redis.Redis.from_url(self.broker_url, socket_connect_timeout=3, socket_timeout=5,
                                               decode_responses=True)
        return self._redis

    async def check_broker(self, timeout: float = 3.0) -> None:
        """Raise BrokerUnreachable (one sentence, exit 4) if the broker does not accept a connection."""

        def connect() -> None:
            conn = self.app.connection_for_write()
            try:
                conn.ensure_connection(max_retries=1, timeout=timeout)
            finally:
                conn.release()

        try:
            await asyncio.wait_for(asyncio.to_thread(connect), timeout + 5)
        except Exception as exc:  # kombu raises many types: OperationalError, socket errors, auth errors
            raise BrokerUnreachable(
                f"Cannot reach the broker at {self.display_url} ({mask_text(_reason(exc))}): nothing was changed; "
                "check the URL (--broker / -A) and that the broker is up.") from None

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        if self._round is not None:
            self._round.close()
            self._round = None
        if self._sentinel is not None:
            with _suppress():
                self._sentinel.release()
            self._sentinel = None

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
        for result in results:
            if isinstance(result, set):
                found |= result
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

    async def pidbox_listeners(self, since: float | None = None) -> int | None:
        """Redis: how many connections listen on the fleet's control channel now (None: not Redis, or unknown).

        Every live worker holds one pattern subscription to the pidbox fanout topic, also while a solo pool is busy
        (the subscription is the server's state; the worker only reads later); a SIGKILLed worker's connection
        closes with its process, so its subscription goes while its pidbox binding stays. PUBSUB NUMPAT counts
        patterns, not subscribers, so this publishes an empty message: PUBLISH returns how many clients got it,
        and kombu's consumers skip a message without data. Writes no key.

        A Redis that restarted after ``since`` (wall time; default: this adapter's first reading) and less than
        :data:`RECONNECT_GRACE` seconds ago gives no evidence (None): its workers may still be reconnecting (kombu
        retries with a growing pause), and one that has not yet would look gone."""
        if not self.is_redis:
            return None
        exchange = self.app.conf.control_exchange
        name = f"{exchange}.pidbox"

        def count() -> tuple[int, float]:
            with self.app.connection_for_write() as conn:
                channel: Any = conn.default_channel
                topics = channel._get_publish_topics(name, "")
                listeners = sum(int(channel.client.publish(topic, "")) for topic in topics)
                uptime = float(channel.client.info("server").get("uptime_in_seconds", RECONNECT_GRACE))
                return listeners, uptime

        try:
            listeners, uptime = await asyncio.to_thread(count)
        except Exception:  # an older kombu without the topic helpers, a broker blip: no evidence
            return None
        now = time.time()
        if self._first_listeners_at is None:
            self._first_listeners_at = now
        since = self._first_listeners_at if since is None else since
        if uptime < RECONNECT_GRACE and now - uptime > since + 1.0:  # restarted since (1 s: uptime's resolution)
            return None
        return listeners

    async def pidbox_consumers(self, names: Iterable[str], since: float | None = None) -> dict[str, int | None]:
        """AMQP: consumers on each worker's own pidbox queue (``<name>.<exchange>.pidbox``, passive queue_declare):
        1 while the worker is connected, also while a solo pool is busy; 0 when the queue is gone (auto-delete: the
        worker's connection closed). None per worker when the broker could not tell; {} on Redis.

        A broker restart deletes every pidbox queue while its workers are still reconnecting: a RabbitMQ that
        restarted after ``since`` (default: this adapter's first reading) and less than :data:`RECONNECT_GRACE`
        seconds ago gives no evidence (None per worker), as on Redis. The restart is read from the management API's
        node uptime when it answers, else from this adapter's own connection to the broker breaking."""
        if self.is_redis:
            return {}
        wanted = sorted(set(names))
        if self._first_pidbox_at is None:
            self._first_pidbox_at = time.time()
        if not await asyncio.to_thread(self._sentinel_alive):  # watched at every reading, so a break is seen
            self._lost_at = time.time()
        if not wanted:
            return {}
        suffix = f".{self.app.conf.control_exchange}.pidbox"
        counts = await self._consumer_counts([n + suffix for n in wanted])
        found = {n: counts.get(n + suffix) for n in wanted}
        if 0 in found.values() and await asyncio.to_thread(
                self._amqp_restarted, self._first_pidbox_at if since is None else since):
            return {n: None for n in wanted}
        return found

    def _amqp_restarted(self, since: float) -> bool:
        """The broker restarted (or dropped our connection) after ``since`` and less than RECONNECT_GRACE ago: from
        the management API when it answers (asked again at most once a minute when it does not), else from our own
        connection breaking."""
        now = time.time()
        if self._lost_at is not None and now - self._lost_at < RECONNECT_GRACE:
            return True
        if now < self._management_quiet_until:
            return False
        uptime = management_uptime(self.broker_url)
        if uptime is None:
            self._management_quiet_until = now + RECONNECT_GRACE
            return False
        return now - uptime > since - 1.0 and uptime < RECONNECT_GRACE

    def _sentinel_alive(self) -> bool:
        """Our own long-lived connection to the broker still holds (False once, when it broke: a restart, a
        failover). It is opened at the first call and again after it broke."""
        conn = self._sentinel
        if conn is not None:
            try:
                conn.drain_events(timeout=0.01)
                return True
            except TimeoutError:
                return True
            except Exception:  # closed by the broker (a restart sends connection.close), or a dead socket
                with _suppress():
                    conn.release()
                self._sentinel = None
        try:
            fresh = self.app.connection_for_write()
            fresh.ensure_connection(max_retries=1, timeout=2)
            self._sentinel = fresh
        except Exception:
            return conn is None  # not up yet: only a connection that broke says the broker went away
        return conn is None

    async def queue_consumers(self, queues: Iterable[str]) -> dict[str, int | None]:
        """AMQP: consumers per queue (passive queue_declare). A worker whose consumer loop is blocked (busy solo
        pool) still holds its consumer. None per queue when the broker could not tell; {} on Redis (no count)."""
        if self.is_redis:
            return {}
        return await self._consumer_counts(sorted(set(queues)))

    async def _consumer_counts(self, queues: list[str]) -> dict[str, int | None]:
        def read() -> dict[str, int | None]:
            out: dict[str, int | None] = {}
            with self.app.connection_for_write() as conn:
                channel = conn.channel()
                try:
                    for name in queues:
                        try:
                            out[name] = int(channel.queue_declare(queue=name, passive=True).consumer_count)
                        except Exception as exc:  # 404: no such queue (auto-deleted): nobody consumes it
                            out[name] = 0 if getattr(exc, "code", None) == 404 else None
                            channel = conn.channel()  # a failed passive declare closes the channel
                finally:
                    with _suppress():
                        channel.close()
            return out

        try:
            return await asyncio.to_thread(read)
        except Exception:
            return {q: None for q in queues}

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

    async def queue_depths(self, queues: Iterable[str]) -> list[QueueDepth]:
        """Messages waiting per queue, read from the broker (they pile up during a drain)."""
        names = sorted(set(queues))

        def read() -> list[QueueDepth]:
            out: list[QueueDepth] = []
            with self.app.connection_for_write() as conn:
                channel = conn.default_channel
                for name in names:
                    try:
                        if self.is_redis:
                            client = channel.client
                            total = sum(int(client.llen(name + (f"\x06\x16{p}" if p else "")))
                                        for p in (0, 3, 6, 9))
                            out.append(QueueDepth(name, total))
                        else:
                            ok = channel.queue_declare(queue=name, passive=True)
                            out.append(QueueDepth(name, int(ok.message_count)))
                    except Exception:  # a queue that does not exist yet, a closed channel
                        out.append(QueueDepth(name, None))
                        channel = conn.channel()
            return out

        return await asyncio.to_thread(read)

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
                                      runtime=max(0.0, clock - float(start)) if start else None))
            for t in ress:
                tasks.append(TaskInfo(worker=name, id=str(t.get("id")), name=str(t.get("name") or t.get("type")),
                                      state="reserved", args=short_args(t.get("args"), t.get("kwargs"))))
            for entry in schs:
                req = entry.get("request") or {}
                tasks.append(TaskInfo(worker=name, id=str(req.get("id")), name=str(req.get("name") or req.get("type")),
                                      state="scheduled", args=short_args(req.get("args"), req.get("kwargs")),
                                      eta=entry.get("eta")))
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
        reply) get the four standard inspect commands, in the same round. On Redis a round is one publish of every
        command and one collection of every reply (``RedisRound``); elsewhere parallel broadcasts."""
        plain = [w for w in known if w in self._plain]
        rich = [w for w in known if w not in self._plain]
        requests: list[Request] = []
        if rich:
            requests.append(Request(OBSERVE_COMMAND, tuple(rich)))
        if plain or not known:
            dest = tuple(plain) if plain else None
            requests += [Request(c, dest) for c in OBSERVE_PARTS]
        replies = await self._rounds(requests)
        out: tuple[dict[str, Any], ...] = ({}, {}, {}, {})
        fallback: list[str] = []
        if rich:
            for worker, reply in replies.pop(0).items():
                if isinstance(reply, dict) and "active_queues" in reply:
                    for part, key in zip(out, OBSERVE_PARTS, strict=True):
                        part[worker] = reply.get(key)
                else:  # answered, but without the plugin: remember, and ask it the standard way now
                    self._plain.add(worker)
                    fallback.append(worker)
        if replies:  # the four standard commands' replies
            for part, more in zip(out, replies, strict=True):
                part.update(more)
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
                f"Lost the broker at {self.display_url} while observing the workers ({mask_text(_reason(exc))}): "
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
                f"Lost the broker at {self.display_url} while sending {command!r} ({mask_text(_reason(exc))}): "
                "check that the broker is up, then run `celeryops status` to see what state the fleet is in."
            ) from None


def management_uptime(broker_url: str, timeout: float = 1.0) -> float | None:
    """RabbitMQ: seconds since the broker's node started, from the management API on the broker's host (port 15672,
    the broker URL's credentials); None when the management plugin does not answer."""
    parts = urllib.parse.urlsplit(broker_url)
    if not parts.scheme.startswith(("amqp", "pyamqp")) or not parts.hostname:
        return None
    user = urllib.parse.unquote(parts.username or "guest")
    password = urllib.parse.unquote(parts.password or "guest")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    request = urllib.request.Request(f"http://{host}:15672/api/nodes?columns=name,uptime",
                                     headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            nodes = json.loads(reply.read())
        uptimes = [float(n["uptime"]) for n in nodes if isinstance(n, dict) and "uptime" in n]
    except Exception:  # no plugin, refused, not JSON: no reading
        return None
    return min(uptimes) / 1000.0 if uptimes else None


def _suppress() -> contextlib.suppress:
    return contextlib.suppress(Exception)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
