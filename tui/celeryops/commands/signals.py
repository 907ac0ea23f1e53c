"""Signal handlers installed for a while and the previous ones put back after: in the running event loop (a run
interrupted so that it applies its recovery rules) or process-wide (the demo's sandbox torn down)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


@contextlib.contextmanager
def loop_signals(signals: tuple[signal.Signals, ...], on_signal: Callable[[signal.Signals], None]) -> Iterator[None]:
    """``on_signal(sig)`` runs in the running loop on any of ``signals`` meanwhile; their previous handlers (the
    caller's own: the demo's tears the sandbox down) are back after."""
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            if handler is not None:
                signal.signal(sig, handler)


@contextlib.contextmanager
def process_signals(signals: tuple[signal.Signals, ...], handler: Handler) -> Iterator[None]:
    """``handler`` (a function, or ``signal.SIG_IGN``) for ``signals`` meanwhile, the previous handlers back after."""
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
