"""Console benchmarks (printed table, not a test): how long one drain update takes with 100 / 1,000 / 10,000 rows in
the task table, from the handler until the frame showing the updated table is ready for the terminal (target <= 50
ms at 10,000), time to first frame, CPU while idle-polling a fleet (target < 2 % of one core), and console start:
from starting the ``celeryops`` process in a terminal (a pty) to the first painted home frame showing a live fleet
of real workers (target <= 1.0 s), with ``celery --version`` (whole process) as the anchor in the same run.
Run: ``.venv/bin/python bench/bench_console.py [--start-only]`` (console start needs redis-server). See
bench/README.md."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from dataclasses import replace
from pathlib import Path

from rich.console import RenderableType
from textual._compositor import CompositorUpdate
from textual.geometry import Region
from textual.screen import Screen
from textual.strip import Strip

from celeryops.console import sample
from celeryops.console.app import ConsoleApp, make_app
from celeryops.console.screens.drain import DrainScreen
from celeryops.console.static import StaticBackend
from celeryops.console.widgets.task_table import TaskTable
from celeryops.core.events import DrainProgress

SIZE = (120, 40)


def spread(progress: DrainProgress) -> DrainProgress:
    """Every active task a runtime of its own, to the millisecond (tasks start at any moment): the sample's runtimes
    share 90 whole-second values, which let a cache keyed by whole seconds hide the cost of the text."""
    tasks = [replace(t, runtime=t.runtime + (i * 0.6180339887) % 60) if t.runtime is not None else t
             for i, t in enumerate(progress.tasks)]
    return replace(progress, tasks=tuple(tasks))


def next_poll(progress: DrainProgress, round_no: int, step: float = 15.0) -> DrainProgress:
    """The next poll ``step`` seconds later (15 s: the default drain interval): 1 % of tasks finished, as many new
    ones arrived, every active task's runtime grew by ``step`` (60 s: nearly every "running for" cell changes)."""
    tasks = list(progress.tasks)
    churn = max(1, len(tasks) // 100)
    del tasks[:churn]
    fresh = spread(replace(progress, tasks=sample.tasks(churn))).tasks
    tasks += [replace(t, id=f"r{round_no}-{i}-{t.id}") for i, t in enumerate(fresh)]
    tasks = [replace(t, runtime=(t.runtime or 0) + step) if t.state == "active" else t for t in tasks]
    return replace(progress, tasks=tuple(tasks), elapsed=progress.elapsed + 15, remaining=progress.remaining - 15)


class Frames:
    """Records when frames that repainted the task table, after its idle work (new rows measured, size updated),
    were ready for the terminal.

    Headless apps skip turning a frame into terminal bytes; this does it (``render_segments``, as ``App._display``
    does for a real terminal), so a frame is counted until its bytes exist (only the write itself is left out)."""

    def __init__(self, app: ConsoleApp, table: TaskTable) -> None:
        self.table_done: list[tuple[float, float]] = []  # (wall, cpu) at the end of each such frame
        self._table_rendered = False
        render_lines, display = table.render_lines, app._display

        def table_render_lines(crop: Region) -> list[Strip]:
            self._table_rendered = True
            return render_lines(crop)

        def terminal_display(screen: Screen, renderable: RenderableType | None) -> None:
            if isinstance(renderable, CompositorUpdate):
                renderable.render_segments(app.console)
            display(screen, renderable)
            rendered, self._table_rendered = self._table_rendered, False
            if rendered and not table._require_update_dimensions:
                self.table_done.append((time.perf_counter(), time.process_time()))

        table.render_lines = table_render_lines  # type: ignore[method-assign]
        app._display = terminal_display  # type: ignore[method-assign]


async def drain_update(rows: int, step: float = 15.0, rounds: int = 7) -> dict[str, float]:
    """Medians (ms) for one drain update of ``rounds``: the handler (model + screen update) as wall and CPU time of
    this process (the machine may be shared), and until the first frame showing the updated table was ready for the
    terminal: handler, the table's idle work, the wait for the next frame (60 per second at most), layout, paint.
    (The drain screen then paints once more, ~20 ms later, because the in-flight sparkline grew by a column.)"""
    backend = StaticBackend(fleet=sample.fleet(), preflight_script=sample.preflight_script(),
                            proceed_script=sample.drain_script())
    app = make_app(backend, start="deploy", release="v2.14.0", clock=lambda: sample.NOW, animate=False,
                   poll_interval=3600)
    handler, handler_cpu, painted, painted_cpu = [], [], [], []
    async with app.run_test(size=SIZE) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.press("G")
        await pilot.pause()
        await pilot.press("y")
        await app.workers.wait_for_complete()
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, DrainScreen)
        table = screen.query_one(TaskTable)
        frames = Frames(app, table)
        progress = spread(sample.progress(rows))
        app.sink(progress)
        await pilot.pause()
        assert table.row_count == rows
        for round_no in range(rounds):
            progress = next_poll(progress, round_no, step)
            frames.table_done.clear()
            t0, c0 = time.perf_counter(), time.process_time()
            app.model.apply(progress)
            screen.render_model(app.model)
            t1, c1 = time.perf_counter(), time.process_time()
            await pilot.pause()  # until idle: the table's idle work, layout, paint (and Pilot's own waiting)
            assert frames.table_done, "no frame repainted the task table"
            assert table.get_cell(progress.tasks[-1].id, "id") == progress.tasks[-1].id[:8]
            t2, c2 = frames.table_done[0]
            handler.append((t1 - t0) * 1000)
            handler_cpu.append((c1 - c0) * 1000)
            painted.append((t2 - t0) * 1000)
            painted_cpu.append((c2 - c0) * 1000)
    median = statistics.median
    return {"handler": median(handler), "handler_cpu": median(handler_cpu), "painted": median(painted),
            "painted_cpu": median(painted_cpu)}


