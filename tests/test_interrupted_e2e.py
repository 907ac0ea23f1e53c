"""Issue 22, end to end: the console, ``status``, ``watch`` and ``abort`` tell the truth about an interrupted run.
Real redis-server, real Celery workers running long tasks, the real CLI as subprocesses, the real console in tmux.

The operator's scenario: ``celeryops drain --json`` SIGKILLed after its first poll (a crashed CI job, a killed SSH
session), then ``celeryops`` opened on the same machine right away. The lease TTL is set far longer than any test
waits, so only the owner's death (its process gone from this host) can make the run orphaned.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celeryops.demo.standins.redis_server import RedisServer
from celeryops.ops.fleetwide.lease import read_lease
from celeryops.ops.fleetwide.publish import read_status
from celeryops_harness.workers import WorkerProcess, control_app, wait_for
from clihelp import CliProcess, cli_env, run_cli
from drainhelp import enqueue, started
from e2ehelp import active_queues, journal_runs, only_run
from termhelp import Tmux, tmux  # noqa: F401 - the tmux fixture

pytestmark = pytest.mark.slow

LONG_TTL = "3600"  # the lease would expire only after an hour: "orphaned" can only come from the owner's death
SCREEN = 60.0  # seconds for the console to show something (a loaded machine)


@pytest.fixture
def fleet(own_redis: RedisServer, start_workers: Any, queue_name: str,
          redis_client: redis.Redis) -> Iterator[tuple[str, list[WorkerProcess]]]:
    """Two workers on their own broker, each busy with a long task and holding another."""
    workers = start_workers(own_redis.url, n=2, queues=[queue_name], concurrency=1)
    ids = enqueue(own_redis.url, queue_name, 300.0, n=4)
    wait_for(lambda: len(started(redis_client, ids)) == 2, 60, "two long tasks to start")
    yield own_redis.url, workers


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return cli_env(tmp_path / "state", CELERYOPS_LEASE_TTL=LONG_TTL, TERM="xterm-256color")


def drain_killed_after_first_poll(url: str, queue: str, env: dict[str, str]) -> int:
    """The operator's drain, SIGKILLed right after its first poll; returns its pid."""
    drain = CliProcess(["drain", "--broker", url, "-Q", queue, "--interval", "1", "--streak", "3", "--max-wait",
                        "900", "--json"], env)
    try:
        drain.wait_event("poll", 90)
        drain.proc.send_signal(signal.SIGKILL)
        drain.proc.wait(30)
    finally:
        drain.kill()
    return drain.proc.pid


def status(url: str, env: dict[str, str]) -> dict[str, Any]:
    result = run_cli(["status", "--broker", url, "--json"], env)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def shows(term: Tmux, *texts: str, timeout: float = SCREEN) -> str:
    """Wait until the console's screen shows every one of ``texts``; returns the screen."""
    seen = ""

    def on_screen() -> bool:
        nonlocal seen
        seen = term.screen()
        return all(t in seen for t in texts)

    try:
        wait_for(on_screen, timeout, f"the console to show {texts}", step=0.3)
    except TimeoutError:
        raise AssertionError(f"the console never showed {texts}; its screen:\n{seen}") from None
    return seen


