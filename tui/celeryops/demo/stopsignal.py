"""Blocking until SIGTERM or SIGINT, for the demo's helper processes (the Redis fallback, the Cloud Run stand-in)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType


def until_signalled() -> Callable[[], None]:
    """Install SIGTERM/SIGINT handlers now; the returned call blocks until one arrives.

    It polls a flag instead of waiting on a ``threading.Event``: Python runs signal handlers in the main thread
    only, when it executes bytecode, and the kernel may deliver the signal to another thread (gRPC's, the server's);
    a main thread blocked on a lock is then never woken to run the handler (CI once saw the Cloud Run stand-in
    ignore SIGTERM for 30 s that way)."""
    stopped = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def wait() -> None:
        while not stopped:
            time.sleep(0.1)

    return wait
