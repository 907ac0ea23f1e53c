"""``celeryops deploy`` end to end: real git remote, registry stand-in, the real google-cloud-run client against
the local Cloud Run stand-in, real Celery workers as the stand-in's instances (the new revision's start before the
old ones get SIGTERM) (issue 5)."""

from __future__ import annotations

import json
import signal
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
import redis
from celery import Celery
from google.cloud import run_v2
from google.cloud.run_v2.services.services.transports import ServicesGrpcTransport

from celeryops.demo.standins.cloudrun import CloudRunStandIn, standin_config
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops_harness.workers import RevisionFleet, wait_for
from clihelp import CliProcess, cli_env, run_cli
from drainhelp import enqueue, finished, runs, started

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path: Path, redis_url: str, queue_name: str):
    git = GitFixture(tmp_path / "git", branch="demo-2").create(commits=2, age=timedelta(days=1))
    registry = RegistryStandIn().start()
    fleet = RevisionFleet(redis_url, queue_name, tmp_path)  # the service's instances: real workers
    standin = CloudRunStandIn(rollout_seconds=0.3, launcher=fleet)
    endpoint = standin.start()
    sha = git.tip(git.remote)
    registry.seed("proj/worker", sha)
    standin.add_service("proj", "europe-west1", "worker", f"{registry.host}/proj/worker:old", instances=0)
    fleet.attach(standin, "worker")  # each test starts the instances it needs
    (tmp_path / "celeryops.toml").write_text(standin_config(
        broker=redis_url, endpoint=endpoint, image=f"{registry.host}/proj/worker:{{sha}}"))
    yield {"git": git, "registry": registry, "fleet": fleet, "standin": standin, "dir": tmp_path, "sha": sha}
    fleet.stop()
    standin.stop()
    registry.stop()


def test_deploy_drains_deploys_and_every_task_runs_once(setup, redis_url: str, redis_client: redis.Redis,
                                                        queue_name: str) -> None:
    fleet: RevisionFleet = setup["fleet"]
    fleet.start(2)
    ids = enqueue(redis_url, queue_name, 1.5, n=6)
    wait_for(lambda: started(redis_client, ids), 30, "tasks to start")
    env = cli_env(setup["dir"] / "state")
    proc = CliProcess(["deploy", "demo-2", "--yes", "--accept-warnings", "--json", "--repo", str(setup["git"].work)],
                      env, cwd=setup["dir"])
    drained = proc.wait_event("drained", 90)
    done = proc.wait_event("deployed", 90)
    assert proc.finish() == 0, proc.read_stderr()
    assert fleet.replaced.is_set()
    # Nothing ran on the old revision after the drained verdict; every task ran exactly once in the end.
    for tid in started(redis_client, ids):
        rec = runs(redis_client, tid)
        if rec["worker"] in {w.nodename for w in fleet.workers[:2]}:
            assert rec["finished"] <= drained["_at"]
    wait_for(lambda: len(finished(redis_client, ids)) == len(ids), 60, "every task to finish on the new revision")
    assert all(runs(redis_client, t)["runs"] == 1 for t in ids)
    checks = {e["id"]: e["status"] for e in proc.events if e["event"] == "check" and e["status"] != "running"}
    assert checks["branch"] in ("ok", "warn") and checks["image"] == "ok" and checks["permissions"] == "ok"
    assert "deployed" in done["message"] or done["exit_code"] == 0
    live = setup["standin"].resource("worker")
    (summary,) = done["targets"]  # where the result is
    new_revision = live.latest_ready_revision.rsplit("/", 1)[-1]
    assert summary == {"target": "worker", "image": f"{setup['registry'].host}/proj/worker:{setup['sha']}",
                       "revision": new_revision, "previous_revision": summary["previous_revision"], "url": live.uri,
                       "console_url": "https://console.cloud.google.com/run/detail/europe-west1/worker/revisions"
                                      "?project=proj",
                       "logs_url": setup["standin"].revisions("worker")[-1].log_uri}
    # The new revision's workers were started before the old ones were taken away; they all run it now.
    assert {i.revision for i in setup["standin"].instances("worker")[new_revision]} == {new_revision}
    assert set(setup["standin"].instances("worker")) == {new_revision}
    assert checks["traffic"] == "ok" and checks["validate"] == "ok"
    assert setup["standin"].validations == [live.name]  # validated once, before any consumer stopped
    history = run_cli(["runs", "--json"], env)
    assert '"done"' in history.stdout or '"succeeded"' in history.stdout


def pin_traffic(standin: CloudRunStandIn) -> str:
    """A rollback in the console: all traffic pinned to the serving revision by name."""
    name = standin.resource("worker").name
    with grpc.insecure_channel(standin.address) as chan:
        client = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
        svc = client.get_service(name=name)
        revision = svc.latest_ready_revision.rsplit("/", 1)[-1]
        svc.traffic = [run_v2.TrafficTarget(
            type_=run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_REVISION, revision=revision,
            percent=100)]
        client.update_service(service=svc).result(timeout=30)
    return revision


