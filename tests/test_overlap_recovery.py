"""Recovery of the overlap deploy (issue 19): the deploy SIGKILLed right after each write-ahead record, then
``celeryops abort`` or ``resume`` (from the same machine, or from another one: a state dir without the journal);
SIGINT mid-deploy; the new revision failing to start; the old revision's drain timing out. Real workers as the
stand-in's instances, real Redis; every end state is checked on the pool and the workers themselves."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celeryops.demo.standins.cloudrun import ALL_PERMISSIONS
from celeryops_harness.taskapp import until
from celeryops_harness.workers import wait_for
from clihelp import CliProcess, run_cli
from drainhelp import enqueue, finished, runs, started
from overlaphelp import (
    WAIT,
    Pool,
    all_finished,
    close_pool,
    consumes,
    events_of,
    make_pool,
    running_pool,
    steps,
    wait_consuming,
    wait_lease_orphaned,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def small(tmp_path: Path, redis_url: str, queue_name: str) -> Iterator[Pool]:
    """A pool of one instance (two at the peak): less to start on a shared machine."""
    with running_pool(tmp_path, redis_url, queue_name, count=1) as made:
        yield made


def elsewhere(pool: Pool) -> dict[str, str]:
    """The environment of a teammate's machine: the same broker, another (empty) state dir."""
    return {**pool.env, "CELERYOPS_STATE_DIR": str(pool.dir / "elsewhere")}


def orphaned(pool: Pool, env: dict[str, str], *, status: bool = False) -> dict[str, Any]:
    """Wait until the killed run's lease is orphaned (read in Redis); then, with ``status``, ``status --json`` (what
    recovery would do)."""
    wait_lease_orphaned(pool)
    found: dict[str, Any] = json.loads(run_cli(["status", "--json"], env, cwd=pool.dir).stdout) if status else {}
    return found


def back_on_old(pool: Pool, control: Celery) -> None:
    """The pool runs its original instances of the old revision only, and they consume; no fence is left."""
    wait_for(lambda: pool.instances() == {pool.old: pool.count}, WAIT, "the pool back on the old revision only")
    wait_for(lambda: not pool.alive(pool.new_revision()), WAIT, "the new revision's workers to be gone")
    wait_consuming(control, pool.alive(pool.old), pool.queue)
    assert pool.fence() is None


def on_new(pool: Pool, control: Celery) -> None:
    new = pool.new_revision()
    wait_for(lambda: pool.instances() == {new: pool.count}, WAIT, "every instance on the new revision")
    wait_for(lambda: not pool.alive(pool.old), WAIT, "the old revision's workers to be gone")
    wait_consuming(control, pool.alive(new), pool.queue)
    assert pool.fence() is None


