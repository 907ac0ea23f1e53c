"""Drain observation benchmark (printed table, not a test).

One full observation, ``Fleet.observe`` (active + reserved + scheduled + active_queues of every known worker), at
N = 1, 4, 8 real workers (threads pool, each running two sleep tasks with one more prefetched and one ETA task
held, so the replies are not empty), side by side in the same run with:

  (a) ``celery -A celeryops_harness.taskapp inspect active``: what an operator runs today (a new process,
      default 1 s timeout: it waits the whole timeout because a broadcast cannot know how many workers exist);
  (b) one in-process ``app.control.inspect(destination=known, limit=N).active()`` round trip: the floor.

Targets: ours <= 0.05x (a) and <= 1.5x (b). Also measured, as proposals for ``Fleet.observe`` (prototypes here,
not in fleet.py):

  (p1) the four broadcasts one after another on one held connection, no threads;
  (p2) pipelined: the four commands published at once on one held connection, their 4N replies collected from
       the one reply queue in a single wait, told apart by their ticket header;
  (p3) one command: a worker-side inspect command ``celeryops_observe`` answering active + reserved + scheduled +
       active_queues in one reply (registered here in the bench workers, the way celeryops.fence registers
       ``celeryops_fence``), sent as one broadcast in a thread like Fleet._broadcast: the floor's round trip with
       a bigger reply.

The bench workers run ``-A bench_observe:worker_app``: the test task app (celeryops_harness.taskapp) plus the
``celeryops_observe`` command; every contender talks to the same workers.

Usage: .venv/bin/python bench/bench_observe.py [--repeats 30] [--cli-repeats 5] [--sizes 1,4,8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery
from kombu.connection import Connection
from kombu.messaging import Consumer
from kombu.utils.uuid import uuid

from celeryops.adapters.fleet import Fleet
from celeryops_harness.workers import wait_for
from common import BenchFleet, Timing, bench_fleet, control_app, measure, measure_interleaved, ms, ratio, table

COMMANDS = ("active", "reserved", "scheduled", "active_queues")
OBSERVE_COMMAND = "celeryops_observe"
TIMEOUT = 1.0  # Celery's default inspect timeout, also Fleet's default reply window
TARGET_A = 0.05
TARGET_B = 1.5


# -- worker side (imported by the bench workers only) ----------------------------------------------------------------


def _celeryops_observe(state: Any, **_: Any) -> dict[str, Any]:
    """Active, reserved and scheduled tasks and consumed queues of this worker, in one reply (celeryops bench)."""
    from celery.worker import control

    return {"active": control.active(state), "reserved": control.reserved(state),
            "scheduled": control.scheduled(state), "active_queues": control.active_queues(state)}


def __getattr__(name: str) -> Any:
    """``worker_app``: the test task app with ``celeryops_observe`` registered (lazy: the bench process itself
    never imports the task app, whose broker comes from the worker's environment)."""
    if name != "worker_app":
        raise AttributeError(name)
    from celery.worker.control import Panel, inspect_command

    from celeryops_harness.taskapp import app as worker_app

    if OBSERVE_COMMAND not in Panel.data:
        inspect_command(name=OBSERVE_COMMAND)(_celeryops_observe)
    return worker_app


# -- load -----------------------------------------------------------------------------------------------------------


def load(app: Celery, fleet: BenchFleet, names: list[str]) -> None:
    """Give each new worker two running sleep tasks, one prefetched and one ETA task; wait until they run."""
    for name in names:
        queue = name.split("@", 1)[1]
        for i in range(3):
            app.send_task("celeryops.testing.sleep", args=(600.0, f"{queue}-{i}"), queue=queue)
        app.send_task("celeryops.testing.sleep", args=(1.0, f"{queue}-eta"), queue=queue, countdown=3600)

    def busy() -> bool:
        replies = app.control.inspect(destination=names, limit=len(names), timeout=TIMEOUT).active() or {}
        return all(len(replies.get(n) or []) >= 2 for n in names)

    wait_for(busy, 60, f"{len(names)} workers to run two tasks each")


# -- contenders -----------------------------------------------------------------------------------------------------


def celery_cli() -> list[str]:
    script = Path(sys.executable).parent / "celery"
    return [str(script)] if script.exists() else [sys.executable, "-m", "celery"]


def cli_inspect(broker: str, known: list[str]) -> Callable[[], None]:
    env = {**os.environ, "CELERYOPS_TEST_BROKER": broker}
    cmd = [*celery_cli(), "-A", "celeryops_harness.taskapp", "inspect", "active"]

    def call() -> None:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        missing = [n for n in known if n not in out.stdout]
        if out.returncode != 0 or missing:
            raise RuntimeError(f"`celery inspect active` failed ({out.returncode}, missing {missing}): "
                               f"{out.stderr[-500:]}")

    return call


def floor_inspect(app: Celery, known: list[str]) -> Callable[[], None]:
    def call() -> None:
        replies = app.control.inspect(destination=known, limit=len(known), timeout=TIMEOUT).active() or {}
        if set(replies) != set(known):
            raise RuntimeError(f"inspect active: replies from {sorted(replies)}, expected {known}")

    return call


def ours(fleet: Fleet, loop: asyncio.AbstractEventLoop, known: list[str]) -> Callable[[], None]:
    def call() -> None:
        obs = loop.run_until_complete(fleet.observe(known))
        if not all(w.replied for w in obs.workers.values()) or set(obs.workers) != set(known):
            raise RuntimeError(f"observe: not every worker replied: {obs.workers}")
        if len(obs.tasks) < 4 * len(known):
            raise RuntimeError(f"observe: expected >= {4 * len(known)} tasks, saw {len(obs.tasks)}")

    return call


def sequential_held(conn: Connection, app: Celery, known: list[str]) -> Callable[[], None]:
    def call() -> None:
        for command in COMMANDS:
            replies = app.control.broadcast(command, destination=known, limit=len(known), reply=True,
                                            timeout=TIMEOUT, connection=conn)
            if len(replies or []) != len(known):
                raise RuntimeError(f"{command}: {len(replies or [])} replies, expected {len(known)}")

    return call


def one_command(app: Celery, loop: asyncio.AbstractEventLoop, known: list[str]) -> Callable[[], None]:
    """One broadcast, sent the way Fleet._broadcast sends one (a pooled connection, in a thread)."""

    def broadcast() -> list[dict[str, Any]]:
        return app.control.broadcast(OBSERVE_COMMAND, destination=known, limit=len(known), reply=True,
                                     timeout=TIMEOUT) or []

    def call() -> None:
        replies = loop.run_until_complete(asyncio.to_thread(broadcast))
        merged: dict[str, Any] = {}
        for item in replies:
            merged.update(item)
        if set(merged) != set(known) or any(len(merged[n]["active"]) < 2 for n in known):
            raise RuntimeError(f"{OBSERVE_COMMAND}: replies {merged}, expected two active tasks from each of {known}")

    return call


class Pipelined:
    """Prototype: publish all four commands, then collect the 4N replies in one wait on one reply queue.

    Uses kombu's pidbox Mailbox on one held connection and channel. The reply queue name is derived from the
    mailbox object, so one mailbox is kept for all rounds (a fresh one per call declares a fresh queue)."""

    def __init__(self, app: Celery, conn: Connection) -> None:
        self.conn = conn
        self.mailbox = app.control.mailbox(conn)
        self.channel = conn.channel()
        self.replies: dict[str, dict[str, Any]] = {}
        self.tickets: dict[str, str] = {}
        self.consumer = Consumer(self.channel, [self.mailbox.reply_queue], accept=["json"], no_ack=True,
                                 callbacks=[self._on_reply])
        self.consumer.consume()

    def _on_reply(self, body: dict[str, Any], message: Any) -> None:
        command = self.tickets.get(message.headers.get("ticket", ""))
        if command is not None:  # a late reply of an earlier round has an old ticket: dropped
            self.replies.setdefault(command, {}).update(body)

    def round(self, known: list[str]) -> dict[str, dict[str, Any]]:
        self.replies = {}
        self.tickets = {uuid(): command for command in COMMANDS}
        for ticket, command in self.tickets.items():
            self.mailbox._publish(command, {}, destination=known, reply_ticket=ticket, channel=self.channel,
                                  timeout=TIMEOUT, serializer="json")
        want = len(COMMANDS) * len(known)
        deadline = time.monotonic() + TIMEOUT
        while sum(len(r) for r in self.replies.values()) < want:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                self.conn.drain_events(timeout=remaining)
            except TimeoutError:
                break
        return self.replies

    def call(self, known: list[str]) -> Callable[[], None]:
        def call() -> None:
            replies = self.round(known)
            got = {c: len(replies.get(c, {})) for c in COMMANDS}
            if any(v != len(known) for v in got.values()):
                raise RuntimeError(f"pipelined: replies per command {got}, expected {len(known)} each")

        return call


# -- run ------------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=20, help="repeats of each in-process call")
    parser.add_argument("--cli-repeats", type=int, default=3, help="repeats of `celery inspect active`")
    parser.add_argument("--sizes", default="1,4,8", help="fleet sizes, ascending")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if shutil.which("redis-server") is None:
        print("bench_observe: redis-server is not on PATH; install it (tools/ensure-test-services.sh).")
        return 1

    t_start = time.monotonic()
    here = str(Path(__file__).resolve().parent)
    pythonpath = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    rows: list[list[object]] = []
    proto_rows: list[list[object]] = []
    with bench_fleet() as bench:
        app = control_app(bench.broker)
        fleet = Fleet(app, timeout=TIMEOUT)
        loop = asyncio.new_event_loop()
        held = app.connection_for_write()
        held.ensure_connection(max_retries=3)
        pipe = Pipelined(app, app.connection_for_write())
        try:
            for n in sizes:
                new = bench.add(n - len(bench.workers), own_queue=True, pool="threads", concurrency=2,
                                app="bench_observe:worker_app", env={"PYTHONPATH": pythonpath})
                load(app, bench, [w.nodename for w in new])
                known = sorted(w.nodename for w in bench.workers)
                t_a = measure(cli_inspect(bench.broker, known), args.cli_repeats, warmup=0)
                t = measure_interleaved({
                    "b": floor_inspect(app, known),
                    "ours": ours(fleet, loop, known),
                    "p1": sequential_held(held, app, known),
                    "p2": pipe.call(known),
                    "p3": one_command(app, loop, known),
                }, args.repeats, warmup=3)
                t_b, t_ours, t_p1, t_p2, t_p3 = t["b"], t["ours"], t["p1"], t["p2"], t["p3"]
                rows.append(result_row(n, t_ours, t_a, t_b))
                proto_rows.append(proto_row(n, t_ours, t_b, t_p1, t_p2, t_p3))
                print(f"  N={n}: done ({time.monotonic() - t_start:.0f} s)", flush=True)
        finally:
            held.release()
            pipe.conn.release()
            fleet.close()
            loop.close()
            app.close()

    print()
    print(table(["N", "(a) cli ms med/p95", "(b) floor ms med/p95", "ours ms med/p95", "ours/(a)", "ours/(b)",
                 "targets"], rows,
                title=f"One full observation (Fleet.observe), Redis broker, threads workers; repeats: "
                      f"(a) {args.cli_repeats}, others {args.repeats} (taken in turns)"))
    print()
    print(table(["N", "ours ms med/p95", "(p1) seq held ms", "(p2) pipelined ms", "(p3) one command ms", "ours/(b)",
                 "p1/(b)", "p2/(b)", "p3/(b)"], proto_rows,
                title="Proposals for Fleet.observe (prototypes in this file; each checks that every worker answered)"))
    print(f"\ntotal {time.monotonic() - t_start:.0f} s")
    return 0


def pair(t: Timing) -> str:
    return f"{ms(t.median)} / {ms(t.p95)}"


def result_row(n: int, t_ours: Timing, t_a: Timing, t_b: Timing) -> list[object]:
    ok_a = t_ours.median <= TARGET_A * t_a.median
    ok_b = t_ours.median <= TARGET_B * t_b.median
    verdict = f"(a) {'met' if ok_a else 'MISSED'}, (b) {'met' if ok_b else 'MISSED'}"
    return [n, pair(t_a), pair(t_b), pair(t_ours), ratio(t_ours.median, t_a.median),
            ratio(t_ours.median, t_b.median), verdict]


def proto_row(n: int, t_ours: Timing, t_b: Timing, *protos: Timing) -> list[object]:
    return [n, pair(t_ours), *(pair(t) for t in protos), ratio(t_ours.median, t_b.median),
            *(ratio(t.median, t_b.median) for t in protos)]


if __name__ == "__main__":
    sys.exit(main())
