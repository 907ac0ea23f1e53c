"""May the connected Redis user do what a command is about to do? Asked before anything changes.

Each need is probed with a command that the ACL checks exactly like the real one (the same command class and the
same key) but that changes nothing when it is allowed: ``HDEL <key> <a field nobody writes>``, ``SREM`` of a member
nobody adds, ``EVALSHA`` of a script that does not exist (NOSCRIPT). A ``NOPERM`` answer names the missing
permission. This needs no ACL command (``ACL DRYRUN`` and ``ACL GETUSER`` are admin commands a least-privilege
user is not given, and a managed Redis may refuse them): any other answer (allowed, NOSCRIPT, an unknown or renamed
command, a Redis without ACLs) lets the command go on, and a Redis that does not answer is left to the command's own
checks, which say so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from celeryops.core.errors import EXIT_PREFLIGHT, UserError
from celeryops.core.namespace import fleet_key
from celeryops.ops.access.rules import Role

PROBE_MEMBER = "celeryops-permission-probe"  # a hash field / set member nothing ever writes
NO_SCRIPT = "0" * 40  # no script has this SHA1


@dataclass(frozen=True)
class Need:
    """One permission a command needs: ``what`` it lets the user do (words), the probe, and the role that has it."""

    what: str
    probe: tuple[str, ...]
    role: Role = "operator"

    @property
    def permission(self) -> str:
        """The permission in Redis' words: the command and the key (or channel) it is checked on."""
        return f"{self.probe[0]} on {self.probe[3] if self.probe[0] == 'EVALSHA' else self.probe[1]}"


def operator_needs(fleet: str, *, keyprefix: str = "", control: str = "celery") -> list[Need]:
    """What drain, deploy, abort, resume and rollback need before their first change: write celeryops' keys (the run
    lease, the journal's fleet copy, the published status), run its Lua scripts on them (lease, fence), and bind
    the replies of remote-control commands on the broker (stopping and restoring consumers)."""
    return [
        Need("write the fleet's run keys (lease, journal copy, published status)",
             ("HDEL", fleet_key(fleet, "lease"), PROBE_MEMBER)),
        Need("run celeryops' Lua scripts on the fence and the lease",
             ("EVALSHA", NO_SCRIPT, "1", fleet_key(fleet, "fence"))),
        Need("receive replies to remote-control commands (stop and restore consumers)",
             ("SREM", f"{keyprefix}_kombu.binding.reply.{control}.pidbox", PROBE_MEMBER)),
    ]


def watcher_needs(fleet: str) -> list[Need]:
    """What ``watch`` and ``status`` need: read the published status and the run lease."""
    return [Need("read the fleet's published status", ("HLEN", fleet_key(fleet, "status")), role="watcher")]


def user_of(client: redis.Redis) -> str:
    return str(client.connection_pool.connection_kwargs.get("username") or "default")


def missing(client: redis.Redis, needs: Sequence[Need]) -> list[Need]:
    """The needs ``client``'s user lacks (NOPERM). Raises ``redis.ConnectionError`` / ``TimeoutError`` when Redis
    does not answer."""
    lacking = []
    for need in needs:
        try:
            client.execute_command(*need.probe)  # type: ignore[no-untyped-call]
        except redis.exceptions.NoPermissionError:
            lacking.append(need)
        except redis.ResponseError as exc:
            if str(exc).startswith("NOPERM"):  # older redis-py: a plain ResponseError
                lacking.append(need)
            # NOSCRIPT (allowed), an unknown or renamed command, WRONGTYPE...: not a missing permission
    return lacking


class PermissionRefused(UserError):
    """The connected Redis user lacks a permission the command needs: refused before anything changed (exit 5)."""

    def __init__(self, action: str, user: str, need: Need) -> None:
        super().__init__(
            f"Refused to {action}: the Redis user {user!r} may not {need.what} (no permission for {need.permission}), "
            f"so nothing was stopped or changed; connect as a user with the {need.role} role (`celeryops acl "
            f"{need.role}` prints its ACL rules).", EXIT_PREFLIGHT)
        self.need = need
        self.user = user


async def require(action: str, clients: Sequence[tuple[redis.Redis, Sequence[Need]]]) -> None:
    """Raise ``PermissionRefused`` for the first need a client's user lacks; a Redis that does not answer is left
    to the command's own checks."""
    for client, needs in clients:
        try:
            lacking = await asyncio.to_thread(missing, client, needs)
        except redis.RedisError:
            continue
        if lacking:
            raise PermissionRefused(action, user_of(client), lacking[0])
