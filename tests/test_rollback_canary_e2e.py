"""``celeryops rollback`` after a canary deploy (issue 34, item 3), end to end: the real CLI, the Cloud Run stand-in
whose worker pool instances are real fence-plugin Celery workers, one real Redis, a steady stream of tasks.

- A canary promoted on a pool that ran a revision before it: ``rollback --yes`` (the target's strategy is canary, no
  ``--strategy``) goes back to the revision the canary replaced, the overlap's way: the previous revision comes up
  beside the deployed one and consumes, only the deployed revision's workers stop and are drained, then every
  instance moves back. Processing never pauses, every task runs exactly once; ``runs --json`` shows the canary
  deploy's ``previous`` as it shows a drain deploy's.
- Bad input: a canary deploy whose previous revision was deleted since: one sentence, exit 2, nothing changed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from celery import Celery

from celeryops.demo.standins.cloudrun import CloudRunStandIn, standin_config
from celeryops.ops.journal import OVERLAP_CUTOVER, OVERLAP_UP, Journal
from celeryops.ops.run.pool.rules import Plan
from celeryops_harness.taskapp import work
from celeryops_harness.workers import wait_for
from clihelp import CliProcess, cli_env, run_cli
from drainhelp import finished, runs
from overlaphelp import WAIT, Pool, Producer, all_finished, running_pool, steps, wait_consuming

pytestmark = pytest.mark.slow

CANARY = {"look_interval": 1, "min_tasks": 30, "max_duration": 90, "alpha": 0.05}  # as tests/test_canary_e2e.py
EVERY = 0.05
STEPS = ["planned", "scaling_up", "scaled_up", "consuming", "stopping_old", "old_idle", "cutting_over", "cut_over"]


def promoted(pool: Pool, producer: Producer) -> str:
    """A good release deployed as a canary and promoted; returns its revision, which then runs every instance."""
    proc = CliProcess(pool.args(), pool.env, cwd=pool.dir)
    try:
        assert proc.proc.wait(240) == 0, proc.read_stderr()[-3000:]
        proc.finish()
    finally:
        proc.kill()
    assert proc.events[-1]["event"] == "deployed", proc.events[-1]
    new = pool.new_revision()
    wait_for(lambda: pool.instances() == {new: pool.count} and not pool.alive(pool.old), WAIT,
             "the canary's revision alone")
    assert producer.ids  # the stream ran through the canary
    return new


def test_rollback_after_a_promoted_canary_goes_back_without_a_pause(
        tmp_path: Path, redis_url: str, queue_name: str, redis_client: redis.Redis, redis_control: Celery) -> None:
    with running_pool(tmp_path, redis_url, queue_name, strategy="canary", canary=CANARY) as pool:
        config = pool.dir / "celeryops.toml"  # the target's own strategy: rollback takes it (no --strategy)
        config.write_text(config.read_text().replace("insecure = true", 'insecure = true\nstrategy = "canary"'))
        previous = pool.old
        producer = Producer(redis_url, pool.queue, task=work, seconds=0.02, every=EVERY)
        with producer:
            deployed = promoted(pool, producer)
            history = json.loads(run_cli(["runs", "--json"], pool.env, cwd=pool.dir).stdout)
            assert history[0]["kind"] == "deploy" and history[0]["previous"] == {"worker": f"{previous} 100%"}, \
                history[0]
            proc = CliProcess(["rollback", "--yes", "--accept-warnings", "--json"], pool.env, cwd=pool.dir)
            try:
                assert proc.proc.wait(240) == 0, proc.read_stderr()[-3000:]
                proc.finish()
            finally:
                proc.kill()
        events = proc.events
        done = events[-1]
        assert done["event"] == "rolled_back" and done["exit_code"] == 0, done
        assert done["message"].startswith(f"Rolled back (worker serves revision {previous}) without a pause"), done
        assert steps(events) == STEPS, steps(events)
        planned = next(e for e in events if e["event"] == "overlap" and e["step"] == "planned")
        assert (planned["old_revision"], planned["new_revision"], planned["peak"]) == (deployed, previous, 4)
        stage = next(e for e in events if e["event"] == "stage" and e["stage"] == "preflight")
        assert stage["strategy"] == "canary", stage

        # Processing never paused: while the deployed revision drained, the previous one completed tasks.
        at = {e["step"]: e["_at"] for e in events if e["event"] == "overlap" and e["step"] != "progress"}
        all_finished(redis_client, producer.ids, "every task to finish")
        assert all(runs(redis_client, t)["runs"] == 1 for t in producer.ids)
        during = [runs(redis_client, t) for t in finished(redis_client, producer.ids)]
        during = [r for r in during if at["stopping_old"] <= r["finished"] <= at["old_idle"]]
        assert previous in {pool.workers.revision_of.get(r["worker"], "?") for r in during}, during

        # Back on the revision the canary replaced, at the original count; the run history says so.
        wait_for(lambda: pool.instances() == {previous: pool.count}, WAIT, "every instance on the previous revision")
        wait_for(lambda: not pool.alive(deployed), WAIT, "the canary's revision's workers to be gone")
        wait_consuming(redis_control, pool.alive(previous), pool.queue)
        assert pool.fence() is None
        history = json.loads(run_cli(["runs", "--json"], pool.env, cwd=pool.dir).stdout)
        assert [(r["kind"], r["phase"]) for r in history[:2]] == [("rollback", "done"), ("deploy", "done")]


def canary_record(journal: Journal, *, old: str, new: str, count: int) -> str:
    """A canary deploy of pool ``worker`` from ``old`` to ``new``, promoted and cut over, as a canary run writes it:
    the canary's scale-up (what served before), the promotion's (no ``before``), the cutover."""
    run = journal.create_run(fleet="default", broker="redis://x", release="demo-2",
                             settings={"strategy": "canary", "targets": ["worker"], "new_revision": new})
    plan = Plan(target="worker", old=old, new=new, count=count, image="img:2", beside=1)
    up = journal.intend(run.id, OVERLAP_UP, plan.payload(before={"count": count, "served": {old: 100}}))
    journal.settle(up, {"ok": True, "revision": new})
    journal.settle(journal.intend(run.id, OVERLAP_UP, plan.promoted().payload(promote=True)), {"ok": True})
    for phase in ("overlapping", "stopping", "draining", "drained", "cutting_over"):
        journal.advance(run.id, phase)
    journal.settle(journal.intend(run.id, OVERLAP_CUTOVER, plan.promoted().payload()), {"ok": True})
    journal.advance(run.id, "deployed")
    journal.advance(run.id, "done")
    return run.id


def test_a_canary_whose_previous_revision_was_deleted_is_one_sentence(tmp_path: Path, redis_url: str) -> None:
    """The revision the canary replaced no longer exists: one sentence naming it and the ready ones, exit 2, nothing
    changed (no run opened, the pool as it was)."""
    with CloudRunStandIn(rollout_seconds=0.05) as standin:
        standin.add_worker_pool("proj", "europe-west1", "worker", "img:2", instances=2)
        serving = standin.resource("worker").latest_ready_revision.rsplit("/", 1)[-1]
        state = tmp_path / "state"
        with Journal(state_dir=state) as journal:
            run_id = canary_record(journal, old="worker-00000-gon", new=serving, count=2)
        config = tmp_path / "celeryops.toml"
        config.write_text(standin_config(broker=redis_url, endpoint=standin.address, image="img:{sha}",
                                         kind="cloudrun-worker-pool").replace(
            "insecure = true", 'insecure = true\nstrategy = "canary"'))
        before = standin.resource("worker")
        result = run_cli(["rollback", "--yes", "--json"], cli_env(state), cwd=tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith("celeryops: Revision worker-00000-gon of Cloud Run worker pool worker") and (
            f"does not exist (it was deleted since: replaced by run {run_id}, release demo-2)" in lines[0]), lines[0]
        assert "nothing was changed" in lines[0]
        assert standin.resource("worker") == before
        with Journal(state_dir=state) as journal:
            assert [r.id for r in journal.history(5)] == [run_id]  # no run was opened

