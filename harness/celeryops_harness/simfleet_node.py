"""The worker side of a simulated fleet: one simulation process (``Server``) answering for many simulated workers.

Each simulated worker is a ``kombu.pidbox.Node`` (Celery's own mailbox) with handlers that answer like
``celery.worker.control`` (``HANDLERS``; ``PLUGIN_HANDLERS`` adds ``celeryops_observe``). A process binds every one
of its nodes' pidbox queues, consumes one of them (kombu's Redis channel delivers a fanout topic to one queue per
channel) and hands each broadcast to the addressed nodes itself; replies wait on a timer heap (``reply_delay``), may
be dropped (``drop_rate``) or never sent (``silent``), and go out in round-robin chunks per caller. With ``events``,
a ``task-succeeded`` event is sent when a task ends. ``serve`` is the process's entry point (spawned by
``simfleet.SimFleet``, commands over a pipe: ``tasks``, ``stop``).
"""

from __future__ import annotations

import heapq
import itertools
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from typing import Any

from celeryops_harness.simfleet_plan import SimTask

REPLY_CHUNK = 25  # replies per caller per round (see Server._fire)


@dataclass
class _Worker:
    """The state a simulated node's handlers read and change (kombu passes it as ``state``)."""

    hostname: str
    queues: list[str]
    pid: int
    tasks: list[SimTask] = field(default_factory=list)

    def requests(self, kind: str, now: float) -> list[SimTask]:
        return [t for t in self.tasks if t.state(now) == kind]

    def info(self, task: SimTask, now: float) -> dict[str, Any]:
        """The dict ``celery.worker.request.Request.info()`` gives (time_start in epoch seconds)."""
        running = task.state(now) == "active"
        return {"id": task.id, "name": task.name, "args": list(task.args), "kwargs": {}, "type": task.name,
                "hostname": self.hostname, "time_start": task.start if running else None,
                "acknowledged": running,
                "delivery_info": {"exchange": "", "routing_key": self.queues[0] if self.queues else "celery",
                                  "priority": 0, "redelivered": False},
                "worker_pid": self.pid if running else None}


def _kombu() -> Any:
    """kombu, untyped (its classes carry no annotations)."""
    import kombu

    return kombu


_QUEUE_DICTS: dict[str, dict[str, Any]] = {}


def _queue_dict(name: str) -> dict[str, Any]:
    """kombu's ``Queue.as_dict(recurse=True)`` of a worker's queue (built once per name: replies only serialize it)."""
    found = _QUEUE_DICTS.get(name)
    if found is None:
        kombu = _kombu()
        found = _QUEUE_DICTS[name] = dict(kombu.Queue(name, kombu.Exchange(name), routing_key=name)
                                          .as_dict(recurse=True))
    return found


def _ping(state: _Worker, **_: Any) -> dict[str, Any]:
    return {"ok": "pong"}


def _active(state: _Worker, safe: bool = False, **_: Any) -> list[dict[str, Any]]:
    now = time.time()
    return [state.info(t, now) for t in state.requests("active", now)]


def _reserved(state: _Worker, **_: Any) -> list[dict[str, Any]]:
    now = time.time()
    return [state.info(t, now) for t in state.requests("reserved", now)]


def _scheduled(state: _Worker, **_: Any) -> list[dict[str, Any]]:
    now = time.time()
    out: list[dict[str, Any]] = []
    for task in state.requests("scheduled", now):
        eta = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(task.eta or now))
        out.append({"eta": eta, "priority": 6, "request": state.info(task, now)})
    return out


def _active_queues(state: _Worker, **_: Any) -> list[dict[str, Any]]:
    return [_queue_dict(q) for q in state.queues]


def _cancel_consumer(state: _Worker, queue: str, **_: Any) -> dict[str, Any]:
    if queue in state.queues:
        state.queues.remove(queue)
    return {"ok": f"no longer consuming from {queue}"}


def _add_consumer(state: _Worker, queue: str, **_: Any) -> dict[str, Any]:
    if queue not in state.queues:
        state.queues.append(queue)
    return {"ok": f"add consumer {queue}"}


