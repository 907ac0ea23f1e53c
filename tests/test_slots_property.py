"""Property-based stateful test of acquire / release / renew / expire / reap / re-register totals against real Redis:
after every step 0 <= used <= total and used == the sum of the leases held, and a model of who holds what agrees."""

from __future__ import annotations

import time

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from celeryops.slots import SlotStore
from celeryops.demo.standins.redis_server import RedisServer

TOTALS = {"cpu": 6, "gpu": 2}
IDS = st.sampled_from([f"t{i}" for i in range(6)])
NEEDS = st.fixed_dictionaries({"cpu": st.integers(0, 4), "gpu": st.integers(0, 2)})
SHORT, LONG = 0.03, 60.0


def test_slot_invariants_hold_after_every_step(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)

    class Slots(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            client.flushall()
            self.store = SlotStore(client)
            self.held: dict[str, tuple[int, dict[str, int], float]] = {}  # id -> token, needs, ttl
            self.last_token = 0

        @initialize()
        def totals(self) -> None:
            self.store.set_totals(TOTALS)

        @rule(lease_id=IDS, needs=NEEDS, short=st.booleans())
        def acquire(self, lease_id: str, needs: dict[str, int], short: bool) -> None:
            ttl = SHORT if short else LONG
            res = self.store.acquire(lease_id, needs, ttl=ttl, starvation_after=3600)
            if res.ok and res.status == "ok":
                assert res.token > self.last_token
                self.last_token = res.token
                self.held[lease_id] = (res.token, {k: v for k, v in needs.items() if v}, ttl)
            elif res.ok:  # already held: the same token, the lease renewed with this ttl
                assert lease_id in self.held and self.held[lease_id][0] == res.token
                self.held[lease_id] = (res.token, self.held[lease_id][1], ttl)

        # Rules draw the same data whatever Redis answers (expiry depends on time): ids come from the fixed set.
        @rule(lease_id=IDS, stale=st.booleans())
        def release(self, lease_id: str, stale: bool) -> None:
            if lease_id not in self.held:
                assert not self.store.release(lease_id, self.last_token + 1000)
                return
            token = self.held[lease_id][0]
            if stale:
                assert not self.store.release(lease_id, token + 1000)
            else:
                self.store.release(lease_id, token)
                del self.held[lease_id]

        @rule(lease_id=IDS)
        def renew(self, lease_id: str) -> None:
            if lease_id not in self.held:
                return
            token, needs, ttl = self.held[lease_id]
            r = self.store.renew(lease_id, token, ttl, needs)
            assert r.status in ("renewed", "lost")
            if r.status == "lost":
                del self.held[lease_id]

        @rule()
        def let_short_leases_expire(self) -> None:
            time.sleep(SHORT + 0.01)

        @rule()
        def reap(self) -> None:
            self.store.reap()

        @rule()
        def worker_restart(self) -> None:
            self.store.set_totals(TOTALS, reap_worker="celery@gone")

        @invariant()
        def counters_are_true(self) -> None:
            snap = self.store.snapshot()
            leases = {h.task_id: h for h in snap.holders}
            for t in snap.types:
                assert 0 <= t.used <= t.total, t
                assert t.used == sum(h.slots.get(t.type, 0) for h in snap.holders), (t, snap.holders)
            # every lease in Redis is one we hold (ours may have expired and been reaped, never the reverse)
            for lid, h in leases.items():
                assert lid in self.held and self.held[lid][0] == h.token
            for lid, (_token, _needs, ttl) in self.held.items():
                if ttl == LONG:
                    assert lid in leases, f"a long lease {lid} vanished"

        @invariant()
        def hot_path_shortcuts_are_safe(self) -> None:
            # acquire skips its reap until Redis TIME reaches next_expiry, and the waiting logic while the waiters
            # flag is absent: both are only sound if next_expiry <= every expiry and the flag is set with waiters
            pool, leases, _waitq, waitx = self.store.keys
            nxt = client.hget(pool, "next_expiry")
            scores = [score for _id, score in client.zrange(leases, 0, -1, withscores=True)]
            if nxt is not None and scores:
                assert float(nxt) <= min(scores), (nxt, scores)
            if client.zcard(waitx):
                assert client.hexists(pool, "waiters")

    Slots.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None,
                                       suppress_health_check=list(HealthCheck), derandomize=True)
    try:
        Slots.TestCase().runTest()
    finally:
        client.close()
