"""Issue 30, least privilege: ``celeryops acl ROLE`` prints each role's Redis ACL rules, and each role does its job
with them alone against the session's real redis-server (an ACL user per role, made from the command's output,
unique names, deleted afterwards):

- the worker: a real, fenced, slot-gated Celery worker consumes, runs a slot-gated task and honours a drain's fence;
- the operator: drain, abort and a deploy (a command target) go through;
- the watcher: ``status`` and the watch console follow the fleet; its drain is refused in one sentence naming the
  missing permission and the operator role, before anything changes.

Redis' ACL LOG then holds no refusal of these users but their ``CONFIG GET`` (the broker_safety check reads INFO
instead, and no role is given CONFIG: it would show ``requirepass``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner

from celeryops.cli import main
from celeryops.console.app import make_app
from celeryops.console.screens.home import HomeScreen
from celeryops.core.config import Config
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.fence.registry import listed_workers
from celeryops.ops.access.probe import PermissionRefused
from celeryops.ops.access.rules import KeySchema, rule_args, rules
from celeryops.ops.backend.console import open_backend
from celeryops_harness.slotapp import send, slot_sleep
from celeryops_harness.workers import control_app, wait_for
from clihelp import cli_env, run_cli

ROLES = ("watcher", "operator", "worker")


def acl_args(role: str, queue: str) -> list[str]:
    """The rules of ``role`` as ``celeryops acl ROLE --json`` gives them (the command itself, not the module)."""
    result = CliRunner().invoke(main, ["acl", role, "-Q", queue, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["event"] == "acl" and data["role"] == role and data["setuser"].startswith("ACL SETUSER <name> on")
    return list(data["args"])


def test_acl_prints_one_line_per_role_with_the_least_each_needs() -> None:
    runner = CliRunner()
    for role in ROLES:
        out = runner.invoke(main, ["acl", role], catch_exceptions=False)
        assert out.exit_code == 0 and out.output.count("\n") == 1, out.output
        assert out.output.startswith("resetkeys resetchannels -@all ")
    watcher = rule_args("watcher")
    assert not {"+publish", "+set", "+hset", "+del", "+lpush", "+sadd", "+config|get"} & set(watcher)
    # every key pattern is read-only, but the slot pools' (read by a script, whose commands are checked one by one)
    assert all(k.startswith("%R~") for k in watcher if "~" in k and k != "~resource:*")
    operator, worker = rule_args("operator"), rule_args("worker")
    assert "~celeryops:{default}:*" in operator and "%R~celery" in operator  # queues: read only
    assert "+config|get" not in operator + worker and "+flushall" not in operator + worker
    # a worker reads the fence and keeps its registry entry; it may not raise, lift or renew the fence
    assert "%R~celeryops:{default}:fence" in worker and "~celeryops:{default}:fence:workers" in worker
    assert not [k for k in worker if k.startswith("~celeryops:{default}") and k != "~celeryops:{default}:fence:workers"]
    # a queue's key pattern never reaches celeryops' own keys ("celery*" would)
    assert "~celery*" not in worker and "~celery" in worker and "~celery\x06\x16[0-9]*" in worker
    # the printed line spells the priority lists' control characters as a glob of one such byte, for a shell
    assert "~celery[^!-~][^!-~][0-9]*" in rules("worker").split() and rules("worker").isascii()
    assert "~resource:*" in worker and "&/0.celery.pidbox" in worker
    fleet = rule_args("operator", KeySchema(fleet="blue", db=3))
    assert "~celeryops:{blue}:*" in fleet and "&/3.celery.pidbox" in fleet


def release_1_deploy(tmp_path: Path, broker: str) -> tuple[Path, str]:
    """A git repository with a fresh branch release-1, and a directory whose celeryops.toml names ``broker`` and one
    command target (``true``), with a quick drain: (that directory, the repository's checkout)."""
    git = GitFixture(tmp_path / "git", branch="release-1").create(commits=1, age=timedelta(hours=1))
    here = tmp_path / "deploy"
    here.mkdir()
    (here / "celeryops.toml").write_text(
        f'broker = "{broker}"\n[drain]\ninterval = 0.3\nstreak = 2\n[release]\nremote = "origin"\n'
        '[[targets]]\nname = "worker"\nkind = "command"\ncommand = "true"\n')
    return here, str(git.work)


@pytest.fixture
def users(redis_url: str) -> Iterator[dict[str, str]]:
    """Three ACL users made from ``celeryops acl ROLE`` (unique names; deleted afterwards): role -> broker URL."""
    admin = redis.Redis.from_url(redis_url)
    queue = f"lp-{uuid.uuid4().hex[:6]}"
    tag = uuid.uuid4().hex[:8]
    names = {role: f"celeryops-test-{role}-{tag}" for role in ROLES}
    port = admin.connection_pool.connection_kwargs["port"]
    try:
        admin.execute_command("ACL", "LOG", "RESET")
        for role, name in names.items():
            admin.execute_command("ACL", "SETUSER", name, "on", ">pw-" + tag, *acl_args(role, queue))
        yield {"queue": queue, **{role: f"redis://{name}:pw-{tag}@127.0.0.1:{port}/0" for role, name in names.items()},
               **{f"{role}-name": name for role, name in names.items()}}
    finally:
        for name in names.values():
            admin.execute_command("ACL", "DELUSER", name)
        admin.close()


def refusals(admin: redis.Redis, names: set[str]) -> list[str]:
    """What ACL LOG recorded for these users (``admin`` decodes responses), but CONFIG GET (broker_safety then reads
    INFO)."""
    out = []
    for entry in admin.acl_log(200):
        if entry["username"] in names and entry["object"] != "config|get":
            out.append(f"{entry['username']}: {entry['reason']} {entry['object']}")
    return out


def consuming(app: Celery, node: str) -> list[str]:
    """The task queues ``node`` consumes, less its slot pool's wake queue (celeryops.slots.*: a drain of one named
    queue leaves it alone)."""
    replies = app.control.inspect(destination=[node], timeout=5, limit=1).active_queues() or {}
    return sorted(q["name"] for q in replies.get(node) or [] if not q["name"].startswith("celeryops.slots."))


async def watch_shows(url: str, state: Path, node: str) -> tuple[str, str]:
    """The watch console (read-only) as ``url``'s user: the live run's phase and the broker's safety it shows."""
    app = Celery("watcher", broker=url, set_as_current=False)
    backend = open_backend(app, Config(broker=url), read_only=True, fleet_display="watched", state_dir=str(state),
                           follow_interval=0.2)
    console = make_app(backend, animate=False, poll_interval=0.3)
    try:
        async with console.run_test(size=(120, 40)) as pilot:
            home = console.screen_stack[0]
            assert isinstance(home, HomeScreen)
            deadline = time.monotonic() + 60
            while not (home.fleet is not None and home.fleet.run is not None and home.fleet.broker_safety is not None
                       and node in [w.name for w in home.fleet.workers]):
                assert time.monotonic() < deadline, "the watch console never showed the run"
                await pilot.pause(0.05)
            shown = (home.fleet.run.phase, home.fleet.broker_safety.short)
            await pilot.press("q")
        return shown
    finally:
        await backend.close()
        backend.close_sync()


@pytest.mark.slow
def test_each_role_does_its_job_with_its_rules_alone(redis_url: str, users: dict[str, str], start_workers: Any,
                                                     tmp_path: Path) -> None:
    queue = users["queue"]
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    control = control_app(redis_url)
    env = cli_env(tmp_path / "state")
    try:
        # the worker: a fenced, slot-gated real Celery worker, connected as the worker user
        (worker,) = start_workers(users["worker"], queues=[queue], app="celeryops_harness.fencedslotapp",
                                  env={"CELERYOPS_SLOTS_CPU": "4", "CELERYOPS_FENCE_INTERVAL": "0.3",
                                       # the deploy below exempts this version from the fence: the worker then
                                       # stands for the new revision that a real deploy starts
                                       "CELERYOPS_VERSION": "release-1"})
        send(slot_sleep, redis_url, queue, 0.1, "as-worker")
        wait_for(lambda: "as-worker" in admin.lrange("ct:slots:order", 0, -1), 60, "the slot-gated task to run")
        assert int(admin.get("ct:slots:max") or 0) == 1

        # a worker's user may not watch: refused before the console opens, naming the watcher role
        with pytest.raises(PermissionRefused, match=r"may not read the fleet's published status .*watcher role"):
            open_backend(Celery("w", broker=users["worker"], set_as_current=False), Config(broker=users["worker"]),
                         read_only=True, fleet_display="", state_dir=str(tmp_path / "worker-watch"))

        # the watcher may not drain: refused in one sentence, nothing stopped, no key of celeryops written
        refused = run_cli(["drain", "--broker", users["watcher"], "-Q", queue, "--json"], env)
        assert refused.returncode == 5, refused.stdout + refused.stderr
        message = json.loads(refused.stdout.strip().splitlines()[-1])["message"]
        assert "may not write the fleet's run keys" in message and "operator role" in message, message
        assert "HDEL on celeryops:{default}:lease" in message and "Traceback" not in refused.stderr
        assert consuming(control, worker.nodename) == [queue]
        assert not admin.keys("celeryops:*:lease*") and not admin.keys("celeryops:*:run:*")

        # the operator drains: the worker honours the fence (holds its queue, says so in the registry)
        drained = run_cli(["drain", "--broker", users["operator"], "-Q", queue, "--interval", "0.3", "--streak", "2",
                           "--json"], env)
        assert drained.returncode == 0, drained.stdout[-2000:] + drained.stderr
        wait_for(lambda: (info := listed_workers(admin, "default").get(worker.nodename)) is not None
                 and info.state == "held" and queue in info.held_queues, 30, "the worker to hold the fence")
        assert consuming(control, worker.nodename) == []

        # the watcher follows it: status and the watch console
        status = run_cli(["status", "--broker", users["watcher"], "--json"], env)
        assert status.returncode == 0, status.stderr
        data = json.loads(status.stdout)
        assert data["run"]["phase"] == "drained" and data["broker_safety"]["status"] in ("ok", "warn"), data
        phase, safety = asyncio.run(watch_shows(users["watcher"], tmp_path / "watcher", worker.nodename))
        assert phase == "drained" and safety.startswith("noeviction"), (phase, safety)

        # the operator aborts: consumers back, the fence lifted
        aborted = run_cli(["abort", "--broker", users["operator"], "--json"], env)
        assert aborted.returncode == 0, aborted.stdout[-2000:] + aborted.stderr
        wait_for(lambda: consuming(control, worker.nodename) == [queue], 30, "the consumers to come back")

        # the operator deploys (a command target: drain, deploy, verify, fence lifted)
        here, repo = release_1_deploy(tmp_path, users["operator"])
        deployed = run_cli(["deploy", "release-1", "--yes", "--accept-warnings", "--json", "--repo", repo], env,
                           cwd=here)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr
        final = json.loads(deployed.stdout.strip().splitlines()[-1])
        assert final["event"] == "deployed" and final["exit_code"] == 0, final
        wait_for(lambda: consuming(control, worker.nodename) == [queue], 30, "the worker to consume after the deploy")
        send(slot_sleep, redis_url, queue, 0.1, "after-deploy")
        wait_for(lambda: "after-deploy" in admin.lrange("ct:slots:order", 0, -1), 60, "a task after the deploy")

        names = {users[f"{role}-name"] for role in ("watcher", "operator")}
        seen = refusals(admin, names)  # only the probes of the watcher's drain (HDEL, EVALSHA on the fence)
        watcher = users["watcher-name"]
        assert set(seen) == {f"{watcher}: command hdel", f"{watcher}: key celeryops:{{default}}:fence"}, seen
        # ... and the worker's refused watch (HLEN on the status), nothing else of the worker's
        assert not [r for r in refusals(admin, {users["worker-name"]}) if "celeryops:{default}:status" not in r]
    finally:
        control.close()
        admin.close()
