"""Workers stranded by a broker reconnect after a restore (the README's first known limitation).

Celery 5.6 forgets a queue that was cancelled with ``cancel_consumer`` and added back with ``add_consumer`` (how
every restore works) the next time the worker reconnects to its broker (celery/celery#987, #1048): the consumer is
rebuilt without it. A worker with the ``celeryops.fence`` plugin puts it back by itself; a plain worker then
consumes nothing although the run's restore confirmed its queues back. Pure: the run's journal and what each worker
consumes now in, the stranded workers out. The remedy that works is the restore again (``celeryops abort`` with no
open run, X on the console's home view), or a restart of the worker when it drops back at every reconnect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from celeryops.ops.journal import ADD_CONSUMERS, ALL_WORKERS, Run

REMEDY = ("a broker reconnect made Celery forget the restored queues (celery/celery#987); the restore again puts "
          "them back (`celeryops abort`, or X on the console's home view), a restart of the worker if it drops back "
          "at the next reconnect, and `celeryops.fence` in the worker app for good")


@dataclass(frozen=True)
class Stranded:
    """A live worker that consumes nothing since ``run_id``'s restore gave it ``queues`` back at ``restored_at``."""

    worker: str
    queues: tuple[str, ...]
    run_id: str
    restored_at: float


def last_restore(run: Run) -> tuple[dict[str, tuple[str, ...]], float] | None:
    """What the run's latest settled restore was to give back, per worker (the broadcast entry left out; also the
    workers it left out as gone, which may only have been reconnecting), and when; None when it restored nothing."""
    for rec in reversed(run.records):
        if rec.kind != "settle" or rec.intent != ADD_CONSUMERS:
            continue
        intent = next((r for r in run.records if r.seq == rec.settles), None)
        add = (intent.payload.get("add") if intent is not None else None) or {}
        back = {str(w): tuple(sorted(set(map(str, qs)))) for w, qs in add.items()
                if w != ALL_WORKERS and isinstance(qs, list)}
        return {w: qs for w, qs in back.items() if qs}, rec.at
    return None


def stranded(run: Run | None, consuming: Mapping[str, tuple[str, ...]]) -> tuple[Stranded, ...]:
    """The workers ``run``'s last restore gave queues back to that answered now (``consuming``: worker -> the queues
    it consumes, for the workers that replied) and consume nothing at all: dropped back by a reconnect."""
    if run is None or not run.finished:
        return ()
    found = last_restore(run)
    if found is None:
        return ()
    back, at = found
    return tuple(Stranded(w, qs, run.id, at) for w, qs in sorted(back.items())
                 if w in consuming and not consuming[w])


def stranded_text(workers: tuple[Stranded, ...]) -> str:
    """``celery@w2 (celery) consumes nothing since run R's restore``, for one or more workers of one run."""
    names = ", ".join(f"{s.worker} ({', '.join(s.queues)})" for s in workers)
    runs = ", ".join(sorted({s.run_id for s in workers}))
    return f"{names} consume{'s' if len(workers) == 1 else ''} nothing since the restore of run {runs}"
