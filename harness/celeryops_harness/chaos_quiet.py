"""Kill a worker or crash the broker only once no message is on its way to a worker (kombu#305).

kombu's Redis transport takes a message off its queue (BRPOP) and records it in ``unacked`` in a later round trip:
for that moment the message is only in the memory of the worker that popped it, so a worker SIGKILLed then, or a
broker that crashes then, loses it whatever celeryops does (README, "Known limitations"). celeryops controls none
of that window, so a trial keeps its kills out of it: its producers pause (the caller holds the trial's broker
lock), the workers whose death or whose broker's death is the fault are stopped (SIGSTOP, waited for: a stopped
worker pops nothing), and the fault fires only when every task sent is accounted for: in a queue, in ``unacked``,
received by a worker (its log), or started (the record Redis). Otherwise the workers go on (SIGCONT) and it is
checked again, up to QUIET_DEADLINE; a task still nowhere then is not in transit but gone, and the fault does not
fire (the trial's report says so, and its verdict finds the task lost).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import redis

from celeryops_harness.chaos_verdict import received_by, redis_held
from celeryops_harness.workers import WorkerProcess

QUIET_DEADLINE = 15.0  # s to wait for every sent task to be accounted for


def unaccounted(ids: Iterable[str], record: redis.Redis, broker_url: str, queue: str,
                workers: Iterable[WorkerProcess]) -> list[str]:
    """The ids, among ``ids``, that are nowhere a SIGKILL would leave them: not queued, not unacked, not received
    by any of ``workers``, not started."""
    ids = list(ids)
    held = redis_held(broker_url, queue)
    received = received_by(workers)
    pipe = record.pipeline()
    for tid in ids:
        pipe.exists(f"ct:run:{tid}")
    started = pipe.execute()
    return [t for t, ran in zip(ids, started, strict=True) if not ran and t not in held and t not in received]


@contextlib.contextmanager
def quiet(workers: list[WorkerProcess], missing: Callable[[], list[str]], deadline: float = QUIET_DEADLINE,
          on_wait: Callable[[], None] = lambda: None) -> Iterator[list[str]]:
    """Stop ``workers`` until ``missing()`` (what is unaccounted for) is empty, then yield ``[]`` with them stopped:
    fire the fault now. At the deadline, yield what is still missing (the fault must not fire). ``on_wait``: called
    each time something was missing (the fault held back). The workers left alive go on afterwards."""
    end = time.monotonic() + deadline
    try:
        while True:
            freeze(workers)
            left = missing()
            if not left or time.monotonic() > end:
                break
            on_wait()
            thaw(workers)
            time.sleep(0.05)
        yield left
    finally:
        thaw(workers)


def freeze(workers: Iterable[WorkerProcess], timeout: float = 5.0) -> None:
    """SIGSTOP each worker's process group and wait until its main process is stopped."""
    workers = [w for w in workers if w.alive()]
    for w in workers:
        w.signal(signal.SIGSTOP)
    end = time.monotonic() + timeout
    for w in workers:
        while w.alive() and not _stopped(w.pid) and time.monotonic() < end:
            time.sleep(0.002)


def thaw(workers: Iterable[WorkerProcess]) -> None:
    for w in workers:
        w.signal(signal.SIGCONT)  # a dead one is skipped


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")
