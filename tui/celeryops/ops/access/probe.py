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

from celeryops.core.errors import EXIT_BROKER, EXIT_PREFLIGHT, UserError
from celeryops.core.masking import mask_text
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


def url_of(client: redis.Redis) -> str:
    """The URL ``client`` connects to, its password masked: which Redis, as which user (the one given by --broker,
    say, and not the one in $CELERY_BROKER_URL)."""
    kw = client.connection_pool.connection_kwargs
    user = str(kw.get("username") or "")
    auth = f"{user}:***@" if kw.get("password") else (f"{user}@" if user else "")
    if kw.get("path"):
        return f"unix://{auth}{kw['path']}?db={kw.get('db', 0)}"
    scheme = "rediss" if "ssl" in client.connection_pool.connection_class.__name__.lower() else "redis"
    return f"{scheme}://{auth}{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


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

    def __init__(self, action: str, user: str, need: Need, url: str = "") -> None:
        at = f" at {url}" if url else ""
        super().__init__(
            f"Refused to {action}: the Redis user {user!r}{at} may not {need.what} (no permission for "
            f"{need.permission}), "
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
            raise PermissionRefused(action, user_of(client), lacking[0], url_of(client))


class LoginRefused(UserError):
    """Redis refused to log the user in (wrong password, unknown or disabled user): nothing was read or changed
    (exit 4, as for a broker that cannot be reached)."""

    def __init__(self, url: str, user: str, detail: str) -> None:
        super().__init__(
            f"Redis at {url} refused the login of user {user!r} ({mask_text(detail).rstrip('.')}): nothing was read "
            "or changed; check that URL's user and password (a --broker URL is used as given, whatever "
            "$CELERY_BROKER_URL says).", EXIT_BROKER)
        self.url = url
        self.user = user


def refused_login(client: redis.Redis, exc: BaseException) -> LoginRefused | None:
    """``exc`` as a :class:`LoginRefused` when it is Redis refusing ``client``'s login, else None."""
    if isinstance(exc, redis.AuthenticationError):
        return LoginRefused(url_of(client), user_of(client), str(exc) or type(exc).__name__)
    return None


def require_login(client: redis.Redis) -> None:
    """Raise :class:`LoginRefused` when Redis refuses ``client``'s user (one PING); a Redis that does not answer,
    or a user not allowed PING, is left to the command's own checks, which say so."""
    try:
        client.ping()
    except redis.RedisError as exc:
        refused = refused_login(client, exc)
        if refused is not None:
            raise refused from None
