"""Drain fence: the record's compare-and-set semantics (real Redis) and the worker plugin (real Celery workers).

Worker tests prove "never fetched while fenced" from the tasks' own start records (Redis TIME) against the moment
the fence went away, after a window in which an unfenced worker would certainly have fetched (several plugin
heartbeats, or a task on an unfenced queue finishing).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError

from celeryops.demo.standins.cloudrun_instances import cloud_run_env
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.fence import (
    CloudRunIdentity,
    FenceConflict,
    FenceRecord,
    FenceStore,
    PluginWorkerInfo,
    by_revision,
    cloud_run_identity,
    fence_status,
    plugin_workers,
    registry,
    registry_key,
)
from celeryops.ops.preflight.checks import fence_plugin_check
from celeryops_harness.taskapp import hold, noop, release, sleep
from celeryops_harness.workers import WorkerProcess, wait_for

FENCE_APP = "celeryops_harness.fenceapp"
FAST = {"CELERYOPS_FENCE_INTERVAL": "0.2"}
WAIT = 60.0  # generous: the machine is shared


def control_app(broker: str) -> Celery:
    app = Celery("celeryops_test_fence_control", broker=broker)
    app.conf.broker_connection_retry_on_startup = True
    app.conf.broker_connection_timeout = 2
    return app


def answers_ping(app: Celery, worker: WorkerProcess) -> bool:
    """Like WorkerProcess.wait_ready's check, but a stale pooled connection (kombu keeps a process-global pool per
    broker URL, so the first call after a broker restart fails) only means "not yet"."""
    try:
        replies = app.control.ping(destination=[worker.nodename], timeout=0.5, limit=1)
    except (OSError, OperationalError, redis.RedisError):
        return False
    return any(worker.nodename in r for r in replies or [])


def redis_time(client: redis.Redis) -> float:
    sec, usec = client.time()
    return float(sec) + float(usec) / 1e6


def publish(broker: str, queue: str, n: int, *, seconds: float | None = None) -> list[str]:
    with noop.app.connection_for_write(broker) as conn:
        if seconds is None:
            return [noop.apply_async(queue=queue, connection=conn).id for _ in range(n)]
        return [sleep.apply_async(args=(seconds,), queue=queue, connection=conn).id for _ in range(n)]


def runs(client: redis.Redis, ids: list[str]) -> list[dict[str, Any]]:
    return [client.hgetall(f"ct:run:{i}") for i in ids]


def all_finished(client: redis.Redis, ids: list[str]) -> bool:
    return all(r.get("finished") for r in runs(client, ids))


def entry(client: redis.Redis, worker: WorkerProcess) -> PluginWorkerInfo | None:
    return plugin_workers(client).get(worker.nodename)


def wait_entry(client: redis.Redis, worker: WorkerProcess, what: str,
               cond: Callable[[PluginWorkerInfo], bool]) -> PluginWorkerInfo:
    def check() -> PluginWorkerInfo | None:
        info = entry(client, worker)
        return info if info is not None and cond(info) else None

    found = wait_for(check, WAIT, f"{worker.nodename}: {what}")
    assert isinstance(found, PluginWorkerInfo)
    return found


def hold_window(client: redis.Redis, worker: WorkerProcess) -> PluginWorkerInfo:
    """Wait until the worker reports itself held, then for three more heartbeats (a window to fetch in)."""
    held = wait_entry(client, worker, "held", lambda i: i.state == "held")
    return wait_entry(client, worker, "three more heartbeats", lambda i: i.beats >= held.beats + 3)


# --- the record: pure decision ---


def test_hold_decision_follows_scope_and_exemptions() -> None:
    rec = FenceRecord(run_id="r1", queues=("a", "b"), exempt_revisions=("rev-new",), exempt_versions=("2.0",))
    hold = rec.hold_for("rev-old", "1.0")
    assert hold is not None and hold.run_id == "r1"
    assert hold.selects(["a", "c"]) == {"a"}
    assert rec.hold_for("rev-new", "1.0") is None
    assert rec.hold_for("", "2.0") is None
    assert rec.hold_for("", "") is not None  # no identity is never exempt
    for everything in (FenceRecord(run_id="r"), FenceRecord(run_id="r", queues=("*",))):
        all_hold = everything.hold_for(None, None)
        assert everything.holds_all and all_hold is not None
        assert all_hold.selects(["x", "y"]) == {"x", "y"}


def test_cloud_run_identity_is_what_each_kind_sets() -> None:
    """A worker pool's instances get CLOUD_RUN_WORKER_POOL(_REVISION), a service's K_SERVICE / K_REVISION (container
    runtime contract): the revision a fence exempts comes from whichever the worker has."""
    pool = cloud_run_env("worker-pool", "gpu", "gpu-00002-new")
    assert set(pool) == {"CLOUD_RUN_WORKER_POOL", "CLOUD_RUN_WORKER_POOL_REVISION"}
    assert cloud_run_identity(pool) == CloudRunIdentity("worker-pool", "gpu", "gpu-00002-new")
    service = cloud_run_env("service", "web", "web-00003-abc")
    assert {"K_SERVICE", "K_REVISION", "K_CONFIGURATION"} <= set(service) and "CLOUD_RUN_WORKER_POOL" not in service
    assert cloud_run_identity(service) == CloudRunIdentity("service", "web", "web-00003-abc")
    assert cloud_run_identity({}) == CloudRunIdentity()
    rec = FenceRecord(run_id="r", exempt_revisions=("gpu-00002-new",))
    assert rec.hold_for(cloud_run_identity(pool).revision, "") is None


def test_workers_by_revision() -> None:
    workers = {h: PluginWorkerInfo(hostname=h, revision=r) for h, r in
               (("b@x", "w-2"), ("a@x", "w-2"), ("c@x", "w-1"), ("d@x", ""))}
    assert by_revision(workers) == {"": ("d@x",), "w-1": ("c@x",), "w-2": ("a@x", "b@x")}


# --- the record in Redis: compare-and-set ---


def test_raise_read_renew_rescope_lift_are_owner_checked(redis_client: redis.Redis) -> None:
    store = FenceStore(redis_client, "f1")
    assert store.read() is None
    store.raise_fence("run-1", ["q1", "q2"], "alice@laptop", ttl=30, exempt_revisions=["rev-9"])
    rec = store.read()
    assert rec is not None
    assert (rec.run_id, rec.queues, rec.exempt_revisions, rec.owner) == ("run-1", ("q1", "q2"), ("rev-9",),
                                                                          "alice@laptop")
    assert rec.created > 0 and rec.renewed >= rec.created
    assert rec.ttl is not None and 0 < rec.ttl <= 30
    assert redis_client.exists("celeryops:{f1}:fence")

    # A second run cannot take, renew, rescope or lift it; nothing changes.
    with pytest.raises(FenceConflict, match="run-1"):
        store.raise_fence("run-2", ["*"], "bob@ci", ttl=30)
    assert not store.renew("run-2", 60)
    assert not store.rescope("run-2", exempt_versions=["9.9"])
    assert not store.lift("run-2")
    unchanged = store.read()
    assert unchanged is not None and replace(unchanged, ttl=None) == replace(rec, ttl=None)

    # The owner renews (TTL extended, created kept) and rescopes only what it names.
    assert store.renew("run-1", 120)
    renewed = store.read()
    assert renewed is not None and renewed.ttl is not None and renewed.ttl > 30
    assert renewed.created == rec.created and renewed.renewed >= rec.renewed
    assert store.rescope("run-1", exempt_versions=["2.0"])
    rescoped = store.read()
    assert rescoped is not None
    assert (rescoped.queues, rescoped.exempt_revisions, rescoped.exempt_versions) == (("q1", "q2"), ("rev-9",),
                                                                                      ("2.0",))
    assert store.rescope("run-1", queues=["*"])
    assert store.read().holds_all  # type: ignore[union-attr]

    # Re-raising by the same run (recovery) is allowed and keeps created.
    store.raise_fence("run-1", ["q3"], "alice@laptop", ttl=30)
    again = store.read()
    assert again is not None and again.queues == ("q3",) and again.created == rec.created

    assert store.lift("run-1")
    assert store.read() is None
    assert not store.lift("run-1")
    assert not store.renew("run-1", 30)  # a lost fence is not silently re-created
    assert store.read() is None


def test_fence_scoped_to_revisions_is_stored_and_replaced_whole(redis_client: redis.Redis) -> None:
    """An overlap deploy's fence names the revisions it holds (the old one) and exempts the new one; re-raised
    unscoped by the same run (a retirement's hold of another revision, a drain), the scope goes with it."""
    store = FenceStore(redis_client, "f-scope")
    store.raise_fence("run-o", ["q"], "alice", ttl=30, only_revisions=["pool-00001-old"],
                      exempt_revisions=["pool-abc-new"])
    rec = store.read()
    assert rec is not None and rec.only_revisions == ("pool-00001-old",)
    assert rec.hold_for("pool-00001-old", "") is not None and rec.hold_for("pool-abc-new", "") is None
    assert rec.hold_for("other-pool-00003-x", "") is None  # not in scope: another pool's workers consume
    assert store.rescope("run-o", only_revisions=["pool-abc-new"], exempt_revisions=["pool-00001-old"])
    swapped = store.read()
    assert swapped is not None and swapped.hold_for("pool-abc-new", "") is not None
    assert swapped.hold_for("pool-00001-old", "") is None
    store.raise_fence("run-o", ["q"], "alice", ttl=30)
    plain = store.read()
    assert plain is not None and plain.only_revisions == () and plain.hold_for("pool-abc-new", "") is not None


def test_fence_expires_without_renewal(redis_client: redis.Redis) -> None:
    store = FenceStore(redis_client, "f2")
    store.raise_fence("run-1", [], "alice", ttl=0.3)
    assert store.read() is not None
    wait_for(lambda: store.read() is None, WAIT, "the fence to expire")
    store.raise_fence("run-2", ["q"], "bob", ttl=30)  # an expired fence no longer blocks another run
    assert store.read().run_id == "run-2"  # type: ignore[union-attr]


# --- the worker plugin ---


@pytest.mark.slow
def test_worker_started_under_fence_fetches_nothing_until_lift(
    broker_url: str, redis_url: str, redis_client: redis.Redis, start_workers: Any, queue_name: str
) -> None:
    """Prefork pool, on both brokers (the fence itself always lives in Redis)."""
    store = FenceStore(redis_client)
    free_queue = queue_name + "-free"
    store.raise_fence("run-a", [queue_name], "test", ttl=60)
    fenced = publish(broker_url, queue_name, 4)
    (worker,) = start_workers(broker_url, app=FENCE_APP, pool="prefork", queues=[queue_name, free_queue],
                              env={**FAST, "CELERYOPS_FENCE_REDIS_URL": redis_url})

    info = hold_window(redis_client, worker)
    assert info.held_queues == (queue_name,) and info.fence_run_id == "run-a"
    assert set(info.queues) == {queue_name, free_queue}
    free = publish(broker_url, free_queue, 1)  # the unfenced queue is still consumed meanwhile
    wait_for(lambda: all_finished(redis_client, free), WAIT, "the task on the unfenced queue")
    assert not any(runs(redis_client, fenced)), "a fenced task started while the fence was up"

    lifted_at = redis_time(redis_client)
    assert store.lift("run-a")
    wait_for(lambda: all_finished(redis_client, fenced), WAIT, "the fenced tasks after the lift")
    assert all(float(r["started"]) >= lifted_at for r in runs(redis_client, fenced))
    assert {r["worker"] for r in runs(redis_client, fenced)} == {worker.nodename}
    wait_entry(redis_client, worker, "consuming again", lambda i: i.state == "consuming" and not i.held_queues)


@pytest.mark.slow
def test_reconnect_during_fence_still_fetches_nothing(
    redis_url: str, redis_client: redis.Redis, own_redis: RedisServer, start_workers: Any, queue_name: str
) -> None:
    """Only the broker restarts (own_redis); the fence, registry and task records live in the session Redis."""
    store = FenceStore(redis_client)
    store.raise_fence("run-b", ["*"], "test", ttl=60)
    (worker,) = start_workers(own_redis.url, app=FENCE_APP, queues=[queue_name],
                              env={**FAST, "CELERYOPS_FENCE_REDIS_URL": redis_url})
    first = hold_window(redis_client, worker)
    assert first.consumer_starts == 1

    own_redis.restart()  # connection lost; the restarted broker is empty
    app = control_app(own_redis.url)
    try:
        wait_for(lambda: answers_ping(app, worker), WAIT, "the worker to answer ping after the broker restart")
    finally:
        app.close()
    wait_entry(redis_client, worker, "the plugin to start again after the reconnect", lambda i: i.consumer_starts >= 2)
    ids = publish(own_redis.url, queue_name, 3)
    info = hold_window(redis_client, worker)
    assert info.held_queues == (queue_name,)
    assert not any(runs(redis_client, ids)), "a task started during the fence after the reconnect"

    lifted_at = redis_time(redis_client)
    assert store.lift("run-b")
    wait_for(lambda: all_finished(redis_client, ids), WAIT, "the tasks after the lift")
    assert all(float(r["started"]) >= lifted_at for r in runs(redis_client, ids))

    # The restored queue survives the next reconnect too (Celery's add_task_queue alone would not reselect it).
    own_redis.restart()
    wait_entry(redis_client, worker, "the plugin to start a third time", lambda i: i.consumer_starts >= 3)
    app = control_app(own_redis.url)
    try:
        wait_for(lambda: answers_ping(app, worker), WAIT, "the worker to answer ping after the second restart")
    finally:
        app.close()
    later = publish(own_redis.url, queue_name, 2)
    wait_for(lambda: all_finished(redis_client, later), WAIT, "tasks after the second reconnect")


@pytest.mark.slow
def test_expired_fence_releases_workers_by_themselves(
    redis_url: str, redis_client: redis.Redis, start_workers: Any, queue_name: str
) -> None:
    store = FenceStore(redis_client)
    store.raise_fence("run-c", [queue_name], "test", ttl=60)
    (worker,) = start_workers(redis_url, app=FENCE_APP, queues=[queue_name], env=FAST)
    ids = publish(redis_url, queue_name, 3)
    hold_window(redis_client, worker)
    assert not any(runs(redis_client, ids))

    # The run "dies": its last heartbeat gives the fence one more second, then nobody renews or lifts it.
    renewed_at = redis_time(redis_client)
    assert store.renew("run-c", 1.0)
    wait_for(lambda: all_finished(redis_client, ids), WAIT, "the tasks after the fence expired")
    assert store.read() is None
    assert all(float(r["started"]) >= renewed_at + 1.0 for r in runs(redis_client, ids))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["worker-pool", "service"])
