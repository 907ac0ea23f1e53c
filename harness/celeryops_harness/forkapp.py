"""Both worker plugins installed as the README installs them (``fencedslotapp``), prefork children replaced after
every task, and a record of the threads alive in a worker process each time it forks.

Configured by the environment, on top of fencedslotapp's variables (slotapp's and the fence's):
  CELERYOPS_TEST_FORK_LOG    a file that gets one JSON line per fork of a process of the worker (before the fork,
                             from ``os.register_at_fork``): ``{"pid": <the forking process>, "threads": [names]}``;
                             the worker's main process is the one whose pid the test knows
  CELERYOPS_TEST_MAX_TASKS   ``worker_max_tasks_per_child`` (default 1: every task runs in a freshly forked child)
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from celery import Task

from celeryops_harness.fencedslotapp import app, slot_sleep
from celeryops_harness.slotapp import slot_gpu
from celeryops_harness.taskapp import mark_finish, mark_start

FORK_LOG = "CELERYOPS_TEST_FORK_LOG"

app.conf.worker_max_tasks_per_child = int(os.environ.get("CELERYOPS_TEST_MAX_TASKS") or 1)


def _record_fork() -> None:
    path = os.environ.get(FORK_LOG)
    if not path:
        return
    line = json.dumps({"pid": os.getpid(), "threads": sorted(t.name for t in threading.enumerate())}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write of a short line on O_APPEND: lines never interleave
    finally:
        os.close(fd)


os.register_at_fork(before=_record_fork)


@app.task(bind=True, name="celeryops.testing.fork_touch")
def touch(self: Task[Any, Any], tag: str = "") -> str:
    """A plain task (no slots): records its start and finish."""
    mark_start(self)
    mark_finish(self)
    return tag


def forks(path: Path, pid: int) -> list[list[str]]:
    """The names of the threads that were alive in process ``pid`` at each of its forks, in order."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    records = [json.loads(line) for line in lines if line.strip()]
    return [list(r["threads"]) for r in records if r["pid"] == pid]


__all__ = ["FORK_LOG", "app", "forks", "slot_gpu", "slot_sleep", "touch"]
