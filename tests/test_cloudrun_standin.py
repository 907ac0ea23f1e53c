"""The local Cloud Run stand-in, driven by the real google-cloud-run clients over plaintext gRPC: its resources,
faults (quota, a disabled API with its ErrorInfo), and its instances: real processes per revision (real Celery
workers in the slow test), a new revision's started before old ones are taken away (SIGTERM, SIGKILL after the
grace), the count divided by the split; when a revision's count drops, the instances that go are drawn at random, busy
or not, as on Cloud Run (issue 36)."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.cloud import run_v2
from google.cloud.run_v2.services.revisions.transports import RevisionsGrpcTransport
from google.cloud.run_v2.services.services.transports import ServicesGrpcTransport
from google.cloud.run_v2.services.worker_pools.transports import WorkerPoolsGrpcTransport
from google.longrunning import operations_pb2

from celeryops.adapters.deploy import CloudRunDeployer, DeployError, PoolUpdate
from celeryops.core.config import Target
from celeryops.demo.standins.cloudrun import CloudRunStandIn, InstanceSpec, allocate, iter_conditions
from celeryops.demo.standins.cloudrun_instances import GRACE_SECONDS, InstanceSet
from celeryops.demo.standins.workers import CeleryInstances
from celeryops.fence import by_revision, plugin_workers
from celeryops_harness.taskapp import hold, release
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


# -- instances: how many each revision runs, started before the old ones are taken away ---------------------------

SLEEPER = """
import signal, sys, time
def term(*_):
    if sys.argv[1] != "ignore":
        sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("up", flush=True)
while True:
    time.sleep(1)
"""


class Sleeper:
    """A real process as an instance; what the stand-in sends it is recorded in order (with the starts)."""

    def __init__(self, owner: Sleepers, spec: InstanceSpec, proc: subprocess.Popen[str]) -> None:
        self.owner, self.spec, self.proc = owner, spec, proc

    def signal(self, sig: int) -> None:
        self.owner.log(signal.Signals(sig).name, self.spec)
        os.kill(self.proc.pid, sig)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def environ(self) -> dict[str, str]:
        pairs = Path(f"/proc/{self.proc.pid}/environ").read_bytes().split(b"\0")
        return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)


class Sleepers:
    """The launcher: one sleeper process per instance (``ignore_term``: it survives SIGTERM); ``fail`` decides
    which instances fail to start. ``events``: (what, revision, instance number) in the order they happened."""

    def __init__(self, *, ignore_term: bool = False, fail: Callable[[InstanceSpec], bool] = lambda s: False) -> None:
        self.ignore_term, self.fail = ignore_term, fail
        self.events: list[tuple[str, str, int]] = []
        self.handles: list[Sleeper] = []
        self._lock = threading.Lock()

    def log(self, what: str, spec: InstanceSpec) -> None:
        with self._lock:
            self.events.append((what, spec.revision, spec.number))

    def __call__(self, spec: InstanceSpec) -> Sleeper:
        if self.fail(spec):
            raise RuntimeError("exec format error")
        proc = subprocess.Popen([sys.executable, "-c", SLEEPER, "ignore" if self.ignore_term else "exit"],
                                env={**os.environ, **spec.env}, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"  # its SIGTERM handler is set
        handle = Sleeper(self, spec, proc)
        with self._lock:
            self.handles.append(handle)
        self.log("start", spec)
        return handle

    def of(self, what: str, revision: str) -> list[int]:
        """Positions in ``events`` of ``what`` happening to ``revision``'s instances."""
        return [i for i, (w, r, _n) in enumerate(self.events) if w == what and r == revision]

    def stop(self) -> None:
        for handle in self.handles:
            if handle.alive():
                handle.proc.kill()
            handle.proc.wait(10)
            assert handle.proc.stdout is not None
            handle.proc.stdout.close()


@pytest.fixture
def sleepers() -> Iterator[Sleepers]:
    made = Sleepers()
    yield made
    made.stop()


def pool_target(standin: CloudRunStandIn, name: str = "gpu") -> Target:
    return Target(name=name, kind="cloudrun-worker-pool", project="p", region="europe-west1", resource=name,
                  image=f"{name}:{{sha}}", api_endpoint=standin.address, insecure=True, timeout=60)


def counts(standin: CloudRunStandIn, name: str) -> dict[str, int]:
    return {rev: len(found) for rev, found in standin.instances(name).items()}


