"""SlotStore against a real redis-server: leases, multi-type atomic acquire, fencing tokens, expiry by Redis TIME,
reaping, totals that never wipe live leases, the starvation guard, NOSCRIPT healing, hash tags, seed-schema reads,
and a global pool's totals as the sum of its hosts' contributions (join, renew, change, leave, expire)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import time

import pytest
import redis
from redis.crc import key_slot

from celeryops.slots import SlotStore, read_all
from celeryops_harness.workers import wait_for


@pytest.fixture
def store(redis_client: redis.Redis) -> SlotStore:
    s = SlotStore(redis_client)
    s.set_totals({"cpu": 4, "gpu": 1})
    return s


def used(store: SlotStore) -> dict[str, int]:
    return {t.type: t.used for t in store.snapshot().types}


def test_acquire_release_and_monotonic_tokens(store: SlotStore) -> None:
    a = store.acquire("a", {"cpu": 3}, ttl=30)
    b = store.acquire("b", {"cpu": 1}, ttl=30)
    assert a.ok and b.ok and b.token > a.token
    assert not store.acquire("c", {"cpu": 1}, ttl=30).ok
    assert used(store) == {"cpu": 4, "gpu": 0}
    assert store.release("a", a.token)
    assert not store.release("a", a.token)  # a second release is a no-op
    c = store.acquire("c", {"cpu": 2}, ttl=30)
    assert c.ok and c.token > b.token
    assert used(store)["cpu"] == 3


def test_reacquire_of_a_held_id_returns_its_token(store: SlotStore) -> None:
    a = store.acquire("a", {"cpu": 2}, ttl=30)
    again = store.acquire("a", {"cpu": 2}, ttl=30)
    assert again.ok and again.status == "held" and again.token == a.token
    assert used(store)["cpu"] == 2


def test_multi_type_acquire_is_all_or_nothing(store: SlotStore) -> None:
    assert store.acquire("g", {"gpu": 1}, ttl=30).ok
    res = store.acquire("both", {"cpu": 2, "gpu": 1}, ttl=30)
    assert not res.ok and res.blocked_type == "gpu"
    assert used(store) == {"cpu": 0, "gpu": 1}  # nothing of the cpu part was taken
    store.release("g")
    assert store.acquire("both", {"cpu": 2, "gpu": 1}, ttl=30).ok
    assert used(store) == {"cpu": 2, "gpu": 1}


def test_request_larger_than_total_is_impossible_listed_as_waiting_and_not_reserved(store: SlotStore) -> None:
    res = store.acquire("big", {"cpu": 5}, ttl=30, starvation_after=0)
    assert (res.ok, res.status, res.blocked_type) == (False, "impossible", "cpu")
    assert store.acquire("x", {"tpu": 1}, ttl=30).status == "impossible"  # an unknown type has total 0
    again = store.acquire("big", {"cpu": 5}, ttl=30, starvation_after=0)  # tried again: still one entry, same since
    assert again.status == "impossible"
    waiting = {w.task_id: w for w in store.snapshot(starvation_after=0).waiting}
    assert set(waiting) == {"big", "x"} and waiting["big"].slots == {"cpu": 5} and not waiting["big"].reserved
    # shown as waiting, but past the starvation guard it holds nothing back: the pool's 4 cpu stay usable
    assert store.acquire("small", {"cpu": 4}, ttl=30, starvation_after=0).ok
    store.release("big")  # a request that gives up (or was taken elsewhere) leaves the list
    assert {w.task_id for w in store.snapshot().waiting} == {"x"}


def test_release_never_drives_used_below_zero(store: SlotStore, redis_client: redis.Redis) -> None:
    a = store.acquire("a", {"cpu": 3}, ttl=30)
    redis_client.hset(store.keys[0], "used:cpu", 1)  # a counter damaged by hand (e.g. the seed's global reset)
    assert store.release("a", a.token)
    assert used(store)["cpu"] == 0


def test_release_with_a_stale_token_leaves_the_new_holder_alone(store: SlotStore) -> None:
    old = store.acquire("t", {"cpu": 2}, ttl=0.1)
    wait_for(lambda: store.snapshot().holders[0].expired, 10, "the lease to expire")
    new = store.acquire("t", {"cpu": 2}, ttl=30)  # reaps the expired lease, same id gets a new token
    assert new.ok and new.token > old.token
    assert store.renew("t", old.token, 30, {"cpu": 2}).status == "taken"
    assert not store.release("t", old.token)
    assert used(store)["cpu"] == 2
    assert store.renew("t", new.token, 30, {"cpu": 2}).status == "renewed"


def test_expired_leases_are_reaped_by_redis_time(store: SlotStore) -> None:
    a = store.acquire("a", {"cpu": 4}, ttl=30)
    assert not store.acquire("b", {"cpu": 1}, ttl=30).ok
    # Its last renewal is a short one (set only now: a loaded machine may take longer than it between two calls).
    assert store.renew("a", a.token, 0.2, {"cpu": 4}).status == "renewed"
    wait_for(lambda: store.acquire("b", {"cpu": 1}, ttl=30).ok, 10, "the expired lease to be reaped by acquire")
    assert store.renew("a", a.token, 30, {"cpu": 4}).status == "lost"
    assert [h.task_id for h in store.snapshot().holders] == ["b"]
    assert used(store)["cpu"] == 1


def test_a_shorter_lease_after_a_longer_one_is_still_reaped_by_acquire(store: SlotStore) -> None:
    """Acquire reaps only once Redis TIME reaches the pool's next expiry: a later, shorter lease must lower it,
    whether it comes from a new acquire, a re-acquire of a held id, or a renewal with a shorter TTL."""
    store.acquire("long", {"cpu": 1}, ttl=30)
    store.acquire("short", {"cpu": 3}, ttl=0.2)
    wait_for(lambda: store.acquire("b", {"cpu": 3}, ttl=30).ok, 10, "acquire to reap the short lease")
    assert store.acquire("long", {"cpu": 1}, ttl=0.2).status == "held"  # same lease, now with a 0.2 s TTL
    wait_for(lambda: store.acquire("c", {"cpu": 1}, ttl=30).ok, 10, "acquire to reap the re-acquired lease")
    store.release("b")
    r = store.acquire("d", {"cpu": 2}, ttl=30)
    assert store.renew("d", r.token, 0.2, {"cpu": 2}).status == "renewed"
    wait_for(lambda: store.acquire("e", {"cpu": 3}, ttl=30).ok, 10, "acquire to reap the renewed lease")
    assert {h.task_id for h in store.snapshot().holders} == {"c", "e"}


def test_reaping_more_leases_than_one_batch(store: SlotStore, redis_client: redis.Redis) -> None:
    """Scripts drop leases in batches (Lua's unpack has a stack limit): 1,200 expired leases and 700 leases of a
    restarting worker all come back in one call each."""
    store.set_totals({"cpu": 2000})
    for i in range(1200):
        assert store.acquire(f"old-{i}", {"cpu": 1}, ttl=30).ok
    for i in range(700):
        assert store.acquire(f"w-{i}", {"cpu": 1}, ttl=30, worker="celery@w").ok
    # let the 1,200 expire at once (rewriting their expiry: waiting out 1,200 real TTLs would race the acquires)
    redis_client.zadd(store.keys[1], {f"old-{i}": 1 for i in range(1200)})
    assert store.reap() == 1200
    assert store.set_totals({"cpu": 2000}, reap_worker="celery@w") == 700
    snap = store.snapshot()
    assert snap.holders == [] and snap.usage("cpu").used == 0


def test_reap_call_returns_expired_slots(store: SlotStore) -> None:
    store.acquire("a", {"cpu": 2, "gpu": 1}, ttl=0.1)
    wait_for(lambda: store.reap() == 1, 10, "reap to return the expired lease")
    assert used(store) == {"cpu": 0, "gpu": 0}
    assert store.snapshot().holders == []


def test_renew_keeps_a_lease_alive_past_its_ttl(store: SlotStore) -> None:
    a = store.acquire("a", {"cpu": 4}, ttl=0.5)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert store.renew("a", a.token, 0.5, {"cpu": 4}).status == "renewed"
        assert not store.acquire("b", {"cpu": 1}, ttl=30).ok
        time.sleep(0.1)


def test_worker_start_writes_totals_without_wiping_live_leases(store: SlotStore) -> None:
    store.acquire("a", {"cpu": 2}, ttl=30, worker="celery@w1")
    store.acquire("b", {"cpu": 1}, ttl=30, worker="celery@w2")
    assert store.set_totals({"cpu": 8, "gpu": 1}, reap_worker="celery@w3") == 0
    snap = store.snapshot()
    assert snap.usage("cpu").total == 8 and snap.usage("cpu").used == 3
    assert {h.task_id for h in snap.holders} == {"a", "b"}
    # a worker restarting under w1's node name: w1's old leases are dead, w2's stay
    assert store.set_totals({"cpu": 8}, reap_worker="celery@w1") == 1
    snap = store.snapshot()
    assert [h.task_id for h in snap.holders] == ["b"] and snap.usage("cpu").used == 1
    # only_missing never overwrites an existing total
    store.set_totals({"cpu": 2, "disk": 3}, only_missing=True)
    assert store.snapshot().usage("cpu").total == 8 and store.snapshot().usage("disk").total == 3


def test_starvation_guard_reserves_for_a_large_request(redis_client: redis.Redis) -> None:
    """On 8 slots, a stream of 1-slot requests keeps all 8 busy; an 8-slot request gets in once it has waited
    longer than starvation_after (and never without the guard)."""

    def run(starvation_after: float, pool: str, budget: float) -> bool:
        s = SlotStore(redis_client, pool)
        s.set_totals({"cpu": 8})
        holders = [f"first-{i}" for i in range(8)]
        assert all(s.acquire(h, {"cpu": 1}, ttl=30).ok for h in holders)
        n = 0
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            if s.acquire("big", {"cpu": 8}, ttl=30, starvation_after=starvation_after).ok:
                return True
            if holders:  # the stream: the oldest small one finishes, new ones arrive
                s.release(holders.pop(0))
            for _ in range(8 - len(holders)):
                n += 1
                if s.acquire(f"small-{n}", {"cpu": 1}, ttl=30, starvation_after=starvation_after).ok:
                    holders.append(f"small-{n}")
            time.sleep(0.01)
        return False

    assert not run(starvation_after=3600, pool="no-guard", budget=1.0)
    assert run(starvation_after=0.3, pool="guard", budget=30.0)


def test_reservations_expire_when_the_waiter_goes_away(store: SlotStore) -> None:
    store.acquire("a", {"cpu": 4}, ttl=30)
    store.acquire("big", {"cpu": 4}, ttl=30, starvation_after=0, wait_ttl=3)
    store.release("a")
    # the reservation of "big" holds the 4 cpu back from others...
    assert not store.acquire("small", {"cpu": 1}, ttl=30, starvation_after=0).ok
    # ...until it expires because big never came back
    wait_for(lambda: store.acquire("small2", {"cpu": 1}, ttl=30, starvation_after=3600).ok, 10,
             "the abandoned reservation to expire")


def _use_after_fork(store: SlotStore, out: multiprocessing.queues.Queue) -> None:  # type: ignore[type-arg]
    res = store.acquire("child", {"cpu": 1}, ttl=30)
    out.put((res.ok and store.release("child", res.token), store._hot_client().client_id()))


def test_a_store_used_in_a_forked_child_gets_its_own_connection(store: SlotStore) -> None:
    """The hot path holds one connection per process: a child must not talk on the parent's socket."""
    a = store.acquire("a", {"cpu": 1}, ttl=30)
    parent_conn = store._hot_client().client_id()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_use_after_fork, args=(store, out))
    child.start()
    ok, child_conn = out.get(timeout=30)
    child.join(30)
    assert ok and child.exitcode == 0
    assert child_conn != parent_conn
    assert store._hot_client().client_id() == parent_conn  # the parent keeps its own
    assert store.release("a", a.token)
    b = store.acquire("b", {"cpu": 4}, ttl=30)
    assert b.ok and b.token > a.token + 1
    assert used(store) == {"cpu": 4, "gpu": 0}


