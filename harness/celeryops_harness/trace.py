"""A bursty trace of long tasks (what an autoscaler is for) and the producer that plays it (issue 36).

:meth:`BurstTrace.draw` draws, from a seed alone, bursts of tasks of 30-120 s sent close together, separated by idle
gaps longer than an autoscaler's cool-down, so that every burst makes a pool scale out and every gap lets it scale
in. Every duration (send times, task lengths, gaps) is multiplied by ``scale``, so a trace of 20 minutes plays in
a few at ``scale=0.2``: whoever reports on it must say so, and scale the scaler's own durations (poll interval,
cool-down, Cloud Run's SIGTERM-to-SIGKILL grace) by the same factor.

:class:`TraceProducer` sends each task at its time (``celeryops.testing.sleep`` of its length), writing its send
time in the task's record first (:func:`celeryops_harness.taskapp.send_recorded`), so that the wait from send to
start and what became of every task can be read back from the records.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis


@dataclass(frozen=True)
class TraceTask:
    """One task: sent ``at`` seconds after the trace starts, running ``seconds`` (both scaled)."""

    at: float
    seconds: float


@dataclass(frozen=True)
class BurstTrace:
    """Bursts of long tasks with idle gaps, scaled by ``scale`` (see the module docstring)."""

    seed: int
    scale: float
    bursts: tuple[tuple[TraceTask, ...], ...]

    @classmethod
    def draw(cls, seed: int, scale: float = 1.0, *, bursts: int = 3, size: tuple[int, int] = (3, 9),
             spread: float = 20.0, task: tuple[float, float] = (30.0, 120.0), gap: tuple[float, float] = (150.0, 270.0),
             lead: float = 5.0) -> BurstTrace:
        """``bursts`` bursts of ``size`` tasks (inclusive range) of ``task`` seconds each, sent within ``spread``
        seconds of the burst's start; the next burst starts ``gap`` seconds after the previous one's last send;
        the first ``lead`` seconds after the start (all before scaling)."""
        rng = random.Random(f"burst-trace:{seed}")
        out: list[tuple[TraceTask, ...]] = []
        start = lead
        for _ in range(bursts):
            sends = sorted(start + rng.uniform(0.0, spread) for _ in range(rng.randint(*size)))
            out.append(tuple(TraceTask(round(at * scale, 3), round(rng.uniform(*task) * scale, 3)) for at in sends))
            start = sends[-1] + rng.uniform(*gap)
        return cls(seed, scale, tuple(out))

    @property
    def tasks(self) -> list[TraceTask]:
        return [t for burst in self.bursts for t in burst]

    @property
    def length(self) -> float:
        """Seconds (scaled) from the start until the last task could end if it started at once."""
        return max(t.at + t.seconds for t in self.tasks)

    @property
    def work(self) -> float:
        """Task-seconds (scaled) in the whole trace."""
        return sum(t.seconds for t in self.tasks)

    def describe(self) -> str:
        sizes = "+".join(str(len(b)) for b in self.bursts)
        return (f"{len(self.tasks)} tasks in {len(self.bursts)} bursts ({sizes}), {self.work / self.scale / 60:.0f} "
                f"task-minutes, {self.length / self.scale / 60:.1f} minutes long (seed {self.seed})")


class TraceProducer:
    """Plays ``trace`` on ``queue``: each task sent at its time (``task`` with ``(seconds, tag)``), its send time
    written in the record Redis (``record``) first. ``ids`` in send order; ``started_at``: when it started
    (``time.time()``, the record Redis's clock on this machine); ``done`` is set once every task was sent."""

    def __init__(self, broker: str, record: str, queue: str, task: Any, trace: BurstTrace) -> None:
        self.broker, self.record, self.queue, self.task, self.trace = broker, record, queue, task, trace
        self.ids: list[str] = []
        self.started_at = 0.0
        self.done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="trace-producer")

    def start(self) -> TraceProducer:
        self.started_at = time.time()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        from celeryops_harness.taskapp import send_recorded

        client = redis.Redis.from_url(self.record)
        t0 = time.monotonic()
        try:
            with self.task.app.connection_for_write(self.broker) as conn:
                for i, item in enumerate(self.trace.tasks):
                    if self._stop.wait(max(0.0, t0 + item.at - time.monotonic())):
                        return
                    self.ids.append(send_recorded(self.task, (item.seconds, f"t{i}"), self.queue, conn, client))
        finally:
            client.close()
            self.done.set()
