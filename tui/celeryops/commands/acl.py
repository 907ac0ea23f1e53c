"""``celeryops acl ROLE``: the Redis ACL rules of a role (watcher, operator, worker), one line."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from celeryops.commands.common import FleetSpec, fleet_options
from celeryops.core.urls import is_redis_url
from celeryops.ops.access.rules import ROLES, KeySchema, Role, describe, rule_args, rules


def _schema(fleet: FleetSpec, queues: tuple[str, ...], results: bool | None, fleet_name: str | None,
            slots_prefix: str | None) -> KeySchema:
    """The key schema of this fleet: its name (--fleet, $CELERYOPS_FLEET, the config), and when an app or broker is
    given, kombu's database number and key prefix, the control exchange and the queues (--queue wins)."""
    cfg = fleet.config()
    name = fleet_name or cfg.run.fleet
    prefix = slots_prefix or os.environ.get("CELERYOPS_SLOTS_PREFIX") or "resource"
    found: dict[str, Any] = {}
    if fleet.given:
        app = fleet.celery_app()
        conn = app.connection_for_write()
        try:
            if is_redis_url(conn.as_uri()):
                found["db"] = int(conn.virtual_host or 0) if str(conn.virtual_host or "0").isdigit() else 0
            options = app.conf.broker_transport_options or {}
            found["keyprefix"] = str(options.get("global_keyprefix", ""))
            if options.get("sep"):
                found["priority_sep"] = str(options["sep"])
            found["control"] = str(app.conf.control_exchange)
            found["events"] = str(app.conf.event_exchange)
            named = [str(app.conf.task_default_queue)] + [str(q.name) for q in (app.conf.task_queues or [])]
            found["queues"] = tuple(dict.fromkeys(named))
            backend = str(app.conf.result_backend or "")
            found["results"] = backend.startswith(("redis://", "rediss://", "redis+socket://"))
        finally:
            conn.release()
    if queues:
        found["queues"] = tuple(dict.fromkeys(queues))
    if results is not None:
        found["results"] = results
    return KeySchema(fleet=name, slots_prefix=prefix, **found)


@click.command()
@click.argument("role", type=click.Choice(ROLES))
@fleet_options
@click.option("--queue", "-Q", "queues", multiple=True, metavar="Q",
              help="A task queue the role may use (repeatable; default: the app's, else `celery`).")
@click.option("--fleet", "fleet_name", metavar="NAME", help="The fleet (default $CELERYOPS_FLEET or `default`).")
@click.option("--results/--no-results", default=None,
              help="The worker stores results in this Redis (default: when the app's result backend is Redis).")
@click.option("--slots-prefix", metavar="PREFIX", help="The slot pools' key prefix (default `resource`).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def acl(role: Role, fleet: FleetSpec, queues: tuple[str, ...], fleet_name: str | None, results: bool | None,
        slots_prefix: str | None, as_json: bool) -> None:
    """Print the Redis ACL rules of ROLE (watcher, operator, worker) on one line, to put after
    `ACL SETUSER <name> on ><password>` (Redis 7.0 or later), as in
    `redis-cli ACL SETUSER NAME on '>PASSWORD' $(celeryops acl ROLE)` (bash, zsh) or in redis-cli; --json gives the
    exact rules as `args`. Reads nothing from Redis."""
    schema = _schema(fleet, queues, results, fleet_name, slots_prefix)
    line = rules(role, schema)
    if as_json:
        click.echo(json.dumps({"event": "acl", "role": role, "rules": line, "fleet": schema.fleet,
                               "queues": list(schema.queues), "describe": describe(role),
                               "args": rule_args(role, schema),
                               "setuser": f"ACL SETUSER <name> on ><password> {line}"}))
    else:
        click.echo(line)


COMMANDS = [acl]