def test_scripts_reload_after_script_flush(store: SlotStore, redis_client: redis.Redis) -> None:
    assert store.acquire("a", {"cpu": 1}, ttl=30).ok
    redis_client.script_flush()
    assert store.acquire("b", {"cpu": 1}, ttl=30).ok
    assert store.release("a") and store.reap() == 0


def test_all_keys_of_a_pool_share_one_cluster_slot(store: SlotStore, redis_client: redis.Redis) -> None:
    store.acquire("a", {"cpu": 4}, ttl=30)
    store.acquire("b", {"cpu": 1}, ttl=30)  # refused: writes a waiting entry
    store.contribute("h1", {"disk": 2}, ttl=30, worker="celery@h1")  # writes the hosts and hostinfo keys
    keys = set(redis_client.keys("*"))
    assert keys == {*store.keys, store.registry_key}
    assert len({key_slot(k.encode()) for k in store.keys}) == 1
    untagged = SlotStore(redis_client, "p", hash_tag=False)
    assert all("{" not in k for k in untagged.keys)


def test_adopt_registers_an_ungated_run_even_beyond_the_total(store: SlotStore) -> None:
    store.acquire("a", {"cpu": 4}, ttl=30)
    token = store.adopt("ungated", {"cpu": 2}, ttl=30, name="t", worker="celery@w")
    assert token > 0 and store.adopt("ungated", {"cpu": 2}, ttl=30) == token
    snap = store.snapshot()
    assert snap.usage("cpu").used == 6 and snap.usage("cpu").free == 0
    assert any(h.adopted for h in snap.holders)
    assert not store.acquire("c", {"cpu": 1}, ttl=30).ok


