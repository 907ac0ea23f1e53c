"""A private ``redis-server`` on a free loopback port, started from the binary and stopped at the end."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

# Loopback ports for servers started here: below Linux's ephemeral range (32768-60999), from which every outgoing
# connection and every bind to port 0 take theirs. A server stopped and started again on its port (clients keep the
# URL) would otherwise find it taken by someone's connection, or by another server that asked for "any free port".
PRIVATE_PORTS = range(20000, 32000)


def free_port(ports: range = PRIVATE_PORTS) -> int:
    """A loopback port in ``ports`` that nothing listens on now (picked at random, so that processes picking at
    the same time rarely meet)."""
    for _ in range(500):
        port = random.choice(ports)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free loopback port between {ports.start} and {ports.stop - 1}")


class RedisServerError(RuntimeError):
    pass


class PortTaken(RedisServerError):
    """The port the server was to listen on is another process's."""


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
        self._port_given = port is not None
        self._started_once = False
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
    def data_dir(self) -> Path:
        """Where the server keeps its files (its log; its RDB and append-only files when persistence is on)."""
        return self._dir

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and return once it answers PING (its own process: the answer names its pid). A port
        this server picked itself and found taken before its first start is swapped for another free one; a port
        given, or one clients already know (a restart), is kept, and a taken one is an error."""
        for _ in range(5):
            try:
                self._start_once(timeout)
            except PortTaken:
                if self._port_given or self._started_once:
                    raise
                self.port = free_port()
                continue
            self._started_once = True
            return self
        raise RedisServerError(f"redis-server found no free port to listen on (the last tried: {self.port})")

    def _start_once(self, timeout: float) -> None:
        args = [
            # An RDB save point, as a production broker has (the broker_safety preflight check passes): a snapshot
            # is written only on FLUSHALL or after an hour with a change; a SIGKILL (``stop``) still loses the data.
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "3600 1", "--appendonly", "no",
            "--dir", str(self._dir), "--daemonize", "no", "--loglevel", "warning",
            "--logfile", str(self._dir / "redis.log"),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        log = self._dir / "redis.log"
        log.unlink(missing_ok=True)
        proc = self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2, socket_timeout=0.5)
        try:
            while True:
                if proc.poll() is not None:
                    self._proc = None
                    tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
                    if "Address already in use" in tail:
                        raise PortTaken(f"port {self.port} on 127.0.0.1 is taken by another process")
                    raise RedisServerError(f"redis-server exited with {proc.returncode}: {tail}")
                try:
                    pid = int(client.info("server")["process_id"])
                except redis.RedisError:
                    pid = None
                if pid is not None and pid != proc.pid:  # another server on our port answered
                    self.stop()
                    raise PortTaken(f"port {self.port} on 127.0.0.1 is taken by another redis-server (pid {pid})")
                if pid == proc.pid:
                    return
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
