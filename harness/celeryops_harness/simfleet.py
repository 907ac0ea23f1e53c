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

The parts: ``simfleet_plan`` (the tasks, the fleet's shape, random plans), ``simfleet_node`` (a simulation process
and its handlers), and this module (the parent-side handle, and the names the benchmarks and tests import).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection as Pipe

from celeryops_harness.simfleet_node import HANDLERS, PLUGIN_HANDLERS, REPLY_CHUNK, ProcSpec, serve
from celeryops_harness.simfleet_plan import TASK_NAME, SimSpec, SimTask, last_finish, make_plan

__all__ = ["HANDLERS", "PLUGIN_HANDLERS", "REPLY_CHUNK", "TASK_NAME", "SimFleet", "SimSpec", "SimTask", "last_finish",
           "make_plan", "sim_fleet"]


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
            proc_spec = ProcSpec(broker=self.broker, exchange=self.spec.control_exchange, names=tuple(names),
                                  silent=frozenset(self.silent & set(names)), queues=self.spec.queues,
                                  reply_delay=self.spec.reply_delay, drop_rate=self.spec.drop_rate,
                                  events=self.spec.events, seed=self.spec.seed * 1000 + i,
                                  plugin=self.spec.plugin)
            proc = ctx.Process(target=serve, args=(proc_spec, child), name=f"simfleet-{i}", daemon=True)
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
