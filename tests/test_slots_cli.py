"""``celeryops slots``: JSON and table output from a real Redis; Redis from --redis, the env, or the broker;
bad URL / Redis down / non-Redis broker: one sentence, exit 4, no traceback, no password."""

from __future__ import annotations

import json

import pytest
import redis
from click.testing import CliRunner

from celeryops.cli import main
from celeryops.core.errors import EXIT_BROKER
from celeryops.demo.standins.redis_server import free_port
from celeryops.slots import SlotStore


@pytest.fixture
def pool(redis_client: redis.Redis) -> SlotStore:
    store = SlotStore(redis_client)
    store.set_totals({"cpu": 8, "gpu": 2})
    store.acquire("task-1", {"cpu": 4, "gpu": 1}, ttl=60, name="proj.infer", worker="celery@gpu-01")
    store.acquire("task-2", {"cpu": 6}, ttl=60, name="proj.align", worker="celery@gpu-02",
                  starvation_after=3600)  # refused: waiting
    return store


def test_json_snapshot(pool: SlotStore, redis_url: str) -> None:
    result = CliRunner().invoke(main, ["slots", "--redis", redis_url, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (p,) = data["pools"]
    assert p["pool"] == "global" and p["scope"] == "global"
    assert {t["type"]: (t["total"], t["used"], t["free"]) for t in p["types"]} == {"cpu": (8, 4, 4), "gpu": (2, 1, 1)}
    (h,) = p["holders"]
    assert (h["task_id"], h["task_name"], h["worker"], h["slots"], h["expired"]) == (
        "task-1", "proj.infer", "celery@gpu-01", {"cpu": 4, "gpu": 1}, False)
    assert h["token"] >= 1 and 0 < h["lease_remaining"] <= 60
    assert [w["task_id"] for w in p["waiting"]] == ["task-2"]
    assert p["hosts"] == [] and all(t["fixed"] for t in p["types"])


def test_hosts_adding_up_to_a_global_pool(redis_client: redis.Redis, redis_url: str) -> None:
    """JSON: each host's contribution (host, totals, workers, age, expiry) and whether a total is explicit; table: a
    row per host, and the totals marked as the sum of N hosts."""
    store = SlotStore(redis_client)
    store.contribute("gpu-01", {"cpu": 32, "gpu": 2}, ttl=60, worker="celery@gpu-01")
    store.contribute("cpu-07", {"cpu": 4}, ttl=60, worker="celery@cpu-07")
    store.set_totals({"licence": 5})
    result = CliRunner().invoke(main, ["slots", "--redis", redis_url, "--json"])
    assert result.exit_code == 0, result.output
    (p,) = json.loads(result.stdout)["pools"]
    assert {t["type"]: (t["total"], t["fixed"]) for t in p["types"]} == {
        "cpu": (36, False), "gpu": (2, False), "licence": (5, True)}
    cpu07, gpu01 = p["hosts"]
    assert (gpu01["host"], gpu01["totals"], gpu01["workers"], gpu01["expired"]) == (
        "gpu-01", {"cpu": 32, "gpu": 2}, ["celery@gpu-01"], False)
    assert cpu07["host"] == "cpu-07" and 0 <= cpu07["age"] < 60 and 0 < cpu07["expires_in"] <= 60
    table = CliRunner().invoke(main, ["slots", "--redis", redis_url])
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert any(line.split()[:2] == ["cpu", "36"] and "sum of 2 hosts" in line for line in lines), table.stdout
    assert any(line.split()[:2] == ["licence", "5"] and line.endswith("fixed") for line in lines), table.stdout
    row = next(line for line in lines if line.strip().startswith("gpu-01"))
    assert "cpu=32,gpu=2" in row and "celery@gpu-01" in row and "in " in row


def test_table_from_env_and_from_broker(pool: SlotStore, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERYOPS_SLOTS_REDIS_URL", redis_url)
    out = CliRunner().invoke(main, ["slots"])
    assert out.exit_code == 0, out.output
    assert "pool global (global)" in out.stdout
    assert "task-1" in out.stdout and "proj.infer" in out.stdout and "cpu=4,gpu=1" in out.stdout
    assert "waiting task-2" in out.stdout
    monkeypatch.delenv("CELERYOPS_SLOTS_REDIS_URL")
    via_broker = CliRunner().invoke(main, ["slots", "--broker", redis_url])
    assert via_broker.exit_code == 0, via_broker.output
    assert "pool global (global)" in via_broker.stdout and "task-1" in via_broker.stdout


def test_redis_down_is_one_sentence_exit_4_without_password() -> None:
    url = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    result = CliRunner().invoke(main, ["slots", "--redis", url])
    assert result.exit_code == EXIT_BROKER
    assert result.stderr.startswith("celeryops: Could not read slot pools from redis://:***@127.0.0.1")
    assert "s3cret" not in result.output and "Traceback" not in result.output
    assert result.stderr.count("\n") == 1


def test_bad_url_and_non_redis_broker_exit_4() -> None:
    bad = CliRunner().invoke(main, ["slots", "--redis", "http://nowhere"])
    assert bad.exit_code == EXIT_BROKER and bad.stderr.startswith("celeryops: Bad Redis URL")
    amqp = CliRunner().invoke(main, ["slots", "--broker", "amqp://guest:pw@127.0.0.1:5672//"])
    assert amqp.exit_code == EXIT_BROKER and "is not Redis" in amqp.stderr and "pw@" not in amqp.stderr


def test_empty_redis_says_so(redis_url: str) -> None:
    result = CliRunner().invoke(main, ["slots", "--redis", redis_url])
    assert result.exit_code == 0 and "No slot pools found." in result.stdout


def test_per_host_pools_with_their_devices_and_a_request_no_host_can_serve(redis_client: redis.Redis,
                                                                          redis_url: str) -> None:
    """Two host pools (a GPU host with 4 devices, a CPU host without GPU): JSON lists each device free or held by
    which task; a GPU request refused on the CPU host while the GPU host is live is only waiting; once no live host
    has 2 GPUs, it reads "no capacity anywhere" with the hosts' totals, in the table and in JSON."""
    gpu = SlotStore(redis_client, "host:gpu-01")
    gpu.contribute("gpu-01", {"cpu": 32, "gpu": 4}, ttl=60, worker="celery@gpu-01", devices={"gpu": [0, 1, 2, 3]})
    cpu = SlotStore(redis_client, "host:cpu-07")
    cpu.contribute("cpu-07", {"cpu": 4, "gpu": 0}, ttl=60, worker="celery@cpu-07")
    held = gpu.acquire("task-9", {"gpu": 2}, ttl=60, name="ml.train", worker="celery@gpu-01")
    assert held.devices == {"gpu": [0, 1]}
    cpu.acquire("task-10", {"gpu": 2}, ttl=60, name="ml.embed", worker="celery@cpu-07")  # impossible here
    result = CliRunner().invoke(main, ["slots", "--redis", redis_url, "--json"])
    assert result.exit_code == 0, result.output
    pools = {p["pool"]: p for p in json.loads(result.stdout)["pools"]}
    assert list(pools) == ["host:cpu-07", "host:gpu-01"] and pools["host:gpu-01"]["host"] == "gpu-01"
    devices = pools["host:gpu-01"]["devices"]
    assert [(d["device"], d["free"], d["task_id"], d["task_name"]) for d in devices] == [
        (0, False, "task-9", "ml.train"), (1, False, "task-9", "ml.train"), (2, True, None, ""), (3, True, None, "")]
    assert devices[0]["held_for"] >= 0 and pools["host:gpu-01"]["holders"][0]["devices"] == {"gpu": [0, 1]}
    assert pools["host:gpu-01"]["hosts"][0]["devices"] == {"gpu": [0, 1, 2, 3]}
    (w,) = pools["host:cpu-07"]["waiting"]
    assert (w["task_id"], w["no_capacity"]) == ("task-10", False) and "capacity" not in w  # gpu-01 could take it
    table = CliRunner().invoke(main, ["slots", "--redis", redis_url]).stdout
    assert "pool host:gpu-01 (host, host gpu-01)" in table
    rows = [line.split() for line in table.splitlines()]
    assert ["gpu", "0", "held", "task-9", "ml.train", "celery@gpu-01"] in [r[:6] for r in rows]
    assert ["gpu", "0", "0", "0"] in rows  # the CPU host's gpu: none
    assert ["gpu", "3", "free"] in rows

    gpu.withdraw("gpu-01", "celery@gpu-01")  # the GPU host stops: no live host has a GPU
    data = json.loads(CliRunner().invoke(main, ["slots", "--redis", redis_url, "--json"]).stdout)
    (w,) = next(p for p in data["pools"] if p["pool"] == "host:cpu-07")["waiting"]
    assert w["no_capacity"] and w["capacity"] == {"cpu-07": {"gpu": 0}, "gpu-01": {"gpu": 0}}
    table = CliRunner().invoke(main, ["slots", "--redis", redis_url]).stdout
    line = next(line for line in table.splitlines() if "waiting task-10" in line)
    assert line.endswith("no capacity anywhere (hosts: cpu-07 gpu=0, gpu-01 gpu=0)"), line
