"""The overlap deploy of a Cloud Run worker pool end to end (issue 19): the real CLI, the real google-cloud-run client
against the stand-in, whose instances are real fence-plugin Celery workers, one real Redis (broker, fence, journal,
task records). The new revision consumes while only the old revision's workers stop; the old instances go once idle."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from celery import Celery

from celeryops_harness.taskapp import until
from celeryops_harness.workers import wait_for
from clihelp import CliProcess, run_cli
from drainhelp import finished, runs, started
from overlaphelp import (
    WAIT,
    Producer,
    all_finished,
    running_pool,
    steps,
    wait_consuming,
)

pytestmark = pytest.mark.slow


def test_overlap_deploy_never_pauses_and_kills_no_task(tmp_path: Path, redis_url: str, queue_name: str,
                                                        redis_client: redis.Redis, redis_control: Celery) -> None:
    """Two long tasks run on the old revision, a steady stream of short tasks flows throughout: the new revision
    comes up beside the old one (2 -> 4 instances, none taken away), consumes, only the old workers stop, and the
    old instances are taken away once their long tasks finished (they end only after the old workers stopped, so
    the drain waits for them). Every task runs exactly once."""
    with running_pool(tmp_path, redis_url, queue_name) as pool:
        old_workers = {w.nodename for w in pool.alive(pool.old)}
        with until.app.connection_for_write(redis_url) as conn:
            long_ids = [until.apply_async(args=("overlap-test:long",), queue=pool.queue, connection=conn).id
                        for _ in range(2)]
        wait_for(lambda: len(started(redis_client, long_ids)) == 2, WAIT, "the long tasks to start on the old revision")
        with Producer(redis_url, pool.queue) as producer:
            proc = CliProcess(pool.args(), pool.env, cwd=pool.dir)
            try:
                proc.wait_event("poll", 240, where=lambda e: e["active"] >= 2)  # the old revision stopped, still busy
                redis_client.set("overlap-test:long", 1)
                done = proc.wait_event("deployed", 240)
                assert proc.finish() == 0, proc.read_stderr()
            finally:
                proc.kill()
        all_finished(redis_client, [*long_ids, *producer.ids], "every task to finish")
        assert all(runs(redis_client, t)["runs"] == 1 for t in [*long_ids, *producer.ids])
        events = proc.events
        at = {e["step"]: e["_at"] for e in events if e["event"] == "overlap" and e["step"] != "progress"}
        assert steps(events) == ["planned", "scaling_up", "scaled_up", "consuming", "stopping_old", "old_idle",
                                 "cutting_over", "cut_over"], steps(events)
        new = pool.new_revision()
        planned = next(e for e in events if e["event"] == "overlap" and e["step"] == "planned")
        assert (planned["old_revision"], planned["new_revision"], planned["peak"]) == (pool.old, new, 4)

        # The long tasks ran on the old revision and ended before its instances were told to go.
        for tid in long_ids:
            record = runs(redis_client, tid)
            assert record["worker"] in old_workers and record["finished"] <= at["cutting_over"]
        # Processing never paused: while the old revision drained, the new one completed short tasks (the old one
        # finished only what it had taken before it stopped).
        during = [runs(redis_client, t) for t in finished(redis_client, producer.ids)]
        during = [r for r in during if at["stopping_old"] <= r["finished"] <= at["old_idle"]]
        assert new in {r["worker"].split("@")[1].split(".")[0] for r in during}, during
        # The old revision's drain looked at the old workers only.
        polls = [e for e in events if e["event"] == "poll"]
        assert polls and all(set(p["workers"]) <= old_workers for p in polls)
        assert all(e["consuming"] for e in events if e["event"] == "overlap" and e["step"] == "progress"
                   and e["_at"] > at["consuming"])
        # Never fewer than the old revision's instances while it ran: 4 at the peak, back to 2 of the new one.
        assert pool.instances() == {new: 2}
        assert pool.fence() is None
        wait_consuming(redis_control, pool.alive(new), pool.queue)
        (summary,) = done["targets"]
        assert (summary["revision"], summary["previous_revision"]) == (new, pool.old)
        history = run_cli(["runs", "--json"], pool.env)
        assert '"done"' in history.stdout, history.stdout


def test_service_target_is_refused_in_one_sentence(tmp_path: Path, redis_url: str) -> None:
    """Services split requests, not queue consumers: --strategy overlap on a service target, or strategy =
    "overlap" in its table, is refused before anything is contacted."""
    from celeryops.demo.standins.cloudrun import standin_config
    from clihelp import cli_env

    config = tmp_path / "celeryops.toml"
    config.write_text(standin_config(broker=redis_url, endpoint="127.0.0.1:9", image="img:{sha}"))
    env = cli_env(tmp_path / "state")
    flag = run_cli(["deploy", "demo-2", "--strategy", "overlap", "--yes", "--json"], env, cwd=tmp_path)
    config.write_text(config.read_text().replace("insecure = true", 'insecure = true\nstrategy = "overlap"'))
    table = run_cli(["deploy", "demo-2", "--yes", "--json"], env, cwd=tmp_path)
    for result in (flag, table):
        assert result.returncode == 2, result.stdout + result.stderr
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "worker pool" in lines[0] and "service" in lines[0], result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "state" / "journal.sqlite3").exists()  # nothing was started
