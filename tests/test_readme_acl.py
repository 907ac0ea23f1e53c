"""Issue 34, item 2: the README's ACL lines work as written. Each ``redis-cli ACL SETUSER ... $(celeryops acl ROLE
-A proj.celery:app)`` line is taken from README.md (so this breaks when the README changes) and run, as it is,
through a real ``bash -c`` and ``zsh -c`` and the real ``redis-cli`` against a private redis-server (``redis-cli``
on PATH is a two-line wrapper adding ``-p PORT``; ``$CELERY_BROKER_URL`` names another user meanwhile). Both shells
make the same users; then each user is tried: what its role may do, and what it may not (NOPERM), by the role
semantics of ``celeryops.ops.access.rules``; a real Celery worker consumes a priority task as the worker user, the
operator drains and aborts, the watcher reads the status. The same is checked without ``-A`` and with ``--queue``,
``--fleet`` and ``--results``. ``celeryops acl`` for an unknown role is one sentence, exit 2."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from celeryops.demo.standins.redis_server import RedisServer
from celeryops.ops.access.rules import PRIORITY_SEP
from celeryops_harness.taskapp import sleep
from celeryops_harness.workers import control_app, wait_for
from clihelp import cli_env, run_cli

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
LINE = re.compile(r"^redis-cli ACL SETUSER (?P<user>\S+) on '>(?P<password>[^']+)' "
                  r"\$\(celeryops acl (?P<role>\w+)(?P<args>[^)]*)\)$")
SHELLS = ("bash", "zsh")
OTHER_ENV_URL = "redis://somebody-else:secret@127.0.0.1:1/0"  # what a Django .env leaves in the shell


def readme_acl_lines() -> dict[str, str]:
    """role -> the README's line for it, from its ```sh blocks."""
    blocks = re.findall(r"^```sh\n(.*?)^```", README, flags=re.S | re.M)
    lines = [ln.strip() for b in blocks for ln in b.splitlines() if ln.startswith("redis-cli ACL SETUSER")]
    found = {m["role"]: ln for ln in lines if (m := LINE.match(ln))}
    assert len(found) == len(lines) == 3, f"the README's ACL lines changed shape: {lines}"
    return found


def parsed(line: str) -> dict[str, str]:
    """The user, password, role and ``celeryops acl`` arguments of a README ACL line."""
    m = LINE.match(line)
    assert m is not None, line
    return m.groupdict()


def proj_module(where: Path, url: str) -> None:
    """``proj.celery:app`` as the README's lines load it: two task queues, no result backend."""
    (where / "proj").mkdir()
    (where / "proj" / "__init__.py").write_text("")
    (where / "proj" / "celery.py").write_text(
        "from celery import Celery\nfrom kombu import Queue\n\n"
        f"app = Celery('proj', broker={url!r})\n"
        "app.conf.task_queues = [Queue('celery'), Queue('high')]\n")


