"""Deployers against real parts: the async google-cloud-run clients over a plaintext channel to the local
stand-in, and real shell commands."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import grpc
import pytest
from google.cloud import run_v2
from google.cloud.run_v2.services.services.transports import ServicesGrpcTransport

from celeryops.adapters.deploy import (
    CloudRunDeployer,
    CommandDeployer,
    CommandOutput,
    ConditionChanged,
    DeployError,
    PollTrouble,
    ProgressEvent,
    RevisionCreated,
    RolloutReady,
    RolloutStarted,
    RolloutState,
    deployer_for,
    render_command,
)
from celeryops.core.config import Target
from celeryops.core.errors import EXIT_DEPLOY, EXIT_TIMEOUT
from celeryops.demo.standins.cloudrun import CloudRunStandIn

SERVICE = "projects/p/locations/europe-west1/services/worker"
POOL = "projects/p/locations/europe-west1/workerPools/gpu"


@pytest.fixture
def standin() -> Iterator[CloudRunStandIn]:
    server = CloudRunStandIn(rollout_seconds=0.3)
    server.add_service("p", "europe-west1", "worker", [("proxy", "proxy:1"), ("worker", "app:1")])
    server.add_worker_pool("p", "europe-west1", "gpu", "gpu:1")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def service(standin: CloudRunStandIn) -> Target:
    return Target(name="web", kind="cloudrun-service", project="p", region="europe-west1", resource="worker",
                  container="worker", image="app:{sha}", api_endpoint=standin.address, insecure=True, timeout=60)


@pytest.fixture
def pool(standin: CloudRunStandIn) -> Target:
    return Target(name="gpu", kind="cloudrun-worker-pool", project="p", region="europe-west1", resource="gpu",
                  image="gpu:{sha}", api_endpoint=standin.address, insecure=True, timeout=60)


@pytest.fixture
async def deployer() -> AsyncIterator[CloudRunDeployer]:
    made = CloudRunDeployer(poll_interval=0.05, rpc_timeout=10, outcome_timeout=3, poll_grace=5, read_retry=1.0)
    yield made
    await made.close()


class Events(list[ProgressEvent]):
    def __call__(self, event: ProgressEvent) -> None:
        self.append(event)

    def of(self, kind: type) -> list[ProgressEvent]:
        return [e for e in self if isinstance(e, kind)]


async def test_deploy_service_until_ready(standin: CloudRunStandIn, service: Target,
                                          deployer: CloudRunDeployer) -> None:
    hooked: list[tuple[str, str, str]] = []
    standin.on_update = lambda *args: hooked.append(args)
    before = await deployer.current(service)
    assert before.image == "app:1" and before.generation == 1 and before.settled
    assert before.terminal_state == "succeeded"

    events = Events()
    result = await deployer.deploy(service, "app:2", events)

    live = standin.resource(SERVICE)
    assert [(c.name, c.image) for c in live.template.containers] == [("proxy", "proxy:1"), ("worker", "app:2")]
    assert result.revision == live.latest_ready_revision == live.latest_created_revision
    assert result.previous_revision == before.latest_ready_revision != result.revision
    assert result.operation.startswith("projects/p/locations/europe-west1/operations/")
    assert hooked == [(SERVICE, result.revision, "app:2")]

    assert isinstance(events[0], RolloutStarted) and events[0].image == "app:2"
    assert [e.revision for e in events.of(RevisionCreated)] == [result.revision]  # type: ignore[attr-defined]
    ready_states = [e.state for e in events.of(ConditionChanged) if e.condition == "Ready"]  # type: ignore[attr-defined]
    assert ready_states[0] == "reconciling" and ready_states[-1] == "succeeded"
    assert isinstance(events[-1], RolloutReady) and events[-1].revision == result.revision
    assert all(e.text for e in events)

    after = await deployer.current(service)
    assert after.image == "app:2" and after.generation == 2 and after.settled
    assert await deployer.rollout_outcome(service, before, "app:2") == "ready"


async def test_first_container_by_default(standin: CloudRunStandIn, service: Target,
                                          deployer: CloudRunDeployer) -> None:
    await deployer.deploy(replace(service, container=""), "proxy:2", Events())
    assert [c.image for c in standin.resource(SERVICE).template.containers] == ["proxy:2", "app:1"]


async def test_fixed_revision_name_is_cleared(standin: CloudRunStandIn, service: Target,
                                             deployer: CloudRunDeployer) -> None:
    with grpc.insecure_channel(standin.address) as chan:  # someone deployed once with a fixed revision name
        client = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
        svc = client.get_service(name=SERVICE)
        svc.template.revision = "worker-fixed"
        client.update_service(service=svc).result(timeout=30)
    result = await deployer.deploy(service, "app:2", Events())
    assert result.previous_revision == f"{SERVICE}/revisions/worker-fixed"
    assert "/revisions/worker-00003-" in result.revision


async def test_unknown_container_changes_nothing(standin: CloudRunStandIn, service: Target,
                                                 deployer: CloudRunDeployer) -> None:
    with pytest.raises(DeployError) as info:
        await deployer.deploy(replace(service, container="api"), "app:2", Events())
    assert str(info.value) == ("Cloud Run service worker in p/europe-west1 has no container named 'api' (it has "
                               "proxy, worker): nothing was changed; fix container in the target's configuration.")
    assert standin.resource(SERVICE).generation == 1 and standin.updates == []


async def test_failed_rollout_raises_cloud_runs_message(standin: CloudRunStandIn, service: Target,
                                                        deployer: CloudRunDeployer) -> None:
    before = await deployer.current(service)
    standin.fail_next_rollout("worker", "The user-provided container failed to start and listen on the port.")
    events = Events()
    with pytest.raises(DeployError) as info:
        await deployer.deploy(service, "app:broken", events)
    err = info.value
    old = before.latest_ready_revision.rsplit("/", 1)[-1]
    live = standin.resource(SERVICE)
    new = live.latest_created_revision.rsplit("/", 1)[-1]
    assert str(err) == (f"Cloud Run could not roll out app:broken to Cloud Run service worker in p/europe-west1: "
                        f"revision {new} failed (HEALTH_CHECK_CONTAINER_ERROR: The user-provided container failed to "
                        f"start and listen on the port); the previous revision {old} keeps serving; read the "
                        "revision's logs, fix the image and deploy again.")
    assert err.code == "ROLLOUT_FAILED" and err.exit_code == EXIT_DEPLOY
    assert err.logs_url == standin.revisions(SERVICE)[-1].log_uri != ""
    assert live.latest_ready_revision == before.latest_ready_revision != live.latest_created_revision
    assert not any(isinstance(e, RolloutReady) for e in events)
    now = await deployer.current(service)
    assert now.terminal_state == "failed" and "failed to start" in now.terminal_message
    assert await deployer.rollout_outcome(service, before, "app:broken") == "failed"


async def test_rollout_outcome_never_applied_in_progress_and_unknown(standin: CloudRunStandIn, service: Target,
                                                                     deployer: CloudRunDeployer) -> None:
    before = await deployer.current(service)
    # the run was interrupted before the update was sent: the new image never took effect
    assert await deployer.rollout_outcome(service, before, "app:2") == "failed"

    standin.slow_next_rollout("worker", 30.0)
    task = asyncio.create_task(deployer.deploy(service, "app:2", Events()))
    try:
        for _ in range(600):
            if standin.updates:
                break
            await asyncio.sleep(0.05)
        assert await deployer.rollout_outcome(service, before, "app:2") == "in_progress"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    standin.stop()
    assert await deployer.rollout_outcome(service, before, "app:2") == "unknown"


async def test_not_found(service: Target, deployer: CloudRunDeployer) -> None:
    missing = replace(service, resource="nope")
    with pytest.raises(DeployError) as info:
        await deployer.deploy(missing, "app:2", Events())
    assert str(info.value) == ("Cloud Run service nope in p/europe-west1 was not found: nothing was changed; check "
                               "project, region and resource of target 'web'.")
    assert info.value.code == "NOT_FOUND"
    with pytest.raises(DeployError, match="was not found"):
        await deployer.missing_permissions(missing)
    assert await deployer.rollout_outcome(missing, RolloutState(resource="x"), "app:2") == "unknown"


async def test_permission_denied_and_missing_permissions(standin: CloudRunStandIn, service: Target, pool: Target,
                                                         deployer: CloudRunDeployer) -> None:
    assert await deployer.missing_permissions(service) == []
    assert await deployer.missing_permissions(pool) == []
    standin.grant({"run.services.get", "run.workerpools.update", "run.operations.get"})
    assert await deployer.missing_permissions(service) == ["run.services.update"]
    assert await deployer.missing_permissions(pool) == ["run.workerpools.get"]
    standin.grant({"run.services.get", "run.services.update"})
    assert await deployer.missing_permissions(service) == ["run.operations.get"]
    standin.grant({"run.services.get", "run.workerpools.update"})
    with pytest.raises(DeployError) as info:
        await deployer.deploy(service, "app:2", Events())
    assert info.value.code == "PERMISSION_DENIED" and info.value.permission == "run.services.update"
    assert str(info.value) == ("The permission run.services.update is missing on Cloud Run service worker in "
                               "p/europe-west1: nothing was changed; grant it (with roles/run.developer) to the "
                               "account celeryops runs as.")
    assert info.value.role == "roles/run.developer"
    assert standin.resource(SERVICE).generation == 1
    with pytest.raises(DeployError, match=r"The permission run\.workerpools\.get is missing on Cloud Run worker pool"):
        await deployer.current(pool)


async def test_unavailable_is_reported_quickly(standin: CloudRunStandIn, service: Target,
                                               deployer: CloudRunDeployer) -> None:
    standin.unavailable = True
    with pytest.raises(DeployError) as info:
        await deployer.current(service)
    assert info.value.code == "UNAVAILABLE"
    assert str(info.value).startswith("The Cloud Run API did not answer when asked to read Cloud Run service worker "
                                      "in p/europe-west1")
    assert await deployer.rollout_outcome(service, RolloutState(resource=SERVICE), "app:1") == "unknown"


async def test_rollout_timeout(standin: CloudRunStandIn, service: Target, deployer: CloudRunDeployer) -> None:
    standin.slow_next_rollout("worker", 30.0)
    with pytest.raises(DeployError) as info:
        await deployer.deploy(replace(service, timeout=0.5), "app:2", Events())
    assert info.value.code == "TIMEOUT" and info.value.exit_code == EXIT_TIMEOUT
    assert str(info.value) == ("Cloud Run service worker in p/europe-west1 did not become ready with app:2 within "
                               "0.5 s: it was left rolling out (nothing was rolled back); watch it at "
                               "https://console.cloud.google.com/run/detail/europe-west1/worker/revisions?project=p "
                               "and run recovery.")


async def test_worker_pool_deploy_and_outcome(standin: CloudRunStandIn, pool: Target,
                                              deployer: CloudRunDeployer) -> None:
    hooked: list[tuple[str, str, str]] = []
    standin.on_update = lambda *args: hooked.append(args)
    before = await deployer.current(pool)
    events = Events()
    result = await deployer.deploy(pool, "gpu:2", events)
    live = standin.resource(POOL)
    assert live.template.containers[0].image == "gpu:2"
    assert result.revision == live.latest_ready_revision and "/workerPools/gpu/revisions/gpu-00002-" in result.revision
    assert hooked == [(POOL, result.revision, "gpu:2")]
    assert events.of(RevisionCreated) and isinstance(events[-1], RolloutReady)
    assert await deployer.rollout_outcome(pool, before, "gpu:2") == "ready"

    standin.fail_next_rollout("gpu")  # Cloud Run's own message: sentences, a Logs URL, a troubleshooting link
    events = Events()
    with pytest.raises(DeployError) as info:
        await deployer.deploy(pool, "gpu:3", events)
    text = str(info.value)
    assert "\n" not in text and "Logs URL" not in text and "troubleshooting" not in text
    failed_revision = standin.revisions(POOL)[-1]
    assert text.startswith("Cloud Run could not roll out gpu:3 to Cloud Run worker pool gpu in p/europe-west1: "
                           f"revision {failed_revision.name.rsplit('/', 1)[-1]} failed (HEALTH_CHECK_CONTAINER_ERROR: "
                           "The user-provided container failed to start and listen on the port")
    assert text.endswith(f"; the previous revision {result.revision.rsplit('/', 1)[-1]} keeps serving; read the "
                         "revision's logs, fix the image and deploy again.")
    # the worker pool's logs: its own log filter (not the service one), the revision's log_uri
    assert info.value.logs_url == failed_revision.log_uri
    assert info.value.logs_url.startswith("https://console.cloud.google.com/logs/viewer?project=p&")
    assert "cloud_run_worker_pool" in info.value.logs_url and "cloud_run_revision" not in info.value.logs_url
    failed = [e for e in events.of(ConditionChanged) if e.state == "failed"]  # type: ignore[attr-defined]
    assert failed and all("\n" not in e.message and "Logs URL" not in e.message  # type: ignore[attr-defined]
                          for e in failed)
    assert failed[0].logs_url == info.value.logs_url  # type: ignore[attr-defined]
    assert standin.resource(POOL).latest_ready_revision == result.revision


async def test_insecure_is_refused_off_loopback(service: Target, deployer: CloudRunDeployer) -> None:
    with pytest.raises(DeployError, match="not a loopback address: nothing was contacted"):
        await deployer.current(replace(service, api_endpoint="run.googleapis.com:443"))


def test_rollout_state_round_trips_for_the_journal() -> None:
    state = RolloutState(resource=SERVICE, generation=3, observed_generation=2, reconciling=True,
                         latest_created_revision="b", latest_ready_revision="a", image="app:2",
                         terminal_state="reconciling")
    assert RolloutState.from_dict({**state.to_dict(), "future_field": 1}) == state
    assert not state.settled


def test_deployer_for_picks_by_kind(service: Target) -> None:
    assert isinstance(deployer_for(service), CloudRunDeployer)
    assert isinstance(deployer_for(Target(name="c", kind="command", command="true")), CommandDeployer)


# ----------------------------------------------------------------------------------------------- command


def command_target(command: str, timeout: float = 60) -> Target:
    return Target(name="k8s", kind="command", image="img:{sha}", command=command, timeout=timeout)


async def test_command_success_streams_quoted_output() -> None:
    target = command_target("printf '%s\\n' {image} {sha} {release}; echo 'to stderr' >&2; "
                            "echo redis://:hunter2@redis:6379/0")
    assert render_command(target, "a b;c", "s", "r") == "printf '%s\\n' 'a b;c' s r; echo 'to stderr' >&2; " \
        "echo redis://:hunter2@redis:6379/0"
    events = Events()
    result = await CommandDeployer().deploy(target, "img:1 $(touch /tmp/pwned)", events, sha="abc", release="v1")
    lines = [e.line for e in events.of(CommandOutput)]  # type: ignore[attr-defined]
    assert lines == ["img:1 $(touch /tmp/pwned)", "abc", "v1", "to stderr", "redis://:***@redis:6379/0"]
    assert isinstance(events[0], RolloutStarted) and isinstance(events[-1], RolloutReady)
    assert result.target == "k8s" and result.image == "img:1 $(touch /tmp/pwned)"


async def test_command_failure_quotes_last_lines() -> None:
    target = command_target("for i in 1 2 3 4 5 6 7; do echo line$i; done; exit 3")
    with pytest.raises(DeployError) as info:
        await CommandDeployer(tail_lines=3).deploy(target, "img:1", Events())
    assert str(info.value) == ("The deploy command of target 'k8s' failed with exit status 3 (last output: line5 | "
                               "line6 | line7): fix the command or the target and deploy again.")
    assert info.value.code == "EXIT_STATUS" and info.value.exit_code == EXIT_DEPLOY


async def test_command_timeout_kills_the_process_group() -> None:
    target = command_target("sleep 120 & echo child=$!; wait", timeout=1.0)
    events = Events()
    with pytest.raises(DeployError) as info:
        await CommandDeployer(kill_grace=5).deploy(target, "img:1", events)
    assert info.value.code == "TIMEOUT" and info.value.exit_code == EXIT_TIMEOUT
    assert "did not finish within 1 s and was stopped (last output: child=" in str(info.value)
    child = int(next(e.line for e in events.of(CommandOutput)).split("=")[1])  # type: ignore[attr-defined]
    for _ in range(200):  # the grandchild is reaped by init once killed; wait with a deadline
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"process {child} survived the timeout")


async def test_command_deployer_reports_what_it_cannot_know() -> None:
    target = command_target("true")
    deployer = CommandDeployer()
    assert await deployer.missing_permissions(target) == []
    assert await deployer.rollout_outcome(target, await deployer.current(target), "img:1") == "unknown"


async def test_production_path_without_credentials_is_one_sentence(service: Target, deployer: CloudRunDeployer,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: os.PathLike[str]) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(os.path.join(tmp_path, "missing.json")))
    with pytest.raises(DeployError) as info:
        await deployer.current(replace(service, api_endpoint="", insecure=False))
    assert info.value.code == "UNAUTHENTICATED"
    assert str(info.value).startswith("No Google credentials were found: nothing was deployed;")


async def test_polling_survives_a_short_outage_and_gives_up_on_a_long_one(standin: CloudRunStandIn,
                                                                          service: Target) -> None:
    deployer = CloudRunDeployer(poll_interval=0.05, rpc_timeout=10, poll_grace=30, read_retry=1.0)
    standin.slow_next_rollout("worker", 1.0)
    events = Events()
    task = asyncio.create_task(deployer.deploy(service, "app:2", events))
    for _ in range(600):
        if events.of(RolloutStarted):
            break
        await asyncio.sleep(0.05)
    standin.unavailable = True
    for _ in range(600):
        if events.of(PollTrouble):
            break
        await asyncio.sleep(0.05)
    standin.unavailable = False
    result = await asyncio.wait_for(task, 60)
    assert result.revision == standin.resource(SERVICE).latest_ready_revision
    assert "polling failed (The service is currently unavailable); retrying" in events.of(PollTrouble)[0].text

    impatient = CloudRunDeployer(poll_interval=0.05, rpc_timeout=10, poll_grace=0.3, read_retry=1.0)
    standin.slow_next_rollout("worker", 30.0)
    events = Events()
    task = asyncio.create_task(impatient.deploy(service, "app:3", events))
    for _ in range(600):
        if events.of(RolloutStarted):
            break
        await asyncio.sleep(0.05)
    standin.unavailable = True
    with pytest.raises(DeployError) as info:
        await asyncio.wait_for(task, 60)
    assert info.value.code == "UNAVAILABLE"
    assert str(info.value) == ("Cloud Run stopped answering while Cloud Run service worker in p/europe-west1 was "
                               "rolling out app:3: the rollout may still be going on (nothing was rolled back); "
                               "check the service and run recovery.")