def short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def test_allocate_divides_instances_as_cloud_run_documents() -> None:
    """Proportional shares, the total kept: with fewer instances than revisions, some revisions get none."""
    assert allocate(4, [("old", 50), ("new", 50)]) == {"old": 2, "new": 2}
    assert allocate(3, [("old", 50), ("new", 50)]) == {"old": 2, "new": 1}
    assert allocate(1, [("old", 50), ("new", 50)]) == {"old": 1, "new": 0}
    assert allocate(10, [("a", 33), ("b", 33), ("c", 34)]) == {"a": 3, "b": 3, "c": 4}
    assert allocate(5, [("a", 10), ("b", 90)]) == {"a": 1, "b": 4}
    assert allocate(0, [("a", 100)]) == {"a": 0}
    assert GRACE_SECONDS == 10.0  # Cloud Run's SIGTERM-to-SIGKILL grace


async def test_a_pool_runs_its_count_split_between_revisions_new_ones_first(sleepers: Sleepers) -> None:
    standin = CloudRunStandIn(rollout_seconds=0.1, launcher=sleepers, grace=2.0)
    standin.start()
    deployer = CloudRunDeployer(poll_interval=0.05, rpc_timeout=10, read_retry=1.0)
    try:
        name = standin.add_worker_pool("p", "europe-west1", "gpu", "gpu:1", instances=2)
        (first,) = counts(standin, "gpu")
        assert counts(standin, "gpu") == {first: 2}
        env = sleepers.handles[0].environ()
        assert (env["CLOUD_RUN_WORKER_POOL"], env["CLOUD_RUN_WORKER_POOL_REVISION"]) == ("gpu", first)
        assert not {"K_SERVICE", "K_REVISION", "K_CONFIGURATION"} & set(env)  # services only
        pool = pool_target(standin)
        state = await deployer.current(pool)
        assert state.instance_count == 2 and state.ready

        # Overlap-style: count doubled, the new revision named up front and split 50/50 in ONE update.
        result = await deployer.update_worker_pool(
            pool, PoolUpdate(image="gpu:2", revision="gpu-v2", instance_count=4, split=((first, 50), ("gpu-v2", 50))),
            lambda e: None)
        assert short(result.revision) == "gpu-v2" and result.logs_url
        assert counts(standin, "gpu") == {first: 2, "gpu-v2": 2}
        assert not sleepers.of("SIGTERM", first)  # nothing was taken away
        listed = {r.name: r for r in await deployer.revisions(pool)}
        assert (listed[first].instances, listed["gpu-v2"].instances) == (2, 2)
        assert listed["gpu-v2"].state == "succeeded" and listed["gpu-v2"].image == "gpu:2"
        now = await deployer.current(pool)
        assert now.instance_count == 4 and now.serves(((first, 50), ("gpu-v2", 50)))

        # The split alone: every instance to the latest (gpu-v2) at the original count; the old ones go.
        await deployer.update_worker_pool(pool, PoolUpdate(instance_count=2, split=(("", 100),)), lambda e: None)
        wait_for(lambda: counts(standin, "gpu") == {"gpu-v2": 2} and not standin.leaving("gpu"), 30,
                 "the old revision's instances to leave")
        assert len(sleepers.of("SIGTERM", first)) == 2 and not sleepers.of("SIGKILL", first)  # they exited in time
        assert standin.resource(name).latest_created_revision.endswith("/gpu-v2")  # no new revision was made

        # A new revision (a plain deploy): its instances start before any old one gets SIGTERM.
        third = await deployer.deploy(pool, "gpu:3", lambda e: None)
        wait_for(lambda: counts(standin, "gpu") == {short(third.revision): 2} and not standin.leaving("gpu"), 30,
                 "the replaced instances to leave")
        assert max(sleepers.of("start", short(third.revision))) < min(sleepers.of("SIGTERM", "gpu-v2"))
    finally:
        await deployer.close()
        standin.stop()


