"""Preflight of the overlap deploy (issue 19): the fence plugin is required (its check fails, not warns), the peak
instance count is shown, old and new code side by side is a warning to accept; a service's tagged revision that keeps
old instances running is named by the traffic check. Nothing changes when preflight stops the deploy."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.cloud import run_v2
from google.cloud.run_v2.services.services.transports import ServicesGrpcTransport

from celeryops.demo.standins.cloudrun import CloudRunStandIn, standin_config
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.registry import RegistryStandIn
from clihelp import cli_env, run_cli
from overlaphelp import close_pool, events_of, make_pool

pytestmark = pytest.mark.slow


def checks_of(stdout: str) -> dict[str, dict[str, object]]:
    return {e["id"]: e for e in events_of(stdout) if e["event"] == "check" and e["status"] != "running"}


def test_plain_workers_fail_the_fence_check_and_nothing_changes(tmp_path: Path, redis_url: str,
                                                                queue_name: str) -> None:
    """Workers without the fence plugin cannot be told apart by revision: the fence check fails (exit 5) and the
    pool is not touched; the traffic check shows the peak and mixed_versions warns (not accepted here)."""
    pool = make_pool(tmp_path, redis_url, queue_name, plugin=False)
    try:
        generation = pool.standin.resource("worker").generation
        args = [a for a in pool.args() if a != "--accept-warnings"]
        result = run_cli(args, pool.env, cwd=pool.dir, timeout=240)
        assert result.returncode == 5, result.stdout[-3000:] + result.stderr[-3000:]
        checks = checks_of(result.stdout)
        assert checks["fence"]["status"] == "fail" and "without the fence plugin" in str(checks["fence"]["detail"])
        assert checks["traffic"]["status"] == "ok" and "4 instances at the peak" in str(checks["traffic"]["detail"])
        assert checks["validate"]["status"] == "ok"
        assert checks["mixed_versions"]["status"] == "warn" and checks["mixed_versions"]["accepted"] is False
        assert events_of(result.stdout)[-1]["event"] == "preflight_failed"
        assert pool.standin.updates == [] and pool.standin.resource("worker").generation == generation
        assert pool.instances() == {pool.old: 2}
        assert run_cli(["runs", "--json"], pool.env).stdout.strip() == "[]"  # no run was started
    finally:
        close_pool(pool)


def test_mixed_versions_must_be_accepted(tmp_path: Path, redis_url: str, queue_name: str) -> None:
    """With plugin workers every check passes but mixed_versions, which stops the deploy until accepted (one
    sentence naming the flag); the pool is not touched."""
    pool = make_pool(tmp_path, redis_url, queue_name, count=1)
    try:
        args = [a for a in pool.args() if a != "--accept-warnings"]
        result = run_cli(args, pool.env, cwd=pool.dir, timeout=240)
        assert result.returncode == 5, result.stdout[-3000:] + result.stderr[-3000:]
        checks = checks_of(result.stdout)
        assert {k for k, c in checks.items() if c["status"] == "fail"} == set(), checks
        warned = {k for k, c in checks.items() if c["status"] == "warn"}
        assert "mixed_versions" in warned and checks["fence"]["status"] == "ok", checks
        final = events_of(result.stdout)[-1]
        assert final["event"] == "preflight_failed" and "--accept-warning mixed_versions" in final["message"]
        assert pool.standin.updates == []
    finally:
        close_pool(pool)


def test_tagged_revision_keeping_old_instances_is_named(tmp_path: Path, redis_url: str) -> None:
    """A service whose previous revision is tagged at 0% with revision-level min instances keeps running it: the
    traffic check names the tag and the revision (a warning), even on a drain deploy."""
    git = GitFixture(tmp_path / "git", branch="demo-2").create(commits=2)
    registry = RegistryStandIn().start()
    standin = CloudRunStandIn(rollout_seconds=0.1)
    endpoint = standin.start()
    try:
        registry.seed("proj/worker", git.tip(git.remote))
        name = standin.add_service("proj", "europe-west1", "worker", "img:1")
        with grpc.insecure_channel(standin.address) as chan:
            client = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
            svc = client.get_service(name=name)
            svc.template.containers[0].image = "img:2"
            svc.template.scaling.min_instance_count = 1  # the revision made now keeps one instance
            client.update_service(service=svc).result(timeout=30)
            svc = client.get_service(name=name)
            kept = svc.latest_ready_revision.rsplit("/", 1)[-1]
            svc.template.containers[0].image = "img:3"
            svc.template.scaling.min_instance_count = 0
            svc.traffic = [
                run_v2.TrafficTarget(type_=run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST,
                                     percent=100),
                run_v2.TrafficTarget(type_=run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_REVISION,
                                     revision=kept, percent=0, tag="previous")]
            client.update_service(service=svc).result(timeout=30)
        assert standin.instances("worker")[kept], "the stand-in keeps the tagged revision's min instance"
        (tmp_path / "celeryops.toml").write_text(standin_config(
            broker=redis_url, endpoint=endpoint, image=f"{registry.host}/proj/worker:{{sha}}"))
        result = run_cli(["deploy", "demo-2", "--yes", "--json", "--repo", str(git.work)], cli_env(tmp_path / "state"),
                         cwd=tmp_path, timeout=120)
        assert result.returncode == 5, result.stdout[-3000:] + result.stderr[-3000:]
        traffic = checks_of(result.stdout)["traffic"]
        assert traffic["status"] == "warn", traffic
        assert "tag 'previous'" in str(traffic["detail"]) and kept in str(traffic["detail"])
        assert "--accept-warning traffic" in str(traffic["remedy"])
    finally:
        standin.stop()
        registry.stop()
