"""``python -m celeryops_harness.killcli KIND ARGS...``: the real ``celeryops ARGS...``, SIGKILLed right after the run
journal made the record KIND durable (``created``, ``phase:draining``, ``intent:cancel_consumers``,
``settle:deploy_start`` ...): a process killed at an exact point of a run, for recovery tests and chaos trials.
``A>B`` kills at the first record B written after a record A (``phase:drained>intent:scale_pool``: the pool update
of an autoscaler's scale-in, not the scale-out that came first). ``SIGINT@KIND`` sends SIGINT instead (once): the
process goes on and handles it as an operator's Ctrl-C at that exact point.

The product has no test hook: this wrapper installs the journal's ``after_write`` callback from outside."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from celeryops.ops import journal


def kill_after(kind: str) -> None:
    original = journal.Journal.__init__
    name, _, kind = kind.rpartition("@")
    sig = getattr(signal, name) if name else signal.SIGKILL
    *before, last = kind.split(">")
    seen = [0]  # how many of ``before`` were written, in order (shared by every journal of the process); then 1 more

    def init(self: journal.Journal, *args: Any, **kwargs: Any) -> None:
        previous = kwargs.pop("after_write", None)

        def after_write(written: str) -> None:
            if previous is not None:
                previous(written)
            if seen[0] < len(before):
                seen[0] += written == before[seen[0]]
            elif seen[0] == len(before) and written == last:
                seen[0] += 1  # once
                os.kill(os.getpid(), sig)

        original(self, *args, after_write=after_write, **kwargs)

    journal.Journal.__init__ = init  # type: ignore[method-assign]


if __name__ == "__main__":
    kill_after(sys.argv[1])
    sys.argv = ["celeryops", *sys.argv[2:]]
    from celeryops.cli import main

    main()
