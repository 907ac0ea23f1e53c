"""The work-conserving handoff at the store level, against a real redis-server: a release (or the reaping of an
expired lease) grants the freed slots to the oldest parked request that fits, in the same script, and puts its
message on the wake list; the copies of a parked task (the woken one and the fallback retry) carry its ticket, and
exactly one of them runs: the first to claim; a lost wake-up leaves the slots idle for the claim window only and the
fallback still runs the task; the starvation guard and device binding hold. A hypothesis state machine delivers
copies in any order, loses wake-ups, restarts Redis (data lost) and lets grants expire: no task ever runs twice,
and driven to the end every task runs exactly once."""

from __future__ import annotations

import itertools
import time

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from celeryops.demo.standins.redis_server import RedisServer
from celeryops.slots.store import AcquireResult, Park, SlotStore
from celeryops_harness.workers import wait_for

GPU = {"gpu": 1}
_tickets = itertools.count(1)


def gpu_host(client: redis.Redis, gpus: int = 1, pool: str = "host:h1") -> SlotStore:
    store = SlotStore(client, pool)
    store.contribute(pool[5:], {"gpu": gpus, "cpu": 8}, ttl=600, worker="celery@a", devices={"gpu": list(range(gpus))})
    return store


def wait(store: SlotStore, tid: str, needs: dict[str, int] = GPU, ticket: str = "", window: float = 30,
         starve: float = 3600) -> tuple[AcquireResult, str]:
    """What a refused task does: the parking acquire (under a new ticket); the result and the new ticket."""
    new = f"T{next(_tickets)}"
    res = store.acquire(tid, needs, ttl=30, ticket=ticket, starvation_after=starve,
                        park=Park(new, f"{tid} {new}", window))
    return res, new


def woken(store: SlotStore) -> list[str]:
    return list(store.client.lrange(store.wake_key, 0, -1))  # type: ignore[arg-type]


def test_a_release_hands_the_slot_to_the_oldest_parked_request_that_fits(redis_client: redis.Redis) -> None:
    store = gpu_host(redis_client, gpus=2)
    a = store.acquire("a", {"gpu": 2}, ttl=30)
    assert a.ok
    _, tb = wait(store, "b", {"gpu": 2})  # oldest, but needs both devices
    _, tc = wait(store, "c")
    _, td = wait(store, "d")
    assert woken(store) == []
    assert store.release("a", a.token)
    # b needs 2 and gets them: first in, first out among requests that fit
    assert woken(store) == [f"b {tb}"]
    snap = store.snapshot()
    assert [(h.task_id, h.devices) for h in snap.holders] == [("b", {"gpu": [0, 1]})]
    assert {w.task_id for w in snap.waiting} == {"c", "d"}
    claimed = store.acquire("b", {"gpu": 2}, ttl=30, ticket=tb)
    assert (claimed.ok, claimed.status, claimed.devices) == (True, "claimed", {"gpu": [0, 1]})
    assert store.release("b", claimed.token)
    assert woken(store) == [f"b {tb}", f"c {tc}", f"d {td}"]  # both fit now: each gets a device
    c = store.acquire("c", GPU, ttl=30, ticket=tc)
    d = store.acquire("d", GPU, ttl=30, ticket=td)
    assert sorted([*c.devices["gpu"], *d.devices["gpu"]]) == [0, 1]
    assert store.snapshot().usage("gpu").used == 2


def test_exactly_one_copy_of_a_ticket_runs(redis_client: redis.Redis) -> None:
    store = gpu_host(redis_client)
    a = store.acquire("a", GPU, ttl=30)
    res, t1 = wait(store, "b")
    assert (res.ok, res.status) == (False, "busy")
    store.release("a", a.token)
    first = store.acquire("b", GPU, ttl=30, ticket=t1)  # the woken copy, or the fallback: whichever comes first
    assert first.status == "claimed"
    again = store.acquire("b", GPU, ttl=30, ticket=t1)
    assert (again.ok, again.status, again.blocked_type) == (False, "duplicate", "running")
    assert store.acquire("b", GPU, ttl=30, ticket="T-old").blocked_type == "stale"
    store.release("b", first.token)
    late = store.acquire("b", GPU, ttl=30, ticket=t1)
    assert (late.ok, late.blocked_type) == (False, "done")
    assert store.snapshot().usage("gpu").used == 0
    # a retry the task body asks for is a new run (no ticket): it runs
    assert store.acquire("b", GPU, ttl=30).ok


