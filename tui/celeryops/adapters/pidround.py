"""Several remote-control commands in one round on a Redis broker: published at once, every reply collected from
one Redis list (no Textual; blocking, callers run it in a thread).

Why (bench/bench_observe.py, bench/README.md): a worker serves control commands one at a time, and most of what a
command costs it is the reply. kombu's standard round (``app.control.broadcast``) asks the worker to reply through
the ``reply.<exchange>.pidbox`` direct exchange: for every reply the worker reads that exchange's binding set
(SMEMBERS, on a Redis client it builds for the purpose), routes, then LPUSHes. Here the request names the default
exchange ("") and our reply list as the routing key, which kombu's virtual transport delivers with the LPUSH alone
(``Channel.basic_publish``: "anon exchange: routing_key is the destination queue"): the same reply, about a third
less work per command on every worker, standard Celery workers included. On our side the replies are taken from
the list in bulk (one BRPOP to wait, then LRANGE + DEL in one MULTI for everything that arrived), instead of one
BRPOP and one kombu message per reply, and told apart by their ticket header, as kombu does.

The request message is the one ``kombu.pidbox.Mailbox._publish`` builds (method, arguments, destination, ticket,
reply_to, clock and expires headers), published with kombu on the mailbox's fanout exchange
(``<control_exchange>.pidbox``, declared as ``Mailbox`` declares it), so a worker sees no difference but the reply
route. ``kombu.pidbox`` itself is not imported: loading it scans every installed package's entry points
(``kombu.matcher``, ~30 ms), the largest part of a command's first round. Replies are decoded with kombu's
serialization registry and the app's ``accept_content``.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery

from celeryops.adapters.brokerlink import client_name


@dataclass(frozen=True)
class Request:
    """One command of a round: ``destination`` None means every worker (the round then waits its whole timeout,
    as a broadcast cannot know how many workers exist)."""

    command: str
    destination: tuple[str, ...] | None
    arguments: tuple[tuple[str, Any], ...] = ()


class RedisRound:
    """Rounds of remote-control commands on one held broker connection, replies collected from one Redis list.

    One instance per Fleet; rounds are serialized by a lock (the held connection is not thread-safe)."""

    def __init__(self, app: Celery, broker_url: str, *, keyprefix: str = "") -> None:
        self.app = app
        self.broker_url = broker_url
        self.keyprefix = keyprefix
        # The reply list: the worker LPUSHes to it (through its own key prefix, if the transport has one).
        self.reply_key = f"celeryops.{uuid.uuid4().hex}.reply"
        self._lock = threading.Lock()
        self._conn: Any = None
        self._producer: Any = None
        # What celery's Control gives its Mailbox: the fanout exchange, one Lamport clock for the process's rounds
        # (carried in the "clock" header, adjusted by the replies'), the app's task_serializer (kombu's rounds use it).
        from kombu.clocks import LamportClock
        from kombu.entity import Exchange

        exchange: Any = Exchange  # kombu is untyped
        self._exchange = exchange(f"{app.conf.control_exchange}.pidbox", type="fanout", durable=False,
                                  delivery_mode="transient")
        self._clock = LamportClock()
        self._serializer = str(app.conf.task_serializer or "json")
        self._client: redis.Redis | None = None
        self._client_timeout = 0.0
        self._late = False  # a round ended before every addressed worker replied: late replies may land in the list
        self._accept = _kombu_serialization().prepare_accept_content(list(app.conf.accept_content or ["json"]))
        self._json_ok = "application/json" in self._accept

    # -- connection ---------------------------------------------------------------------------------------------

    def _ensure(self, timeout: float) -> tuple[Any, redis.Redis]:
        if self._conn is None:
            from kombu import messaging

            producer_cls: Any = messaging.Producer  # kombu is untyped
            conn = self.app.connection_for_write()
            conn.ensure_connection(max_retries=1)
            self._conn = conn
            self._producer = producer_cls(conn.default_channel, auto_declare=False)
        if self._client is None or self._client_timeout < timeout + 5:
            if self._client is not None:
                self._client.close()
            self._client_timeout = max(10.0, timeout + 5)
            self._client = redis.Redis.from_url(self.broker_url, socket_connect_timeout=3,
                                                socket_timeout=self._client_timeout, client_name=client_name(self.app))
        return self._producer, self._client

    def close(self) -> None:
        """Delete the reply list (if a round gave up on a worker) and release the connections. Waits up to 2 s for
        a round in progress (closing under it makes that round fail; its caller, shutting down, no longer reads)."""
        locked = self._lock.acquire(timeout=2.0)
        try:
            if self._client is not None:
                if self._late:  # (else every reply was taken: nothing to delete, no round trip at exit)
                    try:
                        self._client.delete(self.keyprefix + self.reply_key)
                    except redis.RedisError:
                        pass
                self._client.close()
                self._client = None
            if self._conn is not None:
                try:
                    self._conn.release()
                except Exception:  # a connection that already broke: nothing left to release
                    pass
                self._conn = self._producer = None
        finally:
            if locked:
                self._lock.release()

    def _reset(self) -> None:
        """After an error: drop the held connection (the next round opens a fresh one)."""
        conn, self._conn, self._producer = self._conn, None, None
        if conn is not None:
            try:
                conn.release()
            except Exception:
                pass
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- one round ----------------------------------------------------------------------------------------------

    def round(self, requests: Sequence[Request], timeout: float) -> list[dict[str, Any]]:
        """Publish every request, then collect until each addressed worker answered each request, or no reply came
        for ``timeout`` seconds (kombu's window: a large fleet's replies may take longer in all, as long as they keep
        coming). Returns, per request in order, worker -> reply. Raises what kombu / redis-py raise (the caller
        words it)."""
        with self._lock:
            try:
                return self._round(requests, timeout)
            except BaseException:
                self._reset()
                raise

    def _round(self, requests: Sequence[Request], timeout: float) -> list[dict[str, Any]]:
        producer, client = self._ensure(timeout)
        tickets = [uuid.uuid4().hex for _ in requests]
        by_ticket: dict[str, dict[str, Any]] = {t: {} for t in tickets}
        waiting: dict[str, set[str] | None] = {
            t: (set(r.destination) if r.destination is not None else None) for t, r in zip(tickets, requests,
                                                                                           strict=True)}
        expires = time.time() + timeout
        for ticket, req in zip(tickets, requests, strict=True):
            message = {"method": req.command, "arguments": dict(req.arguments),
                       "destination": list(req.destination) if req.destination is not None else None,
                       "pattern": None, "matcher": None, "ticket": ticket,
                       "reply_to": {"exchange": "", "routing_key": self.reply_key}}
            producer.publish(message, exchange=self._exchange.name, declare=[self._exchange],
                             headers={"clock": self._clock.forward(), "expires": expires},
                             serializer=self._serializer, retry=True)
        key = self.keyprefix + self.reply_key
        deadline = time.monotonic() + timeout
        while not _complete(waiting):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            first = client.brpop([key], timeout=max(0.001, remaining))
            if first is None:
                break
            pipe = client.pipeline(transaction=True)
            pipe.lrange(key, 0, -1)
            pipe.delete(key)
            rest, _ = pipe.execute()
            taken = [self._take(raw, by_ticket, waiting) for raw in (first[1], *reversed(rest))]  # oldest first
            if any(taken):
                deadline = time.monotonic() + timeout  # kombu's window: the wait for the NEXT reply
        if not _complete(waiting):
            self._late = True
        return [by_ticket[t] for t in tickets]

    def _take(self, raw: bytes, by_ticket: dict[str, dict[str, Any]],
              waiting: dict[str, set[str] | None]) -> bool:
        """Count one reply in; False when it is not one of this round's (a late reply of an earlier round)."""
        try:
            envelope = json.loads(raw)
            headers = envelope.get("headers") or {}
            ticket = headers.get("ticket")
            if ticket not in by_ticket:
                return False
            if headers.get("clock"):
                self._clock.adjust(headers["clock"])
            props = envelope.get("properties") or {}
            body = envelope.get("body")
            if props.get("body_encoding") == "base64":
                body = base64.b64decode(body)
            reply = self._loads(body, envelope.get("content-type"), envelope.get("content-encoding") or "utf-8")
        except Exception:  # not a reply envelope we can read: ignored, the worker then counts as not replied
            return False
        if not isinstance(reply, dict):
            return False
        by_ticket[ticket].update(reply)
        pending = waiting.get(ticket)
        if pending is not None:
            pending.difference_update(reply)
        return True

    def _loads(self, body: Any, content_type: str | None, encoding: str) -> Any:
        """kombu's ``loads``; JSON without kombu's typed values (``{"__type__": ..., "__value__": ...}``, the only
        objects its hook changes) is read by the json module alone: the same result, without a Python call per
        object (a 5,000-worker round has 85,000 objects)."""
        if (content_type == "application/json" and self._json_ok and isinstance(body, bytes)
                and b'"__type__"' not in body):
            return json.loads(body)
        return _kombu_serialization().loads(body, content_type, encoding, accept=self._accept)


def _kombu_serialization() -> Any:
    """kombu.serialization, untyped (its functions carry no annotations)."""
    from kombu import serialization

    return serialization


def _complete(waiting: dict[str, set[str] | None]) -> bool:
    return all(p is not None and not p for p in waiting.values())
