"""GPU slots bound to devices, against a real redis-server: a granted ``gpu: k`` in a host's pool is k of that host's
devices, taken in the same Lua acquire; released, expired and reaped leases give them back; a device list that
changes never hands out a device a lease still holds; a lease registered again after Redis lost its data gets back
only the devices still free; and a property-based test that, after every step of random acquires, releases,
renewals, expiries, reaps and workers joining, changing and leaving, no two live leases hold one device and no
device is lost."""

from __future__ import annotations

import time
from typing import cast

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from celeryops.demo.standins.redis_server import RedisServer
from celeryops.slots import SlotStore, connect, read_all
from celeryops.slots.store import parse_devices
from celeryops_harness.workers import wait_for

FOUR = {"gpu": [0, 1, 2, 3]}


def host_pool(client: redis.Redis, devices: dict[str, list[int | str]] = FOUR, cpu: int = 8) -> SlotStore:
    store = SlotStore(client, "host:h1")
    store.contribute("h1", {"cpu": cpu, "gpu": len(devices["gpu"])}, ttl=60, worker="celery@a", devices=devices)
    return store


def free(store: SlotStore) -> list[int | str]:
    """The free list as acquire reads it (the device freed longest ago first)."""
    raw = cast(str | None, store.client.hget(store.keys[0], "free:gpu"))
    return parse_devices(f"gpu={raw}").get("gpu", []) if raw is not None else []


def test_a_gpu_slot_is_a_device_of_the_host(redis_client: redis.Redis) -> None:
    store = host_pool(redis_client)
    a = store.acquire("a", {"gpu": 2, "cpu": 1}, ttl=30, name="ml.train", worker="celery@a")
    b = store.acquire("b", {"gpu": 1}, ttl=30, name="ml.embed", worker="celery@a")
    assert a.devices == {"gpu": [0, 1]} and b.devices == {"gpu": [2]}
    assert store.acquire("a", {"gpu": 2, "cpu": 1}, ttl=30).devices == {"gpu": [0, 1]}  # held: the same devices
    c = store.acquire("c", {"gpu": 2}, ttl=30)
    assert (c.ok, c.status, c.blocked_type) == (False, "busy", "gpu")
    snap = store.snapshot()
    rows = {d.device: d for d in snap.devices}
    assert [d.device for d in snap.devices] == [0, 1, 2, 3]
    assert (rows[0].task_id, rows[0].task_name, rows[0].worker) == ("a", "ml.train", "celery@a")
    assert rows[2].task_id == "b" and rows[3].free and rows[0].held_for is not None
    assert {h.task_id: h.devices for h in snap.holders} == {"a": {"gpu": [0, 1]}, "b": {"gpu": [2]}}
    assert snap.hosts[0].devices == FOUR
    assert store.release("a", a.token)
    assert free(store) == [3, 0, 1]
    assert [d.device for d in store.snapshot().devices if d.free] == [0, 1, 3]
    # the device freed longest ago is handed out first: 3 (never used), then 0
    assert store.acquire("d", {"gpu": 2}, ttl=30).devices == {"gpu": [3, 0]}
    assert store.acquire("e", {"cpu": 1}, ttl=30).devices == {}  # cpu is counted, not bound


def test_never_more_devices_than_the_host_lists(redis_client: redis.Redis) -> None:
    """An explicit total above the device count: the count would grant, the devices do not."""
    store = host_pool(redis_client, {"gpu": [0, 1]})
    store.set_totals({"gpu": 4})
    assert store.acquire("a", {"gpu": 2}, ttl=30).ok
    res = store.acquire("b", {"gpu": 1}, ttl=30)
    assert (res.ok, res.status, res.blocked_type) == (False, "busy", "gpu")
    assert store.snapshot().usage("gpu").used == 2


def test_an_expired_lease_frees_its_devices_when_it_is_reaped(redis_client: redis.Redis) -> None:
    store = host_pool(redis_client)
    short = store.acquire("short", {"gpu": 4}, ttl=0.1)
    assert short.devices == FOUR
    wait_for(lambda: store.snapshot().holders[0].expired, 10, "the lease to expire")
    other = store.acquire("other", {"gpu": 3}, ttl=30)  # acquire reaps the expired lease first
    assert other.ok and sorted(other.devices["gpu"]) == [0, 1, 2]
    assert store.renew("short", short.token, 30, {"gpu": 4}, devices=FOUR).status == "lost"
    assert not store.release("short", short.token)  # nothing to give back twice
    assert free(store) == [3]
    store.acquire("gone", {"gpu": 1}, ttl=0.05)
    wait_for(lambda: store.reap() >= 0 and free(store) == [3], 10, "the reaper to free device 3")


