"""Who holds an open run now: its process (live), nobody since its owner died or stopped heart-beating
(interrupted), or nobody by design (a drain-only run parked drained). Pure: the journal's run and the fleet's lease
in, a verdict out; the console, ``status`` and ``watch`` read the same verdict.

An owner known dead is dead now: a lease whose process is gone from this host (``LeaseInfo.dead_here``: the same
hostname, boot and pid namespace, and the pid gone or reused) makes the run interrupted at once; on another host
only the lease's expiry says so (its TTL). A run with no lease at all is interrupted once it has been quiet for a
lease TTL (a run is journalled a moment before its lease is taken), or at once when its journalled process is gone
from this host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from celeryops.ops.fleetwide.lease import LeaseInfo, process_gone
from celeryops.ops.journal import Run

Holding = Literal["live", "interrupted", "parked", "starting"]


@dataclass(frozen=True)
class RunHolder:
    """``state``: live (its process holds the lease), interrupted (nobody does: its owner died or lost Redis),
    parked (a drain-only run left drained on purpose), starting (journalled, its lease not taken yet). ``why``: the
    evidence, in words; ``since``: when its owner was last heard of (epoch seconds), for an interrupted run."""

    state: Holding
    why: str = ""
    since: float | None = None
    brief: str = ""  # the evidence in two or three words, for a header line

    @property
    def interrupted(self) -> bool:
        return self.state == "interrupted"


def holder_of(run: Run, lease: LeaseInfo | None, now: float, ttl: float) -> RunHolder:
    """Who holds ``run`` (an unfinished run of the fleet), given the fleet's ``lease`` (None: no lease, or Redis
    not read) at ``now`` with the lease TTL ``ttl``."""
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
    if now - run.updated >= ttl:
        return RunHolder("interrupted", "no process holds its lease", run.updated, "no lease")
    return RunHolder("starting")
