"""The drain against real Celery workers (issue 2 acceptance), over Redis and RabbitMQ."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import redis
from celery import Celery

from celeryops_harness.taskapp import release
from celeryops_harness.workers import WorkerProcess, wait_for
from clihelp import CliProcess, cli_env, run_cli
from drainhelp import enqueue, enqueue_hold, finished, runs, started

pytestmark = pytest.mark.slow

FAST = ["--interval", "0.4", "--streak", "2"]


def consuming(app: Celery, worker: WorkerProcess) -> set[str]:
    replies = app.control.inspect(destination=[worker.nodename], timeout=2, limit=1).active_queues() or {}
    return {q["name"] for q in replies.get(worker.nodename, [])}


@pytest.fixture
def env(tmp_path: Path, redis_url: str) -> dict[str, str]:
    # The coordination Redis (lease, status) is the private server for every broker.
    return cli_env(tmp_path / "state", CELERYOPS_REDIS_URL=redis_url)


def test_long_tasks_finish_before_drained_and_none_lost(broker_url: str, celery_app: Celery, start_workers,
                                                        redis_client: redis.Redis, queue_name: str,
                                                        env: dict[str, str]) -> None:
    workers = start_workers(broker_url, n=2, queues=[queue_name], concurrency=2)
    ids = enqueue(broker_url, queue_name, 2.0, n=8)
    wait_for(lambda: len(started(redis_client, ids)) >= 4, 30, "4 tasks running")
    drain = CliProcess(["drain", "--broker", broker_url, "-Q", queue_name, *FAST, "--json"], env)
    cancelled = drain.wait_event("cancelled", 30)
    drained = drain.wait_event("drained", 60)
    assert drain.finish() == 0
    # Every task that started has finished before the drained verdict, and nothing ran unseen: a task that
    # started after the consumers were stopped was one a worker had already prefetched (seen as reserved).
    seen = {t["id"] for e in drain.events if e["event"] == "poll" for t in e["tasks"]}
    for tid in started(redis_client, ids):
        rec = runs(redis_client, tid)
        assert rec["finished"] <= drained["_at"], f"{tid} still ran after the drained verdict"
        assert rec["started"] <= cancelled["_at"] or tid in seen, f"{tid} started after the stop, unseen"
    assert all(consuming(celery_app, w) == set() for w in workers)
    # Undo from a fresh process: consumers back exactly as before, then every task runs exactly once.
    abort = run_cli(["abort", "--broker", broker_url], env)
    assert abort.returncode == 0, abort.stderr
    assert all(consuming(celery_app, w) == {queue_name} for w in workers)
    wait_for(lambda: len(finished(redis_client, ids)) == len(ids), 60, "every task to finish after abort")
    assert all(runs(redis_client, t)["runs"] == 1 for t in ids)


def test_scale_out_mid_drain_is_stopped_within_one_poll(broker_url: str, celery_app: Celery, start_workers,
                                                        redis_client: redis.Redis, queue_name: str,
                                                        env: dict[str, str]) -> None:
    """On each broker (the workers, the drain and the check all on it): a worker that starts mid-drain stops."""
    start_workers(broker_url, n=1, queues=[queue_name], concurrency=1)
    ids = enqueue(broker_url, queue_name, 1.5, n=12)
    wait_for(lambda: started(redis_client, ids), 30, "a task running")
    drain = CliProcess(["drain", "--broker", broker_url, "-Q", queue_name, "--interval", "1.0", "--streak", "2",
                        "--json"], env)
    drain.wait_event("poll", 30)
    (late,) = start_workers(broker_url, n=1, queues=[queue_name], concurrency=1)
    # Seen first through its pidbox binding, a new worker may not listen to broadcasts yet; once it replies it does,
    # and within one poll of that it consumes nothing any more (the stop is re-sent at the end of every poll).
    joined = drain.wait_event("poll", 60, where=lambda e: e["workers"].get(late.nodename, {}).get("replied"))
    after = drain.wait_event("poll", 30)
    assert after["workers"][late.nodename]["state"] == "stopped", after["workers"][late.nodename]
    drained = drain.wait_event("drained", 60)
    assert drain.finish() == 0
    # Whatever the late worker took before its first cancel was waited for too.
    for tid in started(redis_client, ids):
        assert runs(redis_client, tid)["finished"] <= drained["_at"]
    assert consuming(celery_app, late) == set()
    assert joined["workers"][late.nodename]["replied"] is True


def test_busy_solo_worker_is_unknown_not_zero(redis_url: str, start_workers, redis_client: redis.Redis,
                                              queue_name: str, env: dict[str, str]) -> None:
    solo_q = queue_name + "-solo"
    (solo,) = start_workers(redis_url, pool="solo", queues=[solo_q])
    start_workers(redis_url, n=1, queues=[queue_name])
    (tid,) = enqueue_hold(redis_url, solo_q, gate=solo_q)  # busy until the first poll has seen it
    wait_for(lambda: started(redis_client, [tid]), 30, "the solo task to start")
    drain = CliProcess(["drain", "--broker", redis_url, "-Q", queue_name, "-Q", solo_q, *FAST, "--json"], env)
    poll = drain.wait_event("poll", 30)
    assert solo.nodename in poll["unknown"], poll
    release(redis_client, solo_q)
    drained = drain.wait_event("drained", 60)
    assert drain.finish() == 0
    assert runs(redis_client, tid)["finished"] <= drained["_at"]


def test_reserved_tasks_are_counted_and_waited_for(redis_url: str, start_workers, redis_client: redis.Redis,
                                                   queue_name: str, env: dict[str, str]) -> None:
    start_workers(redis_url, queues=[queue_name], concurrency=1, prefetch=4)
    ids = enqueue_hold(redis_url, queue_name, gate=queue_name, n=4)  # one runs, 3 prefetched until released
    wait_for(lambda: started(redis_client, ids), 30, "the first task to start")
    drain = CliProcess(["drain", "--broker", redis_url, "-Q", queue_name, *FAST, "--json"], env)
    with_reserved = drain.wait_event("poll", 30, where=lambda e: e["reserved"] > 0)
    assert with_reserved["streak"] == 0
    release(redis_client, queue_name)
    drained = drain.wait_event("drained", 60)
    assert drain.finish() == 0
    assert sorted(finished(redis_client, ids)) == sorted(ids)  # the prefetched ones ran: none lost
    assert all(runs(redis_client, t)["finished"] <= drained["_at"] for t in ids)


def test_timeout_kills_nothing_and_restores(broker_url: str, celery_app: Celery, start_workers,
                                            redis_client: redis.Redis, queue_name: str, env: dict[str, str]) -> None:
    (worker,) = start_workers(broker_url, queues=[queue_name])
    (tid,) = enqueue_hold(broker_url, queue_name, gate=queue_name)  # runs until the drain has timed out
    wait_for(lambda: started(redis_client, [tid]), 30, "the long task to start")
    drain = CliProcess(["drain", "--broker", broker_url, "-Q", queue_name, "--interval", "0.3", "--max-wait", "1",
                        "--json"], env)
    timeout = drain.wait_event("timeout", 60)
    assert drain.finish() == 3
    assert not redis_client.hget(f"ct:run:{tid}", "finished"), "the task must still be running at the timeout"
    assert any(e["event"] == "restored" and e["verified"] for e in drain.events)
    assert consuming(celery_app, worker) == {queue_name}
    release(redis_client, queue_name)
    wait_for(lambda: finished(redis_client, [tid]), 60, "the long task to run to its end")
    assert runs(redis_client, tid)["runs"] == 1
    assert timeout["message"]


def test_sigint_restores_consumers_and_exits_130(broker_url: str, celery_app: Celery, start_workers,
                                                 redis_client: redis.Redis, queue_name: str,
                                                 env: dict[str, str]) -> None:
    (worker,) = start_workers(broker_url, queues=[queue_name])
    (tid,) = enqueue_hold(broker_url, queue_name, gate=queue_name)  # never released: must run past the SIGINT
    wait_for(lambda: started(redis_client, [tid]), 30, "the task to start")
    drain = CliProcess(["drain", "--broker", broker_url, "-Q", queue_name, *FAST, "--json"], env)
    drain.wait_event("poll", 30)
    assert consuming(celery_app, worker) == set()
    drain.signal(signal.SIGINT)
    drain.wait_event("interrupted", 30)
    assert drain.finish() == 130
    assert consuming(celery_app, worker) == {queue_name}
    assert not redis_client.hget(f"ct:run:{tid}", "finished")  # nothing was killed: still running


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "redis://:hunter2@127.0.0.1:1/0",
                                 "amqp://guest:hunter2@127.0.0.1:1//"])
def test_unreachable_broker_is_one_sentence_exit_4(url: str, tmp_path: Path) -> None:
    result = run_cli(["drain", "--broker", url, "--interval", "1"], cli_env(tmp_path))
    assert result.returncode == 4, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("celeryops: Cannot reach the broker")
    assert "hunter2" not in result.stderr + result.stdout
    assert "nothing was changed" in result.stderr


def test_no_worker_answers_is_exit_4(redis_url: str, tmp_path: Path) -> None:
    result = run_cli(["drain", "--broker", redis_url], cli_env(tmp_path))
    assert result.returncode == 4
    assert "No worker answered" in result.stderr and "Traceback" not in result.stderr


def test_task_events_trigger_an_early_poll(redis_url: str, start_workers, redis_client: redis.Redis,
                                           queue_name: str, env: dict[str, str]) -> None:
    """With workers sending task events (-E), the drain polls again as soon as the in-flight tasks end instead of
    waiting out the interval; the verdict still needs the full streak of empty polls."""
    start_workers(redis_url, queues=[queue_name], env={"CELERYOPS_TEST_EVENTS": "1"})
    (tid,) = enqueue_hold(redis_url, queue_name, gate=queue_name)  # ends once a poll has seen it running
    wait_for(lambda: started(redis_client, [tid]), 30, "the task to start")
    drain = CliProcess(["drain", "--broker", redis_url, "-Q", queue_name, "--interval", "30", "--streak", "2",
                        "--max-wait", "300", "--json"], env)
    drain.wait_event("poll", 30, where=lambda e: e["active"] == 1)
    release(redis_client, queue_name)
    woke = drain.wait_event("notice", 60, where=lambda e: "polling again now" in e["message"])
    after = drain.wait_event("poll", 30)
    assert after["streak"] == 1 and after["active"] == 0
    drain.signal(signal.SIGINT)
    assert drain.finish() == 130
    assert runs(redis_client, tid)["finished"] <= woke["_at"]


def test_an_unconfirmed_restore_is_confirmed_by_abort_again(redis_url: str, start_workers,
                                                             redis_client: redis.Redis, queue_name: str,
                                                             env: dict[str, str]) -> None:
    """A drain times out while a solo-pool worker is busy: the restore is sent but the worker cannot answer, so the
    run ends aborted with a warning to run ``abort`` again; once the task ends, ``abort`` confirms the consumers
    (rather than "no unfinished run"), and a third ``abort`` has nothing left to do."""
    (solo,) = start_workers(redis_url, pool="solo", queues=[queue_name])
    start_workers(redis_url, queues=[queue_name + "-other"])  # one worker answers the drain's preflight
    (tid,) = enqueue_hold(redis_url, queue_name, gate=queue_name)  # busy through the drain's timeout and restore
    wait_for(lambda: started(redis_client, [tid]), 30, "the solo task to start")
    # The restore asks the busy worker again for the whole recovery patience (shortened here) before it says so.
    drain = CliProcess(["drain", "--broker", redis_url, "-Q", queue_name, "--interval", "0.3", "--max-wait", "1",
                        "--json"], {**env, "CELERYOPS_RECOVERY_PATIENCE": "2"})
    drain.wait_event("timeout", 60)
    assert drain.finish() == 3
    (restored,) = [e for e in drain.events if e["event"] == "restored"]
    assert not restored["verified"] and solo.nodename in restored["missing"], restored
    assert any("celeryops abort` again" in e.get("message", "") for e in drain.events if e["event"] == "notice")
    assert not redis_client.hget(f"ct:run:{tid}", "finished"), "the task must still run: nothing was killed"
    status = run_cli(["status", "--broker", redis_url, "--json"], env)
    assert json.loads(status.stdout)["unconfirmed"]["consumers"] == {solo.nodename: [queue_name]}, status.stdout
    said = run_cli(["status", "--broker", redis_url], env).stdout
    assert "without confirming" in said and solo.nodename in said and "celeryops abort" in said, said

    release(redis_client, queue_name)
    wait_for(lambda: finished(redis_client, [tid]), 60, "the solo task to end")
    again = run_cli(["abort", "--broker", redis_url, "--json"], env)
    assert again.returncode == 0, again.stderr
    events = [json.loads(line) for line in again.stdout.splitlines()]
    confirmed = [e for e in events if e["event"] == "restored"]
    assert confirmed and confirmed[-1]["verified"], events
    app = Celery(broker=redis_url, set_as_current=False)
    try:
        assert consuming(app, solo) == {queue_name}
    finally:
        app.close()
    assert json.loads(run_cli(["status", "--broker", redis_url, "--json"], env).stdout)["unconfirmed"] is None
    done = run_cli(["abort", "--broker", redis_url], env)
    assert done.returncode == 1 and "no unfinished run" in done.stderr, done.stderr


def test_an_unconfirmed_restore_is_found_from_another_machine(redis_url: str, start_workers,
                                                              redis_client: redis.Redis, queue_name: str,
                                                              env: dict[str, str], tmp_path: Path) -> None:
    """Issue 22: the run that could not confirm its restore ran on another machine (this one never saw it): status
    and abort with no open run read the fleet's copy of the journal, so a teammate sees it and confirms it."""
    (solo,) = start_workers(redis_url, pool="solo", queues=[queue_name])
    start_workers(redis_url, queues=[queue_name + "-other"])
    (tid,) = enqueue_hold(redis_url, queue_name, gate=queue_name)  # busy through the drain's timeout and restore
    wait_for(lambda: started(redis_client, [tid]), 30, "the solo task to start")
    drain = CliProcess(["drain", "--broker", redis_url, "-Q", queue_name, "--interval", "0.3", "--max-wait", "1",
                        "--json"], {**env, "CELERYOPS_RECOVERY_PATIENCE": "2"})
    drain.wait_event("timeout", 60)
    assert drain.finish() == 3
    teammate = cli_env(tmp_path / "teammate", CELERYOPS_REDIS_URL=redis_url)
    seen = json.loads(run_cli(["status", "--broker", redis_url, "--json"], teammate).stdout)
    assert seen["run"] is None and seen["unconfirmed"]["consumers"] == {solo.nodename: [queue_name]}, seen

    release(redis_client, queue_name)
    wait_for(lambda: finished(redis_client, [tid]), 60, "the solo task to end")
    again = run_cli(["abort", "--broker", redis_url, "--json"], teammate)
    assert again.returncode == 0, again.stderr
    events = [json.loads(line) for line in again.stdout.splitlines()]
    assert [e for e in events if e["event"] == "restored"][-1]["verified"], events
    app = Celery(broker=redis_url, set_as_current=False)
    try:
        assert consuming(app, solo) == {queue_name}
    finally:
        app.close()
    for who in (teammate, env):  # confirmed for both machines: the fleet's copy has the teammate's restore
        assert json.loads(run_cli(["status", "--broker", redis_url, "--json"], who).stdout)["unconfirmed"] is None
