"""Overlap and canary deploys of a worker pool that ``celeryops autoscale`` split into cohorts (issue 36 item 4), end
to end: the real CLI, the real google-cloud-run client against the stand-in, whose instances are real fence-plugin
Celery workers, one real Redis (broker, fence, lease, journal, task records), the autoscaler running throughout.

The deploy takes the pool's current count as its base: the new revision comes up with that many instances beside
every cohort (each kept at its exact count; a canary: its one instance first), the cohorts are fenced and drained
as one while the new revision consumes, none is taken away while a task runs on it, and after the cutover the pool
is the new revision alone and the autoscaler goes on from it. A split pinned by hand (the Cloud console) still fails
the ``traffic`` check, nothing changed."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from celery import Celery
from google.cloud import run_v2
from google.cloud.run_v2.services.worker_pools.transports import WorkerPoolsGrpcTransport

from autoscalehelp import running, scaled_pool, start, steps_of, wait_instances
from celeryops_harness.taskapp import until, work
from celeryops_harness.workers import wait_for
from clihelp import CliProcess, run_cli
from drainhelp import enqueue, finished, runs, started
from overlaphelp import WAIT, Pool, Producer, all_finished, steps, wait_consuming, wait_lease_orphaned

pytestmark = pytest.mark.slow

DEPLOY_WAIT = 240.0  # the whole deploy at most (a loaded machine)
#: The canary's fast judge (as tests/test_canary_e2e.py): a look a second, promoted after 30 canary tasks.
CANARY = {"look_interval": 1, "min_tasks": 30, "max_duration": 90, "alpha": 0.05}


def send(redis_url: str, queue: str, task: Any, *args: object, n: int = 1) -> list[str]:
    with until.app.connection_for_write(redis_url) as conn:
        return [task.apply_async(args=args, queue=queue, connection=conn).id for _ in range(n)]


def cohorts_up(pool: Pool, autoscaler: CliProcess) -> dict[str, int]:
    """Until the autoscaler ran its first step: the pool's one instance and a cohort beside it (min_instances 2)."""
    added = autoscaler.wait_event("autoscale_step", WAIT, where=lambda e: e["step"] == "added")
    wait_instances(pool, lambda now: len(now) == 2 and sum(now.values()) == 2, "two cohorts of one instance")
    assert set(running(pool)) == {pool.old, added["revision"]}
    return running(pool)


def cohorts_left(pool: Pool) -> dict[str, int]:
    """The autoscaler run until it split the pool into two cohorts, then stopped (SIGINT, exit 0): the cohorts."""
    autoscaler = start(pool)
    try:
        before = cohorts_up(pool, autoscaler)
        autoscaler.signal(signal.SIGINT)
        assert autoscaler.finish() == 0, autoscaler.read_stderr()
    finally:
        autoscaler.kill()
    return before


@pytest.fixture
def cohorts(tmp_path: Path, redis_url: str, queue_name: str, request: pytest.FixtureRequest) -> Iterator[Pool]:
    """A worker pool of one instance that the autoscaler (min 2, max 3, one task per instance) splits into two
    cohorts; ``request.param``: the deploy strategy."""
    strategy = getattr(request, "param", "overlap")
    with scaled_pool(tmp_path, redis_url, queue_name, min_instances=2, max_instances=3, tasks_per_instance=1,
                     idle_after=600) as pool:
        pool.strategy = strategy
        if strategy == "canary":
            config = tmp_path / "celeryops.toml"
            config.write_text(config.read_text() + "\n[canary]\n" + "".join(f"{k} = {v}\n"
                                                                             for k, v in CANARY.items()))
        yield pool


