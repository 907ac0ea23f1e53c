"""The worker-side runtime against a real (private) redis-server: Redis restarted mid-run (scripts reload, leases
and totals come back, counters stay true), fail-open runs registered once Redis is back, fail-closed, the lease-lost
policy (LeaseLost raised in the task's thread, or logged), a host's pool made of its workers' contributions, a
shared type's global pool as the sum of the runtimes' host contributions (renewed by the heartbeat thread, expiring
when it stops, withdrawn at worker stop), and the CELERYOPS_SLOTS_* environment contract."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time

import pytest
import redis

from celeryops.demo.standins.redis_server import RedisServer
from celeryops.slots import LeaseLost, SlotRuntime, SlotSettings, SlotStore, detect_totals, settings_from_env
from celeryops_harness.workers import wait_for


def make_runtime(url: str, nodename: str = "celery@w1", **kw: object) -> SlotRuntime:
    settings = SlotSettings(**{"lease_ttl": 30.0, "totals": {"cpu": 4}, "detect": False, "host": "h1",  # type: ignore[arg-type]
                               **kw})
    rt = SlotRuntime(settings, url)
    rt.on_worker_start(nodename)
    return rt


def test_global_runtimes_add_their_hosts_and_the_heartbeat_keeps_them(redis_url: str,
                                                                     redis_client: redis.Redis) -> None:
    """Two worker runtimes on hosts of different sizes, cpu declared shared: the global pool's total is the sum, the
    heartbeat thread keeps both contributions alive past their TTL; a runtime whose heartbeat stops (a killed or
    frozen worker) drops out when its contribution expires, and comes back when it beats again; a stopping worker
    withdraws at once."""
    big = make_runtime(redis_url, "celery@big", host="big", totals={"cpu": 32}, host_ttl=0.6, shared=frozenset({"cpu"}))
    small = make_runtime(redis_url, "celery@small", host="small", totals={"cpu": 4}, host_ttl=0.6,
                         shared=frozenset({"cpu"}))
    store = SlotStore(redis_client)
    try:
        assert store.snapshot().usage("cpu").total == 36
        assert big.settings.heartbeat_interval == pytest.approx(0.2)  # a third of the shorter TTL
        wait_for(lambda: all(hc.age > 1.8 for hc in store.snapshot().hosts), 30, "3 host TTLs to pass")
        snap = store.snapshot()
        assert snap.usage("cpu").total == 36 and not any(hc.expired for hc in snap.hosts)  # renewed all along
        small.stop_heartbeat()
        wait_for(lambda: store.snapshot().usage("cpu").total == 32, 30, "the silent host's contribution to expire")
        wait_for(lambda: redis_client.hget(store.keys[0], "total:cpu") == "32", 30,
                 "the live worker's heartbeat to reap it")
        small.start_heartbeat()
        wait_for(lambda: store.snapshot().usage("cpu").total == 36, 30, "the host to be added again")
        big.on_worker_stop()
        snap = store.snapshot()
        assert snap.usage("cpu").total == 4 and [hc.host for hc in snap.hosts] == ["small"]
    finally:
        big.stop_heartbeat()
        small.stop_heartbeat()


def test_a_host_pool_holds_what_its_workers_contribute(redis_url: str, redis_client: redis.Redis) -> None:
    """By default a worker's types are its host's: two workers of h1 make its pool (the larger of their numbers), a
    total fixed by an earlier version's per-host scope is forgotten, and the pool empties when both have stopped."""
    pool = SlotStore(redis_client, "host:h1")
    pool.set_totals({"cpu": 99})  # what a worker of the earlier per-host scope wrote (a fixed total)
    a = make_runtime(redis_url, "celery@a", totals={"cpu": 6})
    b = make_runtime(redis_url, "celery@b", totals={"cpu": 4})
    try:
        snap = pool.snapshot()
        assert (snap.usage("cpu").total, snap.usage("cpu").fixed) == (6, False)
        assert [(hc.host, hc.workers) for hc in snap.hosts] == [("h1", ["celery@a", "celery@b"])]
        assert not redis_client.exists(SlotStore(redis_client).keys[0])  # no global pool written
        a.on_worker_stop()
        assert pool.snapshot().usage("cpu").total == 4
        b.on_worker_stop()
        assert pool.snapshot().usage("cpu").total == 0 and pool.snapshot().hosts == []
    finally:
        a.stop_heartbeat()
        b.stop_heartbeat()


