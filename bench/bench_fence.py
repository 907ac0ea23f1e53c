"""Drain fence: how many tasks start during a drain while the fleet scales out, with and without the plugin.

Per case: a private redis-server, one idle worker, then the real ``celeryops drain`` (``--interval`` 15 s as by
default, a streak it never reaches) is started; after its first cancel broadcast a backlog of short tasks is queued
and a new worker is started every ``--every`` seconds, until ``--seconds`` have passed; then the drain is stopped
with SIGINT (it restores the consumers). Counted from the tasks' own start records (Redis TIME): the tasks that
started after the drain's first cancel. Without the plugin a new worker fetches until the next re-broadcast reaches
it; with the plugin (``celeryops_harness.fenceapp``) it must be 0.

Usage: .venv/bin/python bench/bench_fence.py [--seconds 60 | --quick] [--every 5] [--interval 15]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import redis

from celeryops_harness.taskapp import sleep
from celeryops_harness.workers import WorkerProcess
from common import bench_fleet, table

QUEUE = "bench-fence"
BACKLOG = 3000
TASK_SECONDS = 0.3


@dataclass(frozen=True)
class CaseResult:
    label: str
    scale_outs: int
    started_after: int  # tasks started after the first cancel, until the drain was stopped
    workers_that_ran: int  # scale-out workers that started at least one task during the drain
    first_after: float | None  # seconds from the first cancel to the first task start after it


class DrainProcess:
    """``celeryops drain --json`` as a subprocess; its events are read as they come, with their arrival time."""

    def __init__(self, broker: str, interval: float, max_wait: float, state_dir: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERYOPS_")}
        env.update(CELERYOPS_STATE_DIR=state_dir, CELERYOPS_REDIS_URL=broker, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celeryops", "drain", "--broker", broker, "-Q", QUEUE, "--interval", str(interval),
             "--streak", "100000", "--max-wait", str(max_wait), "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        self.events: queue.Queue[tuple[float, dict[str, object]] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put((time.time(), json.loads(line)))
            except json.JSONDecodeError:
                continue
        self.events.put(None)

    def wait_event(self, kind: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                item = self.events.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise RuntimeError(f"the drain ended before {kind!r}: {err}")
            at, event = item
            if event.get("event") == kind:
                return at
        raise TimeoutError(f"no {kind!r} event from the drain within {timeout}s")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(120)


def run_case(plugin: bool, seconds: float, every: float, interval: float) -> CaseResult:
    app = "celeryops_harness.fenceapp" if plugin else "celeryops_harness.taskapp"
    label = "with the fence plugin" if plugin else "without the plugin"
    with bench_fleet() as fleet, tempfile.TemporaryDirectory(prefix="celeryops-bench-state-") as state:
        env = {"CELERYOPS_TEST_RECORD": fleet.broker, "CELERYOPS_FENCE_INTERVAL": "0.5"}
        fleet.add(1, app=app, queues=[QUEUE], env=env)
        client = redis.Redis.from_url(fleet.broker, decode_responses=True)
        drain = DrainProcess(fleet.broker, interval, seconds + 600, state)
        try:
            cancel_at = drain.wait_event("cancelled", 120)
            with sleep.app.connection_for_write(fleet.broker) as conn:
                for i in range(BACKLOG):
                    sleep.apply_async(args=(TASK_SECONDS, f"b{i}"), queue=QUEUE, connection=conn)
            late: list[WorkerProcess] = []
            end = cancel_at + seconds
            next_at = cancel_at + every
            while time.time() < end:
                if time.time() >= next_at:
                    worker = WorkerProcess(fleet.broker, app=app, queues=[QUEUE], env=env, log_dir=fleet.log_dir)
                    fleet.workers.append(worker.start())
                    late.append(worker)
                    next_at += every
                time.sleep(0.05)
            stop_at = time.time()
            drain.stop()
        finally:
            if drain.proc.poll() is None:
                drain.proc.kill()
        ids: list[str] = [str(tid) for tid in client.lrange("ct:starts", 0, -1)]
        pipe = client.pipeline()
        for tid in ids:
            pipe.hmget("ct:run:" + tid, "started", "worker")
        records = [(float(s), w) for s, w in pipe.execute() if s]
        during = [(s, w) for s, w in records if cancel_at < s <= stop_at]
        late_names = {w.nodename for w in late}
        client.close()
        return CaseResult(
            label=label, scale_outs=len(late), started_after=len(during),
            workers_that_ran=len({w for _, w in during if w in late_names}),
            first_after=min(s for s, _ in during) - cancel_at if during else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the drain (default 60)")
    ap.add_argument("--quick", action="store_true", help="a 20 s drain")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between scale-outs (default 5)")
    ap.add_argument("--interval", type=float, default=15.0, help="the drain's poll/re-broadcast interval")
    args = ap.parse_args()
    seconds = 20.0 if args.quick else args.seconds
    results = [run_case(plugin, seconds, args.every, args.interval) for plugin in (False, True)]
    rows = [[r.label, r.scale_outs, r.workers_that_ran, r.started_after,
             "-" if r.first_after is None else f"{r.first_after:.1f}"] for r in results]
    print(table(["case", "scale-outs", "late workers that ran tasks", "tasks started after drain began",
                 "first start after (s)"], rows,
                title=f"{seconds:g} s drain (re-broadcast every {args.interval:g} s), a new worker every "
                      f"{args.every:g} s, backlog of {BACKLOG} x {TASK_SECONDS:g} s tasks"))
    with_plugin = results[1].started_after
    print(f"\nwith the plugin: {with_plugin} task(s) started after the drain began (must be 0): "
          + ("OK" if with_plugin == 0 else "FAIL"))
    if with_plugin:
        sys.exit(1)


if __name__ == "__main__":
    main()