async def test_an_instance_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    """A pool set to 0 instances reports ready with none running (celeryops refuses to deploy to it); the
    instance taken away got SIGTERM, ignored it, and got SIGKILL when the grace ran out."""
    stubborn = Sleepers(ignore_term=True)
    standin = CloudRunStandIn(rollout_seconds=0.1, launcher=stubborn, grace=0.5)
    standin.start()
    deployer = CloudRunDeployer(poll_interval=0.05, rpc_timeout=10, read_retry=1.0)
    try:
        standin.add_worker_pool("p", "europe-west1", "gpu", "gpu:1")  # manual_instance_count unset: 1 instance
        (first,) = counts(standin, "gpu")
        assert (await deployer.current(pool_target(standin))).instance_count == 1
        await deployer.update_worker_pool(pool_target(standin), PoolUpdate(instance_count=0), lambda e: None)
        assert counts(standin, "gpu") == {}
        wait_for(lambda: not stubborn.handles[0].alive(), 30, "the SIGKILL after the grace")
        assert [(w, r) for w, r, _n in stubborn.events] == [("start", first), ("SIGTERM", first), ("SIGKILL", first)]
        state = await deployer.current(pool_target(standin))
        assert state.ready and state.instance_count == 0
        with pytest.raises(DeployError) as info:
            await deployer.validate(pool_target(standin), "gpu:2")
        assert info.value.code == "NO_INSTANCES" and "\n" not in str(info.value)
    finally:
        await deployer.close()
        standin.stop()
        stubborn.stop()


async def test_a_revision_whose_instances_fail_to_start_fails_and_the_old_ones_stay() -> None:
    failing = Sleepers(fail=lambda spec: spec.revision == "gpu-bad" and spec.number == 4)
    standin = CloudRunStandIn(rollout_seconds=0.1, launcher=failing, grace=2.0)
    standin.start()
    deployer = CloudRunDeployer(poll_interval=0.05, rpc_timeout=10, read_retry=1.0)
    try:
        standin.add_worker_pool("p", "europe-west1", "gpu", "gpu:1", instances=2)
        (first,) = counts(standin, "gpu")
        with pytest.raises(DeployError) as info:
            await deployer.update_worker_pool(pool_target(standin), PoolUpdate(image="gpu:bad", revision="gpu-bad"),
                                              lambda e: None)
        assert info.value.code == "ROLLOUT_FAILED" and "revision gpu-bad failed" in str(info.value)
        assert "exec format error" in str(info.value)
        wait_for(lambda: not standin.leaving("gpu"), 30, "the failed revision's instance to leave")
        assert counts(standin, "gpu") == {first: 2}
        assert failing.of("SIGTERM", "gpu-bad") and not failing.of("SIGTERM", first)
        failed = next(r for r in standin.revisions("gpu") if r.name.endswith("/gpu-bad"))
        ready = failed.conditions[0]
        assert ready.state == State.CONDITION_FAILED
        assert ready.revision_reason == run_v2.Condition.RevisionReason.HEALTH_CHECK_CONTAINER_ERROR
        assert "cloud_run_worker_pool" in failed.log_uri and info.value.logs_url == failed.log_uri
    finally:
        await deployer.close()
        standin.stop()
        failing.stop()


def test_a_service_runs_its_instances_with_what_cloud_run_sets_for_services(sleepers: Sleepers) -> None:
    standin = CloudRunStandIn(rollout_seconds=0.1, launcher=sleepers, grace=2.0)
    standin.start()
    try:
        standin.add_service("p", "europe-west1", "web", "web:1", instances=2)
        (first,) = counts(standin, "web")
        env = sleepers.handles[0].environ()
        assert (env["K_SERVICE"], env["K_REVISION"], env["K_CONFIGURATION"]) == ("web", first, "web")
        assert not any(k.startswith("CLOUD_RUN_") for k in env)
        started = standin.scale("web", 3)  # the autoscaler: one more of the serving revision
        assert [i.revision for i in started] == [first] and counts(standin, "web") == {first: 3}
        with grpc.insecure_channel(standin.address) as chan:
            client = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
            svc = client.get_service(name="projects/p/locations/europe-west1/services/web")
            svc.template.containers[0].image = "web:2"
            final = run_v2.Service.deserialize(poll(client, client.update_service(service=svc).operation.name)[-1]
                                               .response.value)
        new = short(final.latest_ready_revision)
        wait_for(lambda: counts(standin, "web") == {new: 3} and not standin.leaving("web"), 30,
                 "the old revision's instances to leave")
        assert max(sleepers.of("start", new)) < min(sleepers.of("SIGTERM", first))
        standin.add_worker_pool("p", "europe-west1", "gpu", "gpu:1")
        with pytest.raises(ValueError, match="manual_instance_count"):
            standin.scale("gpu", 2)
    finally:
        standin.stop()