def test_renew_restores_a_lease_after_redis_lost_its_data(store: SlotStore, redis_client: redis.Redis) -> None:
    store.acquire("x", {"cpu": 1}, ttl=30)
    a = store.acquire("a", {"cpu": 2}, ttl=30, name="job", worker="celery@w")
    redis_client.flushall()
    r = store.renew("a", a.token, 30, {"cpu": 2}, name="job", worker="celery@w")
    assert r.status == "restored" and r.token == a.token
    assert store.snapshot().usage("cpu").used == 2
    assert store.acquire("b", {"gpu": 0, "cpu": 0}, ttl=30).token > a.token  # the counter never goes back


def test_snapshot_holders_and_waiting(store: SlotStore) -> None:
    a = store.acquire("a", {"cpu": 3, "gpu": 1}, ttl=30, name="infer", worker="celery@w1", host="h1")
    store.acquire("b", {"cpu": 2}, ttl=30, name="small", worker="celery@w2")
    snap = store.snapshot(starvation_after=0)
    (h,) = snap.holders
    assert (h.task_id, h.task_name, h.worker, h.host, h.slots, h.token) == (
        "a", "infer", "celery@w1", "h1", {"cpu": 3, "gpu": 1}, a.token)
    assert h.age is not None and h.age >= 0 and h.lease_remaining is not None and 0 < h.lease_remaining <= 30
    assert not h.expired
    (w,) = snap.waiting
    assert (w.task_id, w.task_name, w.slots, w.reserved) == ("b", "small", {"cpu": 2}, True)
    assert snap.usage("cpu").free == 1 and snap.usage("gpu").free == 0


