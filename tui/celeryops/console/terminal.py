"""The console's terminal driver: Textual's Linux driver, made to survive its terminal going away.

When a terminal hangs up (the window closed, an SSH connection dropped, ``tmux kill-session``), the kernel sends the
console SIGHUP *and then SIGCONT*, and every write to the terminal fails with EIO from then on. Textual's driver
reads that SIGCONT as "resumed after Ctrl-Z" and starts application mode again, with a second output thread; that
thread dies on its first EIO, and the app's next writes fill its queue (30 entries) and block the event loop for
good: the console never reached its shutdown, so the live run's recovery never ran (the consumers stayed stopped
until someone ran ``celeryops abort``). This driver:

- ignores a SIGCONT that arrives once the terminal is gone, and stops reading input there (a hung-up terminal
  reads as an endless end-of-file, which spins the input thread);
- drops output the terminal can no longer take instead of letting the output thread die;
- suspends (SIGTSTP) and resumes (SIGCONT with the terminal there) from the event loop, not inside the signal
  handler: Textual does it in the handler, which can run in the middle of the app's own write to the output queue
  and then blocks for good on that queue's lock (seen under load: the console then ignores even SIGHUP).

Suspend and ``fg`` otherwise behave as in Textual.
"""

from __future__ import annotations

import sys
import termios
from typing import IO, Any

from textual.driver import Driver


def terminal_gone(fd: int) -> bool:
    """Whether the terminal on ``fd`` has hung up (its attributes can no longer be read)."""
    try:
        termios.tcgetattr(fd)
    except (termios.error, OSError, ValueError):
        return True
    return False


class _Output:
    """The terminal as the output thread sees it: writes it can no longer take are dropped, not raised."""

    def __init__(self, file: IO[str] | None) -> None:
        if file is None:
            raise RuntimeError("the console needs a standard error stream to draw on")
        self._file = file
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._file.write(text)
            except (OSError, ValueError):
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._file.flush()
            except (OSError, ValueError):
                self.gone = True

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding: the terminal's own
        return getattr(self._file, name)


def driver_class() -> type[Driver] | None:
    """The driver the console runs on: the hang-up-safe Linux driver on POSIX, Textual's choice elsewhere."""
    if sys.platform == "win32":
        return None
    from textual.drivers.linux_driver import LinuxDriver

    class HangupSafeDriver(LinuxDriver):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._file = _Output(self._file)  # type: ignore[assignment]  # a file to the writer thread

        def _sigtstp_application(self, *args: Any) -> None:
            self._loop.call_soon_threadsafe(super()._sigtstp_application)

        def _sigcont_application(self, *args: Any) -> None:
            if terminal_gone(self.fileno):
                self.exit_event.set()  # nothing more will be typed: let the input thread end
                return
            self._loop.call_soon_threadsafe(super()._sigcont_application)

    return HangupSafeDriver
