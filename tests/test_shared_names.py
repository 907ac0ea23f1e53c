"""Workers that share a node name (Cloud Run: every default name is celery@localhost): the fence registry keeps
them apart, a restarted instance takes its entry back, and a run refuses them before it stops anything."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import redis
from celery import Celery

from celeryops.fence import plugin_workers, registry
from celeryops.fence.registry import by_revision, claim_field, heartbeat_states, write_heartbeat
from celeryops.ops.preflight.nodenames import describe, shared_names
from celeryops_harness.workers import wait_for
from clihelp import run_cli
from overlaphelp import FENCE_APP, PLUGIN, RELEASE, running_pool


def _beat(client: redis.Redis, host: str, instance: str, revision: str, ttl: float = 60) -> str:
    """What the plugin's beat does: claim a field, then write the entry there."""
    field = claim_field(client, "f", host, instance)
    write_heartbeat(client, "f", field, {"hostname": host, "instance_id": instance, "revision": revision}, ttl)
    return field


def test_instances_sharing_a_node_name_stay_two_entries(redis_client: redis.Redis) -> None:
    a = _beat(redis_client, "celery@localhost", "id-a", "worker-00001-abc")
    b = _beat(redis_client, "celery@localhost", "id-b", "worker-00002-xyz")
    assert a == "celery@localhost" and b.startswith("celery@localhost#") and len(b) == len(a) + 9
    assert _beat(redis_client, "celery@localhost", "id-a", "worker-00001-abc") == a  # each keeps its own field
    assert _beat(redis_client, "celery@localhost", "id-b", "worker-00002-xyz") == b
    live = plugin_workers(redis_client, "f")
    assert {(i.hostname, i.instance_id) for i in live.values()} == {("celery@localhost", "id-a"),
                                                                    ("celery@localhost", "id-b")}
    assert by_revision(live) == {"worker-00001-abc": (a,), "worker-00002-xyz": (b,)}


def test_an_instance_that_restarts_with_a_new_id_takes_its_entry_back(redis_client: redis.Redis) -> None:
    """A worker with a unique -n restarts (new container, new id): the entry of its old id expired, so the new one
    is listed under the node name again; the expired old one was evidence of the stop meanwhile."""
    _beat(redis_client, "celery@w1", "old-id", "r1", ttl=0.001)
    wait_for(lambda: heartbeat_states(redis_client, "f") == {"celery@w1": False}, 10, "the old entry to expire")
    assert _beat(redis_client, "celery@w1", "new-id", "r1") == "celery@w1"
    assert {h: i.instance_id for h, i in plugin_workers(redis_client, "f").items()} == {"celery@w1": "new-id"}
    raw = json.loads(redis_client.hget(registry.registry_key("f"), "celery@w1"))
    assert raw["hostname"] == "celery@w1"


def test_shared_names_are_described_by_revision() -> None:
    shared = shared_names([("celery@localhost", "worker-00001-abc"), ("celery@localhost", "worker-00001-abc"),
                           ("celery@localhost", ""), ("celery@w2", "r")])
    assert shared == {"celery@localhost": Counter({"worker-00001-abc": 2, "": 1})}
    assert describe(shared) == ("3 workers answer as celery@localhost (1 that names no revision, 2 of revision "
                                "worker-00001-abc)")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateNodenameWarning")  # the test's own inspect