def test_read_all_lists_pools_and_reads_the_seed_schema(redis_client: redis.Redis) -> None:
    SlotStore(redis_client).set_totals({"cpu": 4})
    SlotStore(redis_client, "host:h1").set_totals({"gpu": 2})
    # a pool written by the seed's code
    redis_client.set("resource:cpu:total", 48)
    redis_client.set("resource:cpu:used", 8)
    redis_client.set("resource:gpu:total", 2)
    redis_client.hset("resource:task:t1", mapping={"type": "cpu", "slots": 4, "plugin_name": "align",
                                                   "started_at": time.time() - 60})
    redis_client.hset("resource:task:t2", mapping={"type": "cpu", "slots": 4, "plugin_name": "call",
                                                   "started_at": "not-a-time"})
    snap = read_all(redis_client)
    assert [p.pool for p in snap.pools] == ["global", "host:h1", "legacy"]
    host = snap.pool("host:h1")
    assert host is not None and host.scope == "host" and host.host == "h1"
    legacy = snap.pool("legacy")
    assert legacy is not None
    assert [(t.type, t.total, t.used, t.free) for t in legacy.types] == [("cpu", 48, 8, 40), ("gpu", 2, 0, 2)]
    t1, t2 = legacy.holders
    assert (t1.task_id, t1.task_name, t1.slots, t1.lease_remaining) == ("t1", "align", {"cpu": 4}, None)
    assert t1.age is not None and 50 < t1.age < 3600
    assert t2.age is None
    d = snap.to_dict()
    assert d["pools"][2]["types"][0] == {"type": "cpu", "total": 48, "used": 8, "free": 40, "fixed": True}


