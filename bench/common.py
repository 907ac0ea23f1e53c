"""Small helpers shared by the benchmarks in bench/: timing with repeats (median and p95), a plain-text table,
and a private redis-server with N real Celery workers (``celeryops_harness.workers.WorkerProcess``).

Benchmarks measure speed and print tables; they are not tests and assert nothing about durations.
"""

from __future__ import annotations

import math
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from celery import Celery

from celeryops.demo.standins.redis_server import RedisServer
from celeryops_harness.workers import WorkerProcess


@dataclass(frozen=True)
class Timing:
    """Wall times (seconds) of the repeats of one measured call."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p95(self) -> float:
        """Nearest-rank 95th percentile (with few repeats this is the slowest or second slowest)."""
        ordered = sorted(self.samples)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]

    @property
    def best(self) -> float:
        return min(self.samples)


def measure(call: Callable[[], object], repeats: int, warmup: int = 1) -> Timing:
    """Run ``call`` ``warmup`` times unmeasured (connections opened, code paths warm), then ``repeats`` times."""
    for _ in range(warmup):
        call()
    samples: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return Timing(tuple(samples))


def measure_interleaved(calls: Mapping[str, Callable[[], object]], repeats: int,
                        warmup: int = 1) -> dict[str, Timing]:
    """Like ``measure`` for several calls, taken in turns (a, b, c, a, b, c, ...) so that a burst of load on a
    shared machine hits every contender alike and the ratios stay fair."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - t0)
    return {name: Timing(tuple(values)) for name, values in samples.items()}


def ms(seconds: float) -> str:
    """Seconds as milliseconds, 3 significant-ish digits."""
    value = seconds * 1000
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}x" if b > 0 else "n/a"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str = "") -> str:
    """A fixed-width text table: first column left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    out = [title] if title else []
    out += [line(cells[0]), "  ".join("-" * w for w in widths), *(line(r) for r in cells[1:])]
    return "\n".join(out)


def control_app(broker: str) -> Celery:
    """A Celery app for sending remote-control commands to the bench workers (no tasks of its own)."""
    app = Celery("celeryops_bench_control", broker=broker)
    app.conf.broker_connection_retry_on_startup = True
    app.conf.broker_connection_timeout = 5
    return app


@dataclass
class BenchFleet:
    """A private redis-server and the real workers started on it; ``add`` grows the fleet, ``close`` ends all."""

    server: RedisServer
    log_dir: Path
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def broker(self) -> str:
        return self.server.url

    def add(self, n: int, *, own_queue: bool = False, ready_timeout: float = 90.0,
            **kw: object) -> list[WorkerProcess]:
        """Start ``n`` more workers (in parallel) and wait until every one answers ping. With ``own_queue`` worker
        ``bench-<i>`` consumes only the queue ``bench-<i>`` (so a bench can load each worker on purpose)."""
        batch: list[WorkerProcess] = []
        for _ in range(n):
            name = f"bench-{len(self.workers) + len(batch)}"
            extra: dict[str, object] = {"name": name, "queues": [name]} if own_queue else {}
            batch.append(WorkerProcess(self.broker, log_dir=self.log_dir, **kw, **extra).start())
        self.workers.extend(batch)
        app = control_app(self.broker)
        try:
            for worker in batch:
                worker.wait_ready(app, timeout=ready_timeout)
        finally:
            app.close()
        return batch

    def close(self) -> None:
        """SIGKILL every worker's process group at once (bench workers hold no state worth a warm or cold
        shutdown, and a threads-pool worker running long tasks may not exit on SIGQUIT), then reap them."""
        for worker in self.workers:
            worker.signal(signal.SIGKILL)
        for worker in self.workers:
            worker.stop()
        self.workers.clear()
        self.server.close()


@contextmanager
def bench_fleet() -> Iterator[BenchFleet]:
    """A private redis-server (no workers yet); everything started inside is stopped on exit."""
    server = RedisServer().start()
    fleet = BenchFleet(server, Path(tempfile.mkdtemp(prefix="celeryops-bench-")))
    try:
        yield fleet
    finally:
        fleet.close()
