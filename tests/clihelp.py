"""Run the real ``celeryops`` CLI as a subprocess and read its ``--json`` lines as they come."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "celeryops"]


def cli_env(state_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERYOPS_") and k != "CELERY_BROKER_URL"}
    env.update({"CELERYOPS_STATE_DIR": str(state_dir), "PYTHONUNBUFFERED": "1"}, **extra)
    return env


def run_cli(args: list[str], env: dict[str, str], timeout: float = 120,
            cwd: Path | None = None, kill_after: str | None = None) -> subprocess.CompletedProcess[str]:
    """``kill_after``: SIGKILL the process right after the journal record of that kind is durable (the harness's
    ``celeryops_harness.killcli`` wrapper)."""
    cmd = [sys.executable, "-m", "celeryops_harness.killcli", kill_after] if kill_after else CLI
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=cwd)


class CliProcess:
    """A ``celeryops ... --json`` process whose stdout lines are parsed as they arrive (with arrival time)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen([*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, stdin=subprocess.DEVNULL, cwd=cwd)
        self.events: list[dict[str, Any]] = []
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.stderr = ""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = {"event": "text", "line": line}
            event["_at"] = time.time()
            self._q.put(event)
        self._q.put(None)

    def next_event(self, timeout: float = 60) -> dict[str, Any] | None:
        event = self._q.get(timeout=timeout)
        if event is not None:
            self.events.append(event)
        return event

    def wait_event(self, kind: str, timeout: float = 60, where: Any = None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                last = [{k: v for k, v in e.items() if k != "_at"} for e in self.events[-2:]]
                raise TimeoutError(f"no {kind!r} event within {timeout}s; got {[e['event'] for e in self.events]}; "
                                   f"the last: {str(last)[:1500]}")
            try:
                event = self.next_event(remaining)
            except queue.Empty:
                continue
            if event is None:
                raise AssertionError(f"process ended (rc={self.proc.wait()}) before a {kind!r} event; "
                                     f"events {[e['event'] for e in self.events]}; stderr: {self.read_stderr()}")
            if event["event"] == kind and (where is None or where(event)):
                return event

    def finish(self, timeout: float = 120) -> int:
        rc = self.proc.wait(timeout=timeout)
        while True:
            try:
                event = self.next_event(5)
            except queue.Empty:
                break
            if event is None:
                break
        return rc

    def read_stderr(self) -> str:
        if self.proc.poll() is not None and self.proc.stderr is not None and not self.stderr:
            self.stderr = self.proc.stderr.read()
        return self.stderr

    def signal(self, sig: int = signal.SIGINT) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