# Each chain: the deploy SIGKILLed right after a record, then recovery commands (some SIGKILLed in turn), each from
# this machine or another one (a state dir without the journal); the end state the last one leaves.
CHAINS = {
    # written ahead, never sent: resume sends it; killed again once it stopped the old revision, abort restores the
    # old revision's consumers and retires the new one
    "up-intent": [("deploy", "intent:overlap_up", False), ("resume", "intent:cancel_consumers", True),
                  ("abort", None, True)],
    # both revisions run: resume goes on; killed again once the old revision is idle, resume cuts over (it drains
    # the old revision again first: its fence may have expired)
    "up-settled": [("deploy", "settle:overlap_up", False), ("resume", "phase:drained", True),
                   ("resume", None, False)],
    # a cutover begun is finished, whatever is asked
    "cutover": [("deploy", "intent:overlap_cutover", False), ("abort", None, True)],
}


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_killed_at_each_step_then_abort_or_resume(tmp_path: Path, redis_url: str, queue_name: str,
                                                  redis_control: Celery, redis_client: redis.Redis,
                                                  chain: str) -> None:
    pool = make_pool(tmp_path, redis_url, queue_name, count=1)
    try:
        *killed, (last, _, other) = CHAINS[chain]
        for command, kill_after, other_machine in killed:
            env = elsewhere(pool) if other_machine else pool.env
            args = pool.args() if command == "deploy" else [command, "--json"]
            result = run_cli(args, env, cwd=pool.dir, kill_after=kill_after, timeout=240)
            assert result.returncode == -signal.SIGKILL, (command, result.stdout[-2000:] + result.stderr[-2000:])
            status = orphaned(pool, env, status=True)  # status names the phase and what abort would do
            action = "cutover" if kill_after == "intent:overlap_cutover" else "retire"
            assert status["recovery"]["action"] == action, status
        env = elsewhere(pool) if other else pool.env
        ids = enqueue(pool.redis_url, pool.queue, 0.1, n=4)  # waiting tasks: whoever consumes at the end runs them
        result = run_cli([last, "--json"], env, cwd=pool.dir, timeout=240)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        deployed = chain != "up-intent"
        if deployed:
            on_new(pool, redis_control)
        else:
            back_on_old(pool, redis_control)
        all_finished(redis_client, ids, "the waiting tasks to run")
        assert all(runs(redis_client, t)["runs"] == 1 for t in ids)
        history = json.loads(run_cli(["runs", "--json"], env, cwd=pool.dir).stdout)
        assert history[0]["phase"] == ("done" if deployed else "aborted"), history
    finally:
        close_pool(pool)


def test_killed_while_retiring_resume_finishes_the_retirement(small: Pool, redis_control: Celery) -> None:
    """The new revision fails to start, the retirement begins (written ahead) and celeryops dies: resume finishes
    it (exit 6: the deploy did not take place) and the pool runs the old revision alone. Before that, a resume that
    may not read the pool's revisions says which permission and which role, changing nothing on the pool."""
    pool = small
    pool.standin.fail_next_rollout("worker")
    killed = run_cli(pool.args(), pool.env, cwd=pool.dir, kill_after="intent:overlap_revert", timeout=240)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    orphaned(pool, pool.env)
    generation = pool.standin.resource("worker").generation
    pool.standin.grant(ALL_PERMISSIONS - {"run.revisions.list"})
    denied = run_cli(["resume", "--json"], pool.env, cwd=pool.dir, timeout=240)
    pool.standin.grant(None)
    assert denied.returncode == 6 and "Traceback" not in denied.stderr, denied.stdout[-3000:] + denied.stderr[-3000:]
    message = events_of(denied.stdout)[-1]["message"]
    assert "may not read it or its revisions (run.revisions.list is missing)" in message, message
    assert "grant roles/run.viewer or roles/run.developer to the account celeryops runs as" in message, message
    assert pool.standin.resource("worker").generation == generation  # nothing changed on the pool
    result = run_cli(["resume", "--json"], pool.env, cwd=pool.dir, timeout=240)
    assert result.returncode == 6, result.stdout[-3000:] + result.stderr[-3000:]
    final = events_of(result.stdout)[-1]
    assert final["event"] == "deploy_failed" and "retired" in final["message"], final
    back_on_old(pool, redis_control)


@pytest.mark.parametrize("when", ["consuming", "cancelled"])
def test_interrupted_applies_the_abort_rules_before_exiting(small: Pool, redis_control: Celery,
                                                            redis_client: redis.Redis, when: str) -> None:
    """SIGINT once the new revision consumes, or during the old revision's drain (a long task running on it): the
    new revision is retired before the process exits 130, and the long task was never killed."""
    pool = small
    with until.app.connection_for_write(pool.redis_url) as conn:
        long_task = until.apply_async(args=("overlap-test:long",), queue=pool.queue, connection=conn).id
    wait_for(lambda: started(redis_client, [long_task]), WAIT, "the long task to start")
    proc = CliProcess(pool.args(), pool.env, cwd=pool.dir)
    try:
        if when == "consuming":
            proc.wait_event("overlap", 240, where=lambda e: e["step"] == "consuming")
        else:
            proc.wait_event(when, 240)
        proc.signal(signal.SIGINT)
        assert proc.finish(240) == 130, proc.read_stderr()
    finally:
        proc.kill()
    final = proc.events[-1]
    assert final["event"] == "interrupted" and final["recovered"] is True, final
    assert "retired" in steps(proc.events), steps(proc.events)
    back_on_old(pool, redis_control)
    assert not finished(redis_client, [long_task])  # still running where it started: nothing was killed
    redis_client.set("overlap-test:long", 1)
    all_finished(redis_client, [long_task], "the long task")
    assert runs(redis_client, long_task)["runs"] == 1


