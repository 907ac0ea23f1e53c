"""The sandbox's last line of defence against orphans: a tiny watcher process that outlives a crashed demo.

The demo starts every part (workers, redis-server, the fakeredis fallback) in its own process group and tells the
reaper each group over a pipe. A clean exit stops the parts itself and then writes ``done``; if the pipe closes
without ``done`` (the demo was SIGKILLed or crashed past its own cleanup), the reaper kills every group it was told
about. It ignores SIGINT and SIGHUP (Ctrl-C and a closed terminal are the demo's to handle).

    python -m celeryops.demo.reaper      # reads "group <pgid>" / "done" lines on stdin
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from typing import IO


def _kill_groups(groups: set[int]) -> None:
    for pgid in sorted(groups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def watch(lines: IO[str]) -> None:
    """Read registrations until ``done`` (exit quietly) or end of input (kill every registered group)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    groups: set[int] = set()
    for raw in lines:
        word, _, arg = raw.strip().partition(" ")
        if word == "done":
            return
        if word == "group" and arg.isdigit():
            groups.add(int(arg))
        elif word == "forget" and arg.isdigit():
            groups.discard(int(arg))
    _kill_groups(groups)


class Reaper:
    """The demo's handle on the reaper process. ``track(pgid)`` after starting a part; ``close()`` at a clean exit."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def start(self) -> Reaper:
        self._proc = subprocess.Popen([sys.executable, "-m", "celeryops.demo.reaper"], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                      start_new_session=True)
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _send(self, line: str) -> None:
        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None or proc.poll() is not None:
                return
            with contextlib.suppress(BrokenPipeError, ValueError):
                proc.stdin.write(line + "\n")
                proc.stdin.flush()

    def track(self, pgid: int) -> None:
        self._send(f"group {pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"forget {pgid}")

    def close(self, timeout: float = 10.0) -> None:
        """Every part was stopped: tell the reaper to leave quietly, and wait for it."""
        self._send("done")
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(BrokenPipeError, ValueError, OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


if __name__ == "__main__":
    watch(sys.stdin)