def test_a_changed_device_list_keeps_held_devices_with_their_lease(redis_client: redis.Redis) -> None:
    store = host_pool(redis_client)
    a = store.acquire("a", {"gpu": 1}, ttl=30)
    b = store.acquire("b", {"gpu": 1}, ttl=30)
    assert (a.devices, b.devices) == ({"gpu": [0]}, {"gpu": [1]})
    # the worker restarts with CUDA_VISIBLE_DEVICES=1,2 (and MIG on a new card)
    assert store.contribute("h1", {"gpu": 3}, ttl=60, worker="celery@a",
                            devices={"gpu": [1, 2, "MIG-x"]}).status == "changed"
    assert free(store) == [2, "MIG-x"]  # 1 stays b's, 0 is still a's but no longer the host's
    assert [(d.device, d.task_id) for d in store.snapshot().devices] == [(1, "b"), (2, None), ("MIG-x", None),
                                                                        (0, "a")]
    store.release("a", a.token)
    assert free(store) == [2, "MIG-x"]  # 0 does not come back
    store.release("b", b.token)
    assert free(store) == [2, "MIG-x", 1]
    assert store.withdraw("h1", "celery@a")
    snap = store.snapshot()
    assert snap.devices == [] and snap.usage("gpu").total == 0
    assert not {"devs:gpu", "free:gpu"} & set(cast(list[str], redis_client.hkeys(store.keys[0])))


def test_a_lease_restored_after_redis_lost_its_data_gets_back_the_devices_still_free(
        own_redis: RedisServer) -> None:
    client = connect(own_redis.url)
    store = host_pool(client)
    for i in range(3):  # a's token is 4: above what the counter reaches after the restart below
        store.release(f"x{i}", store.acquire(f"x{i}", {"cpu": 1}, ttl=30).token)
    a = store.acquire("a", {"gpu": 2}, ttl=30)
    assert a.devices == {"gpu": [0, 1]} and a.token == 4
    own_redis.restart()  # no persistence: every key is gone
    host_pool(client)  # the heartbeat adds the host again: every device is free
    intruder = store.acquire("intruder", {"gpu": 1}, ttl=30)  # took device 0 before a's holder renewed
    assert intruder.devices == {"gpu": [0]}
    r = store.renew("a", a.token, 30, {"gpu": 2}, devices=a.devices)
    assert (r.status, r.devices) == ("restored", {"gpu": [1]})
    held = {h.task_id: h.devices for h in store.snapshot().holders}
    assert held == {"a": {"gpu": [1]}, "intruder": {"gpu": [0]}}
    assert free(store) == [2, 3]
    client.close()


def test_a_pool_of_the_earlier_layout_reads_and_binds_nothing(redis_client: redis.Redis) -> None:
    """A host pool written before devices existed (fixed totals, lease records without devices): read as before, gpu
    counted and not bound, until a worker of this version lists the host's devices."""
    store = SlotStore(redis_client, "host:old")
    store.set_totals({"cpu": 4, "gpu": 2})
    old = store.acquire("old", {"gpu": 1}, ttl=30)
    assert old.ok and old.devices == {}
    snap = read_all(redis_client).pool("host:old")
    assert snap is not None and snap.devices == [] and snap.usage("gpu").used == 1
    store.clear_totals(["gpu"])
    store.contribute("old", {"gpu": 2}, ttl=60, worker="celery@new", devices={"gpu": [0, 1]})
    assert free(store) == [0, 1]  # the unbound lease holds a count, not a device: the count still limits
    assert store.acquire("new", {"gpu": 1}, ttl=30).devices == {"gpu": [0]}
    assert not store.acquire("more", {"gpu": 1}, ttl=30).ok


def test_a_client_without_decode_responses_reads_devices_too(redis_url: str, redis_client: redis.Redis) -> None:
    host_pool(redis_client)
    raw = redis.Redis.from_url(redis_url)  # bytes replies
    store = SlotStore(raw, "host:h1")
    a = store.acquire("a", {"gpu": 2}, ttl=30)
    assert (a.status, a.devices) == ("ok", {"gpu": [0, 1]})
    held = store.acquire("a", {"gpu": 2}, ttl=30)
    assert (held.status, held.devices, held.token) == ("held", {"gpu": [0, 1]}, a.token)
    assert store.release("a", a.token) and free(SlotStore(redis_client, "host:h1")) == [2, 3, 0, 1]
    raw.close()


def test_devices_text_round_trip() -> None:
    assert parse_devices("gpu=2,3;npu=MIG-a") == {"gpu": [2, 3], "npu": ["MIG-a"]}
    assert parse_devices("") == {}


