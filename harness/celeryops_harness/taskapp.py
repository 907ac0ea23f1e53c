"""The Celery app the tests, benchmarks and chaos runs start real workers from.

Configured from the environment so that one module serves every broker:
  CELERYOPS_TEST_BROKER            broker URL (redis://... or amqp://...)
  CELERYOPS_TEST_RECORD            Redis URL where tasks record their start/finish (default: the broker if Redis)
  CELERYOPS_TEST_CONTROL_EXCHANGE  remote-control exchange name (isolates test sessions sharing one RabbitMQ)
  CELERYOPS_TEST_PREFETCH          worker_prefetch_multiplier (default 1)
  CELERYOPS_TEST_KEYPREFIX         the Redis transport's global_keyprefix (default: none)
  CELERYOPS_TEST_ACKS_LATE         1: task_acks_late and task_reject_on_worker_lost (default: Celery's, acks early)
  CELERYOPS_TEST_FAIL_RATE         the share of ``work`` tasks this worker fails (0 to 1, default 0): a bad release

Every task run records, in the record Redis:
  ct:run:<id>      hash: name, worker, started, finished (Redis TIME, seconds as float); ``sent`` too when the
                   producer sent it with :func:`send_recorded`
  ct:runs:<id>     counter of starts (a task that ran twice shows 2)
  ct:starts        list of ids in start order;  ct:finishes  list of ids in finish order

A ``work`` task fails (``BadReleaseError``) with the probability CELERYOPS_TEST_FAIL_RATE of the worker that runs it:
given to the instances of a new revision only, it is a bad release (issue 28's canary); without it, ``work`` runs
alike on every revision (a good release). A failure is recorded too: ct:run:<id> gets ``failed`` = 1 and the id goes
to the list ct:failed.

A ``hold`` task runs until the test releases its gate (``release(record_client, gate)`` sets ct:release:<gate>): a
drain a test must catch open stays open however slow the machine is, where a task of N seconds may already be over.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from typing import Any

import redis
from celery import Celery, Task

from celeryops_harness.gates import HOLD_LIMIT, gate_key, release

__all__ = ["HOLD_LIMIT", "app", "gate_key", "release"]  # the gates are importable from here, as they always were

BROKER = os.environ.get("CELERYOPS_TEST_BROKER", "redis://127.0.0.1:6379/0")
RECORD = os.environ.get("CELERYOPS_TEST_RECORD") or (BROKER if BROKER.startswith("redis") else "")

app = Celery("celeryops_testing", broker=BROKER)
app.conf.update(
    task_acks_late=False,
    worker_prefetch_multiplier=int(os.environ.get("CELERYOPS_TEST_PREFETCH", "1")),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_ignore_result=True,
    result_backend=None,
    worker_send_task_events=os.environ.get("CELERYOPS_TEST_EVENTS", "") == "1",
    task_send_sent_event=False,
    broker_transport_options={"visibility_timeout": 3600},
)
if os.environ.get("CELERYOPS_TEST_ACKS_LATE") == "1":  # acknowledged once run: a task cut short goes back to the queue
    app.conf.task_acks_late = True
    app.conf.task_reject_on_worker_lost = True
if os.environ.get("CELERYOPS_TEST_KEYPREFIX"):
    app.conf.broker_transport_options = {**app.conf.broker_transport_options,
                                         "global_keyprefix": os.environ["CELERYOPS_TEST_KEYPREFIX"]}
if os.environ.get("CELERYOPS_TEST_BROKER_HEARTBEAT"):  # AMQP heartbeats: a dead connection found within seconds
    app.conf.broker_heartbeat = float(os.environ["CELERYOPS_TEST_BROKER_HEARTBEAT"])
if os.environ.get("CELERYOPS_TEST_CONTROL_EXCHANGE"):
    app.conf.control_exchange = os.environ["CELERYOPS_TEST_CONTROL_EXCHANGE"]

_record: redis.Redis | None = None


def record() -> redis.Redis:
    global _record
    if _record is None:
        _record = redis.Redis.from_url(RECORD)
    return _record


def _now(r: redis.Redis) -> float:
    sec, usec = r.time()
    return float(sec) + float(usec) / 1e6


redis_now = _now  # the record Redis's clock (Redis TIME), as the task records read it


def send_recorded(task: Task[Any, Any], args: tuple[object, ...], queue: str, connection: Any,
                  client: redis.Redis) -> str:
    """Send ``task`` with ``args`` to ``queue`` on ``connection``, writing ``sent`` (Redis TIME of ``client``, the
    record Redis) in ``ct:run:<id>`` first; returns the id."""
    tid = str(uuid.uuid4())
    client.hset(f"ct:run:{tid}", "sent", _now(client))
    task.apply_async(args=args, task_id=tid, queue=queue, connection=connection)
    return tid


def records(client: redis.Redis, ids: list[str]) -> dict[str, dict[str, Any]]:
    """id -> its ``ct:run:<id>`` fields (strings with a ``decode_responses`` client) and ``runs`` (starts, an int)."""
    pipe = client.pipeline()
    for tid in ids:
        pipe.get(f"ct:runs:{tid}")
        pipe.hgetall(f"ct:run:{tid}")
    raw = pipe.execute()
    return {tid: {**raw[2 * i + 1], "runs": int(raw[2 * i] or 0)} for i, tid in enumerate(ids)}


def mark_start(task: Task[Any, Any]) -> None:
    r = record()
    tid = task.request.id
    pipe = r.pipeline()
    pipe.hset(f"ct:run:{tid}", mapping={"name": task.name, "worker": task.request.hostname or "",
                                         "started": _now(r)})
    pipe.incr(f"ct:runs:{tid}")
    pipe.rpush("ct:starts", tid)
    pipe.execute()


def mark_finish(task: Task[Any, Any]) -> None:
    r = record()
    tid = task.request.id
    pipe = r.pipeline()
    pipe.hset(f"ct:run:{tid}", "finished", _now(r))
    pipe.rpush("ct:finishes", tid)
    pipe.execute()


@app.task(bind=True, name="celeryops.testing.sleep")
def sleep(self: Task[Any, Any], seconds: float = 1.0, tag: str = "") -> str:
    """Run for ``seconds`` (in small steps, so a warm shutdown still waits for it), recording start/finish."""
    mark_start(self)
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    mark_finish(self)
    return tag


@app.task(bind=True, name="celeryops.testing.hold")
def hold(self: Task[Any, Any], gate: str, tag: str = "") -> str:
    """Run until ``gate`` is released in the record Redis (in small steps, like ``sleep``), recording start/finish."""
    mark_start(self)
    r = record()
    deadline = time.monotonic() + HOLD_LIMIT
    while not r.exists(gate_key(gate)) and time.monotonic() < deadline:
        time.sleep(0.05)
    mark_finish(self)
    return tag


@app.task(bind=True, name="celeryops.testing.noop")
def noop(self: Task[Any, Any]) -> None:
    mark_start(self)
    mark_finish(self)


@app.task(bind=True, name="celeryops.testing.until")
def until(self: Task[Any, Any], key: str, limit: float = 300.0) -> None:
    """Run until ``key`` exists in the record Redis (a test says when), at most ``limit`` seconds; recorded."""
    mark_start(self)
    deadline = time.monotonic() + float(limit)
    while not record().exists(key) and time.monotonic() < deadline:
        time.sleep(0.05)
    mark_finish(self)


class CanaryError(Exception):
    """Raised by ``fail`` with ``kind="CanaryError"`` (a type no library raises)."""


@app.task(bind=True, name="celeryops.testing.fail")
def fail(self: Task[Any, Any], kind: str = "ValueError", retries: int = 0) -> None:
    """Raise an exception of type ``kind`` (ValueError, KeyError, CanaryError), after ``retries`` retries (each a
    ``task-retried`` event); recorded like the other tasks."""
    mark_start(self)
    mark_finish(self)
    exc = {"ValueError": ValueError, "KeyError": KeyError, "CanaryError": CanaryError}[kind]("canary test")
    if self.request.retries < retries:
        raise self.retry(exc=exc, countdown=0.1, max_retries=retries)
    raise exc


FAIL_RATE_ENV = "CELERYOPS_TEST_FAIL_RATE"


class BadReleaseError(RuntimeError):
    """Raised by ``work`` on a worker with CELERYOPS_TEST_FAIL_RATE: a type only a bad release raises."""


def fail_rate() -> float:
    """This worker's CELERYOPS_TEST_FAIL_RATE (0 when unset or empty), read at each task: the worker's own env."""
    raw = os.environ.get(FAIL_RATE_ENV, "").strip()
    rate = float(raw) if raw else 0.0
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{FAIL_RATE_ENV} must be between 0 and 1, not {raw!r}")
    return rate


@app.task(bind=True, name="celeryops.testing.work")
def work(self: Task[Any, Any], seconds: float = 0.05, tag: str = "") -> str:
    """Run for ``seconds`` like ``sleep``, then fail with probability CELERYOPS_TEST_FAIL_RATE (``BadReleaseError``,
    recorded: ``failed`` = 1 in ct:run:<id>, the id in ct:failed); recorded start and finish either way."""
    mark_start(self)
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    failing = random.random() < fail_rate()
    if failing:
        r = record()
        pipe = r.pipeline()
        pipe.hset(f"ct:run:{self.request.id}", "failed", 1)
        pipe.rpush("ct:failed", self.request.id)
        pipe.execute()
    mark_finish(self)
    if failing:
        raise BadReleaseError(f"bad release: task {self.request.id} failed")
    return tag