@pytest.mark.parametrize(("fault", "check", "words"), [
    ("update-permission", "permissions", "roles/run.developer"),
    ("act-as", "validate", "roles/iam.serviceAccountUser on the runtime service account"),
    ("pinned-traffic", "traffic", 'set traffic = \\"latest\\"'),
])
def test_preflight_failure_touches_nothing_exit_5(setup, redis_url: str, redis_client: redis.Redis, fault: str,
                                                  check: str, words: str) -> None:
    """Found before a consumer is stopped: a missing Run permission, a missing actAs on the runtime service account
    (only Cloud Run's validate_only can tell), a traffic split pinned by a console rollback."""
    fleet: RevisionFleet = setup["fleet"]
    (worker,) = fleet.start(1)
    standin: CloudRunStandIn = setup["standin"]
    if fault == "update-permission":
        standin.grant(["run.services.get", "run.operations.get"])
    elif fault == "act-as":
        standin.act_as(["someone-else@proj.iam.gserviceaccount.com"])
    else:
        pin_traffic(standin)
    generation = standin.resource("worker").generation
    env = cli_env(setup["dir"] / "state")
    result = run_cli(["deploy", "demo-2", "--yes", "--accept-warnings", "--json", "--repo",
                      str(setup["git"].work)], env, cwd=setup["dir"])
    assert result.returncode == 5, result.stdout + result.stderr
    failed = [line for line in result.stdout.splitlines() if f'"id": "{check}"' in line and '"fail"' in line]
    assert failed and words in failed[0], result.stdout
    assert standin.updates == [] and standin.resource("worker").generation == generation
    app = Celery("t", broker=redis_url)
    replies = app.control.inspect(destination=[worker.nodename], timeout=2, limit=1).active_queues() or {}
    assert [q["name"] for q in replies[worker.nodename]] == [fleet.queue]  # consumers untouched


def test_failed_rollout_restores_consumers_exit_6(setup, redis_url: str) -> None:
    fleet: RevisionFleet = setup["fleet"]
    (worker,) = fleet.start(1)
    setup["standin"].fail_next_rollout("worker")  # Cloud Run's own several-line message with a Logs URL
    env = cli_env(setup["dir"] / "state")
    result = run_cli(["deploy", "demo-2", "--yes", "--accept-warnings", "--json", "--repo",
                      str(setup["git"].work)], env, cwd=setup["dir"])
    assert result.returncode == 6, result.stdout + result.stderr
    final = json.loads(result.stdout.splitlines()[-1])
    assert final["event"] == "deploy_failed" and "user-provided container failed to start" in final["message"]
    assert "Logs URL" not in final["message"] and "troubleshooting" not in final["message"]
    assert final["logs_url"].startswith("https://console.cloud.google.com/logs/viewer?project=proj&")
    app = Celery("t", broker=redis_url)
    replies = app.control.inspect(destination=[worker.nodename], timeout=2, limit=1).active_queues() or {}
    assert [q["name"] for q in replies[worker.nodename]] == [fleet.queue]  # old workers consume again
    assert not fleet.replaced.is_set()


def test_interrupted_while_the_broker_is_down_says_the_consumers_are_still_stopped(
        setup, redis_url: str, redis_server: RedisServer) -> None:
    """The rollout fails while the broker (Redis) is down, the restore keeps trying, Ctrl-C arrives, and the broker
    stays down past the recovery's patience: the deploy must not claim the recovery rules were applied. It exits
    130 naming the run whose consumers are still stopped (`recovered: false`); once the broker is back,
    `celeryops abort` restores them."""
    fleet: RevisionFleet = setup["fleet"]
    (worker,) = fleet.start(1)
    setup["standin"].fail_next_rollout("worker")
    setup["standin"].slow_next_rollout("worker", 3.0)  # time to stop the broker while it rolls out
    env = cli_env(setup["dir"] / "state", CELERYOPS_RECOVERY_PATIENCE="10")
    deploy = CliProcess(["deploy", "demo-2", "--yes", "--accept-warnings", "--json", "--repo",
                         str(setup["git"].work)], env, cwd=setup["dir"])
    try:
        deploy.wait_event("stage", 120, where=lambda e: e.get("stage") == "deploy")
        redis_server.stop()
        deploy.wait_event("notice", 60, where=lambda e: "restore keeps trying" in e.get("message", ""))
        deploy.proc.send_signal(signal.SIGINT)
        assert deploy.proc.wait(120) == 130
        last = [e for e in deploy.events if e["event"] != "text"]
        while (event := deploy.next_event(10)) is not None:
            last.append(event)
        final = last[-1]
        assert final["event"] == "interrupted" and final["recovered"] is False, final
        assert "still has consumers stopped" in final["message"] and "celeryops abort" in final["message"]
        assert "still has consumers stopped" in deploy.read_stderr()
    finally:
        if deploy.proc.poll() is None:
            deploy.proc.kill()
        redis_server.start()
    app = Celery("t", broker=redis_url)

    def consuming() -> list[str] | None:
        try:  # the broker restarted: a first connection of this client may still meet the old socket
            replies = app.control.inspect(destination=[worker.nodename], timeout=2, limit=1).active_queues() or {}
        except Exception:
            return None
        return None if worker.nodename not in replies else [q["name"] for q in replies[worker.nodename] or []]

    # The worker reconnects on its own back-off (Celery: up to 12 s between tries); the operator aborts once
    # `celeryops status` shows the fleet again. Its queue is still stopped: nothing restored it meanwhile.
    wait_for(lambda: consuming() == [], 120, "the old worker to reconnect, still stopped")
    aborted = run_cli(["abort", "--json"], env, cwd=setup["dir"])
    assert aborted.returncode == 0, aborted.stdout[-2000:] + aborted.stderr[-2000:]
    wait_for(lambda: consuming() == [fleet.queue], 60, "the old worker to consume again after the abort")


