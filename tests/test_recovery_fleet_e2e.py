"""Issue 13, end to end: the run is held by the fleet, and the console survives its terminal. Real redis-server, real
Celery workers (the fleet of ``test_recovery_e2e``), the real CLI as subprocesses, the real console in tmux.

- The operator's machine is lost: a drain is SIGKILLed and its state dir deleted; a teammate with only the broker
  (a fresh state dir) sees the run in ``status``, and ``abort`` or ``resume`` finish it; both are refused while
  the run's owner is alive.
- The console's terminal closes (tmux kill-session: SIGHUP), or the console gets SIGTERM, mid-drain: it restores the
  consumers before it exits, and the local journal and the fleet's copy say aborted.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import redis

from celeryops.ops.journal import FleetStore
from celeryops_harness.workers import wait_for
from clihelp import CliProcess, cli_env, run_cli
from e2ehelp import SharedFleet, cli_json, journal_runs, one_sentence_error, only_run
from termhelp import Tmux, pid_alive, tmux  # noqa: F401 - the tmux fixture
from test_recovery_e2e import (  # noqa: F401 - fixtures
    FAST,
    FOREVER,
    LEASE_TTL,
    coord,
    fleet,
    fleet_name,
    recorded_stops,
    shared,
    wait_orphaned,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def owner_env(tmp_path: Path, fleet_name: str) -> dict[str, str]:  # noqa: F811
    return cli_env(tmp_path / "owner", CELERYOPS_FLEET=fleet_name, CELERYOPS_LEASE_TTL=LEASE_TTL)


@pytest.fixture
def other_env(tmp_path: Path, fleet_name: str) -> dict[str, str]:  # noqa: F811
    """A teammate on another machine: the same broker and fleet, a state dir that never saw the run."""
    return cli_env(tmp_path / "other", CELERYOPS_FLEET=fleet_name, CELERYOPS_LEASE_TTL=LEASE_TTL)


def held(coord: redis.Redis, fleet_name: str, run_id: str) -> str | None:  # noqa: F811
    """The phase of the run in the fleet's copy of the journal (None: not held)."""
    copy = FleetStore(coord, fleet_name).read(run_id)
    return copy.run.phase if copy is not None else None


def lose_machine(fleet: SharedFleet, env: dict[str, str], kill_after: str) -> str:  # noqa: F811
    """A drain SIGKILLed right after ``kill_after`` is durable, then its state dir deleted; returns the run id."""
    drain = run_cli(["drain", "--broker", fleet.url, *FAST, "--json"], env, kill_after=kill_after)
    assert drain.returncode == -signal.SIGKILL, (drain.returncode, drain.stderr)
    run_id = only_run(env).id
    shutil.rmtree(env["CELERYOPS_STATE_DIR"])
    return run_id


def test_machine_lost_mid_drain_then_status_and_abort_from_another_machine(
        fleet: SharedFleet, owner_env: dict[str, str], other_env: dict[str, str],  # noqa: F811
        coord: redis.Redis, fleet_name: str) -> None:  # noqa: F811
    run_id = lose_machine(fleet, owner_env, "phase:draining")
    # The stop was broadcast before the kill: wait for a loaded worker to act on it (the drain would re-send it).
    wait_for(lambda: fleet.consuming() == fleet.all_stopped(), 30, "the broadcast stop to land", step=0.3)
    before = cli_json(["status", "--broker", fleet.url], other_env)
    assert before["run"]["id"] == run_id and before["run"]["phase"] == "draining", before
    assert before["run"]["held_by_fleet"] is True and before["run"]["in_local_journal"] is False
    assert before["recovery"]["action"] == "restore" and before["recovery"]["restore"] == recorded_stops(fleet)

    wait_orphaned(coord, fleet_name, run_id)
    abort = run_cli(["abort", "--broker", fleet.url, "--json"], other_env)
    assert abort.returncode == 0, abort.stderr
    assert fleet.consuming() == fleet.baseline  # exactly what each worker consumed before
    ended = journal_runs(other_env["CELERYOPS_STATE_DIR"])[run_id]  # the teammate's history has the whole run
    assert ended.phase == "aborted" and ended.stopped_consumers() == {}
    assert ended.intents("cancel_consumers") and ended.intents("add_consumers")  # the owner's records, then ours
    assert held(coord, fleet_name, run_id) == "aborted"
    after = cli_json(["status", "--broker", fleet.url], other_env)
    assert after["run"] is None and after["lease"] is None, after