@pytest.mark.parametrize("how", ["fails to start", "never consumes"])
def test_new_revision_failing_leaves_the_old_one_serving(tmp_path: Path, redis_url: str, queue_name: str,
                                                         redis_control: Celery, how: str) -> None:
    """The new revision fails to start (Cloud Run says so), or starts but never consumes the old revision's queues
    within max_wait (a crash loop, a wrong queue): exit 6, the old revision was never stopped, the new one is
    retired."""
    pool = make_pool(tmp_path, redis_url, queue_name, count=1, max_wait=5,
                     new_queues=["elsewhere"] if how == "never consumes" else None)
    try:
        if how == "fails to start":
            pool.standin.fail_next_rollout("worker")
        result = run_cli(pool.args(), pool.env, cwd=pool.dir, timeout=240)
        assert result.returncode == 6, result.stdout[-3000:] + result.stderr[-3000:]
        events = events_of(result.stdout)
        final = events[-1]
        assert final["event"] == "deploy_failed", final
        if how == "fails to start":
            assert "failed" in final["message"] and final.get("logs_url"), final
        else:
            assert "did not consume" in final["message"] and f"nobody consumes {queue_name}" in final["message"]
        assert "stopping_old" not in steps(events) and steps(events)[-1] == "retired", steps(events)
        back_on_old(pool, redis_control)
        history = json.loads(run_cli(["runs", "--json"], pool.env, cwd=pool.dir).stdout)
        assert history[0]["phase"] == "aborted", history
    finally:
        close_pool(pool)


def test_retirement_keeps_both_revisions_while_the_new_one_is_busy(tmp_path: Path, redis_url: str, queue_name: str,
                                                                    redis_control: Celery,
                                                                    redis_client: redis.Redis) -> None:
    """Abort while a task runs on the new revision past max_wait: the new revision is never taken away busy; its
    consumers come back and both revisions keep consuming (exit 6, the run stays open); once the task ended, abort
    again retires it."""
    pool = make_pool(tmp_path, redis_url, queue_name, count=1, max_wait=4, new_queues=[queue_name, "only-new"])
    try:
        killed = run_cli(pool.args(), pool.env, cwd=pool.dir, kill_after="settle:overlap_up", timeout=240)
        assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
        # Busy until the test says so; only the new revision's workers consume "only-new".
        with until.app.connection_for_write(redis_url) as conn:
            busy = until.apply_async(args=("overlap-test:release",), queue="only-new", connection=conn).id
        wait_for(lambda: started(redis_client, [busy]), WAIT, "the task to start on the new revision")
        orphaned(pool, pool.env)
        aborted = run_cli(["abort", "--json"], pool.env, cwd=pool.dir, timeout=240)
        assert aborted.returncode == 6, aborted.stdout[-3000:] + aborted.stderr[-3000:]
        events = events_of(aborted.stdout)
        assert "kept_both" in steps(events) and events[-1]["event"] == "abort", events[-1]
        assert events[-1]["action"] == "ask" and "stayed busy" in events[-1]["message"], events[-1]
        new = pool.new_revision()
        assert pool.instances() == {pool.old: 1, new: 1} and pool.fence() is None
        names = {w.nodename: w for w in pool.alive()}
        wait_for(lambda: consumes(redis_control, sorted(names)) == {
            n: sorted([queue_name, "only-new"] if new in n else [queue_name]) for n in names}, WAIT,
            "both revisions to consume")
        status = json.loads(run_cli(["status", "--json"], pool.env, cwd=pool.dir).stdout)
        assert status["run"]["phase"] == "overlapping" and status["recovery"]["action"] == "retire", status
        assert not finished(redis_client, [busy])  # still running: the new revision was not taken away
        redis_client.set("overlap-test:release", 1)
        all_finished(redis_client, [busy], "the task on the new revision to finish")
        again = run_cli(["abort", "--json"], pool.env, cwd=pool.dir, timeout=240)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        back_on_old(pool, redis_control)
        assert runs(redis_client, busy)["runs"] == 1 and new in runs(redis_client, busy)["worker"]
    finally:
        close_pool(pool)