def test_overlap_deploy_of_the_autoscalers_cohorts_kills_nothing_and_the_autoscaler_goes_on(
        cohorts: Pool, redis_client: redis.Redis, redis_control: Celery) -> None:
    """Two cohorts of one instance, a long task on one of them: the deploy runs the new revision at their total (2)
    beside both (4 at the peak), drains both as one while the new revision consumes (the long task finishes where it
    runs), then every instance moves to the new revision; the autoscaler waits meanwhile, goes on from the new
    revision after the cutover, and adds a cohort beside it on demand."""
    pool = cohorts
    autoscaler = start(pool)
    deploy: CliProcess | None = None
    try:
        before = cohorts_up(pool, autoscaler)
        (long_id,) = send(pool.redis_url, pool.queue, until, "cohorts-test:long")
        wait_for(lambda: started(redis_client, [long_id]), WAIT, "the long task to start on a cohort")
        ran_on = runs(redis_client, long_id)["worker"]
        deploy = CliProcess(pool.args(), pool.env, cwd=pool.dir)
        traffic = deploy.wait_event("check", WAIT, where=lambda e: e["id"] == "traffic" and e["status"] != "running")
        assert traffic["status"] == "ok" and "celeryops' cohorts" in traffic["detail"], traffic
        assert "4 instances at the peak" in traffic["detail"], traffic
        up = deploy.wait_event("overlap", WAIT, where=lambda e: e["step"] == "scaled_up")
        new = up["new_revision"]
        assert sum(up["split"].values()) == 100 and set(up["split"]) == {*before, new}
        wait_instances(pool, lambda now: now == {**before, new: 2}, "every cohort beside two new instances")
        deploy.wait_event("poll", WAIT)  # the cohorts are held and drained while the new revision consumes
        assert not finished(redis_client, [long_id])
        assert all(n >= 1 for n in running(pool).values()), running(pool)  # the busy cohort is still there
        redis_client.set("cohorts-test:long", 1)
        assert deploy.finish(DEPLOY_WAIT) == 0, (deploy.events[-3:], deploy.read_stderr()[-3000:])
        assert deploy.events[-1]["event"] == "deployed", deploy.events[-1]
        assert "cut_over" in steps(deploy.events), steps(deploy.events)
        assert running(pool) == {new: 2}
        assert pool.standin.peak("worker") == 4
        assert runs(redis_client, long_id)["runs"] == 1 and finished(redis_client, [long_id])
        assert runs(redis_client, long_id)["worker"] == ran_on

        autoscaler.wait_event("notice", WAIT, where=lambda e: "goes on from the pool as it is" in e["message"])
        waits = [e for e in autoscaler.events if e["event"] == "autoscale" and e["action"] == "wait"]
        assert any("holds the fleet" in e["reason"] for e in waits), [e["reason"] for e in waits]
        ids = send(pool.redis_url, pool.queue, until, "cohorts-test:more", n=3)
        added = autoscaler.wait_event("autoscale_step", WAIT, where=lambda e: e["step"] == "added"
                                      and e["revision"] not in before)
        wait_instances(pool, lambda now: now == {new: 2, added["revision"]: 1}, "a cohort beside the new revision")
        redis_client.set("cohorts-test:more", 1)
        all_finished(redis_client, ids, "the three tasks")
        autoscaler.signal(signal.SIGINT)
        assert autoscaler.finish() == 0, autoscaler.read_stderr()
    finally:
        if deploy is not None:
            deploy.kill()
        autoscaler.kill()
    assert pool.fence() is None
    wait_consuming(redis_control, pool.alive(), pool.queue)

    # Rolled back, the overlap's way, from the new revision and the cohort the autoscaler added beside it (both of
    # the deployed image): every instance back on the image the deploy replaced, its largest cohort, at the count.
    back = run_cli(["rollback", "--strategy", "overlap", "--yes", "--accept-warnings", "--json"], pool.env,
                   cwd=pool.dir, timeout=DEPLOY_WAIT)
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    assert running(pool) == {pool.old: 3}
    wait_consuming(redis_control, pool.alive(pool.old), pool.queue)


