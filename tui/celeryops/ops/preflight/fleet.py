"""The fleet's preflight checks, the same for a drain and a deploy, in the console and headless:
the broker answers, every known worker replies, no other run holds the fleet, the workers run the fence plugin, and
no worker setting loses or duplicates work (``celeryops doctor``: one warning per finding)."""

from __future__ import annotations

import asyncio

import redis

from celeryops.adapters.fleet import Fleet
from celeryops.core.errors import UserError
from celeryops.ops.fleetwide.lease import read_lease
from celeryops.ops.journal import Journal
from celeryops.ops.preflight.brokersafety import broker_safety_check, safety_targets
from celeryops.ops.preflight.checks import fence_plugin_check
from celeryops.ops.preflight.framework import Check, CheckResult
from celeryops.ops.preflight.nodenames import node_names_check
from celeryops.ops.preflight.settings import settings_check

#: Checks whose failure means the fleet cannot be reached at all (a drain exits 4 for these, as documented).
UNREACHABLE = frozenset({"broker", "workers"})


def fleet_checks(fleet: Fleet, journal: Journal, coord: redis.Redis | None, fleet_name: str, *,
                 take_over: bool = False) -> list[Check]:
    found: list[asyncio.Future[set[str]]] = []

    async def known() -> set[str]:
        """The fleet's members, looked up once for the checks that need them (on Redis: the pidbox bindings and the
        fence registry; else who answers ping)."""
        if not found:
            found.append(asyncio.ensure_future(fleet.members()))
        return set(await asyncio.shield(found[0]))

    async def broker() -> CheckResult:
        try:
            await fleet.check_broker()
        except UserError as err:
            return CheckResult("broker", "", "fail", str(err), "start the broker or fix --broker / -A")
        return CheckResult("broker", "", "ok", fleet.display_url)

    async def workers() -> CheckResult:
        members = await known()
        # With every member known, ping returns as soon as all of them answered.
        answered = await fleet.ping(limit=len(members) or None)
        silent = sorted(members - answered)
        # A silent worker whose fence heartbeat expired is gone by evidence (the drain leaves it out the same way):
        # e.g. a Cloud Run instance that was replaced or restarted with a new id, under a new node name.
        expired = await fleet.heartbeats() if silent else {}
        left = [name for name in silent if expired.get(name) is False]
        silent = [name for name in silent if name not in left]
        gone = (f"; {len(left)} registered worker(s) left (their fence heartbeat expired, e.g. an instance "
                f"restarted with a new id): {', '.join(left[:4])}") if left else ""
        if not answered:
            hint = f" ({len(silent)} registered but silent: {', '.join(silent[:4])})" if silent else ""
            return CheckResult("workers", "", "fail", f"no worker answered on {fleet.display_url}{hint}",
                               "start the workers (or check that they use this broker; --forget dead ones)")
        if silent:
            return CheckResult("workers", "", "warn", f"{len(silent)} registered worker(s) did not answer ping: "
                               f"{', '.join(silent[:4])}{gone}", "they count as unknown until they reply; forget "
                               "them with --forget (F in the console) if they are gone")
        return CheckResult("workers", "", "ok", f"{len(answered)} worker(s) answer{gone}")

    async def lease() -> CheckResult:
        if coord is None:
            return CheckResult("lease", "", "warn", "no Redis for the run lease and the run journal (the broker is "
                               "not Redis): recovery will only be possible from this machine, and two operators "
                               "could drain at once",
                               "set CELERYOPS_REDIS_URL to a Redis the fleet shares, so that any machine with the "
                               "broker can abort or resume a run whose operator is gone")
        try:
            holder = await asyncio.to_thread(read_lease, coord, fleet_name)
        except redis.RedisError as exc:
            return CheckResult("lease", "", "fail", f"the run lease could not be read ({exc})",
                               "check that Redis answers, then try again")
        step = holder is not None and not holder.orphaned and await asyncio.to_thread(_autoscale_step, coord,
                                                                                     fleet_name, holder.run_id)
        if step and holder is not None:
            return CheckResult("lease", "", "ok", f"a step of the autoscaler holds the fleet (run {holder.run_id}): "
                               "this run waits for it to end")
        if holder is not None and not (holder.orphaned and take_over):
            state = "orphaned" if holder.orphaned else "live"
            return CheckResult("lease", "", "fail", f"another run holds the fleet ({state}): {holder.describe()}",
                               "wait for it, or take over an orphaned run with --take-over")
        runs = await asyncio.to_thread(journal.unfinished_runs, fleet_name)
        open_run = runs[-1] if runs else None
        if open_run is not None and open_run.holds_fleet() and not take_over:
            held = "stopped consumers" if open_run.stopped_consumers() else "a worker pool it changed"
            return CheckResult("lease", "", "fail", f"run {open_run.id} ({open_run.phase}, started by "
                               f"{open_run.user}@{open_run.host}) is unfinished and holds {held}",
                               "run `celeryops resume` to continue it or `celeryops abort` to "
                               + ("restore them" if open_run.stopped_consumers() else "undo it"))
        return CheckResult("lease", "", "ok", "the lease is free")

    return [Check("broker", "Broker reachable", broker, timeout=15),
            Check("workers", "Every known worker replies", workers, timeout=20),
            Check("lease", "No other run holds the fleet", lease, timeout=10),
            fence_plugin_check(fleet.app, fleet_name, known=known),
            node_names_check(fleet.app),
            broker_safety_check(safety_targets(fleet.redis(), fleet.display_url, coord)),
            settings_check(fleet, coord, fleet_name)]


def _autoscale_step(coord: redis.Redis, fleet: str, run_id: str) -> bool:
    """Whether the run that holds the lease is a step of the autoscaler (its published status says so)."""
    from celeryops.ops.fleetwide.publish import read_status

    try:
        published = read_status(coord, fleet)
    except (redis.RedisError, UserError):
        return False
    return published is not None and published.run_id == run_id and published.kind == "autoscale"
