"""Preflight: the check runner (concurrency, timeouts, failures) and the git/image/freshness/permission checks,
run against real git repositories and the registry stand-in."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from google.cloud import run_v2
from google.cloud.run_v2.services.services.transports import ServicesGrpcTransport

from celeryops.adapters.deploy import CloudRunDeployer
from celeryops.adapters.gitrepo import GitError, GitRepo
from celeryops.adapters.registry import ImageRegistry
from celeryops.core.config import Target
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.findings import SETTING_FINDINGS
from celeryops.demo.standins.cloudrun import CloudRunStandIn, default_service_account
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.redis_server import free_port
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops.ops.preflight import (
    Check,
    CheckFinished,
    CheckResult,
    CheckStarted,
    CheckStatus,
    PreflightEvent,
    PreflightReport,
    check_accept_ids,
    cloudrun_checks,
    freshness_check,
    image_check,
    is_accepted,
    permissions_check,
    release_branch_check,
    run_checks,
    traffic_check,
    unaccepted_warnings,
    validate_check,
)
from celeryops.ops.preflight.checks import MissingPermissions

NOW = datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)


def result(check_id: str, status: CheckStatus = "ok", detail: str = "fine") -> CheckResult:
    return CheckResult(check_id, check_id.title(), status, detail, "" if status == "ok" else "do something")


def fixed(res: CheckResult) -> Check:
    async def run() -> CheckResult:
        return res

    return Check(res.id, res.title, run)


async def run_one(check: Check) -> CheckResult:
    return (await run_checks([check])).results[0]


# -- the runner --
async def test_checks_run_concurrently_observed_through_events() -> None:
    """Each check waits until all three have started: a sequential runner would time every one of them out."""
    events: list[PreflightEvent] = []
    all_started = asyncio.Event()

    def on_event(event: PreflightEvent) -> None:
        events.append(event)
        if sum(isinstance(e, CheckStarted) for e in events) == 3:
            all_started.set()

    def waiting(check_id: str) -> Check:
        async def run() -> CheckResult:
            await all_started.wait()
            return result(check_id)

        return Check(check_id, check_id.title(), run)

    report = await run_checks([waiting("a"), waiting("b"), waiting("c")], on_event, timeout=60)
    assert [r.status for r in report.results] == ["ok", "ok", "ok"]
    assert [type(e) for e in events[:3]] == [CheckStarted] * 3
    assert {e.result.id for e in events[3:] if isinstance(e, CheckFinished)} == {"a", "b", "c"}


async def test_results_keep_the_declared_order_whatever_finishes_first() -> None:
    release = asyncio.Event()
    finished: list[str] = []

    async def slow() -> CheckResult:
        await release.wait()
        return result("slow")

    async def fast() -> CheckResult:
        return result("fast")

    def on_event(event: PreflightEvent) -> None:
        if isinstance(event, CheckFinished):
            finished.append(event.result.id)
            release.set()

    report = await run_checks([Check("slow", "Slow", slow), Check("fast", "Fast", fast)], on_event, timeout=60)
    assert finished == ["fast", "slow"]
    assert [r.id for r in report.results] == ["slow", "fast"]


async def test_a_hanging_check_times_out_as_a_fail_and_the_others_still_report() -> None:
    events: list[PreflightEvent] = []

    async def hang() -> CheckResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    checks = [Check("hang", "Broker", hang, timeout=0.2), fixed(result("ok1"))]
    report = await run_checks(checks, events.append, timeout=60)
    hung = report.results[0]
    assert hung.status == "fail"
    assert hung.detail == "Broker did not finish within 200 milliseconds"
    assert hung.remedy
    assert [r.status for r in report.results] == ["fail", "ok"]
    assert CheckFinished(hung) in events


async def test_runner_default_timeout_applies_when_the_check_sets_none() -> None:
    async def hang() -> CheckResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    report = await run_checks([Check("hang", "Lease", hang)], timeout=0.1)
    assert report.results[0].status == "fail" and "did not finish within" in report.results[0].detail


async def test_a_raising_check_becomes_a_one_line_fail_without_traceback_or_password() -> None:
    async def boom() -> CheckResult:
        raise ConnectionError("cannot reach redis://:hunter2@10.0.0.1:6379/0\nTraceback (most recent call last):")

    res = await run_one(Check("broker", "Broker", boom))
    assert res.status == "fail"
    assert res.detail == ("Broker could not be checked: cannot reach redis://:***@10.0.0.1:6379/0 "
                          "Traceback (most recent call last):")
    assert "hunter2" not in res.detail and "\n" not in res.detail
    assert res.remedy


async def test_an_adapter_error_keeps_its_detail_and_remedy() -> None:
    async def git_fails() -> CheckResult:
        raise GitError("the repository at /x has no remote named 'origin'", "add it with git remote add")

    res = await run_one(Check("branch", "Release branch", git_fails))
    assert (res.status, res.detail, res.remedy) == (
        "fail", "the repository at /x has no remote named 'origin'", "add it with git remote add")


async def test_results_are_normalised_to_the_check_id_and_one_line() -> None:
    async def sloppy() -> CheckResult:
        return CheckResult("other", "Other", "warn", "two\nlines", "do\n  this")

    res = await run_one(Check("mine", "Mine", sloppy))
    assert (res.id, res.title, res.status, res.detail, res.remedy) == ("mine", "Mine", "warn", "two lines", "do this")


async def test_async_event_handlers_are_awaited() -> None:
    seen: list[str] = []

    async def on_event(event: PreflightEvent) -> None:
        await asyncio.sleep(0)
        seen.append(type(event).__name__)

    await run_checks([fixed(result("a"))], on_event)
    assert seen == ["CheckStarted", "CheckFinished"]


async def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        await run_checks([fixed(result("a")), fixed(result("a"))])


def test_report_verdicts() -> None:
    clean = PreflightReport((result("a"), result("b")))
    warned = PreflightReport((result("a"), result("b", "warn")))
    failed = PreflightReport((result("a", "fail"), result("b", "warn")))
    assert clean.ok_to_proceed(accept_warnings=False) and clean.ok_to_proceed(accept_warnings=True)
    assert not warned.ok_to_proceed(accept_warnings=False) and warned.ok_to_proceed(accept_warnings=True)
    assert not failed.ok_to_proceed(accept_warnings=True)
    assert [r.id for r in failed.failed] == ["a"] and [r.id for r in failed.warnings] == ["b"]
    assert warned.get("b") == result("b", "warn") and warned.get("zz") is None


# -- 1. release branch --
@pytest.fixture
def repos(tmp_path: Path) -> GitFixture:
    return GitFixture(tmp_path, branch="release", now=NOW).create(commits=2, age=timedelta(days=3))


async def test_branch_ok_when_local_matches(repos: GitFixture) -> None:
    res = await run_one(release_branch_check(GitRepo(repos.work), "origin", "release"))
    assert res.status == "ok"
    assert res.detail == f"origin/release is at {repos.tip()[:12]} (change 2); local release matches"


async def test_branch_warns_when_local_is_behind(repos: GitFixture) -> None:
    local = repos.tip()
    remote = repos.advance_remote("hotfix")
    res = await run_one(release_branch_check(GitRepo(repos.work), "origin", "release"))
    assert res.status == "warn"
    assert res.detail == (f"origin/release is at {remote[:12]} (hotfix); "
                          f"local release ({local[:12]}) is 1 commit behind origin/release")
    assert "pull or push release" in res.remedy


async def test_branch_warns_when_local_is_ahead_or_diverged(repos: GitFixture) -> None:
    repos.commit(repos.work, "unpushed 1")
    repos.commit(repos.work, "unpushed 2")
    res = await run_one(release_branch_check(GitRepo(repos.work), "origin", "release"))
    assert res.status == "warn" and res.detail.endswith("is 2 commits ahead of origin/release")
    repos.advance_remote()
    res = await run_one(release_branch_check(GitRepo(repos.work), "origin", "release"))
    assert res.status == "warn" and res.detail.endswith("have diverged (2 commits ahead, 1 commit behind)")


async def test_branch_compares_head_when_there_is_no_local_branch(repos: GitFixture) -> None:
    repos.git(repos.work, "switch", "--quiet", "-c", "feature")
    repos.git(repos.work, "branch", "--quiet", "-D", "release")
    feature_tip = repos.commit(repos.work, "feature work")
    res = await run_one(release_branch_check(GitRepo(repos.work), "origin", "release"))
    assert res.status == "warn"
    assert f"local HEAD ({feature_tip[:12]}) is 1 commit ahead of origin/release" in res.detail


async def test_branch_fails_when_missing_on_remote(repos: GitFixture) -> None:
    res = await run_one(release_branch_check(GitRepo(repos.work), "origin", "prod"))
    assert res.status == "fail"
    assert res.detail == "remote origin has no branch 'prod'"
    assert "push the prod branch to origin" in res.remedy


async def test_branch_fails_without_remote_or_repository(repos: GitFixture, tmp_path: Path) -> None:
    res = await run_one(release_branch_check(GitRepo(repos.work), "upstream", "release"))
    assert res.status == "fail" and "has no remote named 'upstream'" in res.detail
    plain = tmp_path / "plain"
    plain.mkdir()
    res = await run_one(release_branch_check(GitRepo(plain), "origin", "release"))
    assert res.status == "fail" and res.detail == f"{plain} is not a git repository"


# -- 2. image --
@pytest.fixture
def standin() -> Iterator[RegistryStandIn]:
    with RegistryStandIn(auth=True, private=["team/secret"]) as registry:
        yield registry


async def test_image_ok_single_and_several(standin: RegistryStandIn) -> None:
    standin.seed("team/api", "abc")
    standin.seed("team/worker", "abc")
    res = await run_one(image_check(f"{standin.host}/team/api:abc"))
    assert res.status == "ok" and res.detail == f"image {standin.host}/team/api:abc exists in {standin.host}"
    refs = [f"{standin.host}/team/api:abc", f"{standin.host}/team/worker:abc"]
    res = await run_one(image_check(refs))
    assert res.status == "ok" and res.detail == f"all 2 images exist: {', '.join(refs)}"


async def test_image_missing_tag_fails_and_names_it(standin: RegistryStandIn) -> None:
    standin.seed("team/api", "abc")
    refs = [f"{standin.host}/team/api:abc", f"{standin.host}/team/worker:abc"]
    res = await run_one(image_check(refs))
    assert res.status == "fail"
    assert res.detail == (f"image {standin.host}/team/worker:abc was not found: "
                          f"{standin.host} has no manifest for tag abc of team/worker")
    assert "build and push the image" in res.remedy


async def test_image_unauthorized_and_unreachable_fail_with_their_own_sentences(standin: RegistryStandIn) -> None:
    standin.seed("team/secret", "abc")
    port = free_port()
    res = await run_one(image_check([f"{standin.host}/team/secret:abc", f"127.0.0.1:{port}/team/api:abc"],
                                    ImageRegistry(timeout=5)))
    assert res.status == "fail"
    assert res.detail.startswith(f"registry {standin.host} refused access to team/secret: HTTP 401 after "
                                 f"authenticating; registry 127.0.0.1:{port} could not be reached (")
    assert "read access" in res.remedy and "network" in res.remedy


async def test_image_with_no_reference_fails() -> None:
    res = await run_one(image_check([]))
    assert res.status == "fail" and res.detail == "no image reference to check"


# -- 3. freshness --
async def test_freshness_ok_within_the_limit(repos: GitFixture) -> None:
    res = await run_one(freshness_check(GitRepo(repos.work), "origin", "release", 30, now=lambda: NOW))
    assert res.status == "ok"
    assert res.detail == (f"commit {repos.tip()[:12]} of origin/release was committed 3 days ago "
                          "(2026-05-01 12:00 UTC), within the 30-day limit")


async def test_freshness_warns_with_the_age_in_words(tmp_path: Path) -> None:
    old = GitFixture(tmp_path, now=NOW).create(age=timedelta(days=45))
    res = await run_one(freshness_check(GitRepo(old.work), "origin", "release", 30, now=lambda: NOW))
    assert res.status == "warn"
    assert res.detail == (f"commit {old.tip()[:12]} of origin/release was committed a month ago "
                          "(2026-03-20 12:00 UTC), longer ago than the 30-day limit")
    assert "accept the warning" in res.remedy


async def test_freshness_judges_the_remote_tip_fetching_it_if_needed(repos: GitFixture) -> None:
    new = repos.advance_remote(age=timedelta(hours=2))
    check = freshness_check(GitRepo(repos.work), "origin", "release", 1, now=lambda: NOW)
    res = await run_one(check)
    assert res.status == "ok" and res.detail.startswith(f"commit {new[:12]} of origin/release was committed 2 hours")
    # an explicit (older) sha is judged instead of the tip
    res = await run_one(freshness_check(GitRepo(repos.work), "origin", "release", 1, sha=repos.tip(),
                                        now=lambda: NOW))
    assert res.status == "warn" and "3 days ago" in res.detail


async def test_freshness_fails_for_a_missing_branch(repos: GitFixture) -> None:
    res = await run_one(freshness_check(GitRepo(repos.work), "origin", "prod", 30, now=lambda: NOW))
    assert res.status == "fail" and "has no branch 'prod'" in res.detail


# -- 4. permissions --
def missing(perms: Sequence[str]) -> MissingPermissions:
    async def probe() -> Sequence[str]:
        return perms

    return probe


async def test_permissions_ok() -> None:
    res = await run_one(permissions_check([("api", missing([])), ("worker", missing([]))]))
    assert res.status == "ok" and res.detail == "every needed permission is granted on api, worker"


async def test_permissions_fail_names_the_missing_ones() -> None:
    targets = [("api", missing([])), ("worker", missing(["run.services.update", "iam.serviceAccounts.actAs"]))]
    res = await run_one(permissions_check(targets))
    assert res.status == "fail"
    assert res.detail == "worker is missing iam.serviceAccounts.actAs, run.services.update"
    assert "roles/run.developer" in res.remedy


async def test_permissions_probe_error_is_a_fail_naming_the_target() -> None:
    async def broken() -> Sequence[str]:
        raise PermissionError("credentials expired")

    res = await run_one(permissions_check([("api", broken), ("worker", missing(["run.services.get"]))]))
    assert res.status == "fail"
    assert res.detail == "api: permissions could not be read (credentials expired); worker is missing run.services.get"
    assert "check your Google credentials" in res.remedy


async def test_permission_probes_run_concurrently() -> None:
    started: list[str] = []
    both = asyncio.Event()

    def probe(name: str) -> MissingPermissions:
        async def run() -> Sequence[str]:
            started.append(name)
            if len(started) == 2:
                both.set()
            await both.wait()
            return []

        return run

    check = permissions_check([("a", probe("a")), ("b", probe("b"))])
    res = (await run_checks([check], timeout=60)).results[0]
    assert res.status == "ok" and sorted(started) == ["a", "b"]


# -- all four together --
async def test_full_preflight_against_git_and_registry(repos: GitFixture, standin: RegistryStandIn) -> None:
    repo = GitRepo(repos.work)
    sha = await repo.ls_remote("origin", "release")
    assert sha is not None
    standin.seed("team/api", sha)
    events: list[PreflightEvent] = []
    report = await run_checks([
        release_branch_check(repo, "origin", "release"),
        image_check([f"{standin.host}/team/api:{sha}"]),
        freshness_check(repo, "origin", "release", 1, sha=sha, now=lambda: NOW),
        permissions_check([("api", missing([]))]),
    ], events.append)
    assert [(r.id, r.status) for r in report.results] == [
        ("branch", "ok"), ("image", "ok"), ("freshness", "warn"), ("permissions", "ok")]
    assert report.ok_to_proceed(accept_warnings=True) and not report.ok_to_proceed(accept_warnings=False)
    assert len(events) == 8


# -- 5./6. Cloud Run: traffic split and the validated update (the real client against the stand-in) --
@pytest.fixture
def cloudrun() -> Iterator[CloudRunStandIn]:
    with CloudRunStandIn(rollout_seconds=0.1) as server:
        server.add_service("p", "europe-west1", "worker", "app:1")
        yield server


def cr_target(server: CloudRunStandIn, **extra: str) -> Target:
    return Target(name="web", kind="cloudrun-service", project="p", region="europe-west1", resource="worker",
                  image="app:{sha}", api_endpoint=server.address, insecure=True, **extra)  # type: ignore[arg-type]


def pin_to_first_revision(server: CloudRunStandIn) -> str:
    """A console rollback: all traffic pinned to the first revision (after a second one was deployed)."""
    name = "projects/p/locations/europe-west1/services/worker"
    with grpc.insecure_channel(server.address) as chan:
        client = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
        svc = client.get_service(name=name)
        first = svc.latest_ready_revision.rsplit("/", 1)[-1]
        svc.template.containers[0].image = "app:2"
        client.update_service(service=svc).result(timeout=30)
        svc = client.get_service(name=name)
        svc.traffic = [run_v2.TrafficTarget(
            type_=run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_REVISION, revision=first,
            percent=100)]
        client.update_service(service=svc).result(timeout=30)
    return first


async def test_traffic_check_fails_on_a_pinned_split_unless_the_target_routes_it(cloudrun: CloudRunStandIn) -> None:
    deployer = CloudRunDeployer(read_retry=1.0)
    try:
        target = cr_target(cloudrun)
        res = await run_one(traffic_check([(target, deployer)]))
        assert res.status == "ok" and res.detail == "all traffic goes to the latest revision on web"
        first = pin_to_first_revision(cloudrun)
        res = await run_one(traffic_check([(target, deployer)]))
        assert res.status == "fail"
        assert res.detail == (f"web pins traffic to {first} 100%: every update keeps that split, so the new revision "
                              "would get only the unpinned share while the deploy looked successful")
        assert res.remedy.startswith('set traffic = "latest" on target(s) web to route everything to the new revision')
        routed = await run_one(traffic_check([(replace(target, traffic="latest"), deployer)]))
        assert routed.status == "ok" and routed.detail.endswith('the deploy routes everything to the new revision '
                                                                '(traffic = "latest")')
    finally:
        await deployer.close()


async def test_validate_check_finds_a_missing_act_as_before_anything_stops(cloudrun: CloudRunStandIn) -> None:
    deployer = CloudRunDeployer(read_retry=1.0)
    try:
        target = cr_target(cloudrun)
        checks = cloudrun_checks([target, Target(name="k8s", kind="command", command="true")], lambda t: deployer,
                                 lambda t: "app:2")
        assert [c.id for c in checks] == ["traffic", "validate"]
        res = await run_one(validate_check([(target, deployer, "app:2")]))
        assert res.status == "ok" and "accepted the update of web (validate only" in res.detail
        cloudrun.act_as(set())
        res = await run_one(validate_check([(target, deployer, "app:2")]))
        account = default_service_account("p")
        assert res.status == "fail"
        assert res.detail == ("web: Cloud Run refused the update (validate only): iam.serviceAccounts.actAs is "
                              "missing")
        assert res.remedy == (f"grant roles/iam.serviceAccountUser on the runtime service account {account} to the "
                              "account celeryops runs as, then run preflight again")
        assert cloudrun.updates == [] and cloudrun.resource("worker").generation == 1
    finally:
        await deployer.close()


async def test_a_worker_pool_without_instances_fails_preflight_before_anything_stops() -> None:
    """manual_instance_count = 0: the new revision would run no worker. One sentence, with the remedy."""
    with CloudRunStandIn(rollout_seconds=0.1) as server:
        server.add_worker_pool("p", "europe-west1", "gpu", "gpu:1", instances=0)
        deployer = CloudRunDeployer(read_retry=1.0)
        target = Target(name="gpu", kind="cloudrun-worker-pool", project="p", region="europe-west1", resource="gpu",
                        image="gpu:{sha}", api_endpoint=server.address, insecure=True)
        try:
            res = await run_one(validate_check([(target, deployer, "gpu:2")]))
        finally:
            await deployer.close()
        assert res.status == "fail"
        assert res.detail == ("gpu: Cloud Run worker pool gpu in p/europe-west1 has scaling.manual_instance_count = 0, "
                              "so its new revision would run no instance and no worker would consume")
        assert res.remedy == ("give it instances (`gcloud run worker-pools update gpu --instances N --project p "
                              "--region europe-west1`) and deploy again")
        assert server.validations == [] and server.resource("gpu").generation == 1


async def test_a_target_still_rolling_out_is_one_finding_and_its_remedy(cloudrun: CloudRunStandIn) -> None:
    """Cloud Run refuses the update while the target rolls out: the finding and the refusal's own remedy, so that
    the preflight's sentence says "nothing was changed" once."""
    deployer = CloudRunDeployer(read_retry=1.0)
    target = cr_target(cloudrun)
    cloudrun.slow_next_rollout("worker", 30.0)
    rolling = asyncio.create_task(deployer.deploy(target, "app:2", lambda e: None))
    try:
        for _ in range(600):  # until the update is sent (30 s at most)
            if cloudrun.updates:
                break
            await asyncio.sleep(0.05)
        res = await run_one(validate_check([(target, deployer, "app:3")]))
        assert res.status == "fail"
        assert res.detail.startswith("web: Cloud Run service worker in p/europe-west1 is still rolling out revision ")
        assert "nothing was changed" not in res.detail
        assert res.remedy == "wait until it finished and deploy again"
    finally:
        rolling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await rolling
        await deployer.close()


