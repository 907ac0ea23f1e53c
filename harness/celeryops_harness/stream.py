"""A steady stream of one task, sent until stopped: what the deploy tests and benchmarks run through a deploy."""

from __future__ import annotations

import threading
from typing import Any


class TaskStream:
    """``task`` with ``args``, one every ``every`` s on ``queue``, until stopped (or the ``with`` block ends);
    ``ids`` in send order."""

    def __init__(self, broker: str, queue: str, task: Any, args: tuple[object, ...], every: float) -> None:
        self.broker, self.queue, self.task, self.args, self.every = broker, queue, task, args, every
        self.ids: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TaskStream:
        self._thread.start()
        return self

    def __enter__(self) -> TaskStream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with self.task.app.connection_for_write(self.broker) as conn:
            while not self._stop.is_set():
                self.ids.append(self.task.apply_async(args=self.args, queue=self.queue, connection=conn).id)
                self._stop.wait(self.every)
