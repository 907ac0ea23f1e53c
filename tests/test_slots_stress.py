"""16 processes x 500 random acquire/release against one pool, with random SIGKILLs of holders: the counters stay
true, and every slot of a killed holder comes back within one TTL (decided by Redis TIME) with no operator."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time

import redis

from celeryops.slots import SlotStore
from celeryops_harness.workers import wait_for

PROCS, OPS, TTL, SEED = 16, 500, 2.0, 20261202
TOTALS = {"cpu": 12, "gpu": 3}


def _client(url: str, i: int, seed: int) -> None:
    rng = random.Random(seed * 100 + i)
    r = redis.Redis.from_url(url, decode_responses=True)
    store = SlotStore(r)
    held: dict[str, int] = {}
    for n in range(OPS):
        if held and (rng.random() < 0.45 or len(held) >= 3):
            lease_id = rng.choice(sorted(held))
            store.release(lease_id, held.pop(lease_id))
        else:
            needs = {"cpu": rng.randint(1, 4), "gpu": rng.choice([0, 0, 1])}
            res = store.acquire(f"p{i}-{n}", needs, ttl=TTL, worker=f"proc{i}", starvation_after=3600)
            if res.ok:
                held[f"p{i}-{n}"] = res.token
        if n % 25 == 0:
            r.set(f"stress:progress:{i}", n)
    if r.sismember("stress:victims", str(i)):
        # A victim never finishes on its own: the test kills it (however fast it ran), holding its leases.
        while True:
            time.sleep(0.05)
    for lease_id, token in held.items():
        store.release(lease_id, token)
    r.set(f"stress:progress:{i}", OPS)
    os._exit(0)


def test_many_processes_with_kills_keep_counters_true(redis_url: str, redis_client: redis.Redis) -> None:
    store = SlotStore(redis_client)
    store.set_totals(TOTALS)
    rng = random.Random(SEED)
    victims = rng.sample(range(PROCS), 4)
    redis_client.sadd("stress:victims", *[str(v) for v in victims])
    # spawn, not fork: a fork of this test process (threads of earlier tests live in it) can copy a held lock and
    # hang the child for good
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_client, args=(redis_url, i, SEED), daemon=True) for i in range(PROCS)]
    for p in procs:
        p.start()
    try:
        for v in victims:
            at = rng.randrange(50, OPS - 100)
            wait_for(lambda v=v, at=at: int(redis_client.get(f"stress:progress:{v}") or 0) >= at
                     or not procs[v].is_alive(), 120, f"process {v} to reach op {at}")
            assert procs[v].is_alive(), f"process {v} ended (exit code {procs[v].exitcode}) before op {at}"
            os.kill(procs[v].pid, signal.SIGKILL)
            procs[v].join(30)
        sec, usec = redis_client.time()
        last_kill_ms = int(sec) * 1000 + int(usec) // 1000
        for p in procs:
            p.join(120)
            assert not p.is_alive()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    survivors = [i for i in range(PROCS) if i not in victims]
    assert all(procs[i].exitcode == 0 for i in survivors)
    assert all(procs[v].exitcode == -signal.SIGKILL for v in victims)

    snap = store.snapshot()
    for t in snap.types:
        assert 0 <= t.used <= t.total
        assert t.used == sum(h.slots.get(t.type, 0) for h in snap.holders)
    # what is left is held by killed processes only, and every lease ends within one TTL of the last kill
    assert {h.worker for h in snap.holders} <= {f"proc{v}" for v in victims}
    expiries = dict(redis_client.zrange(store.keys[1], 0, -1, withscores=True))
    assert all(exp <= last_kill_ms + TTL * 1000 for exp in expiries.values())
    wait_for(lambda: store.reap() >= 0 and store.snapshot().holders == [], 3 * TTL + 30,
             "the killed holders' leases to expire")
    assert all(t.used == 0 for t in store.snapshot().types)
