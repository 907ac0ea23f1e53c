"""The broker under a fleet: its connection, and what the broker itself says of the workers (no Textual).

:class:`BrokerLink` is the part of :class:`~celeryops.adapters.fleet.Fleet` that reads the broker rather than asking
the workers: its Redis client, whether it accepts a connection, the messages waiting per queue, and the evidence
that a worker is still connected while it answers nothing (a busy solo pool): on Redis the listeners on the control
channel, on AMQP the consumers on each worker's pidbox queue. A broker that restarted lately gives no such evidence
(its workers may still be reconnecting): the restart is read from Redis' uptime, RabbitMQ's management API
(:func:`management_uptime`), or this adapter's own connection breaking.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery

from celeryops.core.errors import EXIT_USAGE, BrokerUnreachable, UserError
from celeryops.core.masking import mask_text, mask_url
from celeryops.core.urls import is_redis_url

#: Seconds after a Redis restart during which a worker without a control subscription may still be reconnecting
#: (kombu's reconnect pauses grow to 30 s, and its consumer restarts after): no listener evidence meanwhile.
RECONNECT_GRACE = 60.0
#: kombu's Redis transport: a queue's messages of priority 3, 6 and 9 wait in lists of their own, named after it.
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEP = "\x06\x16"


@dataclass(frozen=True)
class QueueDepth:
    queue: str
    messages: int | None  # None: the broker could not tell


class BrokerLink:
    """The broker of one Celery app: the connection, queue depths and the connection evidence of workers."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        try:
            self.broker_url: str = app.connection_for_write().as_uri(include_password=True)
        except KeyError as exc:  # kombu: "No such transport: htp"
            raise UserError(f"The broker URL names an unknown transport ({exc.args[0]}): nothing was contacted; "
                            "use redis://, rediss:// or amqp:// in --broker, -A or the config.", EXIT_USAGE) from None
        self._redis: redis.Redis | None = None
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
        if self._redis is None:  # named as the transport's connections are (watch mode: celeryops-watch)
            self._redis = redis.Redis.from_url(self.broker_url, socket_connect_timeout=3, socket_timeout=5,
                                               decode_responses=True, client_name=client_name(self.app))
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
            if login_refused(exc):
                raise BrokerUnreachable(
                    f"The broker at {self.display_url} refused the login ({mask_text(reason(exc))}): nothing was "
                    "changed; check that URL's user and password (a --broker URL is used as given, whatever "
                    "$CELERY_BROKER_URL says).") from None
            raise BrokerUnreachable(
                f"Cannot reach the broker at {self.display_url} ({mask_text(reason(exc))}): nothing was changed; "
                "check the URL (--broker / -A) and that the broker is up.") from None

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        if self._sentinel is not None:
            with suppress():
                self._sentinel.release()
            self._sentinel = None

    # -- connection evidence ----------------------------------------------------------------------------------------

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
                with suppress():
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
                    with suppress():
                        channel.close()
            return out

        try:
            return await asyncio.to_thread(read)
        except Exception:
            return {q: None for q in queues}

    # -- queues -----------------------------------------------------------------------------------------------------

    async def queue_depths(self, queues: Iterable[str]) -> list[QueueDepth]:
        """Messages waiting per queue, read from the broker (they pile up during a drain). On Redis one pipelined
        round trip on the held client reads every queue's lists, one per priority step of kombu's
        (``priority_steps``, default 0, 3, 6, 9)."""
        names = sorted(set(queues))
        client = self.redis()
        if client is not None:
            options = self.app.conf.broker_transport_options or {}
            prefix = str(options.get("global_keyprefix", ""))
            steps = tuple(sorted({int(p) for p in options.get("priority_steps") or PRIORITY_STEPS} | {0}))
            return await asyncio.to_thread(redis_depths, client, names, prefix, steps)

        def read() -> list[QueueDepth]:
            out: list[QueueDepth] = []
            with self.app.connection_for_write() as conn:
                channel = conn.default_channel
                for name in names:
                    try:
                        ok = channel.queue_declare(queue=name, passive=True)
                        out.append(QueueDepth(name, int(ok.message_count)))
                    except Exception:  # a queue that does not exist yet, a closed channel
                        out.append(QueueDepth(name, None))
                        channel = conn.channel()
            return out

        return await asyncio.to_thread(read)


def redis_depths(client: redis.Redis, names: list[str], prefix: str = "",
                 steps: tuple[int, ...] = PRIORITY_STEPS) -> list[QueueDepth]:
    """Messages waiting in each of the queues ``names`` on a Redis broker, in one pipelined round trip: kombu's Redis
    transport keeps a queue in one list per priority step (the queue's name, then the name, its separator and each
    other step of ``steps``), under the transport's key ``prefix``; their lengths, summed per queue. A queue whose
    lists cannot be read (not a list) is None, as is every queue when the broker does not answer."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        for step in steps:
            pipe.llen(prefix + name + (f"{PRIORITY_SEP}{step}" if step else ""))
    try:
        lengths = pipe.execute(raise_on_error=False)
    except redis.RedisError:
        return [QueueDepth(name, None) for name in names]
    out: list[QueueDepth] = []
    for i, name in enumerate(names):
        mine = lengths[i * len(steps):(i + 1) * len(steps)]
        out.append(QueueDepth(name, None if any(isinstance(n, Exception) for n in mine)
                              else sum(int(n) for n in mine)))
    return out


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
    from urllib.request import Request, urlopen  # RabbitMQ's management API only: not on a Redis fleet's path

    request = Request(f"http://{host}:15672/api/nodes?columns=name,uptime",
                      headers={"Authorization": f"Basic {token}"})
    try:
        with urlopen(request, timeout=timeout) as reply:
            nodes = json.loads(reply.read())
        uptimes = [float(n["uptime"]) for n in nodes if isinstance(n, dict) and "uptime" in n]
    except Exception:  # no plugin, refused, not JSON: no reading
        return None
    return min(uptimes) / 1000.0 if uptimes else None


def client_name(app: Celery) -> str | None:
    """The name kombu gives this app's broker connections (``broker_transport_options["client_name"]``, set by the
    wiring for watch mode and the doctor), for the Redis clients opened beside them: a MONITOR log tells them apart."""
    name = (app.conf.broker_transport_options or {}).get("client_name")
    return str(name) if name else None


def suppress() -> contextlib.suppress:
    return contextlib.suppress(Exception)


def login_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (kombu's, or one it wraps) is the broker refusing the user's login: a wrong password, an
    unknown or disabled user (Redis ``WRONGPASS``, RabbitMQ ``ACCESS_REFUSED``)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, redis.AuthenticationError) or type(seen).__name__ == "AccessRefused":
            return True
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    return any(word in text for word in ("WRONGPASS", "invalid username-password", "ACCESS_REFUSED"))


def reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
