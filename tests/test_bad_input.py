"""Issue 9, bad-input sweep: a table of bad inputs given to the real ``celeryops`` CLI (subprocesses) against real
parts (a private redis-server with a worker, a password-protected redis-server, a stopped one, the Cloud Run
stand-in, the registry stand-in, a real git remote).

Every row must give a non-zero exit, one ``celeryops: <sentence>`` line on stderr without a traceback (or, with
``--json``, a final JSON error event), and change nothing: the row's journal (file bytes), the Redis keys (KEYS and
DUMP, before and after the whole table) and the worker's consumers (active_queues) are compared.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celeryops.adapters.deploy.base import RolloutState
from celeryops.demo.standins.cloudrun import CloudRunStandIn
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops.ops.journal import Journal
from celeryops_harness.workers import WorkerProcess
from clihelp import cli_env, run_cli

# One worker plays the table (its module fixture runs every row): on several xdist workers it was played on each.
# The first test's setup plays all 49 rows (each CLI bounded by run_cli's 120 s): 4 minutes on a heavily loaded
# 2-core machine, so it gets more than pytest-timeout's 300 s per test.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bad-input"), pytest.mark.timeout(900)]

BRANCH = "release-1"
PASSWORD = "right-pw"
FAILED_EVENTS = ("error", "preflight_failed", "deploy_failed", "timeout")


@dataclass
class World:
    root: Path
    broker: RedisServer
    secured: RedisServer
    down_url: str
    worker: WorkerProcess
    queue: str
    standin: str
    denied: str
    registry: str
    git: GitFixture
    baseline_state: Path
    deployed_state: Path
    changed_state: Path

    def config(self, **edits: str) -> str:
        """A valid celeryops.toml; ``edits`` replace whole lines by their key (``key=None`` text drops nothing)."""
        values = {
            "broker": f'broker = "{self.broker.url}"',
            "interval": "interval = 0.3",
            "streak": "streak = 2",
            "kind": 'kind = "cloudrun-service"',
            "resource": 'resource = "worker"',
            "image": f'image = "{self.registry}/proj/worker:{{sha}}"',
            "api_endpoint": f'api_endpoint = "{self.standin}"',
            "extra": "",
        }
        values.update(edits)
        return f"""{values["broker"]}
{values["extra"]}
[drain]
{values["interval"]}
{values["streak"]}
max_wait = 60
[release]
remote = "origin"
max_age_days = 14
[[targets]]
name = "worker"
{values["kind"]}
project = "proj"
region = "europe-west1"
{values["resource"]}
{values["image"]}
{values["api_endpoint"]}
insecure = true
"""


@dataclass
class Row:
    id: str
    args: Callable[[World], list[str]]
    code: int | None = None  # the exit code owed (None: any non-zero)
    words: str = ""  # must appear in the error sentence
    config: Callable[[World], str] | None = None  # celeryops.toml text (None: the valid one)
    env: dict[str, str] = field(default_factory=dict)
    state: str = "journal"  # journal | deployed (a deploy of "worker" whose revision before is gone) | changed (one
    # whose revision no longer serves) | corrupt | none
    stdin_tty: bool = False


def _deploy(*extra: str, release: str = BRANCH) -> Callable[[World], list[str]]:
    return lambda w: ["deploy", release, "--yes", "--accept-warnings", "--json", "--repo", str(w.git.work), *extra]


def _plain(*args: str) -> Callable[[World], list[str]]:
    return lambda w: list(args)


def _drain(*extra: str) -> Callable[[World], list[str]]:
    return lambda w: ["drain", "--broker", w.broker.url, *extra]


def _rollback(*extra: str) -> Callable[[World], list[str]]:
    return lambda w: ["rollback", "--yes", "--accept-warnings", "--json", *extra]


def _second_target(w: World) -> str:
    return w.config(extra=f"""[[targets]]