def test_a_drain_killed_after_its_first_poll_is_interrupted_at_once_everywhere(
        fleet: tuple[str, list[WorkerProcess]], queue_name: str, env: dict[str, str], tmux: Tmux) -> None:  # noqa: F811
    url, workers = fleet
    pid = drain_killed_after_first_poll(url, queue_name, env)
    run = only_run(env)
    assert run.phase == "draining"
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        lease = read_lease(client, "default")
        assert lease is not None and lease.pid == pid and lease.alive_ms > 0, lease  # its alive key still runs
        assert lease.orphaned and lease.dead_here  # ... but its owner is known dead: orphaned now
    finally:
        client.close()

    # status: interrupted, the phase it reached, the owner gone, what recovery would do.
    now = status(url, env)
    assert now["run"]["id"] == run.id and now["run"]["phase"] == "draining", now
    assert now["run"]["interrupted"] is True and f"pid {pid}" in now["run"]["interrupted_why"], now
    assert now["lease"]["orphaned"] is True and now["lease"]["owner_gone"] is True, now
    assert now["recovery"]["action"] == "restore"
    said = run_cli(["status", "--broker", url], env).stdout
    assert "Interrupted" in said and "is gone" in said and "orphaned" in said, said

    # The console on the same machine: the resume/abort panel at once, the phase the run reached.
    tmux.start(["--broker", url], env)
    shows(tmux, "was interrupted", run.id, "draining", f"pid {pid}", "Resume the drain", "Abort and restore")
    tmux.keys("Escape")
    home = shows(tmux, "INTERRUPTED", "reached draining", "process gone", "2 worker(s) stopped")
    assert "preflight" not in home and "No run in progress" not in home, home
    # Queue depths: the drained queue, 0 waiting (every task was taken), 0 consumers (both stopped).
    row = next((line for line in home.splitlines() if queue_name in line and "celery@" not in line), "")
    assert row.split("│")[1].split() == [queue_name, "0", "0"], home
    app = control_app(url)
    try:
        assert active_queues(app, [w.nodename for w in workers]) == {w.nodename: set() for w in workers}
    finally:
        app.close()

    # w brings the panel back; X aborts at once (no lease TTL to wait out) and restores both workers.
    tmux.keys("w")
    shows(tmux, "Abort and restore")
    tmux.keys("X")
    shows(tmux, "y Confirm")
    tmux.keys("y")
    wait_for(lambda: journal_runs(env["CELERYOPS_STATE_DIR"])[run.id].phase == "aborted", SCREEN,
             "the run to be aborted", step=0.3)
    app = control_app(url)
    try:
        assert active_queues(app, [w.nodename for w in workers]) == {w.nodename: {queue_name} for w in workers}
    finally:
        app.close()
    shows(tmux, "No run in progress")


def test_an_owner_that_dies_while_the_console_looks_opens_the_panel_at_the_next_poll(
        fleet: tuple[str, list[WorkerProcess]], queue_name: str, env: dict[str, str], tmux: Tmux) -> None:  # noqa: F811
    url, _workers = fleet
    drain = CliProcess(["drain", "--broker", url, "-Q", queue_name, "--interval", "1", "--streak", "100000",
                        "--json"], env)
    try:
        drain.wait_event("poll", 90)
        tmux.start(["--broker", url], env)
        live = shows(tmux, "RUN", "draining")
        assert "INTERRUPTED" not in live and "was interrupted" not in live, live
        drain.proc.send_signal(signal.SIGKILL)
        drain.proc.wait(30)
    finally:
        drain.kill()
    shows(tmux, "was interrupted", "draining", f"pid {drain.proc.pid}", "Resume the drain")


def test_a_run_killed_right_after_journalling_draining_is_shown_draining_not_its_published_phase(
        own_redis: RedisServer, start_workers: Any, queue_name: str, env: dict[str, str],
        tmux: Tmux) -> None:  # noqa: F811
    """Killed between the journal's ``draining`` record and the published status: the status still says the phase
    before, the journal (written ahead) says draining, and what every reader shows is the journal's phase; the
    read-only ``watch`` opens the panel too (its choices are not offered there)."""
    url = own_redis.url
    start_workers(url, n=1, queues=[queue_name])
    killed = run_cli(["drain", "--broker", url, "-Q", queue_name, "--interval", "1", "--json"], env,
                     kill_after="phase:draining")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        published = read_status(client, "default")
        assert published is not None and published.phase == "stopping", published  # one step behind
    finally:
        client.close()
    assert status(url, env)["run"]["phase"] == "draining"
    tmux.start(["watch", "--broker", url], env)
    shows(tmux, "was interrupted", "draining", "from `celeryops resume`, not in watch mode")
    tmux.keys("Escape")
    home = shows(tmux, "INTERRUPTED", "reached draining")
    assert "stopping" not in home.splitlines()[1], home
    # resume takes the dead owner's run over at once (its lease would expire only in an hour), and drains it.
    resumed = run_cli(["resume", "--broker", url, "--json"], env)
    assert resumed.returncode == 0, resumed.stderr
    assert only_run(env).phase == "drained"
    assert run_cli(["abort", "--broker", url], env).returncode == 0


