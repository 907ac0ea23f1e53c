"""Redis Cluster readiness, on a real single-node cluster (all 16384 hash slots on one redis-server):
every script runs through redis-py's RedisCluster client because all keys of a pool share one hash tag; without the
tag the same scripts are refused (CROSSSLOT), which shows that the scripts declare their keys."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from celeryops.demo.standins.redis_server import free_port
from celeryops.slots import SlotStore, read_all
from celeryops_harness.workers import wait_for


@pytest.fixture
def cluster() -> Iterator[RedisCluster]:
    port = free_port(range(20000, 22700))  # the cluster bus listens on port + 10000, below the ephemeral range
    workdir = Path(tempfile.mkdtemp(prefix="celeryops-cluster-"))
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
         "--cluster-config-file", str(workdir / "nodes.conf"), "--dir", str(workdir), "--save", "",
         "--appendonly", "no", "--logfile", str(workdir / "redis.log")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        node = redis.Redis(port=port, socket_connect_timeout=0.5)

        def up() -> bool:
            try:
                return bool(node.ping())
            except redis.ConnectionError:
                return False

        wait_for(up, 30, "the cluster node to answer PING")
        node.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        wait_for(lambda: node.cluster("INFO")["cluster_state"] == "ok", 30, "the cluster state to be ok")
        node.close()
        client = RedisCluster(host="127.0.0.1", port=port, decode_responses=True)
        yield client
        client.close()
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def test_pool_works_on_redis_cluster(cluster: RedisCluster) -> None:
    store = SlotStore(cluster)
    store.set_totals({"cpu": 4, "gpu": 1})
    a = store.acquire("a", {"cpu": 2, "gpu": 1}, ttl=30, name="infer")
    assert a.ok and not store.acquire("b", {"cpu": 3}, ttl=30).ok
    assert store.renew("a", a.token, 30, {"cpu": 2, "gpu": 1}).status == "renewed"
    assert store.adopt("c", {"cpu": 1}, ttl=30) > a.token
    snap = store.snapshot()
    assert {h.task_id for h in snap.holders} == {"a", "c"} and [w.task_id for w in snap.waiting] == ["b"]
    assert snap.usage("cpu").used == 3
    cluster.script_flush()
    assert store.release("a", a.token) and store.release("c")  # NOSCRIPT healed on the cluster client too
    store.acquire("short", {"cpu": 1}, ttl=0.05)
    wait_for(lambda: store.reap() == 1, 10, "the short lease to expire (by Redis TIME) and be reaped")
    full = read_all(cluster)
    assert [p.pool for p in full.pools] == ["global"] and full.pools[0].usage("cpu").used == 0


def test_host_contributions_add_up_on_redis_cluster(cluster: RedisCluster) -> None:
    store = SlotStore(cluster)
    assert store.contribute("big", {"cpu": 32}, ttl=30, worker="celery@big", starting=True).status == "new"
    store.contribute("small", {"cpu": 4}, ttl=30, worker="celery@small", starting=True)
    assert store.acquire("a", {"cpu": 36}, ttl=30).ok and store.release("a")
    # Its last heartbeat is a short one (set only now: a loaded machine may take longer than it between two calls).
    assert store.contribute("small", {"cpu": 4}, ttl=0.2, worker="celery@small").status == "renewed"
    wait_for(lambda: store.reap() >= 0 and cluster.hget(store.keys[0], "total:cpu") == "32", 10,
             "the small host's contribution to expire (Redis TIME) and be reaped")
    assert store.snapshot().usage("cpu").total == 32
    assert store.withdraw("big", "celery@big")
    snap = read_all(cluster).pools[0]
    assert snap.hosts == [] and snap.usage("cpu").total == 0


def test_without_the_hash_tag_cluster_refuses_the_scripts(cluster: RedisCluster) -> None:
    untagged = SlotStore(cluster, hash_tag=False)
    with pytest.raises(redis.RedisClusterException, match="same key slot"):
        untagged.acquire("x", {"cpu": 1}, ttl=30)
