"""Run lease on a real redis-server: atomic acquire, live vs orphaned holders, take-over, compare-and-delete."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celeryops.core.errors import EXIT_PREFLIGHT
from celeryops.core.namespace import fleet_key
from celeryops.ops.fleetwide.lease import (
    LeaseHeld,
    RunLease,
    process_gone,
    process_scope,
    process_start,
    read_lease,
)
from celeryops_harness.workers import wait_for


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def test_one_run_at_a_time(client: redis.Redis) -> None:
    first = RunLease(client, "prod", "run-1", owner="alice", host="box1", pid=11)
    first.acquire()
    second = RunLease(client, "prod", "run-2", owner="bob", host="box2", pid=22)
    with pytest.raises(LeaseHeld) as err:
        second.acquire()
    held = err.value
    assert held.exit_code == EXIT_PREFLIGHT
    assert (held.holder.run_id, held.holder.owner, held.holder.host, held.holder.pid) == ("run-1", "alice", "box1", 11)
    assert not held.holder.orphaned
    assert "run-1 of alice@box1 (pid 11)" in str(held) and "alive" in str(held) and "nothing was done" in str(held)
    # Another fleet is independent.
    RunLease(client, "staging", "run-3").acquire()

    assert second.release() is False  # not ours: left alone
    assert read_lease(client, "prod") is not None
    assert first.release() is True
    assert read_lease(client, "prod") is None
    second.acquire()
    assert read_lease(client, "prod").run_id == "run-2"  # type: ignore[union-attr]


def test_acquire_is_atomic_under_contention(redis_url: str) -> None:
    import threading

    winners: list[str] = []
    barrier = threading.Barrier(8)

    def contend(i: int) -> None:
        lease = RunLease(redis.Redis.from_url(redis_url), "prod", f"run-{i}")
        barrier.wait()
        try:
            lease.acquire()
            winners.append(lease.run_id)
        except LeaseHeld:
            pass

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(winners) == 1
    assert read_lease(redis.Redis.from_url(redis_url), "prod").run_id == winners[0]  # type: ignore[union-attr]


def test_take_over_refuses_live_and_other_runs(client: redis.Redis) -> None:
    holder = RunLease(client, "prod", "run-1", ttl=30)
    holder.acquire()
    taker = RunLease(client, "prod", "run-1b")
    with pytest.raises(LeaseHeld, match="alive"):
        taker.take_over("run-1")
    client.delete(fleet_key("prod", "lease", "alive"))  # the holder's heartbeat stopped
    with pytest.raises(LeaseHeld, match="not run run-9"):
        taker.take_over("run-9")
    with pytest.raises(LeaseHeld, match=r"orphaned.*take-over of run run-1"):
        taker.acquire()  # an orphan is never taken implicitly
    taker.take_over("run-1")
    info = read_lease(client, "prod")
    assert info is not None and info.run_id == "run-1b" and info.taken_from == "run-1" and not info.orphaned
    assert holder.renew() is False and holder.release() is False  # the old holder lost it and cannot delete it


async def test_heartbeat_keeps_a_short_lease_alive_and_reports_loss(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    lost = asyncio.Event()
    lease = RunLease(client, "prod", "run-1", ttl=0.6, on_lost=lost.set)
    async with lease.held():
        beats: list[float] = []

        async def heartbeats(n: int) -> None:
            while len(beats) < n:
                info = read_lease(client, "prod")
                assert info is not None and not info.orphaned
                if not beats or info.heartbeat_at != beats[-1]:
                    beats.append(info.heartbeat_at)
                await asyncio.sleep(0.05)

        await asyncio.wait_for(heartbeats(6), timeout=30)  # several ttls of renewals, never orphaned
        client.delete(fleet_key("prod", "lease"))  # someone removed our lease
        await asyncio.wait_for(lost.wait(), timeout=30)
        assert lease.lost
    assert read_lease(client, "prod") is None


HOLDER = textwrap.dedent("""
    import asyncio, sys
    import redis
    from celeryops.ops.fleetwide.lease import RunLease

    async def main():
        client = redis.Redis.from_url(sys.argv[1])
        lease = RunLease(client, "prod", "run-crashed", owner="carol", ttl=float(sys.argv[2]))
        async with lease.held():
            print("held", flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main())
""")


@contextlib.contextmanager
def holder(redis_url: str, ttl: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process holding the lease of run-crashed (owner carol) with ``ttl``, killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, redis_url, ttl], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"held", proc.stderr.read() if proc.stderr else b""
        yield proc
    finally:
        proc.kill()
        proc.wait(30)


@pytest.mark.slow
def test_sigkilled_holder_becomes_orphaned_then_taken_over(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    with holder(redis_url, "1.0") as proc:
        taker = RunLease(client, "prod", "run-new", owner="dave")
        # Alive: the holder heart-beats well past its ttl, and a take-over is refused all along.
        first = read_lease(client, "prod")
        assert first is not None and first.owner == "carol"
        wait_for(lambda: read_lease(client, "prod").heartbeat_at > first.heartbeat_at + 1.0,  # type: ignore[union-attr]
                 30, "the holder to renew past its ttl")
        with pytest.raises(LeaseHeld, match="alive"):
            taker.take_over("run-crashed")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        wait_for(lambda: read_lease(client, "prod").orphaned, 30, "the lease to become orphaned")  # type: ignore[union-attr]
        with pytest.raises(LeaseHeld, match=r"carol.*orphaned"):
            taker.acquire()
        taker.take_over("run-crashed")
        info = read_lease(client, "prod")
        assert info is not None and (info.run_id, info.owner, info.taken_from) == ("run-new", "dave", "run-crashed")


# -- an owner known dead is dead now (issue 22) -------------------------------------------------------------------

def test_a_process_is_known_gone_here_when_it_exited_is_a_zombie_or_its_pid_was_reused() -> None:
    here, me = socket.gethostname(), os.getpid()
    started = process_start(me)
    assert started is not None and not process_gone(here, me, started, process_scope())
    assert process_gone(here, me, started - 100.0, process_scope())  # the pid now belongs to a later process
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait(30)
    assert process_gone(here, exited.pid)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: (Path(f"/proc/{zombie.pid}/stat").read_text().split()[2] == "Z"), 30, "a zombie")
    try:
        assert process_gone(here, zombie.pid)  # dead, not reaped yet
    finally:
        zombie.wait(30)
    # Where this host cannot tell, nobody is taken for dead: another host, another boot or pid namespace.
    assert not process_gone("another-host", exited.pid)
    assert not process_gone(here, exited.pid, None, "another-boot/pid:[1]")


@pytest.mark.slow
def test_a_sigkilled_holder_on_this_host_is_orphaned_and_taken_over_at_once(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    with holder(redis_url, "3600") as proc:
        alive = read_lease(client, "prod")
        assert alive is not None and not alive.orphaned and alive.pid == proc.pid and alive.pid_start is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        dead = read_lease(client, "prod")
        assert dead is not None and dead.alive_ms > 0  # its alive key would live on for an hour
        assert dead.orphaned and dead.dead_here and "gone from this host" in dead.describe()
        taker = RunLease(client, "prod", "run-new", owner="dave")
        with pytest.raises(LeaseHeld, match="orphaned"):
            taker.acquire()  # an orphaned lease is still only taken over explicitly
        taker.take_over("run-crashed")
        info = read_lease(client, "prod")
        assert info is not None and (info.run_id, info.taken_from) == ("run-new", "run-crashed") and not info.orphaned
