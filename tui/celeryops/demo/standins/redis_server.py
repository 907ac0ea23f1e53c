"""A private ``redis-server`` on a free loopback port, started from the binary and stopped at the end."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServerError(RuntimeError):
    pass


class RedisServer:
    """A throwaway redis-server. ``start()`` waits until it answers PING; ``stop()`` kills it.

    The same port is kept across ``stop()``/``start()`` so that clients can reconnect after a restart.
    """

    def __init__(self, port: int | None = None, binary: str | None = None, password: str | None = None) -> None:
        found = binary or shutil.which("redis-server")
        if not found:
            raise RedisServerError("redis-server is not on PATH: install it (apt-get install redis-server).")
        self.binary = found
        self.port = port or free_port()
        self.password = password
        self._dir = Path(tempfile.mkdtemp(prefix="celeryops-redis-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def db_url(self, db: int) -> str:
        return self.url.rsplit("/", 1)[0] + f"/{db}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self._dir), "--daemonize", "no", "--loglevel", "warning",
            "--logfile", str(self._dir / "redis.log"),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2, socket_timeout=0.5)
        try:
            while True:
                if self._proc.poll() is not None:
                    log = (self._dir / "redis.log").read_text(errors="replace")[-500:]
                    raise RedisServerError(f"redis-server exited with {self._proc.returncode}: {log}")
                try:
                    if client.ping():
                        return self
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RedisServerError(f"redis-server on port {self.port} did not answer within {timeout}s")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.kill()
        proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
