"""Cloud Run as it really behaves, against the real google-cloud-run clients over gRPC to the local stand-in:
pinned traffic / instance splits, validate_only before any stop, actAs on the runtime service account, a racing
update (etag), force_new_revision, one-line failures with the Logs URL apart, credentials resolved once off the
event loop (a local OAuth token endpoint), where the result is (revision, URL, console and logs links), and every
failure sentence: a disabled API, a missing permission, quota (retried with backoff, then named), a failed
revision (its name, Cloud Run's reason, its logs), a worker pool without instances, refused credentials."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.cloud import run_v2
from google.cloud.run_v2.services.services.transports import ServicesGrpcTransport
from google.cloud.run_v2.services.worker_pools.transports import WorkerPoolsGrpcTransport

from celeryops.adapters.deploy import CloudRunDeployer, DeployError, PollTrouble, PoolUpdate, RolloutState, condense
from celeryops.adapters.deploy.base import DeployResult, logs_link
from celeryops.commands.output import Printer
from celeryops.core.config import Target
from celeryops.core.events import RunFinished, TargetDeployed
from celeryops.demo.standins.cloudrun import CloudRunStandIn, default_service_account, failure_message
from celeryops.demo.standins.cloudrun_support import log_uri
from celeryops.ops.fleetwide.decode import decode

SERVICE = "projects/p/locations/europe-west1/services/worker"
POOL = "projects/p/locations/europe-west1/workerPools/gpu"
LATEST = run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST
BY_NAME = run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_REVISION
SPLIT_BY_NAME = run_v2.InstanceSplitAllocationType.INSTANCE_SPLIT_ALLOCATION_TYPE_REVISION


@pytest.fixture
def standin() -> Iterator[CloudRunStandIn]:
    server = CloudRunStandIn(rollout_seconds=0.2)
    server.add_service("p", "europe-west1", "worker", "app:1")
    server.add_worker_pool("p", "europe-west1", "gpu", "gpu:1")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def service(standin: CloudRunStandIn) -> Target:
    return Target(name="web", kind="cloudrun-service", project="p", region="europe-west1", resource="worker",
                  image="app:{sha}", api_endpoint=standin.address, insecure=True, timeout=60)


@pytest.fixture
def pool(standin: CloudRunStandIn) -> Target:
    return Target(name="gpu", kind="cloudrun-worker-pool", project="p", region="europe-west1", resource="gpu",
                  image="gpu:{sha}", api_endpoint=standin.address, insecure=True, timeout=60)


@pytest.fixture
async def deployer() -> AsyncIterator[CloudRunDeployer]:
    made = CloudRunDeployer(poll_interval=0.05, rpc_timeout=10, outcome_timeout=3, poll_grace=5, read_retry=1.0)
    yield made
    await made.close()


def ignore(_event: object) -> None:
    pass


def short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def console_rollback(address: str, revision: str, *, tag: str = "") -> None:
    """What a rollback in the Cloud console does: all traffic pinned to a named revision (the real sync client)."""
    with grpc.insecure_channel(address) as chan:
        client = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
        svc = client.get_service(name=SERVICE)
        svc.traffic = [run_v2.TrafficTarget(type_=BY_NAME, revision=short(revision), percent=100, tag=tag)]
        client.update_service(service=svc).result(timeout=30)


def pool_rollback(address: str, revision: str) -> None:
    with grpc.insecure_channel(address) as chan:
        client = run_v2.WorkerPoolsClient(transport=WorkerPoolsGrpcTransport(channel=chan))
        pool = client.get_worker_pool(name=POOL)
        pool.instance_splits = [run_v2.InstanceSplit(type_=SPLIT_BY_NAME, revision=short(revision), percent=100)]
        client.update_worker_pool(worker_pool=pool).result(timeout=30)


# -- traffic ---------------------------------------------------------------------------------------------------


async def test_a_pinned_service_is_refused_before_anything_changes(standin: CloudRunStandIn, service: Target,
                                                                   deployer: CloudRunDeployer) -> None:
    first = (await deployer.current(service)).latest_ready_revision
    await deployer.deploy(service, "app:2", ignore)
    console_rollback(standin.address, first)  # the operator rolled back in the console
    state = await deployer.current(service)
    assert state.pinned == ((short(first), 100),) and state.latest_share == 0 and not state.ready
    generation = standin.resource(SERVICE).generation

    with pytest.raises(DeployError) as info:
        await deployer.deploy(service, "app:3", ignore)
    assert info.value.code == "TRAFFIC_PINNED"
    assert str(info.value) == (f"Cloud Run service worker in p/europe-west1 has its traffic pinned to {short(first)} "
                               "100% (a rollback in the console?), so a new revision would get only what is left: "
                               "nothing was changed; set traffic = \"latest\" on target 'web' to route all traffic "
                               "to the new revision in the same update, or route them to the latest revision in the "
                               "console first.")
    assert standin.resource(SERVICE).generation == generation and len(standin.updates) == 1


async def test_without_the_guard_cloud_run_keeps_the_pin_and_recovery_sees_it(standin: CloudRunStandIn,
                                                                              service: Target,
                                                                              deployer: CloudRunDeployer) -> None:
    """The bug of issue 14: Cloud Run accepts the update, the new revision becomes ready with 0% of the traffic.
    rollout_outcome must not call that ready."""
    before = await deployer.current(service)
    await deployer.deploy(service, "app:2", ignore)
    console_rollback(standin.address, before.latest_ready_revision)
    after_rollback = await deployer.current(service)
    # as an older celeryops would: send the update although the split is pinned (the real client directly)
    with grpc.insecure_channel(standin.address) as chan:
        client = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
        svc = client.get_service(name=SERVICE)
        svc.template.containers[0].image = "app:3"
        final = client.update_service(service=svc).result(timeout=30)
    assert final.latest_ready_revision == final.latest_created_revision  # "ready" by the old rule
    assert [(s.revision, s.percent) for s in final.traffic_statuses] == [(short(before.latest_ready_revision), 100)]
    now = await deployer.current(service)
    assert now.settled and now.image == "app:3" and now.latest_share == 0 and not now.ready
    assert await deployer.rollout_outcome(service, after_rollback, "app:3") == "failed"


async def test_traffic_latest_routes_everything_to_the_new_revision_in_the_same_update(
        standin: CloudRunStandIn, service: Target, deployer: CloudRunDeployer) -> None:
    first = (await deployer.current(service)).latest_ready_revision
    await deployer.deploy(service, "app:2", ignore)
    console_rollback(standin.address, first, tag="stable")
    routed = replace(service, traffic="latest")
    before = await deployer.current(routed)
    result = await deployer.deploy(routed, "app:3", ignore)
    live = standin.resource(SERVICE)
    assert result.revision == live.latest_ready_revision and "-00003-" in result.revision
    assert (live.traffic[0].type_, live.traffic[0].percent) == (LATEST, 100)
    assert [(t.revision, t.percent, t.tag) for t in live.traffic][1:] == [(short(first), 0, "stable")]  # tag kept
    statuses = [(s.revision, s.percent) for s in live.traffic_statuses if s.percent]
    assert statuses == [(short(result.revision), 100)]
    assert len(standin.updates) == 2  # one update made the revision and routed the traffic
    assert await deployer.rollout_outcome(routed, before, "app:3") == "ready"


async def test_a_partial_split_counts_as_pinned(standin: CloudRunStandIn, service: Target,
                                                deployer: CloudRunDeployer) -> None:
    first = (await deployer.current(service)).latest_ready_revision
    with grpc.insecure_channel(standin.address) as chan:
        client = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
        svc = client.get_service(name=SERVICE)
        svc.template.containers[0].image = "app:2"
        svc.traffic = [run_v2.TrafficTarget(type_=LATEST, percent=90),
                       run_v2.TrafficTarget(type_=BY_NAME, revision=short(first), percent=10)]
        client.update_service(service=svc).result(timeout=30)
    state = await deployer.current(service)
    assert state.pinned == ((short(first), 10),) and state.latest_share == 90
    with pytest.raises(DeployError, match=r"pinned to latest \(worker-00002-\w+\) 90%, worker-00001-\w+ 10%"):
        await deployer.deploy(service, "app:3", ignore)


async def test_worker_pool_instance_splits(standin: CloudRunStandIn, pool: Target,
                                           deployer: CloudRunDeployer) -> None:
    first = (await deployer.current(pool)).latest_ready_revision
    before = await deployer.current(pool)
    result = await deployer.deploy(pool, "gpu:2", ignore)
    assert await deployer.rollout_outcome(pool, before, "gpu:2") == "ready"
    pool_rollback(standin.address, first)
    assert await deployer.rollout_outcome(pool, before, "gpu:2") == "failed"  # ready, but serves no instance
    with pytest.raises(DeployError) as info:
        await deployer.deploy(pool, "gpu:3", ignore)
    assert info.value.code == "TRAFFIC_PINNED" and "has its instance_splits pinned to" in str(info.value)

    routed = replace(pool, traffic="latest")
    again = await deployer.deploy(routed, "gpu:3", ignore)
    live = standin.resource(POOL)
    assert [(s.revision, s.percent) for s in live.instance_split_statuses] == [(short(again.revision), 100)]
    assert again.revision != result.revision


async def test_same_image_still_makes_a_new_revision(standin: CloudRunStandIn, service: Target, pool: Target,
                                                     deployer: CloudRunDeployer) -> None:
    """Cloud Run makes no revision for an unchanged template: a redeploy of the same image must still restart the
    workers (worker pools: force_new_revision; services: a label)."""
    one = await deployer.deploy(pool, "gpu:2", ignore)
    two = await deployer.deploy(pool, "gpu:2", ignore)
    assert one.revision != two.revision and len(standin.revisions("gpu")) == 3
    first = await deployer.deploy(service, "app:2", ignore)
    second = await deployer.deploy(service, "app:2", ignore)
    assert first.revision != second.revision and len(standin.revisions("worker")) == 3


async def test_the_stand_in_makes_no_revision_for_an_unchanged_template(standin: CloudRunStandIn) -> None:
    with grpc.insecure_channel(standin.address) as chan:
        client = run_v2.WorkerPoolsClient(transport=WorkerPoolsGrpcTransport(channel=chan))
        pool = client.get_worker_pool(name=POOL)
        final = client.update_worker_pool(worker_pool=pool).result(timeout=30)
        assert final.latest_ready_revision == pool.latest_ready_revision and final.generation == 2
        forced = client.update_worker_pool(request={"worker_pool": client.get_worker_pool(name=POOL),
                                                    "force_new_revision": True}).result(timeout=30)
        assert forced.latest_ready_revision != pool.latest_ready_revision


# -- validate before any stop ------------------------------------------------------------------------------------


async def test_validate_changes_nothing(standin: CloudRunStandIn, service: Target, pool: Target,
                                        deployer: CloudRunDeployer) -> None:
    before = standin.resource(SERVICE)
    await deployer.validate(service, "app:2")
    await deployer.validate(pool, "gpu:2")
    assert standin.validations == [SERVICE, POOL] and standin.updates == []
    after = standin.resource(SERVICE)
    assert after.etag == before.etag and after.generation == 1 and after.template.containers[0].image == "app:1"


async def test_missing_act_as_is_found_by_validate_and_named_with_its_role(standin: CloudRunStandIn,
                                                                           service: Target,
                                                                           deployer: CloudRunDeployer) -> None:
    account = default_service_account("p")
    standin.act_as({"someone-else@p.iam.gserviceaccount.com"})
    with pytest.raises(DeployError) as info:
        await deployer.validate(service, "app:2")
    err = info.value
    assert err.code == "PERMISSION_DENIED" and err.permission == "iam.serviceAccounts.actAs"
    assert err.role == f"roles/iam.serviceAccountUser on the runtime service account {account}"
    assert str(err) == (f"The permission iam.serviceAccounts.actAs is missing on service account {account}, which "
                        "Cloud Run service worker in p/europe-west1 runs as: nothing was changed; grant "
                        f"roles/iam.serviceAccountUser on the runtime service account {account} to the account "
                        "celeryops runs as.")
    assert await deployer.missing_permissions(service) == []  # the Run permissions alone cannot show it
    with pytest.raises(DeployError, match=r"iam\.serviceAccounts\.actAs"):
        await deployer.deploy(service, "app:2", ignore)
    assert standin.updates == [] and standin.resource(SERVICE).generation == 1
    standin.act_as({account})
    await deployer.validate(service, "app:2")


async def test_validate_reports_a_busy_service(standin: CloudRunStandIn, service: Target,
                                               deployer: CloudRunDeployer) -> None:
    standin.slow_next_rollout("worker", 30.0)
    task = asyncio.create_task(deployer.deploy(service, "app:2", ignore))
    try:
        for _ in range(600):
            if standin.updates:
                break
            await asyncio.sleep(0.05)
        with pytest.raises(DeployError) as info:
            await deployer.validate(service, "app:3")
        assert info.value.code == "BUSY"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_allow_missing_and_validate_only_in_the_stand_in(standin: CloudRunStandIn) -> None:
    name = "projects/p/locations/europe-west1/services/fresh"
    with grpc.insecure_channel(standin.address) as chan:
        client = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
        svc = run_v2.Service(name=name, template=run_v2.RevisionTemplate(containers=[run_v2.Container(image="x:1")]))
        client.update_service(request={"service": svc, "allow_missing": True, "validate_only": True})
        with pytest.raises(KeyError):
            standin.resource(name)  # validate_only created nothing
        made = client.update_service(request={"service": svc, "allow_missing": True}).result(timeout=30)
        assert made.latest_ready_revision.startswith(f"{name}/revisions/fresh-00001-")
        assert [(s.type_, s.percent) for s in made.traffic_statuses] == [(LATEST, 100)]
        bad = client.get_service(name=SERVICE)
        bad.traffic = [run_v2.TrafficTarget(type_=LATEST, percent=60)]
        with pytest.raises(Exception, match="add up to 60, not 100"):
            client.update_service(request={"service": bad, "validate_only": True}, retry=None)


async def test_a_missing_service_is_never_created(standin: CloudRunStandIn, service: Target,
                                                  deployer: CloudRunDeployer) -> None:
    with pytest.raises(DeployError, match="was not found"):
        await deployer.deploy(replace(service, resource="nope"), "app:2", ignore)
    with pytest.raises(KeyError):
        standin.resource("nope")


async def test_a_racing_update_is_read_again(standin: CloudRunStandIn, service: Target,
                                             deployer: CloudRunDeployer) -> None:
    standin.race_next_update("worker")
    result = await deployer.deploy(service, "app:2", ignore)
    assert standin.resource(SERVICE).template.containers[0].image == "app:2"
    assert [u[1] for u in standin.updates] == [result.revision]


# -- failure text, refusals, credentials ---------------------------------------------------------------------------


def test_condense_keeps_the_reason_and_takes_the_logs_url_apart() -> None:
    message = failure_message("worker-00002-abc", log_uri(SERVICE, "worker-00002-abc"))
    reason, logs_url = condense(message)
    assert reason == ("The user-provided container failed to start and listen on the port defined provided by the "
                      "PORT=8080 environment variable within the allocated timeout. This can happen when the "
                      "container port is misconfigured or if the timeout is too short")
    assert logs_url.startswith("https://console.cloud.google.com/logs/viewer?project=p&resource=cloud_run_revision")
    assert condense("Container failed to start: exec format error.") == (
        "Container failed to start: exec format error", "")
    long_reason, _ = condense("A" * 50 + " word." * 200)
    assert len(long_reason) <= 300 and long_reason.endswith("…")


@pytest.mark.parametrize(("code", "message", "words"), [
    (grpc.StatusCode.PERMISSION_DENIED, "Request had insufficient authentication scopes.",
     "The Google credentials lack the cloud-platform scope needed to read Cloud Run service worker"),
    (grpc.StatusCode.UNAUTHENTICATED, "Request had invalid authentication credentials. Expected OAuth 2 access token.",
     "Google refused the credentials when asked to read Cloud Run service worker in p/europe-west1: nothing was "
     "changed; they are missing, expired or revoked"),
])
async def test_refused_credentials_are_one_sentence(standin: CloudRunStandIn, service: Target,
                                                    deployer: CloudRunDeployer, code: grpc.StatusCode, message: str,
                                                    words: str) -> None:
    standin.refusal = (code, message)
    with pytest.raises(DeployError) as info:
        await deployer.current(service)
    assert str(info.value).startswith(words) and "\n" not in str(info.value)
    assert await deployer.rollout_outcome(service, RolloutState(resource=SERVICE), "app:1") == "unknown"


class TokenEndpoint:
    """A local OAuth token endpoint (what google-auth's refresh talks to): ``grant`` decides the answer; ``gate``
    holds each answer until it is set."""

    def __init__(self, grant: bool) -> None:
        self.grant = grant
        self.requests = 0
        self.gate_timed_out = False  # an answer was held 20 s without the gate opening
        self.gate = threading.Event()
        self.gate.set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.requests += 1
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if not outer.gate.wait(20):
                    outer.gate_timed_out = True
                if outer.grant:
                    body, status = {"access_token": "ya29.test", "expires_in": 3600, "token_type": "Bearer"}, 200
                else:
                    body, status = {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}, 400
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def adc_file(self, tmp: Path) -> str:
        """A service account key file whose token_uri is this endpoint (a fresh RSA key)."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        path = tmp / "adc.json"
        path.write_text(json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "k1",
                                    "private_key": pem, "client_email": "deployer@p.iam.gserviceaccount.com",
                                    "client_id": "1", "token_uri": self.url}))
        return str(path)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_expired_credentials_are_one_sentence(service: Target, deployer: CloudRunDeployer, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    token = TokenEndpoint(grant=False)
    try:
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", token.adc_file(tmp_path))
        with pytest.raises(DeployError) as info:
            await deployer.current(replace(service, insecure=False))
    finally:
        token.close()
    text = str(info.value)
    assert info.value.code == "UNAUTHENTICATED" and "\n" not in text
    assert text.startswith("Google refused to refresh the credentials (invalid_grant: Invalid JWT Signature")
    assert text.endswith("log in again with `gcloud auth application-default login` (in CI: check the workload "
                         "identity provider and service account).")
    assert "PRIVATE KEY" not in text and token.requests == 1


async def test_credentials_are_resolved_once_off_the_event_loop(standin: CloudRunStandIn, service: Target,
                                                                tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The token endpoint holds its answer until a task on the event loop has run: a lookup on the loop would
    block that task and never be answered. Two calls (two targets) refresh the credentials once."""
    token = TokenEndpoint(grant=True)
    token.gate.clear()
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", token.adc_file(tmp_path))
    deployer = CloudRunDeployer(poll_interval=0.05, rpc_timeout=5, read_retry=0.5)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            if ticks >= 5:
                token.gate.set()
            await asyncio.sleep(0.01)

    ticking = asyncio.create_task(ticker())
    # TLS to the plaintext stand-in fails: the point here is how the credentials were obtained, not the answer
    tls_service = replace(service, insecure=False)
    tls_other = replace(service, name="other", insecure=False)
    try:
        for target in (tls_service, tls_other):
            with pytest.raises(DeployError) as info:
                await deployer.current(target)
            assert info.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED") and "\n" not in str(info.value)
    finally:
        ticking.cancel()
        await deployer.close()
        token.close()
    assert not token.gate_timed_out  # the loop ran (and opened the gate) while the token was being fetched
    assert token.requests == 1 and deployer.credential_lookups == 1


# -- where the result is -----------------------------------------------------------------------------------------


async def test_result_names_revision_url_and_console_link(standin: CloudRunStandIn, service: Target, pool: Target,
                                                          deployer: CloudRunDeployer) -> None:
    result = await deployer.deploy(service, "app:2", ignore)
    live = standin.resource(SERVICE)
    assert result.url == live.uri and result.url.startswith("https://worker-") and result.url.endswith(
        ".europe-west1.run.app")
    assert result.console_url == ("https://console.cloud.google.com/run/detail/europe-west1/worker/revisions"
                                  "?project=p")
    (revision,) = [r for r in standin.revisions(SERVICE) if r.name == result.revision]
    assert result.logs_url == revision.log_uri and "cloud_run_revision" in result.logs_url
    summary = result.summary()
    assert summary == {"target": "web", "image": "app:2", "revision": short(result.revision),
                       "previous_revision": short(result.previous_revision), "url": live.uri,
                       "console_url": result.console_url, "logs_url": result.logs_url}
    pooled = await deployer.deploy(pool, "gpu:2", ignore)
    assert pooled.url == "" and pooled.console_url == (
        "https://console.cloud.google.com/run/worker-pools/details/europe-west1/gpu/revisions?project=p")
    assert "cloud_run_worker_pool" in pooled.logs_url and short(pooled.revision) in pooled.logs_url
    # without run.revisions.get the link is built from the worker pool's own log filter
    standin.grant({"run.workerpools.get", "run.workerpools.update", "run.operations.get"})
    again = await deployer.deploy(pool, "gpu:3", ignore)
    assert again.logs_url == logs_link("cloudrun-worker-pool", "p", "europe-west1", "gpu", again.revision)
    assert "resource.type%3D%22cloud_run_worker_pool%22" in again.logs_url


async def test_one_channel_per_target_until_closed(service: Target, pool: Target,
                                                   deployer: CloudRunDeployer) -> None:
    await deployer.current(service)
    await deployer.current(service)
    await deployer.missing_permissions(service)
    await deployer.current(pool)
    assert len(deployer._cache) == 2  # the channel cache is what this test is about
    await deployer.close()
    assert deployer._cache == {}
    assert (await deployer.current(service)).image == "app:1"  # used again: reconnects


# -- failures, told as gcloud tells them: one sentence each, with the remedy that fits -----------------------------


class Events(list[object]):
    def __call__(self, event: object) -> None:
        self.append(event)

    def troubles(self) -> list[str]:
        return [e.text for e in self if isinstance(e, PollTrouble)]


async def test_a_disabled_api_names_the_api_and_the_command_that_enables_it(standin: CloudRunStandIn, service: Target,
                                                                           pool: Target,
                                                                           deployer: CloudRunDeployer) -> None:
    """PERMISSION_DENIED whose ErrorInfo reason is SERVICE_DISABLED: no role would help, so none is named."""
    standin.disable_api("p")
    with pytest.raises(DeployError) as info:
        await deployer.deploy(service, "app:2", ignore)
    assert str(info.value) == ("The Cloud Run Admin API (run.googleapis.com) is disabled in project p, so celeryops "
                               "could not read Cloud Run service worker in p/europe-west1: nothing was changed; enable "
                               "it with `gcloud services enable run.googleapis.com --project p`, wait a minute, and "
                               "try again.")
    assert info.value.code == "SERVICE_DISABLED" and not info.value.permission and not info.value.role
    with pytest.raises(DeployError, match=r"^The Cloud Run Admin API \(run\.googleapis\.com\) is disabled in project "
                                          r"p, so celeryops could not check permissions on Cloud Run worker pool gpu"):
        await deployer.missing_permissions(pool)
    standin.clear_faults()
    assert (await deployer.current(service)).image == "app:1"


async def test_a_missing_permission_still_names_its_role(standin: CloudRunStandIn, service: Target,
                                                         deployer: CloudRunDeployer) -> None:
    standin.grant({"run.services.update", "run.operations.get"})
    with pytest.raises(DeployError) as info:
        await deployer.current(service)
    assert str(info.value) == ("The permission run.services.get is missing on Cloud Run service worker in "
                               "p/europe-west1: nothing was changed; grant it (with roles/run.developer) to the "
                               "account celeryops runs as.")


async def test_quota_refusing_the_update_is_named_with_where_to_raise_it(standin: CloudRunStandIn, service: Target,
                                                                         deployer: CloudRunDeployer) -> None:
    standin.refuse(grpc.StatusCode.RESOURCE_EXHAUSTED, "Quota exceeded for quota metric 'Write requests' and limit "
                   "'Write requests per minute per region'.", rpcs=["UpdateService"], times=1)
    with pytest.raises(DeployError) as info:
        await deployer.deploy(service, "app:2", ignore)
    assert str(info.value) == ("Cloud Run refused to update Cloud Run service worker in p/europe-west1 because a quota "
                               "of project p is exhausted (Quota exceeded for quota metric 'Write requests' and limit "
                               "'Write requests per minute per region'): nothing was changed; wait a minute and try "
                               "again, or raise the quota at https://console.cloud.google.com/iam-admin/quotas"
                               "?project=p&service=run.googleapis.com.")
    assert info.value.code == "RESOURCE_EXHAUSTED" and standin.updates == []


async def test_quota_while_following_a_rollout_is_retried_with_backoff(standin: CloudRunStandIn, service: Target,
                                                                       deployer: CloudRunDeployer) -> None:
    standin.refuse(grpc.StatusCode.RESOURCE_EXHAUSTED, "Quota exceeded for quota metric 'Read requests'.",
                   rpcs=["GetOperation"], times=3)
    events = Events()
    result = await deployer.deploy(service, "app:2", events)
    assert result.revision == standin.resource(SERVICE).latest_ready_revision
    troubles = events.troubles()
    assert len(troubles) == 3 and all("a quota is exhausted (Quota exceeded for quota metric 'Read requests')" in t
                                      for t in troubles)
    delays = [float(t.rsplit("retrying in ", 1)[1].split(" ")[0]) for t in troubles]
    assert delays == sorted(delays) and delays[0] < delays[-1]  # backing off


async def test_quota_that_stays_exhausted_is_named_after_the_grace(standin: CloudRunStandIn, service: Target) -> None:
    deployer = CloudRunDeployer(poll_interval=0.05, rpc_timeout=10, poll_grace=0.5, read_retry=1.0)
    standin.refuse(grpc.StatusCode.RESOURCE_EXHAUSTED, "Quota exceeded for quota metric 'Read requests'.",
                   rpcs=["GetOperation"])
    try:
        with pytest.raises(DeployError) as info:
            await deployer.deploy(service, "app:2", ignore)
    finally:
        await deployer.close()
    assert str(info.value) == ("Cloud Run kept answering that a quota of project p is exhausted (Quota exceeded for "
                               "quota metric 'Read requests') while Cloud Run service worker in p/europe-west1 was "
                               "rolling out app:2: the rollout may still be going on (nothing was rolled back); watch "
                               "it at https://console.cloud.google.com/run/detail/europe-west1/worker/revisions"
                               "?project=p, run recovery, and raise the quota at https://console.cloud.google.com/"
                               "iam-admin/quotas?project=p&service=run.googleapis.com.")
    assert info.value.code == "RESOURCE_EXHAUSTED"


@pytest.mark.parametrize(("reason", "message", "remedy"), [
    ("", None, "read the revision's logs, fix the image and deploy again."),
    ("CONTAINER_MISSING", "Image 'app:nope' not found.",
     "the image does not exist: push app:nope (or fix the target's image) and deploy again."),
    ("CONTAINER_PERMISSION_DENIED", "Google Cloud Run Service Agent must have permission to read the image.",
     "Cloud Run may not pull the image: grant roles/artifactregistry.reader on its repository to the Cloud Run "
     "service agent (service-PROJECT_NUMBER@serverless-robot-prod.iam.gserviceaccount.com), then deploy again."),
])
async def test_a_failed_revision_is_named_with_cloud_runs_reason_and_its_logs(standin: CloudRunStandIn,
                                                                              service: Target,
                                                                              deployer: CloudRunDeployer,
                                                                              reason: str, message: str | None,
                                                                              remedy: str) -> None:
    before = await deployer.current(service)
    standin.fail_next_rollout("worker", message, reason=reason)
    with pytest.raises(DeployError) as info:
        await deployer.deploy(service, "app:nope", ignore)
    failed = standin.revisions(SERVICE)[-1]
    code = reason or "HEALTH_CHECK_CONTAINER_ERROR"
    why = message.rstrip(".") if message else ("The user-provided container failed to start and listen on the port "
                                               "defined provided by the PORT=8080 environment variable within the "
                                               "allocated timeout. This can happen when the container port is "
                                               "misconfigured or if the timeout is too short")
    assert str(info.value) == (f"Cloud Run could not roll out app:nope to Cloud Run service worker in p/europe-west1: "
                               f"revision {short(failed.name)} failed ({code}: {why}); the previous revision "
                               f"{short(before.latest_ready_revision)} keeps serving; {remedy}")
    assert info.value.logs_url == failed.log_uri and "cloud_run_revision" in failed.log_uri


async def test_a_worker_pool_without_instances_is_refused_before_anything_changes(standin: CloudRunStandIn,
                                                                                  pool: Target,
                                                                                  deployer: CloudRunDeployer) -> None:
    await deployer.update_worker_pool(pool, PoolUpdate(instance_count=0), ignore)
    generation = standin.resource(POOL).generation
    for attempt in (deployer.validate(pool, "gpu:2"), deployer.deploy(pool, "gpu:2", ignore)):
        with pytest.raises(DeployError) as info:
            await attempt
        assert str(info.value) == ("Cloud Run worker pool gpu in p/europe-west1 has scaling.manual_instance_count = 0, "
                                   "so its new revision would run no instance and no worker would consume: nothing "
                                   "was changed; give it instances (`gcloud run worker-pools update gpu --instances N "
                                   "--project p --region europe-west1`) and deploy again.")
        assert info.value.code == "NO_INSTANCES"
    assert standin.resource(POOL).generation == generation


def test_ready_means_the_terminal_condition_succeeded() -> None:
    settled = RolloutState(resource=SERVICE, generation=2, observed_generation=2, latest_created_revision="r2",
                           latest_ready_revision="r2")
    assert replace(settled, terminal_state="succeeded").ready
    for state in ("", "pending", "reconciling", "failed"):  # "not failed" is not ready
        assert not replace(settled, terminal_state=state).ready


def test_the_end_of_a_deploy_prints_each_targets_logs_beside_revision_url_and_console() -> None:
    result = DeployResult("web", image="app:2", revision=f"{SERVICE}/revisions/worker-00002-abc",
                          previous_revision=f"{SERVICE}/revisions/worker-1", url="https://worker-1.run.app",
                          console_url="https://console/run", logs_url="https://logs/x")
    deployed = TargetDeployed(**result.summary())
    text = Printer(as_json=False).text(deployed)
    assert text.splitlines() == ["  web: revision worker-00002-abc  https://worker-1.run.app",
                                 "    console: https://console/run", "    logs: https://logs/x"]
    finished = RunFinished(outcome="deployed", exit_code=0, message="done", targets=(deployed,))
    (target,) = finished.to_json()["targets"]
    assert target["logs_url"] == "https://logs/x" and target["revision"] == "worker-00002-abc"
    assert decode("finished", finished.to_json()) == finished  # what `watch` reads back from the published status
    assert decode("target", deployed.to_json()) == deployed


async def test_after_a_failed_revision_split_and_count_updates_finish_and_ready_stays_false(
        standin: CloudRunStandIn, pool: Target, deployer: CloudRunDeployer) -> None:
    """Cloud Run after a failed revision: latest created is the failed one, latest ready the last serving one, the
    pool not Ready. An update of the split or count alone (a retirement, an abort, an overlap rollback) is applied
    and done when the split statuses and the count say so, not when latest ready == latest created (which never
    comes): it finishes without waiting out the target's timeout, and Ready stays False."""
    old = short((await deployer.current(pool)).latest_ready_revision)
    standin.fail_next_rollout("gpu")
    with pytest.raises(DeployError) as info:
        await deployer.update_worker_pool(pool, PoolUpdate(image="gpu:bad", revision="gpu-bad-0001", instance_count=2,
                                                           split=((old, 50), ("gpu-bad-0001", 50))), ignore)
    assert info.value.code == "ROLLOUT_FAILED", info.value
    failed = await deployer.current(pool)
    assert (short(failed.latest_created_revision), short(failed.latest_ready_revision)) == ("gpu-bad-0001", old)
    assert failed.terminal_state == "failed" and not failed.settled and failed.served == {old: 100}
    quick = replace(pool, timeout=30)  # the old rule (latest ready == latest created) ran into this, or failed
    retired = await deployer.update_worker_pool(quick, PoolUpdate(instance_count=1, split=((old, 100),)), ignore)
    assert short(retired.revision) == old
    now = await deployer.current(pool)
    assert now.served == {old: 100} and now.instance_count == 1 and now.caught_up
    assert now.terminal_state == "failed" and short(now.latest_created_revision) == "gpu-bad-0001", now
    assert short(now.latest_ready_revision) == old
    routed = await deployer.route(quick, ((old, 100),), ignore, by="rollback run test")
    assert short(routed.revision) == old and await deployer.route_outcome(pool, ((old, 100),)) == "ready"
    assert (await deployer.current(pool)).terminal_state == "failed"  # Ready stays False until a good revision
    good = await deployer.update_worker_pool(quick, PoolUpdate(image="gpu:2", split=(("", 100),)), ignore)
    after = await deployer.current(pool)
    assert after.ready and short(after.latest_ready_revision) == short(good.revision) != old


async def test_revision_permissions_are_tested_and_named_with_their_role(standin: CloudRunStandIn, pool: Target,
                                                                         deployer: CloudRunDeployer) -> None:
    """An overlap deploy and a rollback read the pool's revisions: the deployer tests run.revisions.get/list with
    test_iam_permissions; where Cloud Run does not take revision permissions on the resource (INVALID_ARGUMENT), it
    finds them by reading. Each is named with the role that grants it."""
    from celeryops.adapters.deploy.base import role_for
    from celeryops.demo.standins.cloudrun import ALL_PERMISSIONS
    from celeryops.ops.preflight.overlap import revisions_check

    assert await deployer.missing_revision_permissions(pool) == []
    standin.grant(ALL_PERMISSIONS - {"run.revisions.list", "run.revisions.get"})
    assert await deployer.missing_revision_permissions(pool) == ["run.revisions.get", "run.revisions.list"]
    standin.grant(ALL_PERMISSIONS - {"run.revisions.get"})
    standin.refuse(grpc.StatusCode.INVALID_ARGUMENT, "Permission run.revisions.get is not valid for this resource.",
                   rpcs=["TestIamPermissions"], times=1)
    assert await deployer.missing_revision_permissions(pool) == ["run.revisions.get"]  # found by reading
    assert role_for("run.revisions.list") == "roles/run.viewer or roles/run.developer"
    standin.grant(ALL_PERMISSIONS - {"run.revisions.list"})
    check = await revisions_check([(pool.name, lambda: deployer.missing_revision_permissions(pool))]).run()
    assert (check.id, check.status, check.detail) == ("revisions", "fail", "gpu is missing run.revisions.list")
    assert check.remedy == ("grant the account celeryops runs as roles/run.viewer or roles/run.developer (for "
                            "run.revisions.list), then run preflight again")
    with pytest.raises(DeployError) as info:
        await deployer.revisions(pool)
    assert info.value.permission == "run.revisions.list" and "roles/run.viewer or roles/run.developer" in str(
        info.value)


async def test_a_pool_without_manual_instance_count_is_read_as_one_and_the_overlap_says_so(
        standin: CloudRunStandIn, pool: Target, deployer: CloudRunDeployer) -> None:
    """A worker pool that sets no scaling.manual_instance_count runs Cloud Run's default of one instance: celeryops
    counts 1, the overlap's traffic check says so in one sentence (ok: nothing is stopped), and the count is set
    explicitly by the next count update (the overlap's cutover)."""
    from celery import Celery

    from celeryops.ops.preflight.overlap import PoolView, overlap_checks

    state = await deployer.current(pool)  # the fixture's pool was seeded without a count
    assert state.instance_count == 1 and not state.instance_count_set
    assert standin.instances(POOL) and sum(len(i) for i in standin.instances(POOL).values()) == 1

    async def read_pool() -> PoolView:
        return PoolView(state)

    async def validate(_change: PoolUpdate) -> None:
        pass

    async def known() -> list[str]:
        return []

    checks = overlap_checks(pool, read_pool, validate, "gpu:2", "gpu-new-0001", app=Celery("t"), fleet="f",
                            known=known, has_registry=True)
    traffic = await next(c for c in checks if c.id == "traffic").run()
    assert traffic.status == "ok", traffic
    assert traffic.detail.startswith("worker pool gpu sets no scaling.manual_instance_count, which Cloud Run runs as 1 "
                                     "instance: celeryops counts 1 and sets it to 1 explicitly at the cutover; all 1 "
                                     "instance(s) of worker pool gpu run "), traffic.detail
    old = short(state.latest_ready_revision)
    await deployer.update_worker_pool(pool, PoolUpdate(instance_count=1, split=((old, 100),)), ignore)
    after = await deployer.current(pool)
    assert after.instance_count == 1 and after.instance_count_set
