"""Rolling back (issue 20), below the CLI: the deployer routes a Cloud Run service's traffic / a worker pool's
instances back to an existing revision (no image, no new revision), records the split as celeryops' own so the next
deploy moves everything to its new revision, and says how an interrupted route went; the rollback plan decides
what to go back to from the run journal (the deploy_start intent's ``previous``) or ``--to``, and refuses bad input
in one sentence. Real google-cloud-run clients over gRPC to the stand-in; a real SQLite journal."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import redis
from google.cloud import run_v2
from google.cloud.run_v2.services.services.transports import ServicesGrpcTransport
from redis.backoff import NoBackoff
from redis.retry import Retry

from celeryops.adapters.deploy import CloudRunDeployer, DeployError, RouteStarted
from celeryops.adapters.deploy.base import PoolUpdate, RevisionInfo, RolloutState
from celeryops.core.config import Config, Target
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.demo.standins.cloudrun import CloudRunStandIn
from celeryops.ops.fleetwide.publish import Publisher, read_status, status_key
from celeryops.ops.journal import OVERLAP_CUTOVER, OVERLAP_UP, Journal
from celeryops.ops.preflight import traffic_check
from celeryops.ops.run.rollback import chosen
from celeryops.ops.run.rollback_plan import (
    Recorded,
    RollbackRequest,
    RollbackStep,
    changed_since,
    checked_step,
    recorded_deploy,
    replaced_split,
    settings_of,
    steps_of,
)
from celeryops.ops.run.strategies import strategy_named
from test_cloudrun_deployer import (  # the stand-in with a service and a worker pool, their targets, a fast deployer
    LATEST,
    POOL,
    SERVICE,
    console_rollback,
    deployer,
    pool,
    service,
    short,
    standin,
)

__all__ = ["deployer", "pool", "service", "standin"]  # fixtures used by name


def served(standin: CloudRunStandIn, name: str) -> list[tuple[str, int]]:
    live = standin.resource(name)
    statuses = live.traffic_statuses if name == SERVICE else live.instance_split_statuses
    return [(short(s.revision), s.percent) for s in statuses if s.percent]


# -- the deployer: routing back --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["service", "pool"])
async def test_route_takes_the_target_back_without_a_new_revision_and_the_next_deploy_moves_on(
        standin: CloudRunStandIn, deployer: CloudRunDeployer, kind: str, request: pytest.FixtureRequest) -> None:
    target: Target = request.getfixturevalue(kind)
    name, image = (SERVICE, "app") if kind == "service" else (POOL, "gpu")
    first = short((await deployer.current(target)).latest_ready_revision)
    second = short((await deployer.deploy(target, f"{image}:2", lambda e: None)).revision)
    assert served(standin, name) == [(second, 100)]
    events: list[object] = []

    result = await deployer.route(target, ((first, 100),), events.append, by="rollback run r-1")

    assert len(standin.revisions(name)) == 2  # no new revision, no image rolled out
    assert served(standin, name) == [(first, 100)]
    assert (short(result.revision), result.previous_revision, result.image) == (first, second, f"{image}:1")
    assert result.logs_url == standin.revisions(name)[0].log_uri
    assert isinstance(events[0], RouteStarted) and events[0].revision == first
    assert events[0].to_json()["step"] == "routing" and f"routing to {first} 100%" in events[0].text
    state = await deployer.current(target)
    assert state.pinned == ((first, 100),) and state.owned and state.served_split == ((first, 100),)
    assert standin.resource(name).annotations["celeryops/split-by"] == "rollback run r-1"
    assert await deployer.route_outcome(target, ((first, 100),)) == "ready"
    assert await deployer.route_outcome(target, ((second, 100),)) == "failed"
    if kind == "pool":  # the earlier revision's instances run again, the later one's were taken away
        assert standin.wait_rollouts(30)
        assert set(standin.instances(name)) == {first}

    # The split the rollback left is celeryops' own: the traffic check says so, and the next deploy moves
    # everything to its new revision without traffic = "latest" (the record of the split goes with it).
    check = await traffic_check([(target, deployer)]).run()
    assert check.status == "ok" and "(left by a celeryops rollback)" in check.detail, check.detail
    third = await deployer.deploy(target, f"{image}:3", lambda e: None)
    assert served(standin, name) == [(short(third.revision), 100)]
    after = await deployer.current(target)
    assert not after.pinned and not after.owned and "celeryops/split" not in standin.resource(name).annotations


async def test_a_split_changed_after_the_rollback_is_not_celeryops_own(standin: CloudRunStandIn, service: Target,
                                                                        deployer: CloudRunDeployer) -> None:
    target = service
    first = short((await deployer.current(target)).latest_ready_revision)
    second = short((await deployer.deploy(target, "app:2", lambda e: None)).revision)
    await deployer.route(target, ((first, 100),), lambda e: None)
    console_rollback(standin.address, second)  # someone pinned another revision in the console since
    state = await deployer.current(target)
    assert state.pinned == ((second, 100),) and not state.owned
    with pytest.raises(DeployError) as info:
        await deployer.deploy(target, "app:3", lambda e: None)
    assert info.value.code == "TRAFFIC_PINNED"


async def test_validate_route_refuses_a_revision_that_does_not_exist_and_changes_nothing(
        standin: CloudRunStandIn, pool: Target, deployer: CloudRunDeployer) -> None:
    target = pool
    before = standin.resource(POOL)
    with pytest.raises(DeployError) as info:
        await deployer.validate_route(target, (("gpu-00042-zzz", 100),))
    assert "gpu-00042-zzz" in str(info.value) and "nothing was changed" in str(info.value)
    first = short(before.latest_ready_revision)
    await deployer.validate_route(target, ((first, 100),))
    after = standin.resource(POOL)
    assert after.etag == before.etag and after.generation == before.generation and standin.updates == []
    assert standin.validations == [POOL]


async def test_a_service_keeps_its_tags_when_routed_back(standin: CloudRunStandIn, service: Target,
                                                         deployer: CloudRunDeployer) -> None:
    target = service
    first = short((await deployer.current(target)).latest_ready_revision)
    with grpc.insecure_channel(standin.address) as chan:
        client = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
        svc = client.get_service(name=SERVICE)
        svc.template.containers[0].image = "app:2"
        svc.traffic = [run_v2.TrafficTarget(type_=LATEST, percent=100, tag="edge")]
        client.update_service(service=svc).result(timeout=30)
    await deployer.route(target, ((first, 100),), lambda e: None)
    live = standin.resource(SERVICE)
    assert [(t.revision, t.percent, t.tag) for t in live.traffic] == [(first, 100, ""), ("", 0, "edge")]


# -- the plan: what to go back to ------------------------------------------------------------------------------


def _journal_with_deploy(tmp_path: Path, target: str, previous: RolloutState, *, ok: bool = True,
                         release: str = "r-2") -> tuple[Journal, str]:
    journal = Journal(state_dir=tmp_path / "state")
    run = journal.create_run(fleet="default", broker="redis://x", release=release)
    intent = journal.intend_deploy(run.id, target=target, image="app:2", previous=previous.to_dict())
    journal.settle(intent, {"ok": ok, "revision": "worker-00002-bbb"})
    return journal, run.id


def _config(*targets: Target) -> Config:
    return Config(targets=targets)


SVC = Target(name="web", kind="cloudrun-service", project="p", region="r", resource="worker", image="app:{sha}")


def test_the_journal_says_what_the_last_deploy_replaced(tmp_path: Path) -> None:
    previous = RolloutState(resource=SERVICE, latest_ready_revision=f"{SERVICE}/revisions/worker-00001-aaa")
    journal, run_id = _journal_with_deploy(tmp_path, "web", previous)
    with journal:
        split, source = replaced_split(_config(SVC), journal, SVC)
        assert split == (("worker-00001-aaa", 100),) and source == f"replaced by run {run_id}, release r-2"
        # A split served before is what the deploy replaced (a rollback in the console had pinned it).
        pinned = replace(previous, traffic=(("worker-00000-zzz", 100),), traffic_statuses=(("worker-00000-zzz", 100),))
        _j, later = _journal_with_deploy(tmp_path, "web", pinned)
        _j.close()
        assert replaced_split(_config(SVC), journal, SVC) == ((("worker-00000-zzz", 100),),
                                                              f"replaced by run {later}, release r-2")


@pytest.mark.parametrize(("case", "words"), [
    ("nothing-deployed", "has no deploy of target 'web' that took effect"),
    ("failed-deploy", "has no deploy of target 'web' that took effect"),
    ("first-revision", "created the first revision"),
])
def test_nothing_to_go_back_to_is_one_sentence(tmp_path: Path, case: str, words: str) -> None:
    previous = RolloutState(resource=SERVICE, latest_ready_revision="" if case == "first-revision"
                            else f"{SERVICE}/revisions/worker-00001-aaa")
    if case == "nothing-deployed":
        journal = Journal(state_dir=tmp_path / "state")
    else:
        journal, _ = _journal_with_deploy(tmp_path, "web", previous, ok=case != "failed-deploy")
    with journal, pytest.raises(UserError) as info:
        replaced_split(_config(SVC), journal, SVC)
    assert info.value.exit_code == EXIT_USAGE and words in str(info.value) and "--to REVISION" in str(info.value)


def test_bad_requests_are_refused_before_anything_is_read(tmp_path: Path) -> None:
    command = Target(name="shell", kind="command", command="deploy {image}", image="x:{sha}")
    other = replace(SVC, name="api", resource="api")
    cases = [
        (_config(), RollbackRequest(), "No deploy target is configured"),
        (_config(SVC, command), RollbackRequest(), "Target 'shell' runs a command"),
        (_config(SVC, other), RollbackRequest(to="worker-00001-aaa"), "--to names a revision of one target"),
        (_config(SVC), RollbackRequest(strategy="blue-green"), "--strategy 'blue-green' is not a strategy"),
    ]
    for config, request, words in cases:
        with pytest.raises(UserError) as info:
            chosen(config, request, None)
        assert info.value.exit_code == EXIT_USAGE and words in str(info.value) and "nothing was changed" in str(
            info.value), str(info.value)


async def test_a_revision_must_exist_and_be_ready(standin: CloudRunStandIn, service: Target,
                                                  deployer: CloudRunDeployer) -> None:
    target = service
    first = short((await deployer.current(target)).latest_ready_revision)
    await deployer.deploy(target, "app:2", lambda e: None)
    standin.fail_next_rollout("worker", reason="CONTAINER_MISSING")
    with pytest.raises(DeployError):
        await deployer.deploy(target, "app:3", lambda e: None)
    now, revisions = await deployer.current(target), await deployer.revisions(target)
    broken = revisions[0].name
    step = checked_step(target, ((first, 100),), "named with --to", now, revisions, "drain")
    assert step.revision == first and step.image == "app:1" and step.was == now.served_split[0][0]
    with pytest.raises(UserError) as missing:
        checked_step(target, (("worker-00099-zzz", 100),), "named with --to", now, revisions, "drain")
    assert str(missing.value).startswith("Revision worker-00099-zzz of Cloud Run service worker in p/europe-west1 "
                                         "does not exist: nothing was changed; name a ready one with --to REVISION")
    assert first in str(missing.value)
    with pytest.raises(UserError) as failed:
        checked_step(target, ((broken, 100),), "named with --to", now, revisions, "drain")
    assert f"Revision {broken} of" in str(failed.value) and "cannot serve" in str(failed.value)
    assert "CONTAINER_MISSING" in str(failed.value) and failed.value.exit_code == EXIT_USAGE


def test_a_rollback_run_keeps_what_resume_needs() -> None:
    steps = (RollbackStep(SVC, (("worker-00001-aaa", 100),), (("worker-00002-bbb", 100),), "app:1",
                          "replaced by run x", "drain"),)
    settings = settings_of(steps, "drain")
    assert settings["kind"] == "rollback" and settings["targets"] == ["web"]
    assert steps_of(_config(SVC), settings) == steps


def test_watchers_see_a_rollback_as_one(redis_client: redis.Redis) -> None:
    """The published status carries the run's kind (a watcher's header and history); a status published by an
    older version, without it, is told by its release as before."""
    Publisher(redis_client, "prod", run_id="run-r", owner="ops", host="box", release="worker-00001-aaa",
              kind="rollback").flush(True)
    status = read_status(redis_client, "prod")
    assert status is not None and status.run_kind == "rollback" and status.as_dict()["kind"] == "rollback"
    redis_client.hdel(status_key("prod"), "kind")
    older = read_status(redis_client, "prod")
    assert older is not None and older.run_kind == "deploy"


# -- the overlap strategy: one worker pool, one revision; what an overlap deploy replaced ----------------------


POOL_TARGET = Target(name="gpu", kind="cloudrun-worker-pool", project="p", region="r", resource="gpu",
                     image="gpu:{sha}")


def test_overlap_rollbacks_are_refused_in_one_sentence_before_anything_is_read() -> None:
    """A service, several targets, or targets whose strategies differ: refused before the journal or Cloud Run is
    read (the flag wins over a target's ``strategy``)."""
    other_pool = replace(POOL_TARGET, name="cpu", resource="cpu")
    overlap_pool = replace(POOL_TARGET, strategy="overlap")
    cases = [
        (_config(SVC), RollbackRequest(strategy="overlap"), "The overlap strategy is refused: target 'web' is a "
                                                            "Cloud Run service"),
        (_config(replace(SVC, strategy="overlap")), RollbackRequest(), "The overlap strategy is refused"),
        (_config(POOL_TARGET, other_pool), RollbackRequest(strategy="overlap"),
         "An overlap rollback moves one worker pool at a time and 2 targets were chosen (gpu, cpu)"),
        (_config(overlap_pool, SVC), RollbackRequest(), "The targets ask for different strategies (drain, overlap)"),
    ]
    for config, request, words in cases:
        with pytest.raises(UserError) as info:
            chosen(config, request, None)
        message = str(info.value)
        assert info.value.exit_code == EXIT_USAGE and message.startswith(words), message
        assert "nothing was changed" in message and "\n" not in message, message
    assert chosen(_config(overlap_pool, SVC), RollbackRequest(strategy="drain"), None)[0] == (overlap_pool, SVC)
    assert chosen(_config(overlap_pool), RollbackRequest(), None)[0] == (overlap_pool,)
    targets, strategy = chosen(_config(POOL_TARGET), RollbackRequest(strategy="overlap"), None)
    assert targets == (POOL_TARGET,) and strategy.name == "overlap"


def test_an_overlap_rollback_goes_back_to_one_revision() -> None:
    revisions = [RevisionInfo(name=n, state="succeeded", image=f"gpu:{n[-1]}") for n in ("gpu-2", "gpu-1", "gpu-0")]
    now = RolloutState(resource="gpu", latest_ready_revision="gpu-2", traffic_statuses=(("gpu-2", 100),))
    split = (("gpu-1", 50), ("gpu-0", 50))
    overlap, drain = strategy_named("overlap"), strategy_named("drain")
    with pytest.raises(UserError) as info:
        checked_step(POOL_TARGET, split, "replaced by run x", now, revisions, "overlap", overlap.check_rollback)
    assert "moves every instance of" in str(info.value) and "--to REVISION" in str(info.value)
    assert checked_step(POOL_TARGET, split, "replaced by run x", now, revisions, "drain",
                        drain.check_rollback).split == split
    step = checked_step(POOL_TARGET, (("gpu-1", 100),), "replaced by run x", now, revisions, "overlap",
                        overlap.check_rollback)
    assert (step.revision, step.was, step.image, step.strategy) == ("gpu-1", "gpu-2", "gpu:1", "overlap")


def _overlap_deploy(journal: Journal, *, cut_over: bool) -> str:
    """An overlap deploy of pool ``gpu`` from gpu-1 (2 instances) to gpu-2, cut over, or retired before that."""
    run = journal.create_run(fleet="default", broker="redis://x", release="r-3",
                             settings={"strategy": "overlap", "targets": ["gpu"]})
    up = journal.intend(run.id, OVERLAP_UP, {"target": "gpu", "old_revision": "gpu-1", "new_revision": "gpu-2",
                                             "count": 2, "before": {"count": 2, "split": [["", 100]],
                                                                    "served": {"gpu-1": 100}}})
    journal.settle(up, {"ok": True})
    journal.advance(run.id, "overlapping")
    if not cut_over:
        journal.advance(run.id, "retiring")
        journal.advance(run.id, "aborted")
        return run.id
    for phase in ("stopping", "draining", "drained", "cutting_over"):
        journal.advance(run.id, phase)  # type: ignore[arg-type]
    cut = journal.intend(run.id, OVERLAP_CUTOVER, {"target": "gpu", "split": [["", 100]]})
    journal.settle(cut, {"ok": True})
    journal.advance(run.id, "deployed")
    journal.advance(run.id, "done")
    return run.id


def test_what_an_overlap_deploy_replaced_is_in_its_journal(tmp_path: Path) -> None:
    """An overlap deploy writes ``overlap_up`` (what served before), not ``deploy_start``: it is what a rollback goes
    back to once its cutover took effect; a deploy whose new revision was retired again replaced nothing. The
    console's B on the overlap deploy's run names its pool."""
    with Journal(state_dir=tmp_path / "state") as journal:
        deployed = _overlap_deploy(journal, cut_over=True)
        _overlap_deploy(journal, cut_over=False)  # later, retired: not what the pool runs now
        config = _config(POOL_TARGET)
        assert replaced_split(config, journal, POOL_TARGET) == ((("gpu-1", 100),), f"replaced by run {deployed}, "
                                                                                    "release r-3")
        assert chosen(config, RollbackRequest(run_id=deployed), journal)[0] == (POOL_TARGET,)


async def test_a_pool_update_records_its_split_as_celeryops_own_only_when_told(
        standin: CloudRunStandIn, pool: Target, deployer: CloudRunDeployer) -> None:
    """An overlap rollback's cutover pins the previous revision by name and records it as celeryops' own in the same
    update (``owned_by``); a later update that sets a split without it (the next overlap deploy's scale-up) drops
    the record, so a split pinned later in the console is never taken for celeryops' own."""
    target = pool
    first = short((await deployer.current(target)).latest_ready_revision)
    second = short((await deployer.deploy(target, "gpu:2", lambda e: None)).revision)
    await deployer.update_worker_pool(target, PoolUpdate(split=((first, 100),), owned_by="rollback run r-9"),
                                      lambda e: None)
    state = await deployer.current(target)
    assert state.served_split == ((first, 100),) and state.pinned and state.owned
    assert standin.resource(POOL).annotations["celeryops/split-by"] == "rollback run r-9"
    await deployer.update_worker_pool(target, PoolUpdate(split=((first, 50), (second, 50))), lambda e: None)
    state = await deployer.current(target)
    assert not state.owned and not {"celeryops/split", "celeryops/split-by"} & set(standin.resource(POOL).annotations)


def test_the_previous_revision_comes_from_the_journal_the_fleet_holds(tmp_path: Path,
                                                                      redis_client: redis.Redis) -> None:
    """A deploy made on another machine (a CI runner whose disk is gone) is in the fleet's Redis copy of the
    journal: a rollback on this machine, whose own journal never saw it, goes back to what it replaced. Of a run both
    journals hold, the copy with more records wins; with Redis down, this machine's journal alone."""
    from celeryops.ops.journal import FleetStore

    fleet = f"f{uuid.uuid4().hex[:6]}"
    config = replace(_config(SVC), run=replace(Config().run, fleet=fleet))
    store = FleetStore(redis_client, fleet, ttl=3600, ended_ttl=600)
    previous = RolloutState(resource=SERVICE, latest_ready_revision=f"{SERVICE}/revisions/worker-00004-ci")
    with Journal(state_dir=tmp_path / "ci", fleet_store=store) as ci:
        run = ci.create_run(fleet=fleet, broker="redis://x", release="r-9")
        intent = ci.intend_deploy(run.id, target="web", image="app:9", previous=previous.to_dict())
        ci.settle(intent, {"ok": True, "revision": f"{SERVICE}/revisions/worker-00005-new"})
        ci.advance(run.id, "aborted", reason="seeded by the test")  # an ended run: the fleet keeps it
    with Journal(state_dir=tmp_path / "laptop", fleet_store=store) as laptop:
        assert laptop.history(5, fleet) == []  # this machine never saw it
        found = recorded_deploy(config, laptop, SVC)
        assert found.replaced == (("worker-00004-ci", 100),)
        assert found.source == f"replaced by run {run.id}, release r-9"
        assert found.left == (("worker-00005-new", 100),) and found.image == "app:9" and found.run == run.id
    down = redis.Redis(port=1, retry=Retry(NoBackoff(), 0), decode_responses=True)  # nothing listens there
    with Journal(state_dir=tmp_path / "offline", fleet_store=FleetStore(down, fleet)) as offline:
        with pytest.raises(UserError) as info:
            replaced_split(config, offline, SVC)
        assert "has no deploy of target 'web' that took effect" in str(info.value) and offline.fleet_unread


def test_a_deploy_since_the_recorded_one_stops_the_rollback_before_anything_changes() -> None:
    """What serves now is checked against what the recorded deploy left: the same (or what it replaced: rolled back
    already) goes on; anything else (CI without celeryops, gcloud, the console deployed since) is one sentence asking
    for --to, never a silent two steps back. Where the record names no revision, the serving revision's image is
    compared with the deploy's."""
    recorded = Recorded(replaced=(("worker-00001-aaa", 100),), source="replaced by run R1", left=(
        ("worker-00002-bbb", 100),), image="app:2", run="R1")

    def serving(*split: tuple[str, int]) -> RolloutState:
        return RolloutState(resource=SERVICE, latest_ready_revision=f"{SERVICE}/revisions/{split[0][0]}",
                            traffic=split, traffic_statuses=split)

    revisions = [RevisionInfo("worker-00003-ci", image="app:3"), RevisionInfo("worker-00002-bbb", image="app:2"),
                 RevisionInfo("worker-00001-aaa", image="app:1")]
    changed_since(SVC, recorded, serving(("worker-00002-bbb", 100)), revisions)  # what it left: fine
    changed_since(SVC, recorded, serving(("worker-00001-aaa", 100)), revisions)  # rolled back already: fine
    with pytest.raises(UserError) as info:
        changed_since(SVC, recorded, serving(("worker-00003-ci", 100)), revisions)
    assert info.value.exit_code == EXIT_USAGE
    assert str(info.value) == (
        "Cloud Run service worker in p/r serves worker-00003-ci 100%, not worker-00002-bbb 100% that run R1 left, so "
        "it was changed since by a deploy celeryops did not record (CI, gcloud or the Cloud console) and going back "
        "to worker-00001-aaa 100% could skip it: nothing was changed; name the revision to go back to with --to "
        "REVISION.")
    by_image = replace(recorded, left=())
    changed_since(SVC, by_image, serving(("worker-00002-bbb", 100)), revisions)
    with pytest.raises(UserError) as info:
        changed_since(SVC, by_image, serving(("worker-00003-ci", 100)), revisions)
    assert "not the image app:2 that run R1 left" in str(info.value)
