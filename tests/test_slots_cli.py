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
