"""The console's first look at its fleet, read by a child process while the console starts.

``celeryops --broker URL`` paints its first frame before Celery, kombu, redis-py and the ops layer are loaded
(:class:`~celeryops.commands.console.LateBackend`); loading them and polling the fleet then took another ~0.3 s of
one core before the fleet was on screen. Where a core is idle, a child forked before Textual loads does that part
on it, the way the console backend's first poll would (:func:`celeryops.ops.backend.firstlook.read_first_look`), and
sends each part (the fleet, the slot pool, the unfinished run, then what the next polls go on from) through a pipe as
soon as it is read. The console serves each part once, to its first call for it, then opens its own backend.

Safe by construction: the fork happens only while this process runs one thread (no lock of another thread is
copied held), the child never touches the terminal (its standard streams go to /dev/null) and leaves with
``os._exit`` (no atexit handler, no buffer flushed twice), and whatever the child could not send (it failed, it was
slow, a part would not unpickle) the console reads itself, as it would have without a first look.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celeryops.core.errors import UserError

if TYPE_CHECKING:  # asyncio and pickle load after the fork: the child starts sooner, with less to copy
    import asyncio

    from celeryops.commands.common import FleetSpec

Send = Callable[[str, object, "BaseException | None"], None]

_HEADER = struct.Struct("!I")  # each frame: its length, then the part's name, NUL, and the pickled (value, error)
_SEP = b"\0"


@dataclass(frozen=True)
class Taken:
    """One part as the child read it: its ``value``, or the ``error`` its read ended with."""

    value: Any
    error: BaseException | None = None

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class FirstLook:
    """The child that reads the first look, and the parts it sent. :meth:`take` serves each part once (awaiting it
    until the child sent it or ended); :meth:`close` gives up on the parts not taken and ends the child."""

    def __init__(self, pid: int, fd: int) -> None:
        self._seen: bytes | None = None  # the child's last message, still pickled: what the next polls go on from
        self.taken_any = False
        self._pid = pid  # 0 once reaped
        self._fd: int | None = fd
        self._lock = threading.Lock()  # one read at a time, and the pipe closed between reads only
        self._parts: dict[str, asyncio.Future[Taken | None]] = {}
        self._taken: set[str] = set()
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    def start(cls, read: Callable[[Send], None]) -> FirstLook | None:
        """Fork the child that runs ``read(send)``; None where forking is not safe (no ``os.fork``, or threads
        already run here: the demo's sandbox) or fails."""
        if not hasattr(os, "fork") or threading.active_count() > 1:
            return None
        rfd, wfd = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(rfd)
            os.close(wfd)
            return None
        if pid == 0:  # the child
            _child(rfd, wfd, read)
        os.close(wfd)
        return cls(pid, rfd)

    @property
    def seen(self) -> object | None:
        """What the next polls go on from, as the child sent it last (None: not sent). Unpickled only when asked: its
        type is the backend's (:class:`~celeryops.ops.backend.snapshots.Seen`), whose modules (Celery, redis-py, the
        ops layer: ~0.3 s of one core) would otherwise load on the event loop while the fleet waits to be drawn;
        the backend asks for it once it has loaded them."""
        import pickle

        try:
            return None if self._seen is None else pickle.loads(self._seen)[0]
        except Exception:  # it does not unpickle here: the next polls start afresh
            return None

    async def take(self, part: str) -> Taken | None:
        """``part`` as the child read it, the first time it is asked for; None when it was taken before, the child
        did not send it, or the first look was closed."""
        import asyncio

        if self._closed or part in self._taken:
            return None
        self._taken.add(part)
        loop = asyncio.get_running_loop()
        if self._reader is None:
            self._reader = asyncio.ensure_future(self._read_all())
        found = await self._parts.setdefault(part, loop.create_future())
        self.taken_any = self.taken_any or found is not None
        return found

    def settings(self) -> tuple[str, str | None] | None:
        """The configuration as the child loaded it (the fleet's name, the plain broker URL or None for a Celery
        app), if it is in already: the console loads Textual meanwhile, and need not load the configuration before
        its first frame. Raises the :class:`UserError` the child's load ended with (the configuration is wrong: the
        console does not open). None when it is not in yet (a busy machine) or not as sent: the console loads it."""
        import pickle
        import select

        if self._closed or self._fd is None or not select.select([self._fd], [], [], 0)[0]:
            return None
        frame = self._frame()  # the child's first frame, written at once (under PIPE_BUF): whole if any of it is in
        name, _, data = (frame or b"").partition(_SEP)
        try:
            value, error = pickle.loads(data)
        except Exception:
            value, error = None, None
        if name != b"config" or (error is None and not _is_settings(value)):
            self.close()  # not the protocol this process speaks: no part of it is used
            return None
        if error is not None:
            self.close()
            raise error
        return value  # type: ignore[no-any-return]

    def asked(self, parts: tuple[str, ...]) -> bool:
        """Every one of ``parts`` was asked for (and served, or known missing)."""
        return all(p in self._taken for p in parts)

    async def _read_all(self) -> None:
        import asyncio
        import pickle

        try:
            while (frame := await asyncio.to_thread(self._frame)) is not None:
                name, _, data = frame.partition(_SEP)
                part = name.decode("ascii", "replace")
                if part == "seen":
                    self._seen = data
                    continue
                try:
                    value, error = pickle.loads(data)
                except Exception:  # a part that does not unpickle here (an error type with other arguments)
                    continue
                future = self._parts.setdefault(part, asyncio.get_running_loop().create_future())
                if not future.done():
                    future.set_result(Taken(value, error))
        finally:
            self._settle()
        await asyncio.to_thread(self._end, False)  # the child closed the pipe: it exits (or has)

    def _frame(self) -> bytes | None:
        """The next frame from the child; None at its end, or once closed."""
        with self._lock:
            head = self._exactly(_HEADER.size)
            return None if head is None else self._exactly(_HEADER.unpack(head)[0])

    def _exactly(self, size: int) -> bytes | None:
        chunks, left = [], size
        while left:
            if self._fd is None or self._closed:
                return None
            try:
                chunk = os.read(self._fd, left)
            except OSError:
                return None
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _settle(self) -> None:
        """The parts not sent are missing: their callers read them themselves."""
        for future in self._parts.values():
            if not future.done():
                future.set_result(None)

    def close(self) -> None:
        """Give up on what was not taken yet and end the child (killed if it still runs). Idempotent."""
        self._closed = True
        self._settle()
        self._end(True)

    def _end(self, kill: bool) -> None:
        """Reap the child (SIGKILL first when ``kill``: a read blocked on its pipe then returns) and close the pipe
        once no read is under way."""
        if self._pid and kill:  # not reaped yet: the pid is still the child's (at worst a zombie)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
        with self._lock:
            pid, self._pid = self._pid, 0
            if pid:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            fd, self._fd = self._fd, None
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


def _is_settings(value: object) -> bool:
    return (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)
            and (value[1] is None or isinstance(value[1], str)))