# -- stranded by a broker reconnect (issue 22, item 6) --------------------------------------------------------------

def consuming(app: Any, name: str) -> list[str] | None:
    """What ``name`` consumes; None while it (or the broker, being restarted) does not answer."""
    try:
        replies = app.control.inspect(destination=[name], timeout=2.0, limit=1).active_queues() or {}
    except (redis.RedisError, OSError):
        return None
    return None if name not in replies else sorted(q["name"] for q in replies[name] or [])


def restart_and_strand(server: RedisServer, app: Any, worker: WorkerProcess) -> None:
    """Restart the broker: the plain worker reconnects, and Celery forgets the queue the restore added back."""
    server.stop()
    server.start()
    wait_for(lambda: consuming(app, worker.nodename) is not None, 90, "the worker to reconnect", step=0.5)
    assert consuming(app, worker.nodename) == [], "Celery kept the restored queue: celery/celery#987 is fixed?"


def test_a_worker_stranded_by_a_reconnect_after_the_restore_is_named_and_restored_again(
        own_redis: RedisServer, start_workers: Any, queue_name: str, env: dict[str, str],
        tmux: Tmux) -> None:  # noqa: F811
    url = own_redis.url
    (worker,) = start_workers(url, queues=[queue_name])
    assert run_cli(["drain", "--broker", url, "-Q", queue_name, "--interval", "0.3", "--streak", "2", "--json"],
                   env).returncode == 0
    aborted = run_cli(["abort", "--broker", url, "--json"], env)
    assert aborted.returncode == 0, aborted.stderr
    run = only_run(env)
    app = control_app(url)
    try:
        assert consuming(app, worker.nodename) == [queue_name]
        assert status(url, env)["stranded"] is None  # restored and consuming: nothing to say
        restart_and_strand(own_redis, app, worker)

        said = status(url, env)["stranded"]
        assert said["run"] == run.id and said["consumers"] == {worker.nodename: [queue_name]}, said
        assert "restart" in said["remedy"] and "celeryops abort" in said["remedy"]
        text = run_cli(["status", "--broker", url], env).stdout
        assert "Stranded by a broker reconnect" in text and worker.nodename in text and run.id in text, text

        # The console's home names it, and X sends the restore again.
        tmux.start(["--broker", url], env)
        shows(tmux, "Stranded by a broker reconnect", worker.nodename, run.id, "X restore again", "X Restore again")
        tmux.keys("X")
        shows(tmux, "y Confirm")
        tmux.keys("y")
        wait_for(lambda: consuming(app, worker.nodename) == [queue_name], SCREEN, "the queue back", step=0.5)
        shows(tmux, "No run in progress")

        # Once more, with `celeryops abort`: it re-sends the last restore to the worker that dropped back.
        restart_and_strand(own_redis, app, worker)
        again = run_cli(["abort", "--broker", url, "--json"], env)
        assert again.returncode == 0, again.stderr
        events = [json.loads(line) for line in again.stdout.splitlines()]
        assert [e for e in events if e["event"] == "restored"][-1]["verified"], events
        assert consuming(app, worker.nodename) == [queue_name]
        assert status(url, env)["stranded"] is None
        done = run_cli(["abort", "--broker", url], env)
        assert done.returncode == 1 and "no unfinished run" in done.stderr, done.stderr
    finally:
        app.close()