name = "api"
kind = "cloudrun-service"
project = "proj"
region = "europe-west1"
resource = "api"
image = "{w.registry}/proj/api:{{sha}}"
api_endpoint = "{w.standin}"
insecure = true""")


ROWS = [
    # -- CLI arguments --------------------------------------------------------------------------------------------
    Row("negative-interval", _drain("--interval", "-1"), 2, "--interval"),
    Row("zero-interval", _drain("--interval", "0"), 2, "--interval"),
    Row("not-a-number-interval", _drain("--interval", "fast"), 2, "--interval"),
    Row("zero-streak", _drain("--streak", "0"), 2, "--streak"),
    Row("negative-max-wait", _drain("--max-wait", "-5"), 2, "--max-wait"),
    Row("unknown-flag", _drain("--no-such-flag"), 2, "--no-such-flag"),
    Row("unknown-command", _plain("frobnicate"), 2, "frobnicate"),
    Row("runs-limit-zero", _plain("runs", "--limit", "0"), 2, "--limit"),
    Row("deploy-missing-release", _plain("deploy", "--yes"), 2, "RELEASE"),
    Row("deploy-unknown-target", _deploy("--target", "wroker"), 2, "wroker"),
    Row("deploy-without-yes-no-tty", lambda w: ["deploy", BRANCH, "--repo", str(w.git.work)], 2, "--yes"),
    Row("forget-without-yes-no-tty", _drain("--forget", "celery@gone"), 2, "--yes"),
    Row("repo-does-not-exist", _deploy("--repo", "/nonexistent/checkout"), 2, "--repo"),
    Row("deploy-accept-unknown-check", _deploy("--accept-warning", "fense"), 2, "did you mean 'fence'?"),
    Row("deploy-accept-never-warning-check", _deploy("--accept-warning", "image"), 2, "never warns"),
    # -- config values --------------------------------------------------------------------------------------------
    Row("config-unknown-key", _plain("drain"), 2, "colour", config=lambda w: w.config(extra='colour = "red"')),
    Row("config-wrong-type", _plain("drain"), 2, "interval", config=lambda w: w.config(interval='interval = "fast"')),
    Row("config-negative-streak", _plain("drain"), 2, "streak", config=lambda w: w.config(streak="streak = -1")),
    Row("config-insecure-remote-endpoint", _deploy(), 2, "loopback",
        config=lambda w: w.config(api_endpoint='api_endpoint = "10.1.2.3:8080"')),
    Row("config-bad-placeholder", _deploy(), 2, "{shaa}",
        config=lambda w: w.config(image=f'image = "{w.registry}/proj/worker:{{shaa}}"')),
    Row("config-unknown-kind", _deploy(), 2, "lambda", config=lambda w: w.config(kind='kind = "lambda"')),
    Row("config-preflight-accept-unknown", _deploy(), 2, "'bogus'",
        config=lambda w: w.config(extra='[preflight]\naccept = ["bogus"]')),
    Row("config-traffic-mode", _deploy(), 2, "traffic 'all'",
        config=lambda w: w.config(api_endpoint=f'api_endpoint = "{w.standin}"\ntraffic = "all"')),
    Row("config-canary-duration", _plain("drain"), 2, "canary.max_duration",
        config=lambda w: w.config(extra='[canary]\nmax_duration = "soon"')),
    Row("config-not-toml", _plain("drain"), 2, "TOML", config=lambda w: "broker = [unclosed\n"),
    Row("config-file-missing", _plain("drain", "--config", "/nonexistent/celeryops.toml"), 2, "does not exist"),
    Row("env-wrong-type", _plain("drain"), 2, "CELERYOPS_DRAIN_INTERVAL", env={"CELERYOPS_DRAIN_INTERVAL": "soon"}),
    # -- broker URLs ----------------------------------------------------------------------------------------------
    Row("broker-wrong-scheme", lambda w: ["drain", "--broker", "htp://127.0.0.1:6379/0"], None, "htp"),
    Row("broker-unreachable-port", lambda w: ["drain", "--broker", "redis://127.0.0.1:1/0"], 4, "127.0.0.1:1"),
    Row("broker-wrong-password", lambda w: ["drain", "--broker", w.secured.url.replace(PASSWORD, "wrong-pw")], 4),
    Row("broker-no-password", lambda w: ["drain", "--broker", w.secured.url.replace(f":{PASSWORD}@", "")], 4),
    Row("broker-unreachable-json", lambda w: ["drain", "--broker", "redis://127.0.0.1:1/0", "--json"], 4),
    Row("app-not-importable", _plain("drain", "-A", "no_such_module_xyz"), 2, "no_such_module_xyz"),
    # -- celeryops doctor (issue 37): reads only; a bad flag or a broker away is one sentence --------------------
    Row("doctor-zero-grace", lambda w: ["doctor", "--broker", w.broker.url, "--grace", "0"], 2, "--grace"),
    Row("doctor-unreachable-json", lambda w: ["doctor", "--broker", "redis://127.0.0.1:1/0", "--json"], 4),
    Row("doctor-redis-down", lambda w: ["doctor", "--broker", w.down_url], 4, "Cannot reach the broker"),
    # -- Redis down -----------------------------------------------------------------------------------------------
    Row("redis-down-drain", lambda w: ["drain", "--broker", w.down_url], 4),
    Row("redis-down-deploy", _deploy(), 5, config=lambda w: w.config(broker=f'broker = "{w.down_url}"')),
    # -- branch names ---------------------------------------------------------------------------------------------
    Row("branch-missing", _deploy(release="no-such-branch"), 5),
    Row("branch-invalid-name", _deploy(release="bad..name"), None),
    # -- Cloud Run errors -----------------------------------------------------------------------------------------
    Row("cloudrun-not-found", _deploy(), 5, config=lambda w: w.config(resource='resource = "no-such-service"')),
    Row("cloudrun-permission-denied", _deploy(), 5,
        config=lambda w: w.config(api_endpoint=f'api_endpoint = "{w.denied}"')),
    # -- journal --------------------------------------------------------------------------------------------------
    Row("corrupt-journal-drain", _drain(), 1, "corrupt", state="corrupt"),
    Row("corrupt-journal-deploy", _deploy(), None, "corrupt", state="corrupt"),
    Row("corrupt-journal-abort", lambda w: ["abort", "--broker", w.broker.url], 1, "corrupt", state="corrupt"),
    Row("nothing-to-abort", lambda w: ["abort", "--broker", w.broker.url], 1, "no unfinished run"),
    Row("nothing-to-resume", lambda w: ["resume", "--broker", w.broker.url, "--json"], 1, "no unfinished run"),
    # the fleet's Redis is down: a run another machine left open cannot be seen, so "no run" is not claimed
    Row("redis-down-abort", lambda w: ["abort", "--broker", w.down_url], 4, "did not answer"),
    Row("redis-down-resume", lambda w: ["resume", "--broker", w.down_url, "--json"], 4, "did not answer"),
    # -- rollback -------------------------------------------------------------------------------------------------
    Row("rollback-nothing-deployed", _rollback(), 2, "has no deploy of target 'worker' that took effect"),
    Row("rollback-target-never-deployed", _rollback("--target", "api"), 2, "has no deploy of target 'api'",
        config=_second_target, state="deployed"),
    Row("rollback-revision-gone", _rollback(), 2, "Revision worker-00000-gon of", state="deployed"),
    # what serves is not what the recorded deploy left (deployed since from CI or the console): no two steps back
    Row("rollback-deployed-since", _rollback(), 2, "was changed since by a deploy celeryops did not record",
        state="changed"),
    Row("rollback-to-missing-revision", _rollback("--to", "worker-00099-zzz"), 2, "does not exist"),
    Row("rollback-strategy-overlap", _rollback("--strategy", "overlap"), 2, "--strategy drain"),
    Row("rollback-without-yes-no-tty", _plain("rollback"), 2, "--yes"),
    Row("rollback-permission-denied", _rollback("--to", "worker-00001-abc"), 5, "run.revisions.list",
        config=lambda w: w.config(api_endpoint=f'api_endpoint = "{w.denied}"')),
]


# -- the world ---------------------------------------------------------------------------------------------------

def _consumers(app: Celery, worker: WorkerProcess) -> list[str]:
    replies = app.control.inspect(destination=[worker.nodename], timeout=5, limit=1).active_queues() or {}
    assert worker.nodename in replies, "the worker did not answer active_queues"
    return sorted(q["name"] for q in replies[worker.nodename] or [])


def _redis_state(url: str) -> dict[str, Any]:
    """Every key with its type and value (DUMP; sets and hashes as sorted members, since their DUMP bytes depend on
    insertion history). kombu's per-client reply queues and their binding deadlines (made and refreshed by any
    remote-control reader, this test included) are not fleet state."""
    client = redis.Redis.from_url(url)
    out: dict[str, Any] = {}
    try:
        for key in sorted(client.keys("*")):
            if b"reply.celery.pidbox" in key:
                continue
            kind = client.type(key).decode()
            value: Any = client.dump(key)
            if key == b"_kombu.binding_deadlines":  # kombu's binding-expiry clock: scores move on every use
                value = sorted(m for m in client.zrange(key, 0, -1) if b"reply.celery.pidbox" not in m)
            elif kind == "set":
                value = sorted(client.smembers(key))
            elif kind == "hash":
                value = sorted(client.hgetall(key).items())
            out[f"{key!r} {kind}"] = value
        return out
    finally:
        client.close()


def _diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    added = sorted(set(after) - set(before))
    gone = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return f"added {added}, removed {gone}, changed {[(k, before[k], after[k]) for k in changed]}"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("bad-input")
    broker, secured, down = RedisServer(), RedisServer(password=PASSWORD), RedisServer()
    standin, denied = CloudRunStandIn(), CloudRunStandIn()
    registry = RegistryStandIn()
    queue = f"bad-{uuid.uuid4().hex[:6]}"
    worker = WorkerProcess(broker.url, queues=[queue], log_dir=root, env={"CELERYOPS_TEST_RECORD": broker.db_url(1)})
    try:
        broker.start()
        secured.start()
        down.start()
        down.stop()  # a Redis that was there and is down now (nothing listens on its port)
        worker.start()
        git = GitFixture(root / "git", branch=BRANCH).create(commits=2, age=timedelta(days=1))
        registry.start()
        registry.seed("proj/worker", git.tip(git.remote))
        endpoints = []
        for s in (standin, denied):
            endpoints.append(s.start())
            s.add_service("proj", "europe-west1", "worker", f"{registry.host}/proj/worker:old")
        denied.grant(["run.services.get"])  # PERMISSION_DENIED on anything else
        state = root / "baseline-state"
        with Journal(state_dir=state) as journal:  # a journal with one finished run: the rows must leave it alone
            run = journal.create_run(fleet="default", broker=broker.url, settings={"queues": [queue]})
            journal.advance(run.id, "aborted", reason="seeded by the test")
        deployed = root / "deployed-state"  # a deploy of "worker" that replaced a revision deleted since
        with Journal(state_dir=deployed) as journal:
            run = journal.create_run(fleet="default", broker=broker.url, release=BRANCH)
            gone = RolloutState(resource="worker", latest_ready_revision="worker-00000-gon").to_dict()
            serving = f"{registry.host}/proj/worker:old"  # what it left: the image that serves now
            journal.settle(journal.intend_deploy(run.id, target="worker", image=serving, previous=gone), {"ok": True})
            journal.advance(run.id, "failed", reason="seeded by the test")
        changed = root / "changed-state"  # a deploy whose revision no longer serves: deployed since by CI or console
        with Journal(state_dir=changed) as journal:
            run = journal.create_run(fleet="default", broker=broker.url, release=BRANCH)
            intent = journal.intend_deploy(run.id, target="worker", image="img:2", previous=gone)
            journal.settle(intent, {"ok": True, "revision": "worker-00007-new"})
            journal.advance(run.id, "failed", reason="seeded by the test")
        app = Celery("bad-input-control", broker=broker.url)
        worker.wait_ready(app, timeout=60)
        app.close()
        yield World(root=root, broker=broker, secured=secured, down_url=down.url, worker=worker, queue=queue,
                    standin=endpoints[0], denied=endpoints[1], registry=registry.host, git=git, baseline_state=state,
                    deployed_state=deployed, changed_state=changed)
    finally:
        worker.stop()
        for s in (standin, denied):
            s.stop()
        registry.stop()
        for r in (broker, secured, down):
            r.close()


@dataclass
class Outcome:
    row: Row
    result: subprocess.CompletedProcess[str]
    state_before: dict[str, bytes]
    state_after: dict[str, bytes]


def _play(world: World, row: Row) -> Outcome:
    here = world.root / row.id
    here.mkdir()
    state = here / "state"
    if row.state == "journal":
        shutil.copytree(world.baseline_state, state)
    elif row.state == "deployed":
        shutil.copytree(world.deployed_state, state)
    elif row.state == "changed":
        shutil.copytree(world.changed_state, state)
    elif row.state == "corrupt":
        state.mkdir()
        (state / "journal.sqlite3").write_bytes(b"this is not a sqlite database\n" * 300)
    (here / "celeryops.toml").write_text(row.config(world) if row.config else world.config())
    before = _files(here)
    env = cli_env(state, **row.env)
    result = run_cli(row.args(world), env, timeout=120, cwd=here)
    return Outcome(row, result, before, _files(here))


@pytest.fixture(scope="module")
def outcomes(world: World) -> Iterator[dict[str, Outcome]]:
    """Every row, a few at a time (they share nothing but read-only parts); Redis and consumers are compared
    around the whole table."""
    app = Celery("bad-input-control", broker=world.broker.url)
    consumers, keys = _consumers(app, world.worker), _redis_state(world.broker.url)
    secured_keys = _redis_state(world.secured.url)
    with ThreadPoolExecutor(max_workers=6) as pool:
        done = {o.row.id: o for o in pool.map(lambda row: _play(world, row), ROWS)}
    done["-consumers-"] = consumers  # type: ignore[assignment]
    done["-keys-"] = keys  # type: ignore[assignment]
    done["-secured-keys-"] = secured_keys  # type: ignore[assignment]
    yield done
    app.close()


def _error_sentence(row: Row, result: subprocess.CompletedProcess[str]) -> str:
    """The one sentence the operator gets: stderr's single ``celeryops:`` line, or the final JSON error event."""
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    if "--json" in result.args:  # scripts parse stdout: nothing but JSON objects there, one a line
        for line in result.stdout.splitlines():
            assert not line.strip() or isinstance(json.loads(line), dict), f"{row.id}: not JSON: {line!r}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if lines:
        assert len(lines) == 1, f"{row.id}: more than one line on stderr:\n{result.stderr}"
        assert lines[0].startswith("celeryops: "), f"{row.id}: {lines[0]!r}"
        return lines[0]
    events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert events, f"{row.id}: nothing on stderr and no JSON on stdout"
    final = events[-1]
    assert final.get("event") in FAILED_EVENTS, f"{row.id}: last event {final}"
    assert "\n" not in final["message"]
    return str(final["message"])


