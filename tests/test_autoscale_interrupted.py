"""``celeryops autoscale`` interrupted at the edges of a step (issue 36; what the autoscale chaos trials found): the
real CLI, the stand-in's worker pool of real fence-plugin Celery workers, one real Redis.

A step killed right after its last record leaves its lease behind, orphaned: the next autoscaler (of this machine or
a teammate's) drops it, since its run has ended, and goes on. SIGINT right after a step's first records (``created``,
``phase:stopping``) closes its run, gives the lease back, and exits 0. A deploy started while a scale-out's cohort
rolls out waits for the step and deploys."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis
from celery import Celery

from autoscalehelp import running, scaled_pool, start, status_json
from celeryops.core.namespace import fleet_key
from celeryops.ops.fleetwide.lease import read_lease
from celeryops.ops.journal import FleetStore, Journal, Run, journal_path, merge_open
from celeryops_harness.taskapp import sleep, until
from clihelp import CliProcess, run_cli
from drainhelp import runs
from overlaphelp import WAIT, Pool, all_finished, wait_consuming

pytestmark = pytest.mark.slow


def lease_of(pool: Pool) -> object:
    client = redis.Redis.from_url(pool.redis_url, decode_responses=True)
    try:
        return read_lease(client, "default")
    finally:
        client.close()


def open_runs(pool: Pool) -> list[str]:
    """The fleet's open runs as the journal says (this machine's and those the fleet's Redis holds open)."""
    state = Path(pool.env["CELERYOPS_STATE_DIR"])
    local: list[Run] = []
    if journal_path(state).exists():
        with Journal(state_dir=state, read_only=True) as journal:
            local = journal.unfinished_runs("default")
    client = redis.Redis.from_url(pool.redis_url, decode_responses=True)
    try:
        runs, _ended = merge_open(local, FleetStore(client, "default"))
    finally:
        client.close()
    return [f"{r.id} ({r.phase})" for r in runs]


@pytest.mark.parametrize("then", ["autoscale", "teammate's autoscale", "teammate's abort"])
def test_a_step_killed_after_its_last_record_leaves_no_lease_for_good(tmp_path: Path, redis_url: str,
                                                                      queue_name: str, then: str) -> None:
    """SIGKILL right after a scale-in's ``phase:done``: the step had ended (one idle instance taken away) but its
    lease stays, its process gone. The next autoscaler, or ``abort`` (from a teammate's machine: a fresh state dir,
    the run read from the fleet's copy of the journal), drops it in one sentence; the autoscaler goes on, abort exits
    0; no lease is left."""
    with scaled_pool(tmp_path, redis_url, queue_name, count=2, min_instances=1, tasks_per_instance=1) as pool:
        killed = run_cli(["autoscale", "--json"], pool.env, cwd=pool.dir, kill_after="phase:done", timeout=WAIT * 2)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert running(pool) == {pool.old: 1}
        assert lease_of(pool) is not None and not open_runs(pool)
        if then.startswith("teammate"):
            pool.env = {**pool.env, "CELERYOPS_STATE_DIR": str(tmp_path / "teammate")}
        if then.endswith("abort"):
            aborted = run_cli(["abort", "--json"], pool.env, cwd=pool.dir)
            assert aborted.returncode == 0, aborted.stdout + aborted.stderr
            assert "lease is dropped" in aborted.stdout and "had ended (done)" in aborted.stdout
            assert lease_of(pool) is None
            return
        proc = start(pool)
        try:
            said = proc.wait_event("notice", WAIT, where=lambda e: "lease is dropped" in e["message"])
            assert "had ended (done)" in said["message"]
            proc.wait_event("autoscale", WAIT, where=lambda e: e["action"] == "hold")
            proc.signal(signal.SIGINT)
            assert proc.finish() == 0, proc.read_stderr()
        finally:
            proc.kill()
        assert lease_of(pool) is None
        shown = status_json(pool).get("run")  # the dead step's published status no longer shows it scaling
        assert shown is None or shown["phase"] == "done", shown
        assert not [e for e in proc.events if e["event"] == "autoscale" and "orphaned" in e["reason"]]