async def test_permissions_remedy_names_the_role_of_each_missing_permission() -> None:
    res = await run_one(permissions_check([("web", missing(["run.operations.get", "run.services.update"]))]))
    assert res.detail == "web is missing run.operations.get, run.services.update"
    assert res.remedy == ("grant the account celeryops runs as roles/run.developer (for run.operations.get, "
                          "run.services.update), then run preflight again")


# -- accepting warnings per check --
def test_accepting_warnings_by_id() -> None:
    report = PreflightReport((result("branch", "warn"), result("fence", "warn"), result("image")))
    assert [r.id for r in unaccepted_warnings(report, False, ["fence"])] == ["branch"]
    assert unaccepted_warnings(report, False, ["fence", "branch"]) == ()
    assert unaccepted_warnings(report, True) == ()
    assert report.ok_to_proceed(False, ["branch", "fence"]) and not report.ok_to_proceed(False, ["fence"])
    assert is_accepted(report.results[1], False, ["fence"]) and not is_accepted(report.results[2], True)
    assert check_accept_ids(["fence", "fence", "branch"]) == ("fence", "branch")


DOCTOR = ", ".join(SETTING_FINDINGS)  # celeryops doctor's findings, each a warning of its own (issue 37)


@pytest.mark.parametrize(("ids", "sentence"), [
    (["fense"], "--accept-warning names the check 'fense', which does not exist (did you mean 'fence'?): nothing "
                "was run; name a check whose warnings can be accepted (branch, freshness, traffic, workers, lease, "
                f"fence, mixed_versions, broker_safety, {DOCTOR})."),
    (["permissions"], "--accept-warning names the check 'permissions', which passes or fails but never warns: "
                      "nothing was run; name a check whose warnings can be accepted (branch, freshness, traffic, "
                      f"workers, lease, fence, mixed_versions, broker_safety, {DOCTOR})."),
])
def test_accepting_an_unknown_or_never_warning_check_is_one_sentence(ids: list[str], sentence: str) -> None:
    with pytest.raises(UserError) as info:
        check_accept_ids(ids)
    assert str(info.value) == sentence and info.value.exit_code == EXIT_USAGE
