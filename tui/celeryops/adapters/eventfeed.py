"""Celery task and worker events as plain dicts, in a thread, for the doctor's live findings (no Textual).

- :class:`EventFeed`: Celery's event receiver on the broker (:class:`EventReceiverThread`; any broker). It declares
  a queue of its own, bound to the events exchange: the operator's console uses it.
- :class:`PubSubFeed`: on a Redis broker, the events read straight from the channel Celery publishes them on
  (``PSUBSCRIBE <prefix>/<db>.celeryev/*``, the pattern kombu's own receiver subscribes to): no queue declared, no
  binding, no key written, which watch mode needs (the watcher role may subscribe to the events channel).

Both call ``on_event(event)`` for the event types in :data:`TYPES`, from their thread.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis
from celery import Celery

from celeryops.adapters.brokerlink import client_name
from celeryops.adapters.eventreceiver import RECONNECT_FIRST, RECONNECT_MAX, EventReceiverThread, Handlers

TYPES = ("task-received", "task-started", "task-succeeded", "task-failed", "task-revoked", "task-rejected",
         "task-retried", "worker-offline")
OnEvent = Callable[[dict[str, Any]], None]


class EventFeed(EventReceiverThread):
    def __init__(self, app: Celery, on_event: OnEvent) -> None:
        super().__init__(app, "celeryops-events")
        self.on_event = on_event
        self._unused = threading.Thread()  # stop_receiving joins a helper thread; this feed has none

    def handlers(self) -> Handlers:
        return {kind: self.on_event for kind in TYPES}

    def start(self) -> EventFeed:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_receiving(self._unused, 3)


def decode_message(data: bytes | str) -> list[dict[str, Any]]:
    """The events in one kombu message as published on a Redis fanout channel (JSON envelope, base64 body)."""
    try:
        envelope = json.loads(data)
        body = envelope.get("body")
        if (envelope.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        payload = json.loads(body)
    except (ValueError, TypeError, AttributeError):
        return []
    events = payload if isinstance(payload, list) else [payload]
    return [e for e in events if isinstance(e, dict)]


class PubSubFeed:
    """Task events from a Redis broker's events channel, read-only (see the module)."""

    def __init__(self, app: Celery, broker_url: str, on_event: OnEvent) -> None:
        self.app = app
        self.broker_url = broker_url
        self.on_event = on_event
        self.stopping = threading.Event()
        self.ready = threading.Event()  # set once it listens
        self.thread = threading.Thread(target=self._run, name="celeryops-event-tap", daemon=True)

    def pattern(self) -> str:
        options = self.app.conf.broker_transport_options or {}
        prefix = str(options.get("global_keyprefix", ""))
        db = (urlsplit(self.broker_url).path or "/0").strip("/") or "0"
        return f"{prefix}/{db}.{self.app.conf.event_exchange}/*"

    def start(self) -> PubSubFeed:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(3)

    def _run(self) -> None:
        """Listen until stopped; reconnect with a growing pause when Redis goes away. Nothing leaves this thread."""
        pause = RECONNECT_FIRST
        while not self.stopping.is_set():
            client = redis.Redis.from_url(self.broker_url, socket_connect_timeout=3, client_name=client_name(self.app))
            try:
                pubsub: Any = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
                pubsub.psubscribe(self.pattern())
                self.ready.set()
                pause = RECONNECT_FIRST
                while not self.stopping.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message and message.get("type") == "pmessage":
                        for event in decode_message(message["data"]):
                            if event.get("type") in TYPES:
                                self.on_event(event)
            except Exception:  # Redis went away, or a handler failed: listen again
                if self.stopping.wait(pause):
                    return
                pause = min(pause * 2, RECONNECT_MAX)
            finally:
                with contextlib.suppress(Exception):
                    client.close()