# -- a global pool's totals: the sum of the live hosts' contributions --------------------------------------------------
def test_global_totals_are_the_sum_of_the_hosts_contributions(redis_client: redis.Redis) -> None:
    """Each host adds its totals; the last host to start no longer decides the pool size. Workers sharing a host name
    count once (the larger of their numbers); new numbers and withdrawals change the sum at once."""
    store = SlotStore(redis_client)
    assert store.contribute("big", {"cpu": 32, "gpu": 2}, ttl=30, worker="celery@big", starting=True).status == "new"
    assert store.contribute("small", {"cpu": 4}, ttl=30, worker="celery@small", starting=True).status == "new"
    snap = store.snapshot()
    assert [(t.type, t.total, t.fixed) for t in snap.types] == [("cpu", 36, False), ("gpu", 2, False)]
    assert read_all(redis_client).pool("global") is not None  # registered for readers
    # a second worker on host "small" with more cpu: the host counts once, with 6
    store.contribute("small", {"cpu": 6}, ttl=30, worker="celery@small-2")
    assert store.snapshot().usage("cpu").total == 38
    assert store.contribute("big", {"cpu": 32, "gpu": 2}, ttl=30, worker="celery@big").status == "renewed"
    assert store.contribute("big", {"cpu": 16}, ttl=30, worker="celery@big").status == "changed"
    assert [(t.type, t.total) for t in store.snapshot().types] == [("cpu", 22), ("gpu", 0)]  # gpu went with it
    assert store.acquire("a", {"cpu": 22}, ttl=30).ok  # the acquire sees the sum
    store.release("a")
    assert store.withdraw("small", "celery@small-2") and not store.withdraw("small", "celery@small-2")
    assert store.snapshot().usage("cpu").total == 20
    assert store.withdraw("big", "celery@big") and store.withdraw("small", "celery@small")
    assert store.snapshot().usage("cpu").total == 0
    assert store.acquire("b", {"cpu": 1}, ttl=30).status == "impossible"


def test_a_contribution_that_is_not_renewed_expires_by_redis_time(redis_client: redis.Redis) -> None:
    """A killed worker stops renewing: its contribution expires (Redis TIME) and the next acquire, which reaps before
    it checks, sees the smaller total; renewing brings it back. The stored total follows, not only the snapshot."""
    store = SlotStore(redis_client)
    store.contribute("a", {"cpu": 4}, ttl=30, worker="celery@a")
    store.contribute("b", {"cpu": 8}, ttl=30, worker="celery@b")
    assert store.acquire("x", {"cpu": 12}, ttl=30).ok
    store.release("x")
    assert store.contribute("b", {"cpu": 8}, ttl=0.3, worker="celery@b").status == "renewed"  # its last beat

    def refused() -> bool:  # a probe that does not stay: granted probes are released at once
        res = store.acquire("probe", {"cpu": 5}, ttl=30)
        if res.ok:
            store.release("probe", res.token)
        return res.status == "impossible"

    wait_for(refused, 10, "b's contribution to expire and acquire to see a total of 4")
    assert redis_client.hget(store.keys[0], "total:cpu") == "4"
    assert not redis_client.hexists(store.keys[5], "host:b|celery@b")
    assert [hc.host for hc in store.snapshot().hosts] == ["a"]
    assert store.contribute("b", {"cpu": 8}, ttl=30, worker="celery@b").status == "new"  # it is back: grows
    assert store.acquire("y", {"cpu": 12}, ttl=30).ok


