"""The ``node_names`` preflight check: no two worker processes answer under one node name.

celeryops counts, observes and addresses workers by their Celery node name (``cancel_consumer`` to
``destination=[name]``, inspect replies by name, the fence registry by name). On Cloud Run every instance's hostname
is ``localhost``, so a worker with the default name is ``celery@localhost`` on every instance of every revision: a
stop meant for the old revision would reach the new one too, and two instances' tasks would count as one worker's.
The fence plugin renames such a worker at start (``celery@<revision>.<instance>``); workers without it (or with an
older plugin, or a non-unique ``-n``) still share names, and this check fails before anything is stopped.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict

from celery import Celery

from celeryops.core.errors import BrokerUnreachable
from celeryops.ops.preflight.framework import Check, CheckResult

CHECK_ID = "node_names"
TITLE = "Each worker has a node name of its own"


def shared_names(replies: list[tuple[str, str]]) -> dict[str, Counter[str]]:
    """``(node name, revision)`` per answering worker process -> the names answered more than once, with how many
    processes of each revision (``""``: the worker does not say) answered under them. Pure."""
    by_name: dict[str, Counter[str]] = defaultdict(Counter)
    for name, revision in replies:
        by_name[name][revision] += 1
    return {name: revs for name, revs in sorted(by_name.items()) if sum(revs.values()) > 1}


def describe(shared: dict[str, Counter[str]], limit: int = 3) -> str:
    """``3 workers answer as celery@localhost (2 of revision worker-00001-abc, 1 that names no revision)``."""
    parts = []
    for name, revisions in list(shared.items())[:limit]:
        each = ", ".join(f"{n} of revision {rev}" if rev else f"{n} that name{'s' if n == 1 else ''} no revision"
                         for rev, n in sorted(revisions.items()))
        parts.append(f"{sum(revisions.values())} workers answer as {name} ({each})")
    more = f" and {len(shared) - limit} more shared name(s)" if len(shared) > limit else ""
    return "; ".join(parts) + more


def node_names_check(app: Celery, *, timeout: float = 1.0) -> Check:
    """fail: two or more worker processes answer under one node name (see the module); ok otherwise."""

    async def run() -> CheckResult:
        from celeryops.fence.control import every_reply

        try:
            replies = await asyncio.to_thread(every_reply, app, timeout)
        except BrokerUnreachable as err:
            return CheckResult(CHECK_ID, TITLE, "fail", str(err), "start the broker or fix --broker / -A")
        shared = shared_names([(r.worker, r.revision) for r in replies])
        if not shared:
            return CheckResult(CHECK_ID, TITLE, "ok", f"all {len(replies)} worker(s) that answer have a node name "
                               "of their own")
        revisions = {rev for revs in shared.values() for rev in revs}
        across = " of different revisions" if len(revisions) > 1 else ""
        return CheckResult(
            CHECK_ID, TITLE, "fail",
            f"{describe(shared)}: celeryops tells workers{across} apart by node name, so a stop meant for one of "
            "them would reach all of them and their tasks would count as one worker's; nothing was stopped",
            "install celeryops.fence in the worker app (on Cloud Run it names each instance "
            "celery@<revision>.<instance> by itself), or start each worker with a unique -n, then run preflight "
            "again")

    return Check(CHECK_ID, TITLE, run, timeout=15)
