"""The sandbox's Redis: a private ``redis-server`` when the binary is on PATH, else the fakeredis TCP fallback.

Both run as child processes in their own process group on a free loopback port; :attr:`DemoRedis.notice` says which
one runs when it is the fallback (the console shows it in its header).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.demo.standins.redis_server import RedisServer, free_port

FALLBACK_NOTICE = ("redis-server is not installed: the demo runs on the embedded fakeredis server (pure Python, "
                   "slower); install redis-server for a real broker.")


class FakeRedisProcess:
    """``python -m celeryops.demo.fakeserver`` on a free port; ``start()`` returns once it answers PING."""

    def __init__(self, port: int | None = None, log_dir: Path | None = None) -> None:
        self.port = port or free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = Path(log_dir or tempfile.gettempdir()) / f"celeryops-demo-fakeredis-{self.port}.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 30.0) -> FakeRedisProcess:
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen([sys.executable, "-m", "celeryops.demo.fakeserver", "--port", str(self.port)],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=2)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self._proc.poll() is not None:
                    tail = self._log.read_text(errors="replace")[-500:]
                    raise UserError(f"The embedded fakeredis server exited with {self._proc.returncode} ({tail.strip()}"
                                    "): the demo was not started; install redis-server or reinstall celeryops[demo].",
                                    EXIT_USAGE)
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return self
                if time.monotonic() > deadline:
                    self.stop()
                    raise UserError(f"The embedded fakeredis server did not answer within {timeout:g}s: the demo was "
                                    "not started; try again, or install redis-server.", EXIT_USAGE)
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        with contextlib.suppress(OSError):
            self._log.unlink()


class DemoRedis:
    """The sandbox Redis. ``fallback`` is True when it is fakeredis; ``notice`` then explains it (else "")."""

    def __init__(self, log_dir: Path | None = None) -> None:
        self.log_dir = log_dir
        self.binary = shutil.which("redis-server")
        self.fallback = self.binary is None
        self._server: RedisServer | None = None
        self._fake: FakeRedisProcess | None = None

    @property
    def notice(self) -> str:
        return FALLBACK_NOTICE if self.fallback else ""

    @property
    def kind(self) -> str:
        return "fakeredis" if self.fallback else "redis-server"

    def start(self) -> DemoRedis:
        if self.binary is not None:
            self._server = RedisServer(binary=self.binary).start()
            return self
        if importlib.util.find_spec("fakeredis") is None or importlib.util.find_spec("lupa") is None:
            raise UserError("redis-server is not on PATH and the embedded fallback (fakeredis with Lua) is not "
                            "installed: the demo was not started; install redis-server, or "
                            "pip install 'celeryops[demo]'.", EXIT_USAGE)
        self._fake = FakeRedisProcess(log_dir=self.log_dir).start()
        return self

    @property
    def url(self) -> str:
        if self._server is not None:
            return self._server.url
        if self._fake is not None:
            return self._fake.url
        raise RuntimeError("the demo Redis is not started")

    @property
    def pid(self) -> int | None:
        if self._server is not None and self._server._proc is not None:
            return self._server._proc.pid
        return self._fake.pid if self._fake is not None else None

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._fake is not None:
            self._fake.stop()
            self._fake = None
