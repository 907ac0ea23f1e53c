"""The canary deploy of a Cloud Run worker pool end to end (issue 28): the real CLI, the Cloud Run stand-in whose
instances are real fence-plugin Celery workers, one real Redis (broker, fence, journal, task records), a steady
stream of ``work`` tasks throughout.

- a bad release (its workers fail a fifth of their tasks: ``CELERYOPS_TEST_FAIL_RATE`` on the new revision's
  instances only) is rolled back by the analysis: exit 7, the pool back on the old revision at its count, the
  canary's workers gone, every task run exactly once;
- a good release (``work`` runs alike on both revisions) is promoted: exit 0, the pool on the new revision at the
  original count, every task run exactly once.

The judge's settings are the fast ones (a look a second, 30 canary tasks at least, alpha 5 %): with 2 old
instances and 1 canary at ~20 tasks/s, a 20 % failure rate rolls back after ~10 s and a good release promotes after
~15 s (simulated with the judge alone: 300 of 300 runs each way). Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celeryops_harness.taskapp import work
from celeryops_harness.workers import wait_for
from clihelp import CliProcess
from drainhelp import runs
from overlaphelp import WAIT, Pool, Producer, all_finished, running_pool, steps, wait_consuming

pytestmark = pytest.mark.slow

#: Fast judge settings for tests: a look every second, promotion after 30 canary tasks at least (and an upper
#: bound of the increase below the default 5 % margin), alpha 5 % over the whole canary.
CANARY = {"look_interval": 1, "min_tasks": 30, "max_duration": 90, "alpha": 0.05}
BAD = {"CELERYOPS_TEST_FAIL_RATE": "0.2"}
EVERY = 0.05  # one task every 50 ms: ~20 tasks/s over the pool, a third of them on the canary
DEPLOY_WAIT = 240.0  # the whole deploy at most (a loaded machine); it takes ~20-30 s


def canary_pool(tmp_path: Path, redis_url: str, queue: str, **kw: Any) -> Any:
    return running_pool(tmp_path, redis_url, queue, strategy="canary", canary=CANARY, **kw)


def revision_of(pool: Pool, worker: str) -> str:
    return pool.workers.revision_of.get(worker, "?")


def run_deploy(pool: Pool, producer: Producer) -> tuple[int, CliProcess]:
    proc = CliProcess(pool.args(), pool.env, cwd=pool.dir)
    try:
        rc = proc.proc.wait(DEPLOY_WAIT)
        proc.finish()
    finally:
        proc.kill()
        producer.stop()
    return rc, proc


def looks(proc: CliProcess) -> list[dict[str, Any]]:
    return [e for e in proc.events if e["event"] == "canary_look"]


def named_peak(events: list[dict[str, Any]]) -> int:
    """The peak the run named before anything changed: the preflight's traffic check, which the ``planned`` step
    repeats (issue 34: it named the canary's 3 while a promotion runs the overlap's 4)."""
    traffic = next(e for e in events if e["event"] == "check" and e["id"] == "traffic" and e["status"] == "ok")
    found = re.search(r"(\d+) instances at the peak", traffic["detail"])
    assert found, traffic["detail"]
    planned = next(e for e in events if e["event"] == "overlap" and e["step"] == "planned")
    assert planned["peak"] == int(found[1]), (planned, traffic["detail"])
    return int(found[1])


def test_bad_release_is_rolled_back(tmp_path: Path, redis_url: str, queue_name: str, redis_client: redis.Redis,
                                    redis_control: Celery) -> None:
    """The canary's instance fails a fifth of its tasks: the analysis rolls it back (exit 7, outcome
    canary_rolled_back); the pool ends on its 2 old instances, the canary's worker is gone, the old ones consume,
    every task ran exactly once, and only the canary's worker failed any."""
    with canary_pool(tmp_path, redis_url, queue_name, new_env=BAD) as pool:
        old_workers = {w.nodename for w in pool.alive(pool.old)}
        producer = Producer(redis_url, pool.queue, task=work, seconds=0.02, every=EVERY)
        with producer:
            rc, proc = run_deploy(pool, producer)
        events = proc.events
        assert rc == 7, (rc, [e["event"] for e in events], proc.read_stderr()[-3000:])
        assert events[-1]["event"] == "canary_rolled_back" and events[-1]["exit_code"] == 7, events[-1]
        seen = looks(proc)
        assert seen and seen[-1]["verdict"] == "rollback", seen[-1:]
        assert all(e["verdict"] == "continue" for e in seen[:-1]), [e["verdict"] for e in seen]
        new = seen[-1]["canary"]
        assert new != pool.old and seen[-1]["baseline"] == pool.old
        assert seen[-1]["counts"]["canary"]["failed"] >= 1
        assert seen[-1]["counts"]["baseline"]["failed"] == 0
        # Rolled back, it never ran more than the peak named up front (the promotion's, which it did not reach).
        assert pool.standin.peak("worker") == pool.count + 1 < named_peak(events) == 2 * pool.count

        # The pool is back on its old revision at its count; the canary's worker is gone, the old ones consume.
        assert pool.instances() == {pool.old: pool.count}, pool.instances()
        wait_for(lambda: not pool.alive(new), WAIT, "the canary's workers to exit")
        assert {w.nodename for w in pool.alive()} == old_workers
        wait_consuming(redis_control, pool.alive(pool.old), pool.queue)
        assert pool.fence() is None

        # Every task ran exactly once (a failure is a run); only the canary's worker failed any.
        all_finished(redis_client, producer.ids, "every task to finish")
        assert all(runs(redis_client, t)["runs"] == 1 for t in producer.ids)
        failed = redis_client.lrange("ct:failed", 0, -1)
        assert failed and {revision_of(pool, runs(redis_client, t)["worker"]) for t in failed} == {new}
        # Nothing ran on the canary after the run ended (its worker stopped taking tasks at the verdict).
        end = events[-1]["_at"]
        late = [t for t in producer.ids if revision_of(pool, runs(redis_client, t)["worker"]) == new
                and runs(redis_client, t)["started"] > end]
        assert not late, late