def test_exempt_revision_consumes_while_old_revision_is_held(
    redis_url: str, redis_client: redis.Redis, start_workers: Any, queue_name: str, kind: Any
) -> None:
    """Each with only what Cloud Run sets for its kind: a worker pool's revision is exempt as a service's is."""
    store = FenceStore(redis_client)
    store.raise_fence("run-d", [queue_name], "test", ttl=60, exempt_revisions=["svc-00002-new"])
    (old,) = start_workers(redis_url, app=FENCE_APP, queues=[queue_name], wait=False,
                           env={**FAST, **cloud_run_env(kind, "svc", "svc-00001-old"), "CELERYOPS_VERSION": "1.0"})
    (new,) = start_workers(redis_url, app=FENCE_APP, queues=[queue_name],
                           env={**FAST, **cloud_run_env(kind, "svc", "svc-00002-new"), "CELERYOPS_VERSION": "2.0"})
    app = control_app(redis_url)
    try:
        old.wait_ready(app)
    finally:
        app.close()
    hold_window(redis_client, old)
    new_info = wait_entry(redis_client, new, "consuming", lambda i: i.state == "consuming")
    assert new_info.revision == "svc-00002-new" and new_info.fence_run_id == "run-d" and not new_info.held_queues
    assert (new_info.cloudrun_kind, new_info.cloudrun_name) == (kind, "svc")
    assert by_revision(plugin_workers(redis_client)) == {"svc-00001-old": (old.nodename,),
                                                         "svc-00002-new": (new.nodename,)}
    control = control_app(redis_url)
    try:
        replies = fence_status(control, [new.nodename])
    finally:
        control.close()
    assert (replies[new.nodename].revision, replies[new.nodename].cloudrun_kind) == ("svc-00002-new", kind)

    ids = publish(redis_url, queue_name, 6)
    wait_for(lambda: all_finished(redis_client, ids), WAIT, "the tasks on the exempt worker")
    assert {r["worker"] for r in runs(redis_client, ids)} == {new.nodename}
    assert entry(redis_client, old).state == "held"  # type: ignore[union-attr]

    # Rescoping the exemptions to the old worker's version releases it too, without lifting the fence.
    assert store.rescope("run-d", exempt_versions=["1.0"])
    wait_entry(redis_client, old, "released by the rescope", lambda i: i.state == "consuming")
    assert store.read() is not None


