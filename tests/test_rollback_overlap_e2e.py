"""``celeryops rollback --strategy overlap`` end to end (issues 19 and 20): a Cloud Run worker pool on the stand-in
whose instances are real fence-plugin Celery workers, deployed with overlap, then rolled back with overlap: the previous
revision comes up beside the deployed one and consumes, only the deployed revision's workers stop and are drained,
then every instance moves back at the original count. No image, no build, no pause; the split it leaves is
celeryops' own, so the next deploy moves on. Killed midway, ``abort`` recovers it as it recovers an overlap deploy."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from google.cloud import run_v2

from celeryops_harness.taskapp import until
from celeryops_harness.workers import wait_for
from clihelp import CliProcess, run_cli
from drainhelp import enqueue, finished, runs, started
from overlaphelp import (
    WAIT,
    Pool,
    Producer,
    all_finished,
    close_pool,
    events_of,
    make_pool,
    steps,
    wait_consuming,
    wait_lease_orphaned,
)

pytestmark = pytest.mark.slow

ROLLBACK = ["rollback", "--strategy", "overlap", "--yes", "--accept-warnings", "--json"]
STEPS = ["planned", "scaling_up", "scaled_up", "consuming", "stopping_old", "old_idle", "cutting_over", "cut_over"]


def deployed_with_overlap(pool: Pool) -> str:
    """Deploy the release with overlap; returns the new revision, which then runs every instance."""
    result = run_cli(pool.args(), pool.env, cwd=pool.dir, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    new = pool.new_revision()
    wait_for(lambda: pool.instances() == {new: pool.count} and not pool.alive(pool.old), WAIT,
             "the deployed revision alone")
    return new


def serves(pool: Pool, control: Celery, revision: str) -> None:
    """Every instance runs ``revision`` at the original count, its workers consume, no fence is left."""
    wait_for(lambda: pool.instances() == {revision: pool.count}, WAIT, f"every instance on {revision}")
    wait_for(lambda: len(pool.alive()) == pool.count, WAIT, "the other revision's workers to be gone")
    wait_consuming(control, pool.alive(revision), pool.queue)
    assert pool.fence() is None


def split_record(pool: Pool) -> dict[str, str]:
    annotations = pool.standin.resource("worker").annotations
    return {k: v for k, v in annotations.items() if k.startswith("celeryops/")}


def test_overlap_rollback_never_pauses_and_the_next_deploy_moves_on(
        tmp_path: Path, redis_url: str, queue_name: str, redis_client: redis.Redis, redis_control: Celery) -> None:
    """Deployed with overlap, then a deploy whose new revision fails (retired: the pool stays not Ready, its latest
    created revision the failed one, as on Cloud Run), then rolled back with overlap while a long task runs on the
    deployed revision and a steady stream of short tasks flows: the previous revision comes back beside it (2 -> 4
    instances), consumes, the deployed revision's workers stop and are drained (the long task ends where it started),
    every instance moves back; the rollback's updates change only the split and the count, so they finish although
    the pool is not Ready. Every task runs exactly once, and short tasks kept completing throughout."""
    pool = make_pool(tmp_path, redis_url, queue_name)
    try:
        previous = pool.old
        deployed = deployed_with_overlap(pool)
        deployed_workers = {w.nodename for w in pool.alive(deployed)}
        pool.standin.fail_next_rollout("worker")
        failed = run_cli(pool.args(), pool.env, cwd=pool.dir, timeout=240)
        assert failed.returncode == 6 and steps(events_of(failed.stdout))[-1] == "retired", failed.stdout[-3000:]
        broken = pool.standin.resource("worker")
        assert broken.terminal_condition.state == run_v2.Condition.State.CONDITION_FAILED
        assert broken.latest_ready_revision.endswith(f"/{deployed}") and broken.latest_created_revision != \
            broken.latest_ready_revision
        wait_for(lambda: pool.instances() == {deployed: pool.count}, WAIT, "the deployed revision alone again")
        with until.app.connection_for_write(redis_url) as conn:
            long_task = until.apply_async(args=("rollback-test:long",), queue=pool.queue, connection=conn).id
        wait_for(lambda: started(redis_client, [long_task]), WAIT, "the long task to start on the deployed revision")
        with Producer(redis_url, pool.queue) as producer:
            proc = CliProcess(ROLLBACK, pool.env, cwd=pool.dir)
            try:
                proc.wait_event("poll", 240, where=lambda e: e["active"] >= 1)  # the deployed revision stopped, busy
                redis_client.set("rollback-test:long", 1)
                done = proc.wait_event("rolled_back", 240)
                assert proc.finish() == 0, proc.read_stderr()
            finally:
                proc.kill()
        all_finished(redis_client, [long_task, *producer.ids], "every task to finish")
        assert all(runs(redis_client, t)["runs"] == 1 for t in [long_task, *producer.ids])
        events = proc.events
        assert steps(events) == STEPS, steps(events)
        at = {e["step"]: e["_at"] for e in events if e["event"] == "overlap" and e["step"] != "progress"}
        planned = next(e for e in events if e["event"] == "overlap" and e["step"] == "planned")
        assert (planned["old_revision"], planned["new_revision"], planned["peak"]) == (deployed, previous, 4)

        # The long task ran where it started, and ended before the deployed revision's instances were told to go.
        record = runs(redis_client, long_task)
        assert record["worker"] in deployed_workers and record["finished"] <= at["cutting_over"]
        # Processing never paused: while the deployed revision drained, the previous one completed short tasks.
        during = [runs(redis_client, t) for t in finished(redis_client, producer.ids)]
        during = [r for r in during if at["stopping_old"] <= r["finished"] <= at["old_idle"]]
        assert previous in {r["worker"].split("@")[1].split(".")[0] for r in during}, during
        polls = [e for e in events if e["event"] == "poll"]
        assert polls and all(set(p["workers"]) <= deployed_workers for p in polls)
        drained = next(e for e in events if e["event"] == "drained")
        assert drained["message"].startswith(f"The deployed revision {deployed} is idle: every instance moves to "
                                             f"{previous} next."), drained

        # Back on the previous revision: no new revision, no image, no build; the split is celeryops' own.
        serves(pool, redis_control, previous)
        assert len(pool.standin.revisions("worker")) == 3  # the rollback made none (the third one failed)
        still = pool.standin.resource("worker")  # still not Ready: only a good revision makes it Ready again
        assert still.terminal_condition.state == run_v2.Condition.State.CONDITION_FAILED
        assert still.latest_created_revision == broken.latest_created_revision
        assert split_record(pool) == {"celeryops/split": f"{previous}=100",
                                      "celeryops/split-by": f"rollback run {json_runs(pool)[0]['id']}"}
        (target,) = done["targets"]
        assert (target["target"], target["revision"], target["previous_revision"]) == ("worker", previous, deployed)
        assert target["rolled_back"] is True and target["image"].endswith("/proj/worker:old")
        log_uri = next(r.log_uri for r in pool.standin.revisions("worker") if r.name.endswith(f"/{previous}"))
        assert target["logs_url"] == log_uri
        assert done["message"].startswith(f"Rolled back (worker serves revision {previous}) without a pause"), done
        checks = {e["id"]: e["status"] for e in events if e["event"] == "check" and e["status"] != "running"}
        assert {"revision", "permissions", "traffic", "validate", "fence", "mixed_versions"} <= set(checks), checks
        assert checks["mixed_versions"] == "warn" and checks["fence"] == "ok" and checks["traffic"] == "ok"
        assert not {"branch", "image", "freshness"} & set(checks)  # nothing is built
        detail = {e["id"]: e["detail"] for e in events if e["event"] == "check" and e["status"] != "running"}
        assert "the rollback runs 2 of" in detail["traffic"] and "4 instances at the peak" in detail["traffic"]
        assert detail["mixed_versions"].startswith(f"the deployed revision {deployed} and the previous one")
        # Both pool updates route to existing revisions: nothing is rolled out.
        assert [e["step"] for e in events if e["event"] == "deploy" and e["step"] in ("started", "routing")] == [
            "routing", "routing"]
        history = json_runs(pool)
        assert [(r["kind"], r["phase"]) for r in history[:3]] == [("rollback", "done"), ("deploy", "aborted"),
                                                                   ("deploy", "done")]

        # The next deploy (a drain deploy: it refuses a pinned split that is not celeryops' own) moves on.
        again = run_cli(["deploy", "demo-2", "--strategy", "drain", "--yes", "--accept-warnings", "--json", "--repo",
                         str(pool.git.work)], pool.env, cwd=pool.dir, timeout=240)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        check = next(e for e in events_of(again.stdout) if e["event"] == "check" and e["id"] == "traffic"
                     and e["status"] != "running")
        assert check["status"] == "ok" and "left by a celeryops rollback" in check["detail"], check
        assert split_record(pool) == {}
    finally:
        close_pool(pool)


def json_runs(pool: Pool) -> list[dict[str, Any]]:
    return json.loads(run_cli(["runs", "--json"], pool.env, cwd=pool.dir).stdout)  # type: ignore[no-any-return]


def orphaned(pool: Pool) -> dict[str, Any]:
    """Once the killed run's lease is orphaned: ``status --json`` (what recovery would do)."""
    wait_lease_orphaned(pool)
    return json.loads(run_cli(["status", "--json"], pool.env, cwd=pool.dir).stdout)  # type: ignore[no-any-return]


