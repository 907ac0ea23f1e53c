"""Issue 36: how the autoscaler reads demand and capacity: per queue, ready + reserved + active with ETA apart (by
the queue each held task came from), workers grouped into instances of revisions, and a slot-gated pool's capacity
per instance from its hosts' slot totals (a real Redis)."""

from __future__ import annotations

import redis

from celeryops.core.autoscale import AutoscaleSettings
from celeryops.core.config import Target
from celeryops.core.events import Observation, TaskInfo, WorkerObs
from celeryops.fence.registry import PluginWorkerInfo
from celeryops.ops.autoscale.demand import PoolReader, demand_of, instances_of, pool_workers
from celeryops.ops.autoscale.policy import QueueDemand
from celeryops.slots.store import SlotStore, host_pool

POOL = Target(name="gpu", kind="cloudrun-worker-pool", project="p", region="r", resource="gpu-pool")


def test_demand_counts_what_celery_holds_per_queue() -> None:
    tasks = (TaskInfo("w1", "a", "t", "active", queue="gpu"), TaskInfo("w1", "b", "t", "reserved", queue="gpu"),
             TaskInfo("w2", "c", "t", "scheduled", queue="gpu"), TaskInfo("w2", "d", "t", "active", queue="cpu"),
             TaskInfo("w2", "e", "t", "active", queue=""))  # a worker that did not say: the first queue's
    seen = Observation(workers={"w1": WorkerObs("w1", True), "w2": WorkerObs("w2", True)}, tasks=tasks)
    demand = demand_of(["gpu", "cpu"], {"gpu": 5, "cpu": None}, seen)
    assert demand == (QueueDemand("gpu", 5, 1, 2, 1), QueueDemand("cpu", None, 0, 1, 0))
    assert [q.total for q in demand] == [8, 1]  # ETA apart; a queue the broker could not tell counts what it held
    assert demand_of(["gpu"], {"gpu": 3}, None) == (QueueDemand("gpu", 3),)  # no worker: the broker decides


def test_workers_by_revision_and_instance() -> None:
    def info(host: str, revision: str, instance: str, name: str = "gpu-pool") -> PluginWorkerInfo:
        return PluginWorkerInfo(host, revision=revision, cloudrun_kind="worker-pool", cloudrun_name=name,
                                instance_id=instance)

    infos = {"a1": info("a1", "r1", "i1"), "a2": info("a2", "r1", "i1"), "b1": info("b1", "r2", "i2"),
             "x": info("x", "r1", "i9", name="other-pool")}
    mine = pool_workers(infos, POOL)
    assert set(mine) == {"a1", "a2", "b1"}
    assert instances_of(mine) == {"r1": {"i1": ["a1", "a2"]}, "r2": {"i2": ["b1"]}}


async def test_a_gpu_pools_capacity_is_its_gpus(redis_client: redis.Redis) -> None:
    SlotStore(redis_client, host_pool("gpu-pool-00001-abc.1234abcd")).set_totals({"gpu": 2, "cpu": 8})
    SlotStore(redis_client, host_pool("gpu-pool-00001-abc.5678ef90")).set_totals({"gpu": 2, "cpu": 8})
    reader = PoolReader(fleet=None, coord=None, fleet_name="default", target=POOL, deployer=None,  # type: ignore[arg-type]
                        settings=AutoscaleSettings(slot_resource="gpu"), slots=redis_client)
    assert await reader._slot_total() == 2
    assert await reader._per_instance({}, {}) == 2  # no worker to ask its concurrency: the slots say
    reader.settings = AutoscaleSettings(slot_resource="gpu", tasks_per_instance=3)
    assert await reader._per_instance({}, {}) == 3  # said in the configuration: that