@pytest.mark.slow
def test_remote_control_and_registry_tell_plugin_workers_apart(
    redis_url: str, redis_client: redis.Redis, start_workers: Any, queue_name: str
) -> None:
    store = FenceStore(redis_client)
    store.raise_fence("run-e", [], "test", ttl=60)
    (plugin,) = start_workers(redis_url, app=FENCE_APP, queues=[queue_name], wait=False,
                              env={**FAST, "CELERYOPS_VERSION": "3.1"})
    (plain,) = start_workers(redis_url, queues=[queue_name])
    app = control_app(redis_url)
    try:
        plugin.wait_ready(app)
        wait_entry(redis_client, plugin, "held", lambda i: i.state == "held")
        replies = fence_status(app, destination=[plugin.nodename, plain.nodename], timeout=5.0)
        everyone = fence_status(app, timeout=2.0)
        # Preflight: the plain worker is a warning; plugin workers of another fleet than the run's are a failure.
        same = asyncio.run(fence_plugin_check(app, "default").run())
        other = asyncio.run(fence_plugin_check(app, "prod").run())
    finally:
        app.close()

    assert same.status == "warn" and plain.nodename in same.detail, same
    assert other.status == "fail" and "'default'" in other.detail and plugin.nodename in other.detail, other
    assert "CELERYOPS_FLEET=default" in other.remedy, other
    assert set(replies) == {plugin.nodename, plain.nodename}
    mine = replies[plugin.nodename]
    assert mine.plugin and mine.fleet == "default" and mine.version == "3.1" and mine.state == "held"
    assert mine.held_queues == (queue_name,) and mine.fence_run_id == "run-e"
    assert not replies[plain.nodename].plugin
    assert {w for w, r in everyone.items() if r.plugin} == {plugin.nodename}

    members = plugin_workers(redis_client)
    assert set(members) == {plugin.nodename}
    info = members[plugin.nodename]
    assert info.version == "3.1" and info.queues == (queue_name,) and info.held
    assert info.pid == plugin.pid
    assert plugin_workers(redis_client, "another-fleet") == {}

    plugin.signal(signal.SIGTERM)  # a warm shutdown takes the worker out of the registry at once
    wait_for(lambda: entry(redis_client, plugin) is None, WAIT, "the stopped worker to leave the registry")