async def first_frame() -> float:
    """ms from creating the app to the home screen showing the fleet."""
    t0 = time.perf_counter()
    app = make_app(StaticBackend(fleet=sample.fleet(), slots=sample.slots()), clock=lambda: sample.NOW,
                   animate=False)
    async with app.run_test(size=SIZE) as pilot:
        while not app.screen.query("#workers") or app.screen.query_one("#workers").row_count == 0:  # type: ignore[attr-defined]
            await pilot.pause(0.001)
        return (time.perf_counter() - t0) * 1000


async def idle_cpu(seconds: float = 10.0) -> float:
    """% of one core used by the console while polling a (static) fleet every second."""
    app = make_app(StaticBackend(fleet=sample.fleet(), slots=sample.slots()), clock=lambda: sample.NOW,
                   poll_interval=1.0)
    async with app.run_test(size=SIZE):
        await asyncio.sleep(1.0)
        c0, w0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        c1, w1 = time.process_time(), time.perf_counter()
    return 100 * (c1 - c0) / (w1 - w0)


HOME_MARK = b"Queue depths"  # a border title of the home screen, painted in its first frame


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system, all threads) the process has used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def console_start_once(broker: str, names: list[str], state_dir: str,
                       timeout: float = 30.0) -> tuple[float, float, float, float]:
    """Seconds from starting ``celeryops --broker URL`` (the console's home view) in a 120x40 pty until the terminal
    output shows the home screen (its first painted frame), and until it names every worker (the first frame with
    the fleet), each with the CPU time the process had used by then; the process is then killed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(SIZE[0]), "LINES": str(SIZE[1])}
    env.pop("NO_COLOR", None)
    cmd = [*celeryops_cli(), "--broker", broker, "--state-dir", state_dir]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
                            close_fds=True)
    os.close(slave)
    seen = b""
    home = home_cpu = 0.0
    try:
        deadline = time.monotonic() + timeout
        while not all(n.encode() in seen for n in names):
            if not home and HOME_MARK in seen:
                home, home_cpu = time.perf_counter() - t0, cpu_of(proc.pid)
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise RuntimeError(f"the console did not show {names} (exit {proc.poll()}): {seen[-1500:]!r}")
            ready, _, _ = select.select([master], [], [], min(left, 0.5))
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:  # the pty closed: the process exited
                    continue
        fleet, fleet_cpu = time.perf_counter() - t0, cpu_of(proc.pid)
        return home or fleet, home_cpu or fleet_cpu, fleet, fleet_cpu
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        os.close(master)


def celeryops_cli() -> list[str]:
    script = Path(sys.executable).parent / "celeryops"
    return [str(script)] if script.exists() else [sys.executable, "-m", "celeryops"]


def celery_cli() -> list[str]:
    script = Path(sys.executable).parent / "celery"
    return [str(script)] if script.exists() else [sys.executable, "-m", "celery"]


def process_time(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({out.returncode}): {out.stderr[-500:]!r}")
    return time.perf_counter() - t0


def console_start(repeats: int = 5) -> tuple[list[tuple[float, float, float, float]], list[float]]:
    """Console start times (home frame, frame with the fleet) and `celery --version` times (whole processes, taken in
    turns), 2 real workers."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import bench_fleet  # needs redis-server; the in-process benches above do not

    starts: list[tuple[float, float, float, float]] = []
    anchors: list[float] = []
    with bench_fleet() as bench, tempfile.TemporaryDirectory(prefix="celeryops-bench-state-") as state:
        workers = bench.add(2)
        names = [w.nodename.split("@", 1)[1] for w in workers]
        console_start_once(bench.broker, names, state)  # warm-up (file caches)
        process_time([*celery_cli(), "--version"])
        for _ in range(repeats):
            starts.append(console_start_once(bench.broker, names, state))
            anchors.append(process_time([*celery_cli(), "--version"]))
    return starts, anchors


async def main() -> None:
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if "--start-only" in sys.argv:
        print_console_start()
        return
    print(f"{'drain update (median of 7 polls)':<40}{'handler':>10}{'CPU':>10}{'painted':>10}{'CPU':>10}")
    cases = [(f"{rows:,} rows, next poll 15 s later", rows, 15.0) for rows in (100, 1_000, 10_000)]
    cases.append(("10,000 rows, every row changed", 10_000, 60.0))
    for label, rows, step in cases:
        r = await drain_update(rows, step)
        print(f"{label:<40}{r['handler']:>7.1f} ms{r['handler_cpu']:>7.1f} ms{r['painted']:>7.1f} ms"
              f"{r['painted_cpu']:>7.1f} ms")
    print(f"{'time to first frame (home with fleet)':<40}{await first_frame():>7.1f} ms")
    print(f"{'CPU while idle-polling every 1 s':<40}{await idle_cpu():>8.2f} %")
    print_console_start()


def print_console_start() -> None:
    starts, anchors = console_start()
    anchor = statistics.median(anchors)
    for i, label in ((0, "console start -> first home frame"), (2, "console start -> home showing the fleet")):
        values = [s[i] for s in starts]
        med, cpu = statistics.median(values), statistics.median(s[i + 1] for s in starts)
        print(f"{label:<40}{med * 1000:>7.0f} ms (CPU {cpu * 1000:.0f} ms; max {max(values) * 1000:.0f} ms; "
              f"{med / anchor:.2f}x `celery --version` {anchor * 1000:.0f} ms; {len(values)} runs, 2 real workers; "
              f"target <= 1000 ms: {'met' if med <= 1.0 else 'MISSED'})")


if __name__ == "__main__":
    asyncio.run(main())
