"""``celeryops slots``: show every slot pool, per host (totals, used, free, the workers whose contributions make a
host's totals or add up to the global pool's, each device of a host: free or held by which task for how long,
holders with their leases, waiting requests; a request no live host could ever serve reads "no capacity anywhere"
with the hosts' totals).

Redis: ``--redis URL``, else ``$CELERYOPS_SLOTS_REDIS_URL``, else the fleet's broker. Read-only.
"""

from __future__ import annotations

import json

import click
import humanize
import redis

from celeryops.commands.common import FleetSpec, fleet_options
from celeryops.core.errors import EXIT_BROKER, UserError
from celeryops.core.masking import mask_url
from celeryops.core.urls import is_redis_url
from celeryops.ops.access.probe import refused_login
from celeryops.slots.snapshot import PoolSnapshot, Snapshot, Waiting
from celeryops.slots.store import connect, read_all


def _redis_url(fleet: FleetSpec, explicit: str | None) -> str:
    url = explicit or fleet.config().run.slots_redis_url  # $CELERYOPS_SLOTS_REDIS_URL, read by the config
    if url:
        return url
    url = fleet.resolve_broker_url()
    if not is_redis_url(url):
        raise UserError(f"The broker {mask_url(url)} is not Redis, so it holds no slot pools: nothing was read; "
                        "pass --redis URL or set CELERYOPS_SLOTS_REDIS_URL.", EXIT_BROKER)
    return url


def load_snapshot(url: str) -> Snapshot:
    try:
        client = connect(url, timeout=3.0)
    except ValueError as exc:
        raise UserError(f"Bad Redis URL {mask_url(url)} ({exc}): nothing was read; "
                        "pass a redis:// URL with --redis.", EXIT_BROKER) from None
    try:
        return read_all(client)
    except redis.RedisError as exc:
        refused = refused_login(client, exc)
        if refused is not None:
            raise refused from None
        raise UserError(f"Could not read slot pools from {mask_url(url)} ({type(exc).__name__}): nothing was "
                        "changed; check that Redis is up and the URL is right.", EXIT_BROKER) from None
    finally:
        client.close()


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return humanize.naturaldelta(seconds, minimum_unit="seconds") if seconds >= 1 else f"{seconds:.1f}s"


def render(snapshot: Snapshot) -> str:
    if not snapshot.pools:
        return "No slot pools found."
    lines: list[str] = []
    for p in snapshot.pools:
        title = f"pool {p.pool} ({p.scope}" + (f", host {p.host}" if p.host else "") + ")"
        lines.append(title)
        lines.append(f"  {'TYPE':<12}{'TOTAL':>7}{'USED':>7}{'FREE':>7}")
        for t in p.types:
            note = ""
            if p.scope == "global":
                n = sum(1 for h in p.hosts if not h.expired and h.totals.get(t.type))
                note = "  fixed" if t.fixed else f"  sum of {n} host{'' if n == 1 else 's'}"
            lines.append(f"  {t.type:<12}{t.total:>7}{t.used:>7}{t.free:>7}{note}")
        if p.hosts:
            lines.append(f"  {'HOST':<24}{'ADDS':<20}{'AGE':<14}{'EXPIRES':<18}WORKERS")
            for hc in p.hosts:
                adds = ",".join(f"{k}={v}" for k, v in hc.totals.items()) or "-"
                expires = "EXPIRED" if hc.expired else "in " + _dur(hc.expires_in)
                lines.append(f"  {hc.host[:23]:<24}{adds[:19]:<20}{_dur(hc.age):<14}{expires:<18}"
                             f"{' '.join(hc.workers)}")
        if p.devices:
            lines.append(f"  {'DEVICE':<24}{'STATE':<8}{'TASK':<38}{'NAME':<28}{'WORKER':<22}FOR")
            for d in p.devices:
                name = f"{d.type} {d.device}"
                if d.free:
                    lines.append(f"  {name[:23]:<24}free")
                else:
                    lines.append(f"  {name[:23]:<24}{'held':<8}{d.task_id or '':<38}{d.task_name[:27]:<28}"
                                 f"{d.worker[:21]:<22}{_dur(d.held_for)}")
        if p.holders:
            lines.append(f"  {'TASK':<38}{'NAME':<28}{'WORKER':<22}{'SLOTS':<14}{'AGE':<12}{'LEASE':<12}TOKEN")
            for h in p.holders:
                slots = ",".join(f"{k}={v}" for k, v in sorted(h.slots.items()))
                lease = "EXPIRED" if h.expired else _dur(h.lease_remaining)
                lines.append(f"  {h.task_id:<38}{h.task_name[:27]:<28}{h.worker[:21]:<22}{slots:<14}"
                             f"{_dur(h.age):<12}{lease:<12}{'-' if h.token is None else h.token}")
        for w in p.waiting:
            slots = ",".join(f"{k}={v}" for k, v in sorted(w.slots.items()))
            lines.append(f"  waiting {w.task_id} {w.task_name} {slots} for {_dur(w.waited)}"
                         + (" (reserved)" if w.reserved else "") + no_capacity_note(snapshot, p, w))
    return "\n".join(lines)


def no_capacity_note(snapshot: Snapshot, pool: PoolSnapshot, w: Waiting) -> str:
    """``: no capacity anywhere (hosts: cpu-a gpu=0, cpu-b gpu=0)`` for a request no live host could serve."""
    if not w.no_capacity:
        return ""
    hosts = snapshot.capacity(pool, list(w.slots))
    listed = ", ".join(f"{h} " + ",".join(f"{t}={n}" for t, n in totals.items()) for h, totals in hosts.items())
    return f": no capacity anywhere (hosts: {listed or 'none live'})"


@click.command("slots")
@fleet_options
@click.option("--redis", "redis_url", metavar="URL", help="Redis holding the pools (else $CELERYOPS_SLOTS_REDIS_URL, "
              "else the broker).")
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as one JSON object.")
def slots_command(fleet: FleetSpec, redis_url: str | None, as_json: bool) -> None:
    """Show CPU/GPU slot pools per host: totals, used, free, each GPU device (free or held by which task), the
    hosts adding to the global pool of shared types, holders and their leases, waiting requests."""
    snapshot = load_snapshot(_redis_url(fleet, redis_url))
    if as_json:
        click.echo(json.dumps(snapshot.to_dict(), sort_keys=True))
    else:
        click.echo(render(snapshot))


COMMANDS = [slots_command]