@pytest.mark.slow
def test_busy_solo_worker_keeps_its_registry_entry_alive(
    redis_url: str, redis_client: redis.Redis, start_workers: Any, queue_name: str
) -> None:
    (worker,) = start_workers(redis_url, app=FENCE_APP, pool="solo", concurrency=1, queues=[queue_name],
                              env={**FAST, "CELERYOPS_FENCE_REGISTRY_TTL": "2"})
    with hold.app.connection_for_write(redis_url) as conn:  # busy until the test is done with it
        task_id = hold.apply_async(args=(queue_name,), queue=queue_name, connection=conn).id
    wait_for(lambda: redis_client.hget(f"ct:run:{task_id}", "started"), WAIT, "the long task to start")
    busy = entry(redis_client, worker)
    assert busy is not None
    app = control_app(redis_url)
    try:  # the event loop is blocked by the task: the worker answers no control command...
        assert worker.nodename not in fence_status(app, destination=[worker.nodename], timeout=0.5)
    finally:
        app.close()
    # ...but its plugin thread keeps beating.
    wait_entry(redis_client, worker, "heartbeats while busy", lambda i: i.beats >= busy.beats + 3)
    assert not redis_client.hget(f"ct:run:{task_id}", "finished")
    release(redis_client, queue_name)

    worker.kill()  # no goodbye: the entry stops counting when its TTL runs out
    wait_for(lambda: entry(redis_client, worker) is None, WAIT, "the killed worker's entry to expire")
    assert redis_client.hexists(registry_key("default"), worker.nodename)  # readers never delete anything


