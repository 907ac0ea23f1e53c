"""Celery task events received on the broker in a thread: what the drain's early re-poll
(:mod:`celeryops.adapters.taskevents`) and the canary's outcome collector (:mod:`celeryops.adapters.canaryevents`)
share."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from celery import Celery

RECONNECT_FIRST, RECONNECT_MAX = 0.5, 5.0  # seconds between the event receiver's reconnection attempts

Handlers = dict[str, Callable[[dict[str, Any]], None]]


class EventReceiverThread:
    """An event receiver on ``app``'s broker in ``thread`` (named ``name``), with the ``handlers()`` of its subclass:
    ``ready`` once it consumes; ``stopping`` ends it; ``reconnects`` counts the connections lost or refused."""

    def __init__(self, app: Celery, name: str) -> None:
        self.app = app
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self.receiver: Any = None
        self.reconnects = 0
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def handlers(self) -> Handlers:
        """Event type -> what to do with each event of that type (called in the receiving thread)."""
        raise NotImplementedError

    def stop_receiving(self, helper: threading.Thread, timeout: float) -> None:
        """Stop the receiver and wait (at most ``timeout`` s each) for its thread and for ``helper`` (the thread
        that runs beside it, if started)."""
        self.stopping.set()
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.thread.join(timeout)
        if helper.is_alive():
            helper.join(timeout)

    def _run(self) -> None:
        """Receive until stopped; when the broker goes away (a restart, the network), reconnect with a growing
        pause. Nothing may leave this thread (an uncaught error would print a traceback on the operator's
        terminal)."""
        pause = RECONNECT_FIRST
        handlers = self.handlers()
        while not self.stopping.is_set():
            try:
                with self.app.connection_for_read() as conn:
                    receiver = self.app.events.Receiver(conn, handlers=handlers)
                    receiver.on_consume_ready = lambda *a, **kw: self.ready.set()
                    self.receiver = receiver
                    if self.stopping.is_set():  # stop() ran before the receiver existed: it could not reach it
                        return
                    receiver.capture(limit=None, timeout=None, wakeup=False)
                    return  # stop() set should_stop
            except Exception:
                self.reconnects += 1
                if self.stopping.wait(pause):
                    return
                pause = min(pause * 2, RECONNECT_MAX)
