"""``celeryops rollback`` end to end (issue 20): a real git remote and registry stand-in for the deploy before it,
the real google-cloud-run client against the Cloud Run stand-in, real Celery workers as the stand-in's instances
(each revision's own), real redis-server. A rollback drains like a deploy, routes the service back to the revision
its last deploy replaced (no new revision), the old revision's workers consume again, and the next deploy moves
everything to its new revision without ``traffic = "latest"``; an interrupted rollback recovers like a deploy."""

from __future__ import annotations

import json
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celeryops.demo.standins.cloudrun import CloudRunStandIn, standin_config
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops_harness.workers import RevisionFleet, wait_for
from clihelp import CliProcess, cli_env, run_cli
from drainhelp import enqueue, finished, runs, started

pytestmark = pytest.mark.slow

SERVICE = "worker"


@pytest.fixture
def setup(tmp_path: Path, redis_url: str, queue_name: str):
    """A service running one instance of its first revision, then deployed once (release demo-2): the second
    revision serves, the first is what that deploy replaced."""
    git = GitFixture(tmp_path / "git", branch="demo-2").create(commits=2, age=timedelta(days=1))
    registry = RegistryStandIn().start()
    fleet = RevisionFleet(redis_url, queue_name, tmp_path)
    standin = CloudRunStandIn(rollout_seconds=0.3, launcher=fleet)
    endpoint = standin.start()
    sha = git.tip(git.remote)
    registry.seed("proj/worker", sha)
    standin.add_service("proj", "europe-west1", SERVICE, f"{registry.host}/proj/worker:old", instances=0)
    fleet.attach(standin, SERVICE)
    (tmp_path / "celeryops.toml").write_text(standin_config(
        broker=redis_url, endpoint=endpoint, image=f"{registry.host}/proj/worker:{{sha}}"))
    env = cli_env(tmp_path / "state", CELERYOPS_LEASE_TTL="1")
    try:
        fleet.start(1)
        first = short(standin.resource(SERVICE).latest_ready_revision)
        deployed = run_cli(["deploy", "demo-2", "--yes", "--accept-warnings", "--json", "--repo", str(git.work)],
                           env, cwd=tmp_path)
        assert deployed.returncode == 0, deployed.stdout[-2000:] + deployed.stderr[-2000:]
        second = short(standin.resource(SERVICE).latest_ready_revision)
        assert first != second and standin.wait_rollouts(30)
        yield {"git": git, "fleet": fleet, "standin": standin, "dir": tmp_path, "env": env, "first": first,
               "second": second, "image": f"{registry.host}/proj/worker:old"}
    finally:
        fleet.stop()
        standin.stop()
        registry.stop()


def short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def serving(standin: CloudRunStandIn) -> list[tuple[str, int]]:
    return [(short(s.revision), s.percent) for s in standin.resource(SERVICE).traffic_statuses if s.percent]