def test_a_step_killed_on_another_machine_is_recovered_once_its_lease_expires(
        tmp_path: Path, redis_url: str, queue_name: str, redis_control: Celery) -> None:
    """SIGKILL in a scale-in's drain, on what looks like another machine (the lease names another host, its
    heartbeat still fresh): the next autoscaler cannot take the step over at once and waits; once the lease's
    heartbeat expired it finishes or undoes the step (rather than waiting for the orphaned lease for good)."""
    with scaled_pool(tmp_path, redis_url, queue_name, count=2, min_instances=1, tasks_per_instance=1) as pool:
        killed = run_cli(["autoscale", "--json"], pool.env, cwd=pool.dir, kill_after="phase:draining",
                         timeout=WAIT * 2)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        client = redis.Redis.from_url(pool.redis_url, decode_responses=True)
        try:  # the holder ran elsewhere and its last heartbeat was just now
            record = fleet_key("default", "lease")
            client.hset(record, "host", "another-machine")
            client.set(fleet_key("default", "lease", "alive"), client.hget(record, "token") or "", px=6000)
        finally:
            client.close()
        proc = start(pool)
        try:
            proc.wait_event("autoscale_step", WAIT, where=lambda e: e["step"] == "recovered")
            proc.wait_event("autoscale", WAIT, where=lambda e: e["action"] != "wait")
            proc.signal(signal.SIGINT)
            assert proc.finish() == 0, proc.read_stderr()
        finally:
            proc.kill()
        waits = [e["reason"] for e in proc.events if e["event"] == "autoscale" and e["action"] == "wait"]
        assert waits and "alive" in waits[0]  # it waited while the holder could still be running
        assert lease_of(pool) is None and pool.fence() is None and not open_runs(pool)
        wait_consuming(redis_control, pool.alive(), pool.queue)


@pytest.mark.parametrize("point", ["created", "phase:stopping"])
def test_sigint_right_after_a_steps_first_record_closes_its_run(tmp_path: Path, redis_url: str, queue_name: str,
                                                                redis_control: Celery, point: str) -> None:
    """SIGINT right after a scale-in's ``created`` (the lease being taken) or ``phase:stopping`` (no consumer
    stopped yet): exit 0 with the step's run closed, no lease and no fence left, nothing removed, every worker
    consuming."""
    with scaled_pool(tmp_path, redis_url, queue_name, count=2, min_instances=1, tasks_per_instance=1) as pool:
        stopped = run_cli(["autoscale", "--json"], pool.env, cwd=pool.dir, kill_after=f"SIGINT@{point}",
                          timeout=WAIT * 2)
        assert stopped.returncode == 0, stopped.stderr
        assert lease_of(pool) is None
        assert pool.fence() is None
        assert not open_runs(pool)
        assert running(pool) == {pool.old: 2}
        wait_consuming(redis_control, pool.alive(), pool.queue)


def test_a_deploy_started_while_a_cohort_rolls_out_waits_for_the_step(tmp_path: Path, redis_url: str,
                                                                       queue_name: str,
                                                                       redis_client: redis.Redis) -> None:
    """A scale-out's update takes a while to roll out; a deploy started meanwhile waits for the step (it says so)
    instead of refusing the pool that is "still rolling out", then deploys at the count in force; every task runs
    once."""
    with scaled_pool(tmp_path, redis_url, queue_name, min_instances=1, max_instances=3,
                     tasks_per_instance=1) as pool:
        pool.standin.slow_next_rollout("worker", 6)
        proc = start(pool)
        try:
            proc.wait_event("autoscale", WAIT)
            with until.app.connection_for_write(redis_url) as conn:
                ids = [sleep.apply_async(args=(1.0, "demand"), queue=pool.queue, connection=conn).id
                       for _ in range(3)]
            proc.wait_event("autoscale_step", WAIT, where=lambda e: e["step"] == "adding")
            deploy = CliProcess([*pool.args()[:3], "drain", *pool.args()[4:]], pool.env, cwd=pool.dir)
            try:
                deploy.wait_event("notice", WAIT, where=lambda e: "a step of the autoscaler" in e["message"])
                assert deploy.finish(WAIT * 2) == 0, deploy.read_stderr() + str(deploy.events[-3:])
            finally:
                deploy.kill()
            all_finished(redis_client, ids, "the tasks to run")
            proc.signal(signal.SIGINT)
            assert proc.finish() == 0, proc.read_stderr()
        finally:
            proc.kill()
        assert all(runs(redis_client, t)["runs"] == 1 for t in ids)
        assert [e for e in deploy.events if e["event"] == "deployed"]