@pytest.mark.parametrize("cohorts", ["canary"], indirect=True)
def test_canary_deploy_of_the_autoscalers_cohorts_is_promoted_from_them(
        cohorts: Pool, redis_client: redis.Redis, redis_control: Celery) -> None:
    """A canary of one instance beside both cohorts (3 while judged, 4 once promoted), judged against both,
    promoted, then both cohorts drained and every instance on the new revision; every task ran exactly once."""
    pool = cohorts
    autoscaler = start(pool)
    producer = Producer(pool.redis_url, pool.queue, task=work, seconds=0.02, every=0.05)
    deploy: CliProcess | None = None
    try:
        before = cohorts_up(pool, autoscaler)
        with producer:
            deploy = CliProcess(pool.args(), pool.env, cwd=pool.dir)
            up = deploy.wait_event("overlap", WAIT, where=lambda e: e["step"] == "scaled_up")
            new = up["new_revision"]
            wait_instances(pool, lambda now: now == {**before, new: 1}, "one canary instance beside both cohorts")
            rc = deploy.finish(DEPLOY_WAIT)
        assert rc == 0, (deploy.events[-3:], deploy.read_stderr()[-3000:])
        looks = [e for e in deploy.events if e["event"] == "canary_look"]
        assert looks and looks[-1]["verdict"] == "promote", looks[-1:]
        assert "cut_over" in steps(deploy.events) and running(pool) == {new: 2}
        assert pool.standin.peak("worker") == 4
        autoscaler.wait_event("notice", WAIT, where=lambda e: "goes on from the pool as it is" in e["message"])
        autoscaler.signal(signal.SIGINT)
        assert autoscaler.finish() == 0, autoscaler.read_stderr()
    finally:
        if deploy is not None:
            deploy.kill()
        autoscaler.kill()
        producer.stop()
    all_finished(redis_client, producer.ids, "every task to finish")
    assert all(runs(redis_client, t)["runs"] == 1 for t in producer.ids)
    assert pool.fence() is None
    wait_consuming(redis_control, pool.alive(), pool.queue)


def console_split(address: str, split: dict[str, int], count: int) -> None:
    """What an edit in the Cloud console does: the instances split by hand between named revisions (the real client;
    the resource's annotations are sent back as they were)."""
    with grpc.insecure_channel(address) as chan:
        client = run_v2.WorkerPoolsClient(transport=WorkerPoolsGrpcTransport(channel=chan))
        found = client.get_worker_pool(name="projects/proj/locations/europe-west1/workerPools/worker")
        found.instance_splits = [run_v2.InstanceSplit(
            type_=run_v2.InstanceSplitAllocationType.INSTANCE_SPLIT_ALLOCATION_TYPE_REVISION, revision=rev,
            percent=pct) for rev, pct in split.items()]
        found.scaling.manual_instance_count = count
        client.update_worker_pool(worker_pool=found).result(timeout=60)


def test_a_split_pinned_in_the_console_still_fails_the_traffic_check(cohorts: Pool) -> None:
    """The autoscaler's two cohorts, then someone pins another split in the Cloud console (two thirds / one third of
    three instances): not celeryops' cohorts; the deploy stops at preflight (exit 5) and changes nothing."""
    pool = cohorts
    before = cohorts_left(pool)
    cohort = next(rev for rev in before if rev != pool.old)
    console_split(pool.standin.address, {pool.old: 67, cohort: 33}, 3)
    wait_instances(pool, lambda now: now == {pool.old: 2, cohort: 1}, "the split pinned in the console")
    result = run_cli(pool.args(), pool.env, cwd=pool.dir, timeout=DEPLOY_WAIT)
    assert result.returncode == 5, result.stdout[-3000:] + result.stderr[-3000:]
    assert "not celeryops' own cohorts" in result.stdout, result.stdout[-3000:]
    assert "Traceback" not in result.stderr
    assert running(pool) == {pool.old: 2, cohort: 1} and len(pool.standin.revisions("worker")) == 2
    assert pool.fence() is None


