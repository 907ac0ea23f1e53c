"""Console benchmarks (printed table, not a test): how long one drain update takes with 100 / 1,000 / 10,000 rows in
the task table, from the handler until the frame showing the updated table is ready for the terminal (target <= 50
ms at 10,000), time to first frame, CPU while idle-polling a fleet (target < 2 % of one core), and console start:
from starting the ``celeryops`` process in a terminal (a pty) to its first painted home frame (target <= 1.0 s and
<= 0.8x) and to the first frame whose workers table names every worker of a live fleet of real workers (the fleet
shown, what an operator waits for: target <= 1.2x), with ``celery --version`` (whole process) as the anchor, taken
in turns in the same run.
Run: ``.venv/bin/python bench/bench_console.py [--start-only] [--fastdatatable | --before CHECKOUT]`` (console start
needs redis-server; ``--fastdatatable`` needs textual-fastdatatable installed: the drain update with its DataTable in
turns with the task table; ``--before CHECKOUT``: the drain update and console start of another checkout, e.g. a
``git worktree`` of main, in turns with this one; with ``--start-only``, its console start alone). See
bench/README.md."""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import fcntl
import json
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
import tomllib
from collections.abc import Iterator
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
ROOT = Path(__file__).resolve().parents[1]  # this checkout


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


async def drain_update(rows: int, step: float = 15.0, rounds: int = 7,
                       table_class: type[TaskTable] | None = None) -> dict[str, float]:
    """Medians (ms) for one drain update of ``rounds``: the handler (model + screen update) as wall and CPU time of
    this process (the machine may be shared), and until the first frame showing the updated table was ready for the
    terminal: handler, the table's idle work, the wait for the next frame (60 per second at most), layout, paint.
    (The drain screen then paints once more, ~20 ms later, because the in-flight sparkline grew by a column.)
    ``table_class``: another table in place of the task table (``--fastdatatable``)."""
    if table_class is not None:
        with swapped_task_table(table_class):
            return await drain_update(rows, step, rounds)
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
        table: TaskTable = screen.query_one("#tasks")  # type: ignore[assignment]  # or the swapped-in table
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