# Killed right after a record of the rollback, then `celeryops abort` or `resume`, as an overlap deploy is recovered:
# (the killed point, the command, what status says recovery does, where the pool ends). A cutover begun is finished
# (every instance on the previous revision); before it, abort retires the previous revision again (the deployed one
# serves, as before), resume goes on with the rollback.
CASES = [
    ("intent:overlap_cutover", "abort", "cutover", "previous"),
    ("settle:overlap_up", "abort", "retire", "deployed"),
    ("intent:cancel_consumers", "abort", "retire", "deployed"),
    ("settle:overlap_up", "resume", "retire", "previous"),
    ("phase:drained", "resume", "retire", "previous"),
]


@pytest.mark.parametrize(("kill_after", "command", "action", "ends_on"), CASES,
                         ids=[f"{k}-{c}" for k, c, _a, _e in CASES])
def test_killed_overlap_rollback_recovers_to_a_consistent_fleet(
        tmp_path: Path, redis_url: str, queue_name: str, redis_client: redis.Redis, redis_control: Celery,
        kill_after: str, command: str, action: str, ends_on: str) -> None:
    pool = make_pool(tmp_path, redis_url, queue_name, count=1)
    try:
        previous = pool.old
        deployed = deployed_with_overlap(pool)
        killed = run_cli(ROLLBACK, pool.env, cwd=pool.dir, kill_after=kill_after, timeout=240)
        assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
        status = orphaned(pool)
        assert status["run"]["kind"] == "rollback" and status["recovery"]["action"] == action, status
        ids = enqueue(pool.redis_url, pool.queue, 0.1, n=4)  # waiting tasks: whoever consumes at the end runs them
        recovered = run_cli([command, "--json"], pool.env, cwd=pool.dir, timeout=240)
        assert recovered.returncode == 0, recovered.stdout[-3000:] + recovered.stderr[-3000:]
        assert "Traceback" not in recovered.stderr
        final = events_of(recovered.stdout)[-1]
        history = json_runs(pool)
        if ends_on == "previous":  # rolled back: every instance on the previous revision, the split celeryops' own
            serves(pool, redis_control, previous)
            assert split_record(pool)["celeryops/split"] == f"{previous}=100"
            assert (history[0]["kind"], history[0]["phase"]) == ("rollback", "done")
            if command == "resume":
                assert final["event"] == "rolled_back" and final["targets"][0]["revision"] == previous, final
                assert final["targets"][0]["rolled_back"] is True and final["targets"][0]["logs_url"], final
            else:
                assert final["event"] == "abort" and final["action"] == "cutover", final
        else:  # the previous revision was retired again: the deployed one serves, pinned by celeryops
            serves(pool, redis_control, deployed)
            assert split_record(pool)["celeryops/split"] == f"{deployed}=100"
            assert final["event"] == "abort" and final["action"] == "retire", final
            assert final["message"].startswith(f"The previous revision {previous} was retired"), final
            assert (history[0]["kind"], history[0]["phase"]) == ("rollback", "aborted")
        all_finished(redis_client, ids, "the waiting tasks to run")
        assert all(runs(redis_client, t)["runs"] == 1 for t in ids)
    finally:
        close_pool(pool)


