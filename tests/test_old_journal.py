"""A journal written before the strategy refactor (issue 35) is still recovered after it: the journals in
``fixtures/journal_965acfa/`` were written by celeryops at main 965acfa (``make_fixtures.py`` there: real runs of that
version's CLI, SIGKILLed at a record or run to their end), each with the fleet's copy of it in Redis. Today's
``status``, ``abort``, ``resume`` and ``rollback`` take them over on a pool put back in the state the run left it.

The pool of this test is new (the Cloud Run stand-in names its first revision anew each time), so the fixture's first
revision is renamed as this stand-in named it, in the journal and its fleet copy alike; the revision the old run made
keeps its name (this test makes it again, by that name, as the run had)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from celery import Celery

from celeryops.adapters.deploy import Deployers
from celeryops.adapters.deploy.base import PoolDeployer, PoolUpdate
from celeryops.core.canary import canary_split
from celeryops.core.configload import load_config
from celeryops_harness.workers import wait_for
from clihelp import run_cli
from drainhelp import enqueue, runs
from overlaphelp import WAIT, Pool, all_finished, events_of, running_pool, wait_consuming

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "journal_965acfa"
FLEET_TTL = 3600


def _renamed(text: str, names: dict[str, str]) -> str:
    for old, new in names.items():
        text = text.replace(old, new)
    return text


def install(name: str, pool: Pool) -> dict[str, Any]:
    """The fixture ``name`` as this pool's journal and fleet copy; returns its meta (what the old run's pool ran)."""
    where = FIXTURES / name
    meta: dict[str, Any] = json.loads((where / "meta.json").read_text())
    names = {meta["old"]: pool.old, meta["broker"]: pool.redis_url}
    state = pool.dir / "state"
    state.mkdir(parents=True, exist_ok=True)
    shutil.copy(where / "journal.sqlite3", state / "journal.sqlite3")
    conn = sqlite3.connect(state / "journal.sqlite3")
    try:
        for table, column in (("runs", "settings"), ("runs", "broker"), ("records", "payload")):
            for old, new in names.items():
                conn.execute(f"UPDATE {table} SET {column} = replace({column}, ?, ?)", (old, new))
        conn.commit()
    finally:
        conn.close()
    client = redis.Redis.from_url(pool.redis_url, decode_responses=True)
    try:
        for key, value in json.loads((where / "fleet.json").read_text()).items():
            if "hash" in value:
                client.hset(key, mapping={k: _renamed(v, names) for k, v in value["hash"].items()})
            elif "list" in value:
                client.rpush(key, *(_renamed(v, names) for v in value["list"]))
            else:
                client.zadd(key, {member: score for member, score in value["zset"]})
            client.expire(key, FLEET_TTL)
    finally:
        client.close()
    return meta


def run_as_left(pool: Pool, meta: dict[str, Any], counts: dict[str, int]) -> None:
    """The pool as the old run left it: its new revision (by the name the run gave it) made and run beside the first
    at ``counts``; their workers consume."""
    config = load_config(str(pool.dir / "celeryops.toml"), pool.dir, {}, {})
    (target,) = config.targets
    live = [(rev, n) for rev, n in counts.items() if n]
    split = ((live[0][0], 100),) if len(live) == 1 else canary_split(live[0][0], live[1][0], live[0][1], live[1][1])

    async def update() -> None:
        deployers = Deployers({})
        try:
            deployer = cast(PoolDeployer, deployers(target))
            await deployer.update_worker_pool(target, PoolUpdate(
                image=f"{pool.registry.host}/proj/worker:{pool.sha}", revision=meta["new"],
                instance_count=sum(counts.values()), split=split), lambda event: None)
        finally:
            await deployers.close()

    asyncio.run(update())
    wait_for(lambda: pool.instances() == {rev: n for rev, n in counts.items() if n}, WAIT, "the pool as left")


def status(pool: Pool) -> dict[str, Any]:
    return json.loads(run_cli(["status", "--json"], pool.env, cwd=pool.dir).stdout)  # type: ignore[no-any-return]


def test_a_canary_killed_mid_analysis_is_aborted(tmp_path: Path, redis_url: str, queue_name: str,
                                                 redis_client: redis.Redis, redis_control: Celery) -> None:
    """965acfa's canary, SIGKILLed at its first look: ``status`` says abort retires the canary; ``abort`` takes it
    away, the pool back on its first revision, the waiting tasks run once."""
    with running_pool(tmp_path, redis_url, queue_name, strategy="canary") as pool:
        meta = install("canary-analysing", pool)
        run_as_left(pool, meta, {pool.old: pool.count, meta["new"]: meta["beside"]})
        seen = status(pool)
        assert seen["run"]["phase"] == "overlapping" and seen["recovery"]["action"] == "retire", seen
        ids = enqueue(pool.redis_url, pool.queue, 0.1, n=4)
        result = run_cli(["abort", "--json"], pool.env, cwd=pool.dir, timeout=240)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        assert any(e["event"] == "overlap" and e["step"] == "retired" for e in events_of(result.stdout))
        wait_for(lambda: pool.instances() == {pool.old: pool.count}, WAIT, "the first revision alone")
        wait_consuming(redis_control, pool.alive(pool.old), pool.queue)
        all_finished(redis_client, ids, "the waiting tasks")
        assert all(runs(redis_client, t)["runs"] == 1 for t in ids)
        assert json.loads(run_cli(["runs", "--json"], pool.env, cwd=pool.dir).stdout)[0]["phase"] == "aborted"


def test_an_overlap_deploy_killed_after_its_scale_up_is_resumed(tmp_path: Path, redis_url: str, queue_name: str,
                                                                redis_client: redis.Redis,
                                                                redis_control: Celery) -> None:
    """965acfa's overlap deploy, SIGKILLed once both revisions ran: ``resume`` waits for the new revision, drains the
    old one and cuts over: every instance on the revision the old run made."""
    with running_pool(tmp_path, redis_url, queue_name) as pool:
        meta = install("overlap-up", pool)
        run_as_left(pool, meta, {pool.old: pool.count, meta["new"]: pool.count})
        assert status(pool)["recovery"]["action"] == "retire"
        ids = enqueue(pool.redis_url, pool.queue, 0.1, n=4)
        result = run_cli(["resume", "--json"], pool.env, cwd=pool.dir, timeout=240)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert events_of(result.stdout)[-1]["event"] == "deployed"
        wait_for(lambda: pool.instances() == {meta["new"]: pool.count}, WAIT, "every instance on the new revision")
        wait_consuming(redis_control, pool.alive(meta["new"]), pool.queue)
        all_finished(redis_client, ids, "the waiting tasks")
        assert all(runs(redis_client, t)["runs"] == 1 for t in ids)
        assert pool.fence() is None


def test_a_canary_promoted_before_is_rolled_back(tmp_path: Path, redis_url: str, queue_name: str,
                                                 redis_control: Celery) -> None:
    """965acfa's promoted canary (its promotion's record names no ``before``): ``runs`` shows what it replaced, and
    ``rollback`` goes back there without a pause."""
    with running_pool(tmp_path, redis_url, queue_name, strategy="canary") as pool:
        config = pool.dir / "celeryops.toml"
        config.write_text(config.read_text().replace("insecure = true", 'insecure = true\nstrategy = "canary"'))
        meta = install("canary-promoted", pool)
        run_as_left(pool, meta, {meta["new"]: pool.count})
        history = json.loads(run_cli(["runs", "--json"], pool.env, cwd=pool.dir).stdout)
        assert history[0]["previous"] == {"worker": f"{pool.old} 100%"}, history[0]
        result = run_cli(["rollback", "--yes", "--accept-warnings", "--json"], pool.env, cwd=pool.dir, timeout=240)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        done = events_of(result.stdout)[-1]
        assert done["event"] == "rolled_back" and done["targets"][0]["revision"] == pool.old, done
        wait_for(lambda: pool.instances() == {pool.old: pool.count}, WAIT, "the first revision again")
        wait_consuming(redis_control, pool.alive(pool.old), pool.queue)
