"""The demo's Celery tasks, and :func:`create_app`, which builds the worker app with or without the fence plugin.

Two worker "images" use it: :mod:`celeryops.demo.worker_fenced` (``fence.install``) and
:mod:`celeryops.demo.worker_plain` (no plugin), so the drain shows both ways of stopping a worker. Every task takes
its duration as an argument (the producer scales it by ``--speed``) and sleeps in small steps, so a warm shutdown
waits for it like for real work. Each run counts itself in Redis (``demo:runs:<task id>``, ``demo:started``,
``demo:finished``).

Worker environment: ``CELERYOPS_DEMO_BROKER`` (the sandbox Redis), ``CELERYOPS_DEMO_FENCE_INTERVAL`` (seconds),
``CELERYOPS_FLEET`` and the slots contract (``CELERYOPS_SLOTS_CPU``/``_GPU``/``_DETECT``/``_RETRY_COUNTDOWN``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery, Task

from celeryops import fence, slots

QUEUE_DEFAULT = "default"
QUEUE_HEAVY = "heavy"
QUEUES = (QUEUE_DEFAULT, QUEUE_HEAVY)
RUN_TTL = 3600

SHORT = "demo.short"
LONG = "demo.long"
REPORT = "demo.report"  # the ETA task
CPU = "demo.cpu_render"
GPU = "demo.gpu_infer"
TASK_QUEUES = {SHORT: QUEUE_DEFAULT, LONG: QUEUE_DEFAULT, REPORT: QUEUE_DEFAULT, CPU: QUEUE_HEAVY, GPU: QUEUE_HEAVY}

_client: redis.Redis | None = None


def _redis(app: Celery) -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(str(app.conf.broker_url), socket_timeout=5)
    return _client


def _work(task: Task[Any, Any], seconds: float) -> float:
    """Count the run, sleep ``seconds`` in small steps, count the finish."""
    client = _redis(task.app)
    key = f"demo:runs:{task.request.id}"
    pipe = client.pipeline()
    pipe.incr(key)
    pipe.expire(key, RUN_TTL)
    pipe.incr("demo:started")
    pipe.execute()
    deadline = time.monotonic() + max(0.0, float(seconds))
    while time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    client.incr("demo:finished")
    return float(seconds)


def create_app(*, fenced: bool, broker: str | None = None) -> Celery:
    """The demo worker app on ``broker`` (default ``$CELERYOPS_DEMO_BROKER``), with the fence plugin if ``fenced``.
    Slot totals come from ``CELERYOPS_SLOTS_*`` (the sandbox sets cpu and gpu)."""
    url = broker or os.environ.get("CELERYOPS_DEMO_BROKER", "redis://127.0.0.1:6379/0")
    app = Celery("celeryops_demo", broker=url, set_as_current=True)
    app.conf.update(
        task_acks_late=False,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_ignore_result=True,
        result_backend=None,
        task_default_queue=QUEUE_DEFAULT,
        task_routes={name: {"queue": queue} for name, queue in TASK_QUEUES.items()},
        broker_transport_options={"visibility_timeout": 3600},
        # As `celery worker -E`: the canary credits task outcomes from task events, and the demo's workers run
        # without heartbeats, so `enable_events` alone would not turn them on.
        worker_send_task_events=True,
    )
    slots.install(app)
    if fenced:
        fence.install(app, interval=float(os.environ.get("CELERYOPS_DEMO_FENCE_INTERVAL", "2.0")))

    @app.task(bind=True, name=SHORT)
    def short(self: Task[Any, Any], seconds: float = 1.0) -> float:
        """A quick job (an e-mail, a thumbnail)."""
        return _work(self, seconds)

    @app.task(bind=True, name=LONG)
    def long(self: Task[Any, Any], seconds: float = 30.0) -> float:
        """A long job (a report, an export): the reason a deploy must drain instead of killing."""
        return _work(self, seconds)

    @app.task(bind=True, name=REPORT)
    def report(self: Task[Any, Any], seconds: float = 1.0) -> float:
        """Sent with a countdown: it waits in a worker's timer (an ETA task) until it is due."""
        return _work(self, seconds)

    @app.task(bind=True, base=slots.SlotTask, slots={"cpu": 2}, name=CPU)
    def cpu_render(self: Task[Any, Any], seconds: float = 5.0) -> float:
        """Holds 2 cpu slots while it runs."""
        return _work(self, seconds)

    @app.task(bind=True, base=slots.SlotTask, slots={"gpu": 1}, name=GPU)
    def gpu_infer(self: Task[Any, Any], seconds: float = 8.0) -> float:
        """Holds the gpu slot while it runs."""
        return _work(self, seconds)

    return app
