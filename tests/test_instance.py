"""Instances told apart without the user's help: the instance id (Cloud Run's metadata server, else random per
container start) and the node name the fence plugin gives a worker whose name has the default hostname."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from celeryops.core.instance import ENV_CACHE, InstanceId, instance_host, instance_id, unique_node_name
from celeryops.demo.standins import metadata
from celeryops.fence import plugin_workers
from celeryops.slots.settings import settings_from_env
from celeryops_harness.workers import wait_for

POOL = {"CLOUD_RUN_WORKER_POOL": "worker", "CLOUD_RUN_WORKER_POOL_REVISION": "worker-00002-abc"}


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A metadata host that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_the_metadata_server_names_the_instance() -> None:
    env = {**POOL, "GCE_METADATA_HOST": metadata.shared().host_for("0087abc")}
    ident = instance_id(env)
    assert (ident.value, ident.source, ident.problem) == ("0087abc", "metadata", "")
    assert env[ENV_CACHE] == f"{os.getpid()}:0087abc"  # kept for the worker's children
    assert instance_id(env) == InstanceId("0087abc", "inherited")


def test_a_silent_metadata_server_gives_a_random_id_after_the_timeout(silent_server: str) -> None:
    env = {**POOL, "GCE_METADATA_HOST": silent_server}
    ident = instance_id(env, timeout=0.3)
    assert ident.source == "random" and len(ident.value) == 32
    assert f"http://{silent_server}/computeMetadata/v1/instance/id" in ident.problem
    assert ident.problem.endswith("(no answer within 0.3 s)")


def test_a_metadata_server_that_refuses_a_request_without_the_flavor_header_is_no_id() -> None:
    host = metadata.shared().host_for("x1")
    status = subprocess.run([sys.executable, "-c", f"import urllib.request as u; u.urlopen('http://{host}"
                             "/computeMetadata/v1/instance/id', timeout=5)"], capture_output=True, text=True)
    assert "403" in status.stderr


def test_outside_cloud_run_no_metadata_server_is_asked(silent_server: str) -> None:
    ident = instance_id({"GCE_METADATA_HOST": silent_server})
    assert (ident.source, ident.problem) == ("random", "")


def test_a_restarted_instance_has_a_new_id_and_children_share_their_parents() -> None:
    first, restarted = instance_id(dict(POOL)), instance_id(dict(POOL))  # two container starts: fresh environments
    assert first.value != restarted.value and first.short != restarted.short
    env = dict(POOL)
    made = instance_id(env)
    child = subprocess.run([sys.executable, "-c", "from celeryops.core.instance import instance_id; "
                            "i = instance_id(); print(i.value, i.source)"],
                           env={**os.environ, **env}, capture_output=True, text=True, check=True)
    assert child.stdout.split() == [made.value, "inherited"]
    grandchild = subprocess.run(  # a process the worker did not start (its parent is not the maker): its own id
        [sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', 'from celeryops.core."
         "instance import instance_id; print(instance_id().value)'])"],
        env={**os.environ, **env}, capture_output=True, text=True, check=True)
    assert grandchild.stdout.strip() not in ("", made.value)


def test_only_a_node_name_with_the_default_hostname_is_renamed() -> None:
    ident = InstanceId("0087abc", "metadata")
    here = socket.gethostname()
    assert unique_node_name("celery@localhost", "worker-00002-abc", ident) == f"celery@worker-00002-abc.{ident.short}"
    assert unique_node_name(f"gpu@{here}", "r1", ident) == f"gpu@r1.{ident.short}"
    assert unique_node_name("celery@worker-3.example", "r1", ident) == "celery@worker-3.example"
    assert instance_host(POOL, ident) == f"worker-00002-abc.{ident.short}"


def test_slots_on_cloud_run_pool_per_instance_and_the_host_setting_wins() -> None:
    a = settings_from_env(env={**POOL, "GCE_METADATA_HOST": metadata.shared().host_for("id-a")}, detect=False)
    b = settings_from_env(env={**POOL, "GCE_METADATA_HOST": metadata.shared().host_for("id-b")}, detect=False)
    assert a.host.startswith("worker-00002-abc.") and a.host != b.host  # two instances: two pools
    assert settings_from_env(env={**POOL, "CELERYOPS_SLOTS_HOST": "gpu-box"}, detect=False).host == "gpu-box"
    assert settings_from_env(env={}, detect=False).host == socket.gethostname()


def test_workers_with_the_default_name_are_renamed_per_instance(start_workers, redis_url: str,
                                                                 queue_name: str, tmp_path: Path) -> None:
    """Two instances of one revision, both started as celery@<this host> (no -n): each answers ping, heartbeats
    the registry and runs tasks under a name of its own, and says so once in its log."""
    names = []
    workers = []
    for _ in range(2):
        env, name = metadata.instance_env(POOL["CLOUD_RUN_WORKER_POOL_REVISION"])
        names.append(name)
        workers += start_workers(redis_url, app="celeryops_harness.fenceapp", queues=[queue_name],
                                 default_name=name, env={**POOL, **env, "CELERYOPS_FENCE_INTERVAL": "0.3"})
    assert len(set(names)) == 2 and all(n.startswith("celery@worker-00002-abc.") for n in names)
    client = redis.Redis.from_url(redis_url)
    app = Celery("t", broker=redis_url, set_as_current=False)
    try:
        replies = app.control.ping(timeout=1.0)
        assert sorted(n for r in replies for n in r) == sorted(names)
        live = wait_for(lambda: (lambda w: w if set(w) == set(names) else None)(plugin_workers(client)), 30,
                        "both renamed workers in the registry")
        assert {info.instance_id for info in live.values()} and all(  # type: ignore[union-attr]
            info.revision == "worker-00002-abc" and info.instance_id for info in live.values())  # type: ignore[union-attr]
        result = app.send_task("celeryops.testing.noop", queue=queue_name)
        wait_for(lambda: client.hget(f"ct:run:{result.id}", "finished"), 30, "the task to run")
        assert client.hget(f"ct:run:{result.id}", "worker").decode() in names  # task.request.hostname too
    finally:
        app.close()
        client.close()
    for worker, name in zip(workers, names, strict=True):
        log = worker.log()
        assert log.count(f"this instance runs as {name}") == 1, log[-2000:]


def test_a_unique_node_name_is_kept(start_workers, redis_url: str, queue_name: str) -> None:
    (worker,) = start_workers(redis_url, app="celeryops_harness.fenceapp", queues=[queue_name], name="mine-1",
                              env={**POOL, "GCE_METADATA_HOST": metadata.shared().host_for("i9")})
    assert worker.nodename == "celery@mine-1" and "this instance runs as" not in worker.log()


def test_a_worker_whose_metadata_server_does_not_answer_starts_under_a_random_id(
        start_workers, redis_url: str, queue_name: str, silent_server: str) -> None:
    """Bad input: the metadata server does not answer. The worker waits for it at most a second, says so in one
    log line, and consumes under a node name made from a random id."""
    (worker,) = start_workers(redis_url, app="celeryops_harness.fenceapp", queues=[queue_name], wait=False,
                              default_name="celery@not-known-yet",
                              env={**POOL, "GCE_METADATA_HOST": silent_server})
    app = Celery("t", broker=redis_url, set_as_current=False)
    try:
        names = wait_for(lambda: [n for r in app.control.ping(timeout=0.5) for n in r
                                  if n.startswith("celery@worker-00002-abc.")], 60, "the renamed worker to answer")
        queues = app.control.inspect(destination=names, timeout=1.0).active_queues() or {}  # type: ignore[arg-type]
    finally:
        app.close()
    assert [q["name"] for q in queues[names[0]]] == [queue_name]  # type: ignore[index]
    lines = [line for line in worker.log().splitlines() if "this instance runs as" in line]
    assert len(lines) == 1 and f"the metadata server at http://{silent_server}/computeMetadata/v1/instance/id " \
        "gave no instance id (no answer within 1 s), so a random id made at this start names it" in lines[0], lines


def test_the_slots_plugin_alone_renames_too_and_its_pool_is_the_instance(start_workers, redis_url: str,
                                                                          queue_name: str) -> None:
    """Item 2: a worker with only ``slots.install`` (no fence) on Cloud Run: renamed like the fence plugin does, and
    its CPU slots live in the pool of its instance (<revision>.<short id>), not of the shared hostname."""
    env, name = metadata.instance_env(POOL["CLOUD_RUN_WORKER_POOL_REVISION"])
    start_workers(redis_url, app="celeryops_harness.slotapp", queues=[queue_name], default_name=name,
                  env={**POOL, **env, "CELERYOPS_SLOTS_CPU": "2", "CELERYOPS_SLOTS_DETECT": "0"})
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        host = name.split("@", 1)[1]
        pools = wait_for(lambda: [k for k in client.scan_iter("resource:*") if f"host:{host}" in k], 30,
                         "the instance's slot pool")
        assert pools and not [k for k in client.scan_iter("resource:*") if f"host:{socket.gethostname()}}}" in k]
    finally:
        client.close()