def test_sigterm_to_the_deploy_puts_the_cohorts_back_and_the_next_deploy_starts_from_them(
        cohorts: Pool, redis_client: redis.Redis, redis_control: Celery) -> None:
    """Interrupted while the cohorts drain (SIGTERM; a long task keeps them busy), the deploy applies the abort's
    rules: the cohorts consume again (the long task was never killed) and the new revision is retired; the pool is
    back on both cohorts, each at its count, recorded as celeryops' own, so the autoscaler goes on from them and the
    next deploy starts from them again."""
    pool = cohorts
    autoscaler = start(pool)
    deploy: CliProcess | None = None
    try:
        before = cohorts_up(pool, autoscaler)
        (long_id,) = send(pool.redis_url, pool.queue, until, "cohorts-test:long")
        deploy = CliProcess(pool.args(), pool.env, cwd=pool.dir)
        deploy.wait_event("poll", WAIT)
        deploy.signal(signal.SIGTERM)
        assert deploy.finish(DEPLOY_WAIT) == 130, (deploy.events[-3:], deploy.read_stderr()[-3000:])
        assert "retired" in steps(deploy.events), steps(deploy.events)
        wait_instances(pool, lambda now: now == before, "both cohorts back at their counts")
        ended = deploy.events[-1]["_at"]
        look = autoscaler.wait_event("autoscale", WAIT, where=lambda e: e["_at"] > ended and e["action"] != "wait")
        assert {c["revision"]: c["count"] for c in look["cohorts"]} == before, look  # not left alone: its own
        assert not finished(redis_client, [long_id])  # still running where it started
        redis_client.set("cohorts-test:long", 1)
        all_finished(redis_client, [long_id], "the long task")
        autoscaler.signal(signal.SIGINT)
        assert autoscaler.finish() == 0, autoscaler.read_stderr()
    finally:
        if deploy is not None:
            deploy.kill()
        autoscaler.kill()
    assert runs(redis_client, long_id)["runs"] == 1
    assert not any(step == "removed" for step, _ in steps_of(autoscaler.events))
    assert pool.fence() is None
    again = run_cli(pool.args(), pool.env, cwd=pool.dir, timeout=DEPLOY_WAIT)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    (only,) = running(pool).items()
    assert only[1] == 2 and only[0] not in before
    wait_consuming(redis_control, pool.alive(only[0]), pool.queue)


# Each chain: the deploy of two cohorts SIGKILLed right after a record, then recovery commands from a teammate's
# machine (a state dir without the journal; the last one not killed), and where the pool ends: back on the cohorts,
# each at its count, or every instance on the new revision.
CHAINS = {
    "up-intent": ([("deploy", "intent:overlap_up"), ("abort", None)], "cohorts"),
    "stopped": ([("deploy", "intent:cancel_consumers"), ("abort", None)], "cohorts"),
    "drained": ([("deploy", "phase:drained"), ("resume", None)], "new"),
    "retiring": ([("deploy", "phase:drained"), ("abort", "intent:overlap_revert"), ("abort", None)], "cohorts"),
    "cutover": ([("deploy", "intent:overlap_cutover"), ("abort", None)], "new"),
}


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_a_deploy_of_cohorts_killed_at_each_step_is_finished_or_undone(
        cohorts: Pool, redis_client: redis.Redis, redis_control: Celery, chain: str) -> None:
    """The autoscaler's two cohorts (it stopped since), then the overlap deploy SIGKILLed right after a record; abort
    or resume from another machine (the fleet's journal in Redis) finishes or undoes it by the pool's rules: undone,
    both cohorts are back at their counts and consume; finished, the new revision runs the pool's count alone."""
    pool = cohorts
    before = cohorts_left(pool)
    elsewhere = {**pool.env, "CELERYOPS_STATE_DIR": str(pool.dir / "elsewhere")}
    commands, ends = CHAINS[chain]
    for i, (command, kill_after) in enumerate(commands):
        env = pool.env if i == 0 else elsewhere
        args = pool.args() if command == "deploy" else [command, "--json"]
        result = run_cli(args, env, cwd=pool.dir, kill_after=kill_after, timeout=DEPLOY_WAIT)
        if kill_after is not None:
            assert result.returncode == -signal.SIGKILL, (command, result.stdout[-2000:] + result.stderr[-2000:])
            wait_lease_orphaned(pool)
        else:
            assert result.returncode == 0, (command, result.stdout[-3000:] + result.stderr[-3000:])
            assert "Traceback" not in result.stderr
    if ends == "cohorts":
        wait_instances(pool, lambda now: now == before, "both cohorts back at their counts")
        alive = pool.alive()
    else:
        new = pool.new_revision()
        wait_instances(pool, lambda now: now == {new: 2}, "every instance on the new revision")
        wait_for(lambda: not any(pool.alive(rev) for rev in before), WAIT, "the cohorts' workers to be gone")
        alive = pool.alive(new)
    assert pool.fence() is None
    wait_consuming(redis_control, alive, pool.queue)
    ids = enqueue(pool.redis_url, pool.queue, 0.1, n=4)  # whoever consumes at the end runs them, once each
    all_finished(redis_client, ids, "the tasks sent after the recovery")
    assert all(runs(redis_client, t)["runs"] == 1 for t in ids)