def test_table_has_enough_rows() -> None:
    assert len(ROWS) >= 30 and len({r.id for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_fails_with_one_sentence_and_changes_nothing(outcomes: dict[str, Any], row: Row) -> None:
    outcome: Outcome = outcomes[row.id]
    result = outcome.result
    assert result.returncode > 0, f"{row.id}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    if row.code is not None:
        assert result.returncode == row.code, f"{row.id}: exit {result.returncode}, not {row.code}: {result.stderr}"
    sentence = _error_sentence(row, result)
    assert row.words in sentence, f"{row.id}: {row.words!r} not in {sentence!r}"
    assert PASSWORD not in result.stdout + result.stderr
    assert outcome.state_after == outcome.state_before, f"{row.id}: the journal or config changed"


def test_no_redis_key_and_no_consumer_changed(world: World, outcomes: dict[str, Any]) -> None:
    app = Celery("bad-input-control", broker=world.broker.url)
    try:
        assert _consumers(app, world.worker) == outcomes["-consumers-"] == [world.queue]
    finally:
        app.close()
    now = _redis_state(world.broker.url)
    assert now == outcomes["-keys-"], _diff(outcomes["-keys-"], now)
    secured = _redis_state(world.secured.url)
    assert secured == outcomes["-secured-keys-"], _diff(outcomes["-secured-keys-"], secured)


# -- issue 30: a broker that may evict keys, and the fleet's records as untrusted input ----------------------------
# (own fixtures: the table's world stays as it is)

@pytest.fixture
def evicting(tmp_path: Path) -> Iterator[tuple[RedisServer, WorkerProcess]]:
    """A Redis with maxmemory 512mb and allkeys-lru (a managed Redis' default), and a worker consuming from it."""
    server = RedisServer().start()
    client = redis.Redis.from_url(server.url)
    client.config_set("maxmemory", "512mb")
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.close()
    worker = WorkerProcess(server.url, queues=["evicted"], log_dir=tmp_path,
                           env={"CELERYOPS_TEST_RECORD": server.db_url(1)})
    try:
        worker.start()
        app = Celery("bad-input-evicting", broker=server.url)
        worker.wait_ready(app, timeout=60)
        app.close()
        yield server, worker
    finally:
        worker.stop()
        server.close()


def _final_message(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert events and events[-1]["event"] in FAILED_EVENTS, events[-1:]
    return str(events[-1]["message"])


def test_evicting_broker_drain_refuses_and_stops_nothing(evicting: tuple[RedisServer, WorkerProcess],
                                                          tmp_path: Path) -> None:
    """A Redis with maxmemory and allkeys-lru: drain refuses, nothing stopped."""
    server, worker = evicting
    app = Celery("bad-input-evicting", broker=server.url)
    try:
        consumers, keys = _consumers(app, worker), _redis_state(server.url)
        result = run_cli(["drain", "--broker", server.url, "--json"], cli_env(tmp_path / "state"))
        assert result.returncode == 5, result.stdout[-2000:] + result.stderr
        message = _final_message(result)
        assert "allkeys-lru" in message and "CONFIG SET maxmemory-policy noeviction" in message, message
        assert "nothing was changed" in message
        assert _consumers(app, worker) == consumers == ["evicted"]
        now = _redis_state(server.url)
        assert now == keys, _diff(keys, now)
    finally:
        app.close()


def _run_head(fleet: str, run_id: str, **fields: str) -> dict[str, str]:
    return {"id": run_id, "fleet": fleet, "broker": "redis://h/0", "user": "mallory", "host": "elsewhere", "pid": "1",
            "created": "1", "updated": "1", "phase": "draining", "settings": "{}", **fields}


STOP_RECORD = json.dumps({"uid": "u1", "at": 1, "kind": "intent", "intent": "cancel_consumers", "settles": None,
                          "payload": {"consumers": {"*": ["q"]}}})
# (what is planted in the fleet's Redis, the command, its exit code, words of its sentence)
UNTRUSTED = {
    "journal-copy-not-json": ({"run:r-bad": _run_head("default", "r-bad")}, {"run:r-bad:records": ["{not json"]},
                              ["abort"], 1, "malformed or foreign run record at celeryops:{default}:run:r-bad"),
    "journal-copy-foreign-run": ({"run:r-one": _run_head("default", "r-two")}, {"run:r-one:records": [STOP_RECORD]},
                                 ["resume", "--json"], 1, "its head names run 'r-two', not 'r-one'"),
    "journal-copy-other-fleet": ({"run:r-x": _run_head("green", "r-x")}, {"run:r-x:records": [STOP_RECORD]},
                                 ["abort"], 1, "it is a run of fleet 'green'"),
    "journal-copy-unknown-phase": ({"run:r-p": _run_head("default", "r-p", phase="stopping-everything")},
                                   {"run:r-p:records": [STOP_RECORD]}, ["abort"], 1, "is not a run phase"),
    "lease-not-a-number": ({"lease": {"run_id": "r-l", "token": "t", "pid": "twelve", "owner": "mallory"}}, {},
                           ["drain", "--json"], 5, "malformed or foreign run lease at celeryops:{default}:lease"),
}


@pytest.mark.parametrize("case", sorted(UNTRUSTED))
def test_malformed_fleet_record_is_named_and_not_acted_on(case: str, redis_url: str, start_workers: Any,
                                                          tmp_path: Path) -> None:
    """The journal copy and the lease in Redis are input: a malformed or foreign one is named in one sentence, and
    nothing is restored or stopped on its word."""
    hashes, lists, args, code, words = UNTRUSTED[case]
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    (worker,) = start_workers(redis_url, queues=["kept"])
    app = Celery("bad-input-untrusted", broker=redis_url)
    try:
        for part, fields in hashes.items():
            client.hset(f"celeryops:{{default}}:{part}", mapping=fields)
            if part.startswith("run:"):
                client.zadd("celeryops:{default}:runs", {part.split(":", 1)[1]: 1})
        for part, items in lists.items():
            client.rpush(f"celeryops:{{default}}:{part}", *items)
        consumers, keys = _consumers(app, worker), _redis_state(redis_url)
        result = run_cli([*args, "--broker", redis_url], cli_env(tmp_path / "state"))
        assert result.returncode == code, f"{case}: exit {result.returncode}\n{result.stdout[-2000:]}{result.stderr}"
        if "--json" in args:
            sentence = _final_message(result)
        else:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith("celeryops: "), result.stderr
            sentence = lines[0]
        assert words in sentence and "it was not acted on" in sentence, sentence
        assert _consumers(app, worker) == consumers == ["kept"]
        now = _redis_state(redis_url)
        assert now == keys, _diff(keys, now)
    finally:
        app.close()
        client.close()
