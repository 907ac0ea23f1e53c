"""A simulated Celery fleet: N lightweight workers that speak Celery's real remote-control protocol on a real broker.

Used by the scale and latency benchmarks and by tests that need hundreds of workers (a real worker costs a process
and ~60 MB; a simulated one a few KB). Each simulated worker is a ``kombu.pidbox.Node`` (Celery's own mailbox,
``app.control.mailbox``) with handlers that answer like ``celery.worker.control``:

  ping -> {'ok': 'pong'};  active / reserved -> [request info];  scheduled -> [{eta, priority, request}];
  active_queues -> [kombu Queue.as_dict(recurse=True)];  cancel_consumer / add_consumer -> {'ok': ...} (and the
  worker's active_queues change accordingly).

How it maps onto Redis like a real worker: every node's pidbox queue ``<hostname>.<exchange>.pidbox`` is declared
and bound on the fanout exchange, so it appears in ``_kombu.binding.<exchange>.pidbox`` (``Fleet.members``); a
broadcast is a PUBLISH on the exchange's topic. kombu's Redis channel delivers a fanout topic to one queue per
channel, so each process consumes one of its nodes' pidbox queues (one PSUBSCRIBE) and hands every broadcast to
its nodes itself, with kombu's destination / pattern rules; each addressed node replies through ``Node.dispatch``
(the reply is the real envelope, published to the caller's reply queue with its ticket).

Behaviour over time: each worker holds tasks with start and end times (``SimTask``); a task is *reserved* before
its start, *active* until its end, then gone (and, with ``events=True``, a real ``task-succeeded`` Celery event is
sent at its end, as a worker started with ``-E`` would). Replies can be delayed (``reply_delay``), dropped at random
(``drop_rate``), and a fraction of the workers (``silent``) never answer at all (like a busy solo-pool worker).

Many workers share one process (several hundred is fine); several processes (``multiprocessing``, spawn) share the
load. ``SimFleet`` is the parent-side handle: ``start()``, ``set_tasks()``, ``stop()``.
"""

from __future__ import annotations

import heapq
import itertools
import multiprocessing
import os
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from typing import Any

__all__ = ["SimFleet", "SimSpec", "SimTask", "make_plan", "sim_fleet"]

TASK_NAME = "celeryops.testing.sleep"
REPLY_CHUNK = 25  # replies per caller per round (see _Server._fire)


@dataclass(frozen=True)
class SimTask:
    """One task held by a simulated worker. Times are epoch seconds (``time.time()``), shared by all processes.

    Reserved (prefetched) before ``start``, active from ``start`` to ``end``, then finished. With ``eta`` set the
    task is an ETA/countdown task: listed by ``scheduled`` until its eta, never active."""

    id: str
    start: float
    end: float
    name: str = TASK_NAME
    args: tuple[Any, ...] = ()
    eta: float | None = None

    def state(self, now: float) -> str:
        if self.eta is not None:
            return "scheduled" if now < self.eta else "done"
        if now < self.start:
            return "reserved"
        return "active" if now < self.end else "done"


@dataclass(frozen=True)
class SimSpec:
    """The shape of a simulated fleet.

    ``tasks_per_worker`` running tasks each end at a random time within ``task_duration`` from the plan's start;
    ``reserved_per_worker`` more start when a running one ends; ``scheduled_per_worker`` ETA tasks are due in an
    hour. ``silent``: fraction of workers that never answer; ``drop_rate``: chance that one reply is lost.
    ``reply_delay``: each reply waits uniform(lo, hi) seconds."""

    n: int = 10
    processes: int = 2
    queues: tuple[str, ...] = ("celery",)
    tasks_per_worker: int = 0
    reserved_per_worker: int = 0
    scheduled_per_worker: int = 0
    task_duration: tuple[float, float] = (5.0, 30.0)
    reply_delay: tuple[float, float] = (0.0, 0.0)
    silent: float = 0.0
    drop_rate: float = 0.0
    events: bool = False
    seed: int = 0
    prefix: str = ""
    control_exchange: str = "celery"
    plugin: bool = False  # answer ``celeryops_observe`` like workers running the celeryops plugin

    def names(self) -> list[str]:
        prefix = self.prefix or "sim"
        width = max(4, len(str(self.n)))
        return [f"celery@{prefix}-{i:0{width}d}" for i in range(self.n)]

    def silent_names(self) -> set[str]:
        names = self.names()
        count = round(self.silent * len(names))
        return set(random.Random(f"{self.seed}-silent").sample(names, count)) if count else set()


