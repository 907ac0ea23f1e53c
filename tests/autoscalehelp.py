"""A worker pool on the Cloud Run stand-in, whose instances are real fence-plugin Celery workers, with an
``[autoscale]`` table: what ``celeryops autoscale`` runs against in the tests (issue 36)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from celeryops_harness.workers import wait_for
from clihelp import CliProcess, run_cli
from overlaphelp import WAIT, Pool, close_pool, make_pool, toml_table

#: Fast looks for the tests (the machine is shared: deadlines stay generous, the loop's pace does not matter).
FAST = {"interval": 0.5, "idle_after": 2, "drain_timeout": 30}


@contextlib.contextmanager
def scaled_pool(tmp_path: Path, redis_url: str, queue: str, *, count: int = 1, streak: int | None = None,
                poll: float = 0.3, **autoscale: Any) -> Iterator[Pool]:
    """A worker pool of ``count`` instances with ``[autoscale]`` ``autoscale`` (over :data:`FAST`); the drain's
    ``streak`` and ``poll`` interval (a cohort's drain lasts about their product). Stopped (stand-ins and every
    worker) when the block ends."""
    pool = make_pool(tmp_path, redis_url, queue, count=count, interval=poll)
    try:
        config = tmp_path / "celeryops.toml"
        text = config.read_text() + toml_table("autoscale", {**FAST, "queues": [queue], **autoscale})
        if streak is not None:
            text = text.replace("streak = 2\n", f"streak = {streak}\n")
        config.write_text(text)
        yield pool
    finally:
        close_pool(pool)


def start(pool: Pool, *more: str) -> CliProcess:
    return CliProcess(["autoscale", "--json", *more], pool.env, cwd=pool.dir)


def running(pool: Pool) -> dict[str, int]:
    """Running instances by revision, revisions without any left out."""
    return {rev: n for rev, n in pool.instances().items() if n}


def wait_instances(pool: Pool, wanted: Any, what: str, timeout: float = WAIT) -> None:
    """Until the running instances satisfy ``wanted`` (a predicate over :func:`running`)."""
    wait_for(lambda: wanted(running(pool)), timeout, what, step=0.2)


def steps_of(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["step"], e["revision"]) for e in events if e["event"] == "autoscale_step"]


def status_json(pool: Pool) -> dict[str, Any]:
    import json

    result = run_cli(["status", "--json"], pool.env, cwd=pool.dir)
    assert result.returncode in (0, 1), result.stderr
    return dict(json.loads(result.stdout))


def fence_of(pool: Pool) -> Any:
    return pool.fence()


def redis_of(pool: Pool) -> redis.Redis:
    return redis.Redis.from_url(pool.redis_url, decode_responses=True)