def test_a_lost_wake_up_holds_the_slot_for_the_claim_window_only(redis_client: redis.Redis) -> None:
    store = gpu_host(redis_client)
    a = store.acquire("a", GPU, ttl=30)
    _, tb = wait(store, "b", window=0.3)
    _, tc = wait(store, "c", window=0.3)
    store.release("a", a.token)
    assert redis_client.lpop(store.wake_key) == f"b {tb}"  # popped by a waker that died: never sent
    # nobody claims it: the grant expires and the waker's tick hands the slot to the next parked request
    wait_for(lambda: store.tick().reaped == 1 or woken(store) == [f"c {tc}"], 30, "the unclaimed grant to expire")
    assert woken(store) == [f"c {tc}"]
    assert [h.task_id for h in store.snapshot().holders] == ["c"]
    # b's fallback retry comes: its grant is gone, so it waits again (parked under a new ticket), and runs next
    res, tb2 = wait(store, "b", ticket=tb)
    assert (res.ok, res.status) == (False, "busy")
    c = store.acquire("c", GPU, ttl=30, ticket=tc)
    store.release("c", c.token)
    assert woken(store)[-1] == f"b {tb2}"
    assert store.acquire("b", GPU, ttl=30, ticket=tb).blocked_type == "stale"  # the old ticket's copy is dropped
    assert store.acquire("b", GPU, ttl=30, ticket=tb2).status == "claimed"


def test_the_fallback_retry_claims_a_grant_whose_wake_up_was_lost(redis_client: redis.Redis) -> None:
    store = gpu_host(redis_client)
    a = store.acquire("a", GPU, ttl=30)
    _, tb = wait(store, "b")
    store.release("a", a.token)
    redis_client.delete(store.wake_key)  # lost
    res = store.acquire("b", GPU, ttl=30, ticket=tb)
    assert (res.ok, res.status) == (True, "claimed")


def test_an_expired_lease_is_handed_off_when_reaped(redis_client: redis.Redis) -> None:
    """The holder was killed: its lease expires and the first script that reaps it (a waker's tick) hands it on."""
    store = gpu_host(redis_client)
    assert store.acquire("killed", GPU, ttl=0.2).ok
    _, tb = wait(store, "b")
    tick = store.tick()
    assert tick.waiting and tick.next_expiry_in <= 0.2
    wait_for(lambda: store.tick().reaped == 1, 30, "the killed holder's lease to expire and be reaped")
    assert woken(store) == [f"b {tb}"]
    assert store.snapshot().devices[0].task_id == "b"


def test_the_starvation_guard_holds_back_for_a_big_request(redis_client: redis.Redis) -> None:
    store = gpu_host(redis_client, gpus=2)
    a = store.acquire("a", GPU, ttl=30)
    s = store.acquire("s", GPU, ttl=30)
    _, tb = wait(store, "big", {"gpu": 2}, starve=0)  # starved at once: it reserves both devices
    wait(store, "small")
    store.release("a", a.token)
    assert woken(store) == []  # the freed device is held back for the big request, not given to the small one
    store.release("s", s.token)
    assert woken(store) == [f"big {tb}"]


def test_a_copy_that_runs_on_another_host_takes_the_task_out_of_the_first(redis_client: redis.Redis) -> None:
    h1, h2 = gpu_host(redis_client, pool="host:h1"), gpu_host(redis_client, pool="host:h2")
    a = h1.acquire("a", GPU, ttl=30)
    _, tb = wait(h1, "b")
    _, tc = wait(h1, "c")
    h1.release("a", a.token)  # b is handed h1's device and woken...
    assert h1.unpark("b", tb) == "moved"  # ...but its fallback retry came to h2 first: it runs there
    assert h2.acquire("b", GPU, ttl=30).ok
    assert woken(h1) == [f"b {tb}", f"c {tc}"]  # h1's device went on to c
    assert h1.acquire("b", GPU, ttl=30, ticket=tb).blocked_type == "stale"  # the woken copy drops itself
    c = h1.acquire("c", GPU, ttl=30, ticket=tc)
    assert c.status == "claimed"
    assert h1.unpark("c", tc) == "running"  # c's fallback on h2 drops itself
    h1.release("c", c.token)
    assert h1.unpark("c", tc) == "done"


def test_slots_of_a_ticketed_run_given_back_before_it_ran_forget_the_ticket(redis_client: redis.Redis) -> None:
    store = gpu_host(redis_client)
    a = store.acquire("a", GPU, ttl=30)
    _, tb = wait(store, "b")
    store.release("a", a.token)
    res = store.acquire("b", GPU, ttl=30, ticket=tb)
    store.release("b", res.token, unused=True)  # another pool refused it: it did not run
    assert store.acquire("b", GPU, ttl=30, ticket=tb).ok  # its next copy is not taken for a duplicate