def test_quota_and_a_disabled_api_answer_as_cloud_run_does(standin: CloudRunStandIn,
                                                           services: run_v2.ServicesClient) -> None:
    standin.refuse(grpc.StatusCode.RESOURCE_EXHAUSTED, "Quota exceeded for quota metric 'Read requests'.",
                   rpcs=["GetService"], times=2)
    for _ in range(2):
        with pytest.raises(gexc.ResourceExhausted, match="Quota exceeded"):
            services.get_service(name=NAME, retry=None)
    assert services.get_service(name=NAME, retry=None).name == NAME  # two calls only
    standin.disable_api("p")
    with pytest.raises(gexc.PermissionDenied) as info:
        services.get_service(name=NAME, retry=None)
    assert info.value.reason == "SERVICE_DISABLED" and info.value.domain == "googleapis.com"
    assert info.value.metadata["service"] == "run.googleapis.com"
    assert "Cloud Run Admin API has not been used in project" in str(info.value.message)
    standin.clear_faults()
    assert services.get_service(name=NAME, retry=None).name == NAME


@pytest.mark.slow
async def test_pool_instances_are_real_celery_workers_per_revision(redis_url: str, redis_client: Any,
                                                                   queue_name: str, tmp_path: Path) -> None:
    """Count 4 split 50/50 is 2 Celery workers of each revision, each telling the fence registry which revision of
    which worker pool it is; moving the split to the new revision takes the old workers away (warm shutdown)."""
    workers = CeleryInstances(redis_url, app="celeryops_harness.fenceapp", queues=[queue_name], log_dir=tmp_path,
                              env={"CELERYOPS_TEST_RECORD": redis_url, "CELERYOPS_FENCE_INTERVAL": "0.3"})
    standin = CloudRunStandIn(rollout_seconds=0.1, launcher=workers)
    standin.start()
    deployer = CloudRunDeployer(poll_interval=0.1, rpc_timeout=10, read_retry=1.0)
    try:
        standin.add_worker_pool("p", "europe-west1", "gpu", "gpu:1", instances=2)
        (first,) = counts(standin, "gpu")
        pool = pool_target(standin)
        await deployer.update_worker_pool(
            pool, PoolUpdate(image="gpu:2", revision="gpu-v2", instance_count=4, split=((first, 50), ("gpu-v2", 50))),
            lambda e: None)

        def registry() -> dict[str, tuple[str, ...]]:
            return by_revision(plugin_workers(redis_client))

        wait_for(lambda: {r: len(h) for r, h in registry().items()} == {first: 2, "gpu-v2": 2}, 60,
                 "two plugin workers of each revision in the fence registry")
        assert {i.cloudrun_kind for i in plugin_workers(redis_client).values()} == {"worker-pool"}
        assert {i.cloudrun_name for i in plugin_workers(redis_client).values()} == {"gpu"}
        await deployer.update_worker_pool(pool, PoolUpdate(instance_count=2, split=(("", 100),)), lambda e: None)
        wait_for(lambda: not workers.alive(first), 60, "the old revision's workers to shut down")
        wait_for(lambda: set(registry()) == {"gpu-v2"}, 60, "only the new revision in the registry")
        assert len(workers.alive("gpu-v2")) == 2
    finally:
        await deployer.close()
        standin.stop()
        workers.stop()


def taken_numbers(seed: int, running: int, keep: int) -> list[int]:
    """The numbers of the instances a seeded stand-in takes away when a revision of ``running`` drops to ``keep``."""
    instances = InstanceSet(rng=random.Random(seed))  # bookkeeping instances: no launcher
    instances.grow("pool", "worker-pool", {"rev": running}, lambda rev: "img:1")
    taken = instances.shrink("pool", {"rev": keep})
    assert sorted(i.spec.number for i in instances.of("pool") if i.running) == sorted(
        set(range(1, running + 1)) - {i.spec.number for i in taken})
    return sorted(i.spec.number for i in taken)