@pytest.fixture
def shell_env(own_redis: RedisServer, tmp_path: Path) -> dict[str, Any]:
    """A working directory with ``proj``, and the environment a user's shell has: ``celeryops`` and ``redis-cli``
    (on this test's server) on PATH, $CELERY_BROKER_URL naming another user."""
    for shell in SHELLS:
        if not shutil.which(shell):
            pytest.fail(f"the README's commands are run through {shell}: run tools/ensure-test-services.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "redis-cli"
    shim.write_text(f"#!/bin/sh\nexec {shutil.which('redis-cli')} -p {own_redis.port} \"$@\"\n")
    shim.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    proj_module(work, own_redis.url)
    env = cli_env(tmp_path / "state", CELERY_BROKER_URL=OTHER_ENV_URL)
    env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return {"env": env, "cwd": work, "server": own_redis}


def run_shell(shell: str, line: str, setup: dict[str, Any]) -> None:
    done = subprocess.run([shell, "-c", line], env=setup["env"], cwd=setup["cwd"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "OK", (shell, line, done.stdout, done.stderr)


def acl_of(admin: redis.Redis, user: str) -> dict[str, Any]:
    """What ACL GETUSER says of ``user``: enabled, commands, key patterns, channel patterns (as text)."""
    info = admin.acl_getuser(user)
    assert info is not None, f"{user} was not created"

    def text(value: Any) -> Any:
        if isinstance(value, bytes):
            return value.decode("latin-1")
        return [text(v) for v in value] if isinstance(value, list) else value

    return {k: text(info[k]) for k in ("enabled", "commands", "keys", "channels")}


def allowed(client: redis.Redis, *command: str) -> bool:
    """Whether the ACL lets ``client``'s user run ``command`` (any answer but NOPERM: allowed)."""
    try:
        client.execute_command(*command)  # type: ignore[no-untyped-call]
    except redis.exceptions.NoPermissionError:
        return False
    except redis.ResponseError as exc:
        return not str(exc).startswith("NOPERM")
    return True


def as_user(server: RedisServer, user: str, password: str) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, username=user, password=password, socket_timeout=30)


def check_role(client: redis.Redis, role: str, *, queues: tuple[str, ...], fleet: str = "default",
               results: bool = False) -> None:
    """What a user made from ``celeryops acl ROLE`` may and may not do (rules.py's role semantics)."""
    ours = f"celeryops:{{{fleet}}}"
    prio = [q + PRIORITY_SEP + n for q in queues for n in ("3", "9")]
    assert allowed(client, "PING") and allowed(client, "INFO", "memory")
    assert not allowed(client, "CONFIG", "GET", "maxmemory-policy")  # no role: it would show requirepass
    assert not allowed(client, "LLEN", "another-queue") and not allowed(client, "LPUSH", queues[0] + "x", "m")
    assert not allowed(client, "LPUSH", queues[0] + PRIORITY_SEP + "x", "m")  # not a priority list
    if role == "watcher":
        for key in (*queues, *prio):
            assert allowed(client, "LLEN", key), key
            assert not allowed(client, "LPUSH", key, "m"), key
        assert allowed(client, "HGETALL", f"{ours}:status") and allowed(client, "GET", f"{ours}:lease")
        assert not allowed(client, "HSET", f"{ours}:status", "phase", "x")
        assert not allowed(client, "DEL", f"{ours}:lease") and not allowed(client, "SET", f"{ours}:fence", "1")
        assert not allowed(client, "PUBLISH", "/0.celery.pidbox", "x")  # no remote control
    elif role == "operator":
        for key in (*queues, *prio):
            assert allowed(client, "LLEN", key), key
            assert not allowed(client, "LPUSH", key, "m") and not allowed(client, "RPOP", key), key
        assert allowed(client, "HDEL", f"{ours}:lease", "probe") and allowed(client, "HSET", f"{ours}:status", "a", "b")
        assert allowed(client, "PUBLISH", "/0.celery.pidbox", "x")
        assert allowed(client, "SREM", "_kombu.binding.reply.celery.pidbox", "probe")
        assert not allowed(client, "SET", "resource:x", "1") and not allowed(client, "SADD", "_kombu.binding.x", "m")
    else:
        for key in (*queues, *prio):
            assert allowed(client, "LPUSH", key, "m") and allowed(client, "RPOP", key), key
        assert allowed(client, "GET", f"{ours}:fence") and allowed(client, "HSET", f"{ours}:fence:workers", "w", "1")
        assert not allowed(client, "SET", f"{ours}:fence", "1") and not allowed(client, "DEL", f"{ours}:lease")
        assert not allowed(client, "LPUSH", f"{ours}:x", "m")
        assert allowed(client, "SET", "celery-task-meta-x", "{}") is results


def test_the_readme_lines_make_the_same_users_in_bash_and_zsh(shell_env: dict[str, Any]) -> None:
    lines = readme_acl_lines()
    assert set(lines) == {"watcher", "operator", "worker"}
    admin = redis.Redis.from_url(shell_env["server"].url)
    made: dict[str, dict[str, Any]] = {}
    try:
        for shell in SHELLS:
            for role, line in lines.items():
                run_shell(shell, line, shell_env)
                user = parsed(line)["user"]
                made[f"{shell} {role}"] = acl_of(admin, user)
                client = as_user(shell_env["server"], user, parsed(line)["password"])
                try:
                    check_role(client, role, queues=("celery", "high"))
                finally:
                    client.close()
                admin.acl_deluser(user)
        for role in lines:
            assert made[f"bash {role}"] == made[f"zsh {role}"], role
        # the line asks no more than the exact rules (--json's args) but for the priority lists' spelling
        exact = json.loads(subprocess.run(
            [sys.executable, "-m", "celeryops", "acl", "worker", "-A", "proj.celery:app", "--json"],
            env=shell_env["env"], cwd=shell_env["cwd"], capture_output=True, text=True, timeout=60).stdout)
        assert "~high\x06\x16[0-9]*" in exact["args"] and "~high[^!-~][^!-~][0-9]*" in exact["rules"].split()
        admin.execute_command("ACL", "SETUSER", "exact", "on", ">pw", *exact["args"])
        keys_exact = [k for k in acl_of(admin, "exact")["keys"] if PRIORITY_SEP not in k]
        keys_line = [k for k in made["bash worker"]["keys"] if "[^!-~]" not in k]
        assert keys_exact == keys_line and made["bash worker"]["commands"] == acl_of(admin, "exact")["commands"]
    finally:
        admin.close()


@pytest.mark.parametrize("variant, queues, fleet, results", [
    ("", ("celery",), "default", False),
    (" --queue high --queue low --fleet blue --results", ("high", "low"), "blue", True),
    (" -A proj.celery:app --queue high --fleet blue", ("high",), "blue", False),
], ids=["no-app", "queues-fleet-results", "app-and-options"])
def test_the_line_works_for_every_role_without_the_app_and_with_options(
        shell_env: dict[str, Any], variant: str, queues: tuple[str, ...], fleet: str, results: bool) -> None:
    admin = redis.Redis.from_url(shell_env["server"].url)
    try:
        for role, line in readme_acl_lines().items():
            readme = parsed(line)
            derived = line.replace(" -A proj.celery:app)", variant + ")")
            assert parsed(derived)["args"] == variant
            for shell in SHELLS:
                user = f"{role}-{shell}"
                run_shell(shell, derived.replace(f"SETUSER {readme['user']} ", f"SETUSER {user} "), shell_env)
                client = as_user(shell_env["server"], user, readme["password"])
                try:
                    check_role(client, role, queues=queues, fleet=fleet, results=results)
                finally:
                    client.close()
    finally:
        admin.close()


@pytest.mark.slow
def test_users_made_by_the_readme_lines_do_their_jobs(shell_env: dict[str, Any], start_workers: Any,
                                                      redis_url: str, tmp_path: Path) -> None:
    """A real worker consumes a priority task as the worker user, the operator drains and aborts, the watcher
    reads the status: users made by the README's lines in bash (zsh makes the same, checked above)."""
    server: RedisServer = shell_env["server"]
    lines = readme_acl_lines()
    urls = {}
    for role, line in lines.items():
        run_shell("bash", line, shell_env)
        m = parsed(line)
        urls[role] = f"redis://{m['user']}:{m['password']}@127.0.0.1:{server.port}/0"
    record = redis.Redis.from_url(redis_url, decode_responses=True)
    control = control_app(server.url)
    env = cli_env(tmp_path / "state", CELERY_BROKER_URL=OTHER_ENV_URL)
    try:
        (worker,) = start_workers(urls["worker"], queues=["high"])
        with sleep.app.connection_for_write(server.url) as conn:
            task = sleep.apply_async(args=(0.05, "p"), queue="high", priority=9, connection=conn).id
        wait_for(lambda: record.hget(f"ct:run:{task}", "finished"), 60, "the priority task to run")

        drained = run_cli(["drain", "--broker", urls["operator"], "-Q", "high", "--interval", "0.3", "--streak", "2",
                           "--json"], env)
        assert drained.returncode == 0, drained.stdout[-2000:] + drained.stderr
        status = run_cli(["status", "--broker", urls["watcher"], "--json"], env)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["run"]["phase"] == "drained"
        aborted = run_cli(["abort", "--broker", urls["operator"], "--json"], env)
        assert aborted.returncode == 0, aborted.stdout[-2000:] + aborted.stderr

        def consuming() -> list[str]:
            replies = control.control.inspect(destination=[worker.nodename], timeout=5, limit=1).active_queues()
            return sorted(q["name"] for q in (replies or {}).get(worker.nodename) or [])

        wait_for(lambda: consuming() == ["high"], 30, "the worker to consume again")
        refused = [e for e in redis.Redis.from_url(server.url, decode_responses=True).acl_log(100)
                   if e["username"] in {"watch", "ops", "workers"} and e["object"] != "config|get"]
        assert not refused, refused
    finally:
        control.close()
        record.close()


def test_an_unknown_role_is_one_sentence() -> None:
    for args in (["acl", "admin"], ["acl"]):
        done = subprocess.run([sys.executable, "-m", "celeryops", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stdout == "", done
        assert done.stderr.count("\n") == 1 and "watcher, operator, worker" in done.stderr.replace("'", ""), done
        assert "nothing was run" in done.stderr and "Traceback" not in done.stderr