def spare_core() -> bool:
    """A core is free now and has been of late: fewer tasks run than there are cores (Linux: the running count of
    /proc/loadavg, this process included), and tasks have seldom waited for a core in the last ten seconds (Linux's
    CPU pressure, /proc/pressure/cpu; where it is not kept, the 1-minute load average leaves a core idle). A child on
    a busy machine would take its time from the console's own first frame."""
    return core_free(os.cpu_count() or 1, _procs_running(), _cpu_pressure(), os.getloadavg()[0])


#: The share of the last ten seconds (%) in which some task waited for a core, below which a core counts as free.
CPU_PRESSURE_LIMIT = 10.0


def core_free(cores: int, running: int | None, pressure: float | None, load: float) -> bool:
    """:func:`spare_core`'s rule: ``running`` tasks now (None: unknown), CPU ``pressure`` (the "some" avg10 share, %;
    None: not kept), the 1-minute ``load`` average. The pressure is preferred to the load average: a burst a minute
    ago (the previous command, a build) holds the load average above a core for a minute after the cores are idle
    again, while the pressure says whether anything has waited for one since."""
    if cores < 2 or (running is not None and running >= cores):
        return False
    if pressure is not None:
        return pressure < CPU_PRESSURE_LIMIT
    return load < cores - 1


def _procs_running() -> int | None:
    try:
        with open("/proc/loadavg") as fh:
            return int(fh.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None  # not Linux


def _cpu_pressure() -> float | None:
    try:
        with open("/proc/pressure/cpu") as fh:
            some = fh.readline().split()  # "some avg10=1.60 avg60=2.09 avg300=1.50 total=..."
        return float(some[1].removeprefix("avg10=")) if some[0] == "some" else None
    except (OSError, ValueError, IndexError):
        return None  # not Linux, or a kernel without pressure stall information


def _child(rfd: int, wfd: int, read: Callable[[Send], None]) -> None:
    """The child's whole life: ``read(send)``, each part pickled into the pipe; never returns."""
    code = 1
    try:
        import pickle

        gc.disable()  # a short life: what it allocates is freed with it
        os.close(rfd)
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the terminal is the console's: nothing of the child may reach it
            os.dup2(quiet, fd)

        def send(part: str, value: object, error: BaseException | None) -> None:
            data = part.encode("ascii") + _SEP + pickle.dumps((value, error))
            view = memoryview(_HEADER.pack(len(data)) + data)
            while view:
                view = view[os.write(wfd, view):]

        read(send)
        code = 0
    except BaseException:  # whatever ends the child: the console reads what is missing itself
        pass
    finally:
        os._exit(code)


def first_look_for_home(fleet: FleetSpec, state_dir: str | None) -> FirstLook | None:
    """The first look of ``celeryops`` (the console's home view) at a fleet given by its broker URL, started now,
    before the console loads anything more (the child reads the configuration itself, as the console does). None
    where the console will not open (not a terminal), imports a Celery app first (``-A``), or where no core is free
    now: the child would take its time from the console's own start, which then reads the fleet itself, as it
    always did."""
    if not (sys.stdout.isatty() and sys.stdin.isatty()) or fleet.app_path or not spare_core():
        return None
    return FirstLook.start(lambda send: read_for(fleet, state_dir, send))


def read_for(fleet: FleetSpec, state_dir: str | None, send: Send) -> None:
    """In the first look's child: the configuration first (the fleet's name and plain broker URL, or the
    :class:`UserError` that loading it ended with: :meth:`FirstLook.settings`), then the fleet's first look, read as
    the console backend would read it (nothing when the configuration names a Celery app: the console imports it
    first)."""
    try:
        config = fleet.config({"state_dir": state_dir})
        url = fleet.plain_broker_url()
    except UserError as err:
        send("config", None, err)
        return
    send("config", (config.run.fleet, url), None)
    if url is None:
        return
    from celeryops.ops.backend.firstlook import read_first_look

    read_first_look(fleet.celery_app(), config, send)


__all__ = ["CPU_PRESSURE_LIMIT", "FirstLook", "Send", "Taken", "core_free", "first_look_for_home", "read_for",
           "spare_core"]