LISTS: list[list[int | str]] = [[0, 1, 2, 3], [0, 1], [2, 3, "MIG-x"], [0, 1, 2, 3, "MIG-x"]]
WORKERS = st.sampled_from(["celery@a", "celery@b"])
IDS = st.sampled_from([f"t{i}" for i in range(6)])
SHORT, LONG = 0.03, 60.0


def test_no_two_live_leases_ever_hold_one_device(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)

    class Devices(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            client.flushall()
            self.store = SlotStore(client, "host:h1")
            self.held: dict[str, tuple[int, dict[str, int], dict[str, list[int | str]], float]] = {}
            self.members: dict[str, float] = {}  # worker -> its contribution's ttl

        @rule(worker=WORKERS, which=st.integers(0, len(LISTS) - 1), short=st.booleans())
        def worker_contributes(self, worker: str, which: int, short: bool) -> None:
            devices = LISTS[which]
            ttl = SHORT if short else LONG
            self.store.contribute("h1", {"cpu": 4, "gpu": len(devices)}, ttl=ttl, worker=worker,
                                  devices={"gpu": devices})
            self.members[worker] = ttl

        @rule(worker=WORKERS)
        def worker_leaves(self, worker: str) -> None:
            self.store.withdraw("h1", worker)
            self.members.pop(worker, None)

        @rule(lease_id=IDS, gpu=st.integers(0, 3), cpu=st.integers(0, 2), short=st.booleans())
        def acquire(self, lease_id: str, gpu: int, cpu: int, short: bool) -> None:
            needs = {k: v for k, v in {"gpu": gpu, "cpu": cpu}.items() if v}
            if not needs:
                return
            ttl = SHORT if short else LONG
            res = self.store.acquire(lease_id, needs, ttl=ttl, starvation_after=3600)
            if res.ok and res.status == "ok":
                assert len(res.devices.get("gpu", [])) == needs.get("gpu", 0), res
                self.held[lease_id] = (res.token, needs, res.devices, ttl)
            elif res.ok:
                token, held_needs, devices, _ttl = self.held[lease_id]
                assert (res.token, res.devices) == (token, devices)
                self.held[lease_id] = (token, held_needs, devices, ttl)

        @rule(lease_id=IDS)
        def release(self, lease_id: str) -> None:
            if lease_id in self.held:
                self.store.release(lease_id, self.held.pop(lease_id)[0])

        @rule(lease_id=IDS)
        def renew(self, lease_id: str) -> None:
            if lease_id in self.held:
                token, needs, devices, ttl = self.held[lease_id]
                r = self.store.renew(lease_id, token, ttl, needs, devices=devices)
                assert r.status in ("renewed", "lost")
                if r.status == "lost":
                    del self.held[lease_id]

        @rule()
        def time_passes(self) -> None:
            time.sleep(SHORT + 0.01)

        @rule()
        def reap(self) -> None:
            self.store.reap()

        @invariant()
        def one_lease_per_device_and_none_lost(self) -> None:
            pool = cast(dict[str, str], client.hgetall(self.store.keys[0]))
            leases = {f[len("lease:"):] for f in pool if f.startswith("lease:")}
            # a lease record's fifth field: "0" or "1" (adopted), then the devices it holds: "0 gpu=2,3"
            bound = {lid: parse_devices(pool[f"lease:{lid}"].split("|")[4].partition(" ")[2]).get("gpu", [])
                     for lid in leases}
            bound = {lid: ds for lid, ds in bound.items() if ds}
            held = [str(d) for ds in bound.values() for d in ds]
            assert len(held) == len(set(held)), bound  # no device in two live leases
            for lid in leases:
                _token, needs, devices, _ttl = self.held[lid]  # every lease in Redis is one we hold
                assert bound.get(lid, []) == devices.get("gpu", []), (lid, bound, devices)
                assert len(bound.get(lid, [])) == needs.get("gpu", 0)
            assert int(pool.get("used:gpu", 0)) == sum(self.held[lid][1].get("gpu", 0) for lid in leases)
            if "devs:gpu" in pool:
                devs = [d for d in pool["devs:gpu"].split(",") if d]
                free_list = [d for d in pool["free:gpu"].split(",") if d]
                assert len(free_list) == len(set(free_list)) and set(free_list) <= set(devs)
                assert not set(free_list) & set(held)
                assert set(devs) <= set(free_list) | set(held), (devs, free_list, held)  # none lost
            else:
                assert "free:gpu" not in pool
            for lid, (_token, _needs, _devices, ttl) in self.held.items():
                if ttl == LONG:
                    assert lid in leases, f"a long lease {lid} vanished"

    Devices.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                         suppress_health_check=list(HealthCheck), derandomize=True)
    try:
        Devices.TestCase().runTest()
    finally:
        client.close()