def test_redis_restart_mid_run_reloads_scripts_and_restores_state(own_redis: RedisServer) -> None:
    rt = make_runtime(own_redis.url)
    try:
        a = rt.acquire("a", {"cpu": 2}, name="job")
        b = rt.acquire("b", {"cpu": 2}, name="job")
        assert a is not None and b is not None
        assert rt.acquire("c", {"cpu": 1}) is None

        own_redis.restart()  # no persistence: data and scripts are gone
        rt.heartbeat_once()  # totals written again, both leases registered again under their tokens

        snap = rt.store.snapshot()
        assert (snap.usage("cpu").total, snap.usage("cpu").used) == (4, 4)
        assert {(h.task_id, h.token) for h in snap.holders} == {("a", a.token), ("b", b.token)}
        assert rt.acquire("c", {"cpu": 1}) is None  # scripts reloaded (NOSCRIPT healed), and still full
        rt.release("a")
        c = rt.acquire("c", {"cpu": 1})
        assert c is not None and c.token > b.token
        snap = rt.store.snapshot()
        assert snap.usage("cpu").used == 3 == sum(h.slots["cpu"] for h in snap.holders)
    finally:
        rt.stop_heartbeat()


def test_restart_while_clients_run_keeps_counters_true(own_redis: RedisServer) -> None:
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    store = SlotStore(client)
    store.set_totals({"cpu": 6})
    stop = threading.Event()
    done = {"ok": 0, "errors": 0}

    def loop(i: int) -> None:
        s = SlotStore(redis.Redis.from_url(own_redis.url, decode_responses=True, socket_timeout=2))
        n = 0
        while not stop.is_set():
            n += 1
            try:
                res = s.acquire(f"c{i}-{n}", {"cpu": 1 + n % 2}, ttl=30)
                if res.ok:
                    s.release(f"c{i}-{n}", res.token)
                    done["ok"] += 1
            except redis.RedisError:
                done["errors"] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: done["ok"] > 50, 30, "clients to run")
        own_redis.restart()
        store.set_totals({"cpu": 6})  # what a worker's heartbeat does when the totals are missing
        before = done["ok"]
        wait_for(lambda: done["ok"] > before + 50, 30, "clients to work again after the restart")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    snap = store.snapshot()
    assert snap.usage("cpu").used == sum(h.slots.get("cpu", 0) for h in snap.holders) == 0
    client.close()


def test_fail_open_runs_ungated_and_registers_the_lease_when_redis_is_back(own_redis: RedisServer) -> None:
    rt = make_runtime(own_redis.url)
    try:
        own_redis.stop()
        h = rt.acquire("x", {"cpu": 3}, name="heavy")
        assert h is not None and h.ungated
        own_redis.start()
        assert rt.store.snapshot().holders == []  # Redis came back empty: the counters do not know about x yet
        rt.heartbeat_once()
        snap = rt.store.snapshot()
        (holder,) = snap.holders
        assert holder.task_id == "x" and holder.adopted and holder.token == h.token
        assert snap.usage("cpu").used == 3 and snap.usage("cpu").total == 4
        assert rt.acquire("y", {"cpu": 2}) is None  # the counters are true again: only 1 cpu is free
        rt.release("x")
        assert rt.store.snapshot().usage("cpu").used == 0
    finally:
        rt.stop_heartbeat()


def test_fail_closed_waits_while_redis_is_down(own_redis: RedisServer) -> None:
    rt = make_runtime(own_redis.url, fail_open=False)
    try:
        own_redis.stop()
        assert rt.acquire("x", {"cpu": 1}) is None
        own_redis.start()
        rt.heartbeat_once()
        assert rt.acquire("x", {"cpu": 1}) is not None
    finally:
        rt.stop_heartbeat()


def _hold_until_interrupted(rt: SlotRuntime, outcome: dict[str, object], started: threading.Event) -> None:
    try:
        assert rt.acquire("t", {"cpu": 4}) is not None
        started.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a task's busy loop (bounded, so a failing test cannot leave it spinning)
            time.sleep(0.001)
    except LeaseLost as exc:
        outcome["raised"] = exc