def test_copies_in_any_order_run_each_task_exactly_once(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    ids = [f"t{i}" for i in range(6)]

    class Handoff(RuleBasedStateMachine):
        """The broker is a list of copies (id, ticket); ``deliver`` runs one the way SlotTask does."""

        def __init__(self) -> None:
            super().__init__()
            client.flushall()
            self.store = gpu_host(client, gpus=2)
            self.copies: list[tuple[str, str]] = []
            self.running: dict[str, int] = {}  # id -> token
            self.runs: dict[str, int] = {}
            self.submitted: set[str] = set()

        def handle(self, tid: str, ticket: str) -> None:
            if not ticket:
                res = self.store.acquire(tid, GPU, ttl=30, starvation_after=3600)
                if res.ok:
                    return self.start(tid, res)
            res, new = wait(self.store, tid, ticket=ticket, window=0.05)
            if res.ok:
                return self.start(tid, res)
            if res.status == "busy":
                self.copies.append((tid, new))  # the fallback retry under the new ticket
            else:
                assert res.status == "duplicate", res
            return None

        def start(self, tid: str, res: AcquireResult) -> None:
            assert tid not in self.running, f"{tid} runs twice at once"
            self.running[tid] = res.token
            self.runs[tid] = self.runs.get(tid, 0) + 1

        @rule(i=st.integers(0, 5))
        def submit(self, i: int) -> None:
            if ids[i] not in self.submitted:
                self.submitted.add(ids[i])
                self.handle(ids[i], "")

        @rule(k=st.integers(0, 20))
        def deliver(self, k: int) -> None:
            if self.copies:
                self.handle(*self.copies.pop(k % len(self.copies)))

        @rule(i=st.integers(0, 5))
        def finish(self, i: int) -> None:
            tid = ids[i]
            if tid in self.running:
                self.store.release(tid, self.running.pop(tid))

        @rule(lose=st.booleans())
        def wake(self, lose: bool) -> None:
            msg = client.lpop(self.store.wake_key)
            if msg and not lose:
                tid, ticket = str(msg).split(" ")
                self.copies.append((tid, ticket))

        @rule()
        def grants_expire(self) -> None:
            time.sleep(0.06)
            self.store.tick()

        @rule()
        def redis_restarts(self) -> None:
            """Redis comes back empty: the running tasks' heartbeats register their leases again."""
            client.flushall()
            self.store = gpu_host(client, gpus=2)
            for tid, token in self.running.items():
                assert self.store.renew(tid, token, 30, GPU, devices={}).status == "restored"

        @invariant()
        def never_twice(self) -> None:
            assert all(n == 1 for n in self.runs.values()), self.runs

        def teardown(self) -> None:
            for _ in range(200):  # every waiting task runs, by its wake-up or its fallback
                for tid in list(self.running):
                    self.store.release(tid, self.running.pop(tid))
                while (msg := client.lpop(self.store.wake_key)) is not None:
                    tid, ticket = str(msg).split(" ")
                    self.copies.append((tid, ticket))
                if not self.copies:
                    break
                self.handle(*self.copies.pop(0))
            assert not self.copies
            assert self.runs == {tid: 1 for tid in self.submitted}

    Handoff.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                         suppress_health_check=list(HealthCheck), derandomize=True)
    try:
        Handoff.TestCase().runTest()
    finally:
        client.close()


def test_a_retry_the_task_body_asks_for_carries_no_ticket() -> None:
    """The woken copy's ticket is taken off its request: ``self.retry()`` (a new run, the same task id) is never
    taken for a late copy of the wait and dropped."""
    from celery.app.task import Context

    from celeryops.slots.celery import POOL_HEADER, TICKET_HEADER, WAITS_HEADER, _take, _take_ticket

    req = Context({"id": "x", TICKET_HEADER: "T1", POOL_HEADER: "host:h1", WAITS_HEADER: 2, "mine": "kept"})
    assert req.headers == {TICKET_HEADER: "T1", POOL_HEADER: "host:h1", WAITS_HEADER: 2, "mine": "kept"}
    assert _take_ticket(req) == ("T1", "host:h1") and _take(req, WAITS_HEADER) == 2
    assert req.headers == {"mine": "kept"}  # what signature_from_request copies into a retry
    assert not hasattr(req, TICKET_HEADER) and not hasattr(req, WAITS_HEADER)
    assert _take_ticket(Context({"id": "y"})) == ("", "")