def test_snapshot_counts_expired_contributions_out_before_anyone_reaps(redis_client: redis.Redis) -> None:
    store = SlotStore(redis_client)
    store.contribute("a", {"cpu": 4}, ttl=30, worker="celery@a")
    store.contribute("b", {"cpu": 8}, ttl=0.2, worker="celery@b")
    wait_for(lambda: store.snapshot().usage("cpu").total == 4, 10, "the snapshot to count b out")
    b = next(hc for hc in store.snapshot().hosts if hc.host == "b")
    assert b.expired and b.expires_in == 0 and b.totals == {"cpu": 8}
    assert redis_client.hget(store.keys[0], "total:cpu") == "12"  # nothing reaped yet: no script ran
    store.reap()
    assert redis_client.hget(store.keys[0], "total:cpu") == "4"


def test_more_contributions_than_one_batch_are_counted_and_reaped(redis_client: redis.Redis) -> None:
    """Counting the totals again and reaping go over the hosts' contributions in batches of 500 (Lua's unpack has a
    stack limit): 600 hosts add up, and the 550 whose contributions expire at once all go in one reap."""
    store = SlotStore(redis_client)
    for i in range(600):
        store.contribute(f"h{i}", {"cpu": 1}, ttl=30, worker=f"celery@h{i}")
    assert store.snapshot().usage("cpu").total == 600
    # let 550 expire at once (rewriting their expiry, as a killed worker's would pass)
    members = redis_client.zrange(store.keys[4], 0, -1)
    redis_client.zadd(store.keys[4], {m: 1 for m in members if int(m.split("|")[0][1:]) >= 50})
    store.reap()
    assert redis_client.hget(store.keys[0], "total:cpu") == "50"
    assert redis_client.zcard(store.keys[4]) == 50
    assert sum(1 for f in redis_client.hkeys(store.keys[5]) if f.startswith("host:")) == 50


def test_leases_above_a_shrunk_total_are_never_revoked(redis_client: redis.Redis) -> None:
    """A host leaves while the pool is busy beyond what is left: running leases keep their slots (renewals still
    succeed), used stays above total, new acquires wait until enough leases end."""
    store = SlotStore(redis_client)
    store.contribute("a", {"cpu": 4}, ttl=30, worker="celery@a")
    store.contribute("b", {"cpu": 4}, ttl=30, worker="celery@b")
    held = {lid: store.acquire(lid, {"cpu": 2}, ttl=30, worker="celery@a").token for lid in ("l1", "l2", "l3")}
    assert store.withdraw("b", "celery@b")
    snap = store.snapshot()
    cpu = snap.usage("cpu")
    assert (cpu.total, cpu.used, cpu.free) == (4, 6, 0)
    assert {h.task_id for h in snap.holders} == {"l1", "l2", "l3"}
    assert all(store.renew(lid, tok, 30, {"cpu": 2}).status == "renewed" for lid, tok in held.items())
    assert store.acquire("new", {"cpu": 1}, ttl=30, starvation_after=3600).status == "busy"
    store.release("l1", held["l1"])
    assert store.acquire("new", {"cpu": 1}, ttl=30, starvation_after=3600).status == "busy"  # 4 used of 4
    store.release("l2", held["l2"])
    assert store.acquire("new", {"cpu": 2}, ttl=30, starvation_after=3600).ok
    assert store.snapshot().usage("cpu").used == 4


def test_explicit_totals_win_over_the_hosts_sum_until_cleared(redis_client: redis.Redis) -> None:
    store = SlotStore(redis_client)
    store.contribute("a", {"cpu": 4, "gpu": 1}, ttl=30, worker="celery@a")
    store.set_totals({"cpu": 10, "licence": 3})
    snap = store.snapshot()
    assert [(t.type, t.total, t.fixed) for t in snap.types] == [
        ("cpu", 10, True), ("gpu", 1, False), ("licence", 3, True)]
    store.contribute("b", {"cpu": 8}, ttl=30, worker="celery@b")
    assert store.snapshot().usage("cpu").total == 10  # still the explicit one
    store.clear_totals(["cpu", "licence"])
    assert [(t.type, t.total, t.fixed) for t in store.snapshot().types] == [
        ("cpu", 12, False), ("gpu", 1, False), ("licence", 0, False)]
    assert not store.acquire("x", {"licence": 1}, ttl=30).ok


