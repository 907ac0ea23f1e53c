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

from autoscalehelp import running, scaled_pool, start, steps_of, wait_instances
from celeryops_harness.taskapp import sleep, until
from drainhelp import finished, runs, started
from overlaphelp import WAIT, all_finished, wait_consuming

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


def test_only_an_idle_cohort_is_taken_away_while_a_long_task_runs(tmp_path: Path, redis_url: str, queue_name: str,
                                                                 redis_client: redis.Redis,
                                                                 redis_control: Celery) -> None:
    """A long task and three short ones need two instances: a cohort is added. Once the short ones finished, the
    surplus instance goes: the cohort without the long task is drained and taken away, never the busy one; the
    long task completes once, nothing was killed."""
    with scaled_pool(tmp_path, redis_url, queue_name, min_instances=1, max_instances=3, tasks_per_instance=2) as pool:
        long_id, = send(redis_url, pool.queue, until, "autoscale-test:long")
        short = send(redis_url, pool.queue, sleep, 2.0, "short", n=3)
        proc = start(pool)
        try:
            proc.wait_event("autoscale_step", WAIT, where=lambda e: e["step"] == "added")
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