def test_a_count_that_drops_takes_instances_away_at_random() -> None:
    """Cloud Run documents no order for the instances it takes away: the stand-in draws them (issue 36). Over seeds
    every instance of the revision is sometimes the one, the oldest and the newest included; a seed replays the same
    draw; several go at once when the count drops by several; a revision set to 0 loses all of them."""
    draws = [taken_numbers(seed, 4, 3) for seed in range(40)]
    assert all(len(d) == 1 for d in draws)
    assert {d[0] for d in draws} == {1, 2, 3, 4}
    assert taken_numbers(7, 4, 3) == taken_numbers(7, 4, 3)
    pairs = {tuple(taken_numbers(seed, 5, 2)) for seed in range(60)}
    assert all(len(p) == 3 for p in pairs) and len(pairs) > 5
    assert taken_numbers(3, 3, 0) == [1, 2, 3]


@pytest.mark.slow
def test_a_busy_instance_may_be_taken_away_and_its_task_is_lost(redis_url: str, redis_client: Any,
                                                                queue_name: str, tmp_path: Path) -> None:
    """The stand-in is as dangerous as Cloud Run (issue 36): a worker pool of 3 real Celery workers (one task at a
    time), one of them running a long task; its count lowered to 2 through the real client, the stand-in re-seeded
    at each round. In some rounds the busy instance is the one taken away: SIGTERM (a warm shutdown that waits for
    the task), SIGKILL when the grace ran out, and the task, started, never finishes (acks_late off: it is gone). In
    others an idle one goes and the task finishes. The count goes back to 3 between rounds."""
    workers = CeleryInstances(redis_url, app="celeryops_harness.taskapp", queues=[queue_name], log_dir=tmp_path,
                              env={"CELERYOPS_TEST_RECORD": redis_url}, options=lambda spec: {"concurrency": 1})
    standin = CloudRunStandIn(rollout_seconds=0.1, launcher=workers, grace=1.0, rng=random.Random(0))
    standin.start()
    chan = grpc.insecure_channel(standin.address)
    pools = run_v2.WorkerPoolsClient(transport=WorkerPoolsGrpcTransport(channel=chan))
    outcomes: dict[bool, int] = {}  # busy instance taken away? -> the first seed where it happened
    taken_rounds = 0  # rounds whose busy instance was taken away (several may come before the first that kept it)
    try:
        name = standin.add_worker_pool("p", "europe-west1", "gpu", "gpu:1", instances=3)

        def set_count(count: int) -> None:
            pool = pools.get_worker_pool(name=name)
            pool.scaling.manual_instance_count = count
            assert poll(pools, pools.update_worker_pool(worker_pool=pool).operation.name)[-1].HasField("response")

        for seed in range(1, 41):
            gate = f"round-{seed}"
            with hold.app.connection_for_write(redis_url) as conn:
                tid = hold.apply_async(args=(gate, "long"), queue=queue_name, connection=conn).id
            wait_for(lambda: redis_client.hget(f"ct:run:{tid}", "worker"), 60, "the long task to start")  # noqa: B023
            busy = next(w for w in workers.workers if w.nodename == redis_client.hget(f"ct:run:{tid}", "worker"))
            standin.instance_set.rng.seed(seed)
            set_count(2)
            # The update's operation may be done before the stand-in takes the instance away (as on Cloud Run, where
            # instances go after the revision is ready): wait for 2 running and none leaving, not for none leaving.
            wait_for(lambda: not standin.leaving("gpu")
                     and sum(len(found) for found in standin.instances("gpu").values()) == 2,
                     60, "one instance taken away and exited")
            taken = not busy.alive()
            release(redis_client, gate)
            if taken:  # SIGTERM, a warm shutdown waiting for the task, then the SIGKILL after the grace: it is lost
                assert busy.proc is not None and busy.proc.returncode == -signal.SIGKILL
                assert "warm shutdown" in busy.log().lower()
                assert redis_client.hget(f"ct:run:{tid}", "started") and redis_client.get(f"ct:runs:{tid}") == "1"
            else:
                wait_for(lambda: redis_client.hget(f"ct:run:{tid}", "finished"), 60,  # noqa: B023
                         "the long task to finish on the instance that stayed")
            outcomes.setdefault(taken, seed)
            taken_rounds += taken
            if len(outcomes) == 2:
                break
            set_count(3)
        assert set(outcomes) == {True, False}, outcomes
        lost = [t for t in redis_client.lrange("ct:starts", 0, -1) if not redis_client.hget(f"ct:run:{t}", "finished")]
        assert len(lost) == taken_rounds  # each taken busy instance's task: never finished, never ran again
    finally:
        chan.close()
        standin.stop()
        workers.stop()
