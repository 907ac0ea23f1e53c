"""Helpers for the end-to-end recovery tests: one fleet of real workers shared by a module, the CLI's JSON answers,
and a full dump of a Redis server (to grep it for secrets)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery

from celeryops.demo.standins.redis_server import RedisServer
from celeryops.ops.journal import Journal, Run, journal_path
from celeryops_harness.workers import WorkerProcess, wait_for
from clihelp import run_cli

Consumers = dict[str, set[str]]


@dataclass
class SharedFleet:
    """Real workers on a private redis-server, started once per module. ``baseline``: what each worker consumes
    when no run has stopped anything; ``reset()`` puts that back between tests (so one failure does not cascade)."""

    server: RedisServer
    app: Celery
    baseline: Consumers
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def names(self) -> list[str]:
        return sorted(self.baseline)

    @property
    def queues(self) -> list[str]:
        return sorted({q for qs in self.baseline.values() for q in qs})

    def consuming(self) -> Consumers:
        """active_queues of every worker; fails unless every one of them replied."""
        return active_queues(self.app, self.names)

    def all_stopped(self) -> Consumers:
        return {w: set() for w in self.names}

    def reset(self) -> None:
        now = self.consuming()
        for worker, queues in self.baseline.items():
            for queue in sorted(queues - now[worker]):
                self.app.control.add_consumer(queue, destination=[worker], reply=True, timeout=3)
            for queue in sorted(now[worker] - queues):
                self.app.control.cancel_consumer(queue, destination=[worker], reply=True, timeout=3)
        wait_for(lambda: self.consuming() == self.baseline, 30, "the shared fleet to consume its baseline again")


def active_queues(app: Celery, workers: Iterable[str]) -> Consumers:
    names = sorted(workers)
    replies = app.control.inspect(destination=names, timeout=5, limit=len(names)).active_queues() or {}
    missing = set(names) - set(replies)
    assert not missing, f"no active_queues reply from {sorted(missing)}"
    return {w: {q["name"] for q in (replies[w] or [])} for w in names}


def run_together(*calls: tuple[list[str], dict[str, str]]) -> list[subprocess.CompletedProcess[str]]:
    """Run several CLI commands at the same time (they only read, or are all refused): less wall time."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda call: run_cli(*call), calls))


def journal_runs(state_dir: str) -> dict[str, Run]:
    """Every run of a state dir's journal, read in-process without writing ({} when there is no journal)."""
    if not journal_path(state_dir).exists():
        return {}
    with Journal(state_dir=state_dir, read_only=True) as journal:
        return {r.id: journal.get(r.id) for r in journal.history(limit=100)}


def cli_json(args: list[str], env: dict[str, str]) -> Any:
    """Run a read-only ``--json`` command; it must succeed and print one JSON document."""
    result = run_cli([*args, "--json"], env)
    assert result.returncode == 0, f"{args} exited {result.returncode}: {result.stderr}"
    return json.loads(result.stdout)


def parse_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, f"{result.args} exited {result.returncode}: {result.stderr}"
    return json.loads(result.stdout)


def only_run(env: dict[str, str]) -> Run:
    """The single run of a fresh state dir (in-process read of the journal)."""
    runs = list(journal_runs(env["CELERYOPS_STATE_DIR"]).values())
    assert len(runs) == 1, runs
    return runs[0]


def one_sentence_error(result: subprocess.CompletedProcess[str]) -> str:
    """A user error: non-zero exit, no traceback, exactly one ``celeryops: ...`` line on stderr."""
    assert result.returncode not in (0, None), result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("celeryops: "), result.stderr
    return lines[0]


def dump_redis(client: redis.Redis) -> str:
    """Every key and value of every type in the server's database, as text (for grepping)."""
    out: list[str] = []
    for key in client.scan_iter(count=500):
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        value: object
        if kind == "string":
            value = client.get(key)
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "set":
            value = client.smembers(key)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = client.xrange(key)
        else:
            value = f"<{kind}>"
        out.append(f"{key!r} {kind} {value!r}")
    return "\n".join(out)