def consuming(app: Celery, fleet: RevisionFleet, revision: str) -> dict[str, list[str]]:
    """The queues each running worker of ``revision`` consumes (the stand-in's instances of it)."""
    names = [w.nodename for w in fleet.instances.alive(revision)]
    if not names:
        return {}
    replies = app.control.inspect(destination=names, timeout=3, limit=len(names)).active_queues() or {}
    return {n: sorted(q["name"] for q in replies.get(n) or []) for n in names}


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_rollback_drains_routes_back_and_the_next_deploy_moves_on(setup, redis_url: str, redis_client: redis.Redis,
                                                                  queue_name: str) -> None:
    fleet: RevisionFleet = setup["fleet"]
    standin: CloudRunStandIn = setup["standin"]
    first, second = setup["first"], setup["second"]
    ids = enqueue(redis_url, queue_name, 1.5, n=4)
    wait_for(lambda: started(redis_client, ids), 30, "tasks to start on the deployed revision")

    proc = CliProcess(["rollback", "--yes", "--accept-warnings", "--json"], setup["env"], cwd=setup["dir"])
    drained = proc.wait_event("drained", 90)
    done = proc.wait_event("rolled_back", 90)
    assert proc.finish() == 0, proc.read_stderr()
    assert drained["message"] == "Drained: no task is running; rolling back next.", drained

    # Nothing was killed: what ran on the deployed revision finished before the drained verdict.
    for tid in started(redis_client, ids):
        rec = runs(redis_client, tid)
        if fleet.instances.revision_of.get(rec["worker"]) == second:
            assert rec["finished"] <= drained["_at"]
    wait_for(lambda: len(finished(redis_client, ids)) == len(ids), 60, "every task to finish")
    assert all(runs(redis_client, t)["runs"] == 1 for t in ids)
    # Routed back: no new revision, no image; the first revision serves and its workers consume again.
    assert serving(standin) == [(first, 100)] and len(standin.revisions(SERVICE)) == 2
    app = Celery("t", broker=redis_url)
    wait_for(lambda: consuming(app, fleet, first) and all(q == [queue_name] for q in
                                                          consuming(app, fleet, first).values()),
             60, "the first revision's workers to consume")
    assert standin.wait_rollouts(30) and set(standin.instances(SERVICE)) == {first}
    (target,) = done["targets"]
    assert (target["target"], target["revision"], target["previous_revision"]) == ("worker", first, second)
    assert target["image"] == setup["image"] and target["rolled_back"] is True
    assert target["logs_url"] == standin.revisions(SERVICE)[0].log_uri
    checks = {e["id"]: e["status"] for e in proc.events if e["event"] == "check" and e["status"] != "running"}
    assert checks["revision"] == "ok" and checks["validate"] == "ok" and checks["permissions"] == "ok"
    assert not {"branch", "image", "freshness", "traffic"} & set(checks)  # nothing is built or rolled out
    assert next(e["step"] for e in proc.events if e["event"] == "deploy") == "routing"
    history = json.loads(run_cli(["runs", "--json"], setup["env"], cwd=setup["dir"]).stdout)
    assert [(r["kind"], r["phase"], r["release"]) for r in history][:2] == [("rollback", "done", first),
                                                                           ("deploy", "done", "demo-2")]
    text = run_cli(["runs"], setup["env"], cwd=setup["dir"]).stdout
    assert "rollback" in text.splitlines()[1]

    # Rolling back again changes nothing: the last deploy's revision already serves.
    again = run_cli(["rollback", "--yes", "--json"], setup["env"], cwd=setup["dir"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert json_lines(again.stdout)[-1]["event"] == "rolled_back" and "Nothing was changed" in again.stdout
    assert len(standin.revisions(SERVICE)) == 2 and serving(standin) == [(first, 100)]

    # The next deploy moves everything to its new revision, without traffic = "latest", and says why.
    redeploy = run_cli(["deploy", "demo-2", "--yes", "--accept-warnings", "--json", "--repo",
                        str(setup["git"].work)], setup["env"], cwd=setup["dir"])
    assert redeploy.returncode == 0, redeploy.stdout[-2000:] + redeploy.stderr[-2000:]
    events = json_lines(redeploy.stdout)
    traffic = next(e for e in events if e["event"] == "check" and e["id"] == "traffic" and e["status"] != "running")
    assert traffic["status"] == "ok" and "left by a celeryops rollback" in traffic["detail"], traffic
    third = short(standin.resource(SERVICE).latest_ready_revision)
    assert third not in (first, second) and serving(standin) == [(third, 100)]
    assert "celeryops/split" not in standin.resource(SERVICE).annotations


@pytest.mark.parametrize(("kill_after", "resumed_exit"), [("phase:drained", 0), ("settle:deploy_start", 0),
                                                          ("intent:deploy_start", 6)])
def test_resume_finishes_an_interrupted_rollback(setup, redis_url: str, queue_name: str, kill_after: str,
                                                 resumed_exit: int) -> None:
    """SIGKILL at a precise journal record, then `celeryops resume`, as for a deploy: drained -> drain again and
    route back; the route settled -> it took effect, finish; the route written ahead but never sent -> it never took
    effect, the deployed revision's workers consume again (exit 6)."""
    fleet: RevisionFleet = setup["fleet"]
    standin: CloudRunStandIn = setup["standin"]
    first, second = setup["first"], setup["second"]
    killed = run_cli(["rollback", "--yes", "--accept-warnings", "--json"], setup["env"], cwd=setup["dir"],
                     kill_after=kill_after)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-1500:] + killed.stderr[-1500:]
    status = run_cli(["status", "--json"], setup["env"], cwd=setup["dir"])
    assert json.loads(status.stdout)["run"]["kind"] == "rollback"
    wait_for(lambda: '"orphaned": true' in run_cli(["status", "--json"], setup["env"], cwd=setup["dir"]).stdout,
             30, "the killed run's lease to be orphaned")
    resumed = run_cli(["resume", "--json"], setup["env"], cwd=setup["dir"])
    assert resumed.returncode == resumed_exit, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "Traceback" not in resumed.stderr
    final = json_lines(resumed.stdout)[-1]
    app = Celery("t", broker=redis_url)
    if resumed_exit == 0:
        assert final["event"] == "rolled_back" and final["targets"][0]["revision"] == first
        assert serving(standin) == [(first, 100)]
        wait_for(lambda: bool(consuming(app, fleet, first)) and all(
            q == [queue_name] for q in consuming(app, fleet, first).values()), 60, "the first revision to consume")
    else:
        assert final["event"] == "rollback_failed" and "did not take effect" in final["message"]
        assert serving(standin) == [(second, 100)]
        wait_for(lambda: consuming(app, fleet, second) == {w.nodename: [queue_name]
                                                            for w in fleet.instances.alive(second)},
                 60, "the deployed revision's workers to consume again")
    history = json.loads(run_cli(["runs", "--json"], setup["env"], cwd=setup["dir"]).stdout)
    assert (history[0]["kind"], history[0]["phase"]) == ("rollback", "done" if resumed_exit == 0 else "aborted")


def test_abort_restores_an_interrupted_rollback(setup, redis_url: str, queue_name: str) -> None:
    """Killed once drained, before anything was routed: `celeryops abort` (any machine) restores the consumers it
    stopped; the deployed revision keeps serving."""
    fleet: RevisionFleet = setup["fleet"]
    standin: CloudRunStandIn = setup["standin"]
    second = setup["second"]
    killed = run_cli(["rollback", "--yes", "--accept-warnings", "--json"], setup["env"], cwd=setup["dir"],
                     kill_after="phase:drained")
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-1500:] + killed.stderr[-1500:]
    app = Celery("t", broker=redis_url)
    assert all(q == [] for q in consuming(app, fleet, second).values())  # stopped by the killed rollback
    wait_for(lambda: '"orphaned": true' in run_cli(["status", "--json"], setup["env"], cwd=setup["dir"]).stdout,
             30, "the killed run's lease to be orphaned")
    aborted = run_cli(["abort", "--json"], setup["env"], cwd=setup["dir"])
    assert aborted.returncode == 0, aborted.stdout[-2000:] + aborted.stderr[-2000:]
    assert json_lines(aborted.stdout)[-1]["action"] == "restore"
    wait_for(lambda: consuming(app, fleet, second) == {w.nodename: [queue_name]
                                                        for w in fleet.instances.alive(second)},
             60, "the deployed revision's workers to consume again")
    assert serving(standin) == [(second, 100)] and len(standin.revisions(SERVICE)) == 2
    history = json.loads(run_cli(["runs", "--json"], setup["env"], cwd=setup["dir"]).stdout)
    assert (history[0]["kind"], history[0]["phase"]) == ("rollback", "aborted")
