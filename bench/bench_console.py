"""Console benchmarks (printed table, not a test): how long one drain update takes to reach the task table with
100 / 1,000 / 10,000 rows (target <= 50 ms at 10,000), time to first frame, and CPU while idle-polling a fleet
(target < 2 % of one core). Run: ``.venv/bin/python bench/bench_console.py``."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import replace

from celeryops.console import sample
from celeryops.console.app import make_app
from celeryops.console.screens.drain import DrainScreen
from celeryops.console.static import StaticBackend
from celeryops.console.widgets.task_table import TaskTable
from celeryops.events import DrainProgress

SIZE = (120, 40)


def next_poll(progress: DrainProgress, round_no: int, step: float = 15.0) -> DrainProgress:
    """The next poll ``step`` seconds later (15 s: the default drain interval): 1 % of tasks finished, as many new
    ones arrived, every active task's runtime grew by ``step`` (60 s: nearly every "running for" cell changes)."""
    tasks = list(progress.tasks)
    churn = max(1, len(tasks) // 100)
    del tasks[:churn]
    fresh = sample.tasks(churn)
    tasks += [replace(t, id=f"r{round_no}-{i}-{t.id}") for i, t in enumerate(fresh)]
    tasks = [replace(t, runtime=(t.runtime or 0) + step) if t.state == "active" else t for t in tasks]
    return replace(progress, tasks=tuple(tasks), elapsed=progress.elapsed + 15, remaining=progress.remaining - 15)


async def drain_update(rows: int, step: float = 15.0, rounds: int = 5) -> tuple[float, float, float]:
    """Median ms for the handler (model + screen update) as wall time and as this process's CPU time (the
    machine may be shared), and until the app is idle again (layout + paint, plus Pilot's own pause)."""
    backend = StaticBackend(fleet=sample.fleet(), preflight_script=sample.preflight_script(),
                            proceed_script=sample.drain_script())
    app = make_app(backend, start="deploy", release="v2.14.0", clock=lambda: sample.NOW, animate=False,
                   poll_interval=3600)
    handler, cpu, total = [], [], []
    async with app.run_test(size=SIZE) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.press("G")
        await pilot.pause()
        await pilot.press("y")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, DrainScreen)
        progress = sample.progress(rows)
        app.sink(progress)
        await pilot.pause()
        assert app.screen.query_one(TaskTable).row_count == rows
        for round_no in range(rounds):
            progress = next_poll(progress, round_no, step)
            t0, c0 = time.perf_counter(), time.process_time()
            app.model.apply(progress)
            app.screen.render_model(app.model)
            t1, c1 = time.perf_counter(), time.process_time()
            cpu.append((c1 - c0) * 1000)
            await pilot.pause()  # layout + paint of the change
            t2 = time.perf_counter()
            handler.append((t1 - t0) * 1000)
            total.append((t2 - t0) * 1000)
    return statistics.median(handler), statistics.median(cpu), statistics.median(total)


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


async def main() -> None:
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'drain update (median of 5 polls)':<40}{'handler':>10}{'CPU':>10}{'until idle':>12}")
    cases = [(f"{rows:,} rows, next poll 15 s later", rows, 15.0) for rows in (100, 1_000, 10_000)]
    cases.append(("10,000 rows, every row changed", 10_000, 60.0))
    for label, rows, step in cases:
        handler, cpu, total = await drain_update(rows, step)
        print(f"{label:<40}{handler:>7.1f} ms{cpu:>7.1f} ms{total:>9.1f} ms")
    print(f"{'time to first frame (home with fleet)':<40}{await first_frame():>7.1f} ms")
    print(f"{'CPU while idle-polling every 1 s':<40}{await idle_cpu():>8.2f} %")


if __name__ == "__main__":
    asyncio.run(main())
