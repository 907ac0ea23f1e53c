"""``celeryops status`` and ``celeryops runs`` against a real redis-server and a real journal file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from celeryops.cli import main
from celeryops.demo.standins.redis_server import free_port
from celeryops.ops.fleetwide.lease import RunLease
from celeryops.ops.fleetwide.publish import Publisher
from celeryops.ops.journal import Journal, journal_path

CLEAN_ENV = {"CELERYOPS_REDIS_URL": None, "CELERY_BROKER_URL": None, "CELERYOPS_FLEET": None}


def cli(*args: str, **env: str | None) -> Result:
    return CliRunner(env={**CLEAN_ENV, **env}).invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def drained_run(state: Path) -> Iterator[str]:
    """An open drain-only run in the local journal: consumers stopped, phase drained."""
    with Journal(state_dir=state) as journal:
        run = journal.create_run(fleet="default", broker="redis://:pw@h/0", release="v7", user="alice", host="box1")
        journal.advance(run.id, "stopping")
        journal.settle(journal.intend_cancel_consumers(run.id, {"w1": ["q1"], "*": ["q1"]}, {"w1": ["q1", "q2"]}))
        journal.advance(run.id, "draining")
        journal.advance(run.id, "drained")
        yield run.id


def test_no_run_anywhere(redis_url: str, state: Path) -> None:
    result = cli("status", "--broker", redis_url, "--state-dir", str(state))
    assert result.exit_code == 0, result.output
    # the fleet's Redis is judged too (issue 30): the test Redis evicts nothing and has an RDB save point
    assert result.stdout.strip().splitlines() == [
        "No run in progress on fleet default.",
        f"Broker safety: safe: the fleet's Redis at {redis_url}: maxmemory-policy noeviction, no maxmemory, "
        "persistence RDB."]
    assert not state.exists()  # reading never creates the state dir
    data = json.loads(cli("status", "--broker", redis_url, "--state-dir", str(state), "--json").stdout)
    assert data["run"] is None and data["source"] is None and data["recovery"] is None
    assert data["broker_safety"]["status"] == "ok" and data["broker_safety"]["short"] == "noeviction, RDB"


def test_open_run_from_the_local_journal(redis_url: str, state: Path, drained_run: str) -> None:
    before = journal_path(state).read_bytes()
    result = cli("status", "--broker", redis_url, "--state-dir", str(state))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"run {drained_run} is in phase drained" in out and "alice@box1, release v7" in out
    assert "Source: the local journal" in out
    assert "Lease: not held" in out
    assert "Recovery: restore the stopped consumers" in out and "Next: celeryops abort" in out

    data = json.loads(cli("status", "--broker", redis_url, "--state-dir", str(state), "--json").stdout)
    assert data["source"] == "journal" and data["run"]["id"] == drained_run and data["run"]["phase"] == "drained"
    assert data["recovery"]["action"] == "restore"
    assert data["recovery"]["restore"] == {"*": ["q1"], "w1": ["q1"]}
    assert journal_path(state).read_bytes() == before  # status wrote nothing


def test_published_run_of_another_machine_read_by_a_read_only_user(redis_url: str, redis_client: redis.Redis,
                                                                   state: Path) -> None:
    writer = redis.Redis.from_url(redis_url)
    pub = Publisher(writer, "prod", run_id="run-remote", owner="bob", host="box2", release="v9")
    pub.phase("stopping")
    pub.phase("draining")
    pub.progress({"active": 2, "reserved": 1, "streak": 0, "required": 2, "elapsed": 6.070110549999299,
                  "remaining": 293.9298894500007})
    assert pub.flush()
    RunLease(writer, "prod", "run-remote", owner="bob", host="box2", pid=4242).acquire()
    redis_client.acl_setuser("watcher", enabled=True, passwords=["+s3cret"], keys=["*"],
                             commands=["+@read", "+ping", "+time"])
    try:
        port = redis_client.connection_pool.connection_kwargs["port"]
        url = f"redis://watcher:s3cret@127.0.0.1:{port}/0"
        result = cli("status", "--state-dir", str(state), CELERYOPS_REDIS_URL=url, CELERYOPS_FLEET="prod")
        assert result.exit_code == 0, result.output
        out = result.stdout
        assert "Fleet prod: run run-remote is in phase draining" in out and "bob@box2, release v9" in out
        assert "Source: the status published in Redis" in out
        # in words, to the second: no raw floats
        assert ("streak 0 of 2 · 2 active · 1 reserved · 6 seconds elapsed · 4 minutes and 54 seconds to max wait"
                in out), out
        assert "6.07" not in out and "293.9" not in out
        assert "Lease: run run-remote of bob@box2 (pid 4242)" in out and "alive" in out
        assert "decided from the journal on box2" in out
        assert "s3cret" not in result.output

        data = json.loads(cli("status", "--json", "--state-dir", str(state), CELERYOPS_REDIS_URL=url,
                              CELERYOPS_FLEET="prod").stdout)
        assert data["source"] == "redis" and data["run"]["in_local_journal"] is False
        assert data["run"]["progress"]["active"] == 2 and data["run"]["progress"]["remaining"] > 293
        assert data["lease"]["orphaned"] is False and data["lease"]["pid"] == 4242
    finally:
        redis_client.acl_deluser("watcher")


def test_redis_unreachable_falls_back_to_the_journal(state: Path, drained_run: str) -> None:
    dead = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    result = cli("status", "--broker", dead, "--state-dir", str(state))
    assert result.exit_code == 0, result.output
    assert f"run {drained_run} is in phase drained" in result.stdout
    assert "unreachable" in result.stdout and "local journal only" in result.stdout
    assert "hunter2" not in result.output
    data = json.loads(cli("status", "--broker", dead, "--state-dir", str(state), "--json").stdout)
    assert data["source"] == "journal" and any("unreachable" in n for n in data["notes"])
    assert data["redis_unreachable"] is True
    assert "hunter2" not in json.dumps(data)


def test_redis_unreachable_and_no_local_run_does_not_claim_the_fleet_is_idle(tmp_path: Path) -> None:
    """Another machine's run lives in the fleet's Redis: when that Redis does not answer, "no run" is only the
    local journal's word, and the headline says so."""
    dead = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    result = cli("status", "--broker", dead, "--state-dir", str(tmp_path / "empty"))
    assert result.exit_code == 0, result.output
    headline = result.stdout.splitlines()[0]
    assert headline.startswith("No run in progress in the local journal") and "did not answer" in headline
    assert "hunter2" not in result.output
    data = json.loads(cli("status", "--broker", dead, "--state-dir", str(tmp_path / "empty"), "--json").stdout)
    assert data["run"] is None and data["redis_unreachable"] is True


