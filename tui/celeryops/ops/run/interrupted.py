"""Who holds an open run now: its process (live), nobody since its owner died or stopped heart-beating
(interrupted), or nobody by design (a drain-only run parked drained). Pure: the journal's run and the fleet's lease
in, a verdict out; the console, ``status`` and ``watch`` read the same verdict.

An owner known dead is dead now: a lease whose process is gone from this host (``LeaseInfo.dead_here``: the same
hostname, boot and pid namespace, and the pid gone or reused) makes the run interrupted at once; on another host
only the lease's expiry says so (its TTL). A run with no lease at all is interrupted, but for a run still in
preflight that was written less than a lease TTL ago (a run is journalled a moment before its lease is taken, and
stops nothing before it holds it) whose journalled process is not gone from this host, nor this very process (a
console that detached from its run).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Literal

from celeryops.ops.fleetwide.lease import LeaseInfo, process_gone
from celeryops.ops.journal import Run

Holding = Literal["live", "interrupted", "parked", "starting", "unknown"]


@dataclass(frozen=True)
class RunHolder:
    """``state``: live (its process holds the lease), interrupted (nobody does: its owner died or lost Redis),
    parked (a drain-only run left drained on purpose), starting (journalled, its lease not taken yet), unknown (the
    lease could not be read, and no evidence here says its owner is gone). ``why``: the
    evidence, in words; ``since``: when its owner was last heard of (epoch seconds), for an interrupted run."""

    state: Holding
    why: str = ""
    since: float | None = None
    brief: str = ""  # the evidence in two or three words, for a header line

    @property
    def interrupted(self) -> bool:
        return self.state == "interrupted"


def holder_of(run: Run, lease: LeaseInfo | None, now: float, ttl: float, *, lease_read: bool = True) -> RunHolder:
    """Who holds ``run`` (an unfinished run of the fleet), given the fleet's ``lease`` (None: no lease) at ``now``
    with the lease TTL ``ttl``. ``lease_read`` False: Redis did not answer (or there is none), so no lease says
    nothing."""
    if lease is not None and lease.run_id == run.id:
        if not lease.orphaned:
            return RunHolder("live")
        if lease.dead_here:
            return RunHolder("interrupted", f"its process (pid {lease.pid}) is gone from {lease.host}",
                             lease.heartbeat_at, "process gone")
        return RunHolder("interrupted", f"its owner stopped heart-beating (pid {lease.pid} on {lease.host})",
                         lease.heartbeat_at, "heartbeat stopped")
    if run.phase == "drained" and not run.release:
        return RunHolder("parked", "drained and parked: its consumers stay stopped until a deploy or an abort")
    if process_gone(run.host, run.pid):
        return RunHolder("interrupted", f"its process (pid {run.pid}) is gone from {run.host}", run.updated,
                         "process gone")
    if (run.host, run.pid) == (socket.gethostname(), os.getpid()):  # ours, and we do not hold it: detached
        return RunHolder("interrupted", "this process left it (detached)", run.updated, "detached")
    if not lease_read:
        return RunHolder("unknown", "the fleet's Redis did not answer: who holds it cannot be read")
    if run.phase == "preflight" and now - run.updated < ttl:  # journalled, its lease about to be taken
        return RunHolder("starting")
    return RunHolder("interrupted", "no process holds its lease", run.updated, "no lease")
