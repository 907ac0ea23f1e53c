"""The one place that assembles a run's objects from the configuration: the journal (first: a bad state dir stops
us before the fleet is touched), the fleet, the coordination Redis (lease, fence, published status, and the copy of
the journal held by the fleet), and for each run session its runner, given the sink its events go to. The headless
commands, the console and the demo all build through here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import redis
from celery import Celery

from celeryops.adapters.fleet import Fleet
from celeryops.core.config import Config
from celeryops.core.errors import UserError
from celeryops.core.events import Event
from celeryops.ops.access.probe import require_login
from celeryops.ops.journal import DAY, DEFAULT_TTL, FleetStore, Journal, journal_path

if TYPE_CHECKING:  # a session's parts load with the first session: the console's first look reads the fleet only
    from celeryops.ops.run.operator import Operator
    from celeryops.ops.run.session import RunSession

CONSOLE_CLIENT_NAME = "celeryops-console"
WATCH_CLIENT_NAME = "celeryops-watch"


def named_redis(url: str, name: str | None = None) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=5, decode_responses=True,
                                client_name=name)


T = TypeVar("T")


@dataclass
class Wiring:
    """What a command or the console works with; ``close()`` closes every connection it opened."""

    config: Config
    fleet: Fleet
    journal: Journal | None  # None: read-only, and no journal yet
    coord: redis.Redis | None
    slots_client: redis.Redis | None
    read_only: bool = False

    @property
    def fleet_name(self) -> str:
        return self.config.run.fleet

    def session(self, operator: Operator, sink: Callable[[Event], None], *, repo: Path | None = None,
                accept_all: bool = False, accept: tuple[str, ...] = ()) -> RunSession:
        """A run session whose events go to ``sink`` (and to the published status while it holds the run); warnings
        accepted up front: ``accept_all``, or these check ids and the config's. The journal's warnings (a record the
        fleet's Redis did not take) go to the newest session: the one that writes."""
        from celeryops.ops.run.runner import Runner
        from celeryops.ops.run.session import RunSession

        assert self.journal is not None, "a session needs the journal"
        runner = Runner(fleet=self.fleet, journal=self.journal, fleet_name=self.fleet_name, on_event=sink,
                        read_only=self.read_only, coord=self.coord, settings=self.config.run)
        if not self.read_only:
            self.journal.on_warning = runner.journal_warning
        return RunSession(runner, self.config, operator, repo=repo or Path.cwd(), accept_all=accept_all,
                          accepted=frozenset((*accept, *self.config.preflight.accept)))

    async def read_coord(self, read: Callable[[redis.Redis, str], T], *unreadable: type[Exception]) -> T | None:
        """``read(coord, fleet)`` on a thread; None when there is no coordination Redis, or when it fails with a
        Redis error or one of ``unreadable`` (what the console shows is then "nothing published")."""
        if self.coord is None:
            return None
        errors: tuple[type[Exception], ...] = (redis.RedisError, *unreadable)
        try:
            return await asyncio.to_thread(read, self.coord, self.fleet_name)
        except errors:
            return None

    def require_login(self) -> None:
        """Raise :class:`~celeryops.ops.access.probe.LoginRefused` (and close everything) when the fleet's Redis
        refuses the login of the URL's user (a wrong password in --broker, say), before anything is read."""
        try:
            for client in {id(c): c for c in (self.coord, self.slots_client) if c is not None}.values():
                require_login(client)
        except UserError:
            self.close()
            raise

    def close(self) -> None:
        for client in {id(c): c for c in (self.coord, self.slots_client) if c is not None}.values():
            with contextlib.suppress(Exception):
                client.close()
        self.fleet.close()
        if self.journal is not None:
            self.journal.close()


def wire(app: Celery, config: Config, *, read_only: bool = False, client_name: str | None = None,
         journal: bool = True) -> Wiring:
    """Everything for the fleet of ``app``. Read-only (watch mode): the journal is opened read-only (if it exists;
    not at all without ``journal``: ``celeryops doctor`` touches no file) and every Redis connection is named
    ``celeryops-watch`` (or ``client_name``) so a MONITOR log can tell them apart."""
    name = client_name or (WATCH_CLIENT_NAME if read_only else None)
    if read_only:
        options = dict(app.conf.broker_transport_options or {})
        options.setdefault("client_name", name)
        app.conf.broker_transport_options = options
        path = journal_path(config.state_dir)
        opened: Journal | None = Journal(path, read_only=True) if journal and path.exists() else None
    else:
        opened = Journal(state_dir=config.state_dir)
    fleet = Fleet(app)
    coord_at = config.run.coordination_url(fleet.broker_url)
    slots_at = config.run.slots_url(fleet.broker_url)
    coord = named_redis(coord_at, name) if coord_at else None
    slots_client = coord if slots_at == coord_at else (named_redis(slots_at, name) if slots_at else None)
    fleet_id = config.run.fleet
    if coord is not None and opened is not None:
        # The journal is held by the fleet too: any machine with the broker can finish or undo its open runs.
        opened.fleet_store = FleetStore(coord, fleet_id, ttl=max(DEFAULT_TTL, config.run.fence_parked_ttl + DAY))
    if coord is not None:
        # The fence plugin's registry is a membership source: it lists plugin workers even while they are busy.
        fleet.extra_members.append(lambda: _plugin_members(coord, fleet_id))
        # ... and its heartbeats are evidence: an expired one says the worker is gone (membership by evidence).
        fleet.heartbeat_sources.append(lambda: _plugin_heartbeats(coord, fleet_id))
    return Wiring(config, fleet, opened, coord, slots_client, read_only)


async def _plugin_members(coord: redis.Redis, fleet: str) -> set[str]:
    from celeryops.fence import plugin_workers

    return set(await asyncio.to_thread(plugin_workers, coord, fleet))


async def _plugin_heartbeats(coord: redis.Redis, fleet: str) -> dict[str, bool]:
    from celeryops.fence import heartbeat_states

    return await asyncio.to_thread(heartbeat_states, coord, fleet)
