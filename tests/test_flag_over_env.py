"""Issue 34, item 1: a flag given on the command line wins over the environment, which wins over the config file,
in every command. Celery's own ``Settings.broker_url`` answers ``$CELERY_BROKER_URL`` before ``app.conf``, so a
Django ``.env`` in the shell used to replace ``--broker`` (a drain as the watcher ran as the default user).

Against a private redis-server with ACL users (``celeryops acl``'s rules for the watcher and the operator, a user
with no right at all, and one with every right), each fleet command runs as a subprocess with $CELERY_BROKER_URL
naming another user than ``--broker``: Redis sees only the flag's user (its ACL LOG has nothing of the other, and
the long-running console and watch show in CLIENT LIST as the flag's user alone). With every right in the
environment, the watcher's flag is still refused in one sentence naming its URL (exit 5), and a wrong password in
the flag is one sentence naming that URL (exit 4), with nothing stopped and no key written.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celeryops.adapters.celeryapp import pin_broker
from celeryops.commands.common import FleetSpec
from celeryops.demo.standins.cloudrun import CloudRunStandIn, standin_config
from celeryops.demo.standins.redis_server import RedisServer
from celeryops_harness.workers import control_app, wait_for
from clihelp import cli_env, run_cli
from termhelp import Tmux
from test_least_privilege import acl_args, release_1_deploy

PW = "pw-" + uuid.uuid4().hex[:6]


# -- which URL is chosen (no Redis) ----------------------------------------------------------------------------


def uri(spec: FleetSpec) -> str:
    return str(spec.celery_app().connection_for_write().as_uri(include_password=True))


def test_flag_beats_environment_beats_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flag, ours, celery, file = (f"redis://{who}:x@127.0.0.1:1/{n}" for n, who in enumerate(
        ("flag", "ours", "celery", "file")))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "celeryops.toml").write_text(f'broker = "{file}"\n')
    for var in ("CELERYOPS_BROKER", "CELERYOPS_APP", "CELERY_BROKER_URL", "CELERY_BROKER_READ_URL",
                "CELERY_BROKER_WRITE_URL"):
        monkeypatch.delenv(var, raising=False)
    assert uri(FleetSpec()) == file
    monkeypatch.setenv("CELERY_BROKER_URL", celery)
    assert uri(FleetSpec()) == celery == FleetSpec().plain_broker_url()  # the environment over the file
    monkeypatch.setenv("CELERYOPS_BROKER", ours)
    assert uri(FleetSpec()) == ours  # celeryops' own variable over Celery's
    monkeypatch.setenv("CELERY_BROKER_WRITE_URL", celery)
    monkeypatch.setenv("CELERY_BROKER_READ_URL", celery)
    spec = FleetSpec(broker=flag)
    app = spec.celery_app()
    assert uri(spec) == flag == spec.plain_broker_url()  # the flag over all of them, for reading and writing
    assert app.connection_for_read().as_uri(include_password=True) == flag == app.conf.broker_url
    with app.pool.acquire() as conn:  # what control and inspect broadcasts use
        assert conn.as_uri(include_password=True) == flag


def test_an_app_alone_reads_the_broker_as_celery_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-A`` without ``--broker`` is the fleet ``celery -A`` sees (what the workers use): $CELERY_BROKER_URL, else
    the app's; with ``--broker``, the app's settings on that broker (``celery -A M --broker URL``)."""
    (tmp_path / "flagproj.py").write_text("from celery import Celery\n"
                                          "app = Celery('p', broker='redis://app:x@127.0.0.1:1/4')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for var in ("CELERYOPS_BROKER", "CELERY_BROKER_URL"):
        monkeypatch.delenv(var, raising=False)
    assert uri(FleetSpec(app_path="flagproj:app")) == "redis://app:x@127.0.0.1:1/4"
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://env:x@127.0.0.1:1/5")
    assert uri(FleetSpec(app_path="flagproj:app")) == "redis://env:x@127.0.0.1:1/5"
    assert uri(FleetSpec(app_path="flagproj:app", broker="redis://flag:x@127.0.0.1:1/6")) == \
        "redis://flag:x@127.0.0.1:1/6"


def test_a_pinned_broker_sticks_to_a_namespaced_django_style_app(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://env@127.0.0.1:1/0")
    app = Celery("dj", set_as_current=False)
    app.config_from_object({"CELERY_BROKER_URL": "redis://settings@127.0.0.1:1/1", "CELERY_TASK_DEFAULT_QUEUE": "q"},
                           namespace="CELERY")
    pin_broker(app, "redis://flag:x@127.0.0.1:1/2")
    assert app.connection_for_write().as_uri(include_password=True) == "redis://flag:x@127.0.0.1:1/2"
    assert app.conf.task_default_queue == "q"  # the rest of the app's settings stay


def test_acl_derives_the_schema_from_the_flag_and_flags_before_the_command_count(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "state", CELERY_BROKER_URL="redis://other@127.0.0.1:1/0")
    for args in (["acl", "operator", "--broker", "redis://127.0.0.1:1/3"],
                 ["--broker", "redis://127.0.0.1:1/3", "acl", "operator"]):
        done = run_cli(args, env)
        assert done.returncode == 0 and "&/3.celery.pidbox" in done.stdout.split(), done.stdout + done.stderr
    (tmp_path / "celeryops.toml").write_text('state_dir = "from-file"\n')
    runs = run_cli(["runs"], cli_env(tmp_path / "from-env"), cwd=tmp_path)
    assert f"{tmp_path / 'from-env'}/journal" in runs.stdout, runs.stdout  # the environment over the file
    runs = run_cli(["--state-dir", str(tmp_path / "flag"), "runs"], cli_env(tmp_path / "from-env"), cwd=tmp_path)
    assert f"{tmp_path / 'flag'}/journal" in runs.stdout, runs.stdout  # a flag before the command name too
    env_less = {k: v for k, v in cli_env(tmp_path).items() if k != "CELERYOPS_STATE_DIR"}
    runs = run_cli(["runs"], env_less, cwd=tmp_path)
    assert f"{tmp_path / 'from-file'}/journal" in runs.stdout, runs.stdout


# -- what Redis sees --------------------------------------------------------------------------------------------


@pytest.fixture
def fleet(own_redis: RedisServer, start_workers: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A private Redis with the users watcher, operator (celeryops acl's rules for the queue), nobody (no right:
    anything it is used for is in ACL LOG) and everything (every right: stands for the default user); one real
    worker consuming the queue (as the default user)."""
    admin = redis.Redis.from_url(own_redis.url, decode_responses=True)
    queue = f"fe-{uuid.uuid4().hex[:6]}"
    for role in ("watcher", "operator"):
        admin.execute_command("ACL", "SETUSER", role, "on", ">" + PW, *acl_args(role, queue))
    admin.execute_command("ACL", "SETUSER", "nobody", "on", ">" + PW, "resetkeys", "resetchannels", "-@all")
    admin.execute_command("ACL", "SETUSER", "everything", "on", ">" + PW, "~*", "&*", "+@all")
    url = {who: f"redis://{who}:{PW}@127.0.0.1:{own_redis.port}/0"
           for who in ("watcher", "operator", "nobody", "everything")}
    # fenced (as the README installs it) and of release-1: the deploy below exempts that version from the fence, so
    # the worker stands for the new revision a real deploy starts
    (worker,) = start_workers(own_redis.url, queues=[queue], app="celeryops_harness.fencedslotapp",
                              env={"CELERYOPS_SLOTS_CPU": "4", "CELERYOPS_FENCE_INTERVAL": "0.3",
                                   "CELERYOPS_VERSION": "release-1"})
    control = control_app(own_redis.url)
    admin.execute_command("ACL", "LOG", "RESET")
    try:
        yield {"admin": admin, "url": url, "queue": queue, "worker": worker, "control": control,
               "server": own_redis, "masked": {k: v.replace(PW, "***") for k, v in url.items()}}
    finally:
        control.close()
        admin.close()


def consuming(f: dict[str, Any]) -> list[str]:
    """The task queues the worker consumes, less its slot pool's wake queue (a drain of one queue leaves it)."""
    node = f["worker"].nodename
    replies = f["control"].control.inspect(destination=[node], timeout=5, limit=1).active_queues() or {}
    return sorted(q["name"] for q in replies.get(node) or [] if not q["name"].startswith("celeryops.slots."))


def logged(f: dict[str, Any], user: str) -> list[str]:
    return [f"{e['reason']} {e['object']}" for e in f["admin"].acl_log(200) if e["username"] == user]


def users_connected(f: dict[str, Any]) -> set[str]:
    """The users of the connections open now, but the admin's and the worker's (the default user)."""
    return {c["user"] for c in f["admin"].client_list()} - {"default"}


def console_in_tmux(tmp_path: Path, args: list[str], env: dict[str, str]) -> Tmux:
    tmp_path.mkdir(parents=True, exist_ok=True)
    term = Tmux(tmp_path)
    term.start(args, env)
    return term


def follow_console(f: dict[str, Any], term: Tmux, user: str, name: str) -> None:
    """Until the console's connections show up as ``user`` (named ``name``), nobody else's ever; then quit."""
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while True:
        clients = [c for c in f["admin"].client_list() if c["user"] != "default"]
        seen |= {c["user"] for c in clients}
        if any(c["user"] == user and c["name"] == name for c in clients):
            break
        assert time.monotonic() < deadline, f"the console never connected as {user}: {term.screen()}"
        time.sleep(0.1)
    term.keys("q")
    wait_for(lambda: user not in users_connected(f), 30, "the console to quit")
    assert seen == {user}, seen


@pytest.mark.slow
def test_every_fleet_command_connects_as_the_flags_user_only(fleet: dict[str, Any], tmp_path: Path) -> None:
    f, url = fleet, fleet["url"]
    env = cli_env(tmp_path / "state", CELERY_BROKER_URL=url["nobody"])

    status = run_cli(["status", "--broker", url["watcher"], "--json"], env)
    assert status.returncode == 0 and json.loads(status.stdout)["broker_safety"] is not None, status.stderr
    slots = run_cli(["slots", "--broker", url["watcher"]], env)
    assert slots.returncode == 0 and f["worker"].nodename in slots.stdout, slots.stdout + slots.stderr  # its pool

    drained = run_cli(["drain", "--broker", url["operator"], "-Q", f["queue"], "--interval", "0.3", "--streak", "2",
                       "--json"], env)
    assert drained.returncode == 0, drained.stdout[-2000:] + drained.stderr
    assert consuming(f) == []
    status = run_cli(["--broker", url["watcher"], "status", "--json"], env)  # a flag before the command name
    assert json.loads(status.stdout)["run"]["phase"] == "drained", status.stdout + status.stderr
    resumed = run_cli(["resume", "--broker", url["operator"], "--json"], env)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr
    aborted = run_cli(["abort", "--broker", url["operator"], "--json"], env)
    assert aborted.returncode == 0, aborted.stdout[-2000:] + aborted.stderr
    wait_for(lambda: consuming(f) == [f["queue"]], 30, "the consumers to come back")

    # deploy: the config file names yet another user; the flag wins over it and over the environment
    here, repo = release_1_deploy(tmp_path, url["nobody"])
    deployed = run_cli(["deploy", "release-1", "--broker", url["operator"], "--yes", "--accept-warnings", "--json",
                        "--repo", repo], env, cwd=here)
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr
    wait_for(lambda: consuming(f) == [f["queue"]], 30, "the worker to consume after the deploy")

    for args, user, name in ((["watch", "--broker", url["watcher"]], "watcher", "celeryops-watch"),
                             (["--broker", url["operator"]], "operator", "celeryops-console")):
        term = console_in_tmux(tmp_path / user, args, env)
        try:
            follow_console(f, term, user, name)
        finally:
            term.close()

    assert not logged(f, "nobody"), logged(f, "nobody")  # the environment's user never did anything


def keys(f: dict[str, Any]) -> set[str]:
    return set(f["admin"].scan_iter(count=1000))


@pytest.mark.slow
def test_a_refused_flag_user_is_one_sentence_and_nothing_changes(fleet: dict[str, Any], tmp_path: Path) -> None:
    """The environment names a user with every right: the watcher's --broker is still refused (exit 5), a wrong
    password in --broker is refused (exit 4), each in one sentence naming the flag's URL, password masked; no
    consumer is cancelled and no key is written."""
    f, url, masked = fleet, fleet["url"], fleet["masked"]
    env = cli_env(tmp_path / "state", CELERY_BROKER_URL=url["everything"])
    wrong = url["operator"].replace(PW, "wrong-password")
    standin = CloudRunStandIn()
    endpoint = standin.start()
    here = tmp_path / "rollback"
    here.mkdir()
    try:
        standin.add_service("proj", "europe-west1", "worker", "registry.example/proj/worker:1", instances=0)
        revision = standin.revisions("worker")[0].name.rsplit("/", 1)[-1]
        (here / "celeryops.toml").write_text(standin_config(broker=url["everything"], endpoint=endpoint,
                                                            image="registry.example/proj/worker:{sha}"))
        before = keys(f)
        cases = [
            (["drain", "--broker", url["watcher"], "-Q", f["queue"], "--json"], 5, masked["watcher"], None),
            (["rollback", "--to", revision, "--broker", url["watcher"], "--yes", "--json"], 5, masked["watcher"],
             here),
            *((cmd, 4, wrong.replace("wrong-password", "***"), None)
              for cmd in (["drain", "--broker", wrong, "-Q", f["queue"], "--json"], ["abort", "--broker", wrong],
                          ["resume", "--broker", wrong], ["status", "--broker", wrong],
                          ["slots", "--broker", wrong])),
            (["rollback", "--to", revision, "--broker", wrong, "--yes"], 4, wrong.replace("wrong-password", "***"),
             here),
        ]
        for args, code, named, cwd in cases:
            done = run_cli(args, env, cwd=cwd)
            said = done.stderr.removeprefix("celeryops: ")
            assert done.returncode == code, (args, done.stdout[-2000:], done.stderr)
            assert said.count("\n") == 1 and named in said and "Traceback" not in said, (args, said)
            assert "everything" not in said and "wrong-password" not in done.stdout + done.stderr, (args, said)
            if "--json" in args:
                assert json.loads(done.stdout.strip().splitlines()[-1])["exit_code"] == code, done.stdout
            assert consuming(f) == [f["queue"]] and keys(f) == before, args
        assert not logged(f, "everything"), logged(f, "everything")

        # with a run open: the watcher's abort is refused as well, and the consumers stay as they are
        drained = run_cli(["drain", "--broker", url["operator"], "-Q", f["queue"], "--interval", "0.3", "--streak",
                           "2", "--json"], env)
        assert drained.returncode == 0, drained.stdout[-2000:] + drained.stderr
        for cmd in ("abort", "resume"):
            refused = run_cli([cmd, "--broker", url["watcher"]], env)
            assert refused.returncode == 5 and masked["watcher"] in refused.stderr, refused.stderr
            assert consuming(f) == []
        aborted = run_cli(["abort", "--broker", url["operator"]], env)
        assert aborted.returncode == 0, aborted.stdout + aborted.stderr
        wait_for(lambda: consuming(f) == [f["queue"]], 30, "the consumers to come back")
        assert not logged(f, "everything"), logged(f, "everything")
    finally:
        standin.stop()


@pytest.mark.slow
def test_watch_with_a_refused_flag_user_says_so_and_exits_4(fleet: dict[str, Any], tmp_path: Path) -> None:
    """The console with a wrong password in --broker (a user with every right in the environment): it closes,
    and the terminal shows one sentence naming the flag's URL; exit 4."""
    wrong = fleet["url"]["watcher"].replace(PW, "wrong-password")
    env = cli_env(tmp_path / "state", CELERY_BROKER_URL=fleet["url"]["everything"])
    term = Tmux(tmp_path)
    script = tmp_path / "watch.sh"
    exports = "".join(f"export {k}='{v}'\n" for k, v in env.items() if "'" not in v and k.isidentifier())
    script.write_text(f"#!/bin/sh\n{exports}{sys.executable} -m celeryops watch --broker '{wrong}'\n"
                      "echo \"exit code $?\"; sleep 120\n")
    script.chmod(0o755)
    try:
        started = term.tmux("-f", "/dev/null", "new-session", "-d", "-s", term.session, "-x", "120", "-y", "40",
                            str(script))
        assert started.returncode == 0, started.stderr
        wait_for(lambda: "exit code" in term.screen(), 60, "the watch console to exit")
        screen = " ".join(term.screen().split())
    finally:
        term.close()
    assert "exit code 4" in screen, screen
    assert f"Redis at {fleet['masked']['watcher']} refused the login of user 'watcher'" in screen, screen
    assert "wrong-password" not in screen and not logged(fleet, "everything")