@pytest.mark.parametrize(("kill_after", "resumed_exit"), [("phase:drained", 0), ("settle:deploy_start", 0),
                                                          ("intent:deploy_start", 6)])
def test_resume_finishes_an_interrupted_deploy(setup, redis_url: str, redis_client: redis.Redis, kill_after: str,
                                               resumed_exit: int) -> None:
    """SIGKILL at a precise journal record; `celeryops resume` follows the recovery rules from there: drained ->
    drain again and deploy; deploy settled -> the new revision is ready, finish; deploy intended but never sent ->
    it never took effect, restore the old workers' consumers (exit 6)."""
    fleet: RevisionFleet = setup["fleet"]
    (old,) = fleet.start(1)
    env = cli_env(setup["dir"] / "state", CELERYOPS_LEASE_TTL="1")
    args = ["deploy", "demo-2", "--yes", "--accept-warnings", "--json", "--repo", str(setup["git"].work)]
    killed = run_cli(args, env, cwd=setup["dir"], kill_after=kill_after)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-1500:] + killed.stderr[-1500:]
    wait_for(lambda: '"orphaned": true' in run_cli(["status", "--json"], env, cwd=setup["dir"]).stdout, 30,
             "the killed run's lease to be orphaned")
    resumed = run_cli(["resume", "--json"], env, cwd=setup["dir"])
    assert resumed.returncode == resumed_exit, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "Traceback" not in resumed.stderr
    app = Celery("t", broker=redis_url)
    if resumed_exit == 0:
        assert fleet.replaced.is_set() or kill_after == "settle:deploy_start"
        new = [w for w in fleet.workers if w is not old]
        assert new, "the new revision's workers were started"
        replies = app.control.inspect(destination=[new[-1].nodename], timeout=2, limit=1).active_queues() or {}
        assert [q["name"] for q in replies[new[-1].nodename]] == [fleet.queue]
    else:
        replies = app.control.inspect(destination=[old.nodename], timeout=2, limit=1).active_queues() or {}
        assert [q["name"] for q in replies[old.nodename]] == [fleet.queue]  # old workers consume again
    history = run_cli(["runs", "--json"], env, cwd=setup["dir"])
    assert history.returncode == 0
    assert ('"done"' in history.stdout) == (resumed_exit == 0)


def test_warnings_accepted_per_check(setup, redis_url: str) -> None:
    """The fence check warns (plain workers): without acceptance nothing is touched (exit 5) and the message
    names the flag; `[preflight] accept = ["fence"]` in the config lets the same deploy through."""
    fleet: RevisionFleet = setup["fleet"]
    fleet.start(1)
    env = cli_env(setup["dir"] / "state")
    args = ["deploy", "demo-2", "--yes", "--json", "--repo", str(setup["git"].work)]
    refused = run_cli(args, env, cwd=setup["dir"])
    assert refused.returncode == 5, refused.stdout + refused.stderr
    final = json.loads(refused.stdout.splitlines()[-1])
    assert final["event"] == "preflight_failed" and "--accept-warning fence" in final["message"]
    assert setup["standin"].updates == [] and not fleet.replaced.is_set()
    config = setup["dir"] / "celeryops.toml"
    config.write_text(config.read_text().replace("[release]", '[preflight]\naccept = ["fence"]\n\n[release]'))
    accepted = run_cli(args, env, cwd=setup["dir"])
    assert accepted.returncode == 0, accepted.stdout[-2000:] + accepted.stderr[-2000:]
    events = [json.loads(line) for line in accepted.stdout.splitlines() if line.startswith("{")]
    fence = [e for e in events if e["event"] == "check" and e["id"] == "fence" and e["status"] != "running"]
    assert fence and fence[0]["status"] == "warn" and fence[0]["accepted"] is True
    assert events[-1]["event"] == "deployed" and fleet.replaced.is_set()
