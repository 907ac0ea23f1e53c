"""Redis MONITOR in tests: record every command the server sees, and tell which connection (by the name its client
gave with CLIENT SETNAME) sent each: watch mode and ``celeryops doctor`` are checked read-only on the wire."""

from __future__ import annotations

import threading
from typing import Any

import redis

READS = {"hgetall", "hget", "hmget", "xrange", "xrevrange", "llen", "pttl", "ttl", "time", "get", "mget", "exists",
         "type", "smembers", "scard", "ping", "info", "select", "client", "hello", "multi", "exec", "zrange",
         "zrevrange", "lrange", "evalsha_ro", "eval_ro", "scan",
         "hlen",  # the watcher's permission probe: may this user read the published status (ops/access/probe.py)
         "psubscribe", "punsubscribe"}  # task events, read from the broker's events channel (the live findings)


class Monitor:
    """Records every command the server sees, in a thread, until ``stop()``."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.records: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Monitor:
        self._thread.start()
        return self

    def _run(self) -> None:
        with self.client.monitor() as mon:
            while not self._stop.is_set():
                self.records.append(mon.next_command())  # the live drain keeps traffic going

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.client.close()


def addr(record: dict[str, Any]) -> str:
    return f"{record.get('client_address')}:{record.get('client_port')}"


def owned_by(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Commands sent by connections named ``name``. redis-py opens every connection with CLIENT SETNAME (when
    named) then CLIENT SETINFO LIB-NAME, so a SETINFO not right after a SETNAME starts an unnamed connection: a
    port reused by another process after the watcher closed its connection is not blamed on the watcher."""
    owner: dict[str, str | None] = {}
    named_just_now: set[str] = set()
    out = []
    for r in records:
        where, command = addr(r), str(r.get("command", ""))
        words = command.lower().split()
        if words[:2] == ["client", "setname"]:
            owner[where] = command.split()[2] if len(command.split()) > 2 else ""
            named_just_now.add(where)
        elif words[:3] == ["client", "setinfo", "lib-name"]:
            if where in named_just_now:
                named_just_now.discard(where)
            else:
                owner[where] = None
        if owner.get(where) == name:
            out.append(r)
    return out
