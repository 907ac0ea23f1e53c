"""Issue 36, bad input to ``celeryops autoscale``: min above max, a queue nobody consumes, a missing
``run.workerpools.update``, a service or command target, a pool Cloud Run scales itself, an unknown target. Each is
one sentence on stderr with exit 2, and nothing changes: no run in the journal, no key of the fleet written, the pool
as it was, its workers consuming."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis
from celery import Celery
from google.cloud.run_v2 import WorkerPoolScaling

from autoscalehelp import running, scaled_pool
from celeryops.demo.standins.cloudrun import ALL_PERMISSIONS
from celeryops_harness.workers import WorkerProcess
from clihelp import run_cli
from overlaphelp import Pool, wait_consuming

pytestmark = pytest.mark.slow


def refused(pool: Pool, *args: str) -> str:
    """Run ``celeryops autoscale ARGS`` and return its one sentence (exit 2, no traceback, nothing on stdout but a
    final ``--json`` error event)."""
    result = run_cli(["autoscale", *args], pool.env, cwd=pool.dir, timeout=90)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith("celeryops: ") and "Traceback" not in result.stderr, lines
    assert lines[0].endswith(".") and re.search(r"nothing was (changed|run)", lines[0], re.I), lines[0]
    return lines[0]


OTHER_TARGETS = """
[[targets]]
name = "svc"
kind = "cloudrun-service"
project = "proj"
region = "europe-west1"
resource = "svc"
image = "registry.example/proj/svc:{sha}"

[[targets]]
name = "cmd"
kind = "command"
command = "true"
"""


def fleet_keys(client: redis.Redis) -> list[str]:
    return sorted(k for k in client.keys("celeryops:*") if not re.search(r":fence:workers$", k))


def edit(pool: Pool, old: str, new: str) -> str:
    config = pool.dir / "celeryops.toml"
    before = config.read_text()
    assert old in before, old
    config.write_text(before.replace(old, new, 1))
    return before


def test_bad_input_is_one_sentence_and_changes_nothing(tmp_path: Path, redis_url: str, queue_name: str,
                                                       redis_client: redis.Redis, redis_control: Celery) -> None:
    with scaled_pool(tmp_path, redis_url, queue_name, min_instances=1, max_instances=3) as pool:
        keys = fleet_keys(redis_client)
        config = (pool.dir / "celeryops.toml").read_text()
        sentences: dict[str, str] = {}

        edit(pool, "min_instances = 1", "min_instances = 5")
        sentences["min>max"] = refused(pool)
        (pool.dir / "celeryops.toml").write_text(config)

        edit(pool, f'queues = ["{queue_name}"]', f'queues = ["{queue_name}", "nobody-eats-this"]')
        sentences["queue"] = refused(pool, "--json")
        (pool.dir / "celeryops.toml").write_text(config)

        (pool.dir / "celeryops.toml").write_text(config + OTHER_TARGETS)
        sentences["service"] = refused(pool, "svc")
        sentences["command"] = refused(pool, "cmd")
        (pool.dir / "celeryops.toml").write_text(config)

        sentences["unknown"] = refused(pool, "wroker")

        pool.standin.grant(ALL_PERMISSIONS - {"run.workerpools.update"})
        sentences["permission"] = refused(pool)
        pool.standin.grant(None)

        with pool.standin._lock:  # Cloud Run sizes it: a scaling setting this client cannot read, no manual count
            pool.standin._find("worker").message.scaling = WorkerPoolScaling.deserialize(bytes([0x08, 0x01]))
        sentences["automatic"] = refused(pool)

        assert "autoscale.min_instances (5) is more than autoscale.max_instances (3)" in sentences["min>max"]
        assert "'nobody-eats-this', which no worker of Cloud Run worker pool worker" in sentences["queue"]
        assert "services scale themselves" in sentences["service"]
        assert "command target" in sentences["command"]
        assert "There is no target 'wroker' to autoscale" in sentences["unknown"]
        assert "lack run.workerpools.update" in sentences["permission"] and "roles/run.developer" in \
            sentences["permission"]
        assert "automatic scaling" in sentences["automatic"]

        assert fleet_keys(redis_client) == keys  # no lease, fence, journal copy, status or autoscaler status
        history = run_cli(["runs", "--json"], pool.env, cwd=pool.dir)
        assert '"id"' not in history.stdout, history.stdout
        assert running(pool) == {pool.old: 1}
        workers: list[WorkerProcess] = pool.alive(pool.old)
        wait_consuming(redis_control, workers, pool.queue)


def test_dry_run_prints_decisions_and_changes_nothing(tmp_path: Path, redis_url: str, queue_name: str,
                                                      redis_client: redis.Redis) -> None:
    """``--dry-run`` on an idle pool above its minimum: each look says it would take a cohort away; nothing is
    changed or published."""
    import json
    import signal
    import time

    from clihelp import CliProcess

    with scaled_pool(tmp_path, redis_url, queue_name, count=2, min_instances=1, tasks_per_instance=1) as pool:
        keys = fleet_keys(redis_client)
        proc = CliProcess(["autoscale", "--dry-run", "--json"], pool.env, cwd=pool.dir)
        try:
            decided = proc.wait_event("autoscale", 90, where=lambda e: e["action"] == "in")
            assert decided["dry_run"] and decided["reason"].endswith(".")
            deadline = time.monotonic() + 3  # a few more looks: still nothing changes
            while time.monotonic() < deadline:
                proc.next_event(10)
            proc.signal(signal.SIGINT)
            assert proc.finish() == 0, proc.read_stderr()
        finally:
            proc.kill()
        assert not [e for e in proc.events if e["event"] == "autoscale_step"]
        assert fleet_keys(redis_client) == keys
        assert running(pool) == {pool.old: 2}
        assert json.loads(json.dumps(proc.events[-1]))["event"] == "autoscale_stopped"