def test_no_fleet_given_reads_the_journal(state: Path, drained_run: str) -> None:
    result = cli("status", "--state-dir", str(state))
    assert result.exit_code == 0, result.output
    assert drained_run in result.stdout and "only the local journal was read" in result.stdout


def test_deploying_run_depends_on_the_rollout(redis_url: str, state: Path) -> None:
    with Journal(state_dir=state) as journal:
        run = journal.create_run(fleet="default", broker="redis://h")
        for phase in ("stopping", "draining", "drained"):
            journal.advance(run.id, phase)  # type: ignore[arg-type]
        journal.intend_cancel_consumers(run.id, {"*": ["q1"]})
        journal.intend_deploy(run.id, target="svc-a", image="img:2", previous={"revision": "svc-a-001"})
        journal.advance(run.id, "deploying")
    result = cli("status", "--broker", redis_url, "--state-dir", str(state))
    assert result.exit_code == 0, result.output
    assert "Recovery: depends on the rollout" in result.stdout
    assert "Next: celeryops resume | celeryops abort --restore" in result.stdout
    data = json.loads(cli("status", "--broker", redis_url, "--state-dir", str(state), "--json").stdout)
    assert data["recovery"]["action"] == "ask" and data["recovery"]["depends_on_rollout"] is True


def test_finished_published_run_is_not_current(redis_url: str, state: Path) -> None:
    pub = Publisher(redis.Redis.from_url(redis_url), "default", run_id="run-old", owner="a", host="h")
    pub.phase("aborted")
    assert pub.flush()
    result = cli("status", "--broker", redis_url, "--state-dir", str(state))
    assert result.exit_code == 0
    assert result.stdout.startswith("No run in progress on fleet default. The last published run run-old ended in "
                                    "phase aborted")


def test_runs_history(state: Path, drained_run: str) -> None:
    with Journal(state_dir=state) as journal:
        done = journal.create_run(fleet="default", broker="redis://h", release="v8")
        for phase in ("stopping", "draining", "drained", "done"):
            journal.advance(done.id, phase)  # type: ignore[arg-type]
    result = cli("runs", "--state-dir", str(state))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["RUN", "FLEET", "KIND", "RELEASE", "PHASE", "OUTCOME", "DURATION", "STARTED"]
    # one phase vocabulary (RUN_PHASES) in its own column, the outcome apart
    assert lines[1].startswith(done.id) and lines[1].split()[2:6] == ["deploy", "v8", "done", "succeeded"]
    assert lines[2].startswith(drained_run) and lines[2].split()[2:6] == ["deploy", "v7", "drained", "open"]

    data = json.loads(cli("runs", "--json", "--state-dir", str(state)).stdout)
    assert [(r["id"], r["outcome"], r["phase"]) for r in data] == [(done.id, "succeeded", "done"),
                                                                   (drained_run, None, "drained")]
    assert all(r["duration"] >= 0 for r in data)
    assert len(json.loads(cli("runs", "--json", "-n", "1", "--state-dir", str(state)).stdout)) == 1


def test_runs_without_a_journal(state: Path) -> None:
    result = cli("runs", "--state-dir", str(state))
    assert result.exit_code == 0 and result.stdout.startswith("No runs recorded in")
    assert json.loads(cli("runs", "--json", "--state-dir", str(state)).stdout) == []
    assert not state.exists()


@pytest.mark.parametrize("command", [["runs"], ["status"]])
def test_corrupt_journal_is_one_sentence_and_exit_1(state: Path, command: list[str]) -> None:
    state.mkdir(parents=True)
    journal_path(state).write_bytes(b"garbage" * 1000)
    result = cli(*command, "--state-dir", str(state))
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("celeryops: The run journal ")
    assert "corrupt" in lines[0] and "move the file aside" in lines[0]
    assert journal_path(state).read_bytes() == b"garbage" * 1000
