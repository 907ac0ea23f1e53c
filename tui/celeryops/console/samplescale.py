"""Fixed data for the autoscaler's screen in snapshot tests and the preview: a GPU worker pool that scaled out on a
burst of long tasks and is taking an idle cohort away. No real hostnames, no wall-clock times (relative to
:data:`celeryops.console.sample.NOW`)."""

from __future__ import annotations

from celeryops.console.sample import NOW
from celeryops.core.autoscale import AutoscaleSettings
from celeryops.ops.fleetwide.scalestatus import ScaleStatus

POOL = "gpu-pool"
COHORTS = ("gpu-pool-00004-kex", "gpu-pool-as0611101502-3f1a", "gpu-pool-as0611103344-9c2e")


def points() -> tuple[tuple[float, int, int], ...]:
    """60 looks 5 s apart: idle, a burst of 9 long tasks (the pool grows from 2 to 5 instances, 2 tasks each), the
    burst running down, the surplus held until idle_after."""
    demand = [1] * 10 + [3, 6, 9, 9, 9, 9, 9, 8, 8, 8, 7, 7, 7, 7, 6, 6, 6, 5, 5, 4, 4, 4, 3, 3, 3, 3, 2, 2, 2, 2,
                         2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]
    capacity = [4] * 11 + [4, 10] + [10] * 47
    return tuple((NOW - 5.0 * (len(demand) - i), d, c) for i, (d, c) in enumerate(zip(demand, capacity, strict=True)))


def decisions() -> tuple[dict[str, object], ...]:
    b = COHORTS[1]
    return (
        {"action": "hold", "at": NOW - 300, "desired": 2, "current": 2, "add": 0, "revision": "", "keep": 0,
         "reason": "1 task(s) wait or run (gpu 1): the pool's 2 instances at 2 task(s) each fit."},
        {"action": "out", "at": NOW - 245, "desired": 5, "current": 2, "add": 3, "revision": "", "keep": 0,
         "reason": "9 task(s) wait or run (gpu 9): 5 instances at 2 task(s) each are needed and the pool runs 2: "
                   "adding a cohort of 3 instances."},
        {"action": "hold", "at": NOW - 150, "desired": 3, "current": 5, "add": 0, "revision": "", "keep": 0,
         "reason": "5 task(s) wait or run (gpu 5): 3 of the 5 instances are needed; the surplus of 2 has lasted 0 s, "
                   "one goes after 60 s."},
        {"action": "in", "at": NOW - 10, "desired": 1, "current": 5, "add": 0, "revision": b, "keep": 0,
         "reason": f"2 task(s) wait or run (gpu 2): 1 of the 5 instances is needed for 140 s: cohort {b} "
                   "(1 instance) is idle, so it is drained and taken away."},
    )


def status() -> ScaleStatus:
    settings = AutoscaleSettings(target=POOL, min_instances=0, max_instances=8, queues=("gpu",), slot_resource="gpu")
    a, b, c = COHORTS
    return ScaleStatus(
        fleet="default", target=POOL, state="running", owner="ops", host="autoscaler-host", pid=4242,
        started_at=NOW - 3600, updated_at=NOW - 2, interval=5.0, per_instance=2, queues=("gpu",), instances=5,
        desired=1, points=points(), decisions=decisions(), settings=settings.to_dict(),
        cohorts=({"revision": a, "count": 2, "live": 2, "busy": 1, "state": "busy"},
                 {"revision": b, "count": 1, "live": 1, "busy": 0, "state": "draining"},
                 {"revision": c, "count": 2, "live": 2, "busy": 0, "state": "idle"}),
        demand=({"queue": "gpu", "ready": 0, "reserved": 0, "active": 2, "scheduled": 1},))


__all__ = ["status"]
