"""The demo's producer: a thread that keeps enqueuing a mix of demo tasks, like an application would.

A mix of short and long tasks, CPU- and GPU-slot-gated tasks, and now and then an ETA task (sent with a countdown),
at a pace set by :class:`~celeryops.demo.timing.Timing`. It pauses while the backlog is above ``max_backlog`` so a
long drain does not pile up an endless queue.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading

import redis
from celery import Celery
from kombu.exceptions import KombuError

from celeryops.demo.tasks import CPU, GPU, LONG, QUEUES, REPORT, SHORT, TASK_QUEUES
from celeryops.demo.timing import Timing

log = logging.getLogger("celeryops.demo")

# (task, weight) of the steady mix; the ETA task is sent every ETA_EVERY tasks.
MIX: tuple[tuple[str, int], ...] = ((SHORT, 50), (LONG, 12), (CPU, 15), (GPU, 10))
ETA_EVERY = 15


def queue_depth(client: redis.Redis, queues: tuple[str, ...] = QUEUES) -> int:
    """Messages waiting in the demo queues (kombu's Redis transport keeps each queue in a list of that name)."""
    pipe = client.pipeline()
    for queue in queues:
        pipe.llen(queue)
    return int(sum(int(n) for n in pipe.execute()))


class Producer:
    """``start()`` seeds a first batch (two long tasks, an ETA task, slot tasks), then enqueues one task per
    ``timing.produce_every`` seconds until ``stop()``."""

    def __init__(self, broker: str, timing: Timing, *, max_backlog: int = 30, seed: int | None = None) -> None:
        self.timing = timing
        self.max_backlog = max_backlog
        self.sent = 0
        self._app = Celery("celeryops-demo-producer", broker=broker, set_as_current=False)
        self._app.conf.broker_connection_retry_on_startup = False
        self._redis = redis.Redis.from_url(broker, socket_timeout=5, socket_connect_timeout=3)
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-producer", daemon=True)

    def duration(self, task: str) -> float:
        span = {SHORT: self.timing.short_task, LONG: self.timing.long_task, REPORT: self.timing.short_task,
                CPU: self.timing.cpu_task, GPU: self.timing.gpu_task}[task]
        return round(self._random.uniform(*span), 2)

    def send(self, task: str, countdown: float | None = None) -> None:
        self._app.send_task(task, args=[self.duration(task)], queue=TASK_QUEUES[task], countdown=countdown)
        self.sent += 1

    def seed_batch(self) -> None:
        for task in (LONG, LONG, SHORT, CPU, GPU, SHORT):
            self.send(task)
        self.send(REPORT, countdown=self._random.uniform(*self.timing.eta_countdown))

    def start(self) -> Producer:
        self.seed_batch()
        self._thread.start()
        return self

    def _run(self) -> None:
        tasks = [t for t, _ in MIX]
        weights = [w for _, w in MIX]
        while not self._stop.wait(self.timing.produce_every):
            try:
                if queue_depth(self._redis) >= self.max_backlog:
                    continue
                if self.sent % ETA_EVERY == ETA_EVERY - 1:
                    self.send(REPORT, countdown=self._random.uniform(*self.timing.eta_countdown))
                else:
                    self.send(self._random.choices(tasks, weights)[0])
            except (redis.RedisError, KombuError, OSError) as exc:  # the sandbox is going away, or Redis hiccups
                log.debug("demo producer: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        with contextlib.suppress(Exception):
            self._app.close()
        self._redis.close()
