"""Putting a drain's stopped consumers back: every queue of the stop record that a worker does not consume now is
added back, then checked with ``active_queues`` (idempotent: what recovery runs too, on an interrupted run's record).

Workers gone by evidence are not addressed; a broker that does not answer, and a worker that has not confirmed its
consumers yet, are asked again for a patience (:data:`RESTORE_PATIENCE`) before the restore gives up or reports
itself unverified: stopped consumers must not stay stopped over a blip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from celeryops.adapters.fleet import Fleet
from celeryops.core.errors import BrokerUnreachable
from celeryops.core.events import ConsumersRestored, Notice
from celeryops.core.wording import consumers as consumers_text
from celeryops.ops.drain.membership import gone_now
from celeryops.ops.drain.retry import keep_trying

__all__ = ["BROADCAST", "RESTORE_PATIENCE", "broker_wait_notice", "restore_consumers", "unconfirmed_wait_notice"]

BROADCAST = "*"  # in a stop record: queues to restore on workers whose own queues were never seen
RESTORE_PATIENCE = 30.0  # seconds a restore keeps trying while the broker or a worker does not answer


async def restore_consumers(fleet: Fleet, record: dict[str, tuple[str, ...]], *, known: Iterable[str] = (),
                            exclude: Iterable[str] = (), attempts: int = 3, patience: float = RESTORE_PATIENCE,
                            on_wait: Callable[[Notice], None] | None = None,
                            since: float | None = None) -> ConsumersRestored:
    """Add back every queue in ``record`` (worker -> queues; ``"*"`` -> queues for workers whose own queues were
    never seen) that the worker does not consume now, then verify with active_queues. Idempotent. ``exclude``:
    workers known to be gone (forgotten, or left the fleet), never addressed.

    A broker that does not answer (a restart, a failover) is tried again for ``patience`` seconds before the
    restore gives up with :class:`BrokerUnreachable`: stopped consumers must not stay stopped over a blip. A worker
    that has not confirmed its consumers (slow to answer on a loaded machine, or busy) is asked again within the same
    patience before the restore is reported unverified. ``on_wait`` hears, once for each, why the restore takes
    longer. ``since``: when the run began (see ``Fleet.pidbox_listeners``: a worker still reconnecting after a Redis
    restart is not gone)."""
    restored: dict[str, tuple[str, ...]] = {}  # over every round: what was sent back, whichever round confirmed it

    def broker_waits(exc: BrokerUnreachable) -> None:
        if on_wait is not None:
            on_wait(broker_wait_notice(exc, patience))

    def worker_waits(event: ConsumersRestored) -> None:
        if on_wait is not None:
            on_wait(unconfirmed_wait_notice(event, patience))

    return await keep_trying(lambda: _restore_once(fleet, record, restored, known=known, exclude=exclude,
                                                   attempts=attempts, since=since),
                             BrokerUnreachable, patience, broker_waits,
                             until=lambda event: event.verified, on_first_miss=worker_waits)


async def _restore_once(fleet: Fleet, record: dict[str, tuple[str, ...]], restored: dict[str, tuple[str, ...]], *,
                        known: Iterable[str], exclude: Iterable[str], attempts: int,
                        since: float | None) -> ConsumersRestored:
    broadcast = set(record.get(BROADCAST, ()))
    skip = set(exclude)
    per_worker = {w: set(qs) for w, qs in record.items() if w != BROADCAST and w not in skip}
    members = (set(known) | await fleet.members()) - skip
    for name in members - set(per_worker):
        per_worker[name] = set(broadcast)  # appeared since: its own queues were never recorded
    missing: dict[str, tuple[str, ...]] = {}
    before = await fleet.pidbox_listeners(since)
    for attempt in range(attempts):
        current = await fleet.active_queues(sorted(per_worker)) if per_worker else {}
        if attempt == 0:  # workers gone by evidence (SIGKILLed, their bindings stay) are not addressed
            for name in await gone_now(fleet, set(per_worker) - set(current), current, before, since):
                del per_worker[name]
        missing = {}
        for worker, queues in per_worker.items():
            if worker not in current:
                if queues:
                    missing[worker] = tuple(sorted(queues))
                continue
            lacking = queues - set(current[worker])
            if lacking:
                missing[worker] = tuple(sorted(lacking))
        if not missing:
            break
        for worker, lacking_queues in missing.items():
            for queue in lacking_queues:
                await fleet.add_consumer(queue, destination=[worker], reply=True)
            restored[worker] = tuple(sorted(set(restored.get(worker, ())) | set(lacking_queues)))
    else:
        final = await fleet.active_queues(sorted(per_worker)) if per_worker else {}
        missing = {w: tuple(sorted(qs - set(final.get(w, ())))) for w, qs in per_worker.items()
                   if qs - set(final.get(w, ()))}
    return ConsumersRestored(restored=dict(restored), verified=not missing, missing=missing)


def broker_wait_notice(exc: BrokerUnreachable, patience: float) -> Notice:
    return Notice(level="warning", message=f"The broker does not answer ({exc}); the consumers are still stopped: "
                                           f"the restore keeps trying ({patience:g} s in all).")


def unconfirmed_wait_notice(event: ConsumersRestored, patience: float) -> Notice:
    return Notice(level="info", message=f"Not confirmed back yet: {consumers_text(event.missing)} (a busy or slow "
                                        f"worker answers late); the restore keeps asking ({patience:g} s in all).")
