"""Issue 30: the ``broker_safety`` verdict on a real redis-server (CONFIG GET, and INFO when an ACL user may not
run CONFIG), and the untrusted records that have no CLI row (a fence registry entry, a slot pool)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from celeryops.cli import main
from celeryops.core.untrusted import MalformedRecord
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.fence.registry import PluginWorkerInfo, listed_workers, registry_key
from celeryops.ops.fleetwide.brokersafety import RedisSafety, assess, combine, judge
from celeryops.ops.fleetwide.publish import read_events
from celeryops.slots.store import SlotStore

EVICTING = ["allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu", "volatile-random",
            "volatile-ttl"]


@pytest.fixture
def server(own_redis: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    yield client
    client.close()


@pytest.mark.parametrize("policy", EVICTING)
def test_an_evicting_policy_with_maxmemory_fails_naming_policy_and_fix(server: redis.Redis, policy: str) -> None:
    server.config_set("maxmemory", "512mb")
    server.config_set("maxmemory-policy", policy)
    verdict = assess(server, "the broker")
    assert verdict.status == "fail", verdict
    assert policy in verdict.detail and "512.0 MiB" in verdict.detail
    assert "CONFIG SET maxmemory-policy noeviction" in verdict.remedy and "managed Redis" in verdict.remedy


def test_noeviction_or_no_maxmemory_passes_and_persistence_off_warns(server: redis.Redis) -> None:
    server.config_set("maxmemory", "512mb")
    server.config_set("maxmemory-policy", "noeviction")
    ok = assess(server, "the broker")
    assert ok.status == "ok" and ok.short == "noeviction, RDB", ok  # the test server has an RDB save point
    server.config_set("maxmemory", "0")
    server.config_set("maxmemory-policy", "allkeys-lru")  # nothing to evict without a maxmemory
    assert assess(server, "the broker").status == "ok"
    server.config_set("save", "")
    off = assess(server, "the broker")
    assert off.status == "warn" and "no AOF and no RDB save point" in off.detail, off
    server.config_set("appendonly", "yes")
    assert assess(server, "the broker").short == "allkeys-lru, AOF"


def test_info_stands_in_when_config_is_refused(server: redis.Redis) -> None:
    name = f"celeryops-test-noconfig-{uuid.uuid4().hex[:8]}"
    kw = server.connection_pool.connection_kwargs
    server.execute_command("ACL", "SETUSER", name, "on", ">pw", "resetkeys", "-@all", "+info", "+ping", "+hello",
                           "+client|setname")
    user = redis.Redis(host=kw["host"], port=kw["port"], username=name, password="pw", decode_responses=True)
    try:
        server.config_set("maxmemory", "100mb")
        server.config_set("maxmemory-policy", "volatile-ttl")
        verdict = assess(user, "the broker")
        assert verdict.status == "fail" and "volatile-ttl" in verdict.detail and "read from INFO" in verdict.detail
        server.execute_command("ACL", "SETUSER", name, "-info")
        refused = assess(user, "the broker")  # neither CONFIG nor INFO: a warning naming what to allow
        assert refused.status == "warn" and "allow INFO" in refused.remedy, refused
    finally:
        user.close()
        server.execute_command("ACL", "DELUSER", name)


def test_judge_and_combine_are_pure() -> None:
    unknown = judge(RedisSafety(maxmemory=0, policy="noeviction", aof=False, rdb=None, source="info"), "R")
    assert unknown.status == "warn" and "save points are not in INFO" in unknown.detail
    bad = judge(RedisSafety(maxmemory=1, policy="allkeys-lru", aof=True, rdb=True, source="config"), "B")
    good = judge(RedisSafety(maxmemory=0, policy="noeviction", aof=True, rdb=False, source="config"), "C")
    both = combine([good, bad])
    assert both.status == "fail" and both.detail == bad.detail and combine([good]).status == "ok"
    assert combine([]).status == "ok"


def test_a_malformed_registry_entry_is_not_a_workers_word(redis_client: redis.Redis) -> None:
    assert PluginWorkerInfo.from_json("w", '{"pid": "abc", "expires_at": "soon"}') is None
    assert PluginWorkerInfo.from_json("w", '{"queues": 5}') is None
    assert PluginWorkerInfo.from_json("w", "[1, 2]") is None
    redis_client.hset(registry_key("default"), mapping={"celery@bad": '{"expires_at": "never"}', "celery@junk": "{"})
    assert listed_workers(redis_client, "default") == {}


def test_a_malformed_slot_pool_is_named(redis_client: redis.Redis) -> None:
    store = SlotStore(redis_client, "global")
    redis_client.hset(store.keys[0], mapping={"total:cpu": "lots", "used:cpu": "1"})
    with pytest.raises(MalformedRecord, match=r"slot pool at resource:\{global\}:pool .*it was not acted on"):
        store.snapshot()


def test_a_malformed_published_status_is_named_by_status_and_not_followed(redis_url: str,
                                                                          redis_client: redis.Redis,
                                                                          tmp_path: Path) -> None:
    redis_client.hset("celeryops:{default}:status", mapping={"run_id": "r-x", "phase": "draining",
                                                             "updated_at": "soon", "progress": "{bad"})
    redis_client.xadd("celeryops:{default}:events", {"run_id": "r-x", "kind": "phase", "at": "later"})
    assert read_events(redis_client, "default") == []  # a malformed entry is no event of the run
    result = CliRunner().invoke(main, ["status", "--broker", redis_url, "--state-dir", str(tmp_path)])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    lines = result.output.splitlines()
    assert lines[0] == "No run in progress on fleet default."
    assert "malformed or foreign published status at celeryops:{default}:status" in lines[1]
    assert lines[-1].startswith("Broker safety: safe:")