def test_registry_prune_drops_only_long_expired_entries(redis_client: redis.Redis) -> None:
    registry.write_heartbeat(redis_client, "f3", "celery@gone", {"state": "consuming"}, ttl=0.001)
    registry.write_heartbeat(redis_client, "f3", "celery@alive", {"state": "held", "held_queues": ["q"]}, ttl=60)
    wait_for(lambda: "celery@gone" not in plugin_workers(redis_client, "f3"), WAIT, "the short entry to expire")
    assert registry.prune(redis_client, "f3", grace=3600) == 0  # expired, but not long ago: kept
    assert registry.prune(redis_client, "f3", grace=0) == 1
    assert set(redis_client.hkeys(registry_key("f3"))) == {"celery@alive"}
    alive = plugin_workers(redis_client, "f3")["celery@alive"]
    assert alive.held and alive.held_queues == ("q",)


@pytest.mark.slow
def test_unreadable_fence_at_start_holds_until_redis_answers(
    redis_url: str, redis_client: redis.Redis, own_redis: RedisServer, start_workers: Any, queue_name: str
) -> None:
    """The fence Redis (own_redis) is down when the worker starts: it holds everything ("unknown")."""
    own_redis.stop()
    ids = publish(redis_url, queue_name, 2)
    (worker,) = start_workers(redis_url, app=FENCE_APP, queues=[queue_name],
                              env={**FAST, "CELERYOPS_FENCE_REDIS_URL": own_redis.url})
    app = control_app(redis_url)
    try:
        def status() -> Any:
            reply = fence_status(app, destination=[worker.nodename], timeout=2.0).get(worker.nodename)
            return reply if reply is not None and reply.beats >= 3 else None

        reply = wait_for(status, WAIT, "three plugin heartbeats")
    finally:
        app.close()
    assert reply.state == "unknown" and not reply.fence_readable and reply.held_queues == (queue_name,)
    assert not any(runs(redis_client, ids)), "a task started although the fence could not be read"
    assert "cannot read the drain fence" in worker.log()

    own_redis.start()  # empty: no fence, so the worker consumes
    wait_for(lambda: all_finished(redis_client, ids), WAIT, "the tasks once the fence Redis answers")


