"""The local Cloud Run stand-in, driven by the real (sync) google-cloud-run clients over plaintext gRPC."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.cloud import run_v2
from google.cloud.run_v2.services.revisions.transports import RevisionsGrpcTransport
from google.cloud.run_v2.services.services.transports import ServicesGrpcTransport
from google.cloud.run_v2.services.worker_pools.transports import WorkerPoolsGrpcTransport
from google.longrunning import operations_pb2

from celeryops.demo.standins.cloudrun import CloudRunStandIn, iter_conditions
from celeryops_harness.workers import wait_for

State = run_v2.Condition.State
REVISION = re.compile(r"^projects/p/locations/europe-west1/services/worker/revisions/worker-(\d{5})-[a-z0-9]{3}$")


@pytest.fixture
def standin() -> Iterator[CloudRunStandIn]:
    server = CloudRunStandIn(rollout_seconds=0.2)
    server.add_service("p", "europe-west1", "worker", "img:1")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def channel(standin: CloudRunStandIn) -> Iterator[grpc.Channel]:
    chan = grpc.insecure_channel(standin.address)
    yield chan
    chan.close()


@pytest.fixture
def services(channel: grpc.Channel) -> run_v2.ServicesClient:
    return run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=channel))


NAME = "projects/p/locations/europe-west1/services/worker"


def poll(client: run_v2.ServicesClient | run_v2.WorkerPoolsClient, op_name: str) -> list[operations_pb2.Operation]:
    """Every GetOperation answer until done (bounded by a deadline)."""
    seen: list[operations_pb2.Operation] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        op = client.get_operation({"name": op_name})
        seen.append(op)
        if op.done:
            return seen
        time.sleep(0.02)
    raise AssertionError("the operation never finished")


def test_seeded_service_is_ready(services: run_v2.ServicesClient) -> None:
    svc = services.get_service(name=NAME)
    assert svc.generation == svc.observed_generation == 1
    assert not svc.reconciling
    match = REVISION.match(svc.latest_ready_revision)
    assert match and match.group(1) == "00001"
    assert svc.latest_created_revision == svc.latest_ready_revision
    assert [(c.name, c.image) for c in svc.template.containers] == [("worker", "img:1")]
    assert svc.terminal_condition.type_ == "Ready" and svc.terminal_condition.state == State.CONDITION_SUCCEEDED


def test_update_reconciles_then_finishes(standin: CloudRunStandIn, services: run_v2.ServicesClient,
                                         channel: grpc.Channel) -> None:
    hook_calls: list[tuple[str, str, str]] = []
    standin.on_update = lambda *args: hook_calls.append(args)
    svc = services.get_service(name=NAME)
    svc.template.containers[0].image = "img:2"
    lro = services.update_service(service=svc)
    ops = poll(services, lro.operation.name)
    first = run_v2.Service.deserialize(ops[0].metadata.value)
    assert first.generation == 2
    new_revision = first.latest_created_revision
    assert REVISION.match(new_revision) and "-00002-" in new_revision
    for op in ops:  # metadata on every poll: the service being reconciled
        assert op.metadata.type_url == "type.googleapis.com/google.cloud.run.v2.Service"
    if not ops[0].done:
        assert first.reconciling and first.observed_generation == 1
        assert first.latest_ready_revision != new_revision
        assert first.terminal_condition.state == State.CONDITION_RECONCILING
    final = run_v2.Service.deserialize(ops[-1].response.value)
    assert not final.reconciling and final.observed_generation == 2
    assert final.latest_ready_revision == final.latest_created_revision == new_revision
    assert final.template.containers[0].image == "img:2"
    assert ("ConfigurationsReady", "CONDITION_SUCCEEDED", "") in list(iter_conditions(final))
    assert hook_calls == [(NAME, new_revision, "img:2")]

    revisions = run_v2.RevisionsClient(transport=RevisionsGrpcTransport(channel=channel))
    listed = [r.name for r in revisions.list_revisions(parent=NAME)]
    assert listed[0] == new_revision and len(listed) == 2
    got = revisions.get_revision(name=new_revision)
    assert got.containers[0].image == "img:2" and got.service == "worker"
    assert got.conditions[0].state == State.CONDITION_SUCCEEDED


def test_failed_rollout_keeps_old_revision(standin: CloudRunStandIn, services: run_v2.ServicesClient) -> None:
    hook_calls: list[tuple[str, str, str]] = []
    standin.on_update = lambda *args: hook_calls.append(args)
    old = services.get_service(name=NAME).latest_ready_revision
    standin.fail_next_rollout("worker", "Container failed to start: exec format error.")
    svc = services.get_service(name=NAME)
    svc.template.containers[0].image = "img:bad"
    ops = poll(services, services.update_service(service=svc).operation.name)
    assert ops[-1].HasField("error") and not ops[-1].HasField("response")
    assert ops[-1].error.message == "Container failed to start: exec format error."
    after = services.get_service(name=NAME)
    assert after.latest_ready_revision == old
    assert after.latest_created_revision != old
    assert not after.reconciling
    assert after.terminal_condition.state == State.CONDITION_FAILED
    assert after.terminal_condition.message == "Container failed to start: exec format error."
    assert hook_calls == []  # the new revision never started


def test_hook_failure_fails_the_rollout(standin: CloudRunStandIn, services: run_v2.ServicesClient) -> None:
    def boom(resource: str, revision: str, image: str) -> None:
        raise RuntimeError("workers did not start")

    standin.on_update = boom
    svc = services.get_service(name=NAME)
    svc.template.containers[0].image = "img:2"
    ops = poll(services, services.update_service(service=svc).operation.name)
    assert "workers did not start" in ops[-1].error.message


def test_not_found_permission_denied_and_unavailable(standin: CloudRunStandIn,
                                                     services: run_v2.ServicesClient) -> None:
    with pytest.raises(gexc.NotFound, match="'nope' of kind 'SERVICE'"):
        services.get_service(name=NAME.replace("worker", "nope"), retry=None)
    standin.grant({"run.services.get"})
    reply = services.test_iam_permissions({"resource": NAME,
                                           "permissions": ["run.services.get", "run.services.update"]})
    assert list(reply.permissions) == ["run.services.get"]
    svc = services.get_service(name=NAME)
    with pytest.raises(gexc.PermissionDenied, match=r"Permission 'run\.services\.update' denied"):
        services.update_service(service=svc, retry=None)
    standin.grant(None)
    standin.unavailable = True
    with pytest.raises(gexc.ServiceUnavailable):
        services.get_service(name=NAME, retry=None, timeout=5)
    standin.unavailable = False
    assert services.get_service(name=NAME, retry=None).generation == 1


def test_stale_etag_is_aborted(services: run_v2.ServicesClient) -> None:
    svc = services.get_service(name=NAME)
    svc.template.containers[0].image = "img:2"
    poll(services, services.update_service(service=svc).operation.name)
    with pytest.raises(gexc.Aborted, match="etag"):
        services.update_service(service=svc, retry=None)  # still carries the old etag


def test_slow_rollout_and_busy_resource(standin: CloudRunStandIn, services: run_v2.ServicesClient) -> None:
    standin.slow_next_rollout("worker", 2.0)
    svc = services.get_service(name=NAME)
    svc.template.containers[0].image = "img:2"
    op_name = services.update_service(service=svc).operation.name
    assert not services.get_operation({"name": op_name}).done
    again = services.get_service(name=NAME)
    with pytest.raises(gexc.FailedPrecondition, match="still in progress"):
        services.update_service(service=again, retry=None)
    assert poll(services, op_name)[-1].HasField("response")


def test_worker_pool(standin: CloudRunStandIn, channel: grpc.Channel) -> None:
    name = standin.add_worker_pool("p", "us-central1", "gpu", [("sidecar", "proxy:1"), ("gpu", "gpu:1")])
    pools = run_v2.WorkerPoolsClient(transport=WorkerPoolsGrpcTransport(channel=channel))
    pool = pools.get_worker_pool(name=name)
    assert pool.latest_ready_revision.startswith(f"{name}/revisions/gpu-00001-")
    pool.template.containers[1].image = "gpu:2"
    ops = poll(pools, pools.update_worker_pool(worker_pool=pool).operation.name)
    final = run_v2.WorkerPool.deserialize(ops[-1].response.value)
    assert [c.image for c in final.template.containers] == ["proxy:1", "gpu:2"]
    assert final.latest_ready_revision.startswith(f"{name}/revisions/gpu-00002-")
    assert standin.updates[-1] == (name, final.latest_ready_revision, "gpu:2")
    reply = pools.test_iam_permissions({"resource": name, "permissions": ["run.workerpools.update"]})
    assert list(reply.permissions) == ["run.workerpools.update"]
    with pytest.raises(gexc.NotFound):  # a service name is not a worker pool
        pools.get_worker_pool(name=NAME, retry=None)


def test_restart_keeps_port_and_state(standin: CloudRunStandIn) -> None:
    address = standin.address
    standin.stop()
    assert not standin.running
    assert standin.start() == address
    with grpc.insecure_channel(address) as chan:
        client = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
        assert client.get_service(name=NAME, retry=None, timeout=10).generation == 1


def test_module_entry_point_serves_seeds() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "celeryops.demo.standins.cloudrun", "--port", "0", "--rollout-seconds", "0.1",
         "--seed-service", "p/europe-west1/worker=img:1", "--seed-worker-pool", "p/europe-west1/pool=img:9"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline() if proc.stdout else ""),
                                  daemon=True)
        reader.start()
        wait_for(lambda: bool(lines), 60, "the stand-in to print its address")
        match = re.search(r"listening on (127\.0\.0\.1:\d+)", lines[0])
        assert match, lines
        with grpc.insecure_channel(match.group(1)) as chan:
            client = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
            assert client.get_service(name=NAME, retry=None, timeout=10).template.containers[0].image == "img:1"
            pools = run_v2.WorkerPoolsClient(transport=WorkerPoolsGrpcTransport(channel=chan))
            pool_name = "projects/p/locations/europe-west1/workerPools/pool"
            assert pools.get_worker_pool(name=pool_name, retry=None, timeout=10).template.containers[0].image \
                == "img:9"
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_fixed_revision_name_cannot_be_reused(services: run_v2.ServicesClient) -> None:
    svc = services.get_service(name=NAME)
    svc.template.revision = "worker-fixed"
    svc.template.containers[0].image = "img:2"
    ops = poll(services, services.update_service(service=svc).operation.name)
    assert run_v2.Service.deserialize(ops[-1].response.value).latest_ready_revision == f"{NAME}/revisions/worker-fixed"
    again = services.get_service(name=NAME)
    again.template.containers[0].image = "img:3"
    with pytest.raises(gexc.AlreadyExists, match="worker-fixed"):
        services.update_service(service=again, retry=None)
