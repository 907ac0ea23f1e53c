"""``celeryops autoscale`` end to end (issue 36): the real CLI, the real google-cloud-run client against the stand-in,
whose instances are real fence-plugin Celery workers, one real Redis (broker, fence, lease, journal, task records).

An idle pool goes to zero and comes back within a look of demand; a cohort is taken away only once idle and drained,
while a long task runs on another (it completes, nothing is killed); SIGTERM in the middle of a step gives the
cohort its consumers back and exits 0; a SIGKILL at a step leaves nothing held for good (``status`` says what
``abort`` does, ``abort`` and the next ``autoscale`` do it); a deploy waits for the step that holds the fleet."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis
from celery import Celery

from autoscalehelp import running, scaled_pool, start, status_json, steps_of, wait_instances
from celeryops_harness.taskapp import sleep, until
from clihelp import CliProcess, run_cli
from drainhelp import finished, runs, started
from overlaphelp import WAIT, all_finished, wait_consuming, wait_lease_orphaned

pytestmark = pytest.mark.slow


def send(redis_url: str, queue: str, task: object, *args: object, n: int = 1) -> list[str]:
    with until.app.connection_for_write(redis_url) as conn:
        return [task.apply_async(args=args, queue=queue, connection=conn).id for _ in range(n)]  # type: ignore[attr-defined]


def test_an_idle_pool_goes_to_zero_and_comes_back_on_demand(tmp_path: Path, redis_url: str, queue_name: str,
                                                            redis_client: redis.Redis,
                                                            redis_control: Celery) -> None:
    """min_instances = 0: the idle pool's only cohort is drained and taken away; three tasks sent to the empty pool
    (nobody to ask: the broker's ready count decides) bring a cohort back within a look; they run once each; the
    signal stops the autoscaler with exit 0."""
    with scaled_pool(tmp_path, redis_url, queue_name, min_instances=0, max_instances=3, tasks_per_instance=1) as pool:
        proc = start(pool)
        try:
            proc.wait_event("autoscale_step", WAIT, where=lambda e: e["step"] == "removed")
            wait_instances(pool, lambda now: not now, "the pool to run no instance")
            seen = status_json(pool)["autoscaler"]
            assert seen["alive"] and seen["target"] == "worker" and seen["state"] == "running"
            assert seen["decisions"] and seen["points"] and seen["settings"]["min_instances"] == 0
            ids = send(redis_url, pool.queue, sleep, 1.0, "demand", n=3)
            added = proc.wait_event("autoscale_step", WAIT, where=lambda e: e["step"] == "added")
            assert added["count"] == 3
            all_finished(redis_client, ids, "the three tasks to run on the new cohort")
            proc.signal(signal.SIGINT)
            assert proc.finish() == 0, proc.read_stderr()
        finally:
            proc.kill()
        assert all(runs(redis_client, t)["runs"] == 1 for t in ids)
        assert proc.events[-1]["event"] == "autoscale_stopped"
        assert pool.fence() is None
        looks = [e for e in proc.events if e["event"] == "autoscale"]
        assert looks and all(e["reason"].endswith(".") for e in looks)
        assert ("removed", pool.old) in steps_of(proc.events)
        assert status_json(pool)["autoscaler"]["state"] == "stopped"


def test_only_an_idle_cohort_is_taken_away_while_a_long_task_runs(tmp_path: Path, redis_url: str, queue_name: str,
                                                                 redis_client: redis.Redis,
                                                                 redis_control: Celery) -> None:
    """A long task and three shorter ones need two instances: a cohort is added. Once the shorter ones finished, the
    surplus instance goes: the cohort without the long task is drained and taken away, never the busy one; the
    long task completes once, nothing was killed. (The shorter ones run until the cohort is added: on a loaded
    machine the autoscaler's first look may come seconds after they were sent.)"""
    with scaled_pool(tmp_path, redis_url, queue_name, min_instances=1, max_instances=3, tasks_per_instance=2) as pool:
        long_id, = send(redis_url, pool.queue, until, "autoscale-test:long")
        short = send(redis_url, pool.queue, until, "autoscale-test:short", n=3)
        proc = start(pool)
        try:
            proc.wait_event("autoscale_step", WAIT, where=lambda e: e["step"] == "added")
            redis_client.set("autoscale-test:short", 1)
            removed = proc.wait_event("autoscale_step", WAIT * 2, where=lambda e: e["step"] == "removed")
            assert started(redis_client, [long_id]) and not finished(redis_client, [long_id])
            worker = runs(redis_client, long_id)["worker"]
            assert removed["revision"] not in worker  # the long task's cohort stayed
            wait_instances(pool, lambda now: sum(now.values()) == 1, "one instance to be left")
            redis_client.set("autoscale-test:long", 1)
            all_finished(redis_client, [long_id, *short], "every task to finish")
            proc.signal(signal.SIGTERM)
            assert proc.finish() == 0, proc.read_stderr()
        finally:
            proc.kill()
        assert all(runs(redis_client, t)["runs"] == 1 for t in [long_id, *short])
        assert pool.fence() is None
        (left,) = running(pool)
        wait_consuming(redis_control, pool.alive(left), pool.queue)


def test_sigterm_in_the_middle_of_a_drain_gives_the_cohort_back(tmp_path: Path, redis_url: str, queue_name: str,
                                                               redis_control: Celery) -> None:
    """Two idle instances, one needed: the cohort is drained (a long streak) to take one away; SIGTERM while it
    drains: its workers consume again, nothing is removed, the fence is gone, exit 0."""
    with scaled_pool(tmp_path, redis_url, queue_name, count=2, streak=20, min_instances=1,
                     tasks_per_instance=1) as pool:
        proc = start(pool)
        try:
            proc.wait_event("poll", WAIT)  # the cohort's drain polls: its workers are stopped and held
            assert pool.fence() is not None
            proc.signal(signal.SIGTERM)
            assert proc.finish() == 0, proc.read_stderr()
        finally:
            proc.kill()
        assert ("restored", pool.old) in steps_of(proc.events)
        assert not any(step == "removed" for step, _ in steps_of(proc.events))
        assert proc.events[-1]["event"] == "autoscale_stopped"
        assert running(pool) == {pool.old: 2}
        assert pool.fence() is None
        wait_consuming(redis_control, pool.alive(pool.old), pool.queue)


@pytest.mark.parametrize("kill_after", ["phase:draining", "intent:scale_pool"])
def test_a_step_killed_is_finished_or_undone_by_abort_and_the_next_autoscale(
        tmp_path: Path, redis_url: str, queue_name: str, redis_control: Celery, kill_after: str) -> None:
    """SIGKILL right after a step's record (its cohort drained and held; its pool update written ahead): the fence
    stays up, ``status`` names the open autoscale step and what recovery does; ``abort`` (phase:draining) or the
    next ``autoscale`` (scale_pool) lifts the fence and every remaining worker consumes again."""
    with scaled_pool(tmp_path, redis_url, queue_name, count=2, min_instances=1, tasks_per_instance=1) as pool:
        killed = run_cli(["autoscale", "--json"], pool.env, cwd=pool.dir, kill_after=kill_after, timeout=WAIT * 2)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert pool.fence() is not None
        status = status_json(pool)
        assert status["run"]["kind"] == "autoscale" and status["recovery"]["action"] in ("restore", "nothing")
        assert "Autoscale step" in status["recovery"]["explanation"]
        wait_lease_orphaned(pool)
        if kill_after == "phase:draining":
            aborted = run_cli(["abort", "--json"], pool.env, cwd=pool.dir)
            assert aborted.returncode == 0, aborted.stdout + aborted.stderr
            assert running(pool) == {pool.old: 2}
        else:
            proc = start(pool)
            try:
                proc.wait_event("autoscale", WAIT)
                assert pool.fence() is None or pool.fence().run_id != status["run"]["id"]
                proc.signal(signal.SIGINT)
                assert proc.finish() == 0, proc.read_stderr()
            finally:
                proc.kill()
            assert any("was interrupted" in e.get("message", "") or "pool update" in e.get("message", "")
                       for e in proc.events if e["event"] in ("notice", "autoscale_step"))
        assert pool.fence() is None
        assert status_json(pool).get("run") is None or status_json(pool)["run"]["phase"] in ("done", "aborted")
        wait_consuming(redis_control, pool.alive(), pool.queue)


def test_a_deploy_waits_for_the_step_and_the_autoscaler_goes_on_from_its_revision(
        tmp_path: Path, redis_url: str, queue_name: str, redis_control: Celery) -> None:
    """A deploy started while a step of the autoscaler holds the fleet waits for it (says so), then deploys at the
    count the step left; the autoscaler waits while the deploy holds the fleet and goes on from the new revision."""
    with scaled_pool(tmp_path, redis_url, queue_name, count=2, streak=12, min_instances=1,
                     tasks_per_instance=1) as pool:
        proc = start(pool)
        try:
            proc.wait_event("poll", WAIT)  # a step holds the fleet: its cohort drains
            deploy = CliProcess([*pool.args()[:3], "drain", *pool.args()[4:]], pool.env, cwd=pool.dir)
            try:
                deploy.wait_event("notice", WAIT, where=lambda e: "a step of the autoscaler" in e["message"])
                deploy.wait_event("deployed", WAIT * 2)
                assert deploy.finish() == 0, deploy.read_stderr()
            finally:
                deploy.kill()
            proc.wait_event("notice", WAIT, where=lambda e: "goes on from the pool as it is" in e["message"])
            proc.signal(signal.SIGINT)
            assert proc.finish() == 0, proc.read_stderr()
        finally:
            proc.kill()
        assert ("removed", pool.old) in steps_of(proc.events)  # the step ended first: 2 -> 1
        new = pool.new_revision()
        assert running(pool) == {new: 1}
        waits = [e for e in proc.events if e["event"] == "autoscale" and e["action"] == "wait"]
        assert waits and any("holds the fleet" in e["reason"] for e in waits)
        wait_consuming(redis_control, pool.alive(new), pool.queue)


def test_cloud_run_refusing_for_a_while_is_said_and_survived(tmp_path: Path, redis_url: str, queue_name: str) -> None:
    """Cloud Run answers no read of the pool for a few looks: each is one warning, nothing changes, and the loop
    goes on once it answers again (a long-running autoscaler outlives an outage)."""
    import grpc

    with scaled_pool(tmp_path, redis_url, queue_name, min_instances=1, max_instances=2, tasks_per_instance=1) as pool:
        proc = start(pool)
        try:
            proc.wait_event("autoscale", WAIT)
            pool.standin.refuse(grpc.StatusCode.PERMISSION_DENIED, "denied for a while", rpcs=("GetWorkerPool",),
                                times=3)
            said = proc.wait_event("notice", WAIT, where=lambda e: "could not look at" in e["message"])
            assert "changes nothing" in said["message"]
            proc.wait_event("autoscale", WAIT, where=lambda e: e["_at"] > said["_at"])  # it looks again
            proc.signal(signal.SIGINT)
            assert proc.finish() == 0, proc.read_stderr()
        finally:
            proc.kill()
        assert running(pool) == {pool.old: 1}


def test_a_pool_someone_else_resized_is_named_and_left_alone(tmp_path: Path, redis_url: str,
                                                             queue_name: str) -> None:
    """Someone sets the pool's count behind the autoscaler's back (the Cloud console, gcloud): every look says so in
    one sentence and the autoscaler changes nothing, although the pool is now far above what is needed."""
    with scaled_pool(tmp_path, redis_url, queue_name, min_instances=1, max_instances=4, tasks_per_instance=1,
                     idle_after=0) as pool:
        proc = start(pool)
        try:
            proc.wait_event("autoscale", WAIT, where=lambda e: e["action"] == "hold")
            with pool.standin._lock:  # what an update from elsewhere leaves: another manual count
                pool.standin._find("worker").message.scaling.manual_instance_count = 3
            left = proc.wait_event("autoscale", WAIT, where=lambda e: e["action"] == "wait")
            assert "Someone else changed Cloud Run worker pool worker" in left["reason"]
            assert "leaves it alone and changes nothing" in left["reason"]
            for _ in range(3):  # later looks too: nothing is taken away
                assert proc.wait_event("autoscale", WAIT)["action"] == "wait"
            proc.signal(signal.SIGINT)
            assert proc.finish() == 0, proc.read_stderr()
        finally:
            proc.kill()
        assert not [e for e in proc.events if e["event"] == "autoscale_step"]