def test_fence_redis_defaults_to_a_redis_broker_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from celeryops.fence.plugin import resolve_redis_url

    monkeypatch.delenv("CELERYOPS_FENCE_REDIS_URL", raising=False)
    redis_app = Celery("r", broker="redis://:pw@10.0.0.1:6379/2;redis://10.0.0.2:6379/2")
    amqp_app = Celery("a", broker="amqp://guest:guest@localhost//")
    assert resolve_redis_url(redis_app, None) == "redis://:pw@10.0.0.1:6379/2"
    assert resolve_redis_url(amqp_app, None) is None
    assert resolve_redis_url(amqp_app, "redis://fence:6379/0") == "redis://fence:6379/0"
    monkeypatch.setenv("CELERYOPS_FENCE_REDIS_URL", "redis://env:6379/1")
    assert resolve_redis_url(amqp_app, None) == "redis://env:6379/1"
    assert resolve_redis_url(redis_app, "redis://arg:6379/0") == "redis://arg:6379/0"


@pytest.mark.slow
def test_queue_restored_by_add_consumer_survives_a_broker_reconnect(
    redis_url: str, redis_client: redis.Redis, own_redis: RedisServer, start_workers: Any, queue_name: str
) -> None:
    """Celery drops a queue that was cancelled and added back by remote control at the next reconnect (it is not
    re-selected); the plugin puts back what the worker consumed before the reconnect (chaos seed 96)."""
    (worker,) = start_workers(own_redis.url, app=FENCE_APP, queues=[queue_name],
                              env={**FAST, "CELERYOPS_FENCE_REDIS_URL": redis_url})
    app = control_app(own_redis.url)
    try:
        app.control.cancel_consumer(queue_name, destination=[worker.nodename], reply=True, timeout=3, limit=1)
        app.control.add_consumer(queue_name, destination=[worker.nodename], reply=True, timeout=3, limit=1)
        wait_entry(redis_client, worker, "the plugin to see the queue consumed again",
                   lambda i: queue_name in i.queues and not i.held_queues)
    finally:
        app.close()
    own_redis.restart()
    wait_entry(redis_client, worker, "the plugin to start again after the reconnect", lambda i: i.consumer_starts >= 2)
    app = control_app(own_redis.url)
    try:
        wait_for(lambda: answers_ping(app, worker), WAIT, "the worker to answer ping after the broker restart")
    finally:
        app.close()
    ids = publish(own_redis.url, queue_name, 2)
    wait_for(lambda: all_finished(redis_client, ids), WAIT, "tasks after the reconnect")