def test_an_overlap_deploy_refuses_workers_of_two_revisions_that_share_a_node_name(
        tmp_path: Path, redis_url: str, queue_name: str, redis_control: Celery, start_workers) -> None:
    """Bad input: a worker of another revision answers under the name of one of the old revision's workers. The
    overlap deploy fails its preflight with one sentence naming them; no consumer stopped, the pool unchanged."""
    with running_pool(tmp_path, redis_url, queue_name) as pool:
        (old_worker, *_) = pool.alive(pool.old)
        start_workers(redis_url, app=FENCE_APP, queues=[queue_name], name=old_worker.nodename.split("@", 1)[1],
                      env={**PLUGIN, "CLOUD_RUN_WORKER_POOL": "worker",
                           "CLOUD_RUN_WORKER_POOL_REVISION": "worker-00009-new"}, wait=False)
        wait_for(lambda: len([r for r in redis_control.control.ping(timeout=0.5) if old_worker.nodename in r]) == 2,
                 60, "both workers to answer under one name")
        before_queues = redis_control.control.inspect(timeout=1.0).active_queues()
        before = pool.instances()
        args = ["deploy", RELEASE, "--strategy", "overlap", "--yes", "--accept-warnings", "--repo", str(pool.git.work)]
        result = run_cli(args, pool.env, cwd=pool.dir, timeout=180)
        assert result.returncode != 0, result.stdout
        errors = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and errors[0].startswith("celeryops: "), result.stderr
        assert "Traceback" not in result.stderr
        assert f"2 workers answer as {old_worker.nodename}" in errors[0], errors[0]
        assert f"of revision {pool.old}" in errors[0] and "of revision worker-00009-new" in errors[0], errors[0]
        assert "nothing was stopped" in errors[0]
        assert pool.instances() == before
        after_queues = redis_control.control.inspect(timeout=1.0).active_queues()
        assert {w: sorted(q["name"] for q in qs) for w, qs in (after_queues or {}).items()} == \
               {w: sorted(q["name"] for q in qs) for w, qs in (before_queues or {}).items()}


def test_instances_per_revision_are_counted_by_instance_id(redis_client: redis.Redis) -> None:
    """The console's per-revision instance counts: one per live instance, also when two share a node name."""
    from celeryops.fence import instances_by_revision

    _beat(redis_client, "celery@localhost", "id-a", "r1")
    _beat(redis_client, "celery@localhost", "id-b", "r1")
    _beat(redis_client, "celery@r2.1", "id-c", "r2")
    _beat(redis_client, "celery@gone", "id-d", "r2", ttl=0.001)
    wait_for(lambda: heartbeat_states(redis_client, "f").get("celery@gone") is False, 10, "the entry to expire")
    assert instances_by_revision(plugin_workers(redis_client, "f")) == {"r1": 2, "r2": 1}


@pytest.mark.slow
def test_an_instance_restarted_with_a_new_id_leaves_by_evidence(tmp_path: Path, redis_url: str, queue_name: str,
                                                                 redis_client: redis.Redis, start_workers) -> None:
    """Bad input: an instance is SIGKILLed (OOM) and restarts with a new id, hence a new node name; its old name
    stays in the broker's pidbox bindings. Preflight says it left (its heartbeat expired) instead of asking for
    --forget, and the drain finishes with the new one alone."""
    from celeryops.demo.standins import metadata
    from clihelp import CliProcess, cli_env

    revision = "worker-00003-abc"
    pool_env = {"CLOUD_RUN_WORKER_POOL": "worker", "CLOUD_RUN_WORKER_POOL_REVISION": revision,
                "CELERYOPS_FENCE_INTERVAL": "0.3", "CELERYOPS_FENCE_REGISTRY_TTL": "2"}
    names = []
    for _ in range(2):
        meta, name = metadata.instance_env(revision)
        names.append(name)
        (worker,) = start_workers(redis_url, app=FENCE_APP, queues=[queue_name], default_name=name,
                                  env={**pool_env, **meta})
        wait_for(lambda n=name: n in plugin_workers(redis_client), 30, "the worker in the registry")
        if len(names) == 1:
            worker.kill()  # the first start dies; Cloud Run starts the instance again: a new container, a new id
    old, new = names
    assert old != new
    wait_for(lambda: heartbeat_states(redis_client).get(old) is False, 30, "the old heartbeat to expire")
    drain = CliProcess(["drain", "--broker", redis_url, "-Q", queue_name, "--interval", "0.4", "--streak", "2",
                        "--json"], cli_env(tmp_path / "state", CELERYOPS_REDIS_URL=redis_url))
    try:
        drain.wait_event("drained", 120)
        assert drain.finish() == 0, drain.read_stderr()
    finally:
        drain.kill()
    (workers,) = [e for e in drain.events
                  if e["event"] == "check" and e["id"] == "workers" and e["status"] != "running"]
    assert workers["status"] == "ok", workers
    assert "1 registered worker(s) left (their fence heartbeat expired, e.g. an instance restarted with a new id): " \
        f"{old}" in workers["detail"], workers
    (names_check,) = [e for e in drain.events if e["event"] == "check" and e["id"] == "node_names"
                      and e["status"] != "running"]
    assert names_check["status"] == "ok", names_check