def make_plan(spec: SimSpec, names: Sequence[str], now: float | None = None,
              rng: random.Random | None = None) -> dict[str, list[SimTask]]:
    """Random tasks per worker from ``spec`` (seeded): running ones that started up to a minute ago and end within
    ``task_duration``, reserved ones queued behind them, ETA ones due in an hour."""
    start = time.time() if now is None else now
    rng = rng or random.Random(spec.seed)
    lo, hi = spec.task_duration
    plan: dict[str, list[SimTask]] = {}
    for name in names:
        tasks: list[SimTask] = []
        ends: list[float] = []
        for _ in range(spec.tasks_per_worker):
            end = start + rng.uniform(lo, hi)
            ends.append(end)
            tasks.append(SimTask(id=str(uuid.uuid4()), start=start - rng.uniform(0, 60), end=end,
                                 args=(round(end - start, 3),)))
        for i in range(spec.reserved_per_worker):
            begin = sorted(ends)[i % len(ends)] if ends else start + rng.uniform(lo, hi)
            end = begin + rng.uniform(lo, hi)
            tasks.append(SimTask(id=str(uuid.uuid4()), start=begin, end=end, args=(round(end - begin, 3),)))
        for _ in range(spec.scheduled_per_worker):
            tasks.append(SimTask(id=str(uuid.uuid4()), start=start, end=start, eta=start + 3600, args=(1.0,)))
        plan[name] = tasks
    return plan


def last_finish(plan: Mapping[str, Iterable[SimTask]]) -> float | None:
    """When the last active or reserved task of ``plan`` ends (ETA tasks do not count), or None."""
    ends = [t.end for tasks in plan.values() for t in tasks if t.eta is None]
    return max(ends) if ends else None


# -- worker side (runs in the simulation processes) -------------------------------------------------------------


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
class _ProcSpec:
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


class _Server:
    """One simulation process: its nodes, one pidbox subscription, a timer heap for delayed replies and events."""

    def __init__(self, spec: _ProcSpec, control: Pipe) -> None:
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


def _serve(spec: _ProcSpec, control: Pipe) -> None:
    _Server(spec, control).serve()


# -- parent side ------------------------------------------------------------------------------------------------


class SimFleet:
    """Parent-side handle of a simulated fleet on ``broker`` (a Redis URL)."""

    def __init__(self, broker: str, spec: SimSpec) -> None:
        self.broker = broker
        self.spec = spec
        self.names = spec.names()
        self.silent = spec.silent_names()
        self.answering = [n for n in self.names if n not in self.silent]
        self.plan: dict[str, list[SimTask]] = {}
        self._procs: list[tuple[multiprocessing.process.BaseProcess, Pipe, list[str]]] = []

    def start(self, timeout: float = 60.0) -> SimFleet:
        """Start the processes and return once every one has bound its nodes and subscribed (not before)."""
        ctx = multiprocessing.get_context("spawn")
        count = max(1, min(self.spec.processes, len(self.names)))
        for i in range(count):
            names = self.names[i::count]
            parent, child = ctx.Pipe()
            proc_spec = _ProcSpec(broker=self.broker, exchange=self.spec.control_exchange, names=tuple(names),
                                  silent=frozenset(self.silent & set(names)), queues=self.spec.queues,
                                  reply_delay=self.spec.reply_delay, drop_rate=self.spec.drop_rate,
                                  events=self.spec.events, seed=self.spec.seed * 1000 + i,
                                  plugin=self.spec.plugin)
            proc = ctx.Process(target=_serve, args=(proc_spec, child), name=f"simfleet-{i}", daemon=True)
            proc.start()
            child.close()
            self._procs.append((proc, parent, names))
        deadline = time.monotonic() + timeout
        for started, pipe, _ in self._procs:
            if not pipe.poll(max(0.0, deadline - time.monotonic())):
                self.stop()
                raise TimeoutError(f"simulated fleet process {started.name} not ready after {timeout}s")
            try:
                pipe.recv()
            except EOFError:
                self.stop()
                raise RuntimeError(f"simulated fleet process {started.name} died while starting (exit code "
                                   f"{started.exitcode}); a script that starts a SimFleet needs an "
                                   "`if __name__ == '__main__':` guard (processes are spawned)") from None
        if self.spec.tasks_per_worker or self.spec.reserved_per_worker or self.spec.scheduled_per_worker:
            self.set_tasks(make_plan(self.spec, self.names))
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p, _, _ in self._procs if p.pid is not None]

    def set_tasks(self, plan: Mapping[str, Sequence[SimTask]], timeout: float = 30.0) -> None:
        """Replace the tasks of the workers named in ``plan`` (others keep theirs); returns once applied."""
        for name, tasks in plan.items():
            self.plan[name] = list(tasks)
        for _proc, pipe, names in self._procs:
            mine = {n: list(plan[n]) for n in names if n in plan}
            pipe.send(("tasks", mine))
        for proc, pipe, _ in self._procs:
            if not pipe.poll(timeout):
                raise TimeoutError(f"simulated fleet process {proc.name} did not take the tasks in {timeout}s")
            pipe.recv()

    def last_finish(self) -> float | None:
        """Epoch time the last active or reserved task of the current plan ends."""
        return last_finish(self.plan)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every process (they unbind their pidbox queues first); kill the ones that do not exit in time."""
        for _proc, pipe, _ in self._procs:
            try:
                pipe.send(("stop", None))
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + timeout
        for proc, pipe, _ in self._procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5)
            pipe.close()
        self._procs.clear()

    def __enter__(self) -> SimFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def sim_fleet(broker: str, spec: SimSpec, timeout: float = 60.0) -> Iterator[SimFleet]:
    """A started simulated fleet, stopped on exit."""
    fleet = SimFleet(broker, spec).start(timeout)
    try:
        yield fleet
    finally:
        fleet.stop()
