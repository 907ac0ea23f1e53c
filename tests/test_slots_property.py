"""Property-based stateful test of acquire / release / renew / expire / reap / re-register totals / hosts joining,
renewing, leaving and expiring against real Redis: after every step 0 <= used == the sum of the leases held, a granted
acquire never takes used above total, the cpu total is the explicit one or the sum over the live hosts (each host
counted once, with its largest contribution), no live lease is ever revoked when hosts go, and a model of who holds
what agrees."""

from __future__ import annotations

import time
from typing import cast

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from celeryops.demo.standins.redis_server import RedisServer
from celeryops.slots import SlotStore

TOTALS = {"cpu": 6, "gpu": 2}
# (host, worker): two workers share h1, so h1 counts once with the larger of their numbers
MEMBERS = st.sampled_from([("h1", "celery@a"), ("h1", "celery@b"), ("h2", "celery@c"), ("h3", "celery@d")])
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
            self.hosts: dict[tuple[str, str], tuple[int, float]] = {}  # (host, worker) -> cpu, ttl
            self.fixed_cpu: int | None = TOTALS["cpu"]

        @initialize(cpu_from_hosts=st.booleans())
        def totals(self, cpu_from_hosts: bool) -> None:
            self.store.set_totals({"gpu": TOTALS["gpu"]} if cpu_from_hosts else TOTALS)
            if cpu_from_hosts:
                self.fixed_cpu = None

        @rule(lease_id=IDS, needs=NEEDS, short=st.booleans())
        def acquire(self, lease_id: str, needs: dict[str, int], short: bool) -> None:
            ttl = SHORT if short else LONG
            res = self.store.acquire(lease_id, needs, ttl=ttl, starvation_after=3600)
            if res.ok and res.status == "ok":
                # granted against the total it saw (after reaping expired hosts): never above it
                pool = self.store.keys[0]
                for typ, n in needs.items():
                    if n:
                        assert int(client.hget(pool, f"used:{typ}") or 0) <= int(client.hget(pool, f"total:{typ}") or 0)
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
            self.store.set_totals({"gpu": TOTALS["gpu"]}, reap_worker="celery@gone")

        @rule(member=MEMBERS, cpu=st.integers(0, 6), short=st.booleans(), starting=st.booleans())
        def host_joins(self, member: tuple[str, str], cpu: int, short: bool, starting: bool) -> None:
            host, worker = member
            r = self.store.contribute(host, {"cpu": cpu}, ttl=SHORT if short else LONG, worker=worker,
                                      starting=starting)
            if member in self.hosts and self.hosts[member][1] == LONG:
                assert r.status == ("renewed" if self.hosts[member][0] == cpu else "changed")
            # no lease is recorded under these worker names: only expired (short) leases can have been reaped
            assert r.reaped <= sum(1 for _tok, _needs, ttl in self.held.values() if ttl == SHORT)
            self.hosts[member] = (cpu, SHORT if short else LONG)

        @rule(member=MEMBERS)
        def host_renews(self, member: tuple[str, str]) -> None:
            if member not in self.hosts:
                return
            cpu, ttl = self.hosts[member]
            r = self.store.contribute(member[0], {"cpu": cpu}, ttl=ttl, worker=member[1])
            assert r.status in (("renewed",) if ttl == LONG else ("renewed", "new"))

        @rule(member=MEMBERS)
        def host_leaves(self, member: tuple[str, str]) -> None:
            had = self.store.withdraw(*member)
            if member in self.hosts and self.hosts[member][1] == LONG:
                assert had
            elif member not in self.hosts:
                assert not had
            self.hosts.pop(member, None)

        @rule(cpu=st.one_of(st.none(), st.integers(0, 8)))
        def operator_sets_cpu(self, cpu: int | None) -> None:
            if cpu is None:
                self.store.clear_totals(["cpu"])
            else:
                self.store.set_totals({"cpu": cpu})
            self.fixed_cpu = cpu

        def cpu_bounds(self) -> tuple[int, int]:
            """The cpu total counting only hosts that cannot have expired, and counting every host we added."""
            if self.fixed_cpu is not None:
                return self.fixed_cpu, self.fixed_cpu
            low: dict[str, int] = {}
            high: dict[str, int] = {}
            for (host, _worker), (cpu, ttl) in self.hosts.items():
                high[host] = max(high.get(host, 0), cpu)
                if ttl == LONG:
                    low[host] = max(low.get(host, 0), cpu)
            return sum(low.values()), sum(high.values())

        @invariant()
        def counters_are_true(self) -> None:
            snap = self.store.snapshot()
            leases = {h.task_id: h for h in snap.holders}
            for t in snap.types:
                # used may exceed total after hosts left (leases are never revoked), but never goes below 0
                assert t.used >= 0, t
                assert t.used == sum(h.slots.get(t.type, 0) for h in snap.holders), (t, snap.holders)
            low, high = self.cpu_bounds()
            stored = int(client.hget(self.store.keys[0], "total:cpu") or 0)
            assert low <= snap.usage("cpu").total <= high, (low, snap.usage("cpu"), high, self.hosts)
            assert low <= stored <= high, (low, stored, high, self.hosts)
            assert snap.usage("cpu").fixed == (self.fixed_cpu is not None)
            assert snap.usage("gpu").total == TOTALS["gpu"]
            live = {hc.host for hc in snap.hosts if not hc.expired}
            assert {h for (h, _w), (_cpu, ttl) in self.hosts.items() if ttl == LONG} <= live
            assert live <= {h for (h, _w) in self.hosts}
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
            pool, leases, _waitq, waitx, hosts, hostinfo = self.store.keys
            nxt = client.hget(pool, "next_expiry")

            def scores_of(key: str) -> list[float]:
                return [float(score) for _m, score in cast(list[tuple[str, float]],
                                                           client.zrange(key, 0, -1, withscores=True))]

            scores = scores_of(leases) + scores_of(hosts)
            # a contribution's expiry entry and its record come and go together
            members = set(cast(list[str], client.zrange(hosts, 0, -1)))
            fields = cast(list[str], client.hkeys(hostinfo))
            assert members == {f[len("host:"):] for f in fields if f.startswith("host:")}
            if nxt is not None and scores:
                assert float(nxt) <= min(scores), (nxt, scores)
            if client.zcard(waitx):
                assert client.hexists(pool, "waiters")
            # the pool hash (a listpack the hot path scans) holds nothing of the hosts
            assert not any(f.startswith(("host:", "fixed:", "ctypes")) for f in cast(list[str], client.hkeys(pool)))

    Slots.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                       suppress_health_check=list(HealthCheck), derandomize=True)
    try:
        Slots.TestCase().runTest()
    finally:
        client.close()