def _observe(state: _Worker, **_: Any) -> dict[str, Any]:
    """``celeryops_observe``, as workers running the celeryops plugin answer it (one round per observation)."""
    return {"active": _active(state), "reserved": _reserved(state), "scheduled": _scheduled(state),
            "active_queues": _active_queues(state)}


HANDLERS: dict[str, Callable[..., Any]] = {
    "ping": _ping, "active": _active, "dump_active": _active, "reserved": _reserved, "dump_reserved": _reserved,
    "scheduled": _scheduled, "dump_schedule": _scheduled, "active_queues": _active_queues,
    "cancel_consumer": _cancel_consumer, "add_consumer": _add_consumer,
}
PLUGIN_HANDLERS: dict[str, Callable[..., Any]] = {**HANDLERS, "celeryops_observe": _observe}


@dataclass(frozen=True)
class ProcSpec:
    broker: str
    exchange: str
    names: tuple[str, ...]
    silent: frozenset[str]
    queues: tuple[str, ...]
    reply_delay: tuple[float, float]
    drop_rate: float
    events: bool
    seed: int
    plugin: bool = False


class Server:
    """One simulation process: its nodes, one pidbox subscription, a timer heap for delayed replies and events."""

    def __init__(self, spec: ProcSpec, control: Pipe) -> None:
        from celery import Celery

        self.spec = spec
        self.control = control
        self.rng = random.Random(spec.seed)
        self.app = Celery("celeryops_simfleet", broker=spec.broker, set_as_current=False)
        self.app.conf.control_exchange = spec.exchange
        self.app.conf.broker_connection_retry_on_startup = True
        self.heap: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.generation = 0
        self.running = True
        pid = os.getpid()
        self.workers = {n: _Worker(n, list(spec.queues), pid) for n in spec.names}
        self.dispatchers: dict[str, Any] = {}

    def serve(self) -> None:
        kombu = _kombu()

        with self.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=5)
            self.conn = conn
            channel = conn.channel()
            self.channel = channel
            mailbox = self.app.control.mailbox(conn)
            self.mailbox = mailbox
            self.producer = kombu.Producer(channel, auto_declare=False)
            handlers = PLUGIN_HANDLERS if self.spec.plugin else HANDLERS
            self.nodes = {n: mailbox.Node(n, state=w, channel=channel, handlers=handlers)
                          for n, w in self.workers.items()}
            queues = [mailbox.get_queue(n) for n in self.spec.names]
            for queue in queues:  # binds it: the entry in _kombu.binding.<exchange>.pidbox a real worker creates
                queue(channel).declare()
            consumer = kombu.Consumer(channel, [queues[0]], no_ack=True, accept=["json"], callbacks=[self.on_message])
            consumer.consume()
            self._drain(0.01)  # subscribes to the exchange's topic
            self.control.send(("ready", os.getpid()))
            try:
                while self.running:
                    self._commands()
                    self._fire()
                    self._drain(self._wait())
            finally:
                consumer.cancel()
                for queue in queues:  # unbinds, as a real worker's shutdown does
                    try:
                        queue(channel).delete()
                    except Exception:
                        pass

    def _drain(self, timeout: float) -> None:
        try:
            self.conn.drain_events(timeout=timeout)
        except TimeoutError:
            pass

    def _wait(self) -> float:
        if not self.heap:
            return 0.05
        return min(0.05, max(0.0, self.heap[0][0] - time.time()))

    def _commands(self) -> None:
        while self.control.poll():
            kind, payload = self.control.recv()
            if kind == "stop":
                self.running = False
            elif kind == "tasks":
                self._set_tasks(payload)
                self.control.send(("ok", None))

    def _set_tasks(self, plan: dict[str, list[SimTask]]) -> None:
        self.generation += 1
        self.heap = [e for e in self.heap if e[2] == "reply"]
        heapq.heapify(self.heap)
        now = time.time()
        for name, tasks in plan.items():
            worker = self.workers.get(name)
            if worker is None:
                continue
            worker.tasks = list(tasks)
            if self.spec.events:
                for task in tasks:
                    if task.eta is None and task.end > now:
                        heapq.heappush(self.heap, (task.end, next(self.seq), "event",
                                                   (self.generation, name, task)))

    def on_message(self, body: dict[str, Any], message: Any) -> None:
        from kombu.matcher import match

        matches: Any = match  # annotated for bytes; kombu's own Node passes the str hostname
        destination = body.get("destination")
        pattern, matcher = body.get("pattern"), body.get("matcher")
        if destination:
            targets = [n for n in destination if n in self.workers]
        elif pattern and matcher:
            targets = [n for n in self.workers if matches(n, pattern, matcher)]
        else:
            targets = list(self.workers)
        lo, hi = self.spec.reply_delay
        now = time.time()
        for name in targets:
            if name in self.spec.silent:
                continue
            if self.spec.drop_rate and self.rng.random() < self.spec.drop_rate:
                continue
            due = now + (self.rng.uniform(lo, hi) if hi > 0 else 0.0)
            heapq.heappush(self.heap, (due, next(self.seq), "reply", (name, body)))

    def _fire(self) -> None:
        now = time.time()
        due: dict[tuple[str, str] | None, list[tuple[str, dict[str, Any]]]] = {}
        while self.heap and self.heap[0][0] <= now:
            _, _, kind, payload = heapq.heappop(self.heap)
            if kind == "reply":
                name, body = payload
                reply_to = body.get("reply_to")
                key = (str(reply_to["exchange"]), str(reply_to["routing_key"])) if reply_to else None
                due.setdefault(key, []).append((name, body))
            else:
                generation, name, task = payload
                if generation == self.generation:
                    self._task_succeeded(name, task)
        # Round-robin over the callers in small chunks: every caller gets its first replies at once, as from a
        # real fleet whose workers answer in parallel (kombu waits at most `timeout` for each next reply).
        while due:
            with self.producer.batch():
                for key in list(due):
                    chunk, due[key] = due[key][:REPLY_CHUNK], due[key][REPLY_CHUNK:]
                    if not due[key]:
                        del due[key]
                    self._answer(key, chunk)

    def _answer(self, key: tuple[str, str] | None, chunk: list[tuple[str, dict[str, Any]]]) -> None:
        """Run each command on its node (as ``kombu.pidbox.Node.dispatch`` does) and publish the replies the way
        ``Mailbox._publish_reply`` does (same envelope, ticket and clock headers) to the caller's reply queue,
        routed once per chunk and written in one pipeline (``Producer.batch``): one process answers for hundreds
        of workers, which a real fleet does in parallel."""
        replies: list[tuple[str, dict[str, Any]]] = []
        for name, body in chunk:
            try:
                reply = self.nodes[name].handle(body["method"], body.get("arguments") or {})
            except Exception as exc:
                reply = {"error": repr(exc)}
            replies.append((str(body.get("ticket")), {name: reply}))
        if key is None:
            return  # a cast (reply=False)
        exchange, routing_key = key
        if not exchange:  # the default exchange: the routing key is the reply list (kombu's basic_publish)
            queues = [routing_key]
        else:
            try:
                queues = self.channel._lookup(exchange, routing_key)
            except Exception:
                return
        for ticket, data in replies:
            for queue in queues:
                self.producer.publish(data, exchange="", routing_key=queue, serializer="json",
                                      headers={"ticket": ticket, "clock": self.mailbox.clock.forward()},
                                      delivery_mode="transient", retry=False)

    def _task_succeeded(self, name: str, task: SimTask) -> None:
        dispatcher = self.dispatchers.get(name)
        if dispatcher is None:
            dispatcher = self.app.events.Dispatcher(self.conn, hostname=name, enabled=True, channel=self.channel)
            self.dispatchers[name] = dispatcher
        dispatcher.send("task-succeeded", uuid=task.id, result="None", runtime=max(0.0, task.end - task.start))


def serve(spec: ProcSpec, control: Pipe) -> None:
    Server(spec, control).serve()
