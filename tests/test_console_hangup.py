"""The console's terminal driver survives its terminal hanging up (``console/terminal.py``).

A real Textual app on the console's driver runs in a real terminal (tmux); the terminal goes away (kill-session: the
kernel sends SIGHUP, then SIGCONT, and every write fails with EIO). Like the console applying the recovery rules, the
app keeps drawing for a while after the SIGHUP, then exits. On Textual's own driver the SIGCONT restarts application
mode with a second output thread that dies on EIO, the app's writes fill its queue and the app blocks for good; on
the console's driver it exits. The same app is also suspended (SIGTSTP) and brought back with ``fg``: a SIGCONT while
the terminal is there still redraws (Textual suspends inside the signal handler, which under load can land in the
middle of the app's own write and block for good on the output queue's lock; the console's driver does it from the
event loop).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeryops_harness.workers import wait_for
from termhelp import Tmux, pid_alive, tmux  # noqa: F401 - the tmux fixture

APP = """
import asyncio, os, signal, sys
from pathlib import Path
from textual.app import App
from textual.widgets import Static
from celeryops.console.terminal import driver_class

OUT = Path(sys.argv[1])

class Ticking(App[int]):
    def compose(self):
        yield Static("starting", id="tick")

    def on_mount(self):
        self.ticks = 0
        self.set_interval(0.01, self.tick)

    def tick(self):
        self.ticks += 1
        self.query_one("#tick").update(f"tick {self.ticks} " + "#" * (self.ticks % 90))

async def main():
    app = Ticking(driver_class=driver_class())
    loop = asyncio.get_running_loop()

    def hung_up():
        (OUT / "hup").write_text(str(app.ticks))
        loop.call_later(1.5, app.exit, 130)  # keeps drawing meanwhile: about 150 more frames

    loop.add_signal_handler(signal.SIGHUP, hung_up)
    (OUT / "pid").write_text(str(os.getpid()))
    code = await app.run_async()
    (OUT / "exited").write_text(str(code))

asyncio.run(main())
"""


@pytest.fixture
def app(tmux: Tmux, tmp_path: Path) -> Iterator[Callable[[bool], int]]:  # noqa: F811
    """Start the app in the terminal (``shell=True``: typed into a shell there, for job control); returns its pid.
    Whatever happens, the app is SIGKILLed at the end (a stuck one would spin on its dead terminal)."""
    pids: list[int] = []

    def start(shell: bool = False) -> int:
        (tmp_path / "app.py").write_text(APP)
        command = f"{sys.executable} {tmp_path / 'app.py'} {tmp_path}"
        size = ["-x", "100", "-y", "20"]
        if shell:
            tmux.tmux("-f", "/dev/null", "new-session", "-d", "-s", tmux.session, *size, "sh")
            tmux.keys(command, "Enter")
        else:
            tmux.tmux("-f", "/dev/null", "new-session", "-d", "-s", tmux.session, *size, command)
        # the app writes its pid file as it starts: wait for the whole number, not only for the file
        wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip().isdigit(), 60,
                 "the app to start")
        pids.append(int((tmp_path / "pid").read_text()))
        wait_for(lambda: re.search(r"tick \d+", tmux.screen()), 60, "the app to draw", step=0.05)
        return pids[-1]

    yield start
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_the_console_driver_exits_after_its_terminal_hangs_up(app: Callable[[bool], int], tmux: Tmux,  # noqa: F811
                                                              tmp_path: Path) -> None:
    pid = app(False)
    tmux.tmux("kill-session", "-t", tmux.session)
    wait_for(lambda: (tmp_path / "hup").exists(), 30, "the app to see SIGHUP")
    wait_for(lambda: not pid_alive(pid), 60, "the app to exit after its terminal hung up", step=0.1)
    assert (tmp_path / "exited").read_text() == "130"  # through the app's own end, not a kill


def test_a_sigcont_while_the_terminal_is_there_redraws(app: Callable[[bool], int], tmux: Tmux) -> None:  # noqa: F811
    pid = app(True)
    os.kill(pid, signal.SIGTSTP)  # the driver leaves application mode, then stops the process
    wait_for(lambda: "tick" not in tmux.screen(), 30, "the app to leave the screen to the shell")
    tmux.keys("fg", "Enter")  # SIGCONT with the terminal there: application mode again
    wait_for(lambda: "tick" in tmux.screen(), 30, "the app to draw again")