def test_machine_lost_mid_drain_then_resume_from_another_machine(
        fleet: SharedFleet, owner_env: dict[str, str], other_env: dict[str, str], tmp_path: Path,  # noqa: F811
        coord: redis.Redis, fleet_name: str) -> None:  # noqa: F811
    run_id = lose_machine(fleet, owner_env, "intent:cancel_consumers")  # recorded, not broadcast yet
    wait_orphaned(coord, fleet_name, run_id)
    resume = CliProcess(["resume", "--broker", fleet.url, "--json"], other_env)
    try:
        resume.wait_event("drained", 60)
        assert resume.finish() == 0
    finally:
        resume.kill()
    assert fleet.consuming() == fleet.all_stopped()  # the same run went on, drained
    assert [r.phase for r in journal_runs(other_env["CELERYOPS_STATE_DIR"]).values()] == ["drained"]
    assert held(coord, fleet_name, run_id) == "drained"  # open, parked, held by the fleet
    # A third machine undoes it: the consumers come back exactly.
    third = cli_env(tmp_path / "third", CELERYOPS_FLEET=fleet_name, CELERYOPS_LEASE_TTL=LEASE_TTL)
    assert run_cli(["abort", "--broker", fleet.url], third).returncode == 0
    assert fleet.consuming() == fleet.baseline
    assert held(coord, fleet_name, run_id) == "aborted"


def test_abort_and_resume_from_another_machine_are_refused_while_the_owner_lives(
        fleet: SharedFleet, owner_env: dict[str, str], other_env: dict[str, str],  # noqa: F811
        coord: redis.Redis, fleet_name: str) -> None:  # noqa: F811
    owner = CliProcess(["drain", "--broker", fleet.url, *FOREVER, "--json"], owner_env)
    try:
        owner.wait_event("poll", 60)
        run_id = only_run(owner_env).id
        for command in ("abort", "resume"):
            line = one_sentence_error(run_cli([command, "--broker", fleet.url], other_env))
            assert run_id in line and ("still running" in line or "alive" in line), line
            assert "nothing was" in line, line
        assert journal_runs(other_env["CELERYOPS_STATE_DIR"]) == {}  # the teammate recorded nothing
        assert fleet.consuming() == fleet.all_stopped() and owner.proc.poll() is None
        owner.signal(signal.SIGINT)
        assert owner.finish() == 130
    finally:
        owner.kill()
    assert fleet.consuming() == fleet.baseline
    assert held(coord, fleet_name, run_id) == "aborted"


# -- the console's terminal closes ------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["SIGHUP", "SIGTERM"])
def test_console_terminal_closed_mid_drain_restores_the_consumers(
        fleet: SharedFleet, owner_env: dict[str, str], coord: redis.Redis, fleet_name: str,  # noqa: F811
        tmux: Tmux, how: str) -> None:  # noqa: F811
    tmux.start(["drain", "--broker", fleet.url, *FOREVER], {**owner_env, "TERM": "xterm-256color"})

    def draining() -> bool:
        runs = journal_runs(owner_env["CELERYOPS_STATE_DIR"])
        if any(r.phase == "draining" for r in runs.values()):
            return True
        screen = tmux.screen()
        if "y Confirm" in screen:
            tmux.keys("y")  # a confirmation dialog is up (stop consumers; proceed despite warnings)
        elif not runs:
            tmux.keys("G")  # Go, once the preflight lets it
        return False

    try:
        wait_for(draining, 90, "the console's drain to start (G, then y)", step=0.5)
    except TimeoutError:
        raise AssertionError("the console's drain did not start; its screen:\n" + tmux.screen()) from None
    run = only_run(owner_env)
    wait_for(lambda: fleet.consuming() == fleet.all_stopped(), 90, "the consumers to stop", step=0.3)
    assert pid_alive(run.pid)
    if how == "SIGHUP":
        tmux.tmux("kill-session", "-t", tmux.session)  # the terminal goes away: SIGHUP
    else:
        import os

        os.kill(run.pid, signal.SIGTERM)
    wait_for(lambda: not pid_alive(run.pid), 180, f"the console to exit after {how}", step=0.3)
    assert fleet.consuming() == fleet.baseline  # restored before it exited
    ended = journal_runs(owner_env["CELERYOPS_STATE_DIR"])[run.id]
    assert ended.phase == "aborted" and ended.stopped_consumers() == {}
    assert held(coord, fleet_name, run.id) == "aborted"