def test_good_release_is_promoted(tmp_path: Path, redis_url: str, queue_name: str, redis_client: redis.Redis,
                                  redis_control: Celery) -> None:
    """The new revision runs ``work`` like the old one: the analysis promotes it (exit 0, outcome deployed); the
    pool ends on 2 instances of the new revision, the old workers gone, every task ran exactly once, none failed."""
    with canary_pool(tmp_path, redis_url, queue_name) as pool:
        producer = Producer(redis_url, pool.queue, task=work, seconds=0.02, every=EVERY)
        with producer:
            rc, proc = run_deploy(pool, producer)
        events = proc.events
        assert rc == 0, (rc, [e["event"] for e in events], proc.read_stderr()[-3000:])
        assert events[-1]["event"] == "deployed" and events[-1]["exit_code"] == 0, events[-1]
        seen = looks(proc)
        assert seen and seen[-1]["verdict"] == "promote", seen[-1:]
        new = seen[-1]["canary"]
        assert seen[-1]["counts"]["canary"]["completed"] >= CANARY["min_tasks"]
        assert "cut_over" in steps(events), steps(events)
        (summary,) = events[-1]["targets"]
        assert (summary["revision"], summary["previous_revision"]) == (new, pool.old)
        # The peak named before anything changed is the one the run reached: the promotion's, not the canary's.
        assert named_peak(events) == pool.standin.peak("worker") == 2 * pool.count

        assert pool.instances() == {new: pool.count}, pool.instances()
        wait_for(lambda: not pool.alive(pool.old), WAIT, "the old revision's workers to exit")
        wait_consuming(redis_control, pool.alive(new), pool.queue)
        assert pool.fence() is None

        all_finished(redis_client, producer.ids, "every task to finish")
        assert all(runs(redis_client, t)["runs"] == 1 for t in producer.ids)
        assert redis_client.llen("ct:failed") == 0


def test_no_verdict_pauses_then_resume_judges_on_and_abort_takes_the_canary_away(
        tmp_path: Path, redis_url: str, queue_name: str, redis_client: redis.Redis, redis_control: Celery) -> None:
    """A canary that cannot reach a verdict within max_duration (it would need more tasks than it gets) is never
    promoted: the headless deploy ends exit 8 with both revisions consuming and the run open. ``resume`` judges it
    for another max_duration from the recorded counts (its looks go on numbering, its counts only grow) and ends
    exit 8 again; ``abort`` takes the canary away: the pool back on its old revision, every task run once."""
    slow = {**CANARY, "min_tasks": 100_000, "max_duration": 4}
    with running_pool(tmp_path, redis_url, queue_name, strategy="canary", canary=slow) as pool:
        producer = Producer(redis_url, pool.queue, task=work, seconds=0.02, every=EVERY)
        with producer:
            proc = CliProcess(pool.args(), pool.env, cwd=pool.dir)
            try:
                assert proc.proc.wait(DEPLOY_WAIT) == 8, proc.read_stderr()[-3000:]
                proc.finish()
            finally:
                proc.kill()
            first = looks(proc)
            assert first[-1]["verdict"] == "inconclusive" and proc.events[-1]["event"] == "canary_paused"
            new = first[-1]["canary"]
            assert pool.instances() == {pool.old: pool.count, new: 1}  # both consume, nothing promoted

            resumed = CliProcess(["resume", "--json"], pool.env, cwd=pool.dir)
            try:
                assert resumed.proc.wait(DEPLOY_WAIT) == 8, resumed.read_stderr()[-3000:]
                resumed.finish()
            finally:
                resumed.kill()
            again = looks(resumed)
            assert again[0]["look"] == first[-1]["look"] + 1 and again[-1]["verdict"] == "inconclusive"
            assert again[-1]["counts"]["canary"]["completed"] >= first[-1]["counts"]["canary"]["completed"]

            aborted = CliProcess(["abort", "--json"], pool.env, cwd=pool.dir)
            try:
                assert aborted.proc.wait(DEPLOY_WAIT) == 0, aborted.read_stderr()[-3000:]
                aborted.finish()
            finally:
                aborted.kill()
        assert pool.instances() == {pool.old: pool.count}, pool.instances()
        wait_for(lambda: not pool.alive(new), WAIT, "the canary's workers to exit")
        wait_consuming(redis_control, pool.alive(pool.old), pool.queue)
        assert pool.fence() is None
        all_finished(redis_client, producer.ids, "every task to finish")
        assert all(runs(redis_client, t)["runs"] == 1 for t in producer.ids)