def test_interrupted_overlap_rollback_retires_the_previous_revision_before_exiting(
        tmp_path: Path, redis_url: str, queue_name: str, redis_control: Celery) -> None:
    """Ctrl-C once the previous revision consumes beside the deployed one: the abort's rules run before the process
    exits 130 (the previous revision is retired again), and the deployed revision serves as before."""
    pool = make_pool(tmp_path, redis_url, queue_name, count=1)
    try:
        deployed = deployed_with_overlap(pool)
        proc = CliProcess(ROLLBACK, pool.env, cwd=pool.dir)
        try:
            proc.wait_event("overlap", 240, where=lambda e: e["step"] == "consuming")
            proc.signal(signal.SIGINT)
            assert proc.finish(240) == 130, proc.read_stderr()
        finally:
            proc.kill()
        final = proc.events[-1]
        assert final["event"] == "interrupted" and final["recovered"] is True, final
        assert steps(proc.events)[-1] == "retired", steps(proc.events)
        notices = [e["message"] for e in proc.events if e["event"] == "notice"]
        assert any(n.startswith("Interrupted: applying the overlap rollback's recovery rules") for n in notices)
        serves(pool, redis_control, deployed)
        assert json_runs(pool)[0]["kind"] == "rollback" and json_runs(pool)[0]["phase"] == "aborted"
    finally:
        close_pool(pool)

def test_service_target_is_refused_in_one_sentence(tmp_path: Path, redis_url: str) -> None:
    """A service splits requests, not queue consumers: ``rollback --strategy overlap`` on a service target, or
    strategy = "overlap" in its table (the configuration refuses it), is refused before anything is contacted."""
    from celeryops.demo.standins.cloudrun import standin_config
    from clihelp import cli_env

    config = tmp_path / "celeryops.toml"
    config.write_text(standin_config(broker=redis_url, endpoint="127.0.0.1:9", image="img:{sha}"))
    env = cli_env(tmp_path / "state")
    flag = run_cli(["rollback", "--strategy", "overlap", "--yes", "--json"], env, cwd=tmp_path)
    config.write_text(config.read_text().replace("insecure = true", 'insecure = true\nstrategy = "overlap"'))
    table = run_cli(["rollback", "--yes", "--json"], env, cwd=tmp_path)
    for result in (flag, table):
        assert result.returncode == 2, result.stdout + result.stderr
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "worker pool" in lines[0] and "service" in lines[0], result.stderr
        assert "Traceback" not in result.stderr
    assert "roll it back with --strategy drain" in flag.stderr, flag.stderr
    assert not (tmp_path / "state" / "journal.sqlite3").exists()  # nothing was started
