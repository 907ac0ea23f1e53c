"""Whether a Celery worker's pool forks from the worker's main process (worker side: stdlib only, the pool is
duck-typed).

A prefork pool forks its children from the worker's main process when it starts and each time it replaces one
(``worker_max_tasks_per_child``, a child that died, a pool restart): a thread alive there at a fork may hold a lock
(logging's, a Redis client's connection pool) that then stays held forever in the child, where a task that loads,
say, torch in ``worker_process_init`` deadlocks. So in a pool that forks, the worker plugins (fence, slots) do their
periodic work on the worker's event loop (the consumer's timer, the hub), and start threads only where no fork
follows: the solo and threads pools, and the green ones (gevent, eventlet).
"""

from __future__ import annotations

IN_PROCESS_POOLS = frozenset({"celery.concurrency.solo", "celery.concurrency.thread"})


def pool_forks(pool: object) -> bool:
    """True unless ``pool`` (a worker's ``TaskPool``, or a subclass of one) runs its tasks in the worker's own process:
    solo, threads, gevent, eventlet. A pool this does not know is taken to fork."""
    if getattr(pool, "is_green", False):
        return False
    return not any(cls.__module__ in IN_PROCESS_POOLS for cls in type(pool).__mro__)


# What a worker plugin's Redis call may cost the event loop at most: a connection to make, then a reply to wait for;
# neither is retried after a timeout (a refused or reset connection is retried once, at once: a stale pooled
# connection after a Redis restart).
LOOP_CONNECT_TIMEOUT = 1.0
LOOP_REPLY_TIMEOUT = 0.5