def test_a_starting_worker_reaps_its_dead_leases_and_keeps_others(redis_client: redis.Redis) -> None:
    store = SlotStore(redis_client)
    store.contribute("a", {"cpu": 8}, ttl=30, worker="celery@a", starting=True)
    store.acquire("mine", {"cpu": 2}, ttl=30, worker="celery@a")
    store.acquire("theirs", {"cpu": 2}, ttl=30, worker="celery@b")
    store.acquire("anon", {"cpu": 1}, ttl=30)  # no worker name: never taken for a restarting worker's
    assert store.contribute("a", {"cpu": 8}, ttl=30, worker="celery@a").reaped == 0  # a heartbeat reaps nothing
    r = store.contribute("a", {"cpu": 8}, ttl=30, worker="celery@a", starting=True)
    assert (r.status, r.reaped) == ("renewed", 1)
    assert {h.task_id for h in store.snapshot().holders} == {"theirs", "anon"}
    assert store.contribute("b", {"cpu": 1}, ttl=30, worker="", starting=True).reaped == 0


def test_contributions_come_back_after_redis_lost_its_data(redis_client: redis.Redis) -> None:
    store = SlotStore(redis_client)
    store.contribute("a", {"cpu": 4}, ttl=30, worker="celery@a")
    redis_client.flushall()
    assert store.contribute("a", {"cpu": 4}, ttl=30, worker="celery@a").status == "new"
    assert store.snapshot().usage("cpu").total == 4
    assert [p.pool for p in read_all(redis_client).pools] == ["global"]


def test_snapshot_lists_each_hosts_contribution(redis_client: redis.Redis) -> None:
    store = SlotStore(redis_client)
    store.contribute("gpu-01", {"cpu": 32, "gpu": 2}, ttl=30, worker="celery@g1")
    store.contribute("gpu-01", {"cpu": 16, "gpu": 4}, ttl=20, worker="celery@g2")
    store.contribute("cpu|01", {"cpu": 4}, ttl=30, worker="celery@c1")  # '|' is stored as '/'
    hosts = {hc.host: hc for hc in store.snapshot().hosts}
    assert set(hosts) == {"gpu-01", "cpu/01"}
    g = hosts["gpu-01"]
    assert (g.totals, g.workers, g.expired) == ({"cpu": 32, "gpu": 4}, ["celery@g1", "celery@g2"], False)
    assert 0 <= g.age < 30 and 20 < g.expires_in <= 30
    assert store.snapshot().usage("cpu").total == 36 and store.snapshot().usage("gpu").total == 4
    d = read_all(redis_client).to_dict()
    (p,) = d["pools"]
    assert [h["host"] for h in p["hosts"]] == ["cpu/01", "gpu-01"]
    assert p["hosts"][1]["totals"] == {"cpu": 32, "gpu": 4} and p["hosts"][1]["workers"] == ["celery@g1", "celery@g2"]
    assert {t["type"]: (t["total"], t["fixed"]) for t in p["types"]} == {"cpu": (36, False), "gpu": (4, False)}


def test_a_heartbeat_counts_again_when_the_pool_hash_lost_its_totals(redis_client: redis.Redis) -> None:
    """Eviction or a hand-made DEL can drop the pool hash and leave the hosts' keys: the next renewal notices the
    missing total and counts the contributions again."""
    store = SlotStore(redis_client)
    store.contribute("a", {"cpu": 4}, ttl=30, worker="celery@a")
    store.contribute("b", {"cpu": 8}, ttl=30, worker="celery@b")
    redis_client.delete(store.keys[0])
    assert store.acquire("x", {"cpu": 1}, ttl=30).status == "impossible"
    assert store.contribute("a", {"cpu": 4}, ttl=30, worker="celery@a").status == "renewed"
    assert store.acquire("x", {"cpu": 12}, ttl=30).ok