def test_a_restore_right_after_the_lift_is_not_undone_by_a_stale_fence(
    redis_url: str, redis_client: redis.Redis, start_workers: Any, queue_name: str
) -> None:
    """``abort`` lifts the fence, then adds the queues back and confirms them, faster than a plugin worker's next
    fence read (chaos seeds 7, 16): the plugin must read the fence again before it stops a queue that came back,
    or it cancels the restored queue with its stale decision and ``status`` finds the worker consuming nothing."""
    store = FenceStore(redis_client)
    store.raise_fence("run-r", [queue_name], "test", ttl=60)
    # A long interval (the default's order): the reader thread's decision stays stale for seconds.
    (worker,) = start_workers(redis_url, app=FENCE_APP, queues=[queue_name],
                              env={"CELERYOPS_FENCE_INTERVAL": "3", "CELERYOPS_FENCE_REDIS_URL": redis_url})
    held = wait_entry(redis_client, worker, "held", lambda i: i.state == "held")
    stops = worker.log_path.read_text().count("stopped consuming it")
    assert stops == 1, worker.log_path.read_text()[-2000:]
    app = control_app(redis_url)
    try:
        assert store.lift("run-r")
        app.control.add_consumer(queue_name, destination=[worker.nodename], reply=True, timeout=5, limit=1)
        # Two more heartbeats: the consumer timer has applied a decision at least once since the restore.
        wait_entry(redis_client, worker, "two more heartbeats", lambda i: i.beats >= held.beats + 2)
        log = worker.log_path.read_text()
        assert log.count("stopped consuming it") == stops, log[-2000:]
        replies = app.control.inspect(destination=[worker.nodename], timeout=5).active_queues() or {}
        assert [q["name"] for q in replies.get(worker.nodename, [])] == [queue_name], replies
    finally:
        app.close()
