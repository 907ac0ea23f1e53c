"""Who holds an open run (``ops/run/interrupted.py``): a real journal's runs and leases as Redis returns them."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from celeryops.ops.fleetwide.lease import LeaseInfo
from celeryops.ops.journal import Journal, Phase, Run
from celeryops.ops.run.interrupted import holder_of

TTL = 30.0


def a_run(tmp_path: Path, phase: Phase, *, host: str = "elsewhere", pid: int = 4242, release: str | None = None) -> Run:
    with Journal(tmp_path / f"{phase}-{host}-{pid}.sqlite3") as journal:
        run = journal.create_run(fleet="f", broker="redis://x", host=host, pid=pid, release=release)
        steps: tuple[Phase, ...] = ("stopping", "draining", "drained")
        for step in steps[: ("preflight", *steps).index(phase)]:
            journal.advance(run.id, step)
        return journal.get(run.id)


def lease(run: Run, *, alive_ms: int = 20_000, host: str = "elsewhere", pid: int = 4242) -> LeaseInfo:
    now = time.time()
    return LeaseInfo(run.id, "ops", host, pid, now - 60, now - 5, alive_ms, now)


def exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(30)
    return proc.pid


def test_the_lease_decides_live_or_interrupted(tmp_path: Path) -> None:
    run = a_run(tmp_path, "draining")
    now = time.time()
    assert holder_of(run, lease(run), now, TTL).state == "live"
    stopped = holder_of(run, lease(run, alive_ms=-2), now, TTL)
    assert stopped.interrupted and stopped.brief == "heartbeat stopped" and stopped.since is not None
    here = socket.gethostname()
    dead = exited_pid()
    gone = holder_of(run, lease(run, host=here, pid=dead), now, TTL)  # its alive key still runs: dead all the same
    assert gone.interrupted and gone.brief == "process gone" and f"pid {dead}" in gone.why


def test_without_a_lease(tmp_path: Path) -> None:
    now = time.time()
    starting = a_run(tmp_path, "preflight")
    assert holder_of(starting, None, now, TTL).state == "starting"  # journalled, about to take its lease
    assert holder_of(starting, None, now + TTL + 5, TTL).interrupted
    assert holder_of(a_run(tmp_path, "draining"), None, now, TTL).interrupted  # stops only once it holds a lease
    assert holder_of(a_run(tmp_path, "drained"), None, now, TTL).state == "parked"  # a drain-only run, left drained
    assert holder_of(a_run(tmp_path, "drained", release="r1"), None, now, TTL).interrupted  # a deploy never parks
    gone_here = a_run(tmp_path, "preflight", host=socket.gethostname(), pid=exited_pid())
    assert holder_of(gone_here, None, now, TTL).brief == "process gone"


def test_an_unread_lease_says_nothing_but_a_dead_process_here_does(tmp_path: Path) -> None:
    now = time.time()
    assert holder_of(a_run(tmp_path, "draining"), None, now, TTL, lease_read=False).state == "unknown"
    dead = a_run(tmp_path, "draining", host=socket.gethostname(), pid=exited_pid())
    assert holder_of(dead, None, now, TTL, lease_read=False).interrupted