def test_lost_lease_raises_in_the_task_thread(redis_url: str, redis_client: redis.Redis) -> None:
    # the host's contribution outlives the stall (host_ttl): the pool keeps its 4 cpu, another task takes them
    rt = make_runtime(redis_url, lease_ttl=0.3, host_ttl=30.0)
    outcome: dict[str, object] = {}
    started = threading.Event()
    t = threading.Thread(target=_hold_until_interrupted, args=(rt, outcome, started), daemon=True)
    t.start()
    try:
        assert started.wait(30)
        rt.stop_heartbeat()  # the holder stalls (GC pause, partition): its lease expires and another task takes it
        other = SlotStore(redis_client, rt.store.pool)
        wait_for(lambda: other.acquire("other", {"cpu": 4}, ttl=30).ok, 10, "the stalled lease to be taken")
        rt.heartbeat_once()
        t.join(30)
        assert isinstance(outcome.get("raised"), LeaseLost)
        with pytest.raises(LeaseLost):
            rt.check("t")
        rt.release("t")
        assert other.snapshot().usage("cpu").used == 4  # the new holder keeps its slots
    finally:
        rt.stop_heartbeat()


def test_lost_lease_is_logged_with_the_log_policy(redis_url: str, redis_client: redis.Redis,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    rt = make_runtime(redis_url, lease_ttl=0.3, host_ttl=30.0, on_lost="log")
    try:
        assert rt.acquire("t", {"cpu": 4}) is not None
        rt.stop_heartbeat()
        other = SlotStore(redis_client, rt.store.pool)
        wait_for(lambda: other.acquire("other", {"cpu": 4}, ttl=30).ok, 10, "the stalled lease to be taken")
        with caplog.at_level(logging.ERROR, logger="celeryops.slots"):
            rt.heartbeat_once()
        assert "LEASE LOST" in caplog.text and rt.holdings["t"].lost
    finally:
        rt.stop_heartbeat()


def test_heartbeat_thread_renews_leases(redis_url: str, redis_client: redis.Redis) -> None:
    rt = make_runtime(redis_url, lease_ttl=0.6)
    try:
        h = rt.acquire("t", {"cpu": 4})
        assert h is not None
        other = SlotStore(redis_client, rt.store.pool)
        # 2.5 TTLs later the lease is still held: the heartbeat thread (every TTL/3) renewed it
        wait_for(lambda: (other.snapshot().holders[0].age or 0) > 1.5, 10, "2.5 TTLs to pass")
        (holder,) = other.snapshot().holders
        assert holder.task_id == "t" and not holder.expired
        assert not other.acquire("o", {"cpu": 1}, ttl=30).ok
        assert other.renew("t", h.token, 0.6, {"cpu": 4}).status == "renewed"
    finally:
        rt.stop_heartbeat()


def test_environment_contract() -> None:
    env = {"CELERYOPS_SLOTS_CPU": "48", "CELERYOPS_SLOTS_GPU": "2", "CELERYOPS_SLOTS_LEASE_TTL": "5",
           "CELERYOPS_SLOTS_REDIS_URL": "redis://slots:6379/3", "CELERYOPS_SLOTS_SCOPE": "host",
           "CELERYOPS_SLOTS_HOST": "gpu-01", "CELERYOPS_SLOTS_FAIL": "closed", "CELERYOPS_SLOTS_DETECT": "0",
           "CELERYOPS_SLOTS_RETRY_COUNTDOWN": "2", "CELERYOPS_SLOTS_STARVATION_AFTER": "7", "OTHER": "1"}
    s = settings_from_env(env)
    assert s.totals == {"cpu": 48, "gpu": 2} and s.worker_totals() == {"cpu": 48, "gpu": 2}
    assert (s.lease_ttl, s.redis_url, s.scope, s.pool, s.fail_open) == (5.0, "redis://slots:6379/3", "host",
                                                                         "host:gpu-01", False)
    assert (s.retry_countdown, s.starvation_after) == (2.0, 7.0)
    assert s.host_ttl is None and s.contribution_ttl == 5.0
    g = settings_from_env({**env, "CELERYOPS_SLOTS_SCOPE": "global", "CELERYOPS_SLOTS_HOST_TTL": "90"})
    assert (g.pool, g.host, g.contribution_ttl) == ("global", "gpu-01", 90.0)
    assert g.heartbeat_interval == pytest.approx(5.0 / 3)
    assert "host_ttl" not in g.totals
    # install() arguments win over the environment, per type
    s = settings_from_env(env, totals={"gpu": 1}, lease_ttl=9.0)
    assert s.totals == {"cpu": 48, "gpu": 1} and s.lease_ttl == 9.0
    d = settings_from_env({})
    assert (d.lease_ttl, d.redis_url, d.scope, d.pool, d.fail_open, d.retry_countdown, d.shared) == (
        60.0, None, "host", f"host:{socket.gethostname()}", True, 10.0, frozenset())
    # machine resources are the host's, shared types the fleet's; CELERYOPS_SLOTS_SCOPE=global keeps the old pool
    sh = settings_from_env({**env, "CELERYOPS_SLOTS_SHARED": " Licence, api ,"})
    assert sh.shared == {"licence", "api"} and "shared" not in sh.totals
    assert sh.split({"cpu": 2, "gpu": 1, "licence": 1}) == [("host:gpu-01", {"cpu": 2, "gpu": 1}),
                                                            ("global", {"licence": 1})]
    assert g.split({"cpu": 2, "licence": 1}) == [("global", {"cpu": 2, "licence": 1})]
    with pytest.raises(ValueError, match="CELERYOPS_SLOTS_SHARED"):
        settings_from_env({"CELERYOPS_SLOTS_SHARED": "licence,a b"})
    with pytest.raises(ValueError, match="CELERYOPS_SLOTS_CPU"):
        settings_from_env({"CELERYOPS_SLOTS_CPU": "many"})
    totals = detect_totals({"GPU": 2})
    assert totals["gpu"] == 2 and totals["cpu"] >= 1


def test_worker_side_import_pulls_in_neither_textual_nor_google() -> None:
    code = ("import sys, celeryops.slots, celeryops_harness.slotapp; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'google', 'grpc')); "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_slot_task_called_directly_is_gated_too(redis_url: str, redis_client: redis.Redis,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from celery import Celery

    from celeryops import slots

    monkeypatch.setattr("celeryops.slots.celery._settings", None)  # undone after the test, like install's effect
    monkeypatch.setattr("celeryops.slots.celery._runtime", None)
    app = Celery("direct_test", broker=redis_url, set_as_current=False)
    slots.install(app, totals={"cpu": 2}, detect=False, lease_ttl=30, host="direct-host")
    pool = SlotStore(redis_client, "host:direct-host")
    pool.set_totals({"cpu": 2})  # what worker start does

    @app.task(base=slots.SlotTask, slots={"cpu": 2}, name="direct.held")
    def held() -> int:
        return pool.snapshot().usage("cpu").used

    assert held() == 2  # inside: the 2 slots are held
    assert pool.snapshot().usage("cpu").used == 0  # released after
    pool.acquire("other", {"cpu": 1}, ttl=30)
    with pytest.raises(slots.SlotsBusy):
        held()
    slots.runtime(app).stop_heartbeat()


def test_a_task_needing_a_gpu_and_a_shared_licence_holds_both_or_neither(redis_url: str,
                                                                        redis_client: redis.Redis) -> None:
    """gpu is the host's (bound to a device), licence the fleet's (CELERYOPS_SLOTS_SHARED): one request takes both,
    the host's part first; refused in the global pool, it gives the host's slots and device back at once."""
    rt = make_runtime(redis_url, totals={"cpu": 4, "gpu": 2, "licence": 1}, shared=frozenset({"licence"}))
    host, shared = SlotStore(redis_client, "host:h1"), SlotStore(redis_client, "global")
    try:
        assert (host.snapshot().usage("gpu").total, shared.snapshot().usage("licence").total) == (2, 1)
        a = rt.acquire("a", {"gpu": 1, "licence": 1}, name="cad.render")
        assert a is not None and a.devices == {"gpu": [0]} and set(a.parts) == {"host:h1", "global"}
        assert rt.acquire("b", {"gpu": 1, "licence": 1}) is None  # no licence left
        snap = host.snapshot()
        assert snap.usage("gpu").used == 1 and [d.task_id for d in snap.devices] == ["a", None]  # b gave gpu 1 back
        assert [w.task_id for w in shared.snapshot().waiting] == ["b"]  # b waits where it was refused
        rt.heartbeat_once()  # both parts renewed
        assert {h.task_id for h in host.snapshot().holders} == {"a"} == {h.task_id for h in shared.snapshot().holders}
        rt.release("a")
        assert host.snapshot().usage("gpu").used == 0 and shared.snapshot().usage("licence").used == 0
        b = rt.acquire("b", {"gpu": 1, "licence": 1})
        assert b is not None and b.devices == {"gpu": [1]}  # freed longest ago: b gave 1 back before a gave 0
    finally:
        rt.stop_heartbeat()