def test_old_revision_not_idle_in_time_is_never_killed(tmp_path: Path, redis_url: str, queue_name: str,
                                                        redis_control: Celery, redis_client: redis.Redis) -> None:
    """max_wait 10 s and a task on the old revision that outlasts it: the drain times out (exit 3), nothing is
    killed (the task's worker is never taken away and the task still runs), the old revision's consumers come
    back, the new revision is retired."""
    pool = make_pool(tmp_path, redis_url, queue_name, max_wait=10, count=1)
    try:
        (long_task,) = enqueue(redis_url, queue_name, 300.0)
        wait_for(lambda: started(redis_client, [long_task]), WAIT, "the long task to start")
        ran_on = runs(redis_client, long_task)["worker"]
        result = run_cli(pool.args(), pool.env, cwd=pool.dir, timeout=240)
        assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
        events = events_of(result.stdout)
        assert events[-1]["event"] == "timeout" and "nothing was killed" in events[-1]["message"], events[-1]
        assert steps(events)[-2:] == ["old_restored", "retired"] or steps(events)[-1] == "retired", steps(events)
        back_on_old(pool, redis_control)
        (instance,) = [i for i in pool.standin.instance_set.of(pool.standin.resource("worker").name)
                       if i.handle is not None and i.handle.nodename == ran_on]  # type: ignore[attr-defined]
        assert instance.taken_away is None and instance.alive()
        assert not finished(redis_client, [long_task]) and runs(redis_client, long_task)["runs"] == 1
        assert long_task in {t for e in events if e["event"] == "poll" for t in (x["id"] for x in e["tasks"])}
    finally:
        close_pool(pool)


def test_abort_after_the_cutover_intent_waits_for_silent_old_workers_instead_of_failing(
        small: Pool, redis_control: Celery) -> None:
    """Chaos seed 51: the deploy SIGKILLed right after its cutover intent, and the old revision's workers silent when
    the operator's abort comes (reconnecting after a broker restart; here SIGSTOPped). Abort finishes the cutover: it
    drains the old revision again, waiting for its silent workers like any drain (unknown is never empty) until they
    answer or the evidence says they left, instead of exiting 4 with "No worker ... answered"."""
    pool = small
    killed = run_cli(pool.args(), pool.env, cwd=pool.dir, kill_after="intent:overlap_cutover", timeout=240)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    orphaned(pool, pool.env)
    old = pool.alive(pool.old)
    for worker in old:
        worker.signal(signal.SIGSTOP)
    abort = CliProcess(["abort", "--json"], pool.env, cwd=pool.dir)
    try:
        abort.wait_event("poll", WAIT)  # drain-polling the silent old workers, not exiting 4
        for worker in old:
            worker.signal(signal.SIGCONT)
        assert abort.finish(240) == 0, (abort.events[-3:], abort.read_stderr()[-3000:])
    finally:
        for worker in old:
            worker.signal(signal.SIGCONT)
        abort.kill()
    assert next(e for e in abort.events if e["event"] == "abort")["action"] == "cutover"
    on_new(pool, redis_control)