@contextlib.contextmanager
def swapped_task_table(table_class: type[TaskTable]) -> Iterator[None]:
    """The drain screen builds and updates ``table_class`` in place of TaskTable (the bench's own swap)."""
    from celeryops.console.screens import drain

    drain.TaskTable = table_class  # type: ignore[misc]
    try:
        yield
    finally:
        drain.TaskTable = TaskTable  # type: ignore[misc]


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
    """CPU seconds (user + system, all threads) the process has used so far, with its children's: those it reaped
    and those still running (the console's first look is read by a child process)."""
    def stat(of: int) -> list[str]:
        with open(f"/proc/{of}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()

    ticks = sum(int(f) for f in stat(pid)[11:15])  # utime, stime, cutime, cstime (children reaped)
    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{pid}/children") as fh:  # forked, still running
        for child in fh.read().split():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ticks += sum(int(f) for f in stat(int(child))[11:13])
    return ticks / os.sysconf("SC_CLK_TCK")


Start = tuple[float, float, float, float, bool]  # home s, its CPU s, fleet s, its CPU s, a first-look child ran


def forked(pid: int) -> bool:
    """The process forked a child by now (the console's first look: a core was free at its start)."""
    with open(f"/proc/{pid}/stat") as fh:
        reaped = sum(int(f) for f in fh.read().rsplit(")", 1)[1].split()[13:15]) > 0
    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{pid}/children") as fh:
        return reaped or bool(fh.read().split())
    return reaped


def console_start_once(broker: str, names: list[str], state_dir: str, timeout: float = 30.0,
                       checkout: Path | None = None) -> Start:
    """Seconds from starting ``celeryops --broker URL`` (the console's home view) in a 120x40 pty until the terminal
    output shows the home screen (its first painted frame), and until it names every worker (the first frame with
    the fleet), each with the CPU time the process had used by then; the process is then killed. ``checkout``: run
    that checkout's celeryops instead (its ``tui`` first on PYTHONPATH)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(SIZE[0]), "LINES": str(SIZE[1]),
           **checkout_env(checkout)}
    env.pop("NO_COLOR", None)
    cmd = [*celeryops_cli(checkout), "--broker", broker, "--state-dir", state_dir]
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
        return home or fleet, home_cpu or fleet_cpu, fleet, fleet_cpu, forked(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        os.close(master)


def celeryops_cli(checkout: Path | None = None) -> list[str]:
    """This environment's ``celeryops`` script; for another checkout, its own entry point (its pyproject's
    ``[project.scripts]``: the script here names this checkout's, which an older checkout may not have)."""
    script = Path(sys.executable).parent / "celeryops"
    if checkout is not None:
        with open(checkout / "pyproject.toml", "rb") as fh:
            module, _, func = tomllib.load(fh)["project"]["scripts"]["celeryops"].partition(":")
        return [sys.executable, "-c", f"import sys; from {module} import {func}; sys.argv[0] = 'celeryops'; "
                                      f"sys.exit({func}())"]
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


def checkout_env(checkout: Path | None) -> dict[str, str]:
    """The environment that runs another checkout's celeryops (None: this one)."""
    if checkout is None:
        return {}
    return {"PYTHONPATH": os.pathsep.join(str(checkout / part) for part in ("tui", "harness"))}


def compiled(checkout: Path) -> None:
    """Compile the checkout's celeryops to bytecode, as pip does when it installs a wheel: this environment sets
    PYTHONDONTWRITEBYTECODE, so a checkout's ~80 modules were otherwise compiled from source at every start (~0.15 s
    of CPU that no installed console pays)."""
    compileall.compile_dir(str(checkout / "tui" / "celeryops"), quiet=1)


def console_start(repeats: int = 5, checkouts: tuple[Path | None, ...] = (None,),
                  ) -> tuple[dict[Path | None, list[Start]], list[float]]:
    """Console start times (home frame, frame with the fleet) of each checkout (None: this one) and
    `celery --version` times (whole processes, all taken in turns), 2 real workers."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import bench_fleet  # needs redis-server; the in-process benches above do not

    for checkout in checkouts:
        compiled(checkout or ROOT)
    starts: dict[Path | None, list[Start]] = {c: [] for c in checkouts}
    anchors: list[float] = []
    with bench_fleet() as bench, tempfile.TemporaryDirectory(prefix="celeryops-bench-state-") as state:
        workers = bench.add(2)
        names = [w.nodename.split("@", 1)[1] for w in workers]
        for checkout in checkouts:  # warm-up (file caches)
            console_start_once(bench.broker, names, state, checkout=checkout)
        process_time([*celery_cli(), "--version"])
        for _ in range(repeats):
            for checkout in checkouts:
                starts[checkout].append(console_start_once(bench.broker, names, state, checkout=checkout))
            anchors.append(process_time([*celery_cli(), "--version"]))
    return starts, anchors


async def main() -> None:
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    before = Path(sys.argv[sys.argv.index("--before") + 1]).resolve() if "--before" in sys.argv else None
    if "--start-only" in sys.argv:  # with --before: that checkout's console start in turns with this one's
        print_console_start(before=before)
        return
    if "--fastdatatable" in sys.argv:
        await print_fastdatatable()
        return
    if before is not None:
        await print_before_after(before, runs=3)
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


async def print_fastdatatable(runs: int = 3) -> None:
    """The drain update with the task table (patched DataTable) and with textual-fastdatatable's DataTable in its
    place, in turns, ``runs`` runs of 7 polls each: medians of the runs' medians."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        from fastdatatable_table import fastdatatable_task_table
    except ImportError:
        sys.exit("bench_console --fastdatatable needs textual-fastdatatable: pip install textual-fastdatatable")
    contenders: dict[str, type[TaskTable] | None] = {"TaskTable": None, "fastdatatable": fastdatatable_task_table()}
    print(f"{'drain update (median of 7 polls, ' + str(runs) + ' runs)':<44}{'handler':>10}{'painted':>10}{'CPU':>10}")
    for rows in (100, 1_000, 10_000):
        results: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
        for _ in range(runs):
            for name, table_class in contenders.items():
                results[name].append(await drain_update(rows, table_class=table_class))
        for name, found in results.items():
            median = {key: statistics.median(r[key] for r in found) for key in found[0]}
            print(f"{f'{rows:,} rows, {name}':<44}{median['handler']:>7.1f} ms{median['painted']:>7.1f} ms"
                  f"{median['painted_cpu']:>7.1f} ms")


def print_console_start(repeats: int = 15, before: Path | None = None) -> None:
    """Medians of ``repeats`` starts, and the ratio to `celery --version` as the median of the ratios of the pairs
    taken one after the other (this machine's speed drifts by ~20 % within a minute: a pair shares the drift)."""
    checkouts = (None,) if before is None else (before, None)
    all_starts, anchors = console_start(repeats, checkouts)
    anchor = statistics.median(anchors)
    for checkout, starts in all_starts.items():
        name = "" if before is None else ("before: " if checkout is not None else "after: ")
        for i, label in ((0, "console start -> first home frame"), (2, "console start -> home showing the fleet")):
            values = [s[i] for s in starts]
            med, cpu = statistics.median(values), statistics.median(s[i + 1] for s in starts)
            ratio = statistics.median(s[i] / a for s, a in zip(starts, anchors, strict=True))
            target = f"target <= 1000 ms and <= 0.8x: {'met' if med <= 1.0 and ratio <= 0.8 else 'MISSED'}" if i == 0 \
                else f"target <= 1.2x: {'met' if ratio <= 1.2 else 'MISSED'}"
            print(f"{name + label:<48}{med * 1000:>7.0f} ms (CPU {cpu * 1000:.0f} ms; max {max(values) * 1000:.0f} ms; "
                  f"{ratio:.2f}x `celery --version` {anchor * 1000:.0f} ms; {len(values)} runs, 2 real workers; "
                  f"{target})")
        print(f"{name}  {first_look_split(starts, anchors)}")


def first_look_split(starts: list[Start], anchors: list[float]) -> str:
    """The starts whose first look was read by a child (a core was free at start) apart from the others: the
    console's CPU counts its child's."""
    def ratios(child: bool, i: int) -> str:
        found = [s[i] / a for s, a in zip(starts, anchors, strict=True) if s[4] == child]
        return f"{statistics.median(found):.2f}x" if found else "-"

    n = sum(1 for s in starts if s[4])
    return (f"{n} of {len(starts)} starts read the first look in a child: first frame {ratios(True, 0)}, fleet "
            f"shown {ratios(True, 2)}; the others {ratios(False, 0)}, {ratios(False, 2)}")


async def print_before_after(before: Path, runs: int) -> None:
    """The drain update and console start of the checkout ``before`` and of this one, in turns (each drain update
    run in a process of its own, its checkout's code first on PYTHONPATH): medians of ``runs`` runs, and the ratio."""
    code = ("import asyncio, json, sys; sys.path.insert(0, sys.argv[1]); import bench_console as b; "
            "print(json.dumps(asyncio.run(b.drain_update(int(sys.argv[2]), float(sys.argv[3])))))")
    print(f"{'drain update, median of 7 polls x ' + str(runs) + ' runs':<44}{'before':>12}{'after':>12}"
          f"{'after/before':>14}")
    for rows, step in ((100, 15.0), (1_000, 15.0), (10_000, 15.0), (10_000, 60.0)):
        found: dict[Path | None, list[dict[str, float]]] = {before: [], None: []}
        for _ in range(runs):
            for checkout in found:
                out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parent), str(rows),
                                      str(step)], capture_output=True, text=True, timeout=600,
                                     env={**os.environ, **checkout_env(checkout or ROOT)})
                if out.returncode != 0:
                    raise RuntimeError(f"the drain update of {checkout or ROOT} failed: {out.stderr[-1500:]}")
                found[checkout].append(json.loads(out.stdout.strip().splitlines()[-1]))
        label = f"{rows:,} rows" + (", every row changed" if step == 60.0 else "")
        for key, what in (("painted", "painted"), ("painted_cpu", "painted CPU")):
            old, new = (statistics.median(r[key] for r in found[c]) for c in (before, None))
            print(f"{label + ' ' + what:<44}{old:>9.1f} ms{new:>9.1f} ms{new / old:>13.2f}x")
    print_console_start(repeats=2 * runs + 1, before=before)


if __name__ == "__main__":
    asyncio.run(main())
