"""Membership by evidence (DESIGN decision 4): which known workers are gone, which are only silent.

A known worker that does not answer is *unknown*, never zero, and never assumed dead. It leaves the known set only
when evidence says so:

- its fence plugin heartbeat expired (the plugin beats from a daemon thread, also while a solo pool is busy);
- AMQP: its own pidbox queue has no consumer left (auto-deleted when its connection closed), on ``confirm`` polls
  in a row;
- Redis: no connection listens for it on the control channel any more, on ``confirm`` polls in a row. kombu keeps
  a SIGKILLed worker's pidbox binding, but its pattern subscription went with its connection; a busy (or hung)
  worker keeps its subscription. Subscriptions cannot be told apart by worker, so the count decides only when it
  is unambiguous: listeners <= workers that answered + silent workers alive by heartbeat (every silent worker
  without other evidence of life then has no listener left). Anything else (say one listener short for two silent
  workers, or fewer listeners than workers that answered: shared connections) leaves all of them silent.

It rejoins as soon as it answers again. ``departures`` is the pure judgement; ``Membership`` keeps the state over
polls; ``held_by`` says what held a drain that timed out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from celeryops.adapters.fleet import Fleet
from celeryops.core.events import DrainProgress

HEARTBEAT = "its fence plugin heartbeat expired"
PIDBOX_QUEUE = "its control queue on the broker has no consumer any more (its connection closed)"
NO_LISTENER = "no connection listens for it on the broker's control channel any more (its connection closed)"
BINDING = "its pidbox binding was removed (it shut down)"


@dataclass(frozen=True)
class Evidence:
    """What the broker and the plugin registry say this poll. ``listeners``: Redis only (None elsewhere or unknown);
    ``heartbeats``: name -> live (True) / expired (False); ``pidbox``: AMQP, name -> consumers on its pidbox queue."""

    listeners: int | None = None
    heartbeats: dict[str, bool] = field(default_factory=dict)
    pidbox: dict[str, int | None] = field(default_factory=dict)


def departures(silent: Iterable[str], replied: Iterable[str], evidence: Evidence) -> dict[str, str]:
    """The silent workers whose evidence says they are gone, each with the evidence. Pure."""
    silent = set(silent)
    gone: dict[str, str] = {}
    for name in sorted(silent):
        if evidence.heartbeats.get(name) is False:
            gone[name] = HEARTBEAT
        elif evidence.pidbox.get(name) == 0:
            gone[name] = PIDBOX_QUEUE
    alive = {n for n in silent if evidence.heartbeats.get(n)}
    rest = silent - set(gone) - alive
    answered = len(set(replied))
    # Fewer listeners than workers that answered: connections are shared (not one per worker), so the count
    # says nothing about who is gone.
    if rest and evidence.listeners is not None and answered <= evidence.listeners <= answered + len(alive):
        gone.update({name: NO_LISTENER for name in sorted(rest)})
    return gone


async def gone_now(fleet: Fleet, silent: Iterable[str], replied: Iterable[str], before: int | None,
                   since: float | None = None) -> dict[str, str]:
    """One reading of the evidence for ``silent`` workers (``before``: listeners read before their silence was seen),
    for a restore from a fresh process: a worker gone by evidence is not addressed (nor reported missing).
    ``since``: when the run began (a Redis restarted since gives no listener evidence for a while)."""
    silent = sorted(set(silent))
    if not silent:
        return {}
    heartbeats, after, pidbox = await asyncio.gather(fleet.heartbeats(), fleet.pidbox_listeners(since),
                                                     fleet.pidbox_consumers(silent, since))
    listeners = None if before is None or after is None else max(before, after)
    return departures(silent, replied, Evidence(listeners=listeners, heartbeats=heartbeats, pidbox=pidbox))


def alive_by_heartbeat(silent: Iterable[str], evidence: Evidence) -> tuple[str, ...]:
    return tuple(sorted(n for n in silent if evidence.heartbeats.get(n)))


@dataclass
class Membership:
    """Evidence over polls. Heartbeat evidence counts at once (the heartbeat's TTL is its grace); broker evidence
    must hold on ``confirm`` polls in a row (a worker that reconnects, or a count read between a worker's reply and
    its death, does not make anyone gone)."""

    confirm: int = 2
    silent_since: dict[str, float] = field(default_factory=dict)
    suspects: dict[str, int] = field(default_factory=dict)
    gone: dict[str, str] = field(default_factory=dict)

    def update(self, now: float, silent: Iterable[str], replied: Iterable[str],
               evidence: Evidence) -> tuple[dict[str, str], set[str]]:
        """One poll: ``silent`` known workers that did not answer (not yet gone), ``replied`` every worker that
        answered. Returns (newly gone with their evidence, rejoined: gone workers that answered again)."""
        silent, replied = set(silent), set(replied)
        rejoined = {n for n in replied if n in self.gone}
        for name in rejoined:
            del self.gone[name]
        for name in replied:
            self.silent_since.pop(name, None)
            self.suspects.pop(name, None)
        for name in silent:
            self.silent_since.setdefault(name, now)
        found = departures(silent, replied, evidence)
        for name in set(self.suspects) - set(found):
            del self.suspects[name]
        newly: dict[str, str] = {}
        for name, why in found.items():
            self.suspects[name] = self.suspects.get(name, 0) + 1
            if why == HEARTBEAT or self.suspects[name] >= self.confirm:
                newly[name] = why
        for name, why in newly.items():
            self.gone[name] = why
            self.suspects.pop(name, None)
            self.silent_since.pop(name, None)
        return newly, rejoined

    def left(self, names: Iterable[str], why: str = BINDING) -> None:
        for name in names:
            self.gone[name] = why
            self.silent_since.pop(name, None)
            self.suspects.pop(name, None)

    def silent_for(self, names: Iterable[str], now: float) -> dict[str, float]:
        return {n: round(max(0.0, now - self.silent_since.get(n, now)), 1) for n in sorted(names)}


def remedy(name: str) -> str:
    return (f"{name} does not answer and no evidence says it is gone (a solo pool busy with a long task, a hung "
            f"process, or a worker whose host vanished): the drain waits for it. If it is dead, press F in the "
            f"console, or run the drain again with --forget {name}.")


def consumers_warning(consumers: dict[str, int]) -> str:
    held = ", ".join(f"{q} ({n if n >= 0 else 'unknown'})" for q, n in sorted(consumers.items()) if n != 0)
    return (f"Consumers are still attached to {held} after the stop: a worker busy with a task (a solo pool answers "
            "no control command until it ends) or a consumer outside this fleet; the drain waits for them.")


def held_by(progress: DrainProgress | None) -> str:
    """What kept a drain from its verdict, for the timeout message: tasks, silent workers (named, with the remedy),
    consumers left on AMQP queues."""
    if progress is None:
        return "the first observation"
    parts: list[str] = []
    if progress.active or progress.reserved:
        parts.append(f"tasks still running ({progress.active} active, {progress.reserved} reserved)")
    busy = [n for n in progress.silent if n in progress.alive]
    dead = [n for n in progress.silent if n not in progress.alive]
    if busy:
        parts.append("busy workers that answer nothing (alive by their plugin heartbeat): " + ", ".join(busy))
    if dead:
        parts.append("silent workers: " + ", ".join(f"{n} (silent {progress.silent[n]:.0f}s)" for n in dead)
                     + " — if one is dead, run again with " + " ".join(f"--forget {n}" for n in dead))
    held = {q: n for q, n in progress.consumers.items() if n != 0}
    if held:
        parts.append("consumers still on " + ", ".join(f"{q} ({n if n >= 0 else '?'})"
                                                       for q, n in sorted(held.items())))
    unexplained = [n for n in progress.unknown if n not in progress.silent]
    if unexplained:
        parts.append("workers that did not answer: " + ", ".join(unexplained))
    return "; ".join(parts) if parts else "the empty streak (the last polls were not all empty)"
